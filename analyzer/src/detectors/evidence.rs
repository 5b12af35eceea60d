//! What every detector's evidence is made of: references to the spans, operations and
//! attempts involved, in one shape across detectors.

use lagscope_model::{ClientTimeline, TimelineAttempt, TimelineCall};
use serde::Serialize;

pub(crate) fn method(call: &TimelineCall) -> String {
    call.rpc_method.clone().or_else(|| call.call_id.clone()).unwrap_or_else(|| "call".to_string())
}

/// `evidence!({ "key": value, ... })`: an anomaly's [`Evidence`](lagscope_model::Evidence),
/// written straight to JSON in the order given (the shape `serde_json::json!` would give,
/// without building a map).
macro_rules! evidence {
    ({ $($key:literal : $value:expr),* $(,)? }) => {
        lagscope_model::Evidence::of(&lagscope_model::evidence::Object(evidence!(@fields $($key : $value),*)))
    };
    (@fields) => { lagscope_model::evidence::End };
    (@fields $key:literal : $value:expr $(, $rest_key:literal : $rest_value:expr)*) => {
        lagscope_model::evidence::Field($key, &$value, evidence!(@fields $($rest_key : $rest_value),*))
    };
}
pub(crate) use evidence;

/// No spans (metric anomalies).
pub(crate) const NO_SPANS: [SpanId<'static>; 0] = [];

/// One attempt of a call, as evidence: what it asked, what served it, its spans.
#[derive(Serialize)]
pub(crate) struct Operation<'a> {
    call_id: Option<&'a str>,
    op: Option<&'a str>,
    rpc_method: Option<&'a str>,
    attempt: Option<i64>,
    start_unix_nano: i64,
    end_unix_nano: i64,
    served: Option<i64>,
    returned: Option<i64>,
    served_by: Option<&'a str>,
    spans: Vec<SpanId<'a>>,
}

pub(crate) fn operation<'a>(call: &'a TimelineCall, attempt: &'a TimelineAttempt) -> Operation<'a> {
    Operation {
        call_id: call.call_id.as_deref(),
        op: call.op.as_ref().map(|op| op.as_str()),
        rpc_method: call.rpc_method.as_deref(),
        attempt: attempt.attempt,
        start_unix_nano: attempt.start_unix_nano,
        end_unix_nano: attempt.end_unix_nano,
        served: attempt.served,
        returned: attempt.returned,
        served_by: attempt.served_by.as_deref(),
        spans: span_ids(attempt),
    }
}

/// A span reference as evidence: `{trace_id, span_id, service_name, node_id}`.
#[derive(Serialize)]
pub(crate) struct SpanId<'a> {
    trace_id: Option<&'a str>,
    span_id: Option<&'a str>,
    service_name: Option<&'a str>,
    node_id: Option<&'a str>,
}

/// The client, router and server spans of an attempt.
pub(crate) fn span_ids(attempt: &TimelineAttempt) -> Vec<SpanId<'_>> {
    std::iter::once(&attempt.client_span)
        .chain(&attempt.router_spans)
        .chain(&attempt.server_spans)
        .map(|span| SpanId {
            trace_id: span.trace_id.as_deref(),
            span_id: span.span_id.as_deref(),
            service_name: span.service_name.as_deref(),
            node_id: span.node_id.as_deref(),
        })
        .collect()
}

/// Appends what identifies an attempt across analysis passes: its client span, else call id,
/// attempt and start. Fingerprints are built by concatenation: one is made for every anomaly,
/// and `format!` costs several times as much.
fn push_attempt_key(out: &mut String, call: &TimelineCall, attempt: &TimelineAttempt) {
    use std::fmt::Write as _;
    match (&attempt.client_span.trace_id, &attempt.client_span.span_id) {
        (Some(trace_id), Some(span_id)) => {
            out.push_str(trace_id);
            out.push('/');
            out.push_str(span_id);
        }
        _ => {
            out.push_str(call.call_id.as_deref().unwrap_or(""));
            // Writing into a String cannot fail.
            let _ = write!(out, "#{}@{}", attempt.attempt.unwrap_or_default(), attempt.start_unix_nano);
        }
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
    let cluster = timeline.cluster.as_deref().unwrap_or("");
    let namespace = timeline.namespace.as_deref().unwrap_or("");
    // Four separators, then the key: a trace id, '/' and a span id (32 + 1 + 16 digits).
    let mut fingerprint =
        String::with_capacity(kind.len() + cluster.len() + namespace.len() + timeline.client_id.len() + 4 + 49);
    for part in [kind, cluster, namespace, timeline.client_id.as_str()] {
        fingerprint.push_str(part);
        fingerprint.push('|');
    }
    push_attempt_key(&mut fingerprint, call, attempt);
    fingerprint
}
