//! lagscope's scenario simulator. Each scenario models a replicated system on its real
//! mechanisms (HDFS RBF state ids, router pools and membership cache, observer requeue; Ozone
//! follower-read providers and retry policy; Elasticsearch per-shard accounting; Pulsar's
//! failover probe loop), runs it on a simulated clock, emits the OTLP its clients, routers
//! and servers would send, and records the ground truth: every anomaly a correct analyzer
//! must report, and nothing else.
//!
//! Pure and deterministic: the same configuration and seed produce the same requests, byte
//! for byte. No I/O, no wall clock, no async runtime; sinks are the caller's.

pub mod emit;
mod es;
mod hdfs;
mod mixed;
pub mod native;
mod ozone;
mod pulsar;
mod rng;
pub mod score;
pub mod truth;

use std::fmt;

pub use emit::{Request, Sink};
pub use rng::Rng;
pub use truth::{ExpectedAnomaly, Truth};

/// Simulated time: nanoseconds since the start of the run.
pub type Nanos = i64;

pub const MILLISECOND: Nanos = 1_000_000;
pub const SECOND: Nanos = 1_000_000_000;

/// 2026-01-01T00:00:00Z: where simulated time starts unless told otherwise, so that a run is
/// the same bytes whenever it is made.
pub const DEFAULT_START_UNIX_NANO: i64 = 1_767_225_600 * SECOND;

/// How to run a scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    pub scenario: String,
    pub seed: u64,
    /// Number of client sessions; `None` takes the scenario's default.
    pub clients: Option<usize>,
    /// Simulated length of the run; `None` takes the scenario's default.
    pub duration: Option<Nanos>,
    /// Client operations per second across all clients; `None` takes the scenario's default.
    pub rate: Option<f64>,
    pub start_unix_nano: i64,
    /// Put with a dot before every cluster name and client id (in the telemetry and the
    /// truth): runs that must not be taken for the same clusters and client sessions, as the
    /// demo's rounds (each starts its clusters' state ids over, with new sessions).
    pub name_prefix: Option<String>,
}

impl SimConfig {
    pub fn new(scenario: &str) -> Self {
        Self {
            scenario: scenario.to_string(),
            seed: 1,
            clients: None,
            duration: None,
            rate: None,
            start_unix_nano: DEFAULT_START_UNIX_NANO,
            name_prefix: None,
        }
    }
}

/// A sink that prefixes the names of what passes through it ([`SimConfig::name_prefix`]).
struct Prefixed<'a> {
    inner: &'a mut dyn Sink,
    prefix: &'a str,
}

impl Sink for Prefixed<'_> {
    fn export(&mut self, at: Nanos, mut request: Request) {
        emit::prefix_names(&mut request, self.prefix);
        self.inner.export(at, request);
    }
}

/// A scenario the simulator knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScenarioInfo {
    pub name: &'static str,
    pub system: &'static str,
    pub summary: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SimError {
    UnknownScenario(String),
    InvalidConfig(String),
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownScenario(name) => {
                let known: Vec<&str> = scenarios().iter().map(|scenario| scenario.name).collect();
                write!(f, "unknown scenario {name:?} (known: {})", known.join(", "))
            }
            Self::InvalidConfig(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for SimError {}

/// Every scenario, in the order `eval --scenario all` runs them.
pub fn scenarios() -> Vec<ScenarioInfo> {
    let mut all = hdfs::SCENARIOS.to_vec();
    all.extend_from_slice(ozone::SCENARIOS);
    all.extend_from_slice(es::SCENARIOS);
    all.extend_from_slice(pulsar::SCENARIOS);
    all.push(mixed::SCENARIO);
    all
}

/// Runs a scenario, exporting its telemetry to `sink`; returns its ground truth.
pub fn run(config: &SimConfig, sink: &mut dyn Sink) -> Result<Truth, SimError> {
    if config.clients == Some(0) {
        return Err(SimError::InvalidConfig("--clients must be at least 1".to_string()));
    }
    if config.rate.is_some_and(|rate| !(rate > 0.0 && rate.is_finite())) {
        return Err(SimError::InvalidConfig("--rate must be a positive number of operations per second".to_string()));
    }
    if config.duration.is_some_and(|duration| duration <= 0) {
        return Err(SimError::InvalidConfig("--duration must be positive".to_string()));
    }
    if let Some(prefix) = &config.name_prefix {
        let unprefixed = SimConfig { name_prefix: None, ..config.clone() };
        let mut truth = run(&unprefixed, &mut Prefixed { inner: sink, prefix })?;
        truth.prefix_names(prefix);
        return Ok(truth);
    }
    let mut truth = if config.scenario == mixed::SCENARIO.name {
        let members: Vec<ScenarioInfo> =
            scenarios().into_iter().filter(|info| info.name != mixed::SCENARIO.name).collect();
        mixed::run(config, sink, &members)
    } else if let Some(truth) = hdfs::run(config, sink) {
        truth
    } else if let Some(truth) = ozone::run(config, sink) {
        truth
    } else if let Some(truth) = es::run(config, sink) {
        truth
    } else if let Some(truth) = pulsar::run(config, sink) {
        truth
    } else {
        return Err(SimError::UnknownScenario(config.scenario.clone()));
    };
    truth.scenario = config.scenario.clone();
    truth.seed = config.seed;
    truth.anomalies.sort_by(|left, right| {
        (left.start_unix_nano, &left.kind, &left.client_id, &left.node_id).cmp(&(
            right.start_unix_nano,
            &right.kind,
            &right.client_id,
            &right.node_id,
        ))
    });
    Ok(truth)
}
