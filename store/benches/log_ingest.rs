//! Log record ingest, fresh and sent again, into both backends:
//! `cargo bench -p lagscope-store --bench log_ingest` (needs Debian's postgresql-15, as the
//! tests do; the cluster is started here with fsync on, PostgreSQL's default).
//!
//! For each backend and run: a fresh store; `RECORDS` router log records (the lines of a
//! NoNamenodesAvailable window and their chatter, each with its thread, namespace and resource)
//! ingested in batches of `BATCH` (an OTLP logs request's worth), one durable `Store::ingest`
//! each; then the same batches again, as an exporter that lost every acknowledgement would
//! send them. Prints records/s and how many rows each pass stored. `RUNS` (default 3) runs;
//! the medians on the last lines.

use std::time::Instant;

#[path = "../tests/support/postgres.rs"]
mod postgres_support;

use lagscope_model::{Component, LogRecord, ResourceFields};
use lagscope_store::{IngestBatch, PgStore, SqliteStore, Store};
use serde_json::json;

const RECORDS: usize = 100_000;
const BATCH: usize = 500;
const T0: i64 = 1_764_435_600_000_000_000;

fn record(index: usize) -> LogRecord {
    let namespace = index % 4;
    let body = if index.is_multiple_of(3) {
        format!(
            "Cannot get available namenode for ns{namespace} nn{namespace}0{}:8020 error: \
             org.apache.hadoop.hdfs.server.federation.router.NoNamenodesAvailableException: No namenodes \
             available under nameservice ns{namespace}",
            index % 2
        )
    } else {
        format!("Call {index} from client-{} took {} ms", index % 50, index % 97)
    };
    let time = T0 + (index as i64) * 1_000_000;
    let mut attributes = serde_json::Map::new();
    attributes.insert("thread.name".to_string(), json!(format!("IPC Server handler {} on 8888", index % 16)));
    attributes.insert("lagscope.namespace".to_string(), json!(format!("ns{namespace}")));
    LogRecord {
        time_unix_nano: time,
        observed_time_unix_nano: Some(time + 20_000),
        severity_number: 13,
        severity_text: Some("WARN".to_string()),
        body: json!(body),
        event_name: None,
        trace_id: None,
        span_id: None,
        resource: ResourceFields {
            service_name: Some("hdfs-router".to_string()),
            system: Some("hdfs-rbf".to_string()),
            cluster: Some("prod".to_string()),
            component: Some(Component::Router),
            node_id: Some(format!("router-{}", index % 3)),
            attributes: json!({"host.name": "r1", "process.pid": 4242}).as_object().cloned().unwrap_or_default(),
        },
        scope_name: Some("org.apache.hadoop.hdfs.server.federation.router.RouterRpcClient".to_string()),
        scope_version: None,
        attributes,
    }
}

/// Ingests every batch once; returns records/s and the rows stored.
async fn pass(store: &dyn Store, batches: &[IngestBatch]) -> (f64, u64) {
    let started = Instant::now();
    let mut written = 0;
    for batch in batches {
        written += store.ingest(batch).await.expect("ingest").logs_written;
    }
    (RECORDS as f64 / started.elapsed().as_secs_f64(), written)
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

#[tokio::main]
async fn main() {
    let runs: usize = std::env::var("RUNS").ok().and_then(|runs| runs.parse().ok()).unwrap_or(3);
    let records: Vec<LogRecord> = (0..RECORDS).map(record).collect();
    let batches: Vec<IngestBatch> =
        records.chunks(BATCH).map(|chunk| IngestBatch { logs: chunk.to_vec(), ..IngestBatch::default() }).collect();
    for backend in ["sqlite", "postgres"] {
        let (mut fresh, mut again) = (Vec::new(), Vec::new());
        for run in 1..=runs {
            let directory = tempfile::tempdir().expect("temp dir");
            let store: Box<dyn Store> = match backend {
                "sqlite" => Box::new(SqliteStore::open_dir(directory.path()).await.expect("sqlite")),
                _ => {
                    let url = postgres_support::fresh_durable_database().await;
                    Box::new(PgStore::connect(&url).await.expect("postgres"))
                }
            };
            let (first_rate, first_written) = pass(store.as_ref(), &batches).await;
            let (second_rate, second_written) = pass(store.as_ref(), &batches).await;
            println!(
                "{backend} run {run}: {RECORDS} records in batches of {BATCH}: fresh {first_rate:.0} records/s \
                 ({first_written} stored), sent again {second_rate:.0} records/s ({second_written} stored)"
            );
            fresh.push(first_rate);
            again.push(second_rate);
        }
        println!(
            "{backend} median of {runs}: fresh {:.0} records/s, sent again {:.0} records/s",
            median(&mut fresh),
            median(&mut again)
        );
    }
}
