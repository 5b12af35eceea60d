//! Ground truth: every anomaly a correct analyzer must report for a run, and nothing else,
//! plus the figures of the run that the seeds describe (window lengths, attempt counts).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What a run must produce. Written by `lagscope sim --truth FILE.json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Truth {
    pub scenario: String,
    pub seed: u64,
    pub start_unix_nano: i64,
    pub end_unix_nano: i64,
    pub anomalies: Vec<ExpectedAnomaly>,
    /// Named figures of the run (e.g. `no_namenodes_window_seconds`), for tests and notes.
    pub figures: BTreeMap<String, serde_json::Value>,
}

/// One anomaly a correct analyzer must report. Fields that do not identify it are `None`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExpectedAnomaly {
    pub kind: String,
    pub cluster: String,
    pub namespace: Option<String>,
    pub client_id: Option<String>,
    pub node_id: Option<String>,
    pub start_unix_nano: i64,
    pub end_unix_nano: i64,
    /// Why the model produced it, for people reading the truth file.
    pub detail: String,
    /// Right either way: the model's figure lies within what the telemetry can resolve of the
    /// detector's threshold (a staleness within a metric period of its bound). Found, it
    /// matches; not found, it is not missed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
}

impl Truth {
    /// Puts `prefix` and a dot before the cluster and client id of every expected anomaly, as
    /// [`crate::SimConfig::name_prefix`] does to the telemetry.
    pub fn prefix_names(&mut self, prefix: &str) {
        for anomaly in &mut self.anomalies {
            anomaly.cluster = format!("{prefix}.{}", anomaly.cluster);
            anomaly.client_id = anomaly.client_id.take().map(|client| format!("{prefix}.{client}"));
        }
    }

    pub fn count(&self, kind: &str) -> usize {
        self.anomalies.iter().filter(|anomaly| anomaly.kind == kind).count()
    }

    pub fn figure(&mut self, name: &str, value: impl Into<serde_json::Value>) {
        self.figures.insert(name.to_string(), value.into());
    }
}
