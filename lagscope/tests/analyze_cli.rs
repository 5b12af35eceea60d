//! `lagscope analyze` as a user runs it: the binary over capture files, golden output.
//! Regenerate the golden files with `UPDATE_EXPECT=1 cargo test -p lagscope --test analyze_cli`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn lagscope(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lagscope")).args(args).output().expect("lagscope runs")
}

/// Simulates `hdfs-publish-race` for `duration` into `out` (OTLP JSON lines or lscap, by its
/// extension).
fn simulate_race(duration: &str, out: &Path) {
    let simulated = lagscope(&[
        "sim",
        "--scenario",
        "hdfs-publish-race",
        "--duration",
        duration,
        "--out",
        out.to_str().expect("path"),
    ]);
    assert!(simulated.status.success(), "{}", String::from_utf8_lossy(&simulated.stderr));
}

fn stdout_of(output: &Output) -> String {
    assert!(output.status.success(), "lagscope failed: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout.clone()).expect("UTF-8 output")
}

#[test]
fn json_output_of_a_capture_matches_the_golden_file() {
    let capture = fixture("hdfs-rbf-capture.jsonl");
    let output = lagscope(&["analyze", "--format", "json", capture.to_str().expect("path")]);
    let stdout = stdout_of(&output);
    expect_test::expect_file!["fixtures/hdfs-rbf-capture.expected.json"].assert_eq(&stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("10 export requests") && stderr.contains("16 spans") && stderr.contains("2 anomalies"),
        "{stderr}"
    );

    // The contract every consumer relies on.
    let parsed: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    let first = &parsed["anomalies"][0];
    for field in [
        "kind",
        "severity",
        "cluster",
        "namespace",
        "client_id",
        "node_id",
        "start_unix_nano",
        "end_unix_nano",
        "summary",
        "cause",
        "evidence",
    ] {
        assert!(first.get(field).is_some(), "field {field} missing from {first:#}");
    }
    assert_eq!(first["evidence"]["guarantee"], "read_your_writes");
    assert_eq!(parsed["anomalies"][1]["evidence"]["guarantee"], "monotonic_reads");
}

#[test]
fn table_output_of_a_capture_matches_the_golden_file() {
    let capture = fixture("hdfs-rbf-capture.jsonl");
    let stdout = stdout_of(&lagscope(&["analyze", capture.to_str().expect("path")]));
    expect_test::expect_file!["fixtures/hdfs-rbf-capture.expected.txt"].assert_eq(&stdout);
}

#[test]
fn a_gzipped_capture_and_a_single_pretty_printed_request_read_the_same() {
    let directory = tempfile::tempdir().expect("temp dir");
    let text = std::fs::read_to_string(fixture("hdfs-rbf-capture.jsonl")).expect("fixture");
    let gzipped = directory.path().join("capture.jsonl.gz");
    let mut encoder =
        flate2::write::GzEncoder::new(std::fs::File::create(&gzipped).expect("create"), flate2::Compression::fast());
    encoder.write_all(text.as_bytes()).expect("write");
    encoder.finish().expect("finish");
    let plain = stdout_of(&lagscope(&[
        "analyze",
        "--format",
        "json",
        fixture("hdfs-rbf-capture.jsonl").to_str().expect("path"),
    ]));
    let from_gzip = stdout_of(&lagscope(&["analyze", "--format", "json", gzipped.to_str().expect("path")]));
    assert_eq!(from_gzip, plain);

    // Each line as its own pretty-printed file: the same requests, the same anomalies.
    let mut paths = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let value: serde_json::Value = serde_json::from_str(line).expect("line");
        let path = directory.path().join(format!("request-{index}.json"));
        std::fs::write(&path, serde_json::to_string_pretty(&value).expect("pretty")).expect("write");
        paths.push(path.to_str().expect("path").to_string());
    }
    let mut args = vec!["analyze", "--format", "json"];
    args.extend(paths.iter().map(String::as_str));
    assert_eq!(stdout_of(&lagscope(&args)), plain);
}

/// The fixture's requests as protobuf, each as the OpenTelemetry Collector's file exporter
/// writes it in its binary layouts: after its length (4 bytes, big-endian), compressed with
/// zstd on its own when `compress` is given.
fn length_prefixed(text: &str, compress: impl Fn(Vec<u8>) -> Vec<u8>, as_json: bool) -> Vec<u8> {
    use opentelemetry_proto::tonic::collector::{
        logs::v1::ExportLogsServiceRequest, metrics::v1::ExportMetricsServiceRequest,
        trace::v1::ExportTraceServiceRequest,
    };
    use prost::Message;
    let mut bytes = Vec::new();
    for line in text.lines() {
        let request = if as_json {
            line.as_bytes().to_vec()
        } else if line.starts_with(r#"{"resourceSpans""#) {
            serde_json::from_str::<ExportTraceServiceRequest>(line).expect("traces").encode_to_vec()
        } else if line.starts_with(r#"{"resourceMetrics""#) {
            serde_json::from_str::<ExportMetricsServiceRequest>(line).expect("metrics").encode_to_vec()
        } else {
            serde_json::from_str::<ExportLogsServiceRequest>(line).expect("logs").encode_to_vec()
        };
        let request = compress(request);
        bytes.extend_from_slice(&u32::try_from(request.len()).expect("small").to_be_bytes());
        bytes.extend_from_slice(&request);
    }
    bytes
}

#[test]
fn the_collector_file_exporter_s_binary_and_zstd_captures_analyze_as_its_json_lines() {
    let directory = tempfile::tempdir().expect("temp dir");
    let text = std::fs::read_to_string(fixture("hdfs-rbf-capture.jsonl")).expect("fixture");
    let kinds: std::collections::BTreeSet<&str> =
        text.lines().map(|line| &line[..line.find(':').expect("a key")]).collect();
    assert_eq!(kinds.len(), 3, "the fixture mixes traces, metrics and logs: {kinds:?}");
    let zstd = |bytes: Vec<u8>| zstd::encode_all(&bytes[..], 3).expect("zstd");
    let proto = length_prefixed(&text, |bytes| bytes, false);
    let layouts = [
        ("format: proto", proto.clone()),
        ("format: proto, compression: zstd", length_prefixed(&text, zstd, false)),
        ("format: json, compression: zstd", length_prefixed(&text, zstd, true)),
        ("format: json, the whole file zstd", zstd(text.clone().into_bytes())),
        ("format: proto, the whole file zstd", zstd(proto.clone())),
    ];
    let plain = stdout_of(&lagscope(&[
        "analyze",
        "--format",
        "json",
        fixture("hdfs-rbf-capture.jsonl").to_str().expect("path"),
    ]));
    assert!(plain.contains("stale_read"), "{plain}");
    for (index, (layout, bytes)) in layouts.iter().enumerate() {
        let path = directory.path().join(format!("capture-{index}.bin"));
        std::fs::write(&path, bytes).expect("write");
        let output = lagscope(&["analyze", "--format", "json", path.to_str().expect("path")]);
        assert_eq!(stdout_of(&output), plain, "{layout}");
        assert!(
            String::from_utf8_lossy(&output.stderr).contains("16 spans, 1 metric samples, 1 log records"),
            "{layout}"
        );
    }
    // From the standard input too.
    for (layout, bytes) in [&layouts[0], &layouts[2]] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_lagscope"))
            .args(["analyze", "--format", "json", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("lagscope runs");
        let mut stdin = child.stdin.take().expect("stdin");
        let bytes = bytes.clone();
        let writer = std::thread::spawn(move || stdin.write_all(&bytes));
        let output = child.wait_with_output().expect("lagscope ends");
        writer.join().expect("writer").expect("written");
        assert_eq!(stdout_of(&output), plain, "{layout} from the standard input");
    }
    // A directory: its files in the order of their names (rotated ones first), hidden ones not.
    let rotated = directory.path().join("rotated");
    std::fs::create_dir(&rotated).expect("mkdir");
    let lines: Vec<&str> = text.lines().collect();
    let (older, newer) = lines.split_at(lines.len() / 2);
    std::fs::write(rotated.join("otlp.json"), newer.join("\n")).expect("write");
    std::fs::write(rotated.join("otlp-2025-11-29T17-00-00.000.json"), older.join("\n")).expect("write");
    std::fs::write(rotated.join(".otlp.json.swp"), b"not a capture").expect("write");
    let output = lagscope(&["analyze", "--format", "json", rotated.to_str().expect("path")]);
    assert_eq!(stdout_of(&output), plain, "a directory of rotated files");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("from 2 file(s)"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let empty = directory.path().join("empty");
    std::fs::create_dir(&empty).expect("mkdir");
    let output = lagscope(&["analyze", empty.to_str().expect("path")]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("a directory without capture files"), "{output:?}");
    // `convert` reads them too.
    let binpb = directory.path().join("capture-0.bin");
    let lscap = directory.path().join("capture.lscap");
    let converted = lagscope(&["convert", "--out", lscap.to_str().expect("path"), binpb.to_str().expect("path")]);
    assert!(converted.status.success(), "{}", String::from_utf8_lossy(&converted.stderr));
    assert_eq!(stdout_of(&lagscope(&["analyze", "--format", "json", lscap.to_str().expect("path")])), plain);

    // Cut inside its last request: named by number and byte, after what came before it.
    let last = text.lines().last().expect("a line");
    let cut_at = proto.len() - 3;
    let cut = directory.path().join("cut.binpb");
    std::fs::write(&cut, &proto[..cut_at]).expect("write");
    let output = lagscope(&["analyze", cut.to_str().expect("path")]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let last_length = length_prefixed(last, |bytes| bytes, false).len();
    let expected = format!(
        "{}: request {} at byte {}: the file ends",
        cut.display(),
        text.lines().count(),
        proto.len() - last_length
    );
    assert!(stderr.contains(&expected), "{expected:?} in {stderr}");
}

#[test]
fn a_simulated_proto_capture_analyzes_as_its_json_lines() {
    let directory = tempfile::tempdir().expect("temp dir");
    let (jsonl, binpb) = (directory.path().join("race.jsonl"), directory.path().join("race.binpb"));
    simulate_race("30s", &jsonl);
    simulate_race("30s", &binpb);
    let bytes = std::fs::read(&binpb).expect("binpb");
    let first = u32::from_be_bytes(bytes[..4].try_into().expect("a length")) as usize;
    assert!(4 + first < bytes.len() && bytes[4] != b'{', "length-prefixed protobuf: {:?}", &bytes[..8]);
    let from_json = stdout_of(&lagscope(&["analyze", "--format", "json", jsonl.to_str().expect("path")]));
    assert!(from_json.contains("stale_read"), "{from_json}");
    assert_eq!(stdout_of(&lagscope(&["analyze", "--format", "json", binpb.to_str().expect("path")])), from_json);
}

#[test]
fn spans_without_a_client_attempt_are_said_to_be_so() {
    let directory = tempfile::tempdir().expect("temp dir");
    let plain = directory.path().join("plain.jsonl");
    // A server span of plain instrumentation: nothing names a client session.
    std::fs::write(
        &plain,
        r#"{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"api"}}]},"scopeSpans":[{"spans":[{"traceId":"5b8efff798038103d269b633813fc60c","spanId":"eee19b7ec3c1b174","name":"GET /","kind":2,"startTimeUnixNano":"1","endTimeUnixNano":"2"}]}]}]}"#,
    )
    .expect("write");
    let output = lagscope(&["analyze", plain.to_str().expect("path")]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("note: none of the 1 spans is a client's attempt"), "{stderr}");
    let fixture = lagscope(&["analyze", fixture("hdfs-rbf-capture.jsonl").to_str().expect("path")]);
    assert!(
        !String::from_utf8_lossy(&fixture.stderr).contains("note: none"),
        "a capture with clients has no such note"
    );
}

#[test]
fn malformed_input_fails_with_the_file_and_line() {
    let directory = tempfile::tempdir().expect("temp dir");
    let text = std::fs::read_to_string(fixture("hdfs-rbf-capture.jsonl")).expect("fixture");
    let mut lines: Vec<&str> = text.lines().collect();
    lines.insert(3, r#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"abc","spanId":"00"}]}]}]}"#);
    let broken = directory.path().join("broken.jsonl");
    std::fs::write(&broken, lines.join("\n")).expect("write");

    let output = lagscope(&["analyze", broken.to_str().expect("path")]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(&format!("{}:4:", broken.display())), "{stderr}");
    assert!(stderr.contains("invalid ExportTraceServiceRequest"), "{stderr}");

    let truncated = directory.path().join("truncated.jsonl");
    std::fs::write(&truncated, &text[..text.len() - 40]).expect("write");
    let stderr = String::from_utf8_lossy(&lagscope(&["analyze", truncated.to_str().expect("path")]).stderr).to_string();
    assert!(
        stderr.contains(&format!("{}:10:", truncated.display())) && stderr.contains("EOF while parsing"),
        "{stderr}"
    );

    let missing = directory.path().join("missing.jsonl");
    let output = lagscope(&["analyze", missing.to_str().expect("path")]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("cannot open"), "missing file is named");
}

#[test]
fn a_simulated_lscap_carries_the_recognised_log_lines() {
    // The Pulsar client's switch lines (which name no client) decide its flapping: written to
    // an lscap by `sim`, they must be there, as in the OTLP JSON capture of the same run.
    let directory = tempfile::tempdir().expect("temp dir");
    let path = |name: &str| directory.path().join(name).to_str().expect("path").to_string();
    for out in [path("run.lscap"), path("run.jsonl")] {
        let output = lagscope(&["sim", "--scenario", "pulsar-switch-back-delay-lost", "--out", &out]);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    }
    let from_json = stdout_of(&lagscope(&["analyze", "--format", "json", &path("run.jsonl")]));
    let from_lscap = stdout_of(&lagscope(&["analyze", "--format", "json", &path("run.lscap")]));
    assert_eq!(from_lscap, from_json);
    let parsed: serde_json::Value = serde_json::from_str(&from_lscap).expect("JSON");
    let flapping: Vec<&serde_json::Value> = (parsed["anomalies"].as_array().into_iter().flatten())
        .filter(|anomaly| anomaly["kind"] == "failover_flapping")
        .collect();
    assert_eq!(flapping.len(), 1, "{parsed:#}");
    assert_eq!(flapping[0]["evidence"]["source"], "client log", "{:#}", flapping[0]);
}

#[test]
fn an_lscap_conversion_analyzes_the_same_and_writes_jsonl() {
    let directory = tempfile::tempdir().expect("temp dir");
    let capture = fixture("hdfs-rbf-capture.jsonl");
    let lscap = directory.path().join("capture.lscap");
    let converted = lagscope(&["convert", "--out", lscap.to_str().expect("path"), capture.to_str().expect("path")]);
    assert!(converted.status.success(), "{}", String::from_utf8_lossy(&converted.stderr));
    assert!(
        String::from_utf8_lossy(&converted.stderr).contains("16 spans"),
        "{}",
        String::from_utf8_lossy(&converted.stderr)
    );
    let from_json = stdout_of(&lagscope(&["analyze", "--format", "json", capture.to_str().expect("path")]));
    let from_lscap = stdout_of(&lagscope(&["analyze", "--format", "json", lscap.to_str().expect("path")]));
    assert_eq!(from_lscap, from_json);

    let lines = stdout_of(&lagscope(&["analyze", "--format", "jsonl", lscap.to_str().expect("path")]));
    let parsed: Vec<serde_json::Value> =
        lines.lines().map(|line| serde_json::from_str(line).expect("one JSON anomaly per line")).collect();
    let whole: serde_json::Value = serde_json::from_str(&from_json).expect("JSON");
    assert_eq!(serde_json::Value::Array(parsed), whole["anomalies"]);
}

#[test]
fn a_damaged_lscap_file_is_refused_with_where() {
    let directory = tempfile::tempdir().expect("temp dir");
    let capture = fixture("hdfs-rbf-capture.jsonl");
    let lscap = directory.path().join("capture.lscap");
    let converted = lagscope(&["convert", "--out", lscap.to_str().expect("path"), capture.to_str().expect("path")]);
    assert!(converted.status.success());
    let mut bytes = std::fs::read(&lscap).expect("lscap written");

    // Cut short: the block is truncated.
    let truncated = directory.path().join("truncated.lscap");
    std::fs::write(&truncated, &bytes[..bytes.len() - 10]).expect("write");
    let output = lagscope(&["analyze", truncated.to_str().expect("path")]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("truncated.lscap: block 0 at byte 8"), "{stderr}");

    // A corrupt item tag inside the block.
    bytes[12] = 0xee;
    let corrupt = directory.path().join("corrupt.lscap");
    std::fs::write(&corrupt, &bytes).expect("write");
    let output = lagscope(&["analyze", corrupt.to_str().expect("path")]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("corrupt.lscap: block 0 at byte 8") && stderr.contains("unknown item tag 238"), "{stderr}");

    // Not an lscap file at all.
    let other = directory.path().join("other.lscap");
    std::fs::write(&other, "{\"resourceSpans\": []}\n").expect("write");
    let output = lagscope(&["analyze", other.to_str().expect("path")]);
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("not an lscap file"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn a_router_s_log_lines_in_a_capture_are_analyzed_and_carried_by_convert() {
    let directory = tempfile::tempdir().expect("temp dir");
    let capture = directory.path().join("router-logs.jsonl");
    let records: Vec<serde_json::Value> = (0..=20u64)
        .step_by(2)
        .map(|second| {
            serde_json::json!({
                "timeUnixNano": ((1_764_435_600 + second) * 1_000_000_000).to_string(),
                "body": {"stringValue": "Cannot get available namenode for ns3 nn2:8020 error: \
                                         No namenodes available under nameservice ns3"}
            })
        })
        .collect();
    let request = serde_json::json!({"resourceLogs": [{
        "resource": {"attributes": [
            {"key": "lagscope.cluster", "value": {"stringValue": "c1"}},
            {"key": "lagscope.component", "value": {"stringValue": "router"}},
            {"key": "lagscope.node.id", "value": {"stringValue": "router-2"}}
        ]},
        "scopeLogs": [{"logRecords": records}]
    }]});
    std::fs::write(&capture, format!("{request}\n")).expect("capture");
    let output = lagscope(&["analyze", "--format", "json", capture.to_str().expect("path")]);
    let parsed: serde_json::Value = serde_json::from_str(&stdout_of(&output)).expect("JSON");
    let anomalies = parsed["anomalies"].as_array().cloned().unwrap_or_default();
    assert_eq!(anomalies.len(), 1, "{parsed:#}");
    assert_eq!(anomalies[0]["kind"], "no_namenodes_window");
    assert_eq!(anomalies[0]["node_id"], "router-2");
    assert_eq!(anomalies[0]["evidence"]["attempts"], 11);

    let lscap = directory.path().join("router-logs.lscap");
    let output = lagscope(&["convert", "--out", lscap.to_str().expect("path"), capture.to_str().expect("path")]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("11 recognised log lines"), "{stderr}");
    // The lines travel in the .lscap: its analysis finds the same window.
    let from_lscap = lagscope(&["analyze", "--format", "json", lscap.to_str().expect("path")]);
    let converted: serde_json::Value = serde_json::from_str(&stdout_of(&from_lscap)).expect("JSON");
    assert_eq!(converted["anomalies"], parsed["anomalies"]);
}

#[test]
fn an_otlp_json_capture_reads_the_same_on_any_number_of_decoding_threads() {
    // A simulated capture of several megabytes (many chunks of lines, decoded out of order on
    // the threads): the same anomalies, in the same order, as decoded on one thread.
    let directory = tempfile::tempdir().expect("temp dir");
    let capture = directory.path().join("race.jsonl");
    simulate_race("20s", &capture);
    let size = std::fs::metadata(&capture).expect("capture written").len();
    assert!(size > 2 << 20, "a capture of {size} bytes");
    let on = |threads: &str| {
        let output =
            lagscope(&["analyze", "--format", "jsonl", "--decode-threads", threads, capture.to_str().expect("path")]);
        (stdout_of(&output), String::from_utf8_lossy(&output.stderr).into_owned())
    };
    let (one, one_log) = on("1");
    assert!(one.lines().count() > 10, "the race is found: {one_log}");
    assert!(!one_log.contains("decoded on"), "{one_log}");
    for threads in ["2", "4"] {
        let (many, log) = on(threads);
        assert!(many == one, "{threads} threads: {} anomalies against {}", many.lines().count(), one.lines().count());
        assert!(log.contains(&format!("OTLP decoded on {threads} threads")), "{log}");
    }
    let refused = lagscope(&["analyze", "--decode-threads", "0", capture.to_str().expect("path")]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--decode-threads"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}

#[test]
fn progress_lines_of_analyze_convert_and_sim_say_how_far_they_are_only_when_asked_or_on_a_terminal() {
    let directory = tempfile::tempdir().expect("temp dir");
    let json = directory.path().join("race.jsonl");
    let lscap = directory.path().join("race.lscap");
    // Progress is checked per request in OTLP JSON and per block (~256 KB) in lscap.
    simulate_race("10s", &json);
    simulate_race("120s", &lscap);
    let (json, lscap) = (json.to_str().expect("path"), lscap.to_str().expect("path"));
    let stderr = |args: &[&str]| {
        let output = lagscope(args);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    // Not a terminal, not asked: no progress (scripts read this stderr).
    let quiet = stderr(&["analyze", "--format", "jsonl", json, lscap]);
    assert!(!quiet.contains("analyze: "), "{quiet}");
    // Every chunk read: lines naming each file in turn, percentages that never go back and
    // counts that never go down, in both formats.
    let log = stderr(&["analyze", "--format", "jsonl", "--progress-every", "0", json, lscap]);
    let lines: Vec<&str> = log.lines().filter(|line| line.starts_with("analyze: ")).collect();
    let parse = |line: &str| -> (String, u32, u64, u64) {
        // analyze: PATH (file I of 2): P% of SIZE; S spans, A anomalies so far; ...
        let (file, rest) = line["analyze: ".len()..].split_once(" (file ").expect(line);
        let percent = rest.split_once("): ").and_then(|(_, rest)| rest.split_once('%')).expect(line).0;
        let spans = rest.split_once("; ").and_then(|(_, rest)| rest.split_once(" spans")).expect(line).0;
        let anomalies = rest.split_once(" spans, ").and_then(|(_, rest)| rest.split_once(" anomalies")).expect(line).0;
        (file.to_string(), percent.parse().expect(line), spans.parse().expect(line), anomalies.parse().expect(line))
    };
    let parsed: Vec<_> = lines.iter().map(|line| parse(line)).collect();
    for file in [json, lscap] {
        let of_file: Vec<_> = parsed.iter().filter(|(name, ..)| name == file).collect();
        assert!(of_file.len() > 2, "{file}: {lines:?}");
        assert!(of_file.windows(2).all(|pair| pair[0].1 <= pair[1].1), "{file}: percentages go back: {of_file:?}");
        assert!(of_file.iter().all(|(_, percent, ..)| *percent <= 100), "{of_file:?}");
        assert_eq!(of_file.last().expect("lines").1, 100, "{file}: reached {:?}", of_file.last());
    }
    assert_eq!(parsed.first().expect("lines").0, json, "the files in the order given");
    assert!(parsed.windows(2).all(|pair| pair[0].2 <= pair[1].2 && pair[0].3 <= pair[1].3), "{parsed:?}");
    assert!(lines.iter().any(|line| line.contains("(file 2 of 2)")), "{lines:?}");
    // The summary still follows.
    assert!(log.contains("anomalies\n") && log.contains("took "), "{log}");
    // convert says how far it is too: spans written, nothing about anomalies.
    let converted = directory.path().join("again.lscap");
    let log = stderr(&["convert", "--progress-every", "0", "--out", converted.to_str().expect("path"), json]);
    let lines: Vec<&str> = log.lines().filter(|line| line.starts_with("convert: ")).collect();
    assert!(lines.len() > 2, "{log}");
    assert!(lines.iter().all(|line| line.contains(" spans so far;") && !line.contains("anomalies")), "{lines:?}");
    assert!(lines.last().is_some_and(|line| line.contains(": 100% of ")), "{lines:?}");
    // sim says how much of the run it has simulated.
    let simulated = directory.path().join("again.jsonl");
    let log = stderr(&[
        "sim",
        "--scenario",
        "hdfs-publish-race",
        "--duration",
        "10s",
        "--progress-every",
        "0",
        "--out",
        simulated.to_str().expect("path"),
    ]);
    let percents: Vec<u32> = log
        .lines()
        .filter_map(|line| line.strip_prefix("sim: "))
        .map(|line| line.split_once("% of 10 s simulated; ").expect(line).0.parse().expect(line))
        .collect();
    assert!(percents.len() > 2, "{log}");
    assert!(percents.windows(2).all(|pair| pair[0] <= pair[1]) && percents[percents.len() - 1] >= 90, "{percents:?}");
    let refused = lagscope(&["analyze", "--progress-every=-1", json]);
    assert!(!refused.status.success());
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(message.contains("--progress-every -1"), "{message}");
}

#[test]
fn a_sim_or_convert_that_fails_leaves_its_destination_as_it_was() {
    let directory = tempfile::tempdir().expect("temp dir");
    let path = |name: &str| directory.path().join(name).to_str().expect("path").to_string();
    for name in ["out.jsonl", "out.lscap"] {
        std::fs::write(path(name), "precious\n").expect("write");
    }
    std::fs::write(path("broken.jsonl"), "{\"resourceSpans\": []}\n{not json\n").expect("write");
    let failures: [&[&str]; 3] = [
        &["sim", "--scenario", "no-such-scenario", "--out", &path("out.jsonl")],
        &["sim", "--scenario", "hdfs-publish-race", "--clients", "0", "--out", &path("out.lscap")],
        &["convert", "--out", &path("out.lscap"), &path("broken.jsonl")],
    ];
    for args in failures {
        let output = lagscope(args);
        assert!(!output.status.success(), "{args:?} succeeded");
        for name in ["out.jsonl", "out.lscap"] {
            assert_eq!(std::fs::read_to_string(path(name)).expect("read"), "precious\n", "{args:?} changed {name}");
        }
    }
    let mut names: Vec<String> = std::fs::read_dir(directory.path())
        .expect("read dir")
        .map(|entry| entry.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["broken.jsonl", "out.jsonl", "out.lscap"], "nothing left behind");
    // A run that succeeds replaces the file whole.
    simulate_race("5s", Path::new(&path("out.lscap")));
    let analyzed = lagscope(&["analyze", "--format", "jsonl", &path("out.lscap")]);
    assert!(analyzed.status.success(), "{}", String::from_utf8_lossy(&analyzed.stderr));
}
