//! Pulsar client cluster failover (seed 004: PIP-121's AutoClusterFailover and the health
//! probe proposed for half-dead clusters).
//!
//! A producer on `pulsar://pulsar-east:6650` (primary) with `pulsar://pulsar-west:6650` as
//! secondary. Every `checkInterval` the client's failover task (a port of
//! `AutoClusterFailover`, [`Failover`]) probes its current service URL; once it has been down
//! longer than `failoverDelay` it switches to the other URL if that probes up, and, on the
//! secondary, switches back once the primary has been up for `switchBackDelay`.
//! - `pulsar-tcp-probe-half-dead`: from [`HALF_DEAD`] the east brokers still accept TCP
//!   connections but fail every produce. The TCP-connect probe (`probeAvailable`) sees east
//!   up: no failover, and produce fails for the whole half-dead period.
//! - `pulsar-health-probe`: the same, with a health probe (`CommandHealthCheck`) that sees east
//!   down: the client fails over after `failoverDelay` and switches back after
//!   `switchBackDelay` once east is healthy again.
//! - `pulsar-switch-back-delay-lost` (apache/pulsar#14442): east has an outage, west one that
//!   ends the client's stay there, and then east's broker crash-loops ([`CRASH_LOOP`]: 35 s down,
//!   10 s up). Before the fix, the task that fails the client over from west to east runs the
//!   switch-back check in the same round, now on the primary: it starts `recoverTimestamp`,
//!   which nothing resets while the client stays on east. After the next failover to west the
//!   first probe that finds east up sees a recovery older than `switchBackDelay` and switches
//!   straight back to the crash-looping east: the client flaps between the clusters faster
//!   than `switchBackDelay` allows. `-fixed`: the check runs only while still on the secondary;
//!   the client stays on west until east has been up for `switchBackDelay`.

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
    ScenarioInfo {
        name: "pulsar-switch-back-delay-lost",
        system: "pulsar",
        summary: "apache/pulsar#14442: a stale recoverTimestamp; the client switches straight back to a crash-looping primary, flapping",
    },
    ScenarioInfo {
        name: "pulsar-switch-back-delay-lost-fixed",
        system: "pulsar",
        summary: "#14442 fixed: the client waits switchBackDelay on the secondary while the primary crash-loops",
    },
];

const TOPIC: &str = "persistent://public/default/orders";
const HALF_DEAD: (Nanos, Nanos) = (20 * SECOND, 110 * SECOND);
/// `pulsar-switch-back-delay-lost`: east's outage, west's, and east's crash loop (from, to,
/// down, up): east's broker down 35 s, up 10 s, over and over.
const EAST_OUTAGE: (Nanos, Nanos) = (20 * SECOND, 112 * SECOND);
const WEST_OUTAGE: (Nanos, Nanos) = (80 * SECOND, 140 * SECOND);
const CRASH_LOOP: (Nanos, Nanos, Nanos, Nanos) = (150 * SECOND, 330 * SECOND, 35 * SECOND, 10 * SECOND);
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

/// What happens to the clusters, and what the client's probe sees of it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Model {
    /// East half-dead during [`HALF_DEAD`]; the probe is a health check, or a TCP connect.
    HalfDead { health_probe: bool },
    /// Outages and east's crash loop; a TCP probe; the switch-back check as before
    /// apache/pulsar#14442 (`fixed: false`) or after.
    CrashLoop { fixed: bool },
}

impl Model {
    /// Whether `cluster` takes produce requests at `at`.
    fn serves(self, cluster: Cluster, at: Nanos) -> bool {
        match self {
            Model::HalfDead { .. } => cluster != EAST || !(HALF_DEAD.0..HALF_DEAD.1).contains(&at),
            Model::CrashLoop { .. } => {
                let outage = if cluster == EAST { EAST_OUTAGE } else { WEST_OUTAGE };
                let (from, to, down, up) = CRASH_LOOP;
                let crashed = cluster == EAST && (from..to).contains(&at) && (at - from) % (down + up) < down;
                !(outage.0..outage.1).contains(&at) && !crashed
            }
        }
    }

    /// What the client's probe of `cluster` says at `at`: a TCP connect succeeds while the
    /// broker process is up, half-dead or not; a health check sees whether it serves.
    fn probe(self, cluster: Cluster, at: Nanos) -> bool {
        match self {
            Model::HalfDead { health_probe: false } => true,
            Model::HalfDead { health_probe: true } | Model::CrashLoop { .. } => self.serves(cluster, at),
        }
    }

    fn probe_kind(self) -> &'static str {
        match self {
            Model::HalfDead { health_probe: true } => "health",
            _ => "tcp",
        }
    }
}

/// A switch of the client's service URL, and the line its failover task logs for it.
struct Switch {
    from: Cluster,
    to: Cluster,
    reason: String,
    line: String,
}

/// The client's failover task, `AutoClusterFailover`: its state between rounds.
struct Failover {
    current: Cluster,
    /// `failedTimestamp`: since when the current service has probed down.
    failed_since: Option<Nanos>,
    /// `recoverTimestamp`: since when the primary has probed up, as seen by the switch-back
    /// check; only that check resets it.
    recovered_since: Option<Nanos>,
    /// apache/pulsar#14442 fixed: the switch-back check runs only while still on the secondary.
    fixed: bool,
    probe_kind: &'static str,
}

impl Failover {
    /// One round at `at`: the switch it made, if any, and the line logged for a failover the
    /// other URL could not take (its probe down too).
    fn round(&mut self, at: Nanos, probe: impl Fn(Cluster) -> bool) -> (Option<Switch>, Option<String>) {
        if self.current == EAST {
            return self.probe_and_update(at, WEST, &probe);
        }
        let (switch, refused) = self.probe_and_update(at, EAST, &probe);
        if switch.is_some() && self.fixed {
            return (switch, refused);
        }
        // Before the fix this runs on the primary too, right after a failover to it.
        let back = self.probe_and_check_switch_back(at, &probe);
        (switch.or(back), refused)
    }

    /// `probeAndUpdateServiceUrl(target)`.
    fn probe_and_update(
        &mut self,
        at: Nanos,
        target: Cluster,
        probe: &impl Fn(Cluster) -> bool,
    ) -> (Option<Switch>, Option<String>) {
        if probe(self.current) {
            self.failed_since = None;
            return (None, None);
        }
        let since = *self.failed_since.get_or_insert(at);
        if at - since < FAILOVER_DELAY {
            return (None, None);
        }
        let from = self.current;
        if !probe(target) {
            let line = format!(
                "Current Pulsar service is pulsar://{}:6650, it has been down for {} ms. Failed to switch to service \
                 pulsar://{}:6650, because it is not available",
                from.host,
                (at - since) / MILLISECOND,
                target.host
            );
            return (None, Some(line));
        }
        self.current = target;
        self.failed_since = None;
        let line = format!(
            "Current Pulsar service is pulsar://{}:6650, it has been down for {} ms, switch to the service \
             pulsar://{}:6650. The current service down at {}",
            from.host,
            (at - since) / MILLISECOND,
            target.host,
            since / MILLISECOND
        );
        let reason = format!("{} probe down for {} ms", self.probe_kind, (at - since) / MILLISECOND);
        (Some(Switch { from, to: target, reason, line }), None)
    }

    /// `probeAndCheckSwitchBack(primary)`.
    fn probe_and_check_switch_back(&mut self, at: Nanos, probe: &impl Fn(Cluster) -> bool) -> Option<Switch> {
        if !probe(EAST) {
            self.recovered_since = None;
            return None;
        }
        let since = *self.recovered_since.get_or_insert(at);
        if at - since < SWITCH_BACK_DELAY {
            return None;
        }
        let from = self.current;
        self.current = EAST;
        self.recovered_since = None;
        let line = format!(
            "Current Pulsar service is secondary: pulsar://{}:6650, the primary service: pulsar://{}:6650 has been \
             recover for {} ms, switch back to the primary service",
            from.host,
            EAST.host,
            (at - since) / MILLISECOND
        );
        Some(Switch { from, to: EAST, reason: "primary recovered".to_string(), line })
    }
}

pub fn run(config: &SimConfig, sink: &mut dyn Sink) -> Option<Truth> {
    let model = match config.scenario.as_str() {
        "pulsar-tcp-probe-half-dead" => Model::HalfDead { health_probe: false },
        "pulsar-health-probe" => Model::HalfDead { health_probe: true },
        "pulsar-switch-back-delay-lost" => Model::CrashLoop { fixed: false },
        "pulsar-switch-back-delay-lost-fixed" => Model::CrashLoop { fixed: true },
        _ => return None,
    };
    let mut rng = Rng::new(config.seed);
    let mut emitter = Emitter::new(config.start_unix_nano, SECOND, rng.fork(1).named(&config.scenario));
    let default_duration = if matches!(model, Model::CrashLoop { .. }) { 420 * SECOND } else { 200 * SECOND };
    let duration = config.duration.unwrap_or(default_duration);
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
    let probe_kind = model.probe_kind();
    let mut failover = Failover {
        current: EAST,
        failed_since: None,
        recovered_since: None,
        // The half-dead scenarios never fail over from west: the check's order is moot there.
        fixed: !matches!(model, Model::CrashLoop { fixed: false }),
        probe_kind,
    };
    let mut next_check = CHECK_INTERVAL;
    let mut at = 10 * MILLISECOND;
    let mut sequence = 0u64;
    let mut blind: Option<(Nanos, Nanos)> = None;
    let mut switches = Vec::new();
    let mut pending_event: Option<(Nanos, Vec<opentelemetry_proto::tonic::common::v1::KeyValue>)> = None;
    while at < duration {
        // The failover task's rounds (AutoClusterFailover's scheduled probe).
        while next_check <= at {
            let probe = |cluster: Cluster| model.probe(cluster, next_check);
            for cluster in [EAST, WEST] {
                let labels = vec![
                    string("server.address", cluster.host),
                    int("server.port", 6650),
                    string("lagscope.probe.kind", probe_kind),
                    string("lagscope.client.id", client_id),
                ];
                emitter.gauge(client, "lagscope.probe.up", next_check, f64::from(u8::from(probe(cluster))), labels);
            }
            let (switch, refused) = failover.round(next_check, probe);
            if let Some(line) = refused {
                emitter.log(client, next_check, (17, "ERROR"), line, vec![]);
            }
            if let Some(Switch { from, to, reason, line }) = switch {
                emitter.log(client, next_check, (9, "INFO"), line, vec![]);
                pending_event = Some((
                    next_check,
                    vec![
                        string("lagscope.failover.from", format!("pulsar://{}:6650", from.host)),
                        string("lagscope.failover.to", format!("pulsar://{}:6650", to.host)),
                        string("lagscope.failover.reason", reason),
                    ],
                ));
                switches.push(next_check);
            }
            next_check += CHECK_INTERVAL;
        }
        emitter.advance(at, sink);
        // One send.
        sequence += 1;
        let current = failover.current;
        let ok = model.serves(current, at);
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
            // Failing while the probe says the cluster is up: nothing will fail the client over.
            if model.probe(current, at) {
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
    // Runs of switches each sooner than switchBackDelay after the one before: the settling
    // the delays exist for did not happen. The client logs its switches (its cluster: east's).
    for run in switches.chunk_by(|previous, next| next - previous < SWITCH_BACK_DELAY) {
        if let [first, .., last] = *run {
            truth.anomalies.push(ExpectedAnomaly {
                optional: false,
                kind: "failover_flapping".to_string(),
                cluster: EAST.name.to_string(),
                namespace: None,
                client_id: Some(client_id.to_string()),
                node_id: None,
                start_unix_nano: config.start_unix_nano + first,
                end_unix_nano: config.start_unix_nano + last,
                detail: format!(
                    "{} switches in {:.0} s, each sooner than switchBackDelay ({} s) after the last",
                    run.len(),
                    (last - first) as f64 / SECOND as f64,
                    SWITCH_BACK_DELAY / SECOND
                ),
            });
        }
    }
    Some(truth)
}
