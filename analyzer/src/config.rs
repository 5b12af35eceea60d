use serde::{Deserialize, Serialize};

/// Detector thresholds. Every field has a default; a config file overrides what it names and
/// is refused if it names something unknown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AnalyzerConfig {
    /// A window anomaly whose window reaches within this many seconds of the latest telemetry
    /// it is found in (its node's metrics for lags, storms and pressure; its cluster's spans
    /// and log lines for the others) is open (its condition still holds); otherwise resolved.
    pub open_grace_seconds: i64,
    /// A window its cluster's telemetry has moved this far past is resolved, whatever its own
    /// source says (its node stopped reporting, its clients went away).
    pub open_silence_seconds: i64,
    pub stream: StreamConfig,
    pub stale_read: StaleReadConfig,
    pub carried_state_regression: StatesBehindConfig,
    pub router_state_dropped: StatesBehindConfig,
    pub untrusted_state: UntrustedStateConfig,
    pub pinned_retry: PinnedRetryConfig,
    pub follower_read_disabled: FollowerReadDisabledConfig,
    pub no_namenodes_window: NoNamenodesWindowConfig,
    pub apply_lag: ApplyLagConfig,
    pub requeue_storm: RequeueStormConfig,
    pub shard_pressure: ShardPressureConfig,
    pub unfair_rejection: UnfairRejectionConfig,
    pub blind_failover_probe: BlindFailoverProbeConfig,
    pub failover_flapping: FailoverFlappingConfig,
}

/// How the streaming engine (offline analysis) waits for data that arrives out of order.
/// Memory is bounded by what these windows hold, not by the length of the history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StreamConfig {
    /// How long after an attempt ended its router and server spans may still arrive (the
    /// senders' export delay, plus how far the hosts' clocks disagree: the data's time is the
    /// fastest clock's): the attempt is joined then.
    pub lateness_seconds: i64,
    /// A call is processed once the data is this far past its start: it must cover the
    /// longest attempt (timeouts, e.g. 60 s bulk requests) plus the lateness. Attempts that
    /// come later are counted and analyzed as a call of their own. It is also how long a call
    /// id names one call: an attempt that starts more than this after the first attempt of
    /// the call with its id begins another call (a client restarted under the same client id
    /// numbers its calls from the start again).
    pub horizon_seconds: i64,
    /// How long per-namespace history is kept (committed states, answers, active reports,
    /// probe verdicts) for windows that look back.
    pub retention_seconds: i64,
}

impl StreamConfig {
    /// [`StreamConfig::horizon_seconds`] in nanoseconds.
    pub fn horizon(&self) -> i64 {
        self.horizon_seconds.saturating_mul(1_000_000_000)
    }

    /// Refuses windows that cannot work: every one positive, the horizon longer than the
    /// lateness (an attempt must be joined before its call is processed), the retention at
    /// least the horizon.
    pub fn validate(&self) -> Result<(), String> {
        let Self { lateness_seconds, horizon_seconds, retention_seconds } = *self;
        if lateness_seconds < 1 || horizon_seconds < 1 || retention_seconds < 1 {
            return Err(format!(
                "analyzer.stream windows must be at least 1 s (lateness {lateness_seconds}, horizon {horizon_seconds}, \
                 retention {retention_seconds})"
            ));
        }
        if horizon_seconds <= lateness_seconds {
            return Err(format!(
                "analyzer.stream.horizon_seconds ({horizon_seconds}) must exceed lateness_seconds ({lateness_seconds})"
            ));
        }
        if retention_seconds < horizon_seconds {
            return Err(format!(
                "analyzer.stream.retention_seconds ({retention_seconds}) must be at least horizon_seconds ({horizon_seconds})"
            ));
        }
        Ok(())
    }
}

impl Default for StreamConfig {
    fn default() -> Self {
        Self { lateness_seconds: 10, horizon_seconds: 90, retention_seconds: 600 }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FailoverFlappingConfig {
    /// The clients' switchBackDelay: switches closer together than this are flapping.
    pub switch_back_delay_seconds: i64,
}

impl FailoverFlappingConfig {
    /// The switch-back delay in nanoseconds: the least gap between switches that is no flapping.
    pub fn switch_back_delay_nanos(&self) -> i64 {
        self.switch_back_delay_seconds * 1_000_000_000
    }
}

impl Default for FailoverFlappingConfig {
    fn default() -> Self {
        Self { switch_back_delay_seconds: 60 }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShardPressureConfig {
    /// Share of the limit that is yellow.
    pub yellow_ratio: f64,
    /// Share of the limit that is red (at the limit).
    pub red_ratio: f64,
    pub min_seconds: i64,
}

impl Default for ShardPressureConfig {
    fn default() -> Self {
        Self { yellow_ratio: 0.8, red_ratio: 0.99, min_seconds: 10 }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UnfairRejectionConfig {
    /// A rejected shard under this share of its own limit was not the one under pressure.
    pub max_own_ratio: f64,
    /// Another shard holding at least this share of the node's in-flight bytes was.
    pub min_holder_share: f64,
}

impl Default for UnfairRejectionConfig {
    fn default() -> Self {
        Self { max_own_ratio: 0.2, min_holder_share: 0.5 }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BlindFailoverProbeConfig {
    /// How long sends must keep failing without a failover while the probe says up.
    pub min_seconds: i64,
}

impl Default for BlindFailoverProbeConfig {
    fn default() -> Self {
        Self { min_seconds: 30 }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApplyLagConfig {
    /// Behind committed by more than this many states is lagging.
    pub max_lag_states: i64,
    /// Not advancing while committed advances for this long is a stall; shorter episodes
    /// are not reported.
    pub min_seconds: i64,
    /// Within this many states of committed, and applying again, counts as caught up (the
    /// episode ends; a stalled follower close to committed is still stalled).
    pub caught_up_states: i64,
}

impl Default for ApplyLagConfig {
    fn default() -> Self {
        Self { max_lag_states: 10_000, min_seconds: 10, caught_up_states: 1_000 }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RequeueStormConfig {
    /// Requeues per second that count as a storm.
    pub min_requeues_per_second: f64,
    /// Requeues per call processed in the same second: a server briefly behind a fresh write
    /// requeues a call a few times; one that cannot catch up, hundreds of times.
    pub min_requeues_per_processed_call: f64,
    /// How long the rate must stay that high.
    pub min_seconds: i64,
    /// A dip below that rate no longer than this does not end a storm (a server requeueing a
    /// few clients' calls drops for a second whenever one of them gives up and the next has
    /// not arrived); 0: any dip ends it.
    pub max_dip_seconds: i64,
}

impl Default for RequeueStormConfig {
    fn default() -> Self {
        Self {
            min_requeues_per_second: 100.0,
            min_requeues_per_processed_call: 100.0,
            min_seconds: 30,
            max_dip_seconds: 5,
        }
    }
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

impl Default for AnalyzerConfig {
    fn default() -> Self {
        Self {
            open_grace_seconds: 5,
            open_silence_seconds: 300,
            stream: StreamConfig::default(),
            stale_read: StaleReadConfig::default(),
            carried_state_regression: StatesBehindConfig::default(),
            router_state_dropped: StatesBehindConfig::default(),
            untrusted_state: UntrustedStateConfig::default(),
            pinned_retry: PinnedRetryConfig::default(),
            follower_read_disabled: FollowerReadDisabledConfig::default(),
            no_namenodes_window: NoNamenodesWindowConfig::default(),
            apply_lag: ApplyLagConfig::default(),
            requeue_storm: RequeueStormConfig::default(),
            shard_pressure: ShardPressureConfig::default(),
            unfair_rejection: UnfairRejectionConfig::default(),
            blind_failover_probe: BlindFailoverProbeConfig::default(),
            failover_flapping: FailoverFlappingConfig::default(),
        }
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
    /// Per system (`lagscope.system`), how stale (seconds since newer data was committed) a
    /// read may be across clients: HDFS RBF's observer state refresh period, Ozone's
    /// LOCAL_LEASE lease time. Systems not listed are not checked across clients.
    pub cross_client_bounds_seconds: std::collections::BTreeMap<String, i64>,
}

impl Default for StaleReadConfig {
    fn default() -> Self {
        Self {
            min_states_behind: 1,
            exempt_consistencies: vec!["LOCAL_LEASE".to_string()],
            cross_client_bounds_seconds: [("hdfs-rbf".to_string(), 15), ("ozone".to_string(), 5)].into_iter().collect(),
        }
    }
}
