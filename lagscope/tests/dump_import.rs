//! `lagscope export --dump` and `lagscope import` move a store between backends without
//! losing anything: SQLite -> dump -> PostgreSQL -> dump gives the same records, and an
//! import run twice stores no span, sample or anomaly twice.

mod support;

#[path = "../../store/tests/support/postgres.rs"]
mod postgres_support;

use std::path::Path;
use std::process::Command;

use lagscope_analyzer::{AnalysisInput, AnalyzerConfig, analyze};
use lagscope_sim::{Request, SECOND, SimConfig};
use lagscope_store::{IngestBatch, SqliteStore, Store};
use serde_json::Value;

fn lagscope(args: &[&str]) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_lagscope")).args(args).output().expect("lagscope runs");
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    (output.status.success(), stderr)
}

/// A store filled with a scenario's spans, samples and logs and the anomalies found in them.
async fn seeded_sqlite(directory: &Path) -> lagscope_store::StoreStats {
    let mut sim = SimConfig::new("hdfs-no-namenodes");
    sim.duration = Some(20 * SECOND);
    let mut requests: Vec<Request> = Vec::new();
    lagscope_sim::run(&sim, &mut requests).expect("sim");
    let store = SqliteStore::open_dir(directory).await.expect("store");
    let mut spans = Vec::new();
    let mut samples = Vec::new();
    for request in &requests {
        let mut batch = IngestBatch::default();
        match request {
            Request::Traces(request) => batch.spans = lagscope_collector::otlp::spans_from_request(request).items,
            Request::Metrics(request) => batch.samples = lagscope_collector::otlp::samples_from_request(request).items,
            Request::Logs(request) => batch.logs = lagscope_collector::otlp::logs_from_request(request).items,
        }
        store.ingest(&batch).await.expect("ingest");
        spans.extend(batch.spans);
        samples.extend(batch.samples);
    }
    // Hostile text survives too.
    let mut hostile = spans[0].clone();
    hostile.span_id = Some("00000000000000ff".into());
    hostile.status_message = Some("<script>alert('x')</script> \"quoted\" \u{1F600} tab\there".into());
    hostile.attributes.insert("weird.key\n".into(), serde_json::json!({"nested": [1, 2.5, null, "x"]}));
    store.ingest(&IngestBatch { spans: vec![hostile], ..IngestBatch::default() }).await.expect("ingest");
    let config = AnalyzerConfig::default();
    let anomalies = analyze(&AnalysisInput::from_telemetry(&spans, samples, config.stream.horizon()), &config);
    assert!(!anomalies.is_empty(), "the scenario has anomalies to carry over");
    store.upsert_anomalies(&anomalies, 1_700_000_000 * SECOND).await.expect("anomalies");
    let stats = store.stats().await.expect("stats");
    store.close().await;
    stats
}

/// The records of a dump, without the header, each as canonical JSON text, sorted.
fn records(path: &Path) -> Vec<String> {
    let mut records: Vec<String> = lagscope::dump::read_records(path)
        .expect("dump readable")
        .into_iter()
        .skip(1)
        .map(|mut record| {
            // Ids are each store's own; last-seen becomes first-seen on import.
            if let Some(anomaly) = record.get_mut("anomaly").and_then(Value::as_object_mut) {
                anomaly.remove("last_seen_unix_nano");
            }
            record.to_string()
        })
        .collect();
    records.sort();
    records
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_moves_between_backends_without_loss() {
    let directory = tempfile::tempdir().expect("temp dir");
    let sqlite_dir = directory.path().join("sqlite");
    let stats = seeded_sqlite(&sqlite_dir).await;
    assert!(stats.spans > 0 && stats.samples > 0 && stats.logs > 0 && stats.anomalies > 0, "{stats:?}");
    let url = postgres_support::fresh_database().await;
    let first = directory.path().join("first.jsonl.gz");
    let second = directory.path().join("second.jsonl.gz");
    let sqlite = sqlite_dir.to_str().expect("utf-8 path");

    let (ok, stderr) = lagscope(&["export", "--dump", first.to_str().expect("path"), "--data-dir", sqlite]);
    assert!(ok, "{stderr}");
    assert!(
        stderr
            .contains(&format!("dumped {} spans, {} samples, {} log records", stats.spans, stats.samples, stats.logs)),
        "{stderr}"
    );
    let (ok, stderr) = lagscope(&["import", "--database-url", &url, first.to_str().expect("path")]);
    assert!(ok, "{stderr}");
    let postgres = lagscope_store::PgStore::connect(&url).await.expect("PostgreSQL");
    let moved = postgres.stats().await.expect("stats");
    assert_eq!(moved, stats);
    let (ok, stderr) = lagscope(&["export", "--dump", second.to_str().expect("path"), "--database-url", &url]);
    assert!(ok, "{stderr}");
    let (before, after) = (records(&first), records(&second));
    assert_eq!(before.len() as u64, stats.spans + stats.samples + stats.logs + stats.anomalies);
    let differing: Vec<_> = before.iter().zip(&after).filter(|(left, right)| left != right).take(3).collect();
    assert!(differing.is_empty() && before.len() == after.len(), "records changed on the way: {differing:#?}");
    assert!(before.iter().any(|record| record.contains("<script>alert('x')</script>")));

    // Run again (after an interruption, say): no span, sample, log record or anomaly is stored
    // twice.
    let (ok, stderr) = lagscope(&["import", "--database-url", &url, first.to_str().expect("path")]);
    assert!(ok, "{stderr}");
    let again = postgres.stats().await.expect("stats");
    assert_eq!(
        (again.spans, again.series, again.samples, again.logs, again.anomalies),
        (stats.spans, stats.series, stats.samples, stats.logs, stats.anomalies)
    );
    postgres.close().await;

    // And back into a fresh SQLite store.
    let back = directory.path().join("back");
    let (ok, stderr) =
        lagscope(&["import", "--data-dir", back.to_str().expect("path"), second.to_str().expect("path")]);
    assert!(ok, "{stderr}");
    let store = SqliteStore::open_dir(&back).await.expect("store");
    let returned = store.stats().await.expect("stats");
    assert_eq!(returned, stats);
}

#[test]
fn bad_dumps_are_refused_with_file_and_line() {
    let directory = tempfile::tempdir().expect("temp dir");
    let target = directory.path().join("store");
    let header = |version: u32| {
        format!(
            "{{\"header\":{{\"format\":\"lagscope-dump\",\"version\":{version},\"source\":\"t\",\"lagscope_version\":\"0\"}}}}\n"
        )
    };
    let cases = [
        ("capture.jsonl", "{\"resourceSpans\":[]}\n".to_string(), "capture.jsonl:1: not a lagscope dump record"),
        ("broken.jsonl", header(1) + "{\"span\":{\"name\":3}}\n", "broken.jsonl:2: not a lagscope dump record"),
        ("newer.jsonl", header(9), "version 9; this lagscope reads lagscope-dump version 1"),
    ];
    for (name, content, expected) in cases {
        let file = directory.path().join(name);
        std::fs::write(&file, content).expect("write");
        let (ok, stderr) =
            lagscope(&["import", "--data-dir", target.to_str().expect("path"), file.to_str().expect("path")]);
        assert!(!ok, "{name} was imported");
        assert!(stderr.contains(expected), "{name}: {stderr}");
    }
    let (ok, stderr) =
        lagscope(&["export", "--dump", "x.gz", "--data-dir", directory.path().join("none").to_str().expect("path")]);
    assert!(!ok);
    assert!(stderr.contains("no store at"), "{stderr}");
}

/// A dump that breaks after more than one import transaction: the batches before the bad
/// line's are committed (the import parses ahead of the store, in order), the error names the
/// line and says how far the import got, and running it again once mended stores the rest
/// without storing anything twice.
#[test]
fn an_import_stopped_by_a_bad_line_keeps_the_batches_before_it() {
    use lagscope_model::{CallFields, ResourceFields, Span, SpanKind};
    let directory = tempfile::tempdir().expect("temp dir");
    let target = directory.path().join("store");
    let header =
        "{\"header\":{\"format\":\"lagscope-dump\",\"version\":1,\"source\":\"t\",\"lagscope_version\":\"0\"}}\n";
    let span_line = |index: i64| {
        let span = Span {
            trace_id: Some(format!("{index:032x}")),
            span_id: Some(format!("{index:016x}")),
            parent_span_id: None,
            name: "getFileInfo".into(),
            kind: SpanKind::Client,
            start_unix_nano: 1_700_000_000_000_000_000 + index * 1_000_000,
            end_unix_nano: 1_700_000_000_000_000_000 + index * 1_000_000 + 500_000,
            status_code: 0,
            status_message: None,
            resource: ResourceFields::default(),
            scope_name: None,
            scope_version: None,
            scope_attributes: Default::default(),
            call: CallFields { client_id: Some(format!("client-{}", index % 7)), ..CallFields::default() },
            attributes: Default::default(),
            events: Vec::new(),
            links: Vec::new(),
        };
        serde_json::json!({ "span": span }).to_string() + "\n"
    };
    // Line 1 the header, lines 2-6001 six thousand spans (one transaction of 5 000, then
    // 1 000 more), line 6002 broken.
    let good: String = (0..6_000).map(span_line).collect();
    let broken = directory.path().join("broken.jsonl");
    std::fs::write(&broken, format!("{header}{good}{{\"span\":{{\"name\":3}}}}\n")).expect("write");
    let (ok, stderr) =
        lagscope(&["import", "--data-dir", target.to_str().expect("path"), broken.to_str().expect("path")]);
    assert!(!ok, "a broken dump was imported");
    assert!(stderr.contains("broken.jsonl:6002: not a lagscope dump record"), "{stderr}");
    assert!(stderr.contains("import stopped; the lines before 5002 are imported"), "{stderr}");
    let stored = || {
        tokio::runtime::Runtime::new().expect("runtime").block_on(async {
            let store = SqliteStore::open_dir(&target).await.expect("store");
            let stats = store.stats().await.expect("stats");
            store.close().await;
            stats.spans
        })
    };
    assert_eq!(stored(), 5_000, "exactly the transaction before the bad line's");

    // Mended (the bad line dropped) and run again: the rest, nothing twice.
    let mended = directory.path().join("mended.jsonl");
    std::fs::write(&mended, format!("{header}{good}")).expect("write");
    let (ok, stderr) =
        lagscope(&["import", "--data-dir", target.to_str().expect("path"), mended.to_str().expect("path")]);
    assert!(ok, "{stderr}");
    assert!(stderr.contains("imported 6000 spans"), "{stderr}");
    assert_eq!(stored(), 6_000);

    // A bad first line: nothing of it is imported, and the error says so.
    let capture = directory.path().join("capture.jsonl");
    std::fs::write(&capture, "{\"resourceSpans\":[]}\n").expect("write");
    let (ok, stderr) =
        lagscope(&["import", "--data-dir", target.to_str().expect("path"), capture.to_str().expect("path")]);
    assert!(!ok);
    assert!(stderr.contains("capture.jsonl: import stopped; nothing of it was imported"), "{stderr}");
}
