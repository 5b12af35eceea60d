//! Captured OTLP JSON: a file holding one `Export*ServiceRequest`, or JSON lines of them as
//! the OpenTelemetry Collector's file exporter writes them (traces, metrics and logs mixed).

use lagscope_model::{LogRecord, Sample, Span};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use thiserror::Error;

use crate::otlp::{Converted, logs_from_request, samples_from_request, spans_from_request};

/// Everything read from one or more captures.
#[derive(Debug, Default)]
pub struct Capture {
    pub spans: Vec<Span>,
    pub samples: Vec<Sample>,
    pub logs: Vec<LogRecord>,
    /// Export requests read.
    pub requests: usize,
}

/// What was wrong with a capture, and where (1-based line).
#[derive(Debug, Error, PartialEq)]
#[error("{source_name}:{line}: {message}")]
pub struct CaptureError {
    pub source_name: String,
    pub line: usize,
    pub message: String,
}

impl Capture {
    /// Reads every export request in `text` (already decompressed), appending to `self`.
    /// `source_name` names the input in error messages.
    pub fn read_str(&mut self, source_name: &str, text: &str) -> Result<(), CaptureError> {
        let mut stream = serde_json::Deserializer::from_str(text).into_iter::<AnyRequest>();
        // Lines are counted incrementally: counting from the start for every request would
        // make a long capture quadratic.
        let mut line = 1;
        let mut counted_to = 0;
        loop {
            let offset = skip_whitespace(text, stream.byte_offset());
            line += newlines(&text.as_bytes()[counted_to..offset]);
            counted_to = offset;
            let error = |message: String| CaptureError { source_name: source_name.to_string(), line, message };
            let request = match stream.next() {
                None => return Ok(()),
                Some(Ok(request)) => request,
                Some(Err(json_error)) => {
                    let message = if json_error.is_data() {
                        json_error.to_string()
                    } else {
                        format!("invalid JSON: {json_error}")
                    };
                    return Err(CaptureError {
                        source_name: source_name.to_string(),
                        line: json_error.line().max(1),
                        message,
                    });
                }
            };
            self.read_request(request).map_err(error)?;
            self.requests += 1;
        }
    }

    fn read_request(&mut self, request: AnyRequest) -> Result<(), String> {
        match request {
            AnyRequest::Traces(request) => self.spans.extend(accept_all(spans_from_request(&request))?),
            AnyRequest::Metrics(request) => self.samples.extend(accept_all(samples_from_request(&request))?),
            AnyRequest::Logs(request) => self.logs.extend(accept_all(logs_from_request(&request))?),
        }
        Ok(())
    }
}

/// What one export request held.
#[derive(Debug, Default)]
pub struct Decoded {
    pub spans: Vec<Span>,
    pub samples: Vec<Sample>,
    pub logs: Vec<LogRecord>,
}

/// Reads export requests one at a time from JSON lines (the Collector's file exporter: one
/// request per line), handing each to `each` as it is decoded, so memory holds one request,
/// not the file. A file that is one JSON document over several lines is read whole. Returns
/// how many requests were read; `each`'s error stops the reading and is reported at its line.
pub fn stream_requests(
    source_name: &str,
    mut reader: impl std::io::BufRead,
    mut each: impl FnMut(Decoded) -> Result<(), String>,
) -> Result<usize, CaptureError> {
    let error = |line: usize, message: String| CaptureError { source_name: source_name.to_string(), line, message };
    let mut text = String::new();
    let mut line = 0;
    let mut requests = 0;
    loop {
        text.clear();
        let read = reader.read_line(&mut text).map_err(|io| {
            let what = if io.kind() == std::io::ErrorKind::InvalidData { "not UTF-8 text" } else { "cannot read" };
            error(line + 1, format!("{what}: {io}"))
        })?;
        if read == 0 {
            return Ok(requests);
        }
        line += 1;
        let mut values = serde_json::Deserializer::from_str(&text).into_iter::<AnyRequest>();
        loop {
            match values.next() {
                None => break,
                Some(Ok(request)) => {
                    let mut capture = Capture::default();
                    capture.read_request(request).map_err(|message| error(line, message))?;
                    requests += 1;
                    let decoded = Decoded { spans: capture.spans, samples: capture.samples, logs: capture.logs };
                    each(decoded).map_err(|message| error(line, message))?;
                }
                Some(Err(json_error)) if json_error.is_eof() && requests == 0 => {
                    // One document over several lines: read it whole.
                    let mut rest = text.clone();
                    reader.read_to_string(&mut rest).map_err(|io| error(line, format!("cannot read: {io}")))?;
                    let mut capture = Capture::default();
                    capture.read_str(source_name, &rest).map_err(|mut inner| {
                        inner.line += line - 1;
                        inner
                    })?;
                    let decoded = Decoded { spans: capture.spans, samples: capture.samples, logs: capture.logs };
                    each(decoded).map_err(|message| error(line, message))?;
                    return Ok(capture.requests);
                }
                Some(Err(json_error)) => {
                    let message = if json_error.is_data() {
                        json_error.to_string()
                    } else {
                        format!("invalid JSON: {json_error}")
                    };
                    return Err(error(line, message));
                }
            }
        }
    }
}

/// One export request of any signal, recognised by its key and decoded straight into its
/// type (no intermediate JSON tree: captures run to hundreds of megabytes).
enum AnyRequest {
    Traces(ExportTraceServiceRequest),
    Metrics(ExportMetricsServiceRequest),
    Logs(ExportLogsServiceRequest),
}

impl<'de> serde::Deserialize<'de> for AnyRequest {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct RequestVisitor;

        impl<'de> serde::de::Visitor<'de> for RequestVisitor {
            type Value = AnyRequest;

            fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                formatter.write_str("a JSON object holding an OTLP export request")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<AnyRequest, A::Error> {
                use serde::de::Error;
                let mut request = None;
                while let Some(key) = map.next_key::<String>()? {
                    let invalid = |what: &str, error: A::Error| A::Error::custom(format!("invalid {what}: {error}"));
                    match key.as_str() {
                        "resourceSpans" => {
                            let resource_spans =
                                map.next_value().map_err(|error| invalid("ExportTraceServiceRequest", error))?;
                            request = Some(AnyRequest::Traces(ExportTraceServiceRequest { resource_spans }));
                        }
                        "resourceMetrics" => {
                            let resource_metrics =
                                map.next_value().map_err(|error| invalid("ExportMetricsServiceRequest", error))?;
                            request = Some(AnyRequest::Metrics(ExportMetricsServiceRequest { resource_metrics }));
                        }
                        "resourceLogs" => {
                            let resource_logs =
                                map.next_value().map_err(|error| invalid("ExportLogsServiceRequest", error))?;
                            request = Some(AnyRequest::Logs(ExportLogsServiceRequest { resource_logs }));
                        }
                        // Unknown fields are ignored, as OTLP/JSON requires.
                        _ => {
                            map.next_value::<serde::de::IgnoredAny>()?;
                        }
                    }
                }
                request.ok_or_else(|| {
                    A::Error::custom(
                        "not an OTLP export request: expected a resourceSpans, resourceMetrics or resourceLogs key",
                    )
                })
            }
        }

        deserializer.deserialize_map(RequestVisitor)
    }
}

/// In a capture every record must be readable: the first refusal is the error.
fn accept_all<T>(converted: Converted<T>) -> Result<Vec<T>, String> {
    match converted.rejection_message() {
        Some(message) => Err(message),
        None => Ok(converted.items),
    }
}

fn skip_whitespace(text: &str, offset: usize) -> usize {
    let rest = &text[offset.min(text.len())..];
    offset + (rest.len() - rest.trim_start().len())
}

fn newlines(bytes: &[u8]) -> usize {
    bytes.iter().filter(|byte| **byte == b'\n').count()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPAN_LINE: &str = r#"{"resourceSpans":[{"resource":{"attributes":[{"key":"lagscope.client.id","value":{"stringValue":"c1"}}]},"scopeSpans":[{"spans":[{"traceId":"5b8efff798038103d269b633813fc60c","spanId":"eee19b7ec3c1b174","name":"getFileInfo","startTimeUnixNano":"1","endTimeUnixNano":"2","attributes":[{"key":"lagscope.state.carried","value":{"intValue":"42"}}]}]}]}]}"#;

    #[test]
    fn reads_json_lines_of_mixed_signals() {
        let text = format!(
            "{SPAN_LINE}\n{}\n{}\n",
            r#"{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"m","gauge":{"dataPoints":[{"asInt":"7","timeUnixNano":"5"}]}}]}]}]}"#,
            r#"{"resourceLogs":[{"scopeLogs":[{"logRecords":[{"body":{"stringValue":"x"}}]}]}]}"#,
        );
        let mut capture = Capture::default();
        capture.read_str("c.jsonl", &text).expect("capture reads");
        assert_eq!((capture.requests, capture.spans.len(), capture.samples.len(), capture.logs.len()), (3, 1, 1, 1));
        assert_eq!(capture.logs[0].body_text(), "x");
        assert_eq!(capture.spans[0].call.state.carried, Some(42));
        assert_eq!(capture.samples[0].value.as_number(), Some(7.0));
    }

    #[test]
    fn streams_json_lines_and_reads_a_multi_line_document_whole() {
        let text = format!("{SPAN_LINE}\n\n{SPAN_LINE}\n");
        let mut spans = 0;
        let requests = stream_requests("c.jsonl", text.as_bytes(), |decoded| {
            spans += decoded.spans.len();
            Ok(())
        })
        .expect("capture streams");
        assert_eq!((requests, spans), (2, 2));
        let pretty = serde_json::to_string_pretty(&serde_json::from_str::<serde_json::Value>(SPAN_LINE).expect("json"))
            .expect("pretty");
        let mut spans = 0;
        let requests = stream_requests("c.json", pretty.as_bytes(), |decoded| {
            spans += decoded.spans.len();
            Ok(())
        })
        .expect("document reads");
        assert_eq!((requests, spans), (1, 1));
        let error =
            stream_requests("c.jsonl", format!("{SPAN_LINE}\n{{\"resourceSpans\": 5}}\n").as_bytes(), |_| Ok(()))
                .expect_err("must fail");
        assert_eq!(error.line, 2);
        assert!(error.message.contains("invalid ExportTraceServiceRequest"), "{error}");
    }

    #[test]
    fn names_the_line_of_a_malformed_request() {
        let text = format!("{SPAN_LINE}\n\n{{\"resourceSpans\": 5}}\n");
        let error = Capture::default().read_str("c.jsonl", &text).expect_err("must fail");
        assert_eq!(error.line, 3);
        assert!(error.message.contains("invalid ExportTraceServiceRequest"), "{error}");
    }

    #[test]
    fn names_the_line_of_broken_json() {
        let error = Capture::default()
            .read_str("c.jsonl", &format!("{SPAN_LINE}\n{{\"resourceSpans\": [\n"))
            .expect_err("must fail");
        assert!(error.line >= 2, "{error}");
        assert!(error.message.contains("EOF while parsing"), "{error}");
    }

    #[test]
    fn refuses_a_wrongly_typed_convention_attribute() {
        let text = SPAN_LINE.replace(r#"{"intValue":"42"}"#, r#"{"stringValue":"forty-two"}"#);
        let error = Capture::default().read_str("c.jsonl", &text).expect_err("must fail");
        assert!(error.message.contains("lagscope.state.carried"), "{error}");
        assert!(error.message.contains("resourceSpans[0].scopeSpans[0].spans[0]"), "{error}");
    }
}
