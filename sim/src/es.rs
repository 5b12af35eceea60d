//! Elasticsearch / OpenSearch write path under indexing pressure (seed 003).
//!
//! Index `logs`, two primaries on es-node-1, replica 0 on es-node-2, replica 1 on es-node-3;
//! bulk requests are coordinated by es-node-2 and es-node-3 and forwarded to the primaries.
//! A primary operation holds its bytes on es-node-1 until its replica acknowledges. During
//! [`INCIDENT`] the link from es-node-1 to es-node-2 drops replica 0's requests, so shard 0's
//! operations are not acknowledged until the link is back and their bytes pile up on
//! es-node-1.
//!
//! - Node-level accounting (Elasticsearch's `indexing_pressure.memory.limit`): one budget for
//!   the node. Shard 0's stuck bytes fill it and every primary operation is rejected, shard
//!   1's (healthy) included, until the stuck ones complete.
//! - Shard-level accounting (OpenSearch `shard_indexing_pressure`): each shard has its own
//!   limit; only shard 0 is rejected, and once shard 0 has gone [`REPLICA_FAIL_AFTER`]
//!   without a successful replica acknowledgement the primary fails the replica (the shard
//!   turns yellow), its pending replication is released and indexing continues (the
//!   seed's proposal: fail the replica when rejection due to replica build-up breaches a
//!   time threshold, here 20 s). About 6x fewer primary rejections in all.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::emit::{Emitter, Kind, ProcessId, ProcessSpec, Sink, SpanSpec, int, string};
use crate::rng::Rng;
use crate::truth::ExpectedAnomaly;
use crate::{MILLISECOND, Nanos, SECOND, ScenarioInfo, SimConfig, Truth};

pub const SCENARIOS: &[ScenarioInfo] = &[
    ScenarioInfo {
        name: "es-node-level-pressure",
        system: "elasticsearch",
        summary: "a slow replica path fills the node's indexing budget; node-level limits reject writes for the healthy shard too",
    },
    ScenarioInfo {
        name: "es-shard-level-pressure",
        system: "elasticsearch",
        summary: "shard-level accounting rejects only the hot shard's requests and fails its stuck replica; about 6x fewer primary rejections",
    },
];

const CLUSTER: &str = "es-prod";
const SHARDS: [&str; 2] = ["logs/0", "logs/1"];
const NODE_LIMIT: i64 = 64 * 1024 * 1024;
const SHARD_LIMIT: i64 = NODE_LIMIT / 2;
const INCIDENT: (Nanos, Nanos) = (20 * SECOND, 80 * SECOND);
const REPLICA_FAIL_AFTER: Nanos = 20 * SECOND;
/// How long a shard's load must stay above 80% of its limit to be `shard_pressure` (the
/// detector's default `min_seconds`).
const PRESSURE_SECONDS: Nanos = 10 * SECOND;
const REJECTED: &str = "org.elasticsearch.common.util.concurrent.EsRejectedExecutionException";

pub fn run(config: &SimConfig, sink: &mut dyn Sink) -> Option<Truth> {
    let shard_level = match config.scenario.as_str() {
        "es-node-level-pressure" => false,
        "es-shard-level-pressure" => true,
        _ => return None,
    };
    Some(Model::new(config, shard_level).run(sink))
}

struct InFlight {
    done: Nanos,
    shard: usize,
    bytes: i64,
}

struct Model {
    rng: Rng,
    emitter: Emitter,
    shard_level: bool,
    duration: Nanos,
    rate_per_shard: f64,
    client: ProcessId,
    coordinators: [ProcessId; 2],
    primary_node: ProcessId,
    in_flight: Vec<InFlight>,
    /// Bytes held on es-node-1 per shard (primary role).
    primary_bytes: [i64; 2],
    rejections: [u64; 2],
    last_replica_ack: [Nanos; 2],
    replica_failed: [bool; 2],
    truth: Truth,
    requests: u64,
    /// Truth: when each shard's pressure was above 80% of its limit, and unfair rejections.
    pressure_windows: [Option<(Nanos, Nanos)>; 2],
    unfair: Option<(Nanos, Nanos)>,
}

impl Model {
    fn new(config: &SimConfig, shard_level: bool) -> Self {
        let mut rng = Rng::new(config.seed);
        let mut emitter = Emitter::new(config.start_unix_nano, SECOND, rng.fork(1).named(&config.scenario));
        let spec = |service: &str, component: &'static str, node: &str| ProcessSpec {
            service: service.to_string(),
            system: "elasticsearch".to_string(),
            cluster: CLUSTER.to_string(),
            component,
            node_id: node.to_string(),
        };
        let client = emitter.process(spec("es-bulk-client", "client", "ingest-1"));
        let coordinators = [
            emitter.process(spec("es-node", "router", "es-node-2")),
            emitter.process(spec("es-node", "router", "es-node-3")),
        ];
        let primary_node = emitter.process(spec("es-node", "server", "es-node-1"));
        let duration = config.duration.unwrap_or(120 * SECOND);
        Self {
            rng,
            emitter,
            shard_level,
            duration,
            rate_per_shard: config.rate.unwrap_or(200.0) / 2.0,
            client,
            coordinators,
            primary_node,
            in_flight: Vec::new(),
            primary_bytes: [0; 2],
            rejections: [0; 2],
            last_replica_ack: [0; 2],
            replica_failed: [false; 2],
            truth: Truth {
                start_unix_nano: config.start_unix_nano,
                end_unix_nano: config.start_unix_nano + duration,
                ..Truth::default()
            },
            requests: 0,
            pressure_windows: [None; 2],
            unfair: None,
        }
    }

    fn run(mut self, sink: &mut dyn Sink) -> Truth {
        let mut arrivals: BinaryHeap<Reverse<(Nanos, usize)>> = BinaryHeap::new();
        for shard in 0..SHARDS.len() {
            let first = self.gap();
            arrivals.push(Reverse((first, shard)));
        }
        let mut next_metrics = 0;
        while let Some(Reverse((at, shard))) = arrivals.pop() {
            if at >= self.duration {
                break;
            }
            self.complete_until(at);
            while next_metrics <= at {
                self.emit_metrics(next_metrics);
                next_metrics += SECOND;
            }
            self.emitter.advance(at, sink);
            self.bulk(shard, at);
            let next = at + self.gap();
            arrivals.push(Reverse((next, shard)));
        }
        self.complete_until(self.duration);
        while next_metrics <= self.duration {
            self.emit_metrics(next_metrics);
            next_metrics += SECOND;
        }
        self.emitter.finish(sink);
        self.finish_truth();
        self.truth
    }

    fn gap(&mut self) -> Nanos {
        (self.rng.exponential(SECOND as f64 / self.rate_per_shard) as Nanos).max(100_000)
    }

    fn complete_until(&mut self, at: Nanos) {
        let mut index = 0;
        while index < self.in_flight.len() {
            if self.in_flight[index].done <= at {
                let done = self.in_flight.swap_remove(index);
                self.primary_bytes[done.shard] -= done.bytes;
                self.last_replica_ack[done.shard] = self.last_replica_ack[done.shard].max(done.done);
            } else {
                index += 1;
            }
        }
    }

    fn stuck(&self, shard: usize, at: Nanos) -> bool {
        shard == 0 && (INCIDENT.0..INCIDENT.1).contains(&at) && !self.replica_failed[shard]
    }

    fn bulk(&mut self, shard: usize, at: Nanos) {
        // Shard-level: a shard whose replica has not acknowledged for too long gets its
        // replica failed, and stops waiting for it.
        if self.shard_level
            && shard == 0
            && !self.replica_failed[0]
            && (INCIDENT.0..INCIDENT.1).contains(&at)
            && at - self.last_replica_ack[0].max(INCIDENT.0) > REPLICA_FAIL_AFTER
        {
            self.replica_failed[0] = true;
            // Failing the replica fails its pending replication: the primary releases them.
            for pending in self.in_flight.iter_mut().filter(|pending| pending.shard == 0) {
                pending.done = pending.done.min(at);
            }
            self.complete_until(at);
            self.truth.figure("replica_failed_at_seconds", at as f64 / SECOND as f64);
        }
        let bytes = self.rng.range(64, 192) * 1024;
        let node_total: i64 = self.primary_bytes.iter().sum();
        let (limit, current) =
            if self.shard_level { (SHARD_LIMIT, self.primary_bytes[shard]) } else { (NODE_LIMIT, node_total) };
        let rejected = current + bytes > limit;
        let coordinator = self.coordinators[(self.requests % 2) as usize];
        self.requests += 1;
        let call_id = format!("bulk-{}", self.requests);
        let primary_start = at + 2 * 300_000;
        let (primary_end, outcome) = if rejected {
            self.rejections[shard] += 1;
            if !self.shard_level && shard == 1 {
                let window = self.unfair.get_or_insert((at, at));
                window.1 = at;
            }
            (primary_start + 200_000, "rejected")
        } else {
            let done =
                if self.stuck(shard, at) { INCIDENT.1 + 4 * MILLISECOND } else { primary_start + 7 * MILLISECOND };
            self.primary_bytes[shard] += bytes;
            self.in_flight.push(InFlight { done, shard, bytes });
            (done, "ok")
        };
        // Pressure windows (truth): above 80% of the limit that governs the shard.
        let shard_load = if self.shard_level { self.primary_bytes[shard] } else { self.primary_bytes.iter().sum() };
        if shard == 0 && shard_load * 5 > limit * 4 {
            let window = self.pressure_windows[0].get_or_insert((at, at));
            window.1 = at;
        }
        let end = primary_end + 2 * 300_000;
        let message = (outcome == "rejected").then(|| {
            format!(
                "rejected execution of primary operation [coordinating_and_primary_bytes={current}, replica_bytes=0, all_bytes={current}, primary_operation_bytes={bytes}, max_coordinating_and_primary_bytes={limit}]"
            )
        });
        let namespace = SHARDS[shard];
        let mut client_span = SpanSpec::new("bulk", Kind::Client, at, end);
        client_span.traced = true;
        client_span.attributes = vec![
            string("lagscope.client.id", "ingest-1"),
            string("lagscope.call.id", call_id.clone()),
            int("lagscope.attempt", 0),
            string("lagscope.namespace", namespace),
            string("lagscope.op", "write"),
            string("rpc.method", "bulk"),
            int("lagscope.bytes", bytes),
            string("lagscope.outcome", outcome),
        ];
        if let Some(message) = &message {
            client_span.attributes.push(string("error.type", REJECTED));
            client_span.error = Some(message.clone());
        }
        let client_context = self.emitter.span(self.client, client_span);
        let mut coordinator_span = SpanSpec::new("indices:data/write/bulk", Kind::Server, at + 300_000, end - 300_000);
        coordinator_span.parent = Some(client_context);
        coordinator_span.attributes = vec![
            string("lagscope.namespace", namespace),
            string("lagscope.target.node", "es-node-1"),
            string("lagscope.target.role", "primary"),
            int("lagscope.bytes", bytes),
            string("lagscope.outcome", outcome),
        ];
        let coordinator_context = self.emitter.span(coordinator, coordinator_span);
        let mut primary_span = SpanSpec::new("indices:data/write/bulk[s][p]", Kind::Server, primary_start, primary_end);
        primary_span.parent = Some(coordinator_context);
        primary_span.attributes = vec![
            string("lagscope.namespace", namespace),
            string("lagscope.op", "write"),
            string("lagscope.node.role", "primary"),
            int("lagscope.bytes", bytes),
            string("lagscope.outcome", outcome),
        ];
        if let Some(message) = message {
            primary_span.attributes.push(string("error.type", REJECTED));
            primary_span.error = Some(message);
        }
        self.emitter.span(self.primary_node, primary_span);
    }

    fn emit_metrics(&mut self, at: Nanos) {
        self.complete_until(at);
        for (shard, namespace) in SHARDS.iter().enumerate() {
            let labels =
                |role: &str| vec![string("lagscope.namespace", *namespace), string("lagscope.shard.role", role)];
            let process = self.primary_node;
            self.emitter.gauge(
                process,
                "lagscope.shard.inflight_bytes",
                at,
                self.primary_bytes[shard] as f64,
                labels("primary"),
            );
            let limit = if self.shard_level { SHARD_LIMIT } else { NODE_LIMIT };
            self.emitter.gauge(process, "lagscope.shard.limit_bytes", at, limit as f64, labels("primary"));
            self.emitter.counter(
                process,
                "lagscope.shard.rejections",
                at,
                self.rejections[shard] as f64,
                labels("primary"),
            );
        }
    }

    fn finish_truth(&mut self) {
        let start_unix_nano = self.truth.start_unix_nano;
        let unix = |at: Nanos| start_unix_nano + at;
        let total: u64 = self.rejections.iter().sum();
        self.truth.figure("primary_rejections", total);
        self.truth.figure("primary_rejections_logs_0", self.rejections[0]);
        self.truth.figure("primary_rejections_logs_1", self.rejections[1]);
        self.truth.figure("spans", self.emitter.spans_emitted);
        let mut anomalies = Vec::new();
        // The load is reported once a second (`emit_metrics`): a window within a second of the
        // 10 s it must last may be seen by its samples either side of that (69.7-80.0 s held,
        // sampled at 70-79 s: 9 s), and is borderline.
        if let Some((start, end)) = self.pressure_windows[0]
            && end - start >= PRESSURE_SECONDS - SECOND
        {
            anomalies.push(ExpectedAnomaly {
                optional: end - start < PRESSURE_SECONDS + SECOND,
                kind: "shard_pressure".to_string(),
                cluster: CLUSTER.to_string(),
                namespace: Some("logs/0".to_string()),
                client_id: None,
                node_id: Some("es-node-1".to_string()),
                start_unix_nano: unix(start),
                end_unix_nano: unix(end),
                detail: "shard 0's primary bytes held above 80% of the limit while replica 0's acknowledgements were delayed".to_string(),
            });
        }
        if let Some((start, end)) = self.unfair {
            anomalies.push(ExpectedAnomaly {
                optional: false,
                kind: "unfair_rejection".to_string(),
                cluster: CLUSTER.to_string(),
                namespace: Some("logs/1".to_string()),
                client_id: None,
                node_id: Some("es-node-1".to_string()),
                start_unix_nano: unix(start),
                end_unix_nano: unix(end),
                detail: format!(
                    "{} writes to the healthy shard 1 rejected by the node's budget that shard 0 filled",
                    self.rejections[1]
                ),
            });
        }
        self.truth.anomalies.extend(anomalies);
    }
}
