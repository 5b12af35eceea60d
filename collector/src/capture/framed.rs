//! Captures in the OpenTelemetry Collector file exporter's binary layout: each export request
//! preceded by its length (4 bytes, big-endian), as the exporter writes with `format: proto`,
//! and with `format: json` plus `compression: zstd` (each request compressed on its own).
//!
//! A request is protobuf (`TracesData`, `MetricsData` or `LogsData`: the wire form of the
//! matching `Export*ServiceRequest`), or OTLP JSON; either may be a zstd frame. The Collector
//! writes every signal of a pipeline into one file and protobuf does not say which signal a
//! message holds (each keeps its resources in field 1), so the signal is read off the first
//! record's field numbers and wire types ([`sniff`]), and the request decoded as that.

use std::io::{BufRead, Read};

use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;

use super::{AnyRequest, At, Capture, CaptureError, Decoded, decode_in_order, decode_line};

/// The most a request of a capture may hold, compressed or not: a length above it is taken
/// for a file that is not such a capture rather than allocated. Below 2^27, a capture's first
/// byte (its first length's highest) is at most 7: never whitespace or `{`, which tell JSON.
const MAX_REQUEST_BYTES: usize = 128 << 20;
const _: () = assert!(MAX_REQUEST_BYTES >> 24 < 0x09, "a capture's first byte could be taken for JSON's");

/// A zstd frame's first bytes.
pub const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// Reads length-prefixed export requests from `reader` (already past any compression of the
/// whole file), decoding them on `threads` threads (1: on the caller's) and handing each to
/// `each` in the file's order. Returns how many were read. An error names the request
/// (1-based) and the byte of the stream where its length begins.
pub(super) fn stream_framed(
    threads: usize,
    source_name: &str,
    mut reader: impl BufRead + Send,
    mut each: impl FnMut(Decoded) -> Result<(), String>,
) -> Result<usize, CaptureError> {
    let mut requests = 0;
    let mut handle = |at: At, decoded: Result<Vec<Decoded>, String>| {
        for one in decoded.map_err(|message| at.error(source_name, message))? {
            each(one).map_err(|message| at.error(source_name, message))?;
            requests += 1;
        }
        Ok::<(), CaptureError>(())
    };
    let (mut number, mut offset) = (0, 0_u64);
    let mut read = move || {
        number += 1;
        let at = At { line: number, byte: Some(offset) };
        let body = read_request(&mut reader).map_err(|message| (at, message))?;
        Ok(body.map(|body| {
            offset += 4 + body.len() as u64;
            let size = body.len();
            (at, body, size)
        }))
    };
    if threads <= 1 {
        loop {
            match read() {
                Ok(Some((at, body, _))) => handle(at, decode_request(&body))?,
                Ok(None) => break,
                Err((at, message)) => return Err(at.error(source_name, message)),
            }
        }
    } else {
        decode_in_order(threads, read, |body: &Vec<u8>| decode_request(body), &mut handle)?;
    }
    Ok(requests)
}

/// The next request's bytes (after its length); `None` at the end of the stream.
fn read_request(reader: &mut impl Read) -> Result<Option<Vec<u8>>, String> {
    let mut length = Vec::with_capacity(4);
    match reader.by_ref().take(4).read_to_end(&mut length).map_err(|io| format!("cannot read: {io}"))? {
        0 => return Ok(None),
        4 => {}
        read => return Err(format!("the file ends {read} bytes into a request's 4-byte length")),
    }
    let length = u32::from_be_bytes([length[0], length[1], length[2], length[3]]) as usize;
    if length > MAX_REQUEST_BYTES {
        return Err(format!(
            "a request of {length} bytes is announced, more than the {} MiB one may hold: not a capture of OTLP \
             JSON (which starts with '{{') nor of length-prefixed requests (the Collector's file exporter with \
             `format: proto`, or with `compression: zstd`)",
            MAX_REQUEST_BYTES >> 20
        ));
    }
    let mut body = Vec::with_capacity(length);
    let read = reader.by_ref().take(length as u64).read_to_end(&mut body).map_err(|io| format!("cannot read: {io}"))?;
    if read < length {
        return Err(format!("the file ends {read} bytes into a request of {length} bytes"));
    }
    Ok(Some(body))
}

/// One request's bytes: zstd-compressed or not, protobuf or OTLP JSON. JSON is told by its
/// first byte, `{` (as the Collector writes it): whitespace before it cannot be allowed, since
/// a protobuf request's first byte, field 1's key, is a newline (0x0A), and the length after it
/// may be 123, a `{`.
fn decode_request(body: &[u8]) -> Result<Vec<Decoded>, String> {
    let inflated;
    let body = if body.starts_with(&ZSTD_MAGIC) {
        inflated = crate::otlp::decode::unzstd(body, MAX_REQUEST_BYTES).map_err(|error| error.to_string())?;
        &inflated[..]
    } else {
        body
    };
    if body.first() == Some(&b'{') {
        let text = std::str::from_utf8(body).map_err(|utf8| format!("OTLP JSON that is not UTF-8 text: {utf8}"))?;
        return decode_line(text).map_err(super::LineError::message);
    }
    decode_protobuf(body).map(|decoded| vec![decoded])
}

/// Which signal a protobuf export request holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signal {
    Traces,
    Metrics,
    Logs,
}

impl Signal {
    fn decode(self, bytes: &[u8]) -> Result<AnyRequest, String> {
        let invalid = |what: &str, error: prost::DecodeError| format!("invalid {what} (protobuf): {error}");
        Ok(match self {
            Self::Traces => AnyRequest::Traces(
                ExportTraceServiceRequest::decode(bytes)
                    .map_err(|error| invalid("ExportTraceServiceRequest", error))?,
            ),
            Self::Metrics => AnyRequest::Metrics(
                ExportMetricsServiceRequest::decode(bytes)
                    .map_err(|error| invalid("ExportMetricsServiceRequest", error))?,
            ),
            Self::Logs => AnyRequest::Logs(
                ExportLogsServiceRequest::decode(bytes).map_err(|error| invalid("ExportLogsServiceRequest", error))?,
            ),
        })
    }
}

/// A protobuf export request of the signal [`sniff`] finds. A record that only may be a
/// metric (a message in one of the fields a metric keeps its data in, and nothing a span or a
/// log record always has) is read as a log record when it cannot be read as a metric; with no
/// record to tell by, nothing is read (its resources and scopes carry no data).
fn decode_protobuf(bytes: &[u8]) -> Result<Decoded, String> {
    let read_as = |signal: Signal| -> Result<Decoded, String> {
        let mut capture = Capture::default();
        capture.read_request(signal.decode(bytes)?)?;
        Ok(capture.into())
    };
    match sniff(bytes)? {
        None => Ok(Decoded::default()),
        Some(Told::Surely(signal)) => read_as(signal),
        Some(Told::Likely(signal)) => read_as(signal).or_else(|error| read_as(Signal::Logs).map_err(|_| error)),
    }
}

/// What a record's fields tell of its signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Told {
    Surely(Signal),
    Likely(Signal),
}

/// A protobuf field's value, by wire type.
#[derive(Debug, Clone, Copy)]
enum Wire<'a> {
    Varint,
    Fixed64,
    Bytes(&'a [u8]),
    Fixed32,
}

/// The fields of one protobuf message: (number, value), or what is malformed.
fn fields(mut bytes: &[u8]) -> impl Iterator<Item = Result<(u64, Wire<'_>), String>> {
    std::iter::from_fn(move || {
        if bytes.is_empty() {
            return None;
        }
        let field = (|| {
            let key = varint(&mut bytes)?;
            let (number, wire) = (key >> 3, key & 7);
            let mut take = |count: usize| {
                if bytes.len() < count {
                    return Err(format!("field {number} runs past the end of its message"));
                }
                let (taken, rest) = bytes.split_at(count);
                bytes = rest;
                Ok(taken)
            };
            let value = match wire {
                0 => Wire::Varint,
                1 => take(8).map(|_| Wire::Fixed64)?,
                2 => {
                    let length = usize::try_from(varint_of(&mut take, number)?).unwrap_or(usize::MAX);
                    Wire::Bytes(take(length)?)
                }
                5 => take(4).map(|_| Wire::Fixed32)?,
                other => return Err(format!("field {number} has wire type {other}, which OTLP does not use")),
            };
            if wire == 0 {
                varint(&mut bytes)?;
            }
            Ok((number, value))
        })();
        if field.is_err() {
            bytes = &[];
        }
        Some(field)
    })
}

/// A varint read through `take` (the length of a bytes field).
fn varint_of<'a>(take: &mut impl FnMut(usize) -> Result<&'a [u8], String>, number: u64) -> Result<u64, String> {
    let mut value = 0_u64;
    for shift in (0..64).step_by(7) {
        let byte = take(1).map_err(|_| format!("field {number}'s length runs past the end of its message"))?[0];
        value |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Ok(value);
        }
    }
    Err(format!("field {number}'s length is not a varint"))
}

/// A varint from the front of `bytes`.
fn varint(bytes: &mut &[u8]) -> Result<u64, String> {
    let mut value = 0_u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = bytes.split_first().ok_or("a varint runs past the end of its message")?;
        *bytes = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Ok(value);
        }
    }
    Err("a varint longer than 10 bytes".to_string())
}

/// The signal of a protobuf export request, from its first record that tells: request field 1
/// is a resource's data, whose field 2 is a scope's, whose field 2 is a record (a span, a
/// metric, a log record). `None` without such a record; an error when the bytes are not
/// protobuf.
fn sniff(bytes: &[u8]) -> Result<Option<Told>, String> {
    let not_protobuf = |error: String| format!("not an OTLP export request (neither OTLP JSON nor protobuf): {error}");
    for resource in messages(bytes, 1) {
        for scope in messages(resource.map_err(not_protobuf)?, 2) {
            for record in messages(scope.map_err(not_protobuf)?, 2) {
                if let Some(signal) = record_signal(record.map_err(not_protobuf)?).map_err(not_protobuf)? {
                    return Ok(Some(signal));
                }
            }
        }
    }
    Ok(None)
}

/// The messages a protobuf message holds in field `number` (its other fields passed over), or
/// what is malformed.
fn messages(bytes: &[u8], number: u64) -> impl Iterator<Item = Result<&[u8], String>> {
    fields(bytes).filter_map(move |field| match field {
        Ok((found, Wire::Bytes(message))) if found == number => Some(Ok(message)),
        Ok(_) => None,
        Err(error) => Some(Err(error)),
    })
}

/// What a record's fields say it is:
/// - surely a span: its start or end time (fields 7, 8) as fixed64, or its kind (6) as a
///   varint;
/// - surely a log record: its time or observed time (1, 11) as fixed64, its severity (2) as a
///   varint, its flags (8) as fixed32;
/// - surely a metric: a sum (7) as a message;
/// - likely a metric, with none of the above: a gauge, histogram, exponential histogram or
///   summary (5, 9, 10, 11) as a message (a log record's body and a span's name, attributes
///   and events are messages in some of those fields too).
fn record_signal(record: &[u8]) -> Result<Option<Told>, String> {
    let mut metric_data = false;
    for field in fields(record) {
        match field? {
            (7 | 8, Wire::Fixed64) | (6, Wire::Varint) => return Ok(Some(Told::Surely(Signal::Traces))),
            (1 | 11, Wire::Fixed64) | (2, Wire::Varint) | (8, Wire::Fixed32) => {
                return Ok(Some(Told::Surely(Signal::Logs)));
            }
            (7, Wire::Bytes(_)) => return Ok(Some(Told::Surely(Signal::Metrics))),
            (5 | 9 | 10 | 11, Wire::Bytes(_)) => metric_data = true,
            _ => {}
        }
    }
    Ok(metric_data.then_some(Told::Likely(Signal::Metrics)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::stream_requests;

    /// One request of each signal, and the records whose signal is hardest to tell: a sum, a
    /// log record with a body and nothing else (no time, no severity).
    const REQUESTS: [&str; 5] = [
        r#"{"resourceSpans":[{"resource":{"attributes":[{"key":"lagscope.client.id","value":{"stringValue":"c1"}}]},"scopeSpans":[{"spans":[{"traceId":"5b8efff798038103d269b633813fc60c","spanId":"eee19b7ec3c1b174","name":"getFileInfo","kind":3,"startTimeUnixNano":"1767225600000000000","endTimeUnixNano":"1767225600002000000","attributes":[{"key":"lagscope.state.carried","value":{"intValue":"42"}}]}]}]}]}"#,
        r#"{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"lagscope.server.applied_state","gauge":{"dataPoints":[{"asInt":"7","timeUnixNano":"1767225600000000000"}]}}]}]}]}"#,
        r#"{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"requests","sum":{"aggregationTemporality":2,"isMonotonic":true,"dataPoints":[{"asDouble":3.5,"timeUnixNano":"1767225601000000000"}]}}]}]}]}"#,
        r#"{"resourceLogs":[{"scopeLogs":[{"logRecords":[{"timeUnixNano":"1767225600000000000","severityNumber":9,"body":{"stringValue":"Disable OM follower read"}}]}]}]}"#,
        r#"{"resourceLogs":[{"scopeLogs":[{"logRecords":[{"body":{"stringValue":"hello, a body and nothing else"}}]}]}]}"#,
    ];

    fn protobuf(json: &str) -> Vec<u8> {
        match serde_json::from_str::<AnyRequest>(json).expect("an OTLP JSON request") {
            AnyRequest::Traces(request) => request.encode_to_vec(),
            AnyRequest::Metrics(request) => request.encode_to_vec(),
            AnyRequest::Logs(request) => request.encode_to_vec(),
        }
    }

    /// Requests as the Collector's file exporter writes them: each after its length.
    fn framed(requests: impl IntoIterator<Item = Vec<u8>>) -> Vec<u8> {
        let mut bytes = Vec::new();
        for request in requests {
            bytes.extend_from_slice(&u32::try_from(request.len()).expect("small").to_be_bytes());
            bytes.extend_from_slice(&request);
        }
        bytes
    }

    fn zstd(bytes: &[u8]) -> Vec<u8> {
        zstd::encode_all(bytes, 3).expect("compressed")
    }

    /// Everything `bytes` reads to, through the entry point every command uses.
    fn read(bytes: &[u8]) -> Result<(usize, String), CaptureError> {
        let mut capture = Capture::default();
        let requests = stream_requests("c.binpb", bytes, |decoded| {
            capture.spans.extend(decoded.spans);
            capture.samples.extend(decoded.samples);
            capture.logs.extend(decoded.logs);
            Ok(())
        })?;
        Ok((requests, format!("{:?} {:?} {:?}", capture.spans, capture.samples, capture.logs)))
    }

    #[test]
    fn reads_every_layout_of_the_file_exporter_as_its_json_lines() {
        let (requests, expected) = read(REQUESTS.join("\n").as_bytes()).expect("JSON lines");
        assert_eq!(requests, 5);
        assert!(expected.contains("getFileInfo") && expected.contains("hello, a body"), "{expected}");
        let layouts = [
            ("format: proto", framed(REQUESTS.map(protobuf))),
            ("format: proto, compression: zstd", framed(REQUESTS.map(|json| zstd(&protobuf(json))))),
            ("format: json, compression: zstd", framed(REQUESTS.map(|json| zstd(json.as_bytes())))),
            ("protobuf and JSON requests mixed", framed([protobuf(REQUESTS[0]), REQUESTS[1].as_bytes().to_vec()])),
        ];
        for (layout, bytes) in &layouts[..3] {
            assert_eq!(read(bytes).expect(layout), (5, expected.clone()), "{layout}");
        }
        let (layout, bytes) = &layouts[3];
        let (mixed, _) = read(REQUESTS[..2].join("\n").as_bytes()).expect("JSON lines");
        assert_eq!(read(bytes).expect(layout).0, mixed, "{layout}");
    }

    #[test]
    fn a_request_without_records_reads_to_nothing() {
        let empty = ExportTraceServiceRequest {
            resource_spans: vec![opentelemetry_proto::tonic::trace::v1::ResourceSpans::default()],
        };
        assert_eq!(read(&framed([empty.encode_to_vec(), Vec::new()])).expect("reads"), (2, "[] [] []".to_string()));
    }

    #[test]
    fn names_the_request_and_byte_of_what_is_wrong() {
        let good = framed([protobuf(REQUESTS[0])]);
        let at = good.len();
        let error = |bytes: &[u8]| read(bytes).expect_err("must fail");
        // The file ends inside a length, inside a request.
        let mut cut = good.clone();
        cut.extend_from_slice(&[0, 0]);
        let failed = error(&cut);
        assert_eq!((failed.line, failed.byte), (2, Some(at as u64)), "{failed}");
        assert!(failed.message.contains("2 bytes into a request's 4-byte length"), "{failed}");
        let mut cut = good.clone();
        cut.extend_from_slice(&framed([protobuf(REQUESTS[1])])[..10]);
        assert!(error(&cut).message.contains("6 bytes into a request of"), "{}", error(&cut));
        // A length no capture has: a file of something else.
        let failed = error(b"hello, world");
        assert_eq!((failed.line, failed.byte), (1, Some(0)));
        assert!(failed.message.contains("not a capture of OTLP JSON"), "{failed}");
        assert_eq!(failed.to_string().split(':').next(), Some("c.binpb"));
        assert!(failed.to_string().starts_with("c.binpb: request 1 at byte 0: a request of"), "{failed}");
        // Bytes that are not protobuf, a zstd frame cut short, a record of the wrong type.
        let mut garbage = good.clone();
        garbage.extend_from_slice(&framed([vec![0x0f, 0xff, 0xff]]));
        let failed = error(&garbage);
        assert_eq!((failed.line, failed.byte), (2, Some(at as u64)), "{failed}");
        assert!(failed.message.contains("not an OTLP export request"), "{failed}");
        let compressed = zstd(&protobuf(REQUESTS[0]));
        let failed = error(&framed([compressed[..compressed.len() / 2].to_vec()]));
        assert!(failed.message.contains("invalid zstd"), "{failed}");
        let wrong = REQUESTS[0].replace(r#"{"intValue":"42"}"#, r#"{"stringValue":"forty-two"}"#);
        let failed = error(&framed([protobuf(REQUESTS[1]), protobuf(&wrong)]));
        assert_eq!(failed.line, 2, "{failed}");
        assert!(failed.message.contains("lagscope.state.carried"), "{failed}");
    }

    #[test]
    fn a_refusal_stops_the_reading_at_its_request() {
        let bytes = framed(REQUESTS.map(protobuf));
        let mut seen = 0;
        let failed = stream_requests("c.binpb", &bytes[..], |_| {
            seen += 1;
            if seen == 3 { Err("refused".to_string()) } else { Ok(()) }
        })
        .expect_err("refused");
        let third = 4 + protobuf(REQUESTS[0]).len() + 4 + protobuf(REQUESTS[1]).len();
        assert_eq!((failed.line, failed.byte, failed.message.as_str()), (3, Some(third as u64), "refused"));
    }

    #[test]
    fn decoding_on_threads_hands_on_what_one_thread_does() {
        // Several chunks of requests (about 1.3 MB), decoded out of order on the threads;
        // request n's span carries state n.
        let count = 10_000;
        let numbered: Vec<Vec<u8>> = (1..=count)
            .map(|n| protobuf(&REQUESTS[0].replace(r#"{"intValue":"42"}"#, &format!(r#"{{"intValue":"{n}"}}"#))))
            .collect();
        let whole = framed(numbered.clone());
        assert!(whole.len() > 3 * crate::capture::CHUNK_BYTES, "{} bytes", whole.len());
        let byte_of = |n: usize| numbered[..n - 1].iter().map(|body| 4 + body.len() as u64).sum::<u64>();
        let read_on = crate::capture::tests::read_on;
        let mut garbled = framed(numbered[..2_344].to_vec());
        garbled.extend_from_slice(&framed([vec![0x0f, 0xff, 0xff]]));
        garbled.extend_from_slice(&framed(numbered[2_345..].to_vec()));
        let cut = &whole[..byte_of(3_001) as usize + 6];
        for threads in [1, 2, 3, 8] {
            let (seen, result) = read_on(threads, &whole, None);
            assert_eq!(result.expect("reads"), count, "{threads} threads");
            assert_eq!(seen, (1..=count as i64).collect::<Vec<_>>(), "{threads} threads: in the file's order");
            // Every request before the broken one handed on, none after, its place named.
            let (seen, result) = read_on(threads, &garbled, None);
            let error = result.expect_err("not protobuf");
            assert_eq!((error.line, error.byte, seen.len()), (2_345, Some(byte_of(2_345)), 2_344), "{error}");
            assert!(error.message.contains("not an OTLP export request"), "{error}");
            let (seen, result) = read_on(threads, cut, None);
            let error = result.expect_err("cut short");
            assert_eq!((error.line, error.byte, seen.len()), (3_001, Some(byte_of(3_001)), 3_000), "{error}");
            assert!(error.message.contains("2 bytes into a request of"), "{error}");
            let (seen, result) = read_on(threads, &whole, Some(1_234));
            let error = result.expect_err("refused");
            assert_eq!((error.line, error.message.as_str(), seen.len()), (1_234, "refused 1234", 1_233));
        }
    }

    #[test]
    fn a_protobuf_request_whose_first_resource_is_123_bytes_is_not_taken_for_json() {
        use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
        use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans};
        let span_request = serde_json::from_str::<AnyRequest>(REQUESTS[0]).expect("request");
        let AnyRequest::Traces(mut request) = span_request else { panic!("a trace request") };
        // A second resource first, padded by its scope's name to 123 bytes: `\n{...`.
        let padded = |name: usize| ResourceSpans {
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope { name: "x".repeat(name), ..Default::default() }),
                ..Default::default()
            }],
            ..Default::default()
        };
        let first = (0..200).map(padded).find(|resource| resource.encoded_len() == 123).expect("123 bytes");
        request.resource_spans.insert(0, first);
        let bytes = request.encode_to_vec();
        assert_eq!(&bytes[..2], b"\n{");
        let decoded = decode_request(&bytes).expect("protobuf");
        assert_eq!(decoded.len(), 1);
        assert_eq!(decoded[0].spans.len(), 1);
    }

    #[test]
    fn tells_the_signal_of_a_record_by_its_fields() {
        let told = |json: &str| sniff(&protobuf(json)).expect("protobuf");
        assert_eq!(told(REQUESTS[0]), Some(Told::Surely(Signal::Traces)));
        assert_eq!(told(REQUESTS[1]), Some(Told::Likely(Signal::Metrics)));
        assert_eq!(told(REQUESTS[2]), Some(Told::Surely(Signal::Metrics)));
        assert_eq!(told(REQUESTS[3]), Some(Told::Surely(Signal::Logs)));
        assert_eq!(told(REQUESTS[4]), Some(Told::Likely(Signal::Metrics)));
    }
}
