//! `lagscope sim --serve-native ADDR`: serves what the simulated nodes would expose, so that
//! scrapers can be pointed at them: `/{node}/jmx`, `/{node}/_nodes/stats/indexing_pressure`,
//! `/{node}/_nodes/stats/shard_indexing_pressure`, and Prometheus text on `/metrics`.

use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use lagscope_sim::native::{
    NodeState, es_indexing_pressure, hadoop_jmx, opensearch_shard_indexing_pressure, ozone_jmx, prometheus_text,
};
use serde_json::json;

use crate::sim_cmd::NativeHandle;

pub fn router(native: NativeHandle) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/metrics", get(metrics))
        .route("/{node}/jmx", get(jmx))
        .route("/{node}/_nodes/stats/indexing_pressure", get(indexing_pressure))
        .route("/{node}/_nodes/stats/shard_indexing_pressure", get(shard_indexing_pressure))
        .with_state(native)
}

fn with_node(native: &NativeHandle, node: &str, render: impl Fn(&str, &NodeState) -> serde_json::Value) -> Response {
    let state = native.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    match state.nodes.get(node) {
        Some(node_state) => Json(render(node, node_state)).into_response(),
        None => {
            let known: Vec<&String> = state.nodes.keys().collect();
            (StatusCode::NOT_FOUND, Json(json!({ "error": format!("no simulated node {node:?}"), "nodes": known })))
                .into_response()
        }
    }
}

async fn index(State(native): State<NativeHandle>) -> Json<serde_json::Value> {
    let state = native.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let nodes: Vec<serde_json::Value> = state
        .nodes
        .iter()
        .map(|(node, node_state)| {
            let path = match node_state.system.as_str() {
                "elasticsearch" => format!("/{node}/_nodes/stats/indexing_pressure"),
                _ => format!("/{node}/jmx"),
            };
            json!({ "node": node, "system": node_state.system, "cluster": node_state.cluster, "path": path })
        })
        .collect();
    Json(json!({ "nodes": nodes, "prometheus": "/metrics" }))
}

async fn metrics(State(native): State<NativeHandle>) -> impl IntoResponse {
    let text = prometheus_text(&native.lock().unwrap_or_else(|poisoned| poisoned.into_inner()));
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text)
}

async fn jmx(State(native): State<NativeHandle>, Path(node): Path<String>) -> Response {
    with_node(
        &native,
        &node,
        |node, state| if state.system == "ozone" { ozone_jmx(node, state) } else { hadoop_jmx(node, state) },
    )
}

async fn indexing_pressure(State(native): State<NativeHandle>, Path(node): Path<String>) -> Response {
    with_node(&native, &node, es_indexing_pressure)
}

async fn shard_indexing_pressure(State(native): State<NativeHandle>, Path(node): Path<String>) -> Response {
    with_node(&native, &node, opensearch_shard_indexing_pressure)
}
