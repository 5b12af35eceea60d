//! The detector catalogue. Each detector is one file with one function of the same
//! signature; adding one is a new file and a line in [`REGISTRY`].

mod carried_state_regression;
mod evidence;
mod follower_read_disabled;
mod no_namenodes_window;
mod pinned_retry;
mod router_state_dropped;
mod stale_read;
mod untrusted_state;

use lagscope_model::{Anomaly, AnomalyKind};

use crate::{AnalysisInput, AnalyzerConfig};

/// A detector: the kind it reports and the function that finds it.
pub struct Detector {
    pub kind: AnomalyKind,
    pub detect: fn(&AnalysisInput, &AnalyzerConfig) -> Vec<Anomaly>,
}

pub const REGISTRY: &[Detector] = &[
    Detector { kind: AnomalyKind::StaleRead, detect: stale_read::detect },
    Detector { kind: AnomalyKind::CarriedStateRegression, detect: carried_state_regression::detect },
    Detector { kind: AnomalyKind::RouterStateDropped, detect: router_state_dropped::detect },
    Detector { kind: AnomalyKind::UntrustedState, detect: untrusted_state::detect },
    Detector { kind: AnomalyKind::PinnedRetry, detect: pinned_retry::detect },
    Detector { kind: AnomalyKind::FollowerReadDisabled, detect: follower_read_disabled::detect },
    Detector { kind: AnomalyKind::NoNamenodesWindow, detect: no_namenodes_window::detect },
];
