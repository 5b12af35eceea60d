//! `lagscope analyze --data-dir` and `--database-url`: the detectors over what a store holds
//! find what they find over a capture of the same telemetry, on SQLite and on PostgreSQL,
//! whatever order the store received it in.

#[path = "../../store/tests/support/postgres.rs"]
mod postgres_support;

use std::io::Write;
use std::path::Path;
use std::process::Command;

use lagscope_sim::{Request, SECOND, SimConfig};
use lagscope_store::{IngestBatch, PgStore, SqliteStore, Store};
use serde_json::Value;

const SCENARIO: &str = "mixed";
const CLIENTS: usize = 12;
const SECONDS: i64 = 30;

/// Runs the lagscope binary: whether it succeeded, its stdout and its stderr.
fn lagscope(args: &[&str]) -> (bool, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_lagscope")).args(args).output().expect("lagscope runs");
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).to_string();
    (output.status.success(), text(&output.stdout), text(&output.stderr))
}

/// The scenario's export requests, as `lagscope sim` with the same arguments sends them, and
/// its ground truth.
fn requests() -> (Vec<Request>, lagscope_sim::Truth) {
    let mut sim = SimConfig::new(SCENARIO);
    sim.clients = Some(CLIENTS);
    sim.duration = Some(SECONDS * SECOND);
    let mut requests: Vec<Request> = Vec::new();
    let truth = lagscope_sim::run(&sim, &mut requests).expect("sim");
    (requests, truth)
}

/// The requests as ingest batches of a few requests each, in a shuffled order: a store
/// receives from many exporters at once, batches minutes late among them.
fn shuffled_batches(requests: &[Request]) -> Vec<IngestBatch> {
    let mut batches: Vec<IngestBatch> = requests
        .chunks(50)
        .map(|chunk| {
            let mut batch = IngestBatch::default();
            for request in chunk {
                match request {
                    Request::Traces(request) => {
                        batch.spans.extend(lagscope_collector::otlp::spans_from_request(request).items);
                    }
                    Request::Metrics(request) => {
                        batch.samples.extend(lagscope_collector::otlp::samples_from_request(request).items);
                    }
                    Request::Logs(request) => {
                        batch.logs.extend(lagscope_collector::otlp::logs_from_request(request).items)
                    }
                }
            }
            batch
        })
        .collect();
    // A fixed permutation (Fisher-Yates on a linear congruential sequence).
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    for index in (1..batches.len()).rev() {
        state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        batches.swap(index, (state >> 33) as usize % (index + 1));
    }
    batches
}

async fn fill(store: &dyn Store, batches: &[IngestBatch]) {
    for batch in batches {
        store.ingest(batch).await.expect("ingest");
    }
}

/// One OTLP JSON export request of a client read that took 25 s (a slow call over a stalled
/// connection), as an exporter sends it when it ends: after every span of the capture.
/// Everything else in the capture starts after it and ends before it, so the store, which
/// reads spans in start order, must hold it back to hand the engine the spans as they ended.
const SLOW_READ: &str = r#"{"resourceSpans":[{"resource":{"attributes":[
 {"key":"service.name","value":{"stringValue":"etl"}},
 {"key":"lagscope.system","value":{"stringValue":"hdfs-rbf"}},
 {"key":"lagscope.cluster","value":{"stringValue":"slow.hdfs-prod"}},
 {"key":"lagscope.component","value":{"stringValue":"client"}},
 {"key":"lagscope.client.id","value":{"stringValue":"slow-client"}}]},
 "scopeSpans":[{"spans":[{"traceId":"5f0c0000000000000000000000000001","spanId":"5f0c000000000001",
 "name":"ClientNamenodeProtocol/getFileInfo","kind":3,
 "startTimeUnixNano":"1767225601000000000","endTimeUnixNano":"1767225626000000000","attributes":[
 {"key":"lagscope.namespace","value":{"stringValue":"ns1"}},
 {"key":"lagscope.op","value":{"stringValue":"read"}},
 {"key":"lagscope.call.id","value":{"stringValue":"slow-1"}},
 {"key":"lagscope.outcome","value":{"stringValue":"ok"}}]}]}]}]}"#;

/// The anomalies `analyze --format jsonl` printed, each line as it is, sorted.
fn sorted_lines(stdout: &str) -> Vec<String> {
    let mut lines: Vec<String> = stdout.lines().map(str::to_string).collect();
    lines.sort();
    lines
}

fn kinds(lines: &[String]) -> std::collections::BTreeSet<String> {
    lines
        .iter()
        .map(|line| {
            let anomaly: Value = serde_json::from_str(line).expect("an anomaly per line");
            anomaly["kind"].as_str().expect("kind").to_string()
        })
        .collect()
}

fn path(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_analyzes_as_the_capture_of_the_same_telemetry() {
    let directory = tempfile::tempdir().expect("temp dir");
    let capture = directory.path().join("capture.jsonl");
    let (clients, seconds) = (CLIENTS.to_string(), format!("{SECONDS}s"));
    let (ok, _, stderr) = lagscope(&[
        "sim",
        "--scenario",
        SCENARIO,
        "--clients",
        &clients,
        "--duration",
        &seconds,
        "--out",
        path(&capture),
    ]);
    assert!(ok, "{stderr}");
    let slow_read = SLOW_READ.replace('\n', "");
    let mut file = std::fs::OpenOptions::new().append(true).open(&capture).expect("capture");
    writeln!(file, "{slow_read}").expect("append");
    drop(file);
    let (ok, stdout, stderr) = lagscope(&["analyze", "--format", "jsonl", path(&capture)]);
    assert!(ok, "{stderr}");
    let from_capture = sorted_lines(&stdout);
    let found_kinds = kinds(&from_capture);
    assert!(found_kinds.len() >= 8, "the scenario finds most kinds: {found_kinds:?}");

    let (requests, truth) = requests();
    let mut batches = shuffled_batches(&requests);
    let mut slow = lagscope_collector::capture::Capture::default();
    slow.read_str("slow read", &slow_read).expect("an OTLP JSON request");
    assert_eq!(slow.spans.len(), 1);
    batches.insert(batches.len() / 2, IngestBatch { spans: slow.spans, ..IngestBatch::default() });
    let sqlite_dir = directory.path().join("store");
    let sqlite = SqliteStore::open_dir(&sqlite_dir).await.expect("SQLite store");
    fill(&sqlite, &batches).await;
    let stats = sqlite.stats().await.expect("stats");
    sqlite.close().await;
    let (ok, stdout, stderr) = lagscope(&["analyze", "--format", "jsonl", "--data-dir", path(&sqlite_dir)]);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "lagscope.sqlite: {} spans, {} metric samples, {} log records; {} anomalies",
            stats.spans,
            stats.samples,
            stats.logs,
            from_capture.len()
        )),
        "{stderr}"
    );
    let from_sqlite = sorted_lines(&stdout);
    let differing: Vec<_> =
        from_capture.iter().zip(&from_sqlite).filter(|(left, right)| left != right).take(2).collect();
    assert!(
        differing.is_empty() && from_capture.len() == from_sqlite.len(),
        "{} anomalies from the capture, {} from SQLite; first differences: {differing:#?}",
        from_capture.len(),
        from_sqlite.len()
    );

    let url = postgres_support::fresh_database().await;
    let postgres = PgStore::connect(&url).await.expect("PostgreSQL");
    fill(&postgres, &batches).await;
    postgres.close().await;
    let (ok, stdout, stderr) = lagscope(&["analyze", "--format", "jsonl", "--database-url", &url]);
    assert!(ok, "{stderr}");
    assert!(stderr.contains("read PostgreSQL"), "{stderr}");
    assert_eq!(sorted_lines(&stdout), from_capture, "PostgreSQL and the capture disagree");

    // A range: what starts in it, found as in the whole (a call or a window inside it is
    // whole in it); the table format as well.
    let (from, to) = ("2026-01-01T00:00:10Z", "2026-01-01T00:00:20Z");
    let (ok, stdout, stderr) =
        lagscope(&["analyze", "--format", "jsonl", "--data-dir", path(&sqlite_dir), "--from", from, "--to", to]);
    assert!(ok, "{stderr}");
    let within = sorted_lines(&stdout);
    let starts = |line: &String| serde_json::from_str::<Value>(line).expect("anomaly")["start_unix_nano"].as_i64();
    let (from_nanos, to_nanos) = (1_767_225_610 * SECOND, 1_767_225_620 * SECOND);
    assert!(!within.is_empty() && within.len() < from_capture.len(), "{} of {}", within.len(), from_capture.len());
    assert!(within.iter().all(|line| starts(line).is_some_and(|start| (from_nanos..to_nanos).contains(&start))));
    let (ok, stdout, stderr) = lagscope(&["analyze", "--database-url", &url, "--from", from, "--to", to]);
    assert!(ok, "{stderr}");
    assert_eq!(stdout.lines().count(), within.len() + 1, "a header and a row per anomaly:\n{stdout}");

    // Scored against the run's truth, as `sim --otlp-http ... --truth` into `serve` leaves it:
    // everything expected, nothing else (the slow read breaks no guarantee).
    let truth_path = directory.path().join("truth.json");
    std::fs::write(&truth_path, serde_json::to_string(&truth).expect("truth")).expect("written");
    for store in [["--data-dir", path(&sqlite_dir)], ["--database-url", url.as_str()]] {
        let (ok, stdout, stderr) =
            lagscope(&["eval", "--format", "json", "--truth", path(&truth_path), store[0], store[1]]);
        assert!(ok, "{stderr}\n{stdout}");
        let scores: Value = serde_json::from_str(&stdout).expect("scores");
        assert_eq!(scores[0]["anomalies_expected"], truth.anomalies.len(), "{}", store[0]);
        assert_eq!(scores[0]["anomalies_found"], truth.anomalies.len(), "{}", store[0]);
    }
}

#[test]
fn a_store_that_is_not_there_or_a_range_that_is_not_one_is_refused_by_name() {
    let directory = tempfile::tempdir().expect("temp dir");
    let missing = directory.path().join("missing");
    let (ok, _, stderr) = lagscope(&["analyze", "--data-dir", path(&missing)]);
    assert!(!ok);
    assert!(stderr.contains(&format!("no store at {}", missing.join("lagscope.sqlite").display())), "{stderr}");
    assert!(!missing.exists(), "analyze created a store");

    let (ok, _, stderr) = lagscope(&["analyze", "--data-dir", path(&missing), "capture.jsonl"]);
    assert!(!ok);
    assert!(stderr.contains("'--data-dir <DIR>' cannot be used with '[PATHS]...'"), "{stderr}");
    let (ok, _, stderr) = lagscope(&["analyze", "--from", "2026-01-01T00:00:00Z", "capture.jsonl"]);
    assert!(!ok);
    assert!(stderr.contains("--data-dir <DIR>|--database-url <URL>"), "{stderr}");
    let (ok, _, stderr) = lagscope(&["analyze", "--data-dir", path(&missing), "--from", "yesterday"]);
    assert!(!ok);
    assert!(stderr.contains("--from: \"yesterday\" is neither RFC 3339 nor Unix seconds"), "{stderr}");
    let (ok, _, stderr) = lagscope(&[
        "analyze",
        "--data-dir",
        path(&missing),
        "--from",
        "2026-01-02T00:00:00Z",
        "--to",
        "2026-01-01T00:00:00Z",
    ]);
    assert!(!ok);
    assert!(stderr.contains("--from must be before --to"), "{stderr}");
}
