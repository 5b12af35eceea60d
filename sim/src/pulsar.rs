//! Pulsar client cluster failover (seed 004: PIP-121's AutoClusterFailover and the health
//! probe proposed for half-dead clusters).
//!
//! A producer on `pulsar://pulsar-east:6650` (primary) with `pulsar://pulsar-west:6650` as
//! secondary. Every `checkInterval` the client probes its current service URL; once it has
//! been down longer than `failoverDelay` it switches to the first secondary that probes up,
//! and switches back once the primary has been up for `switchBackDelay`. From [`HALF_DEAD`]
//! the east brokers still accept TCP connections but fail every produce.
//! - With the TCP-connect probe (`probeAvailable`) east always looks up: no failover, and
//!   produce fails for the whole half-dead period.
//! - With a health probe (`CommandHealthCheck`) east is down, the client fails over after
//!   `failoverDelay` and switches back after `switchBackDelay` once east is healthy again.

use crate::emit::{Emitter, Kind, ProcessSpec, Sink, SpanSpec, int, string};
use crate::rng::Rng;
use crate::truth::ExpectedAnomaly;
use crate::{MILLISECOND, Nanos, SECOND, ScenarioInfo, SimConfig, Truth};

pub const SCENARIOS: &[ScenarioInfo] = &[
    ScenarioInfo {
        name: "pulsar-tcp-probe-half-dead",
        system: "pulsar",
        summary: "the TCP probe says the half-dead primary cluster is up while every produce fails; no failover",
    },
    ScenarioInfo {
        name: "pulsar-health-probe",
        system: "pulsar",
        summary: "a health probe sees the half-dead cluster; failover after failoverDelay, switch back after switchBackDelay",
    },
];

const TOPIC: &str = "persistent://public/default/orders";
const HALF_DEAD: (Nanos, Nanos) = (20 * SECOND, 110 * SECOND);
const CHECK_INTERVAL: Nanos = 5 * SECOND;
const FAILOVER_DELAY: Nanos = 30 * SECOND;
const SWITCH_BACK_DELAY: Nanos = 60 * SECOND;
const TIMEOUT: &str = "org.apache.pulsar.client.api.PulsarClientException$TimeoutException";

#[derive(Clone, Copy, PartialEq, Eq)]
struct Cluster {
    name: &'static str,
    host: &'static str,
    broker: &'static str,
}

const EAST: Cluster = Cluster { name: "pulsar-east", host: "pulsar-east", broker: "broker-east-1" };
const WEST: Cluster = Cluster { name: "pulsar-west", host: "pulsar-west", broker: "broker-west-1" };

fn serves(cluster: Cluster, at: Nanos) -> bool {
    cluster != EAST || !(HALF_DEAD.0..HALF_DEAD.1).contains(&at)
}

pub fn run(config: &SimConfig, sink: &mut dyn Sink) -> Option<Truth> {
    let health_probe = match config.scenario.as_str() {
        "pulsar-tcp-probe-half-dead" => false,
        "pulsar-health-probe" => true,
        _ => return None,
    };
    let mut rng = Rng::new(config.seed);
    let mut emitter = Emitter::new(config.start_unix_nano, SECOND, rng.fork(1));
    let duration = config.duration.unwrap_or(200 * SECOND);
    let rate = config.rate.unwrap_or(20.0);
    let client_id = "orders-producer-1";
    let spec = |cluster: &str, component: &'static str, service: &str, node: &str| ProcessSpec {
        service: service.to_string(),
        system: "pulsar".to_string(),
        cluster: cluster.to_string(),
        component,
        node_id: node.to_string(),
    };
    let client = emitter.process(spec(EAST.name, "client", "pulsar-client", "orders-app-1"));
    let brokers = [
        (EAST, emitter.process(spec(EAST.name, "server", "pulsar-broker", EAST.broker))),
        (WEST, emitter.process(spec(WEST.name, "server", "pulsar-broker", WEST.broker))),
    ];
    let probe_kind = if health_probe { "health" } else { "tcp" };
    let mut current = EAST;
    let mut failed_since: Option<Nanos> = None;
    let mut recovered_since: Option<Nanos> = None;
    let mut next_check = CHECK_INTERVAL;
    let mut at = 10 * MILLISECOND;
    let mut sequence = 0u64;
    let mut blind: Option<(Nanos, Nanos)> = None;
    let mut switches = Vec::new();
    let mut pending_event: Option<(Nanos, Vec<opentelemetry_proto::tonic::common::v1::KeyValue>)> = None;
    while at < duration {
        // The failover loop's probes (AutoClusterFailover.probeAndUpdateServiceUrl).
        while next_check <= at {
            let probe = |cluster: Cluster| if health_probe { serves(cluster, next_check) } else { true };
            for cluster in [EAST, WEST] {
                let labels = vec![
                    string("server.address", cluster.host),
                    int("server.port", 6650),
                    string("lagscope.probe.kind", probe_kind),
                    string("lagscope.client.id", client_id),
                ];
                emitter.gauge(client, "lagscope.probe.up", next_check, f64::from(u8::from(probe(cluster))), labels);
            }
            if current == EAST {
                if probe(EAST) {
                    failed_since = None;
                } else {
                    let since = *failed_since.get_or_insert(next_check);
                    if next_check - since >= FAILOVER_DELAY && probe(WEST) {
                        emitter.log(
                            client,
                            next_check,
                            (9, "INFO"),
                            format!(
                                "Current Pulsar service is pulsar://{}:6650, it has been down for {} ms, switch to the service pulsar://{}:6650. The current service down at {}",
                                EAST.host,
                                (next_check - since) / MILLISECOND,
                                WEST.host,
                                since / MILLISECOND
                            ),
                            vec![],
                        );
                        pending_event = Some((
                            next_check,
                            vec![
                                string("lagscope.failover.from", format!("pulsar://{}:6650", EAST.host)),
                                string("lagscope.failover.to", format!("pulsar://{}:6650", WEST.host)),
                                string(
                                    "lagscope.failover.reason",
                                    format!("{probe_kind} probe down for {} ms", (next_check - since) / MILLISECOND),
                                ),
                            ],
                        ));
                        switches.push(next_check);
                        current = WEST;
                        failed_since = None;
                    }
                }
            } else if probe(EAST) {
                let since = *recovered_since.get_or_insert(next_check);
                if next_check - since >= SWITCH_BACK_DELAY {
                    emitter.log(
                        client,
                        next_check,
                        (9, "INFO"),
                        format!(
                            "Current Pulsar service is secondary: pulsar://{}:6650, the primary service: pulsar://{}:6650 has been recover for {} ms, switch back to the primary service",
                            WEST.host,
                            EAST.host,
                            (next_check - since) / MILLISECOND
                        ),
                        vec![],
                    );
                    pending_event = Some((
                        next_check,
                        vec![
                            string("lagscope.failover.from", format!("pulsar://{}:6650", WEST.host)),
                            string("lagscope.failover.to", format!("pulsar://{}:6650", EAST.host)),
                            string("lagscope.failover.reason", "primary recovered"),
                        ],
                    ));
                    switches.push(next_check);
                    current = EAST;
                    recovered_since = None;
                }
            } else {
                recovered_since = None;
            }
            next_check += CHECK_INTERVAL;
        }
        emitter.advance(at, sink);
        // One send.
        sequence += 1;
        let ok = serves(current, at);
        let end = if ok { at + 3 * MILLISECOND } else { at + 3 * SECOND };
        let mut span = SpanSpec::new(format!("send {TOPIC}"), Kind::Client, at, end);
        span.attributes = vec![
            string("lagscope.client.id", client_id),
            string("lagscope.call.id", format!("{client_id}-{sequence}")),
            int("lagscope.attempt", 0),
            string("lagscope.namespace", TOPIC),
            string("lagscope.op", "write"),
            string("rpc.method", "send"),
            string("server.address", current.host),
            int("server.port", 6650),
            string("lagscope.target.node", current.broker),
            string("lagscope.outcome", if ok { "ok" } else { "timeout" }),
        ];
        if let Some((event_at, attributes)) = pending_event.take() {
            span.events.push((event_at.max(at), "lagscope.failover".to_string(), attributes));
        }
        if !ok {
            span.attributes.push(string("error.type", TIMEOUT));
            span.error = Some(format!(
                "The producer orders-producer-1 can not send message to the topic {TOPIC} within given timeout"
            ));
            if !health_probe {
                let window = blind.get_or_insert((at, end));
                window.1 = end;
            }
        }
        let context = emitter.span(client, span);
        if ok {
            let broker = brokers.iter().find(|(cluster, _)| *cluster == current).map(|entry| entry.1).expect("broker");
            let mut broker_span =
                SpanSpec::new(format!("produce {TOPIC}"), Kind::Server, at + MILLISECOND, end - MILLISECOND);
            broker_span.parent = Some(context);
            broker_span.attributes = vec![
                string("lagscope.namespace", TOPIC),
                string("lagscope.op", "write"),
                string("lagscope.node.role", "owner"),
                string("lagscope.outcome", "ok"),
            ];
            emitter.span(broker, broker_span);
        }
        at = end + (rng.exponential(SECOND as f64 / rate) as Nanos).max(MILLISECOND);
    }
    emitter.finish(sink);
    let mut truth = Truth {
        start_unix_nano: config.start_unix_nano,
        end_unix_nano: config.start_unix_nano + duration,
        ..Truth::default()
    };
    let seconds: Vec<f64> = switches.iter().map(|at| *at as f64 / SECOND as f64).collect();
    truth.figure("switch_seconds", seconds);
    truth.figure("spans", emitter.spans_emitted);
    if let Some((start, end)) = blind
        && end - start >= 30 * SECOND
    {
        truth.anomalies.push(ExpectedAnomaly {
            optional: false,
            kind: "blind_failover_probe".to_string(),
            cluster: EAST.name.to_string(),
            namespace: Some(TOPIC.to_string()),
            client_id: Some(client_id.to_string()),
            node_id: None,
            start_unix_nano: config.start_unix_nano + start,
            end_unix_nano: config.start_unix_nano + end,
            detail: format!(
                "TCP probe of pulsar://{}:6650 stayed up while every send timed out; no failover",
                EAST.host
            ),
        });
        truth.figure("blind_seconds", (end - start) as f64 / SECOND as f64);
    }
    Some(truth)
}
