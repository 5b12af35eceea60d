//! A 2xx/OK means committed: senders over OTLP/HTTP and OTLP/gRPC record what `lagscope serve`
//! acknowledged, the process is killed with SIGKILL in the middle of the stream (several
//! times, at varying moments), restarted over the same data directory, and every acknowledged
//! span is found in the store, by id.

mod support;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lagscope_store::{SqliteStore, Store, TimeRange};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message;
use support::{ServeProcess, text};

const SPANS_PER_REQUEST: u64 = 200;

type Acknowledged = Arc<Mutex<BTreeSet<(String, String)>>>;

/// Request `sequence` of sender `sender`: spans with ids unique to it.
fn request(sender: u64, sequence: u64) -> ExportTraceServiceRequest {
    let base = 1_764_435_600_000_000_000u64 + sequence * 1_000_000_000;
    let spans = (0..SPANS_PER_REQUEST)
        .map(|index| {
            let id = ((sender + 1) << 40) | (sequence << 16) | index; // never 0: an all-zero id is invalid
            Span {
                trace_id: u128::from(id).to_be_bytes().to_vec(),
                span_id: (id | 1 << 63).to_be_bytes().to_vec(),
                name: "getFileInfo".to_string(),
                kind: 3,
                start_time_unix_nano: base + index * 1_000_000,
                end_time_unix_nano: base + index * 1_000_000 + 500_000,
                attributes: vec![text("lagscope.client.id", &format!("sender-{sender}"))],
                ..Span::default()
            }
        })
        .collect();
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![text("service.name", "load-generator"), text("lagscope.component", "client")],
                ..Resource::default()
            }),
            scope_spans: vec![ScopeSpans { spans, ..ScopeSpans::default() }],
            ..ResourceSpans::default()
        }],
    }
}

fn ids(request: &ExportTraceServiceRequest) -> Vec<(String, String)> {
    request.resource_spans[0].scope_spans[0]
        .spans
        .iter()
        .map(|span| (hex::encode(&span.trace_id), hex::encode(&span.span_id)))
        .collect()
}

/// Sends requests one after another over OTLP/HTTP until the server is gone; records those
/// answered 200.
async fn http_sender(endpoint: String, sender: u64, first: u64, acknowledged: Acknowledged) {
    let client = reqwest::Client::new();
    for sequence in first.. {
        let request = request(sender, sequence);
        let response = client
            .post(format!("http://{endpoint}/v1/traces"))
            .header("content-type", "application/x-protobuf")
            .body(request.encode_to_vec())
            .send()
            .await;
        match response {
            Ok(response) if response.status().as_u16() == 200 => {
                acknowledged.lock().expect("lock").extend(ids(&request));
            }
            Ok(response) => panic!("unexpected answer {} from a healthy server", response.status()),
            Err(_) => return, // killed: this request was not acknowledged
        }
    }
}

/// The same over OTLP/gRPC.
async fn grpc_sender(endpoint: String, sender: u64, first: u64, acknowledged: Acknowledged) {
    let Ok(mut client) = TraceServiceClient::connect(format!("http://{endpoint}")).await else { return };
    for sequence in first.. {
        let request = request(sender, sequence);
        match client.export(request.clone()).await {
            Ok(_) => acknowledged.lock().expect("lock").extend(ids(&request)),
            Err(status) if status.code() == tonic::Code::ResourceExhausted => {
                panic!("a healthy server refused: {status}")
            }
            Err(_) => return,
        }
    }
}

#[test]
fn every_acknowledged_span_survives_sigkill() {
    let directory = tempfile::tempdir().expect("temp dir");
    let data_dir = directory.path().join("data");
    let acknowledged: Acknowledged = Arc::default();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    // Kill moments vary across rounds, so that the kill lands in different phases (reading,
    // queued, mid-transaction, answering).
    for (round, kill_after_ms) in [(0u64, 700u64), (1, 1100), (2, 450)] {
        let serve = ServeProcess::start(&data_dir, "");
        let mut senders = Vec::new();
        for sender in 0..4u64 {
            let first = round * 1_000; // sequences unique per round
            let id = round * 10 + sender;
            let acknowledged = acknowledged.clone();
            senders.push(if sender % 2 == 0 {
                runtime.spawn(http_sender(serve.otlp_http.clone(), id, first, acknowledged))
            } else {
                runtime.spawn(grpc_sender(serve.otlp_grpc.clone(), id, first, acknowledged))
            });
        }
        // Once this round's first request is acknowledged (a slow machine may take a while to
        // get there), the stream runs on for the round's delay, then the kill.
        let at_start = acknowledged.lock().expect("lock").len();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while acknowledged.lock().expect("lock").len() == at_start {
            assert!(std::time::Instant::now() < deadline, "round {round}: no request acknowledged in 60 s");
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(kill_after_ms));
        let before_kill = acknowledged.lock().expect("lock").len() - at_start;
        serve.kill();
        for sender in senders {
            runtime.block_on(sender).expect("sender task");
        }
        assert!(before_kill > 0, "round {round}: nothing was acknowledged before the kill");
        eprintln!("round {round}: {before_kill} spans acknowledged in this round before the kill");
        eprintln!("round {round}: {} spans acknowledged so far", acknowledged.lock().expect("lock").len());
    }

    // Restarted over the same directory, the service has every acknowledged span.
    let serve = ServeProcess::start(&data_dir, "");
    let health: serde_json::Value = runtime.block_on(async {
        reqwest::get(format!("http://{}/api/v1/health", serve.api)).await.expect("health").json().await.expect("json")
    });
    let stored_count = health["store"]["spans"].as_u64().expect("span count");
    serve.stop();

    let acknowledged = acknowledged.lock().expect("lock").clone();
    let stored: BTreeSet<(String, String)> = runtime.block_on(async {
        let store = SqliteStore::open_dir(&data_dir).await.expect("store reopens");
        let spans = store.spans_in_range(None, None, TimeRange::ALL, u32::MAX).await.expect("spans");
        store.close().await;
        spans.into_iter().map(|span| (span.trace_id.expect("trace id"), span.span_id.expect("span id"))).collect()
    });
    assert_eq!(stored.len() as u64, stored_count);
    let missing: Vec<_> = acknowledged.difference(&stored).take(5).collect();
    assert!(
        missing.is_empty(),
        "{} of {} acknowledged spans are missing after SIGKILL, e.g. {missing:?}",
        acknowledged.difference(&stored).count(),
        acknowledged.len()
    );
    // Unacknowledged requests may or may not have been committed, but only whole.
    assert_eq!(stored.len() as u64 % SPANS_PER_REQUEST, 0, "a request was committed in part");
    eprintln!("{} acknowledged spans, {} stored, all acknowledged present", acknowledged.len(), stored.len());
}
