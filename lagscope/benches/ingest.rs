//! Durable ingest throughput and what group commit buys:
//! `cargo bench -p lagscope --bench ingest`.
//!
//! A fresh `serve` (in-process, SQLite with `synchronous=FULL`: a 200 means committed) takes
//! OTLP/HTTP protobuf requests of 200 client spans each from N concurrent senders, each
//! sending its next request when the previous one is acknowledged, for a fixed time. Reported
//! per N: requests/s, spans/s, requests per store transaction (group commit's effect), and the
//! median and p99 acknowledgement time. The baseline is N = 1 in the same run, where no two
//! requests can share a transaction: the ratio column is spans/s against it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[path = "../tests/support/mod.rs"]
mod support;

use lagscope::Server;

/// The allocator `lagscope serve` runs with.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SPANS_PER_REQUEST: u64 = 200;
const SECONDS_PER_LEVEL: u64 = 6;

fn percentile(sorted: &[Duration], fraction: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * fraction).round() as usize]
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines().find_map(|line| line.strip_prefix(name)?.trim().parse().ok()).unwrap_or(0.0)
}

struct Level {
    senders: u64,
    requests: u64,
    seconds: f64,
    per_commit: f64,
    p50: Duration,
    p99: Duration,
}

async fn level(senders: u64) -> Level {
    let directory = tempfile::tempdir().expect("temp dir");
    let server = Server::start(&support::local_config(directory.path())).await.expect("server");
    let url = format!("http://{}/v1/traces", server.otlp_http_addr);
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(SECONDS_PER_LEVEL);
    let mut tasks = tokio::task::JoinSet::new();
    for sender in 0..senders {
        let (url, done) = (url.clone(), done.clone());
        tasks.spawn(async move {
            let client = reqwest::Client::new();
            let mut latencies = Vec::new();
            let mut sequence = 0;
            while Instant::now() < deadline {
                let payload =
                    support::client_spans_body(1_764_435_600_000_000_000, sender, sequence, SPANS_PER_REQUEST);
                let sent = Instant::now();
                let response = client
                    .post(&url)
                    .header("content-type", "application/x-protobuf")
                    .body(payload)
                    .send()
                    .await
                    .expect("answer");
                assert_eq!(response.status().as_u16(), 200);
                latencies.push(sent.elapsed());
                done.fetch_add(1, Ordering::Relaxed);
                sequence += 1;
            }
            latencies
        });
    }
    let mut latencies = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        latencies.extend(joined.expect("sender"));
    }
    let seconds = started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let metrics =
        reqwest::get(format!("http://{}/metrics", server.api_addr)).await.expect("metrics").text().await.expect("text");
    let commits = metric(&metrics, "lagscope_ingest_commits_total ");
    let committed = metric(&metrics, "lagscope_ingest_committed_requests_total ");
    server.shutdown().await.expect("shutdown");
    Level {
        senders,
        requests: done.load(Ordering::Relaxed),
        seconds,
        per_commit: committed / commits.max(1.0),
        p50: percentile(&latencies, 0.5),
        p99: percentile(&latencies, 0.99),
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    println!(
        "durable OTLP/HTTP ingest, {SPANS_PER_REQUEST} spans per request, {SECONDS_PER_LEVEL} s per level, SQLite synchronous=FULL"
    );
    println!("senders  requests/s    spans/s  vs 1 sender  requests/commit  ack p50    ack p99");
    let mut baseline = None;
    for senders in [1, 4, 16, 64] {
        let level = runtime.block_on(level(senders));
        let spans_per_second = level.requests as f64 * SPANS_PER_REQUEST as f64 / level.seconds;
        let base = *baseline.get_or_insert(spans_per_second);
        println!(
            "{:>7}  {:>10.0}  {:>9.0}  {:>10.2}x  {:>15.2}  {:>7.1?}  {:>8.1?}",
            level.senders,
            level.requests as f64 / level.seconds,
            spans_per_second,
            spans_per_second / base,
            level.per_commit,
            level.p50,
            level.p99,
        );
    }
}
