//! Apache Ozone Manager follower reads (seed 000, HDDS-17548) and follower apply lag.
//!
//! Three OMs in one Ratis ring. The client's follower-read failover proxy provider keeps a
//! believed leader and a follower-read node:
//! - MC-1: an `OMNotLeaderException` answer to a LOCAL_LEASE read makes the provider call
//!   `disableFollowerRead`: the flag is client-wide and never set back, so every later
//!   unhinted read goes to the leader with the leader consistency (DEFAULT) instead of
//!   LINEARIZABLE_ALLOW_FOLLOWER on a follower. The fix moves the follower-read node to the
//!   next OM and sends only that read to the leader.
//! - MC-4: a newly elected leader that is not ready answers `OMLeaderNotReadyException`; the
//!   retry policy retries the OM it believes is the leader, and the follower-read selection
//!   skips that one, so it picks the not-ready OM again: every attempt of the read goes to
//!   it (7 over Hadoop RPC, 6 over gRPC with a budget of 6 failovers) while the other two
//!   OMs could serve. The fix moves on after the first answer and is served at once.

use opentelemetry_proto::tonic::common::v1::KeyValue;

use crate::emit::{Emitter, Kind, ProcessId, ProcessSpec, Sink, SpanSpec, boolean, int, string};
use crate::rng::Rng;
use crate::truth::ExpectedAnomaly;
use crate::{MILLISECOND, Nanos, SECOND, ScenarioInfo, SimConfig, Truth};

pub const SCENARIOS: &[ScenarioInfo] = &[
    ScenarioInfo {
        name: "ozone-follower-read-disabled",
        system: "ozone",
        summary: "HDDS-17548 MC-1: one rejected LOCAL_LEASE read turns follower read off for the client's life; unhinted reads become DEFAULT on the leader",
    },
    ScenarioInfo {
        name: "ozone-follower-read-disabled-fixed",
        system: "ozone",
        summary: "MC-1 fixed: the rejection moves the follower-read node; later reads stay LINEARIZABLE_ALLOW_FOLLOWER on a follower",
    },
    ScenarioInfo {
        name: "ozone-pinned-retry",
        system: "ozone",
        summary: "HDDS-17548 MC-4: a LOCAL_LEASE read retries only the not-ready new leader (7 attempts over Hadoop RPC, 6 over gRPC)",
    },
    ScenarioInfo {
        name: "ozone-pinned-retry-fixed",
        system: "ozone",
        summary: "MC-4 fixed: the read moves to another OM and is served at once",
    },
    ScenarioInfo {
        name: "ozone-apply-lag",
        system: "ozone",
        summary: "a follower's applied index stalls behind the leader's commit index, then catches up",
    },
];

const CLUSTER: &str = "ozone-prod";
const SERVICE_ID: &str = "omservice1";
const OMS: [&str; 3] = ["om1", "om2", "om3"];
const HOP: Nanos = 400_000;
const NOT_LEADER: &str = "org.apache.hadoop.ozone.om.exceptions.OMNotLeaderException";
const NOT_READY: &str = "org.apache.hadoop.ozone.om.exceptions.OMLeaderNotReadyException";
/// `ozone.client.wait.between.retries.millis`: grows linearly when the same OM is retried.
const RETRY_WAIT: Nanos = 2 * SECOND;
/// The failover budget of the seed's reproduction.
const FAILOVER_BUDGET: i64 = 6;
const LOG_LIMIT: i64 = 10_000;

pub fn run(config: &SimConfig, sink: &mut dyn Sink) -> Option<Truth> {
    let mut ring = Ring::new(config);
    match config.scenario.as_str() {
        "ozone-follower-read-disabled" => ring.follower_read_disabled(sink, false),
        "ozone-follower-read-disabled-fixed" => ring.follower_read_disabled(sink, true),
        "ozone-pinned-retry" => ring.pinned_retry(sink, false),
        "ozone-pinned-retry-fixed" => ring.pinned_retry(sink, true),
        "ozone-apply-lag" => ring.apply_lag(sink),
        _ => return None,
    }
    ring.emitter.finish(sink);
    ring.truth.figure("spans", ring.emitter.spans_emitted);
    Some(ring.truth)
}

/// When om2 is elected and how long it stays not ready (MC-4).
const ELECTION: Nanos = 5 * SECOND;
const NOT_READY_UNTIL: Nanos = 70 * SECOND;
/// om3's applier stall (apply lag).
const STALL: (Nanos, Nanos) = (15 * SECOND, 45 * SECOND);
const CATCH_UP_RATE: f64 = 2_000.0;

struct Ring {
    rng: Rng,
    emitter: Emitter,
    duration: Nanos,
    commit_rate: f64,
    oms: Vec<ProcessId>,
    truth: Truth,
    scenario: String,
    next_metrics: Nanos,
    calls: u64,
    /// Per OM (OMMetrics): linearizable reads, LOCAL_LEASE reads served, refused for the
    /// lease time.
    linearizable_reads: [u64; 3],
    local_lease_success: [u64; 3],
    local_lease_fail_time: [u64; 3],
}

/// One read or write attempt as the model decided it.
struct Attempt<'a> {
    client: &'a str,
    client_process: ProcessId,
    call_id: String,
    attempt: i64,
    op: &'static str,
    method: &'static str,
    target: &'static str,
    believed_role: &'static str,
    consistency: &'static str,
    follower_read: bool,
    start: Nanos,
    error: Option<(&'static str, String)>,
    events: Vec<(Nanos, String, Vec<KeyValue>)>,
}

impl Ring {
    fn new(config: &SimConfig) -> Self {
        let mut rng = Rng::new(config.seed);
        let mut emitter = Emitter::new(config.start_unix_nano, SECOND, rng.fork(1).named(&config.scenario));
        let oms = OMS.iter().map(|node| emitter.process(spec("ozone-om", "server", node))).collect();
        let duration = config.duration.unwrap_or(90 * SECOND);
        Self {
            rng,
            emitter,
            duration,
            commit_rate: config.rate.unwrap_or(500.0),
            oms,
            truth: Truth {
                start_unix_nano: config.start_unix_nano,
                end_unix_nano: config.start_unix_nano + duration,
                ..Truth::default()
            },
            scenario: config.scenario.clone(),
            next_metrics: 0,
            calls: 0,
            linearizable_reads: [0; 3],
            local_lease_success: [0; 3],
            local_lease_fail_time: [0; 3],
        }
    }

    fn leader_at(&self, at: Nanos) -> &'static str {
        if self.scenario.starts_with("ozone-pinned-retry") && at >= ELECTION { "om2" } else { "om1" }
    }

    fn commit_index(&self, at: Nanos) -> i64 {
        100_000 + (self.commit_rate * at.max(0) as f64 / SECOND as f64) as i64
    }

    fn applied_index(&self, node: &str, at: Nanos) -> i64 {
        let commit = self.commit_index(at);
        if node == self.leader_at(at) {
            // A not-ready new leader is still applying its backlog.
            if self.scenario.starts_with("ozone-pinned-retry") && (ELECTION..NOT_READY_UNTIL).contains(&at) {
                return self.commit_index(ELECTION) - 2 * LOG_LIMIT + (at - ELECTION) / MILLISECOND;
            }
            return commit;
        }
        let trailing = self.commit_index(at - 30 * MILLISECOND);
        if self.scenario == "ozone-apply-lag" && node == "om3" && at >= STALL.0 {
            let frozen = self.commit_index(STALL.0 - 30 * MILLISECOND);
            if at < STALL.1 {
                return frozen;
            }
            return trailing.min(frozen + (CATCH_UP_RATE * (at - STALL.1) as f64 / SECOND as f64) as i64);
        }
        trailing
    }

    fn advance(&mut self, at: Nanos, sink: &mut dyn Sink) {
        while self.next_metrics <= at.min(self.duration) {
            let now = self.next_metrics;
            for (index, node) in OMS.iter().enumerate() {
                let process = self.oms[index];
                let service = || vec![string("lagscope.namespace", SERVICE_ID)];
                let role = if *node == self.leader_at(now) { "leader" } else { "follower" };
                self.emitter.gauge(
                    process,
                    "lagscope.server.applied_state",
                    now,
                    self.applied_index(node, now) as f64,
                    service(),
                );
                if role == "leader" {
                    self.emitter.gauge(
                        process,
                        "lagscope.server.committed_state",
                        now,
                        self.commit_index(now) as f64,
                        service(),
                    );
                }
                let mut role_attributes = service();
                role_attributes.push(string("lagscope.node.role", role));
                self.emitter.gauge(process, "lagscope.server.role", now, 1.0, role_attributes);
                let counters = [
                    ("lagscope.ozone.linearizable_reads", self.linearizable_reads[index]),
                    ("lagscope.ozone.local_lease_success", self.local_lease_success[index]),
                    ("lagscope.ozone.local_lease_fail_time", self.local_lease_fail_time[index]),
                ];
                for (name, total) in counters {
                    self.emitter.counter(process, name, now, total as f64, service());
                }
            }
            self.next_metrics += SECOND;
        }
        self.emitter.advance(at, sink);
    }

    /// Emits the client span of an attempt and, when it reached an OM, the OM's span.
    fn emit(&mut self, attempt: Attempt<'_>) -> Nanos {
        let server_start = attempt.start + HOP;
        let server_end = server_start + if attempt.error.is_some() { 300_000 } else { 1_200_000 };
        let end = server_end + HOP;
        let outcome = if attempt.error.is_some() { "rejected" } else { "ok" };
        let mut client_span =
            SpanSpec::new(format!("OzoneManagerProtocol/{}", attempt.method), Kind::Client, attempt.start, end);
        client_span.traced = true;
        client_span.attributes = vec![
            string("lagscope.client.id", attempt.client),
            string("lagscope.call.id", attempt.call_id.clone()),
            int("lagscope.attempt", attempt.attempt),
            string("lagscope.namespace", SERVICE_ID),
            string("lagscope.op", attempt.op),
            string("rpc.method", attempt.method),
            string("lagscope.target.node", attempt.target),
            string("lagscope.target.role", attempt.believed_role),
            string("lagscope.outcome", outcome),
        ];
        if attempt.op == "read" {
            client_span.attributes.push(string("lagscope.consistency", attempt.consistency));
            client_span.attributes.push(boolean("lagscope.follower_read", attempt.follower_read));
        }
        if attempt.attempt > 0 {
            client_span.attributes.push(int("lagscope.retry.delay_ms", RETRY_WAIT / MILLISECOND * attempt.attempt));
        }
        if let Some((error_type, message)) = &attempt.error {
            client_span.attributes.push(string("error.type", *error_type));
            client_span.error = Some(message.clone());
        }
        client_span.events = attempt.events;
        let parent = self.emitter.span(attempt.client_process, client_span);
        let node_index = OMS.iter().position(|node| *node == attempt.target).unwrap_or(0);
        if attempt.op == "read" {
            match (attempt.consistency, &attempt.error) {
                ("LINEARIZABLE_ALLOW_FOLLOWER", None) => self.linearizable_reads[node_index] += 1,
                ("LOCAL_LEASE", None) => self.local_lease_success[node_index] += 1,
                ("LOCAL_LEASE", Some((NOT_LEADER, _))) => self.local_lease_fail_time[node_index] += 1,
                _ => {}
            }
        }
        let role = if attempt.target == self.leader_at(server_start) { "leader" } else { "follower" };
        let mut server_span =
            SpanSpec::new(format!("OzoneManagerProtocol/{}", attempt.method), Kind::Server, server_start, server_end);
        server_span.parent = Some(parent);
        // The OM knows the caller and the call from the Hadoop RPC header (client id, call id,
        // retry count), whether or not trace context came with it.
        server_span.attributes = vec![
            string("lagscope.client.id", attempt.client),
            string("lagscope.call.id", attempt.call_id.clone()),
            int("lagscope.attempt", attempt.attempt),
            string("lagscope.namespace", SERVICE_ID),
            string("lagscope.op", attempt.op),
            string("rpc.method", attempt.method),
            string("lagscope.node.role", role),
            string("lagscope.outcome", outcome),
            int("lagscope.state.committed", self.commit_index(server_start)),
        ];
        if attempt.op == "read" {
            server_span.attributes.push(string("lagscope.consistency", attempt.consistency));
        }
        // A linearizable read (ReadIndex) is served once the node applied the leader's commit
        // index; the leader's DEFAULT read at its own state; a LOCAL_LEASE read at whatever
        // the follower has applied, within the lease.
        let served = match attempt.consistency {
            "LOCAL_LEASE" => self.applied_index(attempt.target, server_start),
            _ => self.commit_index(server_start),
        };
        match &attempt.error {
            None => server_span.attributes.push(int("lagscope.state.served", served)),
            Some((error_type, message)) => {
                server_span.attributes.push(string("error.type", *error_type));
                server_span.error = Some(message.clone());
            }
        }
        self.emitter.span(self.oms[node_index], server_span);
        end
    }

    fn client(&mut self, name: &str) -> ProcessId {
        self.emitter.process(spec("ozone-client", "client", name))
    }

    fn next_call(&mut self, client: &str) -> String {
        self.calls += 1;
        format!("{client}-{}", self.calls)
    }

    fn read(
        &mut self,
        client: &str,
        process: ProcessId,
        at: Nanos,
        target: &'static str,
        consistency: &'static str,
        follower_read: bool,
    ) -> Nanos {
        let call_id = self.next_call(client);
        let believed_role = if target == "om1" { "leader" } else { "follower" };
        let method = *self.rng.pick(&["LookupKey", "GetKeyInfo", "ListKeys", "InfoBucket"]);
        self.emit(Attempt {
            client,
            client_process: process,
            call_id,
            attempt: 0,
            op: "read",
            method,
            target,
            believed_role,
            consistency,
            follower_read,
            start: at,
            error: None,
            events: Vec::new(),
        })
    }

    fn write(&mut self, client: &str, process: ProcessId, at: Nanos) -> Nanos {
        let call_id = self.next_call(client);
        let leader = self.leader_at(at);
        let method = *self.rng.pick(&["CreateKey", "CommitKey", "DeleteKey", "RenameKey"]);
        self.emit(Attempt {
            client,
            client_process: process,
            call_id,
            attempt: 0,
            op: "write",
            method,
            target: leader,
            believed_role: "leader",
            consistency: "DEFAULT",
            follower_read: false,
            start: at,
            error: None,
            events: Vec::new(),
        })
    }

    fn think(&mut self, mean: Nanos) -> Nanos {
        (self.rng.exponential(mean as f64) as Nanos).max(MILLISECOND)
    }

    fn expected(
        &self,
        kind: &str,
        client: Option<&str>,
        node: &str,
        start: Nanos,
        end: Nanos,
        detail: String,
    ) -> ExpectedAnomaly {
        ExpectedAnomaly {
            optional: false,
            kind: kind.to_string(),
            cluster: CLUSTER.to_string(),
            namespace: Some(SERVICE_ID.to_string()),
            client_id: client.map(str::to_string),
            node_id: Some(node.to_string()),
            start_unix_nano: self.truth.start_unix_nano + start,
            end_unix_nano: self.truth.start_unix_nano + end,
            detail,
        }
    }

    /// MC-1: the S3 gateway's one OzoneClient loses follower read for good.
    fn follower_read_disabled(&mut self, sink: &mut dyn Sink, fixed: bool) {
        let gateway = "s3g-1";
        let gateway_process = self.client(gateway);
        let writer = "writer-1";
        let writer_process = self.client(writer);
        let rejection_at = 10 * SECOND;
        let mut follower_read = true;
        let mut follower_node: &'static str = "om2";
        let mut at = 200 * MILLISECOND;
        let mut writer_at = 100 * MILLISECOND;
        let mut rejected = false;
        let mut after_rejection = 0;
        let mut after_rejection_on_follower = 0;
        while at < self.duration {
            while writer_at < at {
                self.advance(writer_at, sink);
                let end = self.write(writer, writer_process, writer_at);
                writer_at = end + self.think(300 * MILLISECOND);
            }
            self.advance(at, sink);
            if !rejected && at >= rejection_at {
                rejected = true;
                // The hinted LOCAL_LEASE read (per-request lease time 0 ms): the follower fails
                // the lease check and answers OMNotLeaderException.
                let call_id = self.next_call(gateway);
                let message = format!("OM:{follower_node} is not the leader. Suggested leader is OM:om1[om1:9862].");
                let mut events = Vec::new();
                if !fixed {
                    events.push((
                        at + 2 * HOP,
                        "lagscope.follower_read.disabled".to_string(),
                        vec![
                            string("lagscope.failover.from", follower_node),
                            string("lagscope.failover.reason", NOT_LEADER),
                        ],
                    ));
                    self.emitter.log(
                        gateway_process,
                        at + 2 * HOP,
                        (5, "DEBUG"),
                        format!("Encountered OMNotLeaderException from {follower_node}. Disable OM follower read and retry OM leader directly."),
                        vec![],
                    );
                }
                let first = Attempt {
                    client: gateway,
                    client_process: gateway_process,
                    call_id: call_id.clone(),
                    attempt: 0,
                    op: "read",
                    method: "LookupKey",
                    target: follower_node,
                    believed_role: "follower",
                    consistency: "LOCAL_LEASE",
                    follower_read,
                    start: at,
                    error: Some((NOT_LEADER, message)),
                    events,
                };
                let rejected_end = self.emit(first);
                self.truth.figure("rejected_local_lease_read_node", follower_node);
                if fixed {
                    follower_node = "om3";
                } else {
                    follower_read = false;
                    let detail =
                        "OMNotLeaderException from a LOCAL_LEASE read disabled follower read for the client's life"
                            .to_string();
                    let anomaly =
                        self.expected("follower_read_disabled", Some(gateway), "om2", at, self.duration, detail);
                    self.truth.anomalies.push(anomaly);
                }
                let retry = Attempt {
                    client: gateway,
                    client_process: gateway_process,
                    call_id,
                    attempt: 1,
                    op: "read",
                    method: "LookupKey",
                    target: "om1",
                    believed_role: "leader",
                    consistency: "LOCAL_LEASE",
                    follower_read,
                    start: rejected_end,
                    error: None,
                    events: Vec::new(),
                };
                at = self.emit(retry) + MILLISECOND;
                continue;
            }
            // An unhinted read: follower consistency on the follower-read node, or the leader
            // consistency on the leader once follower read is off.
            let (target, consistency) =
                if follower_read { (follower_node, "LINEARIZABLE_ALLOW_FOLLOWER") } else { ("om1", "DEFAULT") };
            let end = self.read(gateway, gateway_process, at, target, consistency, follower_read);
            if rejected && after_rejection < 5 {
                after_rejection += 1;
                after_rejection_on_follower += i64::from(target != "om1");
                at = end + MILLISECOND;
                continue;
            }
            at = end + self.think(250 * MILLISECOND);
        }
        self.truth.figure("unhinted_reads_after_rejection", after_rejection);
        self.truth.figure("unhinted_reads_served_by_follower", after_rejection_on_follower);
    }

    /// MC-4: LOCAL_LEASE reads pinned to a not-ready new leader, over both transports.
    fn pinned_retry(&mut self, sink: &mut dyn Sink, fixed: bool) {
        let clients: [(&str, &str, i64); 2] =
            [("app-rpc-1", "hadoop-rpc", FAILOVER_BUDGET + 1), ("s3g-grpc-1", "grpc", FAILOVER_BUDGET)];
        let processes: Vec<ProcessId> = clients.iter().map(|(name, _, _)| self.client(name)).collect();
        let background = "reader-bg";
        let background_process = self.client(background);
        // Each client learns that om1 is the leader from a write.
        for (index, (name, _, _)) in clients.iter().enumerate() {
            let at = SECOND + index as Nanos * 100 * MILLISECOND;
            self.advance(at, sink);
            self.write(name, processes[index], at);
        }
        // Retry schedules of both clients' LOCAL_LEASE read, interleaved with a background
        // reader that om1 and om3 keep serving.
        let mut schedules: Vec<(Nanos, usize, i64)> = Vec::new();
        for (index, (_, _, attempts)) in clients.iter().enumerate() {
            let mut at = 6 * SECOND + index as Nanos * 50 * MILLISECOND;
            let total = if fixed { 2 } else { *attempts };
            for attempt in 0..total {
                schedules.push((at, index, attempt));
                at += RETRY_WAIT * (attempt + 1);
            }
        }
        schedules.sort();
        let mut background_at = 2 * SECOND;
        let mut windows: Vec<(Nanos, Nanos, i64)> = vec![(Nanos::MAX, 0, 0); clients.len()];
        let call_ids: Vec<String> = clients.iter().map(|(name, _, _)| format!("{name}-local-lease-read")).collect();
        for (at, index, attempt) in schedules {
            while background_at < at {
                self.advance(background_at, sink);
                let target = if self.rng.chance(0.5) { "om1" } else { "om3" };
                let end = self.read(background, background_process, background_at, target, "LOCAL_LEASE", true);
                background_at = end + self.think(400 * MILLISECOND);
            }
            self.advance(at, sink);
            let (name, transport, _) = clients[index];
            let served_elsewhere = fixed && attempt == 1;
            let target = if served_elsewhere { "om1" } else { "om2" };
            let error = (!served_elsewhere)
                .then(|| (NOT_READY, "om2 is Leader but not ready to process request yet.".to_string()));
            let mut events = Vec::new();
            if attempt > 0 {
                let reason = format!("{NOT_READY} ({transport})");
                events.push((
                    at,
                    "lagscope.failover".to_string(),
                    vec![
                        string("lagscope.failover.from", "om2"),
                        string("lagscope.failover.to", target),
                        string("lagscope.failover.reason", reason),
                    ],
                ));
            }
            let end = self.emit(Attempt {
                client: name,
                client_process: processes[index],
                call_id: call_ids[index].clone(),
                attempt,
                op: "read",
                method: "LookupKey",
                target,
                believed_role: if target == "om1" { "leader" } else { "follower" },
                consistency: "LOCAL_LEASE",
                follower_read: true,
                start: at,
                error,
                events,
            });
            if !served_elsewhere {
                let window = &mut windows[index];
                window.0 = window.0.min(at);
                window.1 = window.1.max(end);
                window.2 += 1;
            }
        }
        while background_at < self.duration {
            self.advance(background_at, sink);
            let target = if self.rng.chance(0.5) { "om1" } else { "om3" };
            let end = self.read(background, background_process, background_at, target, "LOCAL_LEASE", true);
            background_at = end + self.think(400 * MILLISECOND);
        }
        self.advance(self.duration, sink);
        for (index, (name, transport, _)) in clients.iter().enumerate() {
            let (start, end, attempts) = windows[index];
            self.truth.figure(&format!("attempts_to_om2_{}", transport.replace('-', "_")), attempts);
            if !fixed {
                let detail = format!(
                    "{attempts} attempts over {transport}, all to the not-ready leader om2; om1 and om3 were serving"
                );
                let anomaly = self.expected("pinned_retry", Some(name), "om2", start, end, detail);
                self.truth.anomalies.push(anomaly);
            }
        }
    }

    /// A follower's applier stalls; the leader keeps committing.
    fn apply_lag(&mut self, sink: &mut dyn Sink) {
        let writer = "writer-1";
        let writer_process = self.client(writer);
        let reader = "reader-1";
        let reader_process = self.client(reader);
        let mut at = 100 * MILLISECOND;
        while at < self.duration {
            self.advance(at, sink);
            let end = if self.rng.chance(0.5) {
                self.write(writer, writer_process, at)
            } else {
                self.read(reader, reader_process, at, "om2", "LINEARIZABLE_ALLOW_FOLLOWER", true)
            };
            at = end + self.think(100 * MILLISECOND);
        }
        self.advance(self.duration, sink);
        let mut caught_up = STALL.1;
        while caught_up < self.duration
            && self.applied_index("om3", caught_up) < self.commit_index(caught_up - 30 * MILLISECOND)
        {
            caught_up += 100 * MILLISECOND;
        }
        let peak = self.commit_index(STALL.1) - self.applied_index("om3", STALL.1);
        self.truth.figure("om3_peak_lag_states", peak);
        self.truth.figure("om3_caught_up_seconds", caught_up as f64 / SECOND as f64);
        let detail = format!(
            "om3's applier stalled from {} s to {} s; {peak} states behind at the peak",
            STALL.0 / SECOND,
            STALL.1 / SECOND
        );
        let anomaly = self.expected("apply_lag", None, "om3", STALL.0, caught_up, detail);
        self.truth.anomalies.push(anomaly);
    }
}

fn spec(service: &str, component: &'static str, node: &str) -> ProcessSpec {
    ProcessSpec {
        service: service.to_string(),
        system: "ozone".to_string(),
        cluster: CLUSTER.to_string(),
        component,
        node_id: node.to_string(),
    }
}
