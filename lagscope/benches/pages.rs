//! Server-side rendering time of every page with millions of spans in the store:
//! `cargo bench -p lagscope --bench pages [-- DURATION]` (the simulated length of the `mixed`
//! scenario; default `4000s`, about 10 million spans).
//!
//! Loading (once; kept in `$LAGSCOPE_BENCH_DIR/pages-mixed-DURATION`, default
//! `~/.cache/lagscope-bench`): the simulator writes `mixed` as OTLP JSON lines, then `serve`
//! in-process over an embedded SQLite store takes them over OTLP/HTTP from 8 concurrent
//! senders, the live analyzer storing what it finds (and the read rollups); then the service
//! is stopped. Measuring: `serve` again over that store (nothing arriving), and each page requested
//! over HTTP, one request at a time: the overview, each dashboard, the pages of 20 anomalies and
//! of 20 clients drawn at random (seeded), `ROUNDS` times each. Reported per page: p50, p99,
//! max, and the p50 against the baseline measured in the same run (the 404 page of an unknown
//! anomaly: the template and one indexed read, the floor of any page).

use std::path::PathBuf;
use std::time::{Duration, Instant};

#[path = "../tests/support/mod.rs"]
mod support;

use lagscope::Server;
use lagscope_sim::{SECOND, SimConfig};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const ROUNDS: usize = 20;
const SAMPLED: usize = 20;

fn percentile(sorted: &[Duration], fraction: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * fraction).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// A small deterministic generator for picking anomalies and clients.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, bound: usize) -> usize {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) as usize) % bound.max(1)
    }
}

async fn get(client: &reqwest::Client, url: &str) -> (u16, usize, Duration) {
    let started = Instant::now();
    let response = client.get(url).send().await.expect("request");
    let status = response.status().as_u16();
    let body = response.bytes().await.expect("body");
    (status, body.len(), started.elapsed())
}

/// OTLP/HTTP requests in flight at once while loading.
const SENDERS: usize = 8;

/// Hands the simulator's requests, encoded as OTLP protobuf, to the senders.
struct Encoder(tokio::sync::mpsc::Sender<(&'static str, Vec<u8>)>);

impl lagscope_sim::Sink for Encoder {
    fn export(&mut self, _at: lagscope_sim::Nanos, request: lagscope_sim::Request) {
        self.0.blocking_send(lagscope::sim_cmd::otlp_http_body(&request)).expect("senders alive");
    }
}

/// Loads the store: the simulator runs `mixed` as fast as it can, and `SENDERS` concurrent
/// senders post its requests (OTLP/HTTP protobuf, in the order made, so a call's hops arrive
/// close together) to `serve`, again after 429/503 as an OTLP exporter does; then the live
/// analyzer is waited for.
async fn load(data_dir: &std::path::Path, seconds: i64) {
    let started = Instant::now();
    eprintln!(
        "loading: mixed for {seconds} s over OTLP/HTTP from {SENDERS} senders into {} (once)",
        data_dir.display()
    );
    let server = Server::start(&support::local_config(data_dir)).await.expect("serve");
    let base = format!("http://{}", server.otlp_http_addr);
    let client = reqwest::Client::new();
    let (sender, receiver) = tokio::sync::mpsc::channel(SENDERS * 4);
    let receiver = std::sync::Arc::new(tokio::sync::Mutex::new(receiver));
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut senders = tokio::task::JoinSet::new();
    for _ in 0..SENDERS {
        let (receiver, client, base, sent) = (receiver.clone(), client.clone(), base.clone(), sent.clone());
        senders.spawn(async move {
            loop {
                let next = receiver.lock().await.recv().await;
                let Some((path, body)) = next else { return };
                post(&client, &format!("{base}{path}"), body).await;
                let count = sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                if count % 100_000 == 0 {
                    eprintln!("  {count} requests acknowledged after {:.0} s", started.elapsed().as_secs_f64());
                }
            }
        });
    }
    let mut config = SimConfig::new("mixed");
    config.duration = Some(seconds * SECOND);
    let simulated = tokio::task::spawn_blocking(move || lagscope_sim::run(&config, &mut Encoder(sender)));
    let truth = simulated.await.expect("join").expect("sim");
    while let Some(done) = senders.join_next().await {
        done.expect("sender");
    }
    eprintln!(
        "  {} requests ({} spans) acknowledged after {:.0} s; waiting for the live analyzer",
        sent.load(std::sync::atomic::Ordering::Relaxed),
        truth.figures["spans"],
        started.elapsed().as_secs_f64()
    );
    support::wait_until_analyzed_within(&server, Duration::from_secs(24 * 3600)).await;
    eprintln!("  analyzed after {:.0} s", started.elapsed().as_secs_f64());
    server.shutdown().await.expect("shutdown");
}

/// Posts one OTLP/HTTP protobuf request, again while the service answers 429 or 503 (it has
/// not taken the request).
async fn post(client: &reqwest::Client, url: &str, body: Vec<u8>) {
    loop {
        let response = client
            .post(url)
            .header("content-type", "application/x-protobuf")
            .body(body.clone())
            .send()
            .await
            .expect("post");
        match response.status().as_u16() {
            200..=299 => return,
            429 | 503 => tokio::time::sleep(Duration::from_millis(50)).await,
            status => panic!("{url} answered {status}: {}", response.text().await.unwrap_or_default()),
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let duration = std::env::args().skip(1).find(|arg| !arg.starts_with('-')).unwrap_or_else(|| "4000s".to_string());
    let seconds: i64 = duration.trim_end_matches('s').parse().expect("DURATION in seconds, e.g. 4000s");
    let bench_dir = std::env::var_os("LAGSCOPE_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").expect("HOME")).join(".cache/lagscope-bench"));
    let data_dir = bench_dir.join(format!("pages-mixed-{seconds}s"));
    let loaded_marker = data_dir.join("loaded");
    if !loaded_marker.exists() {
        let _ = std::fs::remove_dir_all(&data_dir);
        std::fs::create_dir_all(&data_dir).expect("data dir");
        load(&data_dir, seconds).await;
        std::fs::write(&loaded_marker, "loaded").expect("marker");
    }

    let server = Server::start(&support::local_config(&data_dir)).await.expect("serve");
    let base = format!("http://{}", server.api_addr);
    let client = reqwest::Client::new();
    let health: serde_json::Value =
        client.get(format!("{base}/api/v1/health")).send().await.expect("health").json().await.expect("json");
    eprintln!(
        "store: {} spans, {} samples, {} anomalies ({})",
        health["store"]["spans"],
        health["store"]["samples"],
        health["store"]["anomalies"],
        data_dir.display()
    );

    // What to request: fixed pages, then anomalies and clients drawn at random.
    let mut pages: Vec<(String, String)> = vec![("not found (baseline)".to_string(), "/anomalies/0".to_string())];
    pages.push(("overview".to_string(), "/".to_string()));
    for slug in ["lag", "routers", "shards", "failover"] {
        pages.push((format!("dashboard {slug}"), format!("/dashboards/{slug}")));
    }
    let total = health["store"]["anomalies"].as_i64().expect("anomaly count").max(1);
    let mut random = Lcg(7);
    for _ in 0..SAMPLED {
        // The newest anomaly below a random id: one that exists.
        let below = 2 + random.below(total as usize);
        let found: serde_json::Value = client
            .get(format!("{base}/api/v1/anomalies?limit=1&before={below}"))
            .send()
            .await
            .expect("anomalies")
            .json()
            .await
            .expect("json");
        let id = found["anomalies"][0]["id"].as_i64().expect("an anomaly");
        pages.push(("anomaly".to_string(), format!("/anomalies/{id}")));
    }
    let clients: serde_json::Value = client
        .get(format!("{base}/api/v1/clients?limit=1000"))
        .send()
        .await
        .expect("clients")
        .json()
        .await
        .expect("json");
    let clients: Vec<String> = serde_json::from_value(clients["clients"].clone()).expect("ids");
    for _ in 0..SAMPLED {
        let id = &clients[random.below(clients.len())];
        pages.push(("client timeline".to_string(), format!("/clients/{}", lagscope_web::ui::encode_path(id))));
    }

    // LAGSCOPE_BENCH_PAGES=overview,client: only the pages whose kind contains one of these.
    if let Ok(only) = std::env::var("LAGSCOPE_BENCH_PAGES") {
        let wanted: Vec<&str> = only.split(',').collect();
        pages.retain(|(kind, _)| kind.starts_with("not found") || wanted.iter().any(|w| kind.contains(w)));
    }
    // Warm-up: each page once.
    for (_, path) in &pages {
        get(&client, &format!("{base}{path}")).await;
    }
    let mut by_kind: Vec<(String, Vec<Duration>, usize)> = Vec::new();
    for _ in 0..ROUNDS {
        for (kind, path) in &pages {
            let (status, bytes, took) = get(&client, &format!("{base}{path}")).await;
            let expected = if kind.starts_with("not found") { 404 } else { 200 };
            assert_eq!(status, expected, "{path}");
            match by_kind.iter_mut().find(|(name, _, _)| name == kind) {
                Some((_, times, size)) => {
                    times.push(took);
                    *size = (*size).max(bytes);
                }
                None => by_kind.push((kind.clone(), vec![took], bytes)),
            }
        }
    }
    let baseline = {
        let mut times = by_kind[0].1.clone();
        times.sort();
        percentile(&times, 0.5)
    };
    println!("| page | requests | p50 | p99 | max | p50 / baseline | largest page |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for (kind, mut times, size) in by_kind {
        times.sort();
        let p50 = percentile(&times, 0.5);
        println!(
            "| {kind} | {} | {:.1} ms | {:.1} ms | {:.1} ms | {:.1}x | {} kB |",
            times.len(),
            ms(p50),
            ms(percentile(&times, 0.99)),
            ms(*times.last().expect("times")),
            p50.as_secs_f64() / baseline.as_secs_f64().max(1e-9),
            size / 1024
        );
    }
    server.shutdown().await.expect("shutdown");
}
