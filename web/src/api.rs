//! The `/api/v1` routes and `/metrics`.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use lagscope_analyzer::build_timelines;
use lagscope_model::AnomalyKind;
use lagscope_selfmetrics::SelfMetrics;
use lagscope_store::{AnomalyFilter, Store, StoredAnomaly, TimeRange};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::{ApiError, parse_time};

/// Default and largest page of anomalies.
const DEFAULT_LIMIT: u32 = 100;
const MAX_LIMIT: u32 = 1000;
/// The most of one client's spans a timeline request reads (the most recent ones).
pub const MAX_TIMELINE_SPANS: u32 = 50_000;

/// What the API reads.
#[derive(Clone)]
pub struct ApiState {
    pub store: Arc<dyn Store>,
    pub metrics: Arc<SelfMetrics>,
    /// Aggregates lag analytics (`None`: `/api/v1/lag` answers 503).
    pub lag: Option<crate::LagAggregator>,
    /// This instance's id among the instances sharing the database (`/api/v1/cluster`).
    pub instance: Option<String>,
    /// How long a call id names one call (the analyzer's horizon, in nanoseconds), for the
    /// timelines built here to group attempts into calls as the analyzer did.
    pub call_horizon: i64,
    /// `/api/v1/lag` requests served at once ([`crate::LagTurns`]).
    pub lag_turns: crate::LagTurns,
}

pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/api/v1/health", get(health))
        .route("/api/v1/anomalies", get(list_anomalies))
        .route("/api/v1/anomalies/{id}", get(get_anomaly))
        .route("/api/v1/clients/{client_id}/timeline", get(client_timeline))
        .route("/api/v1/lag", get(crate::lag::lag))
        .route("/api/v1/staleness", get(crate::lag::staleness))
        .route("/api/v1/cluster", get(cluster))
        .route("/api/v1/series", get(crate::query::series))
        .route("/api/v1/windows", get(crate::query::windows))
        .route("/api/v1/clusters", get(crate::query::clusters))
        .route("/api/v1/namespaces", get(crate::query::namespaces))
        .route("/api/v1/nodes", get(crate::query::nodes))
        .route("/api/v1/clients", get(crate::query::clients))
        .route("/api/v1/alerts", get(crate::query::alerts))
        .route("/api/v1/openapi.json", get(crate::query::openapi))
        .route("/metrics", get(metrics))
        .with_state(state)
}

async fn health(State(state): State<ApiState>) -> Result<Json<Value>, ApiError> {
    let stats = state.store.stats().await?;
    Ok(Json(json!({
        "status": "ok",
        "version": env!("CARGO_PKG_VERSION"),
        "store": {
            "spans": stats.spans,
            "series": stats.series,
            "samples": stats.samples,
            "logs": stats.logs,
            "anomalies": stats.anomalies,
        },
        "analysis": {
            "batches_marked": state.metrics.batches_marked.get(),
            "batches_analyzed": state.metrics.batches_analyzed.get(),
            "late_spans_total": state.metrics.analysis_late_spans.get(),
            "scope_late_spans_total": state.metrics.analysis_scope_late_spans.get(),
            "settle_seconds": state.metrics.analysis_settle_seconds.get(),
        },
        "ingest": {
            "queue_bytes": state.metrics.ingest_queue_bytes.get(),
            "queue_capacity_bytes": state.metrics.ingest_queue_capacity_bytes.get(),
            "queue_full_total": state.metrics.ingest_queue_full.get(),
            "commits_total": state.metrics.ingest_commits.get(),
            "committed_requests_total": state.metrics.ingest_committed_requests.get(),
        },
        "scrape": scrape_health(&state.metrics),
    })))
}

/// The instances sharing the database, the analysis shards each holds, and the marks waiting
/// to be analysed. A store only one process uses says so.
async fn cluster(State(state): State<ApiState>) -> Result<Json<Value>, ApiError> {
    let Some(coordinator) = state.store.coordinator() else {
        return Ok(Json(json!({ "shared": false, "instance": state.instance })));
    };
    let status = coordinator.status().await?;
    let instances: Vec<Value> = status
        .instances
        .iter()
        .map(|instance| {
            json!({
                "instance": instance.instance,
                "alive": instance.alive,
                "heartbeat_age_ms": instance.heartbeat_age_ms,
                "lease_ms": instance.lease_ms,
                "shards": instance.shards,
            })
        })
        .collect();
    Ok(Json(json!({
        "shared": true,
        "instance": state.instance,
        "shards": status.shards,
        "instances": instances,
        "unowned_shards": status.unowned_shards,
        "pending_marks": status.pending_marks,
    })))
}

/// Each scrape target's health, by name.
fn scrape_health(metrics: &SelfMetrics) -> Value {
    let nanos_to_rfc3339 = |nanos: Option<i64>| {
        nanos.and_then(|nanos| jiff::Timestamp::from_nanosecond(i128::from(nanos)).ok()).map(|time| time.to_string())
    };
    metrics
        .scrapes
        .snapshot()
        .into_iter()
        .map(|(name, status)| {
            (
                name,
                json!({
                    "url": status.url,
                    "kind": status.kind,
                    "up": status.up,
                    "last_scrape": nanos_to_rfc3339(status.last_scrape_unix_nano),
                    "last_success": nanos_to_rfc3339(status.last_success_unix_nano),
                    "duration_seconds": status.duration_seconds,
                    "samples": status.samples,
                    "scrapes": status.scrapes,
                    "failures": status.failures,
                    "last_error": status.last_error,
                }),
            )
        })
        .collect::<serde_json::Map<String, Value>>()
        .into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AnomalyQuery {
    kind: Option<String>,
    cluster: Option<String>,
    namespace: Option<String>,
    client: Option<String>,
    since: Option<String>,
    until: Option<String>,
    limit: Option<String>,
    /// Paging: only anomalies with an id below this (the previous page's `next_before`).
    before: Option<String>,
    /// `open` (condition still holding) or `resolved`.
    status: Option<String>,
}

async fn list_anomalies(
    State(state): State<ApiState>,
    query: Result<Query<AnomalyQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(query) = query.map_err(|rejection| ApiError::BadRequest(rejection.body_text()))?;
    let (query_kind, query_since, query_until, query_status) =
        (query.kind.clone(), query.since.clone(), query.until.clone(), query.status.clone());
    let kind = query
        .kind
        .as_deref()
        .map(|text| {
            AnomalyKind::parse(text).ok_or_else(|| {
                let known: Vec<&str> = AnomalyKind::ALL.iter().map(|kind| kind.as_str()).collect();
                ApiError::BadRequest(format!("parameter kind: unknown kind {text:?} (known: {})", known.join(", ")))
            })
        })
        .transpose()?;
    let limit = match query.limit.as_deref() {
        None => DEFAULT_LIMIT,
        Some(text) => text.parse::<u32>().ok().filter(|limit| (1..=MAX_LIMIT).contains(limit)).ok_or_else(|| {
            ApiError::BadRequest(format!("parameter limit: {text:?} is not a number from 1 to {MAX_LIMIT}"))
        })?,
    };
    let before_id = query
        .before
        .as_deref()
        .map(|text| {
            text.parse::<i64>()
                .map_err(|_| ApiError::BadRequest(format!("parameter before: {text:?} is not an anomaly id")))
        })
        .transpose()?;
    let open = match query.status.as_deref() {
        None => None,
        Some("open") => Some(true),
        Some("resolved") => Some(false),
        Some(other) => {
            return Err(ApiError::BadRequest(format!("parameter status: {other:?} is neither open nor resolved")));
        }
    };
    let filter = AnomalyFilter {
        open,
        kind,
        cluster: query.cluster,
        namespace: query.namespace,
        client_id: query.client,
        since: optional_time("since", query.since.as_deref())?,
        until: optional_time("until", query.until.as_deref())?,
        before_id,
        limit,
        // The API's anomalies carry their evidence.
        skip_evidence: false,
    };
    let anomalies = state.store.anomalies(&filter).await?;
    let next_before = (anomalies.len() == limit as usize).then(|| anomalies.last().map(|last| last.id)).flatten();
    let next = next_before.map(|id| {
        let mut serializer = form_urlencoded::Serializer::new(String::new());
        for (key, value) in [
            ("kind", query_kind.as_deref()),
            ("cluster", filter.cluster.as_deref()),
            ("namespace", filter.namespace.as_deref()),
            ("client", filter.client_id.as_deref()),
            ("since", query_since.as_deref()),
            ("until", query_until.as_deref()),
            ("status", query_status.as_deref()),
        ] {
            if let Some(value) = value {
                serializer.append_pair(key, value);
            }
        }
        serializer.append_pair("limit", &limit.to_string()).append_pair("before", &id.to_string());
        format!("/api/v1/anomalies?{}", serializer.finish())
    });
    Ok(Json(json!({
        "anomalies": anomalies.iter().map(anomaly_json).collect::<Vec<_>>(),
        "next_before": next_before,
        "next": next,
    })))
}

async fn get_anomaly(State(state): State<ApiState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let id: i64 = id.parse().map_err(|_| ApiError::BadRequest(format!("anomaly id {id:?} is not a number")))?;
    let stored =
        state.store.anomaly(id).await?.ok_or_else(|| ApiError::NotFound(format!("no anomaly with id {id}")))?;
    Ok(Json(anomaly_json(&stored)))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TimelineQuery {
    from: Option<String>,
    to: Option<String>,
}

async fn client_timeline(
    State(state): State<ApiState>,
    Path(client_id): Path<String>,
    query: Result<Query<TimelineQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(query) = query.map_err(|rejection| ApiError::BadRequest(rejection.body_text()))?;
    let range = TimeRange {
        from: optional_time("from", query.from.as_deref())?.unwrap_or(i64::MIN),
        to: optional_time("to", query.to.as_deref())?.unwrap_or(i64::MAX),
    };
    if range.from >= range.to {
        return Err(ApiError::BadRequest("parameter from must be before to".to_string()));
    }
    let spans = state.store.client_spans(&client_id, range, MAX_TIMELINE_SPANS).await?;
    let own_spans = spans.iter().filter(|span| span.call.client_id.as_deref() == Some(client_id.as_str())).count();
    let mut timelines: Vec<_> = build_timelines(&spans, state.call_horizon)
        .into_iter()
        .filter(|timeline| timeline.client_id == client_id)
        .collect();
    // What the metrics said about the nodes and namespaces at each attempt.
    for timeline in &mut timelines {
        crate::enrich_timeline(state.store.as_ref(), timeline).await?;
    }
    if timelines.is_empty() {
        return Err(ApiError::NotFound(format!("no spans of client {client_id:?} in the requested range")));
    }
    Ok(Json(json!({
        "client_id": client_id,
        "timelines": timelines,
        "truncated": own_spans >= MAX_TIMELINE_SPANS as usize,
    })))
}

async fn metrics(State(state): State<ApiState>) -> impl IntoResponse {
    let mut text = state.metrics.render(&[(
        "lagscope_api_lag_requests_served",
        "/api/v1/lag requests being served now (at most server.max_concurrent_lag_requests).",
        state.lag_turns.taken() as f64,
    )]);
    // The findings as gauges; the service's own counters are served even if the store fails.
    match crate::prometheus::analysis_gauges(&state).await {
        Ok(gauges) => text.push_str(&gauges),
        Err(error) => tracing::warn!(%error, "/metrics: the analysis gauges could not be read"),
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text)
}

fn optional_time(name: &str, text: Option<&str>) -> Result<Option<i64>, ApiError> {
    text.map(|text| parse_time(name, text).map_err(ApiError::BadRequest)).transpose()
}

/// An anomaly as the API shows it: the analyzer's fields plus its id and first/last report,
/// and, for one replaced by a whole version of the same incident (read by id only), that one's
/// id (`superseded_by`).
pub fn anomaly_json(stored: &StoredAnomaly) -> Value {
    let mut value = serde_json::to_value(&stored.anomaly).unwrap_or(Value::Null);
    if let Value::Object(object) = &mut value {
        let mut extra: BTreeMap<&str, Value> = BTreeMap::from([
            ("id", json!(stored.id)),
            ("first_seen_unix_nano", json!(stored.first_seen_unix_nano)),
            ("last_seen_unix_nano", json!(stored.last_seen_unix_nano)),
        ]);
        if let Some(by) = stored.superseded_by {
            extra.insert("superseded_by", json!(by));
        }
        for (key, field) in extra {
            object.insert(key.to_string(), field);
        }
    }
    value
}
