//! Lag analytics end to end: simulated telemetry over OTLP/HTTP into the server, aggregated
//! at `GET /api/v1/lag`, and exported from the same store as Parquet by `lagscope export`.

#[path = "../../store/tests/support/postgres.rs"]
mod postgres_support;
mod support;

use std::process::Command;

use lagscope::sim_cmd::{Target, run};
use lagscope_sim::{SECOND, SimConfig, Truth};
use polars::prelude::*;
use serde_json::Value;
use support::{get_json, wait_until_analyzed};

fn simulate(scenario: &str, seconds: i64, target: Target) -> Truth {
    let mut config = SimConfig::new(scenario);
    config.duration = Some(seconds * SECOND);
    std::thread::spawn(move || run(&config, &target, false)).join().expect("sim thread").expect("sim delivers").0
}

/// The spans and samples `scenario` sends in `seconds`, decoded as the receivers decode them.
fn telemetry_of(scenario: &str, seconds: i64) -> (Vec<lagscope_model::Span>, Vec<lagscope_model::Sample>) {
    use lagscope_collector::otlp::{samples_from_request, spans_from_request};
    let mut config = SimConfig::new(scenario);
    config.duration = Some(seconds * SECOND);
    let mut requests = Vec::new();
    lagscope_sim::run(&config, &mut requests).expect("scenario runs");
    let (mut spans, mut samples) = (Vec::new(), Vec::new());
    for request in &requests {
        match request {
            lagscope_sim::Request::Traces(request) => spans.extend(spans_from_request(request).items),
            lagscope_sim::Request::Metrics(request) => samples.extend(samples_from_request(request).items),
            lagscope_sim::Request::Logs(_) => {}
        }
    }
    (spans, samples)
}

fn sum(rows: &Value, field: &str) -> f64 {
    rows.as_array().into_iter().flatten().filter_map(|row| row[field].as_f64()).sum()
}

fn parquet(path: &std::path::Path) -> DataFrame {
    ParquetReader::new(std::fs::File::open(path).expect("parquet file")).finish().expect("valid parquet")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lag_is_aggregated_served_and_exported() {
    let directory = tempfile::tempdir().expect("temp dir");
    let store = vec!["--data-dir".to_string(), directory.path().display().to_string()];
    aggregated_served_and_exported(support::local_config(directory.path()), directory.path(), &store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgresql_lag_is_aggregated_served_and_exported() {
    let directory = tempfile::tempdir().expect("temp dir");
    let mut config = support::local_config(directory.path());
    let url = postgres_support::fresh_database().await;
    config.server.database_url = Some(url.clone());
    aggregated_served_and_exported(config, directory.path(), &["--database-url".to_string(), url]).await;
}

/// Serves the simulator's telemetry from `config`'s store, checks the lag API, then exports
/// the store (`store_args` name it to `lagscope export`) into `directory`.
async fn aggregated_served_and_exported(config: lagscope::Config, directory: &std::path::Path, store_args: &[String]) {
    let server = lagscope::Server::start(&config).await.expect("server starts");
    let http = format!("http://{}", server.otlp_http_addr);
    let (first, second) = (Target::OtlpHttp(http.clone()), Target::OtlpHttp(http));
    let (stale, _) = tokio::task::spawn_blocking(move || {
        (simulate("hdfs-pool-not-advanced", 20, first), simulate("es-node-level-pressure", 40, second))
    })
    .await
    .expect("join");
    wait_until_analyzed(&server).await;

    // Where the data lies: around the stale reads the live analyzer found.
    let (_, listed) = get_json(&server, "/api/v1/anomalies?kind=stale_read&limit=1000").await;
    let anomalies = listed["anomalies"].as_array().expect("anomalies");
    assert_eq!(anomalies.len(), stale.count("stale_read"));
    let at = anomalies[0]["start_unix_nano"].as_i64().expect("start") / SECOND;
    let (from, to) = (at - 300, at + 300);

    let (status, whole) = get_json(&server, &format!("/api/v1/lag?from={from}&to={to}")).await;
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["input"]["truncated"], false);
    let reads = &whole["reads"];
    let observers: Vec<&Value> =
        reads.as_array().expect("reads").iter().filter(|row| row["node"].as_str().is_some()).collect();
    assert!(observers.len() >= 2, "one distribution per serving node: {reads:#}");
    // Every read-your-writes stale read was served below a state the namespace had committed.
    assert!(sum(reads, "stale_reads") >= anomalies.len() as f64, "{reads:#}");
    assert!(
        observers
            .iter()
            .any(|row| row["behind_states"]["max"].as_f64() > Some(0.0)
                && row["behind_seconds"]["max"].as_f64() > Some(0.0)),
        "{reads:#}"
    );
    for row in &observers {
        let states = &row["behind_states"];
        assert!(states["p50"].as_f64() <= states["p99"].as_f64() && states["p99"].as_f64() <= states["max"].as_f64());
    }
    // The Elasticsearch node rejected primary writes on the healthy shard too.
    let rejections = whole["rejections"].as_array().expect("rejections");
    let shards: std::collections::BTreeSet<&str> = rejections
        .iter()
        .filter(|row| row["role"] == "primary" && row["rejections"].as_f64() > Some(0.0))
        .filter_map(|row| row["namespace"].as_str())
        .collect();
    assert!(shards.len() >= 2, "{rejections:#?}");

    // The live analyzer's per-node-minute rollups (what the Lag dashboard reads) agree with
    // the figures computed from the raw telemetry over the same whole minutes: the same reads
    // per node, the same reads behind committed, the same maxima.
    let (minute_from, minute_to) = (from - from.rem_euclid(60), to - to.rem_euclid(60));
    let (status, exact) = get_json(&server, &format!("/api/v1/lag?from={minute_from}&to={minute_to}")).await;
    assert_eq!(status, 200, "{exact}");
    let (status, rolled) = get_json(&server, &format!("/api/v1/staleness?from={minute_from}&to={minute_to}")).await;
    assert_eq!(status, 200, "{rolled}");
    let key = |row: &Value| (row["cluster"].to_string(), row["namespace"].to_string(), row["node"].to_string());
    let rolled_nodes: std::collections::BTreeMap<_, &Value> =
        rolled["nodes"].as_array().expect("nodes").iter().map(|row| (key(row), row)).collect();
    let exact_reads = exact["reads"].as_array().expect("reads");
    assert_eq!(rolled_nodes.len(), exact_reads.len(), "{rolled:#}\n{exact:#}");
    for row in exact_reads {
        let node = rolled_nodes.get(&key(row)).unwrap_or_else(|| panic!("no rollup for {row}"));
        assert_eq!(node["reads"], row["reads"], "{node} against {row}");
        assert_eq!(node["behind_reads"], row["stale_reads"], "{node} against {row}");
        for unit in ["behind_states", "behind_seconds"] {
            let (rolled, exact) = (&node[unit], &row[unit]);
            if exact.is_null() {
                continue;
            }
            let number = |value: &Value| value.as_f64().unwrap_or_else(|| panic!("{unit}: a number, not {value}"));
            let max = number(&rolled["max"]);
            assert!((max - number(&exact["max"])).abs() <= 1e-6, "{unit}: {node} {row}");
            // The percentile methods differ (a bucket's middle at a rank, against polars'
            // linear interpolation): only their bounds are compared, 0 to the max plus the
            // histogram's error.
            for p in ["p50", "p99"] {
                let value = number(&rolled[p]);
                assert!(value >= 0.0 && value <= max * 1.07 + 1e-3, "{unit} {p}: {node}");
            }
        }
    }
    let reads_behind: u64 = rolled_nodes.values().filter_map(|node| node["behind_reads"].as_u64()).sum();
    assert!(reads_behind >= anomalies.len() as u64, "{rolled:#}");

    // Buckets partition the range: per-step counts add up to the whole range's.
    let (status, stepped) = get_json(&server, &format!("/api/v1/lag?from={from}&to={to}&step=10s")).await;
    assert_eq!(status, 200, "{stepped}");
    assert!(stepped["reads"].as_array().map(Vec::len) > reads.as_array().map(Vec::len));
    assert_eq!(sum(&stepped["reads"], "reads"), sum(reads, "reads"));
    assert_eq!(sum(&stepped["rejections"], "rejections"), sum(&whole["rejections"], "rejections"));
    // A scope narrows it.
    let (_, one) = get_json(&server, &format!("/api/v1/lag?from={from}&to={to}&cluster=es-prod")).await;
    assert!(one["reads"].as_array().is_some_and(|rows| rows.iter().all(|row| row["cluster"] == "es-prod")), "{one}");

    for (query, names) in [
        (format!("from={to}&to={from}"), "from"),
        (format!("from={from}&to={to}&step=0"), "step"),
        (format!("from={from}&to={to}&step=5x"), "step"),
        (format!("from=0&to={to}&step=1s"), "buckets"),
        ("from=yesterday".to_string(), "yesterday"),
        ("nodes=1".to_string(), "nodes"),
    ] {
        let (status, body) = get_json(&server, &format!("/api/v1/lag?{query}")).await;
        assert_eq!(status, 400, "{query}: {body}");
        assert!(body["error"].as_str().is_some_and(|error| error.contains(names)), "{query}: {body}");
    }
    server.shutdown().await.expect("clean shutdown");

    // The same store, exported.
    let out = directory.join("parquet");
    let output = Command::new(env!("CARGO_BIN_EXE_lagscope"))
        .args(["export", "--parquet"])
        .arg(&out)
        .args(store_args)
        .args(["--from", &from.to_string(), "--to", &to.to_string(), "--step", "10s"])
        .output()
        .expect("lagscope export runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("wrote 7 files"), "{stderr}");
    let exported_reads = parquet(&out.join("reads.parquet"));
    assert_eq!(exported_reads.height() as f64, sum(reads, "reads"));
    let exported_stale =
        exported_reads.column("behind_states").expect("column").i64().expect("i64").iter().flatten().filter(|b| *b > 0);
    assert_eq!(exported_stale.count() as f64, sum(reads, "stale_reads"));
    let by_step = parquet(&out.join("reads_by_step.parquet"));
    assert_eq!(by_step.height(), stepped["reads"].as_array().map_or(0, Vec::len));
    let spans = parquet(&out.join("spans.parquet"));
    assert_eq!(spans.height() as u64, whole["input"]["spans"].as_u64().expect("spans"));
    let rejected: f64 = parquet(&out.join("rejections.parquet"))
        .column("rejections")
        .expect("column")
        .f64()
        .expect("f64")
        .iter()
        .flatten()
        .sum();
    assert_eq!(rejected, sum(&whole["rejections"], "rejections"));

    // Bad arguments name themselves.
    let output = Command::new(env!("CARGO_BIN_EXE_lagscope"))
        .args(["export", "--parquet"])
        .arg(&out)
        .arg("--data-dir")
        .arg(directory.join("missing"))
        .output()
        .expect("lagscope export runs");
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("no store at"), "{:?}", output);
    // An lscap capture keeps too little to export: refused by name, not read as broken JSON.
    let lscap = directory.join("capture.lscap");
    std::fs::write(&lscap, b"LSCAP\x00\x00\x01").expect("write");
    let output = Command::new(env!("CARGO_BIN_EXE_lagscope"))
        .args(["export", "--parquet"])
        .arg(&out)
        .arg(&lscap)
        .output()
        .expect("lagscope export runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("capture.lscap: an lscap capture") && stderr.contains("reads OTLP captures"), "{stderr}");
}

/// The live passes' per-minute rollups sum exactly the read rows the lag analytics list: on
/// scenarios with stale reads, lagging followers and reads with no committed state known yet,
/// from the first minute and from a cut inside the history.
#[test]
fn read_rollups_sum_the_read_rows_of_each_minute() {
    use lagscope_analyzer::{AnalysisInput, StreamConfig, lag_rows, read_rollups};
    use lagscope_model::{ReadRollup, rollup_step_of};
    use std::collections::BTreeMap;

    let (mut compared, mut behind) = (0, 0);
    for scenario in ["hdfs-pool-not-advanced", "hdfs-observer-lag-storm", "ozone-apply-lag"] {
        let (spans, samples) = telemetry_of(scenario, 150);
        let input = AnalysisInput::from_telemetry(&spans, samples, StreamConfig::default().horizon());
        let reads = lag_rows(&input).reads;
        behind += reads.iter().filter(|read| read.behind_states > Some(0)).count();
        let middle = reads[reads.len() / 2].time_unix_nano;
        for complete_from in [i64::MIN, middle] {
            // The rows summed one by one, as the rollups are defined.
            // (minute, cluster, namespace, node)
            type Key = (i64, Option<String>, Option<String>, Option<String>);
            let mut expected: BTreeMap<Key, ReadRollup> = BTreeMap::new();
            for read in reads.iter().filter(|read| read.time_unix_nano >= complete_from) {
                let minute = rollup_step_of(read.time_unix_nano);
                let key = (minute, read.cluster.clone(), read.namespace.clone(), read.node.clone());
                let rollup = expected.entry(key).or_insert_with(|| ReadRollup {
                    cluster: read.cluster.clone(),
                    namespace: read.namespace.clone(),
                    node: read.node.clone(),
                    minute_unix_nano: minute,
                    ..ReadRollup::default()
                });
                rollup.reads += 1;
                let (Some(states), Some(seconds)) = (read.behind_states, read.behind_seconds) else { continue };
                rollup.compared += 1;
                rollup.behind_reads += u64::from(states > 0);
                rollup.behind_states.record(states.max(0) as u64);
                rollup.behind_millis.record((seconds.max(0.0) * 1e3).round() as u64);
                rollup.max_behind_states = rollup.max_behind_states.max(Some(states));
                rollup.max_behind_seconds = Some(rollup.max_behind_seconds.map_or(seconds, |max| max.max(seconds)));
            }
            let expected: Vec<ReadRollup> = expected.into_values().collect();
            assert!(expected.len() > 1, "{scenario}: {} rollups", expected.len());
            assert_eq!(read_rollups(&input, complete_from), expected, "{scenario} from {complete_from}");
            compared += expected.len();
        }
    }
    assert!(compared > 10 && behind > 0, "{compared} rollups compared, {behind} reads behind");
}

/// The files `export --parquet` wrote before it joined spans a window at a time: the lag rows
/// of all of `spans` at once, aggregated over their whole range, written into `dir`.
fn exported_whole(
    spans: &[lagscope_model::Span],
    samples: Vec<lagscope_model::Sample>,
    dir: &std::path::Path,
) -> Vec<lagscope_analytics::Exported> {
    use lagscope_analyzer::{AnalysisInput, StreamConfig, lag_rows};
    let rows = lag_rows(&AnalysisInput::from_telemetry(spans, samples, StreamConfig::default().horizon()));
    let times = (rows.reads.iter().map(|row| row.time_unix_nano))
        .chain(rows.apply.iter().map(|row| row.time_unix_nano))
        .chain(rows.rejections.iter().map(|row| row.time_unix_nano))
        .chain(spans.iter().map(|span| span.start_unix_nano));
    let (first, last) = times.fold((i64::MAX, i64::MIN), |(first, last), time| (first.min(time), last.max(time)));
    let query = lagscope_model::LagQuery {
        cluster: None,
        namespace: None,
        from_unix_nano: first,
        to_unix_nano: last + 1,
        step_seconds: None,
    };
    let mut written = lagscope_analytics::export_parquet(dir, &rows, &query).expect("expected files");
    written.push(lagscope_analytics::export_spans_parquet(dir, spans).expect("spans"));
    assert!(rows.reads.iter().filter(|row| row.behind_states > Some(0)).count() > 100, "stale reads to compare");
    written
}

/// Each of `expected` has its twin of the same name in `out`, row for row, and nothing else is
/// there (the working directory went).
fn same_files(expected: &[lagscope_analytics::Exported], out: &std::path::Path, what: &str) {
    for file in expected {
        let name = file.path.file_name().expect("name");
        let (want, got) = (parquet(&file.path), parquet(&out.join(name)));
        assert_eq!(got.dtypes(), want.dtypes(), "{what} {name:?}");
        // (Named, not printed: polars prints a time zone's column only with `timezones`.)
        let differ: Vec<String> = (want.columns().iter())
            .filter(|column| got.column(column.name()).ok().is_none_or(|other| !other.equals_missing(column)))
            .map(|column| column.name().to_string())
            .collect();
        assert!(
            got.height() == want.height() && differ.is_empty(),
            "{what} {name:?}: {} rows, {} expected; columns that differ: {differ:?}",
            got.height(),
            want.height()
        );
    }
    assert_eq!(std::fs::read_dir(out).expect("out").count(), expected.len(), "{what}");
}

/// `export --parquet` of capture files, which holds neither the captures nor their timelines,
/// writes exactly what the analytics of the whole telemetry at once give: every file, row for
/// row, with the files read in any order. A bad line stops it with its place named, and no
/// file is left in the directory.
#[test]
fn captures_exported_a_window_at_a_time_are_the_whole_telemetrys_analytics() {
    let directory = tempfile::tempdir().expect("temp dir");
    let lagscope = |args: &[&str]| Command::new(env!("CARGO_BIN_EXE_lagscope")).args(args).output().expect("runs");
    let path = |name: &str| directory.path().join(name).to_str().expect("path").to_string();
    // Stale reads, a follower's apply lag, a shard's rejections; several windows of each.
    let scenarios = ["hdfs-pool-not-advanced", "ozone-apply-lag", "es-node-level-pressure"];
    for scenario in scenarios {
        let output = lagscope(&["sim", "--scenario", scenario, "--duration", "400s", "--out", &path(scenario)]);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    }
    for order in [[0, 1, 2], [2, 0, 1]] {
        let files: Vec<String> = order.iter().map(|index| path(scenarios[*index])).collect();
        let capture = lagscope::analyze::read_captures(&files).expect("captures read");
        let expected = exported_whole(&capture.spans, capture.samples, &directory.path().join("expected"));
        let out = path("out");
        let mut args = vec!["export", "--parquet", &out, "--progress-every", "0"];
        args.extend(files.iter().map(String::as_str));
        let output = lagscope(&args);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("% of the spans joined"), "{stderr}");
        same_files(&expected, &directory.path().join("out"), &format!("{order:?}"));
    }

    // A bad line half way: stopped there, nothing written.
    let text = std::fs::read_to_string(path(scenarios[0])).expect("capture");
    let lines: Vec<&str> = text.lines().collect();
    let broken =
        lines[..lines.len() / 2].join("\n") + "\n{\"resourceSpans\": [oops\n" + &lines[lines.len() / 2..].join("\n");
    std::fs::write(path("broken.jsonl"), broken).expect("write");
    let out = path("stopped");
    let output = lagscope(&["export", "--parquet", &out, &path("broken.jsonl")]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(&format!("broken.jsonl:{}", lines.len() / 2 + 1)), "{stderr}");
    assert_eq!(std::fs::read_dir(directory.path().join("stopped")).expect("created").count(), 0);
}

/// `export --parquet` of a store, its spans read in start order and joined as they come, writes
/// what the analytics of everything it holds at once give; with `--max-spans`, those of its
/// oldest spans.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_exported_a_window_at_a_time_is_its_whole_analytics() {
    use lagscope_store::{IngestBatch, SqliteStore, Store, TimeRange};

    let directory = tempfile::tempdir().expect("temp dir");
    let data_dir = directory.path().join("data");
    let store = SqliteStore::open_dir(&data_dir).await.expect("store");
    for scenario in ["hdfs-pool-not-advanced", "ozone-apply-lag"] {
        let (spans, samples) = telemetry_of(scenario, 400);
        for spans in spans.chunks(5_000) {
            store.ingest(&IngestBatch { spans: spans.to_vec(), ..IngestBatch::default() }).await.expect("ingest");
        }
        for samples in samples.chunks(5_000) {
            store.ingest(&IngestBatch { samples: samples.to_vec(), ..IngestBatch::default() }).await.expect("ingest");
        }
    }
    let store: std::sync::Arc<dyn Store> = std::sync::Arc::new(store);
    for max_spans in [u32::MAX, 30_000] {
        // What the store holds, in the order it reads it, as the lag API reads it.
        let read =
            lagscope_web::read_range(&store, None, None, TimeRange::ALL, max_spans, u32::MAX).await.expect("read");
        let expected =
            exported_whole(&read.spans, read.samples, &directory.path().join(format!("expected-{max_spans}")));
        let out = directory.path().join(format!("out-{max_spans}"));
        let output = Command::new(env!("CARGO_BIN_EXE_lagscope"))
            .args(["export", "--parquet"])
            .arg(&out)
            .arg("--data-dir")
            .arg(&data_dir)
            .args(["--max-spans", &max_spans.to_string()])
            .output()
            .expect("lagscope export runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{stderr}");
        assert_eq!(stderr.contains("the read limit was reached"), max_spans < u32::MAX, "{stderr}");
        same_files(&expected, &out, &format!("--max-spans {max_spans}"));
    }
}
