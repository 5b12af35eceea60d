//! Every `/api/v1` endpoint against a service fed by the simulator: answers that match the
//! OpenAPI document the service serves (each response validated against the schema the
//! document gives for that path and status), bad parameters answered 400 with a message
//! naming them, unknown ids 404, and pages that follow their `next` links without gaps or
//! repeats.

mod support;

use std::collections::BTreeSet;

use serde_json::{Value, json};
use support::{get_json, start_server};

/// The schema the document gives for `GET path` answering `status`, with its references
/// made local so that a JSON Schema validator resolves them.
fn response_schema(document: &Value, path: &str, status: u16) -> Value {
    let schema =
        &document["paths"][path]["get"]["responses"][status.to_string()]["content"]["application/json"]["schema"];
    assert!(schema.is_object(), "the OpenAPI document gives no schema for GET {path} {status}");
    let local = |value: &Value| -> Value {
        serde_json::from_str(&value.to_string().replace("#/components/schemas/", "#/$defs/")).expect("JSON")
    };
    let mut root = local(schema);
    root["$defs"] = local(&document["components"]["schemas"]);
    root["$schema"] = json!("https://json-schema.org/draft/2020-12/schema");
    root
}

struct Api<'a> {
    server: &'a lagscope::Server,
    document: Value,
}

impl Api<'_> {
    /// GETs `uri`, checks the status and that the body matches the documented schema of
    /// `documented_path` for that status.
    async fn get(&self, documented_path: &str, uri: &str, status: u16) -> Value {
        let (got, body) = get_json(self.server, uri).await;
        assert_eq!(got, status, "GET {uri}: {body}");
        let schema = response_schema(&self.document, documented_path, status);
        let validator =
            jsonschema::validator_for(&schema).unwrap_or_else(|error| panic!("schema of {documented_path}: {error}"));
        let errors: Vec<String> =
            validator.iter_errors(&body).map(|error| format!("{} at {}", error, error.instance_path())).collect();
        assert!(errors.is_empty(), "GET {uri} does not match the OpenAPI document: {errors:#?}\n{body:#}");
        body
    }

    /// A 400 whose message names `names`.
    async fn bad(&self, documented_path: &str, uri: &str, names: &str) {
        let body = self.get(documented_path, uri, 400).await;
        let message = body["error"].as_str().unwrap_or_default();
        assert!(message.contains(names), "GET {uri}: the message {message:?} should name {names:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_answers_as_documented() {
    let directory = tempfile::tempdir().expect("temp dir");
    let server = start_server(directory.path()).await;
    support::feed_simulator(&server, "mixed", 15).await;

    let (status, document) = get_json(&server, "/api/v1/openapi.json").await;
    assert_eq!(status, 200);
    assert_eq!(document["openapi"], "3.1.0");
    // The checker can fail: a body that breaks the documented shape is caught.
    let schema = response_schema(&document, "/api/v1/anomalies", 200);
    let validator = jsonschema::validator_for(&schema).expect("schema compiles");
    assert!(!validator.is_valid(&json!({ "anomalies": [{ "id": "seven" }], "next_before": null, "next": null })));
    assert!(validator.is_valid(&json!({ "anomalies": [], "next_before": null, "next": null })));
    let api = Api { server: &server, document };

    // Health and the instance list.
    let health = api.get("/api/v1/health", "/api/v1/health", 200).await;
    assert!(health["store"]["spans"].as_u64().unwrap_or(0) > 0);
    api.get("/api/v1/cluster", "/api/v1/cluster", 200).await;

    // Anomalies: all of them, then the same by pages of 3 through the `next` links.
    let all = api.get("/api/v1/anomalies", "/api/v1/anomalies?limit=1000", 200).await;
    let all_ids: Vec<i64> =
        all["anomalies"].as_array().expect("list").iter().filter_map(|a| a["id"].as_i64()).collect();
    assert!(all_ids.len() > 3, "the scenario yields anomalies: {all_ids:?}");
    let mut paged = Vec::new();
    let mut uri = "/api/v1/anomalies?limit=300".to_string();
    loop {
        let page = api.get("/api/v1/anomalies", &uri, 200).await;
        paged.extend(page["anomalies"].as_array().expect("list").iter().filter_map(|a| a["id"].as_i64()));
        match page["next"].as_str() {
            Some(next) => uri = next.to_string(),
            None => break,
        }
        assert!(paged.len() <= 1_000_000, "paging does not end");
    }
    assert!(paged.windows(2).all(|pair| pair[0] > pair[1]), "pages are newest first, none twice");
    assert_eq!(paged[..all_ids.len()], all_ids[..], "pages agree with one big page");
    let total = api.get("/api/v1/health", "/api/v1/health", 200).await["store"]["anomalies"].as_u64();
    assert_eq!(Some(paged.len() as u64), total, "pages reach every anomaly");
    let first = all_ids[0];
    let one = api.get("/api/v1/anomalies/{id}", &format!("/api/v1/anomalies/{first}"), 200).await;
    assert_eq!(one["id"], first);
    api.get("/api/v1/anomalies/{id}", "/api/v1/anomalies/999999999", 404).await;
    api.bad("/api/v1/anomalies/{id}", "/api/v1/anomalies/abc", "abc").await;
    api.bad("/api/v1/anomalies", "/api/v1/anomalies?limit=0", "limit").await;
    api.bad("/api/v1/anomalies", "/api/v1/anomalies?kind=stale_reads", "kind").await;
    api.bad("/api/v1/anomalies", "/api/v1/anomalies?since=yesterday", "since").await;
    api.bad("/api/v1/anomalies", "/api/v1/anomalies?status=maybe", "status").await;

    // Windows: the scenario's NoNamenodesAvailable windows, with durations.
    let windows = api.get("/api/v1/windows", "/api/v1/windows?kind=no_namenodes_window", 200).await;
    let listed = windows["windows"].as_array().expect("list");
    assert!(!listed.is_empty(), "{windows}");
    assert!(
        listed
            .iter()
            .all(|w| w["kind"] == "no_namenodes_window" && w["duration_seconds"].as_f64().unwrap_or(-1.0) >= 0.0)
    );
    api.get("/api/v1/windows", "/api/v1/windows?status=resolved&limit=1", 200).await;
    api.bad("/api/v1/windows", "/api/v1/windows?kind=stale_read", "kind").await;
    api.bad("/api/v1/windows", "/api/v1/windows?status=maybe", "status").await;
    api.bad("/api/v1/windows", "/api/v1/windows?colour=red", "colour").await;

    // Discovery.
    let clusters = api.get("/api/v1/clusters", "/api/v1/clusters", 200).await;
    let cluster = clusters["clusters"][0]["cluster"].as_str().expect("a cluster").to_string();
    let namespaces = api.get("/api/v1/namespaces", &format!("/api/v1/namespaces?cluster={cluster}"), 200).await;
    let namespace = namespaces["namespaces"][0]["namespace"].as_str().expect("a namespace").to_string();
    assert!(namespaces["namespaces"].as_array().expect("list").iter().all(|n| n["cluster"] == cluster.as_str()));
    let nodes = api.get("/api/v1/nodes", &format!("/api/v1/nodes?cluster={cluster}&namespace={namespace}"), 200).await;
    assert!(!nodes["nodes"].as_array().expect("list").is_empty(), "{nodes}");
    api.bad("/api/v1/nodes", "/api/v1/nodes?node=x", "node").await;
    let everyone = api.get("/api/v1/clients", "/api/v1/clients?limit=1000", 200).await;
    let everyone: Vec<String> = serde_json::from_value(everyone["clients"].clone()).expect("ids");
    assert!(everyone.len() >= 2, "{everyone:?}");
    let mut paged = Vec::new();
    let mut uri = "/api/v1/clients?limit=1".to_string();
    loop {
        let page = api.get("/api/v1/clients", &uri, 200).await;
        paged.extend(serde_json::from_value::<Vec<String>>(page["clients"].clone()).expect("ids"));
        match page["next"].as_str() {
            Some(next) => uri = next.to_string(),
            None => break,
        }
    }
    assert_eq!(paged, everyone);
    assert_eq!(paged.iter().collect::<BTreeSet<_>>().len(), paged.len(), "no client twice");
    api.bad("/api/v1/clients", "/api/v1/clients?limit=5000", "limit").await;

    // A client's timeline.
    let client = &everyone[0];
    let timeline =
        api.get("/api/v1/clients/{client_id}/timeline", &format!("/api/v1/clients/{client}/timeline"), 200).await;
    assert!(!timeline["timelines"].as_array().expect("list").is_empty());
    api.get("/api/v1/clients/{client_id}/timeline", "/api/v1/clients/nobody-at-all/timeline", 404).await;
    api.bad("/api/v1/clients/{client_id}/timeline", &format!("/api/v1/clients/{client}/timeline?from=2&to=1"), "from")
        .await;

    // Series: the committed state of one namespace, by step.
    let any = api.get("/api/v1/series", "/api/v1/series?name=lagscope.server.committed_state", 200).await;
    let labels = &any["series"][0]["labels"];
    let (cluster, namespace) = (
        labels["lagscope.cluster"].as_str().expect("a cluster label").to_string(),
        labels["lagscope.namespace"].as_str().expect("a namespace label").to_string(),
    );
    let base = format!(
        "/api/v1/series?name=lagscope.server.committed_state&match[]=lagscope.cluster%3D{cluster}&match[]=lagscope.namespace%3D{namespace}"
    );
    let series = api.get("/api/v1/series", &base, 200).await;
    let found = series["series"].as_array().expect("list");
    assert!(!found.is_empty(), "{series}");
    assert!(found.iter().all(|s| s["labels"]["lagscope.namespace"] == namespace.as_str()));
    let raw_points: usize = found.iter().map(|s| s["points"].as_array().map_or(0, Vec::len)).sum();
    let stepped = api.get("/api/v1/series", &format!("{base}&step=5s"), 200).await;
    let stepped_points: usize =
        stepped["series"].as_array().expect("list").iter().map(|s| s["points"].as_array().map_or(0, Vec::len)).sum();
    assert!(
        stepped_points > 0 && stepped_points < raw_points,
        "a 5 s step keeps fewer points: {stepped_points} of {raw_points}"
    );
    let none = api.get("/api/v1/series", "/api/v1/series?name=no.such.metric", 200).await;
    assert_eq!(none["series"], json!([]));
    api.bad("/api/v1/series", "/api/v1/series", "name").await;
    api.bad("/api/v1/series", "/api/v1/series?name=m&match[]=novalue", "match[]").await;
    api.bad("/api/v1/series", "/api/v1/series?name=m&step=soon", "step").await;
    api.bad("/api/v1/series", "/api/v1/series?name=m&from=yesterday", "from").await;

    // Lag analytics over the simulated range.
    let (from, to) = (1_767_225_600 - 60, 1_767_225_600 + 120);
    let lag = api.get("/api/v1/lag", &format!("/api/v1/lag?from={from}&to={to}&step=10s"), 200).await;
    assert!(lag["input"]["spans"].as_u64().unwrap_or(0) > 0, "{}", lag["input"]);
    api.bad("/api/v1/lag", "/api/v1/lag?step=soon", "step").await;
    // The same range from the live analyzer's rollups: every read counted.
    let staleness = api.get("/api/v1/staleness", &format!("/api/v1/staleness?from={from}&to={to}"), 200).await;
    let reads: u64 = staleness["nodes"].as_array().expect("nodes").iter().filter_map(|n| n["reads"].as_u64()).sum();
    assert!(reads > 0, "{staleness}");
    let hdfs = api.get("/api/v1/staleness", &format!("/api/v1/staleness?from={from}&to={to}&cluster=none"), 200).await;
    assert_eq!(hdfs["nodes"], json!([]));
    api.bad("/api/v1/staleness", &format!("/api/v1/staleness?from={to}&to={from}"), "from").await;
    api.bad("/api/v1/staleness", "/api/v1/staleness?nodes=1", "nodes").await;

    // Alert deliveries (none configured here: an empty, well-formed list).
    let alerts = api.get("/api/v1/alerts", "/api/v1/alerts?limit=10", 200).await;
    assert_eq!(alerts["messages"], json!([]));
    api.bad("/api/v1/alerts", "/api/v1/alerts?before=soon", "before").await;

    // /metrics: the findings as gauges, and every metric the Grafana dashboards query.
    let text =
        reqwest::get(format!("http://{}/metrics", server.api_addr)).await.expect("scrape").text().await.expect("text");
    for family in
        ["lagscope_anomalies_open{", "lagscope_window_open_seconds{", "lagscope_reads{", "lagscope_read_behind_states{"]
    {
        assert!(text.contains(family), "/metrics lacks {family}");
    }
    // The read gauges count every read of the last minutes, as the raw lag analytics do (they
    // once counted only the oldest 20 000 spans' reads of the last minute: the feed has more).
    let gauge_reads: f64 = text
        .lines()
        .filter(|line| line.starts_with("lagscope_reads{"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    let lag = api.get("/api/v1/lag", "/api/v1/lag?from=0", 200).await;
    assert_eq!(lag["input"]["truncated"], false, "{:#}", lag["input"]);
    assert!(lag["input"]["spans"].as_u64().unwrap_or(0) > 20_000, "{:#}", lag["input"]);
    let raw_reads: u64 =
        lag["reads"].as_array().expect("reads").iter().filter_map(|bucket| bucket["reads"].as_u64()).sum();
    assert!(raw_reads > 0);
    assert_eq!(gauge_reads, raw_reads as f64, "/metrics reads against /api/v1/lag's");
    let exported: BTreeSet<&str> =
        text.lines().filter(|line| !line.starts_with('#')).filter_map(|line| line.split(['{', ' ']).next()).collect();
    let grafana = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../dashboards/grafana");
    let mut checked = 0;
    for entry in std::fs::read_dir(&grafana).expect("dashboards/grafana") {
        let path = entry.expect("entry").path();
        let dashboard: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("Grafana JSON");
        let mut expressions = Vec::new();
        collect_exprs(&dashboard, &mut expressions);
        assert!(!expressions.is_empty(), "{} queries nothing", path.display());
        for expression in expressions {
            for metric in metric_names(&expression) {
                assert!(
                    exported.contains(metric.as_str()),
                    "{}: {metric} (in {expression}) is not in /metrics",
                    path.display()
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 5, "the Grafana dashboards query lagscope's metrics");

    server.shutdown().await.expect("clean shutdown");
}

/// Every `expr` (and templating `query`) string of a Grafana dashboard.
fn collect_exprs(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(object) => {
            for (key, field) in object {
                match (key.as_str(), field) {
                    ("expr" | "definition", Value::String(text)) => out.push(text.clone()),
                    _ => collect_exprs(field, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| collect_exprs(item, out)),
        _ => {}
    }
}

/// The `lagscope_*` metric names a PromQL expression reads.
fn metric_names(expression: &str) -> Vec<String> {
    let mut names = Vec::new();
    let bytes = expression.as_bytes();
    let mut index = 0;
    while let Some(found) = expression[index..].find("lagscope_") {
        let start = index + found;
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        names.push(expression[start..end].to_string());
        index = end;
    }
    names
}
