//! Anomalies: what the analyzer reports, each explaining itself.

use serde::{Deserialize, Serialize};

use crate::UnixNanos;

/// The anomaly catalogue. Its `as_str` names are a public contract (API, alerts, captures).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AnomalyKind {
    /// A read served below what the session had already seen (or, across clients, staler
    /// than the system's bound).
    StaleRead,
    /// A request carried less than the client had already seen in that namespace.
    CarriedStateRegression,
    /// A router's request to a server carried less than the client's request.
    RouterStateDropped,
    /// A request carried a state beyond anything any server of the namespace reported.
    UntrustedState,
    /// Consecutive attempts of one call pinned to one node with the same rejection while
    /// other nodes served.
    PinnedRetry,
    /// A client stopped using follower reads for good after one rejection.
    FollowerReadDisabled,
    /// A router answered NoNamenodesAvailable for a namespace continuously.
    NoNamenodesWindow,
    /// A follower's applied state far behind committed, or stalled.
    ApplyLag,
    /// A server requeueing calls at a high rate for a long time.
    RequeueStorm,
    /// A shard's in-flight bytes near or at its limit.
    ShardPressure,
    /// Writes rejected for a shard whose own pressure was low.
    UnfairRejection,
    /// A failover probe saying "up" while the client's calls to that cluster fail.
    BlindFailoverProbe,
    /// A client switching clusters faster than its switch-back delay allows.
    FailoverFlapping,
}

impl AnomalyKind {
    pub const ALL: &'static [AnomalyKind] = &[
        AnomalyKind::StaleRead,
        AnomalyKind::CarriedStateRegression,
        AnomalyKind::RouterStateDropped,
        AnomalyKind::UntrustedState,
        AnomalyKind::PinnedRetry,
        AnomalyKind::FollowerReadDisabled,
        AnomalyKind::NoNamenodesWindow,
        AnomalyKind::ApplyLag,
        AnomalyKind::RequeueStorm,
        AnomalyKind::ShardPressure,
        AnomalyKind::UnfairRejection,
        AnomalyKind::BlindFailoverProbe,
        AnomalyKind::FailoverFlapping,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::StaleRead => "stale_read",
            Self::CarriedStateRegression => "carried_state_regression",
            Self::RouterStateDropped => "router_state_dropped",
            Self::UntrustedState => "untrusted_state",
            Self::PinnedRetry => "pinned_retry",
            Self::FollowerReadDisabled => "follower_read_disabled",
            Self::NoNamenodesWindow => "no_namenodes_window",
            Self::ApplyLag => "apply_lag",
            Self::RequeueStorm => "requeue_storm",
            Self::ShardPressure => "shard_pressure",
            Self::UnfairRejection => "unfair_rejection",
            Self::BlindFailoverProbe => "blind_failover_probe",
            Self::FailoverFlapping => "failover_flapping",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|kind| kind.as_str() == text)
    }
}

impl std::fmt::Display for AnomalyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Info,
    Warning,
    Critical,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Info => "info",
            Self::Warning => "warning",
            Self::Critical => "critical",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        [Self::Info, Self::Warning, Self::Critical].into_iter().find(|severity| severity.as_str() == text)
    }
}

/// The session guarantee a stale read broke (Terry et al., 1994), or the cross-client bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Guarantee {
    ReadYourWrites,
    MonotonicReads,
    CrossClient,
}

impl Guarantee {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ReadYourWrites => "read_your_writes",
            Self::MonotonicReads => "monotonic_reads",
            Self::CrossClient => "cross_client",
        }
    }
}

/// One anomaly. `fingerprint` identifies the incident: the same anomaly found again (a later
/// analysis pass, a replayed capture) has the same fingerprint and is reported once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Anomaly {
    pub kind: AnomalyKind,
    pub severity: Severity,
    pub cluster: Option<String>,
    pub namespace: Option<String>,
    pub client_id: Option<String>,
    pub node_id: Option<String>,
    pub start_unix_nano: UnixNanos,
    pub end_unix_nano: UnixNanos,
    /// One line a person reads first.
    pub summary: String,
    /// The probable cause, drawn from the domain's failure table.
    pub cause: String,
    /// The events, states, nodes and window that prove it; at least the ids of the spans
    /// involved (`spans`).
    pub evidence: crate::Evidence,
    pub fingerprint: String,
    /// A window anomaly whose condition still held at the end of the data seen so far; it is
    /// resolved (false) once the data shows the condition ended. Point anomalies are never open.
    #[serde(default)]
    pub open: bool,
}

impl AnomalyKind {
    /// Kinds that describe a window (a condition that holds for a while) rather than one event.
    pub fn is_window(self) -> bool {
        !matches!(self, Self::StaleRead | Self::CarriedStateRegression | Self::RouterStateDropped | Self::PinnedRetry)
    }

    /// Kinds whose anomalies name the client they happened to (`client_id`): a call's broken
    /// guarantee, or a client's own failover. The others describe a node, a shard or a
    /// namespace, and name no client.
    pub fn names_client(self) -> bool {
        !matches!(
            self,
            Self::ApplyLag | Self::NoNamenodesWindow | Self::RequeueStorm | Self::ShardPressure | Self::UnfairRejection
        )
    }
}
