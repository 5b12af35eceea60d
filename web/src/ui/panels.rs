//! Runs a dashboard panel's query against the store and draws it: an SVG chart, a table, or
//! both (lanes come with the table of their windows, so every bar is also a link and the page
//! reads without the chart).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use lagscope_model::conventions::{
    CLUSTER, METRIC_APPLIED_STATE, METRIC_COMMITTED_STATE, METRIC_ROLE, METRIC_ROUTER_CACHED_ROLE, NAMESPACE, NODE_ID,
    NODE_ROLE, TARGET_NODE,
};
use lagscope_model::{AnomalyKind, Severity, rollup_step_of};
use lagscope_store::{AnomalyFilter, Reduce, SeriesSamples, StoredAnomaly, TimeRange};
use serde::Serialize;

use super::charts::{self, Bar, Line};
use super::dashboards::{AnomalyLane, ChartKind, HeatColors, Panel, Query, Width};
use super::{Cell, Table, UiState};
use crate::ApiError;
use crate::lag::MAX_ROLLUPS;

/// Points per line a chart draws at most (samples are bucketed to this many).
pub const MAX_POINTS: usize = 240;
/// Cells per heatmap row.
pub const HEATMAP_CELLS: usize = 80;
/// Lines or rows per chart at most (the first ones by name; the panel says how many more).
pub const MAX_LINES: usize = 40;
/// Anomalies a panel reads per kind at most.
pub const MAX_PANEL_ANOMALIES: u32 = 500;

/// The reads of one dashboard request, shared by its panels (which run concurrently): two
/// panels charting the same metric over the range read it from the store once, the second
/// waiting for the first's read (the Lag dashboard charts committed states in two panels).
pub struct Reads<'s> {
    pub state: &'s UiState,
    series: Mutex<HashMap<SeriesRead, SharedRead>>,
}

/// One read, done by the first panel asking for it.
type SharedRead = Arc<tokio::sync::OnceCell<Arc<Vec<SeriesSamples>>>>;

/// A [`Store::series_buckets`](lagscope_store::Store::series_buckets) read, but its range
/// (one per request).
type SeriesRead = (String, Vec<(String, String)>, u32, Reduce);

impl<'s> Reads<'s> {
    pub fn new(state: &'s UiState) -> Self {
        Self { state, series: Mutex::default() }
    }

    async fn series_buckets(
        &self,
        metric: &str,
        matchers: &[(String, String)],
        range: TimeRange,
        buckets: u32,
        reduce: Reduce,
    ) -> Result<Arc<Vec<SeriesSamples>>, ApiError> {
        let key = (metric.to_string(), matchers.to_vec(), buckets, reduce);
        let cell = {
            let mut reads = self.series.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            reads.entry(key).or_default().clone()
        };
        let read = cell.get_or_try_init(|| async {
            let series = self.state.store.series_buckets(metric, matchers, range, buckets, reduce).await?;
            Ok::<_, ApiError>(Arc::new(series))
        });
        Ok(read.await?.clone())
    }
}

/// A panel ready for the template.
#[derive(Debug, Serialize)]
pub struct PanelView {
    pub title: String,
    pub description: String,
    pub half: bool,
    /// Trusted SVG from [`charts`] (which escapes what it prints).
    pub svg: Option<String>,
    pub table: Option<Table>,
    /// A remark on what is shown (cut at a limit, nothing found).
    pub note: Option<String>,
    /// How long the panel's query and drawing took (shown small on the page).
    pub took: String,
}

pub async fn evaluate(reads: &Reads<'_>, panel: &Panel, range: TimeRange) -> Result<PanelView, ApiError> {
    let started = std::time::Instant::now();
    let mut view = evaluate_untimed(reads, panel, range).await?;
    view.took = format!("{:.0} ms", started.elapsed().as_secs_f64() * 1e3);
    tracing::debug!(panel = %panel.title, took = %view.took, "panel drawn");
    Ok(view)
}

async fn evaluate_untimed(reads: &Reads<'_>, panel: &Panel, range: TimeRange) -> Result<PanelView, ApiError> {
    let state = reads.state;
    let mut view = PanelView {
        title: panel.title.clone(),
        description: panel.description.clone(),
        half: panel.width == Width::Half,
        svg: None,
        table: None,
        note: None,
        took: String::new(),
    };
    let span = charts::Span { from: range.from, to: range.to };
    match &panel.query {
        Query::Series { metric, matchers, group_by, rate, ratio_to, colors, unit } => {
            let matchers: Vec<(String, String)> = matchers.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            // The store cuts each series to what the chart draws: a line's last value per
            // point (a counter's rate is then its average over each step), a heatmap cell's
            // largest pressure or, for up/down, its smallest value (any down makes it red).
            let (buckets, reduce) = match (panel.chart, colors) {
                _ if *rate => (MAX_POINTS, Reduce::Last),
                (ChartKind::Heatmap, HeatColors::Pressure) => (HEATMAP_CELLS, Reduce::Max),
                (ChartKind::Heatmap, HeatColors::UpDown) => (HEATMAP_CELLS, Reduce::Min),
                _ => (MAX_POINTS, Reduce::Last),
            };
            let series = reads.series_buckets(metric, &matchers, range, buckets as u32, reduce).await?;
            let limits = match ratio_to {
                Some(limit_metric) => latest_by_scope(&latest(reads, limit_metric, &matchers, range).await?),
                None => BTreeMap::new(),
            };
            let mut groups = group_series(&series, group_by, *rate, ratio_to.as_ref().map(|_| &limits));
            if groups.len() > MAX_LINES {
                view.note = Some(format!("showing {MAX_LINES} of {} series", groups.len()));
                groups.truncate(MAX_LINES);
            }
            match panel.chart {
                ChartKind::Line => {
                    let lines: Vec<Line> = groups
                        .into_iter()
                        .map(|(name, points)| Line { name, points: bucket_last(&points, range, MAX_POINTS) })
                        .collect();
                    view.svg = Some(charts::line_chart(&lines, span, unit));
                }
                ChartKind::Heatmap => {
                    let rows: Vec<(String, Vec<Option<f64>>)> = groups
                        .into_iter()
                        .map(|(name, points)| {
                            let cells = match colors {
                                HeatColors::Pressure => bucket_max(&points, range, HEATMAP_CELLS),
                                // 1 (up) is good, green; any 0 (down) in a cell makes it red.
                                HeatColors::UpDown => {
                                    let down: Vec<(i64, f64)> =
                                        points.iter().map(|(at, value)| (*at, 1.0 - value.clamp(0.0, 1.0))).collect();
                                    bucket_max(&down, range, HEATMAP_CELLS)
                                }
                            };
                            (name, cells)
                        })
                        .collect();
                    view.svg = Some(charts::heatmap(&rows, span));
                }
                _ => {
                    // Per group: its latest value, and its smallest and largest in the range.
                    let extreme = |reduce| reads.series_buckets(metric, &matchers, range, 1, reduce);
                    let (lows, highs) = (extreme(Reduce::Min).await?, extreme(Reduce::Max).await?);
                    let lows = group_series(&lows, group_by, false, None);
                    let highs = group_series(&highs, group_by, false, None);
                    let mut table = Table::new(&["series", "latest", "min", "max"]);
                    for (name, points) in groups {
                        let of = |groups: &[(String, Vec<(i64, f64)>)], fold: fn(f64, f64) -> f64, start: f64| {
                            let found = groups.iter().find(|(group, _)| *group == name);
                            found.map(|(_, points)| points.iter().map(|(_, v)| *v).fold(start, fold))
                        };
                        let text = |value: Option<f64>| value.map(charts::format_value).unwrap_or_default();
                        let latest = points.last().map(|(_, v)| charts::format_value(*v)).unwrap_or_default();
                        table.rows.push(vec![
                            Cell::text(name.clone()),
                            Cell::text(latest),
                            Cell::text(text(of(&lows, f64::min, f64::INFINITY))),
                            Cell::text(text(of(&highs, f64::max, f64::NEG_INFINITY))),
                        ]);
                    }
                    view.table = Some(table);
                }
            }
        }
        Query::Anomalies { kinds, group_by } => {
            let mut found = Vec::new();
            for kind in kinds.iter().filter_map(|kind| AnomalyKind::parse(kind)) {
                let filter = AnomalyFilter {
                    kind: Some(kind),
                    since: Some(range.from),
                    until: Some(range.to),
                    limit: MAX_PANEL_ANOMALIES,
                    skip_evidence: true,
                    ..AnomalyFilter::default()
                };
                let listed = state.store.anomalies(&filter).await?;
                if listed.len() >= MAX_PANEL_ANOMALIES as usize {
                    view.note = Some(format!("showing the newest {MAX_PANEL_ANOMALIES} of each kind"));
                }
                found.extend(listed);
            }
            found.sort_by_key(|stored| (stored.anomaly.start_unix_nano, stored.id));
            if panel.chart == ChartKind::Lanes {
                view.svg = Some(anomaly_lanes(&found, *group_by, span));
            }
            view.table = Some(anomaly_table(&found));
            if found.is_empty() {
                view.note = Some("none in this range".to_string());
            }
        }
        Query::FollowerStatus {} => view.table = Some(follower_status(reads, range).await?),
        Query::BehindCommitted {} => {
            let (lines, note) = behind_committed(reads, range).await?;
            view.svg = Some(charts::line_chart(&lines, span, "states behind"));
            view.note = note;
        }
        Query::Staleness {} => {
            let (table, note) = staleness(state, range).await?;
            view.table = Some(table);
            view.note = note;
        }
        Query::RoleComparison {} => view.table = Some(role_comparison(reads, range).await?),
    }
    Ok(view)
}

/// The name of a series in a panel: its `group_by` labels' values (the metric's name when
/// none are given).
fn group_name(series: &SeriesSamples, group_by: &[String]) -> String {
    if group_by.is_empty() {
        return series.key.name.clone();
    }
    group_by.iter().map(|label| series.key.label(label).unwrap_or("-")).collect::<Vec<_>>().join(" / ")
}

/// (cluster, namespace, node) of a series.
type Scope = (Option<String>, Option<String>, Option<String>);
/// (cluster, namespace).
type NamespaceKey = (Option<String>, Option<String>);
/// (cluster, router, namespace, node): what a router's cache says about one node.
type RouterView = (Option<String>, String, String, String);

fn scope_of(series: &SeriesSamples) -> Scope {
    let label = |key: &str| series.key.label(key).map(str::to_string);
    (label(CLUSTER), label(NAMESPACE), label(NODE_ID))
}

/// A series' finite numeric points.
pub fn numbers(series: &SeriesSamples) -> impl Iterator<Item = (i64, f64)> + '_ {
    series.points.iter().filter_map(|(at, value, _)| value.filter(|v| v.is_finite()).map(|v| (*at, v)))
}

fn latest_by_scope(series: &[SeriesSamples]) -> BTreeMap<Scope, f64> {
    series.iter().filter_map(|series| numbers(series).last().map(|(_, value)| (scope_of(series), value))).collect()
}

/// A group of series: its name, and its cluster unless the name has it.
type GroupKey<'s> = (String, Option<&'s str>);

/// Series grouped into named point lists (values, rates, or ratios), by name. Clusters are
/// never mixed in a group: node names repeat from cluster to cluster (every HDFS federation has
/// its `router-1`), and a group of two clusters' series would zigzag between them. Where a
/// name occurs in several clusters and `group_by` does not name the cluster, the cluster is
/// put before it.
fn group_series(
    series: &[SeriesSamples],
    group_by: &[String],
    rate: bool,
    limits: Option<&BTreeMap<Scope, f64>>,
) -> Vec<(String, Vec<(i64, f64)>)> {
    let by_cluster = !group_by.iter().any(|label| label == CLUSTER);
    // (name, cluster unless group_by has it) -> points
    let mut groups: BTreeMap<GroupKey<'_>, Vec<(i64, f64)>> = BTreeMap::new();
    for series in series {
        let mut points: Vec<(i64, f64)> = numbers(series).collect();
        if rate {
            points = rates(&points);
        }
        if let Some(limits) = limits {
            let Some(limit) = limits.get(&scope_of(series)).copied().filter(|limit| *limit > 0.0) else { continue };
            for point in &mut points {
                point.1 /= limit;
            }
        }
        let cluster = if by_cluster { series.key.label(CLUSTER) } else { None };
        groups.entry((group_name(series, group_by), cluster)).or_default().extend(points);
    }
    let mut clusters_of: BTreeMap<String, usize> = BTreeMap::new();
    for (name, _) in groups.keys() {
        *clusters_of.entry(name.clone()).or_default() += 1;
    }
    let mut named: Vec<(String, Vec<(i64, f64)>)> = groups
        .into_iter()
        .map(|((name, cluster), mut points)| {
            points.sort_by_key(|(at, _)| *at);
            match cluster {
                Some(cluster) if clusters_of[&name] > 1 => (format!("{cluster} / {name}"), points),
                _ => (name, points),
            }
        })
        .collect();
    named.sort_by(|left, right| left.0.cmp(&right.0));
    named
}

/// Per-second rates of a counter (a drop is a reset: the new value is the increase).
pub fn rates(points: &[(i64, f64)]) -> Vec<(i64, f64)> {
    points
        .windows(2)
        .filter_map(|pair| {
            let ((t0, v0), (t1, v1)) = (pair[0], pair[1]);
            let seconds = (t1 - t0) as f64 / 1e9;
            (seconds > 0.0).then(|| (t1, if v1 >= v0 { v1 - v0 } else { v1 } / seconds))
        })
        .collect()
}

fn bucket_index(at: i64, range: TimeRange, buckets: usize) -> Option<usize> {
    if at < range.from || at >= range.to {
        return None;
    }
    let width = (range.to - range.from) as f64;
    Some((((at - range.from) as f64 / width) * buckets as f64) as usize).map(|index| index.min(buckets - 1))
}

/// The last point of each of `buckets` equal slices of the range (lines stay exact at
/// their steps, and their size bounded).
pub fn bucket_last(points: &[(i64, f64)], range: TimeRange, buckets: usize) -> Vec<(i64, f64)> {
    let mut last: Vec<Option<(i64, f64)>> = vec![None; buckets];
    for &(at, value) in points {
        if let Some(index) = bucket_index(at, range, buckets) {
            last[index] = Some((at, value));
        }
    }
    last.into_iter().flatten().collect()
}

/// The largest value in each of `buckets` equal slices of the range.
pub fn bucket_max(points: &[(i64, f64)], range: TimeRange, buckets: usize) -> Vec<Option<f64>> {
    let mut cells: Vec<Option<f64>> = vec![None; buckets];
    for &(at, value) in points {
        if let Some(index) = bucket_index(at, range, buckets) {
            cells[index] = Some(cells[index].map_or(value, |old: f64| old.max(value)));
        }
    }
    cells
}

fn lane_of(stored: &StoredAnomaly, group_by: AnomalyLane) -> String {
    let anomaly = &stored.anomaly;
    let part = |value: &Option<String>| value.clone().unwrap_or_else(|| "-".to_string());
    match group_by {
        AnomalyLane::Node => {
            format!("{} / {} / {}", part(&anomaly.cluster), part(&anomaly.namespace), part(&anomaly.node_id))
        }
        AnomalyLane::Namespace => format!("{} / {}", part(&anomaly.cluster), part(&anomaly.namespace)),
        AnomalyLane::Client => part(&anomaly.client_id),
        AnomalyLane::Kind => anomaly.kind.as_str().to_string(),
    }
}

pub fn severity_color(severity: Severity) -> plotters::style::RGBColor {
    match severity {
        Severity::Critical => charts::RED,
        Severity::Warning => charts::AMBER,
        _ => charts::GREY,
    }
}

pub fn anomaly_lanes(found: &[StoredAnomaly], group_by: AnomalyLane, span: charts::Span) -> String {
    let mut names: Vec<String> = found.iter().map(|stored| lane_of(stored, group_by)).collect();
    names.sort();
    names.dedup();
    names.truncate(MAX_LINES);
    let bars: Vec<Bar> = found
        .iter()
        .filter_map(|stored| {
            let lane = names.binary_search(&lane_of(stored, group_by)).ok()?;
            let anomaly = &stored.anomaly;
            Some(Bar {
                lane,
                start: anomaly.start_unix_nano,
                end: if anomaly.open { span.to } else { anomaly.end_unix_nano },
                color: severity_color(anomaly.severity),
                highlight: anomaly.open,
                text: None,
            })
        })
        .collect();
    charts::lanes(&names, &bars, span)
}

/// Anomalies in start order (ties by id).
pub fn by_start(found: &[StoredAnomaly]) -> Vec<StoredAnomaly> {
    let mut sorted = found.to_vec();
    sorted.sort_by_key(|stored| (stored.anomaly.start_unix_nano, stored.id));
    sorted
}

/// Anomalies as rows linking to their pages.
pub fn anomaly_table(found: &[StoredAnomaly]) -> Table {
    let mut table =
        Table::new(&["started", "duration", "kind", "severity", "cluster / namespace", "node", "client", "summary"]);
    for stored in found.iter().rev().take(MAX_PANEL_ANOMALIES as usize) {
        let anomaly = &stored.anomaly;
        let link = format!("/anomalies/{}", stored.id);
        let duration = if anomaly.open {
            "open".to_string()
        } else {
            super::duration_text(anomaly.end_unix_nano - anomaly.start_unix_nano)
        };
        table.rows.push(vec![
            Cell::link(super::time_text(anomaly.start_unix_nano), link.clone()),
            Cell::text(duration),
            Cell::text(anomaly.kind.as_str()),
            Cell::class(anomaly.severity.as_str(), anomaly.severity.as_str()),
            Cell::text(format!(
                "{} / {}",
                anomaly.cluster.as_deref().unwrap_or("-"),
                anomaly.namespace.as_deref().unwrap_or("-")
            )),
            Cell::text(anomaly.node_id.clone().unwrap_or_default()),
            match &anomaly.client_id {
                Some(client) => Cell::link(client.clone(), super::client_link(client, anomaly.start_unix_nano)),
                None => Cell::text(""),
            },
            Cell::link(anomaly.summary.clone(), link),
        ]);
    }
    table
}

/// Each series of a metric with its latest value in the range (one point).
async fn latest(
    reads: &Reads<'_>,
    metric: &str,
    matchers: &[(String, String)],
    range: TimeRange,
) -> Result<Arc<Vec<SeriesSamples>>, ApiError> {
    reads.series_buckets(metric, matchers, range, 1, Reduce::Last).await
}

async fn follower_status(reads: &Reads<'_>, range: TimeRange) -> Result<Table, ApiError> {
    let state = reads.state;
    let applied = latest(reads, METRIC_APPLIED_STATE, &[], range).await?;
    let committed = latest(reads, METRIC_COMMITTED_STATE, &[], range).await?;
    // A namespace's committed state: the highest any node reports.
    let mut namespace_committed: BTreeMap<NamespaceKey, f64> = BTreeMap::new();
    for (scope, value) in latest_by_scope(&committed) {
        let entry = namespace_committed.entry((scope.0, scope.1)).or_insert(value);
        *entry = entry.max(value);
    }
    // Open apply_lag windows give the node's status.
    let filter = AnomalyFilter {
        kind: Some(AnomalyKind::ApplyLag),
        open: Some(true),
        limit: MAX_PANEL_ANOMALIES,
        ..AnomalyFilter::default()
    };
    let open_lag = state.store.anomalies(&filter).await?;
    let mut table = Table::new(&["cluster", "namespace", "node", "applied", "committed", "behind (states)", "status"]);
    for (scope, value) in latest_by_scope(&applied) {
        let committed = namespace_committed.get(&(scope.0.clone(), scope.1.clone())).copied();
        let behind = committed.map(|committed| (committed - value).max(0.0));
        let window = open_lag.iter().find(|stored| {
            stored.anomaly.node_id == scope.2
                && stored.anomaly.namespace == scope.1
                && stored.anomaly.cluster == scope.0
        });
        let status = window
            .and_then(|stored| stored.anomaly.evidence.get("status").and_then(|s| s.as_str()).map(str::to_string))
            .unwrap_or_else(|| if window.is_some() { "warn".to_string() } else { "ok".to_string() });
        let status_cell = match window {
            Some(stored) => Cell {
                class: Some(format!("status-{status}")),
                ..Cell::link(status.clone(), format!("/anomalies/{}", stored.id))
            },
            None => Cell::class(status.clone(), &format!("status-{status}")),
        };
        table.rows.push(vec![
            Cell::text(scope.0.unwrap_or_default()),
            Cell::text(scope.1.unwrap_or_default()),
            Cell::text(scope.2.unwrap_or_default()),
            Cell::text(format!("{value:.0}")),
            Cell::text(committed.map(|c| format!("{c:.0}")).unwrap_or_default()),
            Cell::text(behind.map(|b| format!("{b:.0}")).unwrap_or_default()),
            status_cell,
        ]);
    }
    Ok(table)
}

async fn behind_committed(reads: &Reads<'_>, range: TimeRange) -> Result<(Vec<Line>, Option<String>), ApiError> {
    let points = MAX_POINTS as u32;
    let (applied, committed) = tokio::try_join!(
        reads.series_buckets(METRIC_APPLIED_STATE, &[], range, points, Reduce::Last),
        reads.series_buckets(METRIC_COMMITTED_STATE, &[], range, points, Reduce::Last),
    )?;
    // Each namespace's committed state as a staircase: the highest any node reported so far.
    let mut staircases: BTreeMap<NamespaceKey, Vec<(i64, f64)>> = BTreeMap::new();
    for series in committed.iter() {
        let scope = scope_of(series);
        staircases.entry((scope.0, scope.1)).or_default().extend(numbers(series));
    }
    for points in staircases.values_mut() {
        points.sort_by_key(|(at, _)| *at);
        let mut highest = f64::NEG_INFINITY;
        for point in points.iter_mut() {
            highest = highest.max(point.1);
            point.1 = highest;
        }
    }
    let mut lines: Vec<(f64, Line)> = Vec::new();
    for series in applied.iter() {
        let scope = scope_of(series);
        let Some(staircase) = staircases.get(&(scope.0.clone(), scope.1.clone())) else { continue };
        let points: Vec<(i64, f64)> = numbers(series)
            .filter_map(|(at, value)| {
                let index = staircase.partition_point(|(time, _)| *time <= at);
                index.checked_sub(1).map(|index| (at, (staircase[index].1 - value).max(0.0)))
            })
            .collect();
        if points.is_empty() {
            continue;
        }
        let worst = points.iter().map(|(_, behind)| *behind).fold(0.0, f64::max);
        let name = format!(
            "{} / {} / {}",
            scope.0.as_deref().unwrap_or("-"),
            scope.1.as_deref().unwrap_or("-"),
            scope.2.as_deref().unwrap_or("-")
        );
        lines.push((worst, Line { name, points: bucket_last(&points, range, MAX_POINTS) }));
    }
    lines.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.name.cmp(&b.1.name)));
    let note = (lines.len() > MAX_LINES / 4)
        .then(|| format!("the {} nodes furthest behind of {}", MAX_LINES / 4, lines.len()));
    lines.truncate(MAX_LINES / 4);
    Ok((lines.into_iter().map(|(_, line)| line).collect(), note))
}

/// Staleness of the reads each node served in the range, from the per-minute rollups the live
/// analyzer writes (every whole minute overlapping the range).
async fn staleness(state: &UiState, range: TimeRange) -> Result<(Table, Option<String>), ApiError> {
    let minutes = TimeRange { from: rollup_step_of(range.from), to: range.to };
    let rollups = state.store.read_rollups(minutes, MAX_ROLLUPS).await?;
    let truncated = rollups.len() >= MAX_ROLLUPS as usize;
    let mut table = Table::new(&[
        "cluster",
        "namespace",
        "node",
        "reads",
        "behind committed",
        "behind p50 (states)",
        "p99",
        "max",
        "behind p50 (s)",
        "p99 (s)",
        "max (s)",
    ]);
    let spread = |percentiles: Option<lagscope_model::Percentiles>, digits: usize| match percentiles {
        Some(p) => [p.p50, p.p99, p.max].map(|value| Cell::text(format!("{value:.digits$}"))),
        None => [Cell::text(""), Cell::text(""), Cell::text("")],
    };
    for node in crate::lag::staleness_by_node(&rollups) {
        let mut row = vec![
            Cell::text(node.cluster.unwrap_or_default()),
            Cell::text(node.namespace.unwrap_or_default()),
            Cell::text(node.node.unwrap_or_default()),
            Cell::text(node.reads.to_string()),
            Cell::text(node.behind_reads.to_string()),
        ];
        row.extend(spread(node.behind_states, 0));
        row.extend(spread(node.behind_seconds, 3));
        table.rows.push(row);
    }
    let note = if truncated {
        format!(
            "the range holds more than {MAX_ROLLUPS} node-minutes: these figures cover its first {MAX_ROLLUPS}; narrow the range for all of it"
        )
    } else {
        "per whole minute overlapping the range; percentiles within 1/16 (exact below 16), counts and maxima exact"
            .to_string()
    };
    Ok((table, Some(note)))
}

async fn role_comparison(reads: &Reads<'_>, range: TimeRange) -> Result<Table, ApiError> {
    // A role series is 1 while the node (or the router's cache) holds that role: its latest
    // value in the range says whether it still does.
    let cached = latest(reads, METRIC_ROUTER_CACHED_ROLE, &[], range).await?;
    let reported = latest(reads, METRIC_ROLE, &[], range).await?;
    // The role each node reports last: (cluster, node) -> (time, role).
    let mut now_reported: BTreeMap<(Option<String>, String), (i64, String)> = BTreeMap::new();
    for series in reported.iter() {
        let (Some(node), Some(role)) = (series.key.label(NODE_ID), series.key.label(NODE_ROLE)) else { continue };
        let Some((at, _)) = numbers(series).filter(|(_, value)| *value > 0.0).last() else { continue };
        let key = (series.key.label(CLUSTER).map(str::to_string), node.to_string());
        if now_reported.get(&key).is_none_or(|(previous, _)| *previous <= at) {
            now_reported.insert(key, (at, role.to_string()));
        }
    }
    let mut table = Table::new(&["cluster", "router", "namespace", "node", "cached role", "reported role", ""]);
    // (cluster, router, namespace, node) -> (time, cached role)
    let mut rows: BTreeMap<RouterView, (i64, String)> = BTreeMap::new();
    for series in cached.iter() {
        let (Some(router), Some(node), Some(role)) =
            (series.key.label(NODE_ID), series.key.label(TARGET_NODE), series.key.label(NODE_ROLE))
        else {
            continue;
        };
        let Some((at, _)) = numbers(series).filter(|(_, value)| *value > 0.0).last() else { continue };
        let key = (
            series.key.label(CLUSTER).map(str::to_string),
            router.to_string(),
            series.key.label(NAMESPACE).unwrap_or("-").to_string(),
            node.to_string(),
        );
        if rows.get(&key).is_none_or(|(previous, _)| *previous <= at) {
            rows.insert(key, (at, role.to_string()));
        }
    }
    for ((cluster, router, namespace, node), (_, role)) in rows {
        let reported = now_reported.get(&(cluster.clone(), node.clone())).map(|(_, role)| role.clone());
        let agrees = reported.as_deref().is_none_or(|reported| reported == role);
        table.rows.push(vec![
            Cell::text(cluster.unwrap_or_default()),
            Cell::text(router),
            Cell::text(namespace),
            Cell::text(node),
            Cell::text(role),
            Cell::text(reported.unwrap_or_else(|| "(not reported)".to_string())),
            if agrees { Cell::class("agrees", "ok") } else { Cell::class("stale cache", "critical") },
        ]);
    }
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_rates_survive_resets() {
        let points = [(0, 10.0), (1_000_000_000, 30.0), (2_000_000_000, 5.0)];
        assert_eq!(rates(&points), vec![(1_000_000_000, 20.0), (2_000_000_000, 5.0)]);
    }

    fn series(cluster: &str, node: &str, points: &[(i64, f64)]) -> SeriesSamples {
        let labels = [(CLUSTER, cluster), (NODE_ID, node)].map(|(key, value)| (key.to_string(), value.to_string()));
        SeriesSamples {
            key: lagscope_model::SeriesKey { name: "lagscope.router.no_namenodes".into(), labels: labels.into() },
            meta: lagscope_model::SeriesMeta { kind: lagscope_model::MetricKind::Gauge, unit: None, description: None },
            points: points.iter().map(|(at, value)| (*at, Some(*value), None)).collect(),
        }
    }

    #[test]
    fn groups_never_mix_clusters() {
        // router-1 of two federations, grouped by node only: two lines, named by cluster;
        // router-2 exists in one, and keeps its plain name.
        let all = [
            series("east", "router-1", &[(1, 1.0), (3, 1.0)]),
            series("west", "router-1", &[(2, 7.0), (4, 7.0)]),
            series("west", "router-2", &[(2, 5.0)]),
        ];
        let groups = group_series(&all, &[NODE_ID.to_string()], false, None);
        assert_eq!(
            groups,
            vec![
                ("east / router-1".to_string(), vec![(1, 1.0), (3, 1.0)]),
                ("router-2".to_string(), vec![(2, 5.0)]),
                ("west / router-1".to_string(), vec![(2, 7.0), (4, 7.0)]),
            ]
        );
        // Grouped by cluster as well: the names say it already.
        let groups = group_series(&all, &[CLUSTER.to_string(), NODE_ID.to_string()], false, None);
        let names: Vec<&str> = groups.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names, ["east / router-1", "west / router-1", "west / router-2"]);
    }

    #[test]
    fn buckets_keep_the_last_and_the_largest() {
        let range = TimeRange { from: 0, to: 100 };
        let points = [(0, 1.0), (10, 5.0), (60, 2.0), (99, 3.0), (100, 9.0)];
        assert_eq!(bucket_last(&points, range, 2), vec![(10, 5.0), (99, 3.0)]);
        assert_eq!(bucket_max(&points, range, 4), vec![Some(5.0), None, Some(2.0), Some(3.0)]);
    }
}
