//! What every detector's evidence is made of: references to the spans, operations and
//! attempts involved, in one shape across detectors.

use lagscope_model::ClientTimeline;
use serde::Serialize;

use super::view::{AttemptView, CallView, Id, SpanView};

/// What a summary calls the call: its RPC method, else its call id.
pub(crate) fn method(call: &impl CallView) -> &str {
    call.rpc_method().or_else(|| call.call_id()).unwrap_or("call")
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
    pub(crate) spans: Spans,
}

pub(crate) fn operation<'a, C: CallView>(call: &'a C, attempt: &'a impl AttemptView) -> Operation<'a> {
    Operation {
        call_id: call.call_id(),
        op: call.op(),
        rpc_method: call.rpc_method(),
        attempt: attempt.number(),
        start_unix_nano: attempt.start(),
        end_unix_nano: attempt.end(),
        served: attempt.served(),
        returned: attempt.returned(),
        served_by: attempt.served_by(),
        spans: span_ids(attempt),
    }
}

/// A span reference as evidence: `{trace_id, span_id, service_name, node_id}` (the shape of
/// the objects in [`Spans`]).
#[derive(Serialize)]
pub(crate) struct SpanId<'a> {
    trace_id: Option<&'a str>,
    span_id: Option<&'a str>,
    service_name: Option<&'a str>,
    node_id: Option<&'a str>,
}

/// Span references as evidence: a JSON array of [`SpanId`] objects, written as text once and
/// copied where it appears again (an anomaly cites the same spans in its operations and in
/// its list of all spans: most of an anomaly's evidence by size).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Spans(String);

impl Spans {
    /// The spans of the attempts, in order: each attempt's client span, router spans, then
    /// server spans.
    pub(crate) fn of<A: AttemptView>(attempts: impl IntoIterator<Item = A>) -> Self {
        // An attempt's three spans, as ids and names are usually long (no growing on the way).
        let mut text = String::with_capacity(512);
        text.push('[');
        for attempt in attempts {
            attempt.each_span(&mut |span| push_span(&mut text, span));
        }
        text.push(']');
        Self(text)
    }

    /// The lists one after the other, as one list.
    pub(crate) fn concat<'a>(lists: impl IntoIterator<Item = &'a Spans, IntoIter: Clone>) -> Self {
        let lists = lists.into_iter();
        let mut text = String::with_capacity(lists.clone().map(|list| list.0.len()).sum::<usize>() + 2);
        text.push('[');
        for list in lists {
            let elements = &list.0[1..list.0.len() - 1];
            if elements.is_empty() {
                continue;
            }
            if text.len() > 1 {
                text.push(',');
            }
            text.push_str(elements);
        }
        text.push(']');
        Self(text)
    }
}

impl Serialize for Spans {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        lagscope_model::json::Raw(&self.0).serialize(serializer)
    }
}

/// Appends `span` to a list being written (the same text serde writes for a [`SpanId`]).
fn push_span(text: &mut String, span: SpanView<'_>) {
    if !text.ends_with('[') {
        text.push(',');
    }
    let fields = [
        ("{\"trace_id\":", span.trace_id),
        (",\"span_id\":", span.span_id),
        (",\"service_name\":", span.service_name.map(Id::Text)),
        (",\"node_id\":", span.node_id.map(Id::Text)),
    ];
    for (name, value) in fields {
        text.push_str(name);
        match value {
            Some(value) => value.push_json(text),
            None => text.push_str("null"),
        }
    }
    text.push('}');
}

/// The client, router and server spans of an attempt.
pub(crate) fn span_ids(attempt: &impl AttemptView) -> Spans {
    Spans::of([attempt])
}

/// Appends what identifies an attempt across analysis passes: its client span, else call id,
/// attempt and start. Fingerprints are built by concatenation: one is made for every anomaly,
/// and `format!` costs several times as much.
fn push_attempt_key(out: &mut String, call: &impl CallView, attempt: &impl AttemptView) {
    use std::fmt::Write as _;
    match attempt.client_span_ids() {
        Some((trace_id, span_id)) => {
            trace_id.push_text(out);
            out.push('/');
            span_id.push_text(out);
        }
        None => {
            out.push_str(call.call_id().unwrap_or(""));
            // Writing into a String cannot fail.
            let _ = write!(out, "#{}@{}", attempt.number().unwrap_or_default(), attempt.start());
        }
    }
}

/// The fingerprint of an anomaly about one attempt of one client: stable across analysis
/// passes, so a re-analysis updates the stored anomaly instead of adding one.
pub(crate) fn attempt_fingerprint(
    kind: &str,
    timeline: &ClientTimeline,
    call: &impl CallView,
    attempt: &impl AttemptView,
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

#[cfg(test)]
mod tests {
    use std::slice::from_ref;

    use lagscope_model::{SpanRef, TimelineAttempt};

    use super::*;

    fn span(trace_id: Option<&str>, span_id: Option<&str>, service: Option<&str>, node: Option<&str>) -> SpanRef {
        let owned = |value: Option<&str>| value.map(str::to_string);
        SpanRef {
            trace_id: owned(trace_id),
            span_id: owned(span_id),
            service_name: owned(service),
            node_id: owned(node),
        }
    }

    /// An attempt of these client, router and server spans (nothing else set).
    fn attempt(client: &SpanRef, routers: &[SpanRef], servers: &[SpanRef]) -> TimelineAttempt {
        serde_json::from_value(serde_json::json!({
            "start_unix_nano": 1, "end_unix_nano": 2, "join": "trace_context",
            "client_span": client, "router_spans": routers, "server_spans": servers,
        }))
        .expect("an attempt")
    }

    fn as_span_ids<'a>(spans: impl IntoIterator<Item = &'a SpanRef>) -> Vec<SpanId<'a>> {
        spans
            .into_iter()
            .map(|span| SpanId {
                trace_id: span.trace_id.as_deref(),
                span_id: span.span_id.as_deref(),
                service_name: span.service_name.as_deref(),
                node_id: span.node_id.as_deref(),
            })
            .collect()
    }

    /// The text written for a list of spans is serde_json's for the same `SpanId`s (absent
    /// fields, and telemetry with quotes, backslashes, control and non-ASCII characters among
    /// them), in order (client, routers, servers; attempt after attempt), and lists joined are
    /// the lists' elements in order.
    #[test]
    fn span_lists_are_written_as_serde_writes_them() {
        let client =
            span(Some("0af7651916cd43dd8448eb211c80319c"), Some("b7ad6b7169203331"), Some("hdfs-client"), None);
        let router = span(None, None, Some("svc \"quoted\" \\ back"), Some("router-1"));
        let server = span(Some("t"), Some("s"), Some("tab\there\u{1}"), Some("nœud-é"));
        let (one, two) =
            (attempt(&client, from_ref(&router), from_ref(&server)), attempt(&server, &[], from_ref(&client)));
        let written = |spans: &Spans| serde_json::to_string(spans).expect("written");
        let expected =
            |spans: &[&SpanRef]| serde_json::to_string(&as_span_ids(spans.iter().copied())).expect("written");
        let (first, second, none) = (span_ids(&one), span_ids(&two), Spans::of::<&TimelineAttempt>([]));
        assert_eq!(written(&first), expected(&[&client, &router, &server]));
        assert_eq!(written(&second), expected(&[&server, &client]));
        assert_eq!(written(&none), "[]");
        let all = [&client, &router, &server, &server, &client];
        assert_eq!(written(&Spans::of([&one, &two])), expected(&all));
        assert_eq!(written(&Spans::concat([&none, &first, &none, &second, &none])), expected(&all));
        assert_eq!(written(&Spans::concat([&none, &none])), "[]");
        // The same through lagscope's own writer, inside an object.
        let evidence = evidence!({ "spans": first, "n": 1 });
        assert_eq!(evidence.as_json(), format!("{{\"spans\":{},\"n\":1}}", expected(&[&client, &router, &server])));
    }
}
