//! The detector catalogue. Each detector is one file with one function of the same
//! signature; adding one is a new file and a line in [`REGISTRY`].

mod stale_read;

use lagscope_model::{Anomaly, AnomalyKind};

use crate::{AnalysisInput, AnalyzerConfig};

/// A detector: the kind it reports and the function that finds it.
pub struct Detector {
    pub kind: AnomalyKind,
    pub detect: fn(&AnalysisInput, &AnalyzerConfig) -> Vec<Anomaly>,
}

pub const REGISTRY: &[Detector] = &[Detector { kind: AnomalyKind::StaleRead, detect: stale_read::detect }];
