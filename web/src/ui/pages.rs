//! The page handlers.

use std::collections::{BTreeMap, HashMap};

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use lagscope_analyzer::build_timelines;
use lagscope_model::conventions::METRIC_COMMITTED_STATE;
use lagscope_model::{AnomalyKind, ClientTimeline, Outcome, Severity, Span};
use lagscope_selfmetrics::SelfMetrics;
use lagscope_store::{AlertMessage, AnomalyFilter, Reduce, StoredAnomaly, TimeRange};
use serde::{Deserialize, Serialize};

use super::charts::{self, Bar, Line, STATE_UNIT};
use super::panels::{self, PanelView};
use super::{Cell, PageRange, RangeParams, Table, UiState, client_link, duration_text, encode_path, time_text};
use crate::ApiError;

mod timeline;

use timeline::timeline_view;

/// Anomalies of each kind the overview reads at most from its range (the newest): a storm of
/// one kind (thousands of stale reads a minute) cannot push the other kinds, and the clusters
/// they name, off the page.
const OVERVIEW_PER_KIND: u32 = 1000;
/// A cluster with open anomalies whose telemetry stops this long before the store's newest
/// is called silent on the overview.
const SILENT_AFTER: i64 = 5 * 60 * 1_000_000_000;
/// Alert messages the overview reads (newest first), and lists.
const OVERVIEW_ALERT_MESSAGES: u32 = 200;
const OVERVIEW_ALERTS_LISTED: usize = 10;
/// The most recent anomalies the overview lists.
const OVERVIEW_LISTED: usize = 50;
/// A client's spans a timeline page reads at most (the most recent of the range).
pub const MAX_PAGE_SPANS: u32 = 2_000;
/// The client's most recent spans whose time a timeline page shows when it names no range.
const DEFAULT_CLIENT_SPANS: u32 = 200;
/// Calls a timeline page draws at most (the most recent).
pub const MAX_PAGE_CALLS: usize = 300;
/// How much of a client's timeline an anomaly page shows around the anomaly.
const ANOMALY_CONTEXT: i64 = 30 * 1_000_000_000;

fn query_params<T>(query: Result<Query<T>, QueryRejection>) -> Result<T, ApiError> {
    query.map(|Query(params)| params).map_err(|rejection| ApiError::BadRequest(rejection.body_text()))
}

#[derive(Debug, Serialize, Default)]
struct KindRow {
    kind: String,
    open: usize,
    /// Counted from the newest `OVERVIEW_PER_KIND` of the kind in range.
    in_range: usize,
    critical: usize,
    /// The kind had more in range than the page read: its counts are lower bounds.
    cut: bool,
}

/// A cluster's anomalies as the overview counts them.
#[derive(Debug)]
struct ClusterCount {
    open: usize,
    in_range: usize,
    worst: Severity,
    /// Some of its in-range anomalies are of a kind the page cut.
    cut: bool,
}

impl Default for ClusterCount {
    fn default() -> Self {
        ClusterCount { open: 0, in_range: 0, worst: Severity::Info, cut: false }
    }
}

#[derive(Debug, Serialize)]
struct ClusterRow {
    cluster: String,
    status: &'static str,
    open: usize,
    in_range: usize,
    cut: bool,
    /// How long before the newest data of the store this cluster, which has open anomalies,
    /// last sent anything (when at least `SILENT_AFTER`).
    silent: Option<String>,
}

pub async fn overview(State(state): State<UiState>, query: Result<Query<RangeParams>, QueryRejection>) -> Response {
    state.page_or_error(overview_page(&state, query).await)
}

async fn overview_page(
    state: &UiState,
    query: Result<Query<RangeParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    let params = query_params(query)?;
    let range = PageRange::resolve(state.store.as_ref(), &params).await?;
    // The open ones counted in the store (through the index of open anomalies, no evidence
    // read). The range's counted from the newest OVERVIEW_PER_KIND of each kind (counting every
    // anomaly of a long range would scan them all); the page names the kinds it cut.
    let open_counts =
        state.store.anomaly_counts(&AnomalyFilter { open: Some(true), ..AnomalyFilter::default() }).await?;
    // Each kind's read on its own connection where the pool has one free; each reads at most
    // OVERVIEW_PER_KIND index entries, however many the range holds.
    let span = TimeRange { from: range.from, to: range.to };
    let of_each_kind = futures::future::try_join_all(
        AnomalyKind::ALL.iter().map(|&kind| state.store.newest_of_kind(kind, span, OVERVIEW_PER_KIND)),
    )
    .await?;
    let mut recent = Vec::new();
    let mut cut_kinds = Vec::new();
    for (&kind, of_kind) in AnomalyKind::ALL.iter().zip(of_each_kind) {
        if of_kind.len() >= OVERVIEW_PER_KIND as usize {
            cut_kinds.push(kind);
        }
        recent.extend(of_kind);
    }
    // Newest first, as one list would have them.
    recent.sort_unstable_by_key(|stored| std::cmp::Reverse(stored.id));
    let mut kinds: BTreeMap<String, KindRow> = BTreeMap::new();
    // By cluster as stored (`None`: anomalies naming no cluster, shown as `-`).
    let mut clusters: BTreeMap<Option<String>, ClusterCount> = BTreeMap::new();
    let mut open_total = 0;
    for count in &open_counts {
        let n = count.count as usize;
        open_total += n;
        kinds.entry(count.kind.clone()).or_default().open += n;
        let entry = clusters.entry(count.cluster.clone()).or_default();
        entry.open += n;
        entry.worst = entry.worst.max(Severity::parse(&count.severity).unwrap_or(Severity::Info));
    }
    let range_total = recent.len();
    for stored in &recent {
        let anomaly = &stored.anomaly;
        let cut = cut_kinds.contains(&anomaly.kind);
        let row = kinds.entry(anomaly.kind.as_str().to_string()).or_default();
        row.in_range += 1;
        row.cut |= cut;
        if anomaly.severity == Severity::Critical {
            row.critical += 1;
        }
        let entry = clusters.entry(anomaly.cluster.clone()).or_default();
        entry.in_range += 1;
        entry.cut |= cut;
    }
    for (kind, row) in &mut kinds {
        row.kind = kind.clone();
    }
    let latest = state.store.latest_time().await?;
    let clusters = cluster_rows(state, clusters, latest).await?;
    let open = state
        .store
        .anomalies(&AnomalyFilter {
            open: Some(true),
            limit: OVERVIEW_LISTED as u32,
            skip_evidence: true,
            ..AnomalyFilter::default()
        })
        .await?;
    let by_start = panels::by_start(&recent[..recent.len().min(OVERVIEW_LISTED)]);
    let open_table = panels::anomaly_table(&panels::by_start(&open));
    let metrics = &state.metrics;
    let ingest = ingest_rows(metrics, latest);
    let scrapes = scrape_rows(metrics);
    // Paging: the latest alert messages and how their delivery went.
    let messages = state.store.alert_messages(None, OVERVIEW_ALERT_MESSAGES).await?;
    let alerts = alert_table(&messages);
    let pending = messages.iter().filter(|message| message.state == "pending").count();
    let failed = messages.iter().filter(|message| message.state == "failed").count();
    let timeline = panels::anomaly_lanes(
        &panels::by_start(&recent),
        super::dashboards::AnomalyLane::Kind,
        charts::Span { from: range.from, to: range.to },
    );
    let context = minijinja::context! {
        timeline => timeline,
        kinds => kinds.into_values().collect::<Vec<_>>(),
        clusters => clusters,
        open_table => open_table,
        open_count => open_total,
        open_cut => open_total > open.len(),
        recent_table => panels::anomaly_table(&by_start),
        recent_count => range_total,
        recent_cut => range_total > by_start.len(),
        cut_kinds => cut_kinds.iter().map(|kind| kind.as_str()).collect::<Vec<_>>(),
        per_kind => OVERVIEW_PER_KIND,
        ingest => ingest,
        scrapes => scrapes,
        alerts => alerts,
        alerts_pending => pending,
        alerts_failed => failed,
        alerts_looked_at => messages.len(),
    };
    Ok(state.render("overview.html", "Overview", Some(&range), context))
}

/// The overview's cluster rows, the clusters in trouble first (critical, then warning), each
/// group by name; a cluster with open windows that has sent nothing for [`SILENT_AFTER`] is
/// called silent: its windows are judged by its own telemetry, so they stay open until it sends
/// again (or its pipeline is fixed).
async fn cluster_rows(
    state: &UiState,
    clusters: BTreeMap<Option<String>, ClusterCount>,
    latest: Option<i64>,
) -> Result<Vec<ClusterRow>, ApiError> {
    let own_latest = futures::future::try_join_all(clusters.iter().map(|(cluster, count)| async move {
        match (count.open, latest) {
            (0, _) | (_, None) => Ok(None),
            _ => state.store.cluster_latest_time(cluster.as_deref()).await,
        }
    }))
    .await?;
    let mut rows = Vec::with_capacity(clusters.len());
    for ((cluster, count), own) in clusters.into_iter().zip(own_latest) {
        let silent =
            latest.zip(own).map(|(latest, own)| latest - own).filter(|quiet| *quiet >= SILENT_AFTER).map(duration_text);
        rows.push(ClusterRow {
            cluster: cluster.unwrap_or_else(|| "-".to_string()),
            status: match (count.open, count.worst) {
                (0, _) => "ok",
                (_, Severity::Critical) => "critical",
                _ => "warning",
            },
            open: count.open,
            in_range: count.in_range,
            cut: count.cut,
            silent,
        });
    }
    // The clusters in trouble first (critical, then warning), each group by name.
    rows.sort_by_key(|row| match row.status {
        "critical" => 0,
        "warning" => 1,
        _ => 2,
    });
    Ok(rows)
}

/// The overview's ingest health: the latest data, the queue, refusals, commits, batches analysed.
fn ingest_rows(metrics: &SelfMetrics, latest: Option<i64>) -> Vec<(String, String)> {
    let queue_bytes = metrics.ingest_queue_bytes.get();
    let queue_capacity = metrics.ingest_queue_capacity_bytes.get().max(1);
    vec![
        ("latest data".to_string(), latest.map(time_text).unwrap_or_else(|| "none yet".to_string())),
        (
            "ingest queue".to_string(),
            format!(
                "{} of {} bytes ({:.0}%)",
                queue_bytes,
                queue_capacity,
                queue_bytes as f64 * 100.0 / queue_capacity as f64
            ),
        ),
        ("requests refused, queue full".to_string(), metrics.ingest_queue_full.get().to_string()),
        ("group commits".to_string(), metrics.ingest_commits.get().to_string()),
        ("requests committed".to_string(), metrics.ingest_committed_requests.get().to_string()),
        (
            "batches analysed / marked".to_string(),
            format!("{} / {}", metrics.batches_analyzed.get(), metrics.batches_marked.get()),
        ),
    ]
}

/// The overview's scrape targets: each one's URL, whether it is up, its failures and last error.
fn scrape_rows(metrics: &SelfMetrics) -> Vec<Vec<Cell>> {
    metrics
        .scrapes
        .snapshot()
        .into_iter()
        .map(|(name, status)| {
            vec![
                Cell::text(name),
                Cell::text(status.url.clone()),
                if status.up { Cell::class("up", "ok") } else { Cell::class("down", "critical") },
                Cell::text(status.failures.to_string()),
                Cell::text(status.last_error.clone().unwrap_or_default()),
            ]
        })
        .collect()
}

/// The overview's latest alert messages and how their delivery went.
fn alert_table(messages: &[AlertMessage]) -> Table {
    let mut alerts = Table::new(&["enqueued", "receiver", "event", "incident", "state", "attempts", "last error"]);
    for message in messages.iter().take(OVERVIEW_ALERTS_LISTED) {
        let state_class = match message.state.as_str() {
            "delivered" => "ok",
            "failed" => "critical",
            _ => "warning",
        };
        alerts.rows.push(vec![
            Cell::text(time_text(message.created_unix_nano)),
            Cell::text(message.receiver.clone()),
            Cell::text(message.event.clone()),
            Cell::text(message.dedup_key.clone()),
            Cell::class(message.state.clone(), state_class),
            Cell::text(message.attempts.to_string()),
            Cell::text(message.last_error.clone().unwrap_or_default()),
        ]);
    }
    alerts
}

pub async fn anomaly(State(state): State<UiState>, Path(id): Path<String>) -> Response {
    state.page_or_error(anomaly_page(&state, &id).await)
}

async fn anomaly_page(state: &UiState, id: &str) -> Result<Response, ApiError> {
    let id: i64 = id.parse().map_err(|_| ApiError::BadRequest(format!("anomaly id {id:?} is not a number")))?;
    let stored =
        state.store.anomaly(id).await?.ok_or_else(|| ApiError::NotFound(format!("no anomaly with id {id}")))?;
    let anomaly = &stored.anomaly;
    let end =
        if anomaly.end_unix_nano > anomaly.start_unix_nano { anomaly.end_unix_nano } else { anomaly.start_unix_nano };
    let window = PageRange::new(anomaly.start_unix_nano - ANOMALY_CONTEXT, end + ANOMALY_CONTEXT);
    let evidence = anomaly.evidence.value();
    // The slice of the client's timeline, when the anomaly has a client.
    let mut timeline = None;
    if let Some(client) = &anomaly.client_id {
        let view = timeline_view(
            state,
            client,
            anomaly.namespace.as_deref(),
            &window,
            std::slice::from_ref(&stored),
            Some(anomaly.start_unix_nano),
        )
        .await?;
        timeline = Some(view);
    }
    // The metrics that show the condition around it.
    let related = related_chart(state, anomaly, &window).await?;
    let title = format!("{} #{}", anomaly.kind.as_str(), stored.id);
    let mut facts = vec![
        ("kind", anomaly.kind.as_str().to_string()),
        ("severity", anomaly.severity.as_str().to_string()),
        (
            "status",
            if anomaly.open {
                "open".to_string()
            } else if anomaly.kind.is_window() {
                "resolved".to_string()
            } else {
                "event".to_string()
            },
        ),
        ("cluster", anomaly.cluster.clone().unwrap_or_default()),
        ("namespace", anomaly.namespace.clone().unwrap_or_default()),
        ("node", anomaly.node_id.clone().unwrap_or_default()),
        ("client", anomaly.client_id.clone().unwrap_or_default()),
        ("started", time_text(anomaly.start_unix_nano)),
        ("ended", if anomaly.open { "(still open)".to_string() } else { time_text(anomaly.end_unix_nano) }),
        ("duration", duration_text(anomaly.end_unix_nano - anomaly.start_unix_nano)),
        ("first reported", time_text(stored.first_seen_unix_nano)),
        ("last changed", time_text(stored.last_seen_unix_nano)),
        ("fingerprint", anomaly.fingerprint.clone()),
    ];
    // Replaced by the whole of the same incident, found once its earlier telemetry came.
    if let Some(by) = stored.superseded_by {
        facts.push(("replaced by", format!("anomaly {by}, the same incident found whole")));
    }
    let evidence_text =
        serde_json::to_string_pretty(evidence).unwrap_or_else(|_| anomaly.evidence.as_json().to_string());
    let context = minijinja::context! {
        anomaly_id => stored.id,
        severity => anomaly.severity.as_str(),
        summary => anomaly.summary.clone(),
        cause => anomaly.cause.clone(),
        facts => facts,
        evidence => evidence_text,
        timeline => timeline,
        related_title => related.as_ref().map(|(title, _)| title.clone()),
        related_chart => related.map(|(_, svg)| svg),
        client_link => anomaly.client_id.as_deref().map(|client| client_link(client, anomaly.start_unix_nano)),
        api_link => format!("/api/v1/anomalies/{}", stored.id),
    };
    Ok(state.render("anomaly.html", &title, Some(&window), context))
}

/// The series that show an anomaly's condition: (metric, per-second rate of a counter, what
/// the line is), read for the anomaly's cluster and the scope its kind names.
fn related_series(kind: AnomalyKind) -> (&'static str, &'static [(&'static str, bool, &'static str)], Scope) {
    use lagscope_model::conventions as c;
    const STATES: &[(&str, bool, &str)] =
        &[(c::METRIC_COMMITTED_STATE, false, "committed"), (c::METRIC_APPLIED_STATE, false, "applied")];
    match kind {
        AnomalyKind::RequeueStorm => (
            "Requeues and RPC counts of the node (per second)",
            &[
                (c::METRIC_REQUEUE_CALLS, true, "requeued"),
                (c::METRIC_RPC_QUEUE_OPS, true, "queue-time ops"),
                (c::METRIC_RPC_PROCESSING_OPS, true, "processing-time ops"),
            ],
            Scope::Node,
        ),
        AnomalyKind::ShardPressure | AnomalyKind::UnfairRejection => (
            "In-flight write bytes of the node's shards, and their limits",
            &[(c::METRIC_SHARD_INFLIGHT_BYTES, false, "in flight"), (c::METRIC_SHARD_LIMIT_BYTES, false, "limit")],
            Scope::Node,
        ),
        AnomalyKind::NoNamenodesWindow => (
            "NoNamenodesAvailable answers of the namespace (per second)",
            &[(c::METRIC_ROUTER_NO_NAMENODES, true, "NoNamenodesAvailable")],
            Scope::Namespace,
        ),
        AnomalyKind::BlindFailoverProbe => {
            ("Probe verdicts of the cluster (1 up, 0 down)", &[(c::METRIC_PROBE_UP, false, "probe")], Scope::Cluster)
        }
        _ => ("States of the namespace around it", STATES, Scope::Namespace),
    }
}

/// How much of an anomaly's place the related series must share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    Cluster,
    Namespace,
    Node,
}

async fn related_chart(
    state: &UiState,
    anomaly: &lagscope_model::Anomaly,
    window: &PageRange,
) -> Result<Option<(String, String)>, ApiError> {
    use lagscope_model::conventions::{CLUSTER, NAMESPACE, NODE_ID};
    let (title, metrics, scope) = related_series(anomaly.kind);
    let mut matchers = Vec::new();
    if let Some(cluster) = &anomaly.cluster {
        matchers.push((CLUSTER.to_string(), cluster.clone()));
    }
    match (scope, &anomaly.namespace, &anomaly.node_id) {
        (Scope::Namespace, Some(namespace), _) => matchers.push((NAMESPACE.to_string(), namespace.clone())),
        (Scope::Node, _, Some(node)) => matchers.push((NODE_ID.to_string(), node.clone())),
        (Scope::Cluster, _, _) if anomaly.cluster.is_some() => {}
        _ => return Ok(None),
    }
    let mut lines = Vec::new();
    for (metric, rate, what) in metrics {
        // Each series cut to the chart's points by the store, as on the dashboards (a counter's
        // rate is then its average over each point's step).
        let read =
            state.store.series_buckets(metric, &matchers, window.range(), panels::MAX_POINTS as u32, Reduce::Last);
        for series in read.await? {
            let mut points: Vec<(i64, f64)> = panels::numbers(&series).collect();
            if *rate {
                points = panels::rates(&points);
            }
            let mut name = vec![what.to_string()];
            for label in [NODE_ID, NAMESPACE, "lagscope.shard.role", "server.address"] {
                if let Some(value) = series.key.label(label).filter(|_| !matchers.iter().any(|(key, _)| key == label)) {
                    name.push(value.to_string());
                }
            }
            lines.push(Line {
                name: name.join(" "),
                points: panels::bucket_last(&points, window.range(), panels::MAX_POINTS),
            });
        }
    }
    if lines.is_empty() {
        return Ok(None);
    }
    lines.truncate(panels::MAX_LINES);
    let unit =
        if metrics.first().is_some_and(|(metric, _, _)| *metric == METRIC_COMMITTED_STATE) { STATE_UNIT } else { "" };
    Ok(Some((title.to_string(), charts::line_chart(&lines, charts::Span { from: window.from, to: window.to }, unit))))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientParams {
    from: Option<String>,
    to: Option<String>,
    last: Option<String>,
    refresh: Option<String>,
    namespace: Option<String>,
}

pub async fn client(
    State(state): State<UiState>,
    Path(client_id): Path<String>,
    query: Result<Query<ClientParams>, QueryRejection>,
) -> Response {
    state.page_or_error(client_page(&state, &client_id, query).await)
}

async fn client_page(
    state: &UiState,
    client_id: &str,
    query: Result<Query<ClientParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    let params = query_params(query)?;
    let explicit = params.from.is_some() || params.to.is_some() || params.last.is_some();
    let range_params = RangeParams { from: params.from, to: params.to, last: params.last, refresh: params.refresh };
    let range = if explicit {
        PageRange::resolve(state.store.as_ref(), &range_params).await?
    } else {
        // The client's latest activity: the time its most recent spans cover, a little wider.
        let latest = state.store.client_spans(client_id, TimeRange::ALL, DEFAULT_CLIENT_SPANS).await?;
        let own = latest.iter().filter(|span| span.call.client_id.as_deref() == Some(client_id));
        let (first, last) = own.fold((i64::MAX, i64::MIN), |(first, last), span| {
            (first.min(span.start_unix_nano), last.max(span.end_unix_nano.max(span.start_unix_nano)))
        });
        if first > last {
            return Err(ApiError::NotFound(format!("no spans of client {client_id:?}")));
        }
        let pad = ((last - first) / 20).max(1_000_000_000);
        PageRange::new(first - pad, last + pad)
    };
    let anomalies = state
        .store
        .anomalies(&AnomalyFilter {
            client_id: Some(client_id.to_string()),
            since: Some(range.from),
            until: Some(range.to),
            limit: 500,
            ..AnomalyFilter::default()
        })
        .await?;
    let view = timeline_view(state, client_id, params.namespace.as_deref(), &range, &anomalies, None).await?;
    let sorted = panels::by_start(&anomalies);
    let context = minijinja::context! {
        client_id => client_id,
        timeline => view,
        anomaly_table => panels::anomaly_table(&sorted),
        anomaly_count => anomalies.len(),
        api_link => format!("/api/v1/clients/{}/timeline?from={}&to={}", encode_path(client_id), super::unix_seconds(range.from), super::unix_seconds(range.to)),
    };
    Ok(state.render("client.html", &format!("client {client_id}"), Some(&range), context))
}

pub async fn dashboard(
    State(state): State<UiState>,
    Path(slug): Path<String>,
    query: Result<Query<RangeParams>, QueryRejection>,
) -> Response {
    state.page_or_error(dashboard_page(&state, &slug, query).await)
}

async fn dashboard_page(
    state: &UiState,
    slug: &str,
    query: Result<Query<RangeParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Some(dashboard) = state.dashboards.get(slug) else {
        let known: Vec<&str> = state.dashboards.list.iter().map(|d| d.slug.as_str()).collect();
        return Err(ApiError::NotFound(format!("no dashboard {slug:?} (there are: {})", known.join(", "))));
    };
    let params = query_params(query)?;
    let range = PageRange::resolve(state.store.as_ref(), &params).await?;
    // The panels' queries run together: the store's reads proceed on its connections while
    // other panels draw.
    let reads = panels::Reads::new(state);
    let panels: Vec<PanelView> = futures::future::try_join_all(
        dashboard.panels.iter().map(|panel| panels::evaluate(&reads, panel, range.range())),
    )
    .await?;
    let context = minijinja::context! {
        description => dashboard.description.clone(),
        panels => panels,
        slug => slug,
    };
    Ok(state.render("dashboard.html", &dashboard.title, Some(&range), context))
}

#[derive(Debug, Deserialize)]
pub struct ClientSearch {
    id: Option<String>,
}

/// The navigation bar's client search (a plain GET form): on to that client's timeline when
/// a client has that id, or the only one whose id begins with it; else the clients whose ids
/// begin with it (a page of them), or, when none does, the ids that follow it in order.
pub async fn client_search(
    State(state): State<UiState>,
    query: Result<Query<ClientSearch>, QueryRejection>,
) -> Response {
    let typed = match query_params(query) {
        Ok(ClientSearch { id: Some(id) }) if !id.trim().is_empty() => id.trim().to_string(),
        Ok(_) => return state.error_page(ApiError::BadRequest("parameter id: give a client id".to_string())),
        Err(error) => return state.error_page(error),
    };
    match search_clients(&state, &typed).await {
        Ok(Found::One(id)) => axum::response::Redirect::to(&format!("/clients/{}", encode_path(&id))).into_response(),
        Ok(Found::Beginning(ids)) => {
            let more = ids.len() > CLIENT_SEARCH_LIST;
            let message = format!(
                "{}{} clients whose ids begin with {typed:?}",
                if more { "the first " } else { "" },
                ids.len().min(CLIENT_SEARCH_LIST)
            );
            state.render("clients.html", "clients", None, client_list(&message, &ids, &typed))
        }
        Ok(Found::Following(ids)) => {
            let message = if ids.is_empty() {
                format!("no client {typed:?}, and no client id sorts after it")
            } else {
                format!("no client {typed:?} and none whose id begins with it; the ids that follow it:")
            };
            state.render_as(StatusCode::NOT_FOUND, "clients.html", "clients", client_list(&message, &ids, &typed))
        }
        Err(error) => state.error_page(error),
    }
}

/// The most clients the search lists whose ids begin with what was typed.
const CLIENT_SEARCH_LIST: usize = 50;

/// The ids that follow it the search lists when none begins with what was typed.
const CLIENT_SEARCH_FOLLOWING: usize = 5;

/// What the client search found for what was typed.
enum Found {
    /// A client with that id, or the only one whose id begins with it.
    One(String),
    /// The clients whose ids begin with it (up to one more than are listed).
    Beginning(Vec<String>),
    /// None: the ids that follow it in order.
    Following(Vec<String>),
}

async fn search_clients(state: &UiState, typed: &str) -> Result<Found, ApiError> {
    let store = state.store.as_ref();
    if !store.client_spans(typed, TimeRange::ALL, 1).await?.is_empty() {
        return Ok(Found::One(typed.to_string()));
    }
    let after = store.clients(Some(typed), CLIENT_SEARCH_LIST as u32 + 1).await?;
    let beginning: Vec<String> = after.iter().take_while(|id| id.starts_with(typed)).cloned().collect();
    Ok(match beginning.len() {
        0 => Found::Following(after.into_iter().take(CLIENT_SEARCH_FOLLOWING).collect()),
        1 => Found::One(beginning.into_iter().next().expect("one")),
        _ => Found::Beginning(beginning),
    })
}

fn client_list(message: &str, ids: &[String], typed: &str) -> minijinja::Value {
    let clients: Vec<minijinja::Value> = (ids.iter().take(CLIENT_SEARCH_LIST))
        .map(|id| minijinja::context! { id => id, href => format!("/clients/{}", encode_path(id)) })
        .collect();
    minijinja::context! {
        message => message,
        clients => clients,
        api_link => format!("/api/v1/clients?after={}&limit={}", encode_path(typed), CLIENT_SEARCH_LIST),
    }
}
