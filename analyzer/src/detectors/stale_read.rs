//! `stale_read` (read-your-writes, monotonic reads): a read served below the client's floor.
//!
//! The check uses the state that *served* the read (the executing node's applied state),
//! never the state the response returned, which a router may raise to its own global state.
//! The cause is found by walking the read's states from client to server: the first hop
//! where the state fell below the floor is where the guarantee broke.

use lagscope_model::{Anomaly, AnomalyKind, ClientTimeline, Guarantee, Severity, UnixNanos};

use super::evidence::{Spans, attempt_fingerprint, evidence, method, operation};
use super::view::{AttemptView, CallView};
use crate::floor::{FloorContribution, FloorSource, served_reads};
use crate::{AnalysisInput, AnalyzerConfig};

/// Whether `read`'s consistency level is exempt from session guarantees.
pub(crate) fn exempt(consistency: Option<&str>, config: &AnalyzerConfig) -> bool {
    consistency
        .is_some_and(|consistency| config.stale_read.exempt_consistencies.iter().any(|exempt| exempt == consistency))
}

pub fn detect(input: &AnalysisInput, config: &AnalyzerConfig) -> Vec<Anomaly> {
    super::every_call(input, config, judge)
}

/// The stale reads among `timeline`'s calls that start at or after `from` (their floors from
/// every call), each with its call's start ([`super::JudgeCalls`]).
pub(crate) fn judge(
    timeline: &ClientTimeline,
    from: UnixNanos,
    config: &AnalyzerConfig,
    found: &mut dyn FnMut(UnixNanos, Anomaly),
) {
    for read in served_reads(&timeline.calls) {
        if read.call.start_unix_nano < from || exempt(read.attempt.consistency.as_deref(), config) {
            continue;
        }
        if let Some(floor) = read.broken_floor(config.stale_read.min_states_behind) {
            let floor_call = &timeline.calls[floor.call_index];
            found(
                read.call.start_unix_nano,
                stale_read(timeline, read.call, read.attempt, read.served, &floor, floor_call),
            );
        }
    }
}

/// The anomaly for `attempt` of `call`, served at `served` below `floor`, which
/// `floor_call` set (its attempt `floor.attempt_index`). Shared with the streaming engine.
pub(crate) fn stale_read<C: CallView>(
    timeline: &ClientTimeline,
    call: &C,
    attempt: &impl AttemptView,
    served: i64,
    floor: &FloorContribution,
    floor_call: &C,
) -> Anomaly {
    let guarantee = match floor.source {
        FloorSource::Write => Guarantee::ReadYourWrites,
        FloorSource::Read => Guarantee::MonotonicReads,
    };
    let floor_attempt = floor_call.attempt(floor.attempt_index);
    let node = attempt.served_by().unwrap_or("an unknown node");
    let role = attempt.served_role().map(|role| format!(" ({role})")).unwrap_or_default();
    let namespace = timeline.namespace.as_deref().unwrap_or("its namespace");
    let what_set_floor = match floor.source {
        FloorSource::Write => format!("its own write {} returned", method(floor_call)),
        FloorSource::Read => format!("its earlier read {} was served at", method(floor_call)),
    };
    let summary = format!(
        "client {} read {namespace} ({}) at state {served} on {node}{role}, {} states below the {} {what_set_floor}: {} broken",
        timeline.client_id,
        method(call),
        floor.state.saturating_sub(served),
        floor.state,
        guarantee.as_str().replace('_', "-"),
    );
    let read = operation(call, attempt);
    let floor_set_by = operation(floor_call, &floor_attempt);
    let spans = Spans::concat([&read.spans, &floor_set_by.spans]);
    let evidence = evidence!({
        "guarantee": guarantee.as_str(),
        "floor": floor.state,
        "served": served,
        "states_behind": floor.state.saturating_sub(served),
        "carried": attempt.carried(),
        "router_carried": attempt.router_carried(),
        "router_state": attempt.router_state(),
        "returned": attempt.returned(),
        "committed": attempt.committed(),
        "served_by": attempt.served_by(),
        "served_role": attempt.served_role(),
        "target_node": attempt.target_node(),
        "router": attempt.router_node(),
        "read": read,
        "floor_set_by": floor_set_by,
        "spans": spans,
    });
    Anomaly {
        kind: AnomalyKind::StaleRead,
        severity: Severity::Critical,
        cluster: timeline.cluster.clone(),
        namespace: timeline.namespace.clone(),
        client_id: Some(timeline.client_id.clone()),
        node_id: attempt.served_by().map(str::to_string),
        start_unix_nano: attempt.start(),
        end_unix_nano: attempt.end(),
        summary,
        cause: cause(attempt, served, floor.state),
        evidence,
        open: false,
        fingerprint: attempt_fingerprint("stale_read", timeline, call, attempt),
    }
}

/// Walks the read's states from client to server and names the first hop below the floor.
fn cause(attempt: &impl AttemptView, served: i64, floor: i64) -> String {
    let node = attempt.served_by().unwrap_or("the serving node");
    let router = attempt.router_node().unwrap_or("the router");
    if let Some(carried) = attempt.carried().filter(|carried| *carried < floor) {
        return format!(
            "carried-state regression: the client carried state {carried}, below the {floor} it had already seen, \
             so no server could know to wait (state published after the call returned, HDFS-17156, or a stale \
             router response overwrote a newer state, HDFS-16837)"
        );
    }
    if let (Some(carried), Some(router_carried)) = (attempt.carried(), attempt.router_carried())
        && router_carried < carried
    {
        return format!(
            "router dropped client state: {router} forwarded state {router_carried} to {node}, below the {carried} \
             the client carried (the pool state was not advanced by the client's state, HDFS-16826)"
        );
    }
    let required = attempt.router_carried().or(attempt.carried());
    match required {
        Some(required) if served < required => format!(
            "{node} served the read at applied state {served} although the request carried {required}: it did not \
             requeue the call until its applied state caught up"
        ),
        Some(_) => format!("{node} served at applied state {served}, below the client's floor {floor}"),
        None => format!(
            "{node} served at applied state {served}, {} states behind the client's floor {floor}; the request \
             reported no carried state, so the server had nothing to wait for",
            floor.saturating_sub(served)
        ),
    }
}
