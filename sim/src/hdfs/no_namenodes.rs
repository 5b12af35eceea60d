//! NoNamenodesAvailableException after failover (seed 002, HDFS-17166).
//!
//! NameNodes report their HA state to the State Store on every heartbeat (5 s); a router
//! reloads its membership cache from the State Store every `dfs.federation.router.cache.ttl`
//! (1 min). The cache orders NameNodes by state (ACTIVE, OBSERVER, STANDBY, ...) and then by
//! priority. If a reload lands while the nameservice has no active NameNode, the router keeps
//! "no active" until the next reload, even after the failover completed: every request goes
//! to the first cached NameNode (a real standby), fails, and the router answers
//! NoNamenodesAvailableException (as a RetriableException) until the cache is reloaded. The
//! fix rotates the failing NameNode to the end of the cached list, so the next try reaches
//! the real active: one exception.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::{CLUSTER, call_attributes, process_spec};
use crate::emit::{Emitter, Kind, ProcessId, Sink, SpanSpec, string};
use crate::rng::Rng;
use crate::truth::ExpectedAnomaly;
use crate::{MILLISECOND, Nanos, SECOND, SimConfig, Truth};

const NAMESPACE: &str = "ns60";
const HEARTBEAT: Nanos = 5 * SECOND;
const CACHE_TTL: Nanos = 60 * SECOND;
/// nn6001 leaves ACTIVE (manual failover) and comes back.
const FAILOVER_START: Nanos = 4 * SECOND;
const FAILOVER_DONE: Nanos = 7 * SECOND;
const HOP: Nanos = 300_000;
const MAX_ATTEMPTS: i64 = 10;
const NNA: &str = "org.apache.hadoop.hdfs.server.federation.router.NoNamenodesAvailableException";
const STANDBY: &str = "org.apache.hadoop.ipc.StandbyException";

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Role {
    Active,
    Standby,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Standby => "standby",
        }
    }
}

/// The real HA state of a NameNode.
fn actual_role(node: &str, at: Nanos) -> Role {
    match node {
        "nn6001" if !(FAILOVER_START..FAILOVER_DONE).contains(&at) => Role::Active,
        _ => Role::Standby,
    }
}

/// What the State Store holds for a NameNode: its state at the last heartbeat.
fn reported_role(node: &str, at: Nanos) -> Role {
    actual_role(node, at.div_euclid(HEARTBEAT) * HEARTBEAT)
}

struct Router {
    node: &'static str,
    process: ProcessId,
    /// When this router reloads its cache (phase of the 1-minute period).
    reload_phase: Nanos,
    /// Cached (NameNode, role) in priority order, and when it was loaded.
    cache: Vec<(&'static str, Role)>,
    loaded_at: Nanos,
    no_namenodes: u64,
    nna_times: Vec<Nanos>,
}

impl Router {
    fn reload_if_due(&mut self, at: Nanos) {
        let last_reload = (at - self.reload_phase).div_euclid(CACHE_TTL) * CACHE_TTL + self.reload_phase;
        if last_reload <= self.loaded_at {
            return;
        }
        self.loaded_at = last_reload;
        // Priority: nn6002 is ahead of nn6001 among NameNodes of the same state.
        let mut cache: Vec<(&'static str, Role)> =
            ["nn6002", "nn6001"].into_iter().map(|node| (node, reported_role(node, last_reload))).collect();
        cache.sort_by_key(|(_, role)| *role);
        self.cache = cache;
    }
}

pub fn run(config: &SimConfig, sink: &mut dyn Sink, fixed: bool) -> Truth {
    let mut rng = Rng::new(config.seed);
    let mut emitter = Emitter::new(config.start_unix_nano, SECOND, rng.fork(1).named(&config.scenario));
    let duration = config.duration.unwrap_or(120 * SECOND);
    let n_clients = config.clients.unwrap_or(6);
    let mean_think = n_clients as f64 / config.rate.unwrap_or(12.0);
    let mut routers: Vec<Router> = [("router-1", 8 * SECOND), ("router-2", 38 * SECOND)]
        .into_iter()
        .map(|(node, reload_phase)| Router {
            node,
            process: emitter.process(process_spec("hdfs-router", "router", node)),
            reload_phase,
            cache: Vec::new(),
            loaded_at: Nanos::MIN,
            no_namenodes: 0,
            nna_times: Vec::new(),
        })
        .collect();
    let servers: Vec<(&str, ProcessId)> = ["nn6001", "nn6002"]
        .into_iter()
        .map(|node| (node, emitter.process(process_spec("hdfs-namenode", "server", node))))
        .collect();
    let clients: Vec<(String, ProcessId)> = (0..n_clients)
        .map(|index| {
            (
                format!("client-{}", index + 1),
                emitter.process(process_spec("hdfs-client", "client", &format!("app-{}", index + 1))),
            )
        })
        .collect();

    // Every attempt is an event of its own, so that the router sees them in time order.
    let mut queue: BinaryHeap<Reverse<(Nanos, usize, i64)>> =
        (0..n_clients).map(|index| Reverse((MILLISECOND * (1 + index as i64), index, 0))).collect();
    let mut next_metrics = 0;
    let mut calls = vec![0u64; n_clients];
    let mut current: Vec<(String, &'static str, &'static str)> = vec![(String::new(), "", ""); n_clients];
    while let Some(Reverse((start, index, attempt))) = queue.pop() {
        if start >= duration {
            break;
        }
        while next_metrics <= start {
            emit_metrics(&mut emitter, &mut routers, &servers, next_metrics);
            next_metrics += SECOND;
        }
        emitter.advance(start, sink);
        // Clients 1..n-1 use router-1; the last one router-2 (RetriableException retries the
        // same router).
        let router_index = usize::from(index + 1 == n_clients && n_clients > 1);
        let (client_id, client_process) = clients[index].clone();
        if attempt == 0 {
            let method = *rng.pick(&["getFileInfo", "listStatus", "create", "getBlockLocations"]);
            let op = if method == "create" { "write" } else { "read" };
            current[index] = (format!("{client_id}-{}", calls[index]), method, op);
            calls[index] += 1;
        }
        let (call_id, method, op) = current[index].clone();
        {
            let router = &mut routers[router_index];
            let router_start = start + HOP;
            router.reload_if_due(router_start);
            // The router tries cached NameNodes in order; with no active cached it answers
            // NoNamenodesAvailable after the first (standby) one fails.
            let no_active_cached = !router.cache.iter().any(|(_, role)| *role == Role::Active);
            let mut tried: Vec<(&'static str, bool, Nanos, Nanos)> = Vec::new();
            let mut at_server = router_start + HOP;
            let mut served = false;
            let order: Vec<&'static str> = router.cache.iter().map(|(node, _)| *node).collect();
            for node in order {
                let ok = actual_role(node, at_server) == Role::Active;
                tried.push((node, ok, at_server, at_server + MILLISECOND));
                at_server += MILLISECOND + HOP;
                if ok || no_active_cached {
                    served = ok;
                    break;
                }
            }
            let router_end = at_server;
            let client_end = router_end + HOP;
            let error = (!served).then_some(if no_active_cached { NNA } else { STANDBY });
            if error == Some(NNA) {
                router.no_namenodes += 1;
                router.nna_times.push(router_start);
                let first = tried.first().map_or("nn6002", |tried| tried.0);
                let message = format!("No namenodes available under nameservice {NAMESPACE}");
                emitter.log(
                    router.process,
                    router_start,
                    (13, "WARN"),
                    format!("Cannot get available namenode for {NAMESPACE} {first}:8020 error: {message}"),
                    vec![string("lagscope.namespace", NAMESPACE)],
                );
                if fixed {
                    // HDFS-17166: move the failing NameNode to the end of the cached list.
                    if let Some(position) = router.cache.iter().position(|(node, _)| *node == first)
                        && position + 1 < router.cache.len()
                    {
                        let entry = router.cache.remove(position);
                        router.cache.push(entry);
                    }
                }
            }
            // Spans.
            let outcome = if served { "ok" } else { "rejected" };
            let mut client_span = SpanSpec::new(format!("ClientProtocol/{method}"), Kind::Client, start, client_end);
            client_span.attributes = call_attributes(&client_id, &call_id, attempt, NAMESPACE, op, method);
            client_span.attributes.extend([
                string("lagscope.target.node", router.node),
                string("lagscope.target.role", "router"),
                string("lagscope.outcome", outcome),
            ]);
            if let Some(error) = error {
                client_span.attributes.push(string("error.type", error));
                client_span.error = Some(format!("{error}: No namenodes available under nameservice {NAMESPACE}"));
            }
            let client_context = emitter.span(client_process, client_span);
            let mut router_span =
                SpanSpec::new(format!("RouterRpcServer/{method}"), Kind::Server, router_start, router_end);
            router_span.parent = Some(client_context);
            router_span.attributes = call_attributes(&client_id, &call_id, attempt, NAMESPACE, op, method);
            router_span.attributes.push(string("lagscope.outcome", outcome));
            if let Some(first) = tried.first() {
                router_span.attributes.push(string("lagscope.target.node", first.0));
                let cached =
                    router.cache.iter().find(|(node, _)| *node == first.0).map_or(Role::Standby, |entry| entry.1);
                router_span.attributes.push(string("lagscope.target.role", cached.name()));
            }
            if let Some(error) = error {
                router_span.attributes.push(string("error.type", error));
            }
            let router_context = emitter.span(router.process, router_span);
            for (node, ok, server_start, server_end) in &tried {
                let process =
                    servers.iter().find(|(name, _)| name == node).map(|entry| entry.1).expect("known NameNode");
                let mut server_span =
                    SpanSpec::new(format!("ClientNamenodeProtocol/{method}"), Kind::Server, *server_start, *server_end);
                server_span.parent = Some(router_context);
                server_span.attributes = vec![
                    string("lagscope.namespace", NAMESPACE),
                    string("rpc.method", method),
                    string("lagscope.op", op),
                    string("lagscope.node.role", actual_role(node, *server_start).name()),
                    string("lagscope.outcome", if *ok { "ok" } else { "rejected" }),
                ];
                if !ok {
                    server_span.attributes.push(string("error.type", STANDBY));
                    server_span.error = Some("Operation category READ is not supported in state standby".to_string());
                }
                emitter.span(process, server_span);
            }
            if served || attempt + 1 >= MAX_ATTEMPTS {
                let think = (rng.exponential(mean_think) * SECOND as f64) as Nanos + MILLISECOND;
                queue.push(Reverse((client_end + think, index, 0)));
            } else {
                // The client's retry policy: RetriableException waits (500 ms, doubling, at
                // most 2 s here) and retries the same router.
                let wait = (500 * MILLISECOND * (1 << attempt.min(4))).min(2 * SECOND);
                queue.push(Reverse((client_end + wait, index, attempt + 1)));
            }
        }
    }
    while next_metrics <= duration {
        emit_metrics(&mut emitter, &mut routers, &servers, next_metrics);
        next_metrics += SECOND;
    }
    emitter.finish(sink);

    let mut truth = Truth {
        start_unix_nano: config.start_unix_nano,
        end_unix_nano: config.start_unix_nano + duration,
        ..Truth::default()
    };
    for router in &routers {
        let (Some(first), Some(last)) = (router.nna_times.first(), router.nna_times.last()) else { continue };
        let seconds = (last - first) as f64 / SECOND as f64;
        truth.figure(&format!("{}_no_namenodes_answers", router.node), router.nna_times.len());
        truth.figure(&format!("{}_no_namenodes_window_seconds", router.node), seconds);
        if last - first >= 5 * SECOND {
            truth.anomalies.push(ExpectedAnomaly {
                optional: false,
                kind: "no_namenodes_window".to_string(),
                cluster: CLUSTER.to_string(),
                namespace: Some(NAMESPACE.to_string()),
                client_id: None,
                node_id: Some(router.node.to_string()),
                start_unix_nano: config.start_unix_nano + first,
                end_unix_nano: config.start_unix_nano + last,
                detail: format!(
                    "cache reloaded at {:.1} s while {NAMESPACE} had no active; nn6001 active again at {:.1} s; next reload at {:.1} s",
                    (router.reload_phase) as f64 / SECOND as f64,
                    FAILOVER_DONE as f64 / SECOND as f64,
                    (router.reload_phase + CACHE_TTL) as f64 / SECOND as f64,
                ),
            });
        }
    }
    truth.figure("spans", emitter.spans_emitted);
    truth
}

fn emit_metrics(emitter: &mut Emitter, routers: &mut [Router], servers: &[(&str, ProcessId)], at: Nanos) {
    let namespace = || vec![string("lagscope.namespace", NAMESPACE)];
    for (node, process) in servers {
        let mut attributes = namespace();
        attributes.push(string("lagscope.node.role", actual_role(node, at).name()));
        emitter.gauge(*process, "lagscope.server.role", at, 1.0, attributes);
    }
    for router in routers.iter_mut() {
        router.reload_if_due(at);
        emitter.counter(router.process, "lagscope.router.no_namenodes", at, router.no_namenodes as f64, namespace());
        for (node, role) in &router.cache {
            let mut attributes = namespace();
            attributes.extend([string("lagscope.target.node", *node), string("lagscope.node.role", role.name())]);
            emitter.gauge(router.process, "lagscope.router.cached_role", at, 1.0, attributes);
        }
    }
}
