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

use lagscope_model::{Anomaly, AnomalyKind};

use crate::{AnalysisInput, AnalyzerConfig};

/// A detector: the kind it reports and the function that finds it.
pub struct Detector {
    pub kind: AnomalyKind,
    pub detect: fn(&AnalysisInput, &AnalyzerConfig) -> Vec<Anomaly>,
}

pub const REGISTRY: &[Detector] = &[
    Detector { kind: AnomalyKind::StaleRead, detect: stale_read::detect },
    Detector { kind: AnomalyKind::StaleRead, detect: stale_read_cross_client::detect },
    Detector { kind: AnomalyKind::CarriedStateRegression, detect: carried_state_regression::detect },
    Detector { kind: AnomalyKind::RouterStateDropped, detect: router_state_dropped::detect },
    Detector { kind: AnomalyKind::UntrustedState, detect: untrusted_state::detect },
    Detector { kind: AnomalyKind::PinnedRetry, detect: pinned_retry::detect },
    Detector { kind: AnomalyKind::FollowerReadDisabled, detect: follower_read_disabled::detect },
    Detector { kind: AnomalyKind::NoNamenodesWindow, detect: no_namenodes_window::detect },
    Detector { kind: AnomalyKind::ApplyLag, detect: apply_lag::detect },
    Detector { kind: AnomalyKind::RequeueStorm, detect: requeue_storm::detect },
    Detector { kind: AnomalyKind::ShardPressure, detect: shard_pressure::detect },
    Detector { kind: AnomalyKind::UnfairRejection, detect: unfair_rejection::detect },
    Detector { kind: AnomalyKind::BlindFailoverProbe, detect: blind_failover_probe::detect },
    Detector { kind: AnomalyKind::FailoverFlapping, detect: failover_flapping::detect },
];
