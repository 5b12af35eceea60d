//! Shared by the integration tests: a server started in-process on port 0, and an API client.

#![allow(dead_code)]

pub mod records;

use std::path::Path;
use std::time::{Duration, Instant};

use lagscope::{Config, Server};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use serde_json::Value;

/// The default configuration, serving from `data_dir` on free loopback ports.
pub fn local_config(data_dir: &Path) -> Config {
    let mut config = Config::default();
    config.server.data_dir = data_dir.to_path_buf();
    config.server.listen = "127.0.0.1:0".to_string();
    config.server.otlp_http = "127.0.0.1:0".to_string();
    config.server.otlp_grpc = "127.0.0.1:0".to_string();
    config
}

pub async fn start_server(data_dir: &Path) -> Server {
    Server::start(&local_config(data_dir)).await.expect("server starts")
}

/// An OTLP attribute with a value.
pub fn kv(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue { key: key.to_string(), value: Some(AnyValue { value: Some(value) }), ..KeyValue::default() }
}

/// An OTLP/HTTP protobuf body of `spans` client spans of sender `sender`'s request number
/// `sequence` (unique ids; starts from `base`, a millisecond apart per request), as the ingest
/// benchmarks send.
pub fn client_spans_body(base: u64, sender: u64, sequence: u64, spans: u64) -> Vec<u8> {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
    use prost::Message;
    let start = base + sequence * 1_000_000;
    let spans = (0..spans)
        .map(|index| {
            let id = ((sender + 1) << 40) | (sequence << 12) | index;
            Span {
                trace_id: u128::from(id).to_be_bytes().to_vec(),
                span_id: (id | 1 << 63).to_be_bytes().to_vec(),
                name: "getFileInfo".to_string(),
                kind: 3,
                start_time_unix_nano: start + index * 1_000,
                end_time_unix_nano: start + index * 1_000 + 400_000,
                attributes: vec![
                    text("lagscope.client.id", &format!("bench-{sender}-{}", index % 4)),
                    text("lagscope.namespace", "ns1"),
                    text("lagscope.op", "read"),
                ],
                ..Span::default()
            }
        })
        .collect();
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![text("service.name", "bench"), text("lagscope.component", "client")],
                ..Resource::default()
            }),
            scope_spans: vec![ScopeSpans { spans, ..ScopeSpans::default() }],
            ..ResourceSpans::default()
        }],
    }
    .encode_to_vec()
}

/// An OTLP string attribute.
pub fn text(key: &str, value: &str) -> KeyValue {
    kv(key, any_value::Value::StringValue(value.to_string()))
}

pub async fn get_json(server: &Server, path_and_query: &str) -> (u16, Value) {
    let response = reqwest::get(format!("http://{}{path_and_query}", server.api_addr)).await.expect("api reachable");
    let status = response.status().as_u16();
    (status, response.json().await.expect("JSON body"))
}

/// Waits until the live analyzer has finished every batch committed so far.
pub async fn wait_until_analyzed(server: &Server) {
    wait_until_analyzed_within(server, Duration::from_secs(10)).await;
}

/// [`wait_until_analyzed`] for runs whose analysis takes longer (large scenarios).
pub async fn wait_until_analyzed_within(server: &Server, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let (_, health) = get_json(server, "/api/v1/health").await;
        let marked = health["analysis"]["batches_marked"].as_u64().unwrap_or(u64::MAX);
        let analyzed = health["analysis"]["batches_analyzed"].as_u64().unwrap_or(0);
        if analyzed >= marked {
            return;
        }
        assert!(Instant::now() < deadline, "the live analyzer is stuck at {analyzed} of {marked} batches");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `lagscope serve` as a separate process (for what only a process can show: SIGKILL, RSS).
/// Killed when dropped, so a failing test leaves no server behind.
pub struct ServeProcess {
    pub child: std::process::Child,
    pub api: String,
    pub otlp_http: String,
    pub otlp_grpc: String,
}

impl ServeProcess {
    /// Starts `lagscope serve` on free loopback ports over `data_dir`, with `config` (TOML) as
    /// its configuration file, and waits until it listens.
    pub fn start(data_dir: &Path, config: &str) -> Self {
        Self::start_with(data_dir, config, &[])
    }

    /// [`ServeProcess::start`] with more arguments to `serve`.
    pub fn start_with(data_dir: &Path, config: &str, arguments: &[&str]) -> Self {
        use std::io::BufRead;
        let config_path = data_dir.with_extension("toml");
        std::fs::write(&config_path, config).expect("config file");
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_lagscope"))
            .args(["serve", "--listen", "127.0.0.1:0", "--otlp-http", "127.0.0.1:0", "--otlp-grpc", "127.0.0.1:0"])
            .arg("--data-dir")
            .arg(data_dir)
            .arg("--config")
            .arg(&config_path)
            .args(arguments)
            .env("RUST_LOG", "warn")
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("lagscope serve starts");
        let stderr = child.stderr.take().expect("stderr");
        let (sender, receiver) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.starts_with("lagscope: API on") {
                    let _ = sender.send(line.clone());
                }
                eprintln!("[serve] {line}");
            }
        });
        let line = receiver.recv_timeout(Duration::from_secs(30)).expect("lagscope serve printed its addresses");
        // lagscope: API on http://A  OTLP/HTTP on http://B  OTLP/gRPC on C  data in D
        let words: Vec<&str> = line.split_whitespace().collect();
        let after = |label: &str| {
            let index = words.iter().position(|word| *word == label).expect(label);
            words[index + 2].trim_start_matches("http://").to_string()
        };
        Self { api: after("API"), otlp_http: after("OTLP/HTTP"), otlp_grpc: after("OTLP/gRPC"), child }
    }

    /// SIGKILL: no shutdown, no flush, no checkpoint.
    pub fn kill(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reaped");
    }

    /// SIGTERM, and waits for the clean shutdown.
    pub fn stop(mut self) {
        let status = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill -TERM");
        assert!(status.success());
        let exit = self.child.wait().expect("reaped");
        assert!(exit.success(), "lagscope serve exited with {exit}");
    }

    /// The process's peak resident set size (VmHWM), in bytes.
    pub fn peak_rss_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).expect("/proc status");
        let line = status.lines().find(|line| line.starts_with("VmHWM:")).expect("VmHWM");
        let kib: u64 = line.split_whitespace().nth(1).and_then(|value| value.parse().ok()).expect("VmHWM value");
        kib * 1024
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Sends `duration_seconds` of the simulator's `scenario` to `server` over OTLP/HTTP and waits
/// (up to 3 minutes) until the live analyzer has caught up.
pub async fn feed_simulator(server: &Server, scenario: &str, duration_seconds: i64) {
    let target = lagscope::sim_cmd::Target::OtlpHttp(format!("http://{}", server.otlp_http_addr));
    let mut config = lagscope_sim::SimConfig::new(scenario);
    config.duration = Some(duration_seconds * lagscope_sim::SECOND);
    tokio::task::spawn_blocking(move || lagscope::sim_cmd::run(&config, &target, false))
        .await
        .expect("join")
        .expect("sim delivers");
    wait_until_analyzed_within(server, Duration::from_secs(180)).await;
}

pub fn int(key: &str, value: i64) -> KeyValue {
    kv(key, any_value::Value::IntValue(value))
}

pub fn resource(component: &str, node: &str) -> Resource {
    Resource {
        attributes: vec![
            text("service.name", "bench"),
            text("lagscope.system", "hdfs-rbf"),
            text("lagscope.cluster", "bench"),
            text("lagscope.component", component),
            text("lagscope.node.id", node),
        ],
        ..Resource::default()
    }
}

pub fn span(trace: u64, id: u64, parent: u64, start: u64, end: u64, attributes: Vec<KeyValue>) -> Span {
    Span {
        trace_id: [trace.to_be_bytes(), 7u64.to_be_bytes()].concat(),
        span_id: id.to_be_bytes().to_vec(),
        parent_span_id: if parent == 0 { Vec::new() } else { parent.to_be_bytes().to_vec() },
        name: "call".to_string(),
        start_time_unix_nano: start,
        end_time_unix_nano: end,
        attributes,
        ..Span::default()
    }
}

/// A write returning 1000 and a read served at 990 by `server` (client `bench-{trial}`, now):
/// one read-your-writes stale read, whole in one request.
pub fn stale_read_request(trial: usize, server: &str) -> ExportTraceServiceRequest {
    let client = format!("bench-{trial}");
    let base =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |now| now.as_nanos() as u64);
    let id = (trial as u64 + 1) * 100;
    let call = |name: &str, op: &str| {
        vec![
            text("lagscope.client.id", &client),
            text("lagscope.call.id", name),
            text("lagscope.namespace", "ns1"),
            text("lagscope.op", op),
        ]
    };
    let mut write = call("w", "write");
    write.push(int("lagscope.state.returned", 1000));
    let mut read = call("r", "read");
    read.push(int("lagscope.state.carried", 1000));
    let clients = ResourceSpans {
        resource: Some(resource("client", "bench-app")),
        scope_spans: vec![ScopeSpans {
            spans: vec![
                span(id, id + 1, 0, base, base + 1_000_000, write),
                span(id + 1, id + 3, 0, base + 2_000_000, base + 3_000_000, read),
            ],
            ..ScopeSpans::default()
        }],
        ..ResourceSpans::default()
    };
    let servers = ResourceSpans {
        resource: Some(resource("server", server)),
        scope_spans: vec![ScopeSpans {
            spans: vec![
                span(id, id + 2, id + 1, base + 100_000, base + 900_000, vec![int("lagscope.state.served", 1000)]),
                span(
                    id + 1,
                    id + 4,
                    id + 3,
                    base + 2_100_000,
                    base + 2_900_000,
                    vec![int("lagscope.state.served", 990)],
                ),
            ],
            ..ScopeSpans::default()
        }],
        ..ResourceSpans::default()
    };
    ExportTraceServiceRequest { resource_spans: vec![clients, servers] }
}

/// Posts [`stale_read_request`] for `trial` (served by `node`) to the server over OTLP/HTTP
/// and returns how long the acknowledgement took: the latency benchmarks' trial start.
pub async fn post_stale_read(client: &reqwest::Client, server: &Server, trial: usize, node: &str) -> Duration {
    use prost::Message;
    let body = stale_read_request(trial, node).encode_to_vec();
    let started = Instant::now();
    let response = client
        .post(format!("http://{}/v1/traces", server.otlp_http_addr))
        .header("content-type", "application/x-protobuf")
        .body(body)
        .send()
        .await
        .expect("post");
    assert!(response.status().is_success(), "{}", response.status());
    started.elapsed()
}

/// The latency benchmarks' background load: the simulator streaming a healthy HDFS cluster
/// (40 clients, 400 ops/s, paced in real time for two minutes) into the server from a thread
/// of its own; returns once it has run for 3 s.
pub async fn start_background_load(server: &Server) {
    let target = lagscope::sim_cmd::Target::OtlpHttp(format!("http://{}", server.otlp_http_addr));
    std::thread::spawn(move || {
        let mut sim = lagscope_sim::SimConfig::new("hdfs-observer-healthy");
        sim.clients = Some(40);
        sim.rate = Some(400.0);
        sim.duration = Some(120 * lagscope_sim::SECOND);
        lagscope::sim_cmd::run(&sim, &target, true)
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
}
