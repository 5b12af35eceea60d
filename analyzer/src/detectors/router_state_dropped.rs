//! `router_state_dropped`: the router's request to a server carried less than the client's
//! request did (HDFS-16826: a connection pool not advanced by the client's state).

use lagscope_model::{Anomaly, AnomalyKind, ClientTimeline, Severity, UnixNanos};

use super::evidence::{attempt_fingerprint, evidence, method, operation, span_ids};
use super::view::{AttemptView, CallView};
use crate::{AnalysisInput, AnalyzerConfig};

pub fn detect(input: &AnalysisInput, config: &AnalyzerConfig) -> Vec<Anomaly> {
    super::every_call(input, config, judge)
}

/// The dropped states in `timeline`'s calls that start at or after `from`, each with its
/// call's start ([`super::JudgeCalls`]).
pub(crate) fn judge(
    timeline: &ClientTimeline,
    from: UnixNanos,
    config: &AnalyzerConfig,
    found: &mut dyn FnMut(UnixNanos, Anomaly),
) {
    for call in timeline.calls.iter().filter(|call| call.start_unix_nano >= from) {
        for attempt in &call.attempts {
            let (Some(carried), Some(forwarded)) = (attempt.carried, attempt.router_carried) else { continue };
            if carried.saturating_sub(forwarded) < config.router_state_dropped.min_states_behind.max(1) {
                continue;
            }
            found(call.start_unix_nano, dropped(timeline, call, attempt, carried, forwarded));
        }
    }
}

/// The anomaly for `attempt` of `call`: the client carried `carried`, the router forwarded
/// `forwarded`. Shared with the streaming engine.
pub(crate) fn dropped(
    timeline: &ClientTimeline,
    call: &impl CallView,
    attempt: &impl AttemptView,
    carried: i64,
    forwarded: i64,
) -> Anomaly {
    let router = attempt.router_node().unwrap_or("the router");
    let target = attempt.served_by().unwrap_or("the server");
    Anomaly {
        kind: AnomalyKind::RouterStateDropped,
        severity: Severity::Warning,
        cluster: timeline.cluster.clone(),
        namespace: timeline.namespace.clone(),
        client_id: Some(timeline.client_id.clone()),
        node_id: attempt.router_node().map(str::to_string),
        start_unix_nano: attempt.start(),
        end_unix_nano: attempt.end(),
        summary: format!(
            "{router} forwarded {} for client {} to {target} with state {forwarded}, {} below the {carried} the client carried",
            method(call),
            timeline.client_id,
            carried.saturating_sub(forwarded)
        ),
        cause: format!(
            "router dropped client state: {router}'s connection pool to {target} was not advanced by the client's state \
             (HDFS-16826); a read there may be served below what the client has seen"
        ),
        evidence: evidence!({
            "carried": carried,
            "forwarded": forwarded,
            "states_behind": carried.saturating_sub(forwarded),
            "router": attempt.router_node(),
            "target": attempt.served_by(),
            "served": attempt.served(),
            "request": operation(call, attempt),
            "spans": span_ids(attempt),
        }),
        open: false,
        fingerprint: attempt_fingerprint("router_state_dropped", timeline, call, attempt),
    }
}
