//! Durable ingest into PostgreSQL against a plain COPY of the same rows, in the same run:
//! `cargo bench -p lagscope --bench postgres_ingest` (needs Debian's postgresql-15, as the
//! tests do; the cluster is started here with fsync on, PostgreSQL's default).
//!
//! 1. For N concurrent senders: a fresh database, `serve --database-url` in-process, OTLP/HTTP
//!    protobuf requests of 200 client spans each, every sender sending its next request when
//!    the previous one is acknowledged (a 200 means committed), for a fixed time: spans/s.
//! 2. The limit: the rows the N = 64 run stored, copied out, then loaded into an empty
//!    database's `spans` table with one plain `COPY ... FROM STDIN` and one commit: rows/s.
//!    The ratio of 1. to 2. is the goal's measure (>= 60%).
//!
//! `-- 64` (or any sender counts) runs only those levels; the comparison uses the last.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[path = "../../store/tests/support/postgres.rs"]
mod postgres_support;
#[path = "../tests/support/mod.rs"]
mod support;

use lagscope::Server;
use sqlx::Connection;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SPANS_PER_REQUEST: u64 = 200;
const SECONDS_PER_LEVEL: u64 = 8;

/// The columns `COPY` moves (every column but the generated id).
const COLUMNS: &str = "trace_id, span_id, parent_span_id, name, kind, start_unix_nano, end_unix_nano, \
    status_code, status_message, service_name, system, cluster, component, node_id, resource_attributes, \
    scope_name, scope_version, scope_attributes, client_id, call_id, attempt, namespace, op, rpc_method, \
    target_node, target_role, node_role, consistency, follower_read, state_carried, state_returned, \
    state_served, state_committed, state_router, outcome, error_type, requeues, retry_delay_ms, bytes, \
    attributes, events, links";

fn now() -> u64 {
    let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970");
    u64::try_from(since_epoch.as_nanos()).expect("before 2262")
}

/// CPU seconds so far: (this process, the whole machine busy), from /proc (Linux clock ticks).
fn cpu_seconds() -> (f64, f64) {
    const TICKS: f64 = 100.0;
    let own = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces): utime and stime are 14 and 15.
    let after = own.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<f64> = after.split_whitespace().map(|field| field.parse().unwrap_or(0.0)).collect();
    let own = fields.get(11).copied().unwrap_or(0.0) + fields.get(12).copied().unwrap_or(0.0);
    let machine = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<f64> = machine
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .map(|field| field.parse().unwrap_or(0.0))
        .collect();
    // user nice system idle iowait irq softirq steal: busy is all but idle and iowait.
    let busy: f64 =
        ticks.iter().take(8).enumerate().filter(|(index, _)| *index != 3 && *index != 4).map(|(_, t)| t).sum();
    (own / TICKS, busy / TICKS)
}

/// Spans/s acknowledged by `serve` on PostgreSQL with `senders` senders; the database's URL.
async fn serve_level(senders: u64) -> (f64, u64, String) {
    let directory = tempfile::tempdir().expect("temp dir");
    let mut config = support::local_config(directory.path());
    let database = postgres_support::fresh_durable_database().await;
    config.server.database_url = Some(database.clone());
    let server = Server::start(&config).await.expect("server");
    let url = format!("http://{}/v1/traces", server.otlp_http_addr);
    let done = Arc::new(AtomicU64::new(0));
    let base = now();
    let cpu_before = cpu_seconds();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(SECONDS_PER_LEVEL);
    let mut tasks = tokio::task::JoinSet::new();
    for sender in 0..senders {
        let (url, done) = (url.clone(), done.clone());
        tasks.spawn(async move {
            let client = reqwest::Client::new();
            let mut sequence = 0;
            while Instant::now() < deadline {
                let response = client
                    .post(&url)
                    .header("content-type", "application/x-protobuf")
                    .body(support::client_spans_body(base, sender, sequence, SPANS_PER_REQUEST))
                    .send()
                    .await
                    .expect("answer");
                assert_eq!(response.status().as_u16(), 200);
                done.fetch_add(1, Ordering::Relaxed);
                sequence += 1;
            }
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.expect("sender");
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu_after = cpu_seconds();
    let (own, busy) = (cpu_after.0 - cpu_before.0, cpu_after.1 - cpu_before.1);
    eprintln!(
        "{senders} senders, CPU over {seconds:.1} s: this process (serve, its live analyzer, the senders) {own:.1} s, \
         other processes (PostgreSQL) {:.1} s, machine busy {busy:.1} s",
        busy - own
    );
    server.shutdown().await.expect("shutdown");
    let spans = done.load(Ordering::Relaxed) * SPANS_PER_REQUEST;
    (spans as f64 / seconds, spans, database)
}

/// Rows/s of one plain COPY (one transaction) of `source`'s spans into an empty database.
async fn plain_copy(source: &str) -> (f64, usize) {
    let mut from = sqlx::PgConnection::connect(source).await.expect("source");
    let mut rows = Vec::new();
    {
        use futures::TryStreamExt;
        let mut stream =
            from.copy_out_raw(&format!("COPY (SELECT {COLUMNS} FROM spans) TO STDOUT")).await.expect("copy out");
        while let Some(chunk) = stream.try_next().await.expect("chunk") {
            rows.extend_from_slice(&chunk);
        }
    }
    let count = rows.iter().filter(|byte| **byte == b'\n').count();
    let target = postgres_support::fresh_durable_database().await;
    lagscope_store::PgStore::connect(&target).await.expect("schema").close().await;
    let mut to = sqlx::PgConnection::connect(&target).await.expect("target");
    let started = Instant::now();
    let mut transaction = to.begin().await.expect("begin");
    let mut copy = transaction.copy_in_raw(&format!("COPY spans ({COLUMNS}) FROM STDIN")).await.expect("copy in");
    for chunk in rows.chunks(1 << 20) {
        copy.send(chunk).await.expect("send");
    }
    copy.finish().await.expect("finish");
    transaction.commit().await.expect("commit");
    (count as f64 / started.elapsed().as_secs_f64(), count)
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    println!(
        "durable OTLP/HTTP ingest into PostgreSQL (fsync on), {SPANS_PER_REQUEST} spans per request, \
         {SECONDS_PER_LEVEL} s per level"
    );
    println!("senders      spans/s   spans stored");
    // `-- 64` runs only the levels given (the comparison uses the last one).
    let mut levels: Vec<u64> = std::env::args().skip(1).filter_map(|arg| arg.parse().ok()).collect();
    if levels.is_empty() {
        levels = vec![1, 16, 64];
    }
    let mut last = None;
    for senders in levels.iter().copied() {
        let (rate, spans, database) = runtime.block_on(serve_level(senders));
        println!("{senders:>7}  {rate:>11.0}  {spans:>13}");
        last = Some((rate, database));
    }
    let (rate, database) = last.expect("a level ran");
    let (copy_rate, rows) = runtime.block_on(plain_copy(&database));
    println!("plain COPY of the same {rows} rows (one statement, one commit): {copy_rate:.0} rows/s");
    println!("serve at {} senders / plain COPY = {:.0}%", levels[levels.len() - 1], 100.0 * rate / copy_rate);
}
