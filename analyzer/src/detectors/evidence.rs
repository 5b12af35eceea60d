//! What every detector's evidence is made of: references to the spans, operations and
//! attempts involved, in one shape across detectors.

use lagscope_model::{ClientTimeline, TimelineAttempt, TimelineCall};
use serde_json::{Value, json};

pub(crate) fn method(call: &TimelineCall) -> String {
    call.rpc_method.clone().or_else(|| call.call_id.clone()).unwrap_or_else(|| "call".to_string())
}

pub(crate) fn operation(call: &TimelineCall, attempt: &TimelineAttempt) -> Value {
    json!({
        "call_id": call.call_id,
        "op": call.op.as_ref().map(|op| op.as_str()),
        "rpc_method": call.rpc_method,
        "attempt": attempt.attempt,
        "start_unix_nano": attempt.start_unix_nano,
        "end_unix_nano": attempt.end_unix_nano,
        "served": attempt.served,
        "returned": attempt.returned,
        "served_by": attempt.served_by,
        "spans": span_ids(attempt),
    })
}

/// The client, router and server spans of an attempt, as `{trace_id, span_id, service, node}`.
pub(crate) fn span_ids(attempt: &TimelineAttempt) -> Vec<Value> {
    std::iter::once(&attempt.client_span)
        .chain(&attempt.router_spans)
        .chain(&attempt.server_spans)
        .map(|span| {
            json!({
                "trace_id": span.trace_id,
                "span_id": span.span_id,
                "service_name": span.service_name,
                "node_id": span.node_id,
            })
        })
        .collect()
}

/// Identifies an attempt across analysis passes: its client span, else call id, attempt and
/// start.
pub(crate) fn attempt_key(call: &TimelineCall, attempt: &TimelineAttempt) -> String {
    match (&attempt.client_span.trace_id, &attempt.client_span.span_id) {
        (Some(trace_id), Some(span_id)) => format!("{trace_id}/{span_id}"),
        _ => format!(
            "{}#{}@{}",
            call.call_id.as_deref().unwrap_or(""),
            attempt.attempt.unwrap_or_default(),
            attempt.start_unix_nano
        ),
    }
}

/// The fingerprint of an anomaly about one attempt of one client: stable across analysis
/// passes, so a re-analysis updates the stored anomaly instead of adding one.
pub(crate) fn attempt_fingerprint(
    kind: &str,
    timeline: &ClientTimeline,
    call: &TimelineCall,
    attempt: &TimelineAttempt,
) -> String {
    format!(
        "{kind}|{}|{}|{}|{}",
        timeline.cluster.as_deref().unwrap_or(""),
        timeline.namespace.as_deref().unwrap_or(""),
        timeline.client_id,
        attempt_key(call, attempt)
    )
}
