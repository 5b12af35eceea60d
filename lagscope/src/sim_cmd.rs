//! `lagscope sim`: runs a scenario and sends its telemetry to a file or an OTLP endpoint.

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use lagscope_sim::native::NativeState;
use lagscope_sim::{Nanos, Request, SimConfig, Sink, Truth};
use prost::Message;

use crate::delivery::{Delivered, Delivery};
use crate::output::Replacement;
use crate::progress::{Position, Progress, Reporter};

/// Where the simulated telemetry goes.
#[derive(Debug, Clone)]
pub enum Target {
    JsonLines(PathBuf),
    /// Length-prefixed protobuf requests, as the Collector's file exporter writes with
    /// `format: proto` (`.binpb`).
    Proto(PathBuf),
    /// lagscope's compact analysis capture (`.lscap`).
    Lscap(PathBuf),
    OtlpHttp(String),
    OtlpGrpc(String),
}

/// Encodes a request as one line of OTLP JSON, as the Collector's file exporter writes it.
pub fn json_line(request: &Request) -> String {
    let encoded = match request {
        Request::Traces(request) => serde_json::to_string(request),
        Request::Metrics(request) => serde_json::to_string(request),
        Request::Logs(request) => serde_json::to_string(request),
    };
    // Serializing generated protobuf structs to a string cannot fail.
    encoded.unwrap_or_default()
}

/// Writes requests as the Collector's file exporter does: JSON lines, or (`proto`) each
/// request as protobuf after its length (4 bytes, big-endian); remembers the first write error.
struct FileSink<W: Write> {
    out: W,
    proto: bool,
    error: Option<std::io::Error>,
    requests: u64,
    /// When pacing in real time: when the run started.
    started: Option<Instant>,
}

impl<W: Write> Sink for FileSink<W> {
    fn export(&mut self, at: Nanos, request: Request) {
        if self.error.is_some() {
            return;
        }
        if let Some(started) = self.started {
            let due = started + Duration::from_nanos(at.max(0) as u64);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            // A paced file is read as it grows (tail -f): hand each batch over at once.
            if let Err(error) = self.out.flush() {
                self.error = Some(error);
                return;
            }
        }
        let written = if self.proto {
            let body = otlp_http_body(&request).1;
            let length = u32::try_from(body.len()).unwrap_or(u32::MAX).to_be_bytes();
            self.out.write_all(&length).and_then(|()| self.out.write_all(&body))
        } else {
            let mut line = json_line(&request);
            line.push('\n');
            self.out.write_all(line.as_bytes())
        };
        match written {
            Ok(()) => self.requests += 1,
            Err(error) => self.error = Some(error),
        }
    }
}

/// Converts requests to lagscope's records and writes them as lscap; remembers the first
/// error.
struct LscapSink<W: Write> {
    writer: crate::lscap::LscapWriter<W>,
    error: Option<anyhow::Error>,
    requests: u64,
}

impl<W: Write> Sink for LscapSink<W> {
    fn export(&mut self, _at: Nanos, request: Request) {
        if self.error.is_some() {
            return;
        }
        let written = match &request {
            Request::Traces(request) => {
                let converted = lagscope_collector::otlp::spans_from_request(request);
                converted.items.iter().try_for_each(|span| self.writer.span(span))
            }
            Request::Metrics(request) => {
                let converted = lagscope_collector::otlp::samples_from_request(request);
                converted.items.iter().try_for_each(|sample| self.writer.sample(sample))
            }
            // The lines the analyzer recognises (a capture keeps those, not every record).
            Request::Logs(request) => {
                let converted = lagscope_collector::otlp::logs_from_request(request);
                converted.items.iter().try_for_each(|log| self.writer.log(log))
            }
        };
        match written {
            Ok(()) => self.requests += 1,
            Err(error) => self.error = Some(error.into()),
        }
    }
}

/// Hands requests to the network sender, pacing them in real time when asked.
struct ChannelSink {
    sender: tokio::sync::mpsc::Sender<(Nanos, Request)>,
    closed: bool,
}

impl Sink for ChannelSink {
    fn export(&mut self, at: Nanos, request: Request) {
        if !self.closed && self.sender.blocking_send((at, request)).is_err() {
            // The sender stopped on an error; it reports it.
            self.closed = true;
        }
    }
}

/// Shares the latest metric values with the native endpoints while passing requests on, and
/// reports how far the run is.
struct Tee<'a> {
    inner: &'a mut dyn Sink,
    native: Option<NativeHandle>,
    progress: Reporter,
    /// The run's length, when it was given; the latest simulated time exported; spans so far.
    length: Option<Nanos>,
    latest: Nanos,
    spans: u64,
}

impl<'a> Tee<'a> {
    fn new(inner: &'a mut dyn Sink, native: Option<NativeHandle>, config: &SimConfig, progress: Progress) -> Self {
        Self {
            inner,
            native,
            progress: Reporter::new("sim", progress, 1),
            length: config.duration,
            latest: 0,
            spans: 0,
        }
    }
}

impl Sink for Tee<'_> {
    fn export(&mut self, at: Nanos, request: Request) {
        if let Some(native) = &self.native {
            native.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).observe(&request);
        }
        if self.progress.active() {
            if let Request::Traces(traces) = &request {
                let spans = traces.resource_spans.iter().flat_map(|resource| &resource.scope_spans);
                self.spans += spans.map(|scope| scope.spans.len() as u64).sum::<u64>();
            }
            self.latest = self.latest.max(at);
            let now = Instant::now();
            if self.progress.due(now) {
                let position = Position::Simulated { at: self.latest, of: self.length };
                self.progress.report_at(now, position, self.spans, None);
            }
        }
        self.inner.export(at, request);
    }
}

/// The simulated nodes' native state, shared with `--serve-native`.
pub type NativeHandle = Arc<Mutex<NativeState>>;

/// Runs the scenario into `target`; returns its truth and how many requests were sent.
pub fn run(config: &SimConfig, target: &Target, realtime: bool) -> anyhow::Result<(Truth, u64)> {
    run_with_native(config, target, &Sending { realtime, ..Sending::default() }, None, Progress::Off)
}

/// How `sim` sends what the run makes.
#[derive(Debug, Clone, Copy)]
pub struct Sending {
    /// Paced on the wall clock, as the simulated time passes.
    pub realtime: bool,
    /// OTLP requests sent at once (1: each waits for the one before it to be answered).
    pub in_flight: usize,
    /// Held back, skewed, sent twice or lost as a collector would ([`Delivery`]).
    pub delivery: Delivery,
}

impl Default for Sending {
    fn default() -> Self {
        Self { realtime: false, in_flight: 1, delivery: Delivery::default() }
    }
}

/// [`run`], sent as `sending` says, also keeping `native` up to date for the native
/// endpoints, and reporting how far it is as `progress` says.
pub fn run_with_native(
    config: &SimConfig,
    target: &Target,
    sending: &Sending,
    native: Option<NativeHandle>,
    progress: Progress,
) -> anyhow::Result<(Truth, u64)> {
    let Sending { realtime, in_flight, delivery } = *sending;
    delivery.check()?;
    match target {
        Target::JsonLines(path) | Target::Proto(path) => {
            // Paced, the file is written where it is read as it grows (tail -f); otherwise
            // under a temporary name, replacing the destination only once the run succeeded.
            let (file, replacement) = if realtime {
                let file = std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
                (file, None)
            } else {
                let (file, replacement) =
                    Replacement::create(path).with_context(|| format!("cannot create {}", path.display()))?;
                (file, Some(replacement))
            };
            let started = realtime.then(Instant::now);
            let proto = matches!(target, Target::Proto(_));
            let mut sink = FileSink { out: std::io::BufWriter::new(file), proto, error: None, requests: 0, started };
            let mut delivered = Delivered::new(&mut sink, delivery, config.seed);
            let truth = lagscope_sim::run(config, &mut Tee::new(&mut delivered, native, config, progress))?;
            delivered.finish();
            if let Some(error) = sink.error {
                return Err(error).with_context(|| format!("cannot write {}", path.display()));
            }
            sink.out.flush().with_context(|| format!("cannot write {}", path.display()))?;
            if let Some(replacement) = replacement {
                replacement.commit().with_context(|| format!("cannot write {}", path.display()))?;
            }
            Ok((truth, sink.requests))
        }
        Target::Lscap(path) => {
            let (file, replacement) =
                Replacement::create(path).with_context(|| format!("cannot create {}", path.display()))?;
            let writer = crate::lscap::LscapWriter::new(std::io::BufWriter::new(file))
                .with_context(|| format!("cannot write {}", path.display()))?;
            let mut sink = LscapSink { writer, error: None, requests: 0 };
            let mut delivered = Delivered::new(&mut sink, delivery, config.seed);
            let truth = lagscope_sim::run(config, &mut Tee::new(&mut delivered, native, config, progress))?;
            delivered.finish();
            if let Some(error) = sink.error {
                return Err(error).with_context(|| format!("cannot write {}", path.display()));
            }
            sink.writer.finish().with_context(|| format!("cannot write {}", path.display()))?;
            replacement.commit().with_context(|| format!("cannot write {}", path.display()))?;
            Ok((truth, sink.requests))
        }
        Target::OtlpHttp(url) | Target::OtlpGrpc(url) => {
            let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
            let (sender, receiver) = tokio::sync::mpsc::channel(256);
            let grpc = matches!(target, Target::OtlpGrpc(_));
            let url = url.trim_end_matches('/').to_string();
            let sending = runtime.spawn(async move {
                let in_flight = InFlight::new(in_flight);
                if grpc {
                    send_grpc(url, receiver, realtime, in_flight).await
                } else {
                    send_http(url, receiver, realtime, in_flight).await
                }
            });
            let config = config.clone();
            let simulated = std::thread::spawn(move || {
                let sink = ChannelSink { sender, closed: false };
                let mut delivered = Delivered::new(sink, delivery, config.seed);
                let truth = lagscope_sim::run(&config, &mut Tee::new(&mut delivered, native, &config, progress));
                // (What is still held goes too; then the channel closes.)
                delivered.finish();
                truth
            });
            let truth = simulated.join().map_err(|_| anyhow::anyhow!("the simulator panicked"))??;
            let sent = runtime.block_on(sending).context("the sender panicked")??;
            Ok((truth, sent))
        }
    }
}

async fn pace(started: Instant, at: Nanos, realtime: bool) {
    if realtime {
        let due = started + Duration::from_nanos(at.max(0) as u64);
        tokio::time::sleep_until(due.into()).await;
    }
}

/// The OTLP/HTTP path of a request's signal and the request as protobuf.
pub fn otlp_http_body(request: &Request) -> (&'static str, Vec<u8>) {
    match request {
        Request::Traces(request) => ("/v1/traces", request.encode_to_vec()),
        Request::Metrics(request) => ("/v1/metrics", request.encode_to_vec()),
        Request::Logs(request) => ("/v1/logs", request.encode_to_vec()),
    }
}

async fn send_http(
    base: String,
    mut receiver: tokio::sync::mpsc::Receiver<(Nanos, Request)>,
    realtime: bool,
    mut in_flight: InFlight,
) -> anyhow::Result<u64> {
    let base =
        base.trim_end_matches("/v1/traces").trim_end_matches("/v1/metrics").trim_end_matches("/v1/logs").to_string();
    let client = reqwest::Client::new();
    let started = Instant::now();
    let mut sent = 0;
    while let Some((at, request)) = receiver.recv().await {
        pace(started, at, realtime).await;
        let (path, body) = otlp_http_body(&request);
        let (client, url) = (client.clone(), format!("{base}{path}"));
        in_flight.send(post(client, url, body)).await?;
        sent += 1;
    }
    in_flight.finish().await?;
    Ok(sent)
}

/// How long a refused export is tried again before the run fails: the OpenTelemetry
/// Collector's exporters' default (`retry_on_failure.max_elapsed_time`, 5 minutes). A receiver
/// under sustained load refuses the same request many times over (one whose store commits
/// slowly, with more exports in flight than it takes at once): a count of tries would give up
/// on a receiver that is only busy.
const RETRY_FOR: Duration = Duration::from_secs(300);

/// Whether an export first sent at `first` may be sent again after `wait` ([`RETRY_FOR`]).
fn may_retry(first: Instant, wait: Duration) -> bool {
    first.elapsed() + wait <= RETRY_FOR
}

/// One OTLP/HTTP export, retried as the specification allows.
async fn post(client: reqwest::Client, url: String, body: Vec<u8>) -> anyhow::Result<()> {
    let (mut attempt, first) = (0, Instant::now());
    loop {
        let response = client
            .post(&url)
            .header("content-type", "application/x-protobuf")
            .body(body.clone())
            .send()
            .await
            .with_context(|| format!("cannot reach {url}"))?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        // OTLP/HTTP: only 429, 502, 503 and 504 may be retried, after Retry-After.
        let retryable = matches!(status.as_u16(), 429 | 502 | 503 | 504);
        let wait = response
            .headers()
            .get("retry-after")
            .and_then(|value| value.to_str().ok())
            .and_then(|text| text.parse::<u64>().ok())
            .map_or(backoff(attempt), Duration::from_secs);
        if !retryable || !may_retry(first, wait) {
            let text = response.text().await.unwrap_or_default();
            bail!("{url} answered {status}: {text}");
        }
        tokio::time::sleep(wait).await;
        attempt += 1;
    }
}

/// Exports sent at once, at most `limit`: the next one waits for a place, and the first
/// failure is returned by the send that finds it (or by [`InFlight::finish`]).
struct InFlight {
    limit: usize,
    sending: tokio::task::JoinSet<anyhow::Result<()>>,
}

impl InFlight {
    fn new(limit: usize) -> Self {
        Self { limit: limit.max(1), sending: tokio::task::JoinSet::new() }
    }

    async fn send(&mut self, export: impl Future<Output = anyhow::Result<()>> + Send + 'static) -> anyhow::Result<()> {
        while self.sending.len() >= self.limit {
            if let Some(done) = self.sending.join_next().await {
                Self::answered(done)?;
            }
        }
        self.sending.spawn(export);
        Ok(())
    }

    async fn finish(mut self) -> anyhow::Result<()> {
        while let Some(done) = self.sending.join_next().await {
            Self::answered(done)?;
        }
        Ok(())
    }

    fn answered(done: Result<anyhow::Result<()>, tokio::task::JoinError>) -> anyhow::Result<()> {
        done.context("an export task failed")?
    }
}

async fn send_grpc(
    endpoint: String,
    mut receiver: tokio::sync::mpsc::Receiver<(Nanos, Request)>,
    realtime: bool,
    mut in_flight: InFlight,
) -> anyhow::Result<u64> {
    use opentelemetry_proto::tonic::collector::logs::v1::logs_service_client::LogsServiceClient;
    use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_client::MetricsServiceClient;
    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;

    let channel = tonic::transport::Endpoint::from_shared(endpoint.clone())
        .with_context(|| format!("invalid gRPC endpoint {endpoint}"))?
        .connect()
        .await
        .with_context(|| format!("cannot connect to {endpoint}"))?;
    let traces = TraceServiceClient::new(channel.clone());
    let metrics = MetricsServiceClient::new(channel.clone());
    let logs = LogsServiceClient::new(channel);
    let started = Instant::now();
    let mut sent = 0;
    while let Some((at, request)) = receiver.recv().await {
        pace(started, at, realtime).await;
        // (The clients are cheap to clone: they share the channel.)
        let (mut traces, mut metrics, mut logs, endpoint) =
            (traces.clone(), metrics.clone(), logs.clone(), endpoint.clone());
        in_flight
            .send(async move {
                let (mut attempt, first) = (0, Instant::now());
                loop {
                    // (Sent again when refused for a while: the request is cloned for each try.)
                    let result = match &request {
                        Request::Traces(request) => traces.export(request.clone()).await.map(|_| ()),
                        Request::Metrics(request) => metrics.export(request.clone()).await.map(|_| ()),
                        Request::Logs(request) => logs.export(request.clone()).await.map(|_| ()),
                    };
                    let Err(status) = result else { return Ok(()) };
                    match grpc_retry_wait(&status, attempt) {
                        Some(wait) if may_retry(first, wait) => tokio::time::sleep(wait).await,
                        _ => bail!("{endpoint} refused an export: {status}"),
                    }
                    attempt += 1;
                }
            })
            .await?;
        sent += 1;
    }
    in_flight.finish().await?;
    Ok(sent)
}

/// The wait before try `attempt + 1` when the receiver said nothing of when: from 100 ms,
/// doubling, at most 6.4 s.
fn backoff(attempt: u32) -> Duration {
    Duration::from_millis(100 << attempt.min(6))
}

/// How long to wait before sending a refused OTLP/gRPC export again (`attempt`: the retries
/// so far), or none if it must not be: the specification's retryable codes back off
/// exponentially, and RESOURCE_EXHAUSTED is retried only when the receiver sent a
/// `google.rpc.RetryInfo`, after its delay.
fn grpc_retry_wait(status: &tonic::Status, attempt: u32) -> Option<Duration> {
    use tonic::Code;
    match status.code() {
        Code::Cancelled
        | Code::DeadlineExceeded
        | Code::Aborted
        | Code::OutOfRange
        | Code::Unavailable
        | Code::DataLoss => Some(lagscope_collector::otlp::grpc::retry_delay(status).unwrap_or(backoff(attempt))),
        Code::ResourceExhausted => lagscope_collector::otlp::grpc::retry_delay(status),
        _ => None,
    }
}

/// Parses `500ms`, `60s`, `2m`, `1h` (a bare number is seconds).
pub fn parse_duration(text: &str) -> anyhow::Result<Nanos> {
    let text = text.trim();
    let split = text.find(|character: char| !(character.is_ascii_digit() || character == '.')).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 =
        number.parse().with_context(|| format!("invalid duration {text:?}: expected e.g. 500ms, 60s, 2m"))?;
    let scale = match unit {
        "ms" => 1e6,
        "" | "s" => 1e9,
        "m" => 60e9,
        "h" => 3600e9,
        other => bail!("invalid duration {text:?}: unknown unit {other:?} (use ms, s, m or h)"),
    };
    let nanos = value * scale;
    if !(nanos > 0.0 && nanos < 1e18) {
        bail!("invalid duration {text:?}: must be positive");
    }
    Ok(nanos as Nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_grpc_exports_are_sent_again_only_as_the_specification_allows() {
        use lagscope_collector::otlp::grpc::retryable_exhausted;
        use lagscope_collector::queue::RETRY_AFTER_SECONDS;
        let overloaded = retryable_exhausted("full".to_string());
        let asked = Duration::from_secs(u64::from(RETRY_AFTER_SECONDS));
        assert_eq!(grpc_retry_wait(&overloaded, 0), Some(asked), "RESOURCE_EXHAUSTED with RetryInfo: its delay");
        assert_eq!(grpc_retry_wait(&tonic::Status::resource_exhausted("full"), 0), None, "without RetryInfo: never");
        let unavailable = tonic::Status::unavailable("down");
        assert_eq!(grpc_retry_wait(&unavailable, 0), Some(Duration::from_millis(100)));
        assert_eq!(grpc_retry_wait(&unavailable, 3), Some(Duration::from_millis(800)), "backing off");
        assert_eq!(grpc_retry_wait(&tonic::Status::invalid_argument("bad"), 0), None);
    }

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("60s").expect("60s"), 60_000_000_000);
        assert_eq!(parse_duration("2m").expect("2m"), 120_000_000_000);
        assert_eq!(parse_duration("250ms").expect("ms"), 250_000_000);
        assert_eq!(parse_duration("1.5").expect("bare"), 1_500_000_000);
        assert!(parse_duration("10 parsecs").is_err());
        assert!(parse_duration("0s").is_err());
    }
}
