use serde::{Deserialize, Serialize};

/// Detector thresholds. Every field has a default; a config file overrides what it names and
/// is refused if it names something unknown.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AnalyzerConfig {
    pub stale_read: StaleReadConfig,
    pub carried_state_regression: StatesBehindConfig,
    pub router_state_dropped: StatesBehindConfig,
    pub untrusted_state: UntrustedStateConfig,
    pub pinned_retry: PinnedRetryConfig,
    pub follower_read_disabled: FollowerReadDisabledConfig,
    pub no_namenodes_window: NoNamenodesWindowConfig,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PinnedRetryConfig {
    /// Consecutive attempts to one node with the same rejection.
    pub min_attempts: usize,
}

impl Default for PinnedRetryConfig {
    fn default() -> Self {
        Self { min_attempts: 3 }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FollowerReadDisabledConfig {
    /// Successful reads after the rejection, none of them on a follower, before it is "for good".
    pub min_reads_after: usize,
}

impl Default for FollowerReadDisabledConfig {
    fn default() -> Self {
        Self { min_reads_after: 3 }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NoNamenodesWindowConfig {
    /// A window shorter than this is a failover blip, not an incident.
    pub min_window_seconds: i64,
    /// NoNamenodesAvailable answers further apart than this are separate windows.
    pub max_gap_seconds: i64,
}

impl Default for NoNamenodesWindowConfig {
    fn default() -> Self {
        Self { min_window_seconds: 5, max_gap_seconds: 10 }
    }
}

/// A threshold in states below the expected one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StatesBehindConfig {
    /// Raise when the state is at least this many states below what it should be.
    pub min_states_behind: i64,
}

impl Default for StatesBehindConfig {
    fn default() -> Self {
        Self { min_states_behind: 1 }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UntrustedStateConfig {
    /// How far beyond the highest reported committed state a carried state may be (writes in
    /// flight, reports not yet sent) before it is untrusted.
    pub margin_states: i64,
}

impl Default for UntrustedStateConfig {
    fn default() -> Self {
        Self { margin_states: 10_000 }
    }
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
