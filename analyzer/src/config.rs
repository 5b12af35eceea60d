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
    /// Read consistencies that ask for bounded staleness (Ozone's LOCAL_LEASE): such reads
    /// promise no session guarantee, so they are not checked against the floor (their served
    /// state still raises it).
    pub exempt_consistencies: Vec<String>,
}

impl Default for StaleReadConfig {
    fn default() -> Self {
        Self { min_states_behind: 1, exempt_consistencies: vec!["LOCAL_LEASE".to_string()] }
    }
}
