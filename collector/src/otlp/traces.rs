//! OTLP trace requests to domain spans.

use lagscope_model::conventions as conv;
use lagscope_model::{
    CallFields, Component, Op, Outcome, ResourceFields, Span, SpanEvent, SpanKind, SpanLink, StateFields,
};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::trace::v1 as proto;

use super::attributes::{AttributeTaker, WrongType, key_values_to_json};
use super::{Converted, Rejection, resource_fields, unix_nanos};

/// Converts every span of a request. Spans that break the protocol or the conventions are
/// rejected one by one with a message naming them; the others are kept.
pub fn spans_from_request(request: &ExportTraceServiceRequest) -> Converted<Span> {
    let mut converted = Converted::default();
    for (resource_index, resource_spans) in request.resource_spans.iter().enumerate() {
        let resource = resource_fields(resource_spans.resource.as_ref());
        for (scope_index, scope_spans) in resource_spans.scope_spans.iter().enumerate() {
            let scope = scope_spans.scope.as_ref();
            for (span_index, span) in scope_spans.spans.iter().enumerate() {
                match convert_span(span, &resource, scope) {
                    Ok(domain_span) => converted.items.push(domain_span),
                    Err(message) => {
                        // (Written only for a span refused: most are not.)
                        let path =
                            format!("resourceSpans[{resource_index}].scopeSpans[{scope_index}].spans[{span_index}]");
                        converted.rejections.push(Rejection { path, message });
                    }
                }
            }
        }
    }
    converted
}

fn convert_span(
    span: &proto::Span,
    resource: &ResourceFields,
    scope: Option<&opentelemetry_proto::tonic::common::v1::InstrumentationScope>,
) -> Result<Span, String> {
    let trace_id = hex_id(&span.trace_id, 16, "traceId")?;
    let span_id = hex_id(&span.span_id, 8, "spanId")?;
    if trace_id.is_some() != span_id.is_some() {
        return Err("traceId and spanId must be sent together".to_string());
    }
    let parent_span_id = hex_id(&span.parent_span_id, 8, "parentSpanId")?;
    let start_unix_nano = unix_nanos(span.start_time_unix_nano, "startTimeUnixNano")?;
    let end_unix_nano = unix_nanos(span.end_time_unix_nano, "endTimeUnixNano")?;
    let (mut call_attributes, attributes) = AttributeTaker::split(&span.attributes);
    let call = take_call_fields(&mut call_attributes).map_err(|wrong| wrong.to_string())?;
    let mut resource = resource.clone();
    // A sender that puts the resource's conventions on the span is understood too; the
    // attribute itself stays with the span's attributes.
    fill_from_span(&mut resource, &attributes);
    let events = span
        .events
        .iter()
        .enumerate()
        .map(|(index, event)| {
            Ok(SpanEvent {
                time_unix_nano: unix_nanos(event.time_unix_nano, &format!("events[{index}].timeUnixNano"))?,
                name: event.name.clone(),
                attributes: key_values_to_json(&event.attributes),
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let links = span
        .links
        .iter()
        .enumerate()
        .map(|(index, link)| {
            Ok(SpanLink {
                trace_id: hex_id(&link.trace_id, 16, &format!("links[{index}].traceId"))?,
                span_id: hex_id(&link.span_id, 8, &format!("links[{index}].spanId"))?,
                attributes: key_values_to_json(&link.attributes),
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let status = span.status.as_ref();
    Ok(Span {
        trace_id,
        span_id,
        parent_span_id,
        name: span.name.clone(),
        kind: SpanKind::from_otlp(span.kind),
        start_unix_nano,
        end_unix_nano,
        status_code: status.map_or(0, |status| status.code),
        status_message: status.map(|status| status.message.clone()).filter(|message| !message.is_empty()),
        resource,
        scope_name: scope.map(|scope| scope.name.clone()).filter(|name| !name.is_empty()),
        scope_version: scope.map(|scope| scope.version.clone()).filter(|version| !version.is_empty()),
        scope_attributes: scope.map(|scope| key_values_to_json(&scope.attributes)).unwrap_or_default(),
        call,
        attributes,
        events,
        links,
    })
}

fn take_call_fields(take: &mut AttributeTaker) -> Result<CallFields, WrongType> {
    Ok(CallFields {
        client_id: take.string(conv::CLIENT_ID)?,
        call_id: take.string(conv::CALL_ID)?,
        attempt: take.int(conv::ATTEMPT)?,
        namespace: take.string(conv::NAMESPACE)?,
        op: take.string(conv::OP)?.as_deref().map(Op::parse),
        rpc_method: take.string(conv::RPC_METHOD)?,
        target_node: take.string(conv::TARGET_NODE)?,
        target_role: take.string(conv::TARGET_ROLE)?,
        node_role: take.string(conv::NODE_ROLE)?,
        consistency: take.string(conv::CONSISTENCY)?,
        follower_read: take.bool(conv::FOLLOWER_READ)?,
        state: StateFields {
            carried: take.int(conv::STATE_CARRIED)?,
            returned: take.int(conv::STATE_RETURNED)?,
            served: take.int(conv::STATE_SERVED)?,
            committed: take.int(conv::STATE_COMMITTED)?,
            router: take.int(conv::STATE_ROUTER)?,
        },
        outcome: take.string(conv::OUTCOME)?.as_deref().map(Outcome::parse),
        error_type: take.string(conv::ERROR_TYPE)?,
        requeues: take.int(conv::REQUEUES)?,
        retry_delay_ms: take.int(conv::RETRY_DELAY_MS)?,
        bytes: take.int(conv::BYTES)?,
    })
}

fn fill_from_span(resource: &mut ResourceFields, attributes: &lagscope_model::Attributes) {
    let text = |key: &str| attributes.get(key).and_then(|value| value.as_str()).map(str::to_string);
    if resource.cluster.is_none() {
        resource.cluster = text(conv::CLUSTER);
    }
    if resource.system.is_none() {
        resource.system = text(conv::SYSTEM);
    }
    if resource.node_id.is_none() {
        resource.node_id = text(conv::NODE_ID);
    }
    if resource.component.is_none() {
        resource.component = text(conv::COMPONENT).as_deref().map(Component::parse);
    }
}

/// A trace or span id as lowercase hex; empty or all-zero ids mean "none" (OTLP's invalid id).
pub(crate) fn hex_id(bytes: &[u8], length: usize, field: &str) -> Result<Option<String>, String> {
    if bytes.is_empty() || bytes.iter().all(|byte| *byte == 0) {
        return Ok(None);
    }
    if bytes.len() != length {
        return Err(format!("{field} must be {length} bytes, got {}", bytes.len()));
    }
    Ok(Some(hex::encode(bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_written_in_lowercase_hex() {
        assert_eq!(hex_id(&[0xab; 8], 8, "spanId"), Ok(Some("abababababababab".to_string())));
        assert_eq!(hex_id(&[0; 16], 16, "traceId"), Ok(None));
        assert_eq!(hex_id(&[1; 7], 8, "spanId"), Err("spanId must be 8 bytes, got 7".to_string()));
    }
}
