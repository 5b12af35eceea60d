//! A client's timeline from PostgreSQL as the spans table grows:
//! `cargo bench -p lagscope --bench postgres_timeline [-- SIZE...]` (sizes in spans, default
//! `1000000 10000000`; needs Debian's postgresql-15, as the tests do).
//!
//! The table is filled server-side (`INSERT ... SELECT ... generate_series`, through the
//! partitioned parent and all of its indexes, as ingest writes) with calls of three spans
//! each: the client's (naming the client), the router's and the server's (naming none, joined
//! by trace id), spread over the last day, 300 spans per client whatever the size: what grows
//! is the table, not the answer. At each size: `VACUUM (ANALYZE)`, then 300 requests of
//! `GET /api/v1/clients/{id}/timeline` for clients drawn at random (seeded), through `serve
//! --database-url` in-process, and the store's `client_spans` read alone: p50, p99, max.
//!
//! `-- --cold`: also after dropping the kernel's page cache (root only), for clients not
//! read before: what a table larger than memory costs (PostgreSQL's own 128 MB of shared
//! buffers stay).
//!
//! `LAGSCOPE_BENCH_DATABASE_URL=postgres://...`: use that database and keep it, loading only
//! the spans it lacks, so one load serves many runs (sizes must then only grow).
//!
//! `LAGSCOPE_BENCH_SEED=N` draws other clients (for reruns on a kept database).
//!
//! The slowest store reads of each pass are listed (stderr) with their place in the pass. With
//! `LAGSCOPE_BENCH_EXPLAIN_MS=N`, PostgreSQL's `auto_explain` logs the plan of every statement
//! slower than N ms with its buffers and I/O times (`track_io_timing`), and the server's log is
//! copied to `postgres-timeline-server.log` in the system's temp dir at the end.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[path = "../../store/tests/support/postgres.rs"]
mod postgres_support;
#[path = "../tests/support/mod.rs"]
mod support;

use lagscope::Server;
use lagscope_store::{PgStore, Store, TimeRange};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SPANS_PER_CALL: i64 = 3;
const CALLS_PER_CLIENT: i64 = 100;
const REQUESTS: usize = 300;
/// Calls inserted per statement (progress is printed after each).
const CALLS_PER_CHUNK: i64 = 500_000;
const DAY: i64 = 86_400 * 1_000_000_000;

fn percentile(sorted: &[Duration], fraction: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * fraction).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

fn summary(mut latencies: Vec<Duration>) -> String {
    latencies.sort();
    let ms = |duration: Duration| duration.as_secs_f64() * 1e3;
    format!(
        "p50 {:.1} ms  p99 {:.1} ms  max {:.1} ms",
        ms(percentile(&latencies, 0.5)),
        ms(percentile(&latencies, 0.99)),
        ms(*latencies.last().expect("latencies"))
    )
}

/// Clients active at once: their calls interleave (block by block of `ACTIVE_CLIENTS * 100`
/// calls), so one client's spans lie scattered over the table as real ingest leaves them.
const ACTIVE_CLIENTS: i64 = 1_000;

/// Inserts calls `[from, to)` of a table holding `total_calls` calls in the end.
async fn insert_calls(pool: &sqlx::PgPool, from: i64, to: i64, total_calls: i64, start: i64) {
    let step = DAY / total_calls.max(1);
    sqlx::query(
        "INSERT INTO spans (trace_id, span_id, parent_span_id, name, kind, start_unix_nano, end_unix_nano,
             status_code, service_name, system, cluster, component, node_id, client_id, call_id, attempt,
             namespace, op, rpc_method, target_node, state_carried, state_served, state_returned, outcome,
             resource_attributes, scope_attributes, attributes, events, links)
         SELECT lpad(to_hex(c), 32, '0'),
                lpad(to_hex(c * 4 + h), 16, '0'),
                CASE WHEN h = 0 THEN NULL ELSE lpad(to_hex(c * 4 + h - 1), 16, '0') END,
                'getBlockLocations',
                CASE WHEN h = 2 THEN 2 ELSE 3 END,
                $3 + c * $4 + h * 100000,
                $3 + c * $4 + h * 100000 + 2000000,
                0,
                CASE h WHEN 0 THEN 'hdfs-client' WHEN 1 THEN 'router' ELSE 'namenode' END,
                'hdfs-rbf', 'prod',
                CASE h WHEN 0 THEN 'client' WHEN 1 THEN 'router' ELSE 'server' END,
                CASE h WHEN 0 THEN NULL WHEN 1 THEN 'router-' || (c % 4) ELSE 'nn-' || (c % 3) END,
                CASE WHEN h = 0 THEN 'client-' || ((c / ($5 * 100)) * $5 + c % $5) END,
                'call-' || c, 1, 'ns' || (c % 8), 'read', 'getBlockLocations',
                CASE WHEN h = 0 THEN NULL ELSE 'nn-' || (c % 3) END,
                c, c, CASE WHEN h <> 1 THEN c END, 'ok',
                '{\"host.name\":\"worker\"}', '{}', '{\"rpc.system\":\"hadoop\"}', '[]', '[]'
         FROM generate_series($1::bigint, $2::bigint - 1) AS c, generate_series(0, 2) AS h",
    )
    .bind(from)
    .bind(to)
    .bind(start)
    .bind(step)
    .bind(ACTIVE_CLIENTS)
    .execute(pool)
    .await
    .expect("insert");
}

/// The slowest reads of a pass: their place in it (0 is the first request), when they started
/// (UTC time of day, to find them in PostgreSQL's log) and how long they took.
fn slowest(reads: &[(SystemTime, Duration)]) -> String {
    let mut ranked: Vec<(usize, &(SystemTime, Duration))> = reads.iter().enumerate().collect();
    ranked.sort_by_key(|(_, (_, latency))| std::cmp::Reverse(*latency));
    ranked
        .iter()
        .take(6)
        .map(|(at, (started, latency))| {
            let since_midnight = started.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs_f64() % 86_400.0;
            let (hours, minutes) = ((since_midnight / 3600.0) as u32, (since_midnight % 3600.0 / 60.0) as u32);
            format!(
                "#{at} at {hours:02}:{minutes:02}:{:06.3} {:.1} ms",
                since_midnight % 60.0,
                latency.as_secs_f64() * 1e3
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Has every new session of the bench's database log the plans of statements slower than
/// `threshold_ms`, with buffers and I/O times.
async fn explain_slow_statements(url: &str, threshold_ms: u64) {
    let (_, database) = url.rsplit_once('/').expect("a database URL");
    let mut connection = <sqlx::PgConnection as sqlx::Connection>::connect(url).await.expect("connect");
    for setting in [
        "session_preload_libraries = 'auto_explain'".to_string(),
        format!("auto_explain.log_min_duration = {threshold_ms}"),
        "auto_explain.log_analyze = on".to_string(),
        "auto_explain.log_buffers = on".to_string(),
        "track_io_timing = on".to_string(),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(format!("ALTER DATABASE {database} SET {setting}")))
            .execute(&mut connection)
            .await
            .expect("set");
    }
}

/// The store's read of a client's spans: when it started, how long it took.
async fn store_read(store: &PgStore, id: &str) -> (SystemTime, Duration) {
    let (wall, started) = (SystemTime::now(), Instant::now());
    let spans = store.client_spans(id, TimeRange::ALL, 50_000).await.expect("client spans");
    let timed = (wall, started.elapsed());
    assert_eq!(spans.len() as i64, CALLS_PER_CLIENT * SPANS_PER_CALL, "{id}");
    timed
}

/// `GET /api/v1/clients/{id}/timeline`, the body read: when it started, how long it took.
async fn api_request(client: &reqwest::Client, server: &Server, id: &str) -> (SystemTime, Duration) {
    let (wall, started) = (SystemTime::now(), Instant::now());
    let response =
        client.get(format!("http://{}/api/v1/clients/{id}/timeline", server.api_addr)).send().await.expect("timeline");
    assert!(response.status().is_success(), "{}", response.status());
    let body: serde_json::Value = response.json().await.expect("JSON");
    let timed = (wall, started.elapsed());
    let calls: usize = body["timelines"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|timeline| timeline["calls"].as_array().map_or(0, Vec::len))
        .sum();
    assert_eq!(calls as i64, CALLS_PER_CLIENT, "{id}");
    timed
}

/// `REQUESTS` clients drawn from `seed`, each read through the store and through the API
/// (the API first when `api_first`: the second request of a client finds its pages cached).
async fn measure(server: &Server, store: &PgStore, clients: i64, seed: &mut u64, api_first: bool) -> (String, String) {
    let client = reqwest::Client::new();
    let mut api = Vec::with_capacity(REQUESTS);
    let mut reads = Vec::with_capacity(REQUESTS);
    for _ in 0..REQUESTS {
        // xorshift: the same clients in every run.
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        let id = format!("client-{}", *seed % clients as u64);
        if api_first {
            api.push(api_request(&client, server, &id).await);
            reads.push(store_read(store, &id).await);
        } else {
            reads.push(store_read(store, &id).await);
            api.push(api_request(&client, server, &id).await);
        }
    }
    eprintln!("slowest store reads: {}", slowest(&reads));
    eprintln!("slowest API requests: {}", slowest(&api));
    let latencies = |timed: Vec<(SystemTime, Duration)>| timed.into_iter().map(|(_, latency)| latency).collect();
    (summary(latencies(api)), summary(latencies(reads)))
}

#[tokio::main]
async fn main() {
    let cold = std::env::args().any(|arg| arg == "--cold");
    let mut sizes: Vec<i64> =
        std::env::args().skip(1).filter(|arg| !arg.starts_with('-')).filter_map(|arg| arg.parse().ok()).collect();
    if sizes.is_empty() {
        sizes = vec![1_000_000, 10_000_000];
    }
    sizes.sort_unstable();
    let largest_calls = sizes.last().copied().unwrap_or(0) / SPANS_PER_CALL;
    // A database to keep between runs (loaded once, measured many times), or a fresh one.
    let kept = std::env::var("LAGSCOPE_BENCH_DATABASE_URL").ok().filter(|url| !url.is_empty());
    let url = match &kept {
        Some(url) => url.clone(),
        None => postgres_support::fresh_database().await,
    };
    let explain_ms: Option<u64> = std::env::var("LAGSCOPE_BENCH_EXPLAIN_MS").ok().and_then(|ms| ms.parse().ok());
    if let Some(threshold_ms) = explain_ms {
        explain_slow_statements(&url, threshold_ms).await;
    }
    let store = PgStore::connect(&url).await.expect("PostgreSQL");
    let directory = tempfile::tempdir().expect("temp dir");
    let mut config = support::local_config(directory.path());
    config.server.database_url = Some(url.clone());
    let server = Server::start(&config).await.expect("server");
    let start = i64::try_from(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_nanos(),
    )
    .expect("before 2262")
        - DAY;
    // Another seed, other clients: a rerun on a kept database reads pages no run read before
    // (not even into the disk's own caches below this machine).
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64
        ^ std::env::var("LAGSCOPE_BENCH_SEED").ok().and_then(|seed| seed.parse::<u64>().ok()).unwrap_or(0);
    // What a kept database already holds (the bench only ever appends whole calls).
    let mut loaded = if kept.is_some() {
        let (spans,): (i64,) =
            sqlx::query_as("SELECT count(*) FROM spans").fetch_one(store.pool()).await.expect("count");
        eprintln!("{url} holds {spans} spans already");
        spans / SPANS_PER_CALL
    } else {
        0
    };
    println!("| spans stored | clients | table + indexes | load | cache | timeline API | store read (client_spans) |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for size in sizes {
        let calls = size / SPANS_PER_CALL;
        // Every client of a complete block has made its 100 calls.
        let block = ACTIVE_CLIENTS * CALLS_PER_CLIENT;
        let clients = (calls / block).max(1) * ACTIVE_CLIENTS;
        let load_started = Instant::now();
        while loaded < calls {
            let to = (loaded + CALLS_PER_CHUNK).min(calls);
            insert_calls(store.pool(), loaded, to, largest_calls, start).await;
            loaded = to;
            eprintln!("loaded {} spans ({:.0} s)", loaded * SPANS_PER_CALL, load_started.elapsed().as_secs_f64());
        }
        // What autovacuum does to an append-only table after a load (inserts trigger it since
        // PostgreSQL 13): statistics, and the visibility map that lets the (client, start)
        // index answer without the heap. Run here so the figures do not depend on whether it
        // got there first.
        sqlx::query("VACUUM (ANALYZE) spans").execute(store.pool()).await.expect("vacuum");
        // Written out now rather than by a checkpoint spread over the reads measured next.
        sqlx::query("CHECKPOINT").execute(store.pool()).await.expect("checkpoint");
        let (bytes,): (i64,) = sqlx::query_as(
            "SELECT sum(pg_total_relation_size(inhrelid))::bigint FROM pg_inherits WHERE inhparent = 'spans'::regclass",
        )
        .fetch_one(store.pool())
        .await
        .expect("size");
        let load = load_started.elapsed();
        // Warm up the connection pools, then measure.
        let _ = measure(&server, &store, clients, &mut seed.clone(), false).await;
        let (api, reads) = measure(&server, &store, clients, &mut seed, false).await;
        let row = |cache: &str, api: &str, reads: &str| {
            println!(
                "| {} | {clients} | {:.1} GiB ({:.0} B/span) | {:.0} s | {cache} | {api} | {reads} |",
                loaded * SPANS_PER_CALL,
                bytes as f64 / f64::from(1 << 30),
                bytes as f64 / (loaded * SPANS_PER_CALL) as f64,
                load.as_secs_f64()
            );
        };
        row("warm", &api, &reads);
        if cold {
            let _ = std::process::Command::new("sync").status();
            match std::fs::write("/proc/sys/vm/drop_caches", "3") {
                Ok(()) => {
                    // Clients no request has read yet.
                    let mut fresh = seed ^ 0x5555_5555_5555_5555;
                    let (api, reads) = measure(&server, &store, clients, &mut fresh, false).await;
                    row("cold (page cache dropped), store read first", &api, &reads);
                    // Again with other clients, the API's request first: a cold timeline
                    // request whole (store reads, metrics, building, JSON).
                    let _ = std::process::Command::new("sync").status();
                    if std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok() {
                        let mut fresh = seed ^ 0x2aaa_aaaa_aaaa_aaaa;
                        let (api, reads) = measure(&server, &store, clients, &mut fresh, true).await;
                        row("cold (page cache dropped), API request first", &api, &reads);
                    }
                }
                Err(error) => eprintln!("--cold: cannot drop the page cache ({error}); needs root"),
            }
        }
    }
    if explain_ms.is_some() {
        let (data,): (String,) =
            sqlx::query_as("SELECT current_setting('data_directory')").fetch_one(store.pool()).await.expect("data dir");
        let log = std::path::Path::new(&data).with_file_name("server.log");
        let copy = std::env::temp_dir().join("postgres-timeline-server.log");
        match std::fs::copy(&log, &copy) {
            Ok(_) => eprintln!("PostgreSQL's log (slow statements' plans): {}", copy.display()),
            Err(error) => eprintln!("cannot copy {}: {error}", log.display()),
        }
    }
    server.shutdown().await.expect("shutdown");
}
