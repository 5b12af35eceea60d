//! The query API beyond anomalies and timelines: metric series, windows, discovery of
//! clusters, namespaces, nodes and clients, and the OpenAPI document that describes it all.
//!
//! Lists page the same way everywhere: `limit` (default 100, at most 1000) and a cursor
//! parameter (`before` for anomalies and windows, newest first; `after` for clients, in
//! order); a response carries the cursor of the next page (`next_before` / `next_after`) and
//! a ready `next` link, both `null` on the last page.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{RawQuery, State};
use axum::http::header;
use axum::response::IntoResponse;
use lagscope_model::AnomalyKind;
use lagscope_store::{AnomalyFilter, Scope, TimeRange};
use serde_json::{Value, json};

use crate::api::anomaly_json;
use crate::{ApiError, ApiState, parse_step, parse_time};

/// Default and largest page of a list.
pub const DEFAULT_LIMIT: u32 = 100;
pub const MAX_LIMIT: u32 = 1000;
/// The most points one series request returns per series (a coarser `step` gives fewer).
pub const MAX_POINTS_PER_SERIES: usize = 11_000;
/// The most series one request returns.
pub const MAX_SERIES: usize = 500;
/// A series request's range when it names none: the last hour of the data.
const DEFAULT_SERIES_RANGE: i64 = 3_600 * 1_000_000_000;

/// The OpenAPI document (`/api/v1/openapi.json`).
pub const OPENAPI: &str = include_str!("openapi.json");

/// Query parameters as pairs, repeated keys kept (`match[]`), unknown keys refused.
struct Params(Vec<(String, String)>);

impl Params {
    fn parse(raw: Option<String>, known: &[&str]) -> Result<Self, ApiError> {
        let pairs: Vec<(String, String)> = form_urlencoded::parse(raw.unwrap_or_default().as_bytes())
            .map(|(key, value)| (key.into_owned(), value.into_owned()))
            .collect();
        if let Some((key, _)) = pairs.iter().find(|(key, _)| !known.contains(&key.as_str())) {
            let takes = if known.is_empty() {
                "this endpoint takes no parameters".to_owned()
            } else {
                format!("this endpoint takes: {}", known.join(", "))
            };
            return Err(ApiError::BadRequest(format!("unknown parameter {key:?} ({takes})")));
        }
        Ok(Self(pairs))
    }

    fn one(&self, name: &str) -> Result<Option<&str>, ApiError> {
        let mut values = self.0.iter().filter(|(key, _)| key == name).map(|(_, value)| value.as_str());
        let first = values.next();
        if values.next().is_some() {
            return Err(ApiError::BadRequest(format!("parameter {name} is given more than once")));
        }
        Ok(first.filter(|value| !value.is_empty()))
    }

    fn all(&self, name: &str) -> impl Iterator<Item = &str> {
        self.0.iter().filter(move |(key, _)| key == name).map(|(_, value)| value.as_str())
    }

    fn time(&self, name: &str) -> Result<Option<i64>, ApiError> {
        self.one(name)?.map(|text| parse_time(name, text).map_err(ApiError::BadRequest)).transpose()
    }

    fn limit(&self) -> Result<u32, ApiError> {
        match self.one("limit")? {
            None => Ok(DEFAULT_LIMIT),
            Some(text) => text.parse::<u32>().ok().filter(|limit| (1..=MAX_LIMIT).contains(limit)).ok_or_else(|| {
                ApiError::BadRequest(format!("parameter limit: {text:?} is not a number from 1 to {MAX_LIMIT}"))
            }),
        }
    }

    /// The query string of the next page: these parameters with `cursor` set to `value`.
    fn next_link(&self, path: &str, cursor: &str, value: &str) -> String {
        let mut serializer = form_urlencoded::Serializer::new(String::new());
        for (key, existing) in &self.0 {
            if key != cursor {
                serializer.append_pair(key, existing);
            }
        }
        serializer.append_pair(cursor, value);
        format!("{path}?{}", serializer.finish())
    }
}

/// `GET /api/v1/series?name=&match[]=label=value&from=&to=&step=`: the series of one metric
/// whose labels match every matcher, with their points in the range; with `step`, the last
/// value of each step.
pub async fn series(State(state): State<ApiState>, RawQuery(raw): RawQuery) -> Result<Json<Value>, ApiError> {
    let params = Params::parse(raw, &["name", "match[]", "from", "to", "step"])?;
    let name = params.one("name")?.ok_or_else(|| ApiError::BadRequest("parameter name is required".to_string()))?;
    let matchers = params
        .all("match[]")
        .map(|matcher| match matcher.split_once('=') {
            Some((label, value)) if !label.is_empty() => Ok((label.to_string(), value.to_string())),
            _ => Err(ApiError::BadRequest(format!("parameter match[]: {matcher:?} is not label=value"))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let step = params
        .one("step")?
        .map(|text| parse_step(text).map(|seconds| seconds * 1_000_000_000).map_err(ApiError::BadRequest))
        .transpose()?;
    let to = match params.time("to")? {
        Some(to) => to,
        None => state.store.latest_time().await?.map_or(i64::MAX, |latest| latest.saturating_add(1)),
    };
    let from = params.time("from")?.unwrap_or_else(|| to.saturating_sub(DEFAULT_SERIES_RANGE));
    if from >= to {
        return Err(ApiError::BadRequest("parameter from must be before to".to_string()));
    }
    let found = state.store.series_samples(name, &matchers, TimeRange { from, to }).await?;
    let truncated_series = found.len() > MAX_SERIES;
    let mut truncated_points = false;
    let series: Vec<Value> = found
        .iter()
        .take(MAX_SERIES)
        .map(|series| {
            let mut points: Vec<(i64, Value)> = series
                .points
                .iter()
                .map(|(at, number, other)| {
                    let value = match (number, other) {
                        (Some(number), _) if number.is_finite() => json!(number),
                        (_, Some(other)) => other.clone(),
                        _ => Value::Null,
                    };
                    (*at, value)
                })
                .collect();
            if let Some(step) = step {
                let mut last: BTreeMap<i64, (i64, Value)> = BTreeMap::new();
                for (at, value) in points {
                    last.insert((at - from).div_euclid(step), (at, value));
                }
                points = last.into_values().collect();
            }
            if points.len() > MAX_POINTS_PER_SERIES {
                truncated_points = true;
                points.truncate(MAX_POINTS_PER_SERIES);
            }
            json!({
                "name": series.key.name,
                "labels": series.key.labels,
                "kind": series.meta.kind,
                "unit": series.meta.unit,
                "points": points.into_iter().map(|(at, value)| json!([at, value])).collect::<Vec<_>>(),
            })
        })
        .collect();
    Ok(Json(json!({
        "from_unix_nano": from,
        "to_unix_nano": to,
        "step_seconds": step.map(|step| step / 1_000_000_000),
        "series": series,
        "truncated": truncated_series || truncated_points,
    })))
}

/// `GET /api/v1/windows`: window anomalies (a condition that held for a while), newest first,
/// with their duration and whether they are still open.
pub async fn windows(State(state): State<ApiState>, RawQuery(raw): RawQuery) -> Result<Json<Value>, ApiError> {
    let params = Params::parse(raw, &["kind", "cluster", "namespace", "status", "from", "to", "limit", "before"])?;
    let window_kinds: Vec<AnomalyKind> = AnomalyKind::ALL.iter().copied().filter(|kind| kind.is_window()).collect();
    let kinds = match params.one("kind")? {
        None => window_kinds.clone(),
        Some(text) => {
            let kind = AnomalyKind::parse(text).filter(|kind| kind.is_window()).ok_or_else(|| {
                let known: Vec<&str> = window_kinds.iter().map(|kind| kind.as_str()).collect();
                ApiError::BadRequest(format!(
                    "parameter kind: {text:?} is not a window kind (known: {})",
                    known.join(", ")
                ))
            })?;
            vec![kind]
        }
    };
    let open = match params.one("status")? {
        None => None,
        Some("open") => Some(true),
        Some("resolved") => Some(false),
        Some(other) => {
            return Err(ApiError::BadRequest(format!("parameter status: {other:?} is neither open nor resolved")));
        }
    };
    let before_id = params
        .one("before")?
        .map(|text| {
            text.parse::<i64>().map_err(|_| ApiError::BadRequest(format!("parameter before: {text:?} is not an id")))
        })
        .transpose()?;
    let limit = params.limit()?;
    // One read per kind, merged newest first (ids grow with first report).
    let mut found = Vec::new();
    for kind in kinds {
        let filter = AnomalyFilter {
            kind: Some(kind),
            cluster: params.one("cluster")?.map(str::to_string),
            namespace: params.one("namespace")?.map(str::to_string),
            since: params.time("from")?,
            until: params.time("to")?,
            before_id,
            open,
            limit,
            ..AnomalyFilter::default()
        };
        found.extend(state.store.anomalies(&filter).await?);
    }
    found.sort_by_key(|stored| std::cmp::Reverse(stored.id));
    found.truncate(limit as usize);
    let next_before = (found.len() == limit as usize).then(|| found.last().map(|last| last.id)).flatten();
    let windows: Vec<Value> = found
        .iter()
        .map(|stored| {
            let mut value = anomaly_json(stored);
            value["duration_seconds"] =
                json!((stored.anomaly.end_unix_nano - stored.anomaly.start_unix_nano) as f64 / 1e9);
            value
        })
        .collect();
    Ok(Json(json!({
        "windows": windows,
        "next_before": next_before,
        "next": next_before.map(|id| params.next_link("/api/v1/windows", "before", &id.to_string())),
    })))
}

fn filter_scopes<'a>(
    scopes: &'a [Scope],
    cluster: Option<&'a str>,
    namespace: Option<&'a str>,
) -> impl Iterator<Item = &'a Scope> {
    scopes.iter().filter(move |scope| {
        cluster.is_none_or(|cluster| scope.cluster.as_deref() == Some(cluster))
            && namespace.is_none_or(|namespace| scope.namespace.as_deref() == Some(namespace))
    })
}

/// `GET /api/v1/clusters`: the clusters metric series name, with their namespaces and nodes.
pub async fn clusters(State(state): State<ApiState>, RawQuery(raw): RawQuery) -> Result<Json<Value>, ApiError> {
    Params::parse(raw, &[])?;
    let scopes = state.store.scopes().await?;
    let mut clusters: BTreeMap<Option<String>, (Vec<String>, Vec<String>)> = BTreeMap::new();
    for scope in &scopes {
        let (namespaces, nodes) = clusters.entry(scope.cluster.clone()).or_default();
        namespaces.extend(scope.namespace.clone());
        nodes.extend(scope.node_id.clone());
    }
    let clusters: Vec<Value> = clusters
        .into_iter()
        .map(|(cluster, (mut namespaces, mut nodes))| {
            namespaces.sort();
            namespaces.dedup();
            nodes.sort();
            nodes.dedup();
            json!({ "cluster": cluster, "namespaces": namespaces, "nodes": nodes })
        })
        .collect();
    Ok(Json(json!({ "clusters": clusters })))
}

/// `GET /api/v1/namespaces?cluster=`: namespaces with the nodes that report for them.
pub async fn namespaces(State(state): State<ApiState>, RawQuery(raw): RawQuery) -> Result<Json<Value>, ApiError> {
    let params = Params::parse(raw, &["cluster"])?;
    let scopes = state.store.scopes().await?;
    let mut namespaces: BTreeMap<(Option<String>, String), Vec<String>> = BTreeMap::new();
    for scope in filter_scopes(&scopes, params.one("cluster")?, None) {
        let Some(namespace) = &scope.namespace else { continue };
        let nodes = namespaces.entry((scope.cluster.clone(), namespace.clone())).or_default();
        nodes.extend(scope.node_id.clone());
    }
    let namespaces: Vec<Value> = namespaces
        .into_iter()
        .map(|((cluster, namespace), mut nodes)| {
            nodes.sort();
            nodes.dedup();
            json!({ "cluster": cluster, "namespace": namespace, "nodes": nodes })
        })
        .collect();
    Ok(Json(json!({ "namespaces": namespaces })))
}

/// `GET /api/v1/nodes?cluster=&namespace=`: the nodes metric series name.
pub async fn nodes(State(state): State<ApiState>, RawQuery(raw): RawQuery) -> Result<Json<Value>, ApiError> {
    let params = Params::parse(raw, &["cluster", "namespace"])?;
    let scopes = state.store.scopes().await?;
    let nodes: Vec<Value> = filter_scopes(&scopes, params.one("cluster")?, params.one("namespace")?)
        .filter(|scope| scope.node_id.is_some())
        .map(|scope| json!({ "cluster": scope.cluster, "namespace": scope.namespace, "node": scope.node_id }))
        .collect();
    Ok(Json(json!({ "nodes": nodes })))
}

/// `GET /api/v1/clients?after=&limit=`: client ids in order, a page at a time.
pub async fn clients(State(state): State<ApiState>, RawQuery(raw): RawQuery) -> Result<Json<Value>, ApiError> {
    let params = Params::parse(raw, &["after", "limit"])?;
    let limit = params.limit()?;
    let clients = state.store.clients(params.one("after")?, limit).await?;
    let next_after = (clients.len() == limit as usize).then(|| clients.last().cloned()).flatten();
    Ok(Json(json!({
        "clients": clients,
        "next_after": next_after,
        "next": next_after.as_deref().map(|after| params.next_link("/api/v1/clients", "after", after)),
    })))
}

/// `GET /api/v1/alerts?before=&limit=`: the alert messages lagscope enqueued for its receivers,
/// newest first, with their delivery state (pending, delivered, failed), attempts and last
/// error.
pub async fn alerts(State(state): State<ApiState>, RawQuery(raw): RawQuery) -> Result<Json<Value>, ApiError> {
    let params = Params::parse(raw, &["before", "limit"])?;
    let limit = params.limit()?;
    let before = params
        .one("before")?
        .map(|text| {
            text.parse::<i64>()
                .map_err(|_| ApiError::BadRequest(format!("parameter before: {text:?} is not a message id")))
        })
        .transpose()?;
    let messages = state.store.alert_messages(before, limit).await?;
    let next_before = (messages.len() == limit as usize).then(|| messages.last().map(|last| last.id)).flatten();
    let messages: Vec<Value> = messages
        .into_iter()
        .map(|message| {
            let body: Value = serde_json::from_str(&message.body).unwrap_or(Value::Null);
            let mut value = serde_json::to_value(&message).unwrap_or(Value::Null);
            value["body"] = body;
            value
        })
        .collect();
    Ok(Json(json!({
        "messages": messages,
        "next_before": next_before,
        "next": next_before.map(|id| params.next_link("/api/v1/alerts", "before", &id.to_string())),
    })))
}

/// `GET /api/v1/openapi.json`.
pub async fn openapi() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_keep_repeats_and_refuse_unknown_keys() {
        let params =
            Params::parse(Some("name=m&match[]=a%3Db&match[]=c=d".to_string()), &["name", "match[]"]).expect("ok");
        assert_eq!(params.all("match[]").collect::<Vec<_>>(), vec!["a=b", "c=d"]);
        let error = Params::parse(Some("nmae=m".to_string()), &["name"]).err().expect("unknown");
        assert!(error.to_string().contains("nmae"), "{error}");
        assert!(error.to_string().contains("takes: name"), "{error}");
        let none = Params::parse(Some("limit=5".to_string()), &[]).err().expect("takes none");
        assert!(none.to_string().contains("takes no parameters"), "{none}");
        let twice = Params::parse(Some("name=a&name=b".to_string()), &["name"]).expect("parses");
        assert!(twice.one("name").is_err());
        let link = Params::parse(Some("limit=2&after=x".to_string()), &["limit", "after"])
            .expect("ok")
            .next_link("/p", "after", "y&z");
        assert_eq!(link, "/p?limit=2&after=y%26z");
    }

    #[test]
    fn the_openapi_document_is_json_and_names_every_route() {
        let document: Value = serde_json::from_str(OPENAPI).expect("valid JSON");
        assert_eq!(document["openapi"], "3.1.0");
        for path in [
            "/api/v1/health",
            "/api/v1/anomalies",
            "/api/v1/anomalies/{id}",
            "/api/v1/clients/{client_id}/timeline",
            "/api/v1/lag",
            "/api/v1/series",
            "/api/v1/windows",
            "/api/v1/clusters",
            "/api/v1/namespaces",
            "/api/v1/nodes",
            "/api/v1/clients",
            "/api/v1/cluster",
        ] {
            assert!(document["paths"][path].is_object(), "{path} is not documented");
        }
    }
}
