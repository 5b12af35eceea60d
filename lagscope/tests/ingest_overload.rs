//! Overload: senders far faster than the store can commit get 429 with `Retry-After` (never a
//! dropped connection or a 5xx), everything answered 200 is stored, and the process's memory
//! stays bounded by the ingest queue rather than growing with the load.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message;
use support::{ServeProcess, text};

/// A 2 MiB body limit and an 8 MiB queue: room for one largest request decoded, or a few
/// ordinary ones. The live analyzer's span caches hold what they are given room for whatever
/// the load (`live.scope_cache_spans`, `live.client_cache_spans`: 500 000 spans each by default,
/// about 3.5 KB a span with their timelines, which alone would be over the bound below once filled): 10 000 each here.
const CONFIG: &str = "[server]\nmax_body_bytes = 2097152\ningest_queue_bytes = 8388608\n\
                      [live]\nscope_cache_spans = 10000\nclient_cache_spans = 10000\n";
/// Without the bound (a queue larger than anything the flood can fill), for comparison:
/// LAGSCOPE_OVERLOAD_UNBOUNDED=1 cargo test --test ingest_overload -- --nocapture
const UNBOUNDED_CONFIG: &str = "[server]\nmax_body_bytes = 2097152\ningest_queue_bytes = 17179869184\n\
                                [live]\nscope_cache_spans = 10000\nclient_cache_spans = 10000\n";

/// What the test holds the service to: the process's peak RSS. The queue is 8 MiB; the rest is
/// the runtime, SQLite's page cache, the live analyzer (its caches within their budgets) and
/// the HTTP connections of 32 senders.
const PEAK_RSS_BOUND: u64 = 400 * 1024 * 1024;

/// 48 senders with nearly 2 MiB bodies: taken without a bound, what is in flight at once
/// (bodies, decoded requests, converted spans) would be several times the RSS bound.
const SENDERS: u64 = 48;
const SPANS_PER_REQUEST: u64 = 19_000;

/// About 1.9 MB of protobuf: 19 000 spans, ids unique per (sender, sequence).
fn body(sender: u64, sequence: u64) -> Vec<u8> {
    request(sender, sequence).encode_to_vec()
}

fn request(sender: u64, sequence: u64) -> ExportTraceServiceRequest {
    let base = 1_764_435_600_000_000_000u64 + sequence * 1_000_000_000;
    let spans = (0..SPANS_PER_REQUEST)
        .map(|index| {
            let id = ((sender + 1) << 48) | (sequence << 16) | index;
            Span {
                trace_id: u128::from(id).to_be_bytes().to_vec(),
                span_id: (id | 1 << 63).to_be_bytes().to_vec(),
                name: "getFileInfo".to_string(),
                kind: 3,
                start_time_unix_nano: base + index * 100_000,
                end_time_unix_nano: base + index * 100_000 + 50_000,
                attributes: vec![text("lagscope.client.id", &format!("overload-{sender}-{}", index % 50))],
                ..Span::default()
            }
        })
        .collect();
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource { attributes: vec![text("service.name", "overload")], ..Resource::default() }),
            scope_spans: vec![ScopeSpans { spans, ..ScopeSpans::default() }],
            ..ResourceSpans::default()
        }],
    }
}

#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    too_many: AtomicU64,
    other: AtomicU64,
}

#[test]
fn a_flood_is_pushed_back_with_429_and_memory_stays_bounded() {
    let directory = tempfile::tempdir().expect("temp dir");
    let unbounded = std::env::var_os("LAGSCOPE_OVERLOAD_UNBOUNDED").is_some();
    let serve = ServeProcess::start(&directory.path().join("data"), if unbounded { UNBOUNDED_CONFIG } else { CONFIG });
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let tally = Arc::new(Tally::default());
    // One body per sender, sent again and again (a span sent again is stored once).
    let bodies: Arc<Vec<Vec<u8>>> = Arc::new((0..SENDERS).map(|sender| body(sender, 0)).collect());
    let delivered: Arc<std::sync::Mutex<std::collections::BTreeSet<u64>>> = Arc::default();
    let deadline = Instant::now() + Duration::from_secs(8);
    let mut senders = Vec::new();
    for sender in 0..SENDERS {
        let (tally, endpoint, bodies, delivered) =
            (tally.clone(), serve.otlp_http.clone(), bodies.clone(), delivered.clone());
        senders.push(runtime.spawn(async move {
            let client = reqwest::Client::new();
            while Instant::now() < deadline {
                // Ignores Retry-After on purpose: a hostile or broken sender.
                let body = bodies[sender as usize].clone();
                let response = client
                    .post(format!("http://{endpoint}/v1/traces"))
                    .header("content-type", "application/x-protobuf")
                    .body(body)
                    .send()
                    .await
                    .expect("the server answers, even when overloaded");
                match response.status().as_u16() {
                    200 => {
                        tally.ok.fetch_add(1, Ordering::Relaxed);
                        delivered.lock().expect("lock").insert(sender);
                    }
                    429 => {
                        let retry_after = response.headers().get("retry-after").and_then(|value| value.to_str().ok());
                        assert_eq!(retry_after, Some("1"), "429 carries Retry-After");
                        tally.too_many.fetch_add(1, Ordering::Relaxed);
                    }
                    status => {
                        let text = response.text().await.unwrap_or_default();
                        eprintln!("unexpected {status}: {text}");
                        tally.other.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    for sender in senders {
        runtime.block_on(sender).expect("sender");
    }
    let peak_rss = serve.peak_rss_bytes();
    let (ok, too_many, other) =
        (tally.ok.load(Ordering::Relaxed), tally.too_many.load(Ordering::Relaxed), tally.other.load(Ordering::Relaxed));
    eprintln!("{ok} requests committed, {too_many} refused with 429, {other} other; peak RSS {} MiB", peak_rss >> 20);
    assert_eq!(other, 0, "only 200 and 429 under overload");
    assert!(too_many > 0 || unbounded, "the flood was pushed back");
    assert!(
        peak_rss < PEAK_RSS_BOUND,
        "peak RSS {} MiB is over the bound of {} MiB",
        peak_rss >> 20,
        PEAK_RSS_BOUND >> 20
    );

    // Once the flood stops, a sender is served at once.
    let after = runtime.block_on(async {
        reqwest::Client::new()
            .post(format!("http://{}/v1/traces", serve.otlp_http))
            .header("content-type", "application/x-protobuf")
            .body(body(SENDERS, 0))
            .send()
            .await
            .expect("answer")
            .status()
            .as_u16()
    });
    assert_eq!(after, 200, "the service is healthy after the flood");
    delivered.lock().expect("lock").insert(SENDERS);
    let metrics = runtime.block_on(async {
        reqwest::get(format!("http://{}/metrics", serve.api)).await.expect("metrics").text().await.expect("text")
    });
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(name).and_then(|rest| rest.trim().parse().ok()))
            .unwrap_or_else(|| panic!("{name} in /metrics"))
    };
    assert_eq!(value("lagscope_ingest_queue_full_total ") as u64, too_many);
    // The acknowledged spans are committed: the counter moves once the commit returned.
    let distinct = delivered.lock().expect("lock").len() as u64;
    assert_eq!(
        value("lagscope_spans_stored_total ") as u64,
        distinct * SPANS_PER_REQUEST,
        "every acknowledged span stored"
    );
    assert!(value("lagscope_ingest_commits_total ") <= value("lagscope_ingest_committed_requests_total "));
    serve.stop();
}

#[test]
fn a_grpc_flood_gets_resource_exhausted_with_retry_info_and_memory_stays_bounded() {
    let directory = tempfile::tempdir().expect("temp dir");
    let unbounded = std::env::var_os("LAGSCOPE_OVERLOAD_UNBOUNDED").is_some();
    let serve = ServeProcess::start(&directory.path().join("data"), if unbounded { UNBOUNDED_CONFIG } else { CONFIG });
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let requests: Arc<Vec<ExportTraceServiceRequest>> =
        Arc::new((0..SENDERS).map(|sender| request(sender + 100, 0)).collect());
    let tally = Arc::new(Tally::default());
    let deadline = Instant::now() + Duration::from_secs(8);
    let mut senders = Vec::new();
    for sender in 0..SENDERS {
        let (tally, endpoint, requests) = (tally.clone(), serve.otlp_grpc.clone(), requests.clone());
        senders.push(runtime.spawn(async move {
            let channel = tonic::transport::Endpoint::from_shared(format!("http://{endpoint}"))
                .expect("endpoint")
                .connect()
                .await
                .expect("connect");
            let mut client = TraceServiceClient::new(channel).max_encoding_message_size(usize::MAX);
            while Instant::now() < deadline {
                match client.export(requests[sender as usize].clone()).await {
                    Ok(_) => {
                        tally.ok.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(status) if status.code() == tonic::Code::ResourceExhausted => {
                        // Retryable only with a RetryInfo in the details.
                        let details = String::from_utf8_lossy(status.details()).to_string();
                        assert!(details.contains("google.rpc.RetryInfo"), "{status:?}");
                        tally.too_many.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(status) => {
                        eprintln!("unexpected {status:?}");
                        tally.other.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    for sender in senders {
        runtime.block_on(sender).expect("sender");
    }
    let peak_rss = serve.peak_rss_bytes();
    let (ok, too_many, other) =
        (tally.ok.load(Ordering::Relaxed), tally.too_many.load(Ordering::Relaxed), tally.other.load(Ordering::Relaxed));
    eprintln!("gRPC: {ok} committed, {too_many} RESOURCE_EXHAUSTED, {other} other; peak RSS {} MiB", peak_rss >> 20);
    assert_eq!(other, 0, "only OK and RESOURCE_EXHAUSTED under overload");
    assert!(too_many > 0 || unbounded, "the flood was pushed back");
    assert!(
        peak_rss < PEAK_RSS_BOUND,
        "peak RSS {} MiB is over the bound of {} MiB",
        peak_rss >> 20,
        PEAK_RSS_BOUND >> 20
    );
    serve.stop();
}
