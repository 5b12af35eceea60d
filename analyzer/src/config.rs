use serde::{Deserialize, Serialize};

/// Detector thresholds. Every field has a default; a config file overrides what it names and
/// is refused if it names something unknown.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AnalyzerConfig {
    pub stale_read: StaleReadConfig,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StaleReadConfig {
    /// A read is stale when served at least this many states below the client's floor.
    pub min_states_behind: i64,
}

impl Default for StaleReadConfig {
    fn default() -> Self {
        Self { min_states_behind: 1 }
    }
}
