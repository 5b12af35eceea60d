//! Clients reading through routers from observers (seed 001): the four-level state model,
//! over two nameservices.
//!
//! - A client keeps C(ns) per nameservice and merges every response's federated state map
//!   with max (the HDFS-16837 bug overwrites instead; the HDFS-17156 bug publishes a write's
//!   state only after the call returned).
//! - A router keeps a global state R(ns), advanced only by NameNode responses, and a state P
//!   per connection pool (user, NameNode), advanced by what clients carry (the HDFS-16826
//!   bug advances it only when the pool is created). It forwards P to the NameNode and
//!   returns its whole map R to the client. A read goes to an observer when the client
//!   carries a state and the router called the active within
//!   `observer.state.id.refresh.period` (15 s); otherwise to the active.
//! - An observer requeues a call whose state is ahead of its applied state until it catches
//!   up, or refuses it at once ("too far behind") when it cannot catch up in time.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use super::namenode::{EditLog, MAX_REQUEUE_WAIT, Observer, REQUEUE_INTERVAL, StateId, TOO_FAR_AHEAD};
use super::{Bugs, CLUSTER, call_attributes, process_spec, push_state};
use crate::emit::{Emitter, Kind, ProcessId, Sink, SpanSpec, int, string};
use crate::rng::Rng;
use crate::truth::ExpectedAnomaly;
use crate::{MILLISECOND, Nanos, SECOND, SimConfig, Truth};

const REFRESH_PERIOD: Nanos = 15 * SECOND;
/// How finely an analyzer can tell a read's staleness across clients from the telemetry: the
/// committed state is reported every second (`emit_metrics`).
const CROSS_CLIENT_RESOLUTION: Nanos = SECOND;
const HOP: Nanos = 300_000; // one network hop, 0.3 ms
const MAX_ATTEMPTS: i64 = 4;
const FUTURE_STATE_JUMP: StateId = 50_000_000;
const RETRIABLE: &str = "org.apache.hadoop.ipc.RetriableException";
const STANDBY: &str = "org.apache.hadoop.ipc.StandbyException";
/// The shortest requeue storm (domain.md: requeues high "for >= 30 s").
const REQUEUE_STORM_MIN: Nanos = 30 * SECOND;

mod truth;

/// Per-nameservice states: the federated state map.
type States = BTreeMap<&'static str, StateId>;

pub fn run(config: &SimConfig, sink: &mut dyn Sink, bugs: Bugs, read_after_write: bool) -> Truth {
    let mut model = Model::new(config, bugs, read_after_write);
    model.run(sink);
    model.truth
}

struct Namespace {
    name: &'static str,
    active: &'static str,
    log: EditLog,
    observers: Vec<Observer>,
    next_background: Nanos,
}

struct Client {
    id: String,
    user: &'static str,
    process: ProcessId,
    /// C(ns) as the client's alignment context holds it.
    state: States,
    /// A write's response map not yet published into the context (HDFS-17156), and when it
    /// lands.
    unpublished: Option<(Nanos, States)>,
    /// Truth: the highest state of each nameservice that responses to calls on that
    /// nameservice returned to this client (what its spans show it has seen).
    seen: States,
    /// Truth: read-your-writes and monotonic-reads floors.
    write_floor: States,
    read_floor: States,
    ops: u64,
    last_write: Option<&'static str>,
    /// Truth: the window in which the client carried a state no server had.
    untrusted: Option<(Nanos, Nanos)>,
    /// Whether the client's context was restored with a future state.
    restored: bool,
}

struct Router {
    node: String,
    process: ProcessId,
    global: States,
    pools: BTreeMap<(&'static str, &'static str), StateId>,
    last_active_call: BTreeMap<&'static str, Nanos>,
    next_observer: BTreeMap<&'static str, usize>,
    in_flight: Vec<Nanos>,
}

#[derive(Default)]
struct ServerCounters {
    queue_ops: u64,
    processing_ops: u64,
    requeues: u64,
    /// Requeues of calls still waiting, spread over their wait: (from, until, count). A
    /// counter read mid-wait shows the requeues done so far, as the real one does.
    waiting: Vec<(Nanos, Nanos, u64)>,
}

impl ServerCounters {
    /// (requeues, queue ops) as the counters read at `at`.
    fn read_at(&mut self, at: Nanos) -> (u64, u64) {
        let mut done = 0;
        let mut partial = 0;
        self.waiting.retain(|&(from, until, count)| {
            if until <= at {
                done += count;
                false
            } else {
                if at > from {
                    partial += (count as i128 * (at - from) as i128 / (until - from) as i128) as u64;
                }
                true
            }
        });
        self.requeues += done;
        self.queue_ops += done;
        (self.requeues + partial, self.queue_ops + partial)
    }
}

struct Server {
    process: ProcessId,
    namespace: usize,
    /// Index into the nameservice's observers; `None` for the active.
    observer: Option<usize>,
    counters: ServerCounters,
    /// The applied state at the last metrics tick and when it last moved.
    last_applied: (StateId, Nanos),
}

struct Model {
    rng: Rng,
    bugs: Bugs,
    read_after_write: bool,
    duration: Nanos,
    mean_think: f64,
    emitter: Emitter,
    background_rate: f64,
    namespaces: Vec<Namespace>,
    servers: BTreeMap<&'static str, Server>,
    routers: Vec<Router>,
    clients: Vec<Client>,
    truth: Truth,
}

/// How one attempt ended at the server.
enum Served {
    Ok { at: Nanos, state: StateId, requeues: i64 },
    Refused { at: Nanos, error: &'static str, message: String, requeues: i64, timeout: bool },
}

/// One attempt as the model decided it, for its spans.
struct AttemptRecord<'a> {
    client_index: usize,
    router_index: usize,
    call_id: &'a str,
    method: &'a str,
    namespace: &'static str,
    is_write: bool,
    attempt: i64,
    start: Nanos,
    target: &'static str,
    carried: Option<StateId>,
    forwarded: StateId,
    router_state_before: Option<StateId>,
    returned: Option<StateId>,
    served: Served,
}

fn observer(node: &'static str, lag_ms: i64, tail_period_ms: i64, stall: Option<(Nanos, Nanos)>) -> Observer {
    Observer {
        node: node.to_string(),
        lag: lag_ms * MILLISECOND,
        tail_period: tail_period_ms * MILLISECOND,
        stall,
        catch_up_rate: 5_000.0,
    }
}

impl Model {
    fn new(config: &SimConfig, bugs: Bugs, read_after_write: bool) -> Self {
        let mut rng = Rng::new(config.seed);
        let emitter = Emitter::new(config.start_unix_nano, SECOND, rng.fork(1).named(&config.scenario));
        let n_clients = config.clients.unwrap_or(6);
        let rate = config.rate.unwrap_or(40.0);
        let duration = config.duration.unwrap_or(if bugs.tail_stall { 120 * SECOND } else { 60 * SECOND });
        let stall = bugs.tail_stall.then_some((20 * SECOND, 75 * SECOND));
        let namespaces = vec![
            Namespace {
                name: "ns1",
                active: "nn-active",
                log: EditLog::new(1_000_000),
                observers: vec![observer("nn-obs1", 40, 50, None), observer("nn-obs2", 120, 100, stall)],
                next_background: 0,
            },
            Namespace {
                name: "ns2",
                active: "nn2-active",
                log: EditLog::new(7_000_000),
                observers: vec![observer("nn2-obs1", 60, 50, None), observer("nn2-obs2", 90, 100, None)],
                next_background: 0,
            },
        ];
        let mut model = Self {
            rng,
            bugs,
            read_after_write,
            duration,
            mean_think: n_clients as f64 / rate,
            emitter,
            background_rate: 200.0,
            namespaces,
            servers: BTreeMap::new(),
            routers: Vec::new(),
            clients: Vec::new(),
            truth: Truth {
                start_unix_nano: config.start_unix_nano,
                end_unix_nano: config.start_unix_nano + duration,
                ..Truth::default()
            },
        };
        let nodes: Vec<(&'static str, usize, Option<usize>)> = [
            ("nn-active", 0, None),
            ("nn-obs1", 0, Some(0)),
            ("nn-obs2", 0, Some(1)),
            ("nn2-active", 1, None),
            ("nn2-obs1", 1, Some(0)),
            ("nn2-obs2", 1, Some(1)),
        ]
        .to_vec();
        for (node, namespace, observer) in nodes {
            let process = model.emitter.process(process_spec("hdfs-namenode", "server", node));
            model.servers.insert(
                node,
                Server { process, namespace, observer, counters: ServerCounters::default(), last_applied: (0, 0) },
            );
        }
        for node in ["router-1", "router-2"] {
            let process = model.emitter.process(process_spec("hdfs-router", "router", node));
            model.routers.push(Router {
                node: node.to_string(),
                process,
                global: States::new(),
                pools: BTreeMap::new(),
                last_active_call: BTreeMap::new(),
                next_observer: BTreeMap::new(),
                in_flight: Vec::new(),
            });
        }
        for index in 0..n_clients {
            let id = if bugs.future_state && index == 0 {
                "client-restored".to_string()
            } else {
                format!("client-{}", index + 1)
            };
            let process = model.emitter.process(process_spec("hdfs-client", "client", &format!("app-{}", index + 1)));
            model.clients.push(Client {
                id,
                // Clients of one user share the routers' connection pools.
                user: if index % 2 == 0 { "etl" } else { "bi" },
                process,
                state: States::new(),
                unpublished: None,
                seen: States::new(),
                write_floor: States::new(),
                read_floor: States::new(),
                ops: 0,
                last_write: None,
                untrusted: None,
                restored: false,
            });
        }
        model
    }

    fn run(&mut self, sink: &mut dyn Sink) {
        let mut queue: BinaryHeap<Reverse<(Nanos, usize)>> = BinaryHeap::new();
        for index in 0..self.clients.len() {
            let first = self.think();
            queue.push(Reverse((first, index)));
        }
        let mut next_metrics = 0;
        while let Some(Reverse((at, index))) = queue.pop() {
            if at >= self.duration {
                break;
            }
            self.write_background(at);
            while next_metrics <= at {
                self.emit_metrics(next_metrics);
                next_metrics += SECOND;
            }
            self.emitter.advance(at, sink);
            let end = self.operation(index, at);
            let think =
                if self.read_after_write && self.clients[index].last_write.is_some() { 0 } else { self.think() };
            queue.push(Reverse((end + think + 100_000, index)));
        }
        self.write_background(self.duration);
        while next_metrics <= self.duration {
            self.emit_metrics(next_metrics);
            next_metrics += SECOND;
        }
        self.emitter.finish(sink);
        self.finish_truth();
    }

    fn think(&mut self) -> Nanos {
        (self.rng.exponential(self.mean_think) * SECOND as f64) as Nanos + MILLISECOND
    }

    /// Writes by jobs that are not traced, so the logs move between the clients' calls.
    fn write_background(&mut self, until: Nanos) {
        let step = (SECOND as f64 / self.background_rate) as Nanos;
        for namespace in &mut self.namespaces {
            while namespace.next_background <= until {
                namespace.log.write(namespace.next_background, 1);
                namespace.next_background += step;
            }
        }
    }

    /// One logical call of a client, from its first attempt to its answer; returns its end.
    fn operation(&mut self, index: usize, at: Nanos) -> Nanos {
        self.publish_due(index, at);
        let ops = self.clients[index].ops;
        self.clients[index].ops += 1;
        if self.bugs.future_state && index == 0 && at >= 10 * SECOND && !self.clients[index].restored {
            // Restored from another cluster's checkpoint: a state no server of this one has.
            let future = self.namespaces[0].log.last() + FUTURE_STATE_JUMP;
            self.clients[index].state.insert("ns1", future);
            self.clients[index].restored = true;
        }
        let (namespace, is_write) = match (self.read_after_write, self.clients[index].last_write) {
            (true, Some(namespace)) => (namespace, false),
            (true, None) => (if self.rng.chance(0.6) { "ns1" } else { "ns2" }, true),
            (false, _) => (if self.rng.chance(0.6) { "ns1" } else { "ns2" }, self.rng.chance(0.3)),
        };
        let call_id = format!("{}-{ops}", self.clients[index].id);
        let method = if is_write {
            *self.rng.pick(&["create", "mkdirs", "rename", "delete", "setPermission"])
        } else {
            *self.rng.pick(&["getFileInfo", "listStatus", "getBlockLocations", "getContentSummary"])
        };
        let mut attempt_start = at;
        let mut end = at;
        for attempt in 0..MAX_ATTEMPTS {
            let router_index = self.rng.range(0, self.routers.len() as i64 - 1) as usize;
            let (attempt_end, ok) =
                self.attempt(index, router_index, &call_id, method, namespace, is_write, attempt, attempt_start);
            end = attempt_end;
            if ok {
                break;
            }
            attempt_start = attempt_end + 200 * MILLISECOND * (attempt + 1);
        }
        self.clients[index].last_write = is_write.then_some(namespace);
        end
    }

    fn publish_due(&mut self, index: usize, at: Nanos) {
        let client = &mut self.clients[index];
        if let Some((due, states)) = client.unpublished.take() {
            if due <= at {
                merge_max(&mut client.state, &states);
            } else {
                client.unpublished = Some((due, states));
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn attempt(
        &mut self,
        index: usize,
        router_index: usize,
        call_id: &str,
        method: &str,
        namespace: &'static str,
        is_write: bool,
        attempt: i64,
        start: Nanos,
    ) -> (Nanos, bool) {
        let ns_index = self.namespaces.iter().position(|candidate| candidate.name == namespace).unwrap_or(0);
        let carried = self.clients[index].state.get(namespace).copied();
        let user = self.clients[index].user;
        let router_start = start + HOP;
        // Route.
        let n_observers = self.namespaces[ns_index].observers.len();
        let router = &mut self.routers[router_index];
        let fresh = router.last_active_call.get(namespace).is_some_and(|last| router_start - last < REFRESH_PERIOD);
        let target: &'static str = if !is_write && carried.is_some() && fresh {
            let next = router.next_observer.entry(namespace).or_default();
            let chosen = *next % n_observers;
            *next += 1;
            self.servers
                .iter()
                .find(|(_, server)| server.namespace == ns_index && server.observer == Some(chosen))
                .map_or(self.namespaces[ns_index].active, |(node, _)| *node)
        } else {
            router.last_active_call.insert(namespace, router_start);
            self.namespaces[ns_index].active
        };
        // Pool state P(ns, user, nn).
        let pool_exists = router.pools.contains_key(&(user, target));
        let pool = router.pools.entry((user, target)).or_insert(carried.unwrap_or(0));
        if !(self.bugs.pool_not_advanced && pool_exists)
            && let Some(carried) = carried
        {
            *pool = (*pool).max(carried);
        }
        let forwarded = *pool;
        let router_state_before = router.global.get(namespace).copied();
        // Execute.
        let server_start = router_start + HOP;
        let served = if self.servers[target].observer.is_none() {
            self.execute_on_active(target, is_write, server_start)
        } else {
            self.execute_on_observer(target, forwarded, server_start)
        };
        let (server_end, served_state) = match &served {
            Served::Ok { at, state, .. } => (*at, Some(*state)),
            Served::Refused { at, .. } => (*at, None),
        };
        let router = &mut self.routers[router_index];
        if let Some(state) = served_state {
            merge_max(&mut router.global, &States::from([(namespace, state)]));
        }
        router.in_flight.push(server_end);
        // The router answers with its whole federated state map.
        let response_map = served_state.map(|_| router.global.clone());
        let returned = response_map.as_ref().and_then(|map| map.get(namespace).copied());
        let client_end = server_end + 2 * HOP;

        // The client's context.
        let client = &mut self.clients[index];
        if let Some(map) = &response_map {
            if self.bugs.publish_race && is_write {
                client.unpublished = Some((client_end + 2 * MILLISECOND, map.clone()));
            } else if self.bugs.overwrite_merge {
                client.state.extend(map.iter().map(|(namespace, state)| (*namespace, *state)));
            } else {
                merge_max(&mut client.state, map);
            }
        }
        let record = AttemptRecord {
            client_index: index,
            router_index,
            call_id,
            method,
            namespace,
            is_write,
            attempt,
            start,
            target,
            carried,
            forwarded,
            router_state_before,
            returned,
            served,
        };
        self.judge(&record, client_end, response_map.as_ref());
        let ok = matches!(record.served, Served::Ok { .. });
        self.emit_attempt(record, client_end);
        (client_end, ok)
    }

    fn execute_on_active(&mut self, node: &'static str, is_write: bool, at: Nanos) -> Served {
        let server = self.servers.get_mut(node).expect("active is registered");
        server.counters.queue_ops += 1;
        server.counters.processing_ops += 1;
        let log = &mut self.namespaces[server.namespace].log;
        let done = at + 800_000;
        let state = if is_write { log.write(done, 1) } else { log.written_at(done) };
        Served::Ok { at: done + 200_000, state, requeues: 0 }
    }

    fn execute_on_observer(&mut self, node: &'static str, request_state: StateId, at: Nanos) -> Served {
        let server = self.servers.get_mut(node).expect("observer is registered");
        let namespace = &self.namespaces[server.namespace];
        let observer = &namespace.observers[server.observer.unwrap_or(0)];
        let applied = observer.applied_at(&namespace.log, at);
        server.counters.queue_ops += 1;
        if request_state - applied > TOO_FAR_AHEAD {
            server.counters.processing_ops += 1;
            return Served::Refused {
                at: at + 300_000,
                error: RETRIABLE,
                message: format!(
                    "Observer Node is too far behind: serverStateId = {applied} clientStateId = {request_state}"
                ),
                requeues: 0,
                timeout: false,
            };
        }
        let ready =
            if request_state <= applied { Some(at) } else { observer.time_reaching(&namespace.log, request_state, at) };
        let waited_until = ready.unwrap_or(at + MAX_REQUEUE_WAIT);
        let requeues = (waited_until - at) / REQUEUE_INTERVAL;
        if requeues > 0 {
            server.counters.waiting.push((at, waited_until, requeues as u64));
        }
        match ready {
            Some(ready_at) => {
                server.counters.processing_ops += 1;
                Served::Ok { at: ready_at + 600_000, state: observer.applied_at(&namespace.log, ready_at), requeues }
            }
            None => Served::Refused {
                at: waited_until,
                error: STANDBY,
                message: format!("call timed out after {requeues} requeues waiting for state {request_state}"),
                requeues,
                timeout: true,
            },
        }
    }

    fn emit_attempt(&mut self, record: AttemptRecord<'_>, client_end: Nanos) {
        let client = &self.clients[record.client_index];
        let (client_id, client_process) = (client.id.clone(), client.process);
        let router = &self.routers[record.router_index];
        let (router_node, router_process) = (router.node.clone(), router.process);
        let server = &self.servers[record.target];
        let server_process = server.process;
        let target_role = if server.observer.is_some() { "observer" } else { "active" };
        let committed = self.namespaces[server.namespace].log.written_at(record.start);
        let op = if record.is_write { "write" } else { "read" };
        let (server_end, served_state, requeues) = match &record.served {
            Served::Ok { at, state, requeues } => (*at, Some(*state), *requeues),
            Served::Refused { at, requeues, .. } => (*at, None, *requeues),
        };
        let (outcome, error) = match &record.served {
            Served::Ok { .. } => ("ok", None),
            Served::Refused { error, message, timeout, .. } => {
                (if *timeout { "timeout" } else { "rejected" }, Some((*error, message.clone())))
            }
        };
        let base = || call_attributes(&client_id, record.call_id, record.attempt, record.namespace, op, record.method);

        let mut client_span =
            SpanSpec::new(format!("ClientProtocol/{}", record.method), Kind::Client, record.start, client_end);
        client_span.attributes = base();
        client_span
            .attributes
            .extend([string("lagscope.target.node", router_node.clone()), string("lagscope.target.role", "router")]);
        push_state(&mut client_span.attributes, "lagscope.state.carried", record.carried);
        push_state(&mut client_span.attributes, "lagscope.state.returned", record.returned);
        client_span.attributes.push(string("lagscope.outcome", outcome));
        if record.attempt > 0 {
            client_span.attributes.push(int("lagscope.retry.delay_ms", 200 * record.attempt));
        }
        if let Some((error_type, message)) = &error {
            client_span.attributes.push(string("error.type", *error_type));
            client_span.error = Some(message.clone());
        }
        let client_context = self.emitter.span(client_process, client_span);

        let router_start = record.start + HOP;
        let mut router_span =
            SpanSpec::new(format!("RouterRpcServer/{}", record.method), Kind::Server, router_start, server_end + HOP);
        router_span.parent = Some(client_context);
        router_span.attributes = base();
        router_span
            .attributes
            .extend([string("lagscope.target.node", record.target), string("lagscope.target.role", target_role)]);
        router_span.attributes.push(int("lagscope.state.carried", record.forwarded));
        push_state(&mut router_span.attributes, "lagscope.state.router", record.router_state_before);
        push_state(&mut router_span.attributes, "lagscope.state.returned", record.returned);
        router_span.attributes.push(string("lagscope.outcome", outcome));
        if let Some((error_type, message)) = &error {
            router_span.attributes.push(string("error.type", *error_type));
            router_span.error = Some(message.clone());
        }
        let router_context = self.emitter.span(router_process, router_span);

        let server_start = router_start + HOP;
        let mut server_span =
            SpanSpec::new(format!("ClientNamenodeProtocol/{}", record.method), Kind::Server, server_start, server_end);
        server_span.parent = Some(router_context);
        server_span.attributes = vec![
            string("lagscope.namespace", record.namespace),
            string("lagscope.op", op),
            string("rpc.method", record.method),
            string("lagscope.node.role", target_role),
            int("lagscope.state.carried", record.forwarded),
            int("lagscope.state.committed", committed),
            int("lagscope.requeues", requeues),
            string("lagscope.outcome", outcome),
        ];
        push_state(&mut server_span.attributes, "lagscope.state.served", served_state);
        push_state(&mut server_span.attributes, "lagscope.state.returned", served_state);
        if let Some((error_type, message)) = &error {
            server_span.attributes.push(string("error.type", *error_type));
            server_span.error = Some(message.clone());
        }
        self.emitter.span(server_process, server_span);
        if let Served::Refused { at, message, timeout: false, .. } = &record.served {
            self.emitter.log(
                server_process,
                *at,
                (13, "WARN"),
                message.clone(),
                vec![string("lagscope.namespace", record.namespace)],
            );
        }
    }

    fn emit_metrics(&mut self, at: Nanos) {
        for server in self.servers.values_mut() {
            let namespace = &self.namespaces[server.namespace];
            let labels = || vec![string("lagscope.namespace", namespace.name)];
            let written = namespace.log.written_at(at);
            let (role, applied) = match server.observer {
                Some(index) => ("observer", namespace.observers[index].applied_at(&namespace.log, at)),
                None => ("active", written),
            };
            let process = server.process;
            if applied != server.last_applied.0 {
                server.last_applied = (applied, at);
            }
            // FSNamesystem's MillisSinceLastLoadedEdits: 0 on the active.
            let since_loaded = if role == "active" { 0 } else { (at - server.last_applied.1) / crate::MILLISECOND };
            self.emitter.gauge(process, "lagscope.server.millis_since_last_applied", at, since_loaded as f64, labels());
            self.emitter.gauge(process, "lagscope.server.applied_state", at, applied as f64, labels());
            if role == "active" {
                self.emitter.gauge(process, "lagscope.server.committed_state", at, written as f64, labels());
            }
            let mut role_labels = labels();
            role_labels.push(string("lagscope.node.role", role));
            self.emitter.gauge(process, "lagscope.server.role", at, 1.0, role_labels);
            let (requeues, queue_ops) = server.counters.read_at(at);
            let counters = &server.counters;
            self.emitter.counter(process, "lagscope.server.requeue_calls", at, requeues as f64, labels());
            self.emitter.counter(process, "lagscope.server.rpc_queue_ops", at, queue_ops as f64, labels());
            self.emitter.counter(
                process,
                "lagscope.server.rpc_processing_ops",
                at,
                counters.processing_ops as f64,
                labels(),
            );
        }
        for router in &mut self.routers {
            router.in_flight.retain(|end| *end > at);
            let process = router.process;
            let queue = router.in_flight.len() as f64;
            self.emitter.gauge(process, "lagscope.router.call_queue_length", at, queue, vec![]);
            for (node, server) in &self.servers {
                let namespace = self.namespaces[server.namespace].name;
                let role = if server.observer.is_some() { "observer" } else { "active" };
                let labels = vec![
                    string("lagscope.namespace", namespace),
                    string("lagscope.target.node", *node),
                    string("lagscope.node.role", role),
                ];
                self.emitter.gauge(process, "lagscope.router.cached_role", at, 1.0, labels);
            }
        }
    }
}

fn merge_max(into: &mut States, from: &States) {
    for (namespace, state) in from {
        let entry = into.entry(namespace).or_insert(*state);
        *entry = (*entry).max(*state);
    }
}
