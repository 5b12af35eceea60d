//! Tenants: with `[tenants] enabled`, each `X-Scope-OrgID` gets a store of its own; data sent
//! for one tenant is never seen through another; requests without a tenant, with a malformed
//! one, or beyond `max_tenants` are refused with a message.

mod support;

use lagscope::{Config, Server};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use serde_json::{Value, json};

/// `traces` spans of `client`, trace ids from `first`.
fn request(client: &str, first: u32, traces: u32) -> Value {
    let spans: Vec<Value> = (first..first + traces)
        .map(|trace| {
            json!({
                "traceId": format!("{trace:032x}"), "spanId": "b7ad6b7169203331", "name": "getFileInfo",
                "startTimeUnixNano": (1_764_435_600_000_000_000u64 + u64::from(trace) * 1_000_000_000).to_string(),
                "endTimeUnixNano": (1_764_435_600_010_000_000u64 + u64::from(trace) * 1_000_000_000).to_string(),
                "attributes": [
                    {"key": "lagscope.client.id", "value": {"stringValue": client}},
                    {"key": "lagscope.namespace", "value": {"stringValue": "ns1"}},
                    {"key": "lagscope.op", "value": {"stringValue": "read"}}
                ]
            })
        })
        .collect();
    json!({"resourceSpans": [{
        "resource": {"attributes": [
            {"key": "service.name", "value": {"stringValue": "client"}},
            {"key": "lagscope.component", "value": {"stringValue": "client"}}
        ]},
        "scopeSpans": [{"spans": spans}]
    }]})
}

struct Api<'a> {
    server: &'a Server,
    http: reqwest::Client,
}

impl Api<'_> {
    async fn get(&self, tenant: Option<&str>, path: &str) -> (u16, Value) {
        let mut request = self.http.get(format!("http://{}{path}", self.server.api_addr));
        if let Some(tenant) = tenant {
            request = request.header("X-Scope-OrgID", tenant);
        }
        let response = request.send().await.expect("answer");
        (response.status().as_u16(), response.json().await.unwrap_or(Value::Null))
    }

    async fn send(&self, tenant: Option<&str>, body: &Value) -> (u16, Value) {
        let mut request = self.http.post(format!("http://{}/v1/traces", self.server.otlp_http_addr)).json(body);
        if let Some(tenant) = tenant {
            request = request.header("X-Scope-OrgID", tenant);
        }
        let response = request.send().await.expect("answer");
        (response.status().as_u16(), response.json().await.unwrap_or(Value::Null))
    }

    async fn spans(&self, tenant: &str) -> u64 {
        let (status, health) = self.get(Some(tenant), "/api/v1/health").await;
        assert_eq!(status, 200, "{health}");
        health["store"]["spans"].as_u64().expect("span count")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tenant_sees_only_its_own_data() {
    let directory = tempfile::tempdir().expect("temp dir");
    let mut config = support::local_config(directory.path());
    config.tenants.enabled = true;
    config.tenants.max_tenants = 2;
    config.validate().expect("valid");
    let server = Server::start(&config).await.expect("starts");
    let api = Api { server: &server, http: reqwest::Client::new() };

    assert_eq!(api.send(Some("team-a"), &request("client-a", 1, 3)).await.0, 200);
    assert_eq!(api.send(Some("team-b"), &request("client-b", 1, 5)).await.0, 200);
    assert_eq!((api.spans("team-a").await, api.spans("team-b").await), (3, 5));
    assert!(directory.path().join("tenants/team-a").is_dir() && directory.path().join("tenants/team-b").is_dir());

    // One tenant's client is not found through another.
    assert_eq!(api.get(Some("team-a"), "/api/v1/clients/client-a/timeline").await.0, 200);
    assert_eq!(api.get(Some("team-b"), "/api/v1/clients/client-a/timeline").await.0, 404);

    // gRPC: the tenant in the metadata.
    let mut client = TraceServiceClient::connect(format!("http://{}", server.otlp_grpc_addr)).await.expect("connect");
    let grpc_request: ExportTraceServiceRequest =
        serde_json::from_value(request("client-b2", 100, 2)).expect("request");
    let refused = client.export(grpc_request.clone()).await.expect_err("no tenant");
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    assert!(refused.message().contains("X-Scope-OrgID"), "{refused}");
    let mut with_tenant = tonic::Request::new(grpc_request);
    with_tenant.metadata_mut().insert("x-scope-orgid", "team-b".parse().expect("metadata"));
    client.export(with_tenant).await.expect("accepted for team-b");
    assert_eq!((api.spans("team-a").await, api.spans("team-b").await), (3, 7));

    // Refusals, each naming what is wrong; nothing stored.
    let (status, body) = api.send(None, &request("x", 200, 1)).await;
    assert_eq!(status, 401, "{body}");
    assert!(body["message"].as_str().unwrap_or_default().contains("X-Scope-OrgID"), "{body}");
    let (status, body) = api.send(Some("../etc"), &request("x", 200, 1)).await;
    assert_eq!(status, 400, "{body}");
    assert!(body["message"].as_str().unwrap_or_default().contains("../etc"), "{body}");
    let (status, body) = api.send(Some("team-c"), &request("x", 200, 1)).await;
    assert_eq!(status, 403, "max_tenants is 2: {body}");
    let (status, body) = api.get(None, "/api/v1/anomalies").await;
    assert_eq!(status, 401, "{body}");
    // Probes still get an answer without a tenant.
    let (status, body) = api.get(None, "/api/v1/health").await;
    assert_eq!((status, body["tenants_open"].as_u64()), (200, Some(2)), "{body}");
    assert_eq!((api.spans("team-a").await, api.spans("team-b").await), (3, 7));
    server.shutdown().await.expect("clean shutdown");

    // After a restart, each tenant's data is where it was.
    let server = Server::start(&config).await.expect("restarts");
    let api = Api { server: &server, http: reqwest::Client::new() };
    assert_eq!((api.spans("team-a").await, api.spans("team-b").await), (3, 7));
    server.shutdown().await.expect("clean shutdown");
}

#[test]
fn scrape_targets_must_name_their_tenant_when_tenants_are_on() {
    let text =
        "[tenants]\nenabled = true\n[[scrape]]\nname = \"nn1\"\nurl = \"http://nn1:9870/jmx\"\nkind = \"hadoop_jmx\"\n";
    let error = Config::from_toml("x.toml", text).expect_err("no tenant");
    assert!(format!("{error:#}").contains("name its tenant"), "{error:#}");
    let with_tenant = format!("{text}tenant = \"team-a\"\n");
    Config::from_toml("x.toml", &with_tenant).expect("valid with a tenant");
}
