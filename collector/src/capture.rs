//! Captured OTLP: a file holding one `Export*ServiceRequest` as JSON, or JSON lines of them as
//! the OpenTelemetry Collector's file exporter writes them (traces, metrics and logs mixed), or
//! the length-prefixed requests it writes with `format: proto` or `compression: zstd`
//! ([`framed`]). Which of these a capture is, is read from its first byte.

use lagscope_model::{LogRecord, Sample, Span};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use thiserror::Error;

use crate::otlp::{Converted, logs_from_request, samples_from_request, spans_from_request};

mod framed;

pub use framed::ZSTD_MAGIC;

/// Everything read from one or more captures.
#[derive(Debug, Default)]
pub struct Capture {
    pub spans: Vec<Span>,
    pub samples: Vec<Sample>,
    pub logs: Vec<LogRecord>,
    /// Export requests read.
    pub requests: usize,
}

/// What was wrong with a capture, and where: the line (1-based) of a JSON capture, the request
/// (1-based) and the byte its length begins at in a length-prefixed one.
#[derive(Debug, Error, PartialEq)]
#[error("{source_name}{}: {message}", match byte {
    Some(byte) => format!(": request {line} at byte {byte}"),
    None => format!(":{line}"),
})]
pub struct CaptureError {
    pub source_name: String,
    /// The line, or in a length-prefixed capture the request.
    pub line: usize,
    /// In a length-prefixed capture, where the request's length begins.
    pub byte: Option<u64>,
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
            let error = |message: String| At::line(line).error(source_name, message);
            let request = match stream.next() {
                None => return Ok(()),
                Some(Ok(request)) => request,
                Some(Err(json_error)) => {
                    let message = if json_error.is_data() {
                        json_error.to_string()
                    } else {
                        format!("invalid JSON: {json_error}")
                    };
                    return Err(At::line(json_error.line().max(1)).error(source_name, message));
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

impl From<Capture> for Decoded {
    fn from(capture: Capture) -> Self {
        Self { spans: capture.spans, samples: capture.samples, logs: capture.logs }
    }
}

/// Reads export requests one at a time from JSON lines (the Collector's file exporter: one
/// request per line), handing each to `each` as it is decoded, so memory holds one request,
/// not the file. A file that is one JSON document over several lines is read whole; one whose
/// first byte is neither whitespace nor `{` is read as length-prefixed requests ([`framed`]).
/// Returns how many requests were read; `each`'s error stops the reading and is reported at
/// its line (or request).
pub fn stream_requests(
    source_name: &str,
    reader: impl std::io::BufRead + Send,
    each: impl FnMut(Decoded) -> Result<(), String>,
) -> Result<usize, CaptureError> {
    stream_requests_decoding_on(1, source_name, reader, each)
}

/// [`stream_requests`], with the requests decoded on `threads` threads (with 1, on the caller's
/// alone) while the caller hands the requests already decoded to `each`, in the file's order.
/// Decoding is most of the work of reading a capture; on a machine with cores to spare this
/// divides it. What `each` sees, and every error with its line (or request), are those of the
/// reading on one thread; memory holds a few lines (requests) per thread.
pub fn stream_requests_decoding_on(
    threads: usize,
    source_name: &str,
    mut reader: impl std::io::BufRead + Send,
    mut each: impl FnMut(Decoded) -> Result<(), String>,
) -> Result<usize, CaptureError> {
    let error = |line: usize, message: String| At::line(line).error(source_name, message);
    if is_length_prefixed(&mut reader).map_err(|io| error(1, format!("cannot read: {io}")))? {
        return framed::stream_framed(threads, source_name, reader, each);
    }
    let mut requests = 0;
    let mut handle = |at: At, decoded: Result<Vec<Decoded>, String>| {
        for one in decoded.map_err(|message| at.error(source_name, message))? {
            each(one).map_err(|message| at.error(source_name, message))?;
            requests += 1;
        }
        Ok::<(), CaptureError>(())
    };
    // A line at a time up to the first line holding a request (a document over several lines
    // is read whole), and on one thread to the end: each request is handed on while what it
    // decoded to is still in the cache.
    let mut line = 0;
    let mut text = String::new();
    let mut handled = 0;
    while threads <= 1 || handled == 0 {
        text.clear();
        if read_line(&mut reader, &mut text).map_err(|message| error(line + 1, message))? == 0 {
            return Ok(requests);
        }
        line += 1;
        match decode_line(&text) {
            Err(LineError::Eof(_)) if handled == 0 => {
                let mut rest = std::mem::take(&mut text);
                reader.read_to_string(&mut rest).map_err(|io| error(line, format!("cannot read: {io}")))?;
                let mut capture = Capture::default();
                capture.read_str(source_name, &rest).map_err(|mut inner| {
                    inner.line += line - 1;
                    inner
                })?;
                let read = capture.requests;
                handle(At::line(line), Ok(vec![capture.into()]))?;
                return Ok(read);
            }
            decoded => {
                handled += decoded.as_ref().map_or(1, Vec::len);
                handle(At::line(line), decoded.map_err(LineError::message))?;
            }
        }
    }
    let read = move || {
        let mut text = String::new();
        match read_line(&mut reader, &mut text) {
            Ok(0) => Ok(None),
            Ok(bytes) => {
                line += 1;
                Ok(Some((At::line(line), text, bytes)))
            }
            Err(message) => Err((At::line(line + 1), message)),
        }
    };
    decode_in_order(threads, read, |text: &String| decode_line(text).map_err(LineError::message), &mut handle)?;
    Ok(requests)
}

/// Whether a capture (past any compression of the whole file) holds length-prefixed requests
/// ([`framed`]) rather than OTLP JSON: its first byte is neither whitespace nor `{`. Reads
/// nothing away.
fn is_length_prefixed(reader: &mut impl std::io::BufRead) -> std::io::Result<bool> {
    let first = reader.fill_buf()?.first().copied();
    Ok(first.is_some_and(|byte| byte != b'{' && !byte.is_ascii_whitespace()))
}

/// Where in a capture a request was read: its line, or (in a length-prefixed capture) its
/// number and the byte its length begins at.
#[derive(Debug, Clone, Copy)]
struct At {
    line: usize,
    byte: Option<u64>,
}

impl At {
    fn line(line: usize) -> Self {
        Self { line, byte: None }
    }

    fn error(self, source_name: &str, message: String) -> CaptureError {
        CaptureError { source_name: source_name.to_string(), line: self.line, byte: self.byte, message }
    }
}

/// Units of a capture (lines, length-prefixed requests) read by `read` on one thread, decoded by
/// `decode` on `threads` others, a chunk of units at a time, and handed to `handle` on this one,
/// in the order read. The reader takes a token for every chunk it reads and this thread gives
/// one back for every chunk handed on: at most a few chunks per thread are between the two,
/// however long one of them takes to decode. A reading error is handled at its place, after the
/// units read before it; `handle`'s error stops everything.
fn decode_in_order<U: Send>(
    threads: usize,
    mut read: impl FnMut() -> Result<Option<(At, U, usize)>, (At, String)> + Send,
    decode: impl Fn(&U) -> Result<Vec<Decoded>, String> + Sync,
    handle: &mut impl FnMut(At, Result<Vec<Decoded>, String>) -> Result<(), CaptureError>,
) -> Result<(), CaptureError> {
    /// A chunk's units, read but not yet decoded, and decoded.
    type Units<U> = Vec<(At, U)>;
    type DecodedUnits = Vec<(At, Result<Vec<Decoded>, String>)>;
    let window = 2 * threads + 1;
    let decode = &decode;
    std::thread::scope(|scope| {
        let (work, jobs) = std::sync::mpsc::sync_channel::<(usize, Units<U>)>(window);
        let jobs = std::sync::Arc::new(std::sync::Mutex::new(jobs));
        let (done, results) = std::sync::mpsc::sync_channel::<(usize, DecodedUnits)>(window);
        let (give, tokens) = std::sync::mpsc::sync_channel::<()>(window);
        for _ in 0..window {
            let _ = give.send(());
        }
        let read_failed = done.clone();
        scope.spawn(move || {
            // Stops at the end of the input, at an error reading it (handed on in its place), or
            // when nothing takes chunks any more (an error was met: tokens or jobs hang up).
            for chunk in 0.. {
                if tokens.recv().is_err() {
                    return;
                }
                let (mut units, mut bytes) = (Vec::new(), 0);
                let mut failed = None;
                let mut end = false;
                while bytes < CHUNK_BYTES {
                    match read() {
                        Ok(None) => {
                            end = true;
                            break;
                        }
                        Ok(Some((at, unit, size))) => {
                            bytes += size;
                            units.push((at, unit));
                        }
                        Err((at, message)) => {
                            failed = Some((at, Err(message)));
                            break;
                        }
                    }
                }
                if let Some(failed) = failed {
                    // After the units read before it, in a chunk of its own.
                    if units.is_empty() {
                        let _ = read_failed.send((chunk, vec![failed]));
                    } else if work.send((chunk, units)).is_ok() {
                        let _ = read_failed.send((chunk + 1, vec![failed]));
                    }
                    return;
                }
                if units.is_empty() || work.send((chunk, units)).is_err() || end {
                    return;
                }
            }
        });
        for _ in 0..threads {
            let (jobs, done) = (std::sync::Arc::clone(&jobs), done.clone());
            scope.spawn(move || {
                loop {
                    let job = jobs.lock().map_err(drop).and_then(|jobs| jobs.recv().map_err(drop));
                    let Ok((chunk, units)) = job else { return };
                    let decoded = units.iter().map(|(at, unit)| (*at, decode(unit))).collect();
                    if done.send((chunk, decoded)).is_err() {
                        return;
                    }
                }
            });
        }
        drop(done);
        let mut next = 0;
        let mut waiting = std::collections::BTreeMap::new();
        for (chunk, decoded) in results {
            waiting.insert(chunk, decoded);
            while let Some(units) = waiting.remove(&next) {
                for (at, decoded) in units {
                    handle(at, decoded)?;
                }
                next += 1;
                let _ = give.send(());
            }
        }
        Ok(())
    })
}

/// Units (lines, requests) decoded together by one of [`decode_in_order`]'s threads, up to about
/// this many bytes: enough that passing them between threads costs nothing beside decoding
/// them (a millisecond or two), few enough that what they decode to is still in the cache when
/// it is handed on.
pub(crate) const CHUNK_BYTES: usize = 256 << 10;

/// One line into `text`; 0 at the end of the input.
fn read_line(reader: &mut impl std::io::BufRead, text: &mut String) -> Result<usize, String> {
    reader.read_line(text).map_err(|io| {
        let what = if io.kind() == std::io::ErrorKind::InvalidData { "not UTF-8 text" } else { "cannot read" };
        format!("{what}: {io}")
    })
}

/// Why a line did not decode: it ended inside a value (perhaps a document over several
/// lines), or it is not a valid request; the message says what is wrong.
enum LineError {
    Eof(String),
    Invalid(String),
}

impl LineError {
    fn message(self) -> String {
        match self {
            Self::Eof(message) | Self::Invalid(message) => message,
        }
    }
}

/// The export requests on one line (none on a blank one), each converted.
fn decode_line(text: &str) -> Result<Vec<Decoded>, LineError> {
    let mut decoded = Vec::new();
    for value in serde_json::Deserializer::from_str(text).into_iter::<AnyRequest>() {
        match value {
            Ok(request) => {
                let mut capture = Capture::default();
                capture.read_request(request).map_err(LineError::Invalid)?;
                decoded.push(capture.into());
            }
            Err(json_error) => {
                let message =
                    if json_error.is_data() { json_error.to_string() } else { format!("invalid JSON: {json_error}") };
                return Err(if json_error.is_eof() { LineError::Eof(message) } else { LineError::Invalid(message) });
            }
        }
    }
    Ok(decoded)
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

    /// A capture of `lines` requests, line `n` holding a span whose carried state is `n`, and
    /// `broken` (1-based) replaced by `with`.
    fn numbered_capture(lines: usize, broken: Option<(usize, &[u8])>) -> Vec<u8> {
        let mut bytes = Vec::new();
        for line in 1..=lines {
            match broken {
                Some((at, with)) if at == line => bytes.extend_from_slice(with),
                _ => bytes.extend_from_slice(
                    SPAN_LINE.replace(r#"{"intValue":"42"}"#, &format!(r#"{{"intValue":"{line}"}}"#)).as_bytes(),
                ),
            }
            bytes.push(b'\n');
        }
        bytes
    }

    /// What reading `bytes` on `threads` threads hands on (each request's first span's carried
    /// state, in order) and returns, `each` refusing the request whose span carries `refuse`.
    pub(super) fn read_on(
        threads: usize,
        bytes: &[u8],
        refuse: Option<i64>,
    ) -> (Vec<i64>, Result<usize, CaptureError>) {
        let mut seen = Vec::new();
        let result = stream_requests_decoding_on(threads, "c.jsonl", bytes, |decoded| {
            let carried = decoded.spans[0].call.state.carried.expect("carried");
            if Some(carried) == refuse {
                return Err(format!("refused {carried}"));
            }
            seen.push(carried);
            Ok(())
        });
        (seen, result)
    }

    #[test]
    fn decoding_on_threads_hands_on_what_one_thread_does() {
        // Several chunks of lines (about 1.3 MB), decoded out of order on the threads.
        let lines = 4_000;
        let whole = numbered_capture(lines, None);
        assert!(whole.len() > 4 * CHUNK_BYTES, "{} bytes", whole.len());
        let expected: Vec<i64> = (1..=lines as i64).collect();
        let broken_json = numbered_capture(lines, Some((2_345, b"{\"resourceSpans\": [")));
        let not_utf8 = numbered_capture(lines, Some((3_001, b"{\"resourceSpans\": \xff}")));
        for threads in [1, 2, 3, 8] {
            let (seen, result) = read_on(threads, &whole, None);
            assert_eq!(result.expect("reads"), lines, "{threads} threads");
            assert_eq!(seen, expected, "{threads} threads: every request, in the file's order");
            // A line that is not JSON: every request before it handed on, none after, its line named.
            let (seen, result) = read_on(threads, &broken_json, None);
            let error = result.expect_err("broken JSON");
            assert_eq!((error.line, seen.len()), (2_345, 2_344), "{threads} threads: {error}");
            assert!(error.message.contains("EOF while parsing"), "{error}");
            // Bytes that are not text: the reading fails there.
            let (seen, result) = read_on(threads, &not_utf8, None);
            let error = result.expect_err("not UTF-8");
            assert_eq!((error.line, seen.len()), (3_001, 3_000), "{threads} threads: {error}");
            assert!(error.message.contains("not UTF-8"), "{error}");
            // `each` refusing a request stops the reading there.
            let (seen, result) = read_on(threads, &whole, Some(1_234));
            let error = result.expect_err("refused");
            assert_eq!((error.line, error.message.as_str(), seen.len()), (1_234, "refused 1234", 1_233));
        }
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
