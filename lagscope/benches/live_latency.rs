//! Live detection latency: time from sending the span that completes a stale read to the
//! anomaly being listed by the API. `cargo bench -p lagscope --bench live_latency`.
//!
//! Each trial posts one OTLP/HTTP request holding a client's write and a later read served
//! below it (client and server spans), then polls `GET /api/v1/anomalies?client=...` every
//! 2 ms. Reported: median and p99 of that latency, next to the median acknowledgement time of
//! the same requests (the baseline measured in the same run), idle and under background load
//! (the simulator streaming `hdfs-observer-healthy` into the same server).
//!
//! `-- --postgres`: on PostgreSQL instead (a throwaway cluster, fsync on, as the tests start
//! it): marks then go through the database and its lease holder (one instance, every shard).

#[path = "../../store/tests/support/postgres.rs"]
mod postgres_support;
#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use lagscope::Server;

const TRIALS: usize = 60;

fn percentile(values: &mut [f64], quantile: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    values[((values.len() - 1) as f64 * quantile).round() as usize]
}

async fn trials(server: &Server, offset: usize) -> (Vec<f64>, Vec<f64>) {
    let client = reqwest::Client::new();
    let mut detect = Vec::new();
    let mut ack = Vec::new();
    for trial in offset..offset + TRIALS {
        let started = Instant::now();
        ack.push(support::post_stale_read(&client, server, trial, "nn-obs1").await.as_secs_f64() * 1e3);
        let url = format!("http://{}/api/v1/anomalies?client=bench-{trial}", server.api_addr);
        loop {
            let listed: serde_json::Value = client.get(&url).send().await.expect("api").json().await.expect("json");
            if listed["anomalies"].as_array().is_some_and(|anomalies| !anomalies.is_empty()) {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(30), "trial {trial}: no anomaly after 30 s");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        detect.push(started.elapsed().as_secs_f64() * 1e3);
    }
    (detect, ack)
}

fn report(label: &str, mut detect: Vec<f64>, mut ack: Vec<f64>) {
    let (median, p99) = (percentile(&mut detect, 0.5), percentile(&mut detect, 0.99));
    let ack_median = percentile(&mut ack, 0.5);
    println!(
        "{label:<28} trials {TRIALS}  detect p50 {median:7.1} ms  p99 {p99:7.1} ms  max {:7.1} ms  ack p50 {ack_median:6.1} ms  detect/ack {:.1}x",
        detect[detect.len() - 1],
        median / ack_median
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let directory = tempfile::tempdir().expect("temp dir");
    let mut config = support::local_config(directory.path());
    if std::env::args().any(|arg| arg == "--postgres") {
        config.server.database_url = Some(postgres_support::fresh_durable_database().await);
        println!("store: PostgreSQL (fsync on)");
        // Let the instance take its leases before the first trial.
        let server = Server::start(&config).await.expect("server");
        tokio::time::sleep(Duration::from_secs(1)).await;
        return measure(server).await;
    }
    println!("store: SQLite");
    measure(Server::start(&config).await.expect("server")).await;
}

async fn measure(server: Server) {
    let (detect, ack) = trials(&server, 0).await;
    report("idle", detect, ack);

    support::start_background_load(&server).await;
    let (detect, ack) = trials(&server, 1_000).await;
    report("under load (400 ops/s sim)", detect, ack);
    // The load thread paces in real time; the process ends here.
    std::process::exit(0);
}
