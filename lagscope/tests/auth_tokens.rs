//! Bearer tokens: with `[auth]` tokens configured, OTLP/HTTP, OTLP/gRPC and the API refuse
//! requests without an accepted token (401 / UNAUTHENTICATED, nothing stored) and serve those
//! with one; the health endpoint stays open for probes.

mod support;

use lagscope::{Config, Server};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use prost::Message;
use serde_json::{Value, json};

const INGEST: &str = "ingest-token-0123456789";
const API: &str = "api-token-abcdefghijklmnop";

fn request(trace: u8) -> ExportTraceServiceRequest {
    serde_json::from_value(json!({"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "c"}}]},
        "scopeSpans": [{"spans": [{
            "traceId": format!("{trace:032x}"), "spanId": "b7ad6b7169203331", "name": "getFileInfo",
            "startTimeUnixNano": "1764435600000000000", "endTimeUnixNano": "1764435600010000000",
            "attributes": [{"key": "lagscope.client.id", "value": {"stringValue": "auth-client"}}]}]}]
    }]}))
    .expect("request")
}

async fn spans_stored(server: &Server, http: &reqwest::Client) -> u64 {
    let health: Value = http
        .get(format!("http://{}/api/v1/health", server.api_addr))
        .send()
        .await
        .expect("health")
        .json()
        .await
        .expect("json");
    health["store"]["spans"].as_u64().expect("count")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_guard_ingest_and_the_api() {
    let directory = tempfile::tempdir().expect("temp dir");
    let mut config = support::local_config(directory.path());
    config.auth.ingest_tokens = vec![INGEST.to_string()];
    config.auth.api_tokens = vec![API.to_string()];
    config.validate().expect("valid");
    let server = Server::start(&config).await.expect("starts");
    let http = reqwest::Client::new();
    let traces = format!("http://{}/v1/traces", server.otlp_http_addr);

    // OTLP/HTTP: no token, a wrong token, an API token: 401, in the request's encoding.
    for (token, content_type) in [
        (None, "application/json"),
        (Some("wrong-token-0123456789"), "application/x-protobuf"),
        (Some(API), "application/json"),
    ] {
        let mut post = http.post(&traces).header("content-type", content_type);
        post = match token {
            Some(token) => post.bearer_auth(token),
            None => post,
        };
        let body = if content_type == "application/json" {
            serde_json::to_vec(&request(1)).expect("json")
        } else {
            request(1).encode_to_vec()
        };
        let response = post.body(body).send().await.expect("answer");
        assert_eq!(response.status().as_u16(), 401, "token {token:?}");
        assert!(response.headers()["www-authenticate"].to_str().unwrap_or_default().starts_with("Bearer"));
        assert_eq!(response.headers()["content-type"], content_type);
        if content_type == "application/json" {
            let body: Value = response.json().await.expect("json");
            assert_eq!(body["code"], 16, "{body}");
        }
    }
    let accepted = http
        .post(&traces)
        .bearer_auth(INGEST)
        .header("content-type", "application/x-protobuf")
        .body(request(2).encode_to_vec())
        .send()
        .await
        .expect("answer");
    assert_eq!(accepted.status().as_u16(), 200);

    // OTLP/gRPC: UNAUTHENTICATED without the token, OK with it in the metadata.
    let mut client = TraceServiceClient::connect(format!("http://{}", server.otlp_grpc_addr)).await.expect("connect");
    let refused = client.export(request(3)).await.expect_err("no token");
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused}");
    let mut with_token = tonic::Request::new(request(4));
    with_token.metadata_mut().insert("authorization", format!("Bearer {INGEST}").parse().expect("metadata"));
    client.export(with_token).await.expect("accepted with the token");

    // Only the two accepted requests were stored; health answers without a token.
    assert_eq!(spans_stored(&server, &http).await, 2);

    // The API: 401 without the API token (the ingest token is not one), 200 with it.
    for (path, expected) in [("/api/v1/anomalies", 200), ("/metrics", 200), ("/api/v1/anomalies/999", 404)] {
        let url = format!("http://{}{path}", server.api_addr);
        let refused = http.get(&url).send().await.expect("answer");
        assert_eq!(refused.status().as_u16(), 401, "{path}");
        let wrong = http.get(&url).bearer_auth(INGEST).send().await.expect("answer");
        assert_eq!(wrong.status().as_u16(), 401, "{path} with the ingest token");
        let served = http.get(&url).bearer_auth(API).send().await.expect("answer");
        assert_eq!(served.status().as_u16(), expected, "{path}: the handler answers");
    }
    server.shutdown().await.expect("clean shutdown");
}

#[test]
fn short_tokens_are_refused_at_start_up() {
    let error = Config::from_toml("x.toml", "[auth]\ningest_tokens = [\"secret\"]\n").expect_err("too short");
    let message = format!("{error:#}");
    assert!(message.contains("auth.ingest_tokens") && message.contains("at least 16"), "{message}");
}
