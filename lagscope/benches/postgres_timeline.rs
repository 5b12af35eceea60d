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

use std::time::{Duration, Instant};

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

async fn measure(server: &Server, store: &PgStore, clients: i64, seed: &mut u64) -> (String, String) {
    let client = reqwest::Client::new();
    let mut api = Vec::with_capacity(REQUESTS);
    let mut reads = Vec::with_capacity(REQUESTS);
    for _ in 0..REQUESTS {
        // xorshift: the same clients in every run.
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        let id = format!("client-{}", *seed % clients as u64);
        let started = Instant::now();
        let spans = store.client_spans(&id, TimeRange::ALL, 50_000).await.expect("client spans");
        reads.push(started.elapsed());
        assert_eq!(spans.len() as i64, CALLS_PER_CLIENT * SPANS_PER_CALL, "{id}");
        let started = Instant::now();
        let response = client
            .get(format!("http://{}/api/v1/clients/{id}/timeline", server.api_addr))
            .send()
            .await
            .expect("timeline");
        assert!(response.status().is_success(), "{}", response.status());
        let body: serde_json::Value = response.json().await.expect("JSON");
        api.push(started.elapsed());
        let calls: usize = body["timelines"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|timeline| timeline["calls"].as_array().map_or(0, Vec::len))
            .sum();
        assert_eq!(calls as i64, CALLS_PER_CLIENT, "{id}");
    }
    (summary(api), summary(reads))
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
    let url = postgres_support::fresh_database().await;
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
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut loaded = 0;
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
        let (bytes,): (i64,) = sqlx::query_as(
            "SELECT sum(pg_total_relation_size(inhrelid))::bigint FROM pg_inherits WHERE inhparent = 'spans'::regclass",
        )
        .fetch_one(store.pool())
        .await
        .expect("size");
        let load = load_started.elapsed();
        // Warm up the connection pools, then measure.
        let _ = measure(&server, &store, clients, &mut seed.clone()).await;
        let (api, reads) = measure(&server, &store, clients, &mut seed).await;
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
                    let (api, reads) = measure(&server, &store, clients, &mut fresh).await;
                    row("cold (page cache dropped)", &api, &reads);
                }
                Err(error) => eprintln!("--cold: cannot drop the page cache ({error}); needs root"),
            }
        }
    }
    server.shutdown().await.expect("shutdown");
}
