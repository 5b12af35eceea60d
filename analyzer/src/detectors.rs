//! The detector catalogue. Each detector is one file with one function of the same
//! signature; adding one is a new file and a line in [`REGISTRY`].

pub(crate) mod apply_lag;
pub(crate) mod blind_failover_probe;
pub(crate) mod carried_state_regression;
pub(crate) mod evidence;
pub(crate) mod failover_flapping;
pub(crate) mod follower_read_disabled;
pub(crate) mod no_namenodes_window;
pub(crate) mod pinned_retry;
pub(crate) mod requeue_storm;
pub(crate) mod router_state_dropped;
pub(crate) mod shard_pressure;
pub(crate) mod stale_read;
pub(crate) mod stale_read_cross_client;
pub(crate) mod unfair_rejection;
pub(crate) mod untrusted_state;
pub(crate) mod view;

use lagscope_model::{Anomaly, AnomalyKind, ClientTimeline, UnixNanos};

use crate::{AnalysisInput, AnalyzerConfig};

/// A detector: the kind it reports and the function that finds it.
pub struct Detector {
    pub kind: AnomalyKind,
    pub detect: fn(&AnalysisInput, &AnalyzerConfig) -> Vec<Anomaly>,
    /// The same, one timeline's calls at a time, for a detector whose anomaly about a call
    /// depends only on the timeline's client, namespace and cluster, that call, and the calls
    /// that started before it (floors, states seen): none of the samples, log lines or other
    /// timelines. Its anomalies are point anomalies that take no log lines. Held timelines
    /// judge only the calls that changed with it ([`crate::analyze_held_kinds`]).
    pub judge: Option<JudgeCalls>,
}

/// Finds the anomalies of a timeline's calls that start at or after the time given (judged
/// against every call of the timeline), each passed with its call's start.
pub type JudgeCalls = fn(&ClientTimeline, UnixNanos, &AnalyzerConfig, &mut dyn FnMut(UnixNanos, Anomaly));

/// What `judge` finds in every call of every timeline of `input`: the `detect` of a detector
/// that judges calls.
fn every_call(input: &AnalysisInput, config: &AnalyzerConfig, judge: JudgeCalls) -> Vec<Anomaly> {
    let mut anomalies = Vec::new();
    for timeline in &input.timelines {
        judge(timeline, UnixNanos::MIN, config, &mut |_, anomaly| anomalies.push(anomaly));
    }
    anomalies
}

pub const REGISTRY: &[Detector] = &[
    Detector { kind: AnomalyKind::StaleRead, detect: stale_read::detect, judge: Some(stale_read::judge) },
    Detector { kind: AnomalyKind::StaleRead, detect: stale_read_cross_client::detect, judge: None },
    Detector {
        kind: AnomalyKind::CarriedStateRegression,
        detect: carried_state_regression::detect,
        judge: Some(carried_state_regression::judge),
    },
    Detector {
        kind: AnomalyKind::RouterStateDropped,
        detect: router_state_dropped::detect,
        judge: Some(router_state_dropped::judge),
    },
    Detector { kind: AnomalyKind::UntrustedState, detect: untrusted_state::detect, judge: None },
    Detector { kind: AnomalyKind::PinnedRetry, detect: pinned_retry::detect, judge: None },
    Detector { kind: AnomalyKind::FollowerReadDisabled, detect: follower_read_disabled::detect, judge: None },
    Detector { kind: AnomalyKind::NoNamenodesWindow, detect: no_namenodes_window::detect, judge: None },
    Detector { kind: AnomalyKind::ApplyLag, detect: apply_lag::detect, judge: None },
    Detector { kind: AnomalyKind::RequeueStorm, detect: requeue_storm::detect, judge: None },
    Detector { kind: AnomalyKind::ShardPressure, detect: shard_pressure::detect, judge: None },
    Detector { kind: AnomalyKind::UnfairRejection, detect: unfair_rejection::detect, judge: None },
    Detector { kind: AnomalyKind::BlindFailoverProbe, detect: blind_failover_probe::detect, judge: None },
    Detector { kind: AnomalyKind::FailoverFlapping, detect: failover_flapping::detect, judge: None },
];

#[cfg(test)]
mod tests {
    use super::*;

    /// What `analyze_held_kinds` takes from verdicts is what `analyze_kinds` would build: a
    /// detector that judges calls one timeline at a time finds point anomalies (never open)
    /// that take no log lines, and each detector has a bit of its own.
    #[test]
    fn detectors_judged_call_by_call_find_what_passes_leave_as_found() {
        assert!(REGISTRY.len() <= 64);
        for detector in REGISTRY.iter().filter(|detector| detector.judge.is_some()) {
            assert!(!detector.kind.is_window(), "{:?}", detector.kind);
            assert!(crate::log_events::evidence_of(detector.kind).is_none(), "{:?}", detector.kind);
        }
    }
}
