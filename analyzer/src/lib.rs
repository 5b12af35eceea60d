//! lagscope's analyzer: reconstructs per-client causal timelines from spans and runs the
//! detector catalogue over them.
//!
//! The same code runs live (the service re-analyzes a client when its spans arrive) and
//! offline (`lagscope analyze` over a capture), so it is pure: no I/O, no clock, no async
//! runtime. Given the same spans it returns the same anomalies, with the same fingerprints.

mod config;
pub mod detectors;
mod floor;
mod series;
mod timeline;

use lagscope_model::{Anomaly, ClientTimeline, Sample, Span};

pub use config::{
    AnalyzerConfig, ApplyLagConfig, BlindFailoverProbeConfig, FailoverFlappingConfig, FollowerReadDisabledConfig,
    NoNamenodesWindowConfig, PinnedRetryConfig, RequeueStormConfig, StaleReadConfig, StatesBehindConfig,
    UntrustedStateConfig,
};
pub use floor::{CallFloors, FloorContribution, FloorSource, floors, seen_before};
pub use timeline::build_timelines;

/// What the detectors look at.
#[derive(Debug, Default)]
pub struct AnalysisInput {
    pub timelines: Vec<ClientTimeline>,
    pub samples: Vec<Sample>,
}

impl AnalysisInput {
    /// Builds the timelines of every client in `spans`.
    pub fn from_telemetry(spans: &[Span], samples: Vec<Sample>) -> Self {
        Self { timelines: build_timelines(spans), samples }
    }
}

/// Runs every detector, returning their anomalies ordered by start time, then kind, then
/// fingerprint (a stable order for output and golden files).
pub fn analyze(input: &AnalysisInput, config: &AnalyzerConfig) -> Vec<Anomaly> {
    let mut anomalies: Vec<Anomaly> =
        detectors::REGISTRY.iter().flat_map(|detector| (detector.detect)(input, config)).collect();
    anomalies.sort_by(|left, right| {
        (left.start_unix_nano, left.kind, &left.fingerprint).cmp(&(
            right.start_unix_nano,
            right.kind,
            &right.fingerprint,
        ))
    });
    anomalies
}
