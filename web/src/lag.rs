//! `GET /api/v1/lag`: aggregate lag analytics over a scope and time range.
//!
//! The store gives the range's spans and samples, the analyzer turns them into raw lag rows,
//! and the injected [`LagAggregator`] (polars, in `lagscope-analytics`; injected so that this
//! crate builds without polars) buckets them and takes percentiles, off the async runtime.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use lagscope_analyzer::{AnalysisInput, LagRows, lag_rows};
use lagscope_model::{LagQuery, LagReport, Percentiles, ReadRollup, rollup_step_of};
use lagscope_store::paging::spans_ahead;
use lagscope_store::{Store, StoreError, TimeRange};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::{ApiError, ApiState, parse_time};

/// Aggregates raw lag rows for a query (the analytics crate's `aggregate`).
pub type LagAggregator = Arc<dyn Fn(&LagRows, &LagQuery) -> Result<LagReport, String> + Send + Sync>;

/// The most spans, and samples, one lag request reads (the oldest of the range first).
pub const MAX_LAG_SPANS: u32 = 500_000;
pub const MAX_LAG_SAMPLES: u32 = 500_000;
/// The most buckets per group one request may ask for.
pub const MAX_BUCKETS: i64 = 10_000;
/// The range when none is given: the last hour.
const DEFAULT_RANGE: i64 = 3_600 * 1_000_000_000;

/// How long a lag request waits for its turn by default ([`LagTurns`]), and the retry hint
/// of one that waited in vain.
pub const LAG_TURN_WAIT: Duration = Duration::from_secs(30);
const BUSY_RETRY_AFTER_SECONDS: u64 = 5;

/// Turns to read and aggregate lag rows: `/api/v1/lag` requests served at once. One request
/// at its read limits holds ~1.1 GB while it runs (500 000 spans and 230 000 samples read,
/// their timelines built; BENCHMARKS.md), so requests beyond the turns wait for one, up to
/// `wait`, and are then answered 503 with `Retry-After` rather than taking the machine's
/// memory between them.
#[derive(Clone, Debug)]
pub struct LagTurns {
    turns: Arc<tokio::sync::Semaphore>,
    size: usize,
    wait: Duration,
}

impl LagTurns {
    /// `size` turns (at least one), each waited for at most `wait`.
    pub fn new(size: usize, wait: Duration) -> Self {
        let size = size.max(1);
        Self { turns: Arc::new(tokio::sync::Semaphore::new(size)), size, wait }
    }

    /// Requests being served now.
    pub fn taken(&self) -> usize {
        self.size.saturating_sub(self.turns.available_permits())
    }

    /// A turn, once one is free within the wait; `None` when none was.
    async fn take(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        tokio::time::timeout(self.wait, self.turns.clone().acquire_owned()).await.ok()?.ok()
    }

    /// The answer to a request that waited in vain.
    fn busy(&self) -> ApiError {
        ApiError::Busy {
            message: format!(
                "lag analytics are busy: {} requests are being served (server.max_concurrent_lag_requests) and this \
                 one waited {:?} for its turn; retry later, or ask /api/v1/staleness, which reads per-minute rollups",
                self.size, self.wait
            ),
            retry_after_seconds: BUSY_RETRY_AFTER_SECONDS,
        }
    }
}

/// Raw lag rows of a scope and range read from the store, and whether a read limit cut them.
pub struct LoadedRows {
    pub rows: LagRows,
    pub spans: usize,
    pub samples: usize,
    pub truncated: bool,
    /// [`RangeTelemetry::complete_before`].
    pub complete_before: Option<i64>,
}

/// A scope's spans and samples of a time range, as lag analytics and exports read them.
pub struct RangeTelemetry {
    pub spans: Vec<lagscope_model::Span>,
    pub samples: Vec<lagscope_model::Sample>,
    /// Whether a read limit was reached (the newest data of the range is missing).
    pub truncated: bool,
    /// When a read limit was reached: the time before which the range was read whole.
    pub complete_before: Option<i64>,
}

/// When a read of rows oldest first took its `max` (`read` of them, the last at `last`): the
/// time before which it holds every row of the range (rows of that very time may be missing).
fn cut_at(read: usize, max: u32, last: Option<i64>) -> Option<i64> {
    last.filter(|_| read >= max as usize)
}

/// The time before which both reads hold every row of the range, when either was cut.
fn complete_before(spans: Option<i64>, samples: Option<i64>) -> Option<i64> {
    spans.into_iter().chain(samples).min()
}

/// Tasks that read a range's spans, slice by slice (`lagscope_store::paging::spans_ahead`).
const SPAN_READERS: usize = 2;

/// Reads the spans and samples of `cluster`/`namespace` (`None` = any) in `range`, at most
/// `max_spans` and `max_samples`, oldest first.
pub async fn read_range(
    store: &Arc<dyn Store>,
    cluster: Option<&str>,
    namespace: Option<&str>,
    range: TimeRange,
    max_spans: u32,
    max_samples: u32,
) -> Result<RangeTelemetry, StoreError> {
    read_range_as(store, cluster, namespace, range, (max_spans, max_samples), |span| span).await
}

/// [`read_range`], each span passed through `shape` as it is taken (`for_timelines`: what lag
/// rows read is kept, the rest is let go a page at a time, not held with the range).
async fn read_range_as(
    store: &Arc<dyn Store>,
    cluster: Option<&str>,
    namespace: Option<&str>,
    range: TimeRange,
    (max_spans, max_samples): (u32, u32),
    shape: fn(lagscope_model::Span) -> lagscope_model::Span,
) -> Result<RangeTelemetry, StoreError> {
    // The spans read a page at a time by tasks of the runtime, in slices of time that they take
    // in turn (the store's query for one slice runs while another's text is parsed), taken
    // here in order up to the cut; the samples read side by side, on a connection of their own.
    let spans = async {
        let last = store.latest_time().await?.unwrap_or(i64::MIN).min(range.to);
        let (cluster, namespace) = (cluster.map(str::to_owned), namespace.map(str::to_owned));
        let mut ahead = spans_ahead(store.clone(), cluster, namespace, range, last, SPAN_READERS).await?;
        let mut spans = Vec::new();
        while spans.len() < max_spans as usize {
            ahead.refill().await?;
            if ahead.rows.is_empty() {
                break;
            }
            let wanted = (max_spans as usize - spans.len()).min(ahead.rows.len());
            spans.extend(ahead.rows.drain(..wanted).map(shape));
        }
        Ok(spans)
    };
    let (spans, samples) =
        futures::future::try_join(spans, store.samples_in_range(cluster, namespace, range, max_samples)).await?;
    let truncated = spans.len() >= max_spans as usize || samples.len() >= max_samples as usize;
    let complete_before = complete_before(
        cut_at(spans.len(), max_spans, spans.last().map(|span| span.start_unix_nano)),
        cut_at(samples.len(), max_samples, samples.last().map(|sample| sample.time_unix_nano)),
    );
    Ok(RangeTelemetry { spans, samples, truncated, complete_before })
}

/// Reads the scope's spans and samples in the query's range and extracts the raw lag rows.
pub async fn load_lag_rows(
    store: &Arc<dyn Store>,
    query: &LagQuery,
    max_spans: u32,
    max_samples: u32,
    call_horizon: i64,
) -> Result<LoadedRows, StoreError> {
    let range = TimeRange { from: query.from_unix_nano, to: query.to_unix_nano };
    let (cluster, namespace) = (query.cluster.as_deref(), query.namespace.as_deref());
    let limits = (max_spans, max_samples);
    let RangeTelemetry { spans, samples, truncated, complete_before } =
        read_range_as(store, cluster, namespace, range, limits, |span| lagscope_analyzer::for_timelines(&span)).await?;
    let (n_spans, n_samples) = (spans.len(), samples.len());
    let rows =
        tokio::task::spawn_blocking(move || lag_rows(&AnalysisInput::from_telemetry(&spans, samples, call_horizon)))
            .await
            .map_err(|error| StoreError::Corrupt { what: "lag rows", detail: error.to_string() })?;
    Ok(LoadedRows { rows, spans: n_spans, samples: n_samples, truncated, complete_before })
}

/// Read rollups (node-minutes) one staleness request or panel reads at most (the oldest of
/// the range first): a week of 20 nodes.
pub const MAX_ROLLUPS: u32 = 200_000;

/// The staleness of the reads one node served over a range, merged from its minutes' rollups.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeStaleness {
    pub cluster: Option<String>,
    pub namespace: Option<String>,
    pub node: Option<String>,
    pub reads: u64,
    /// Reads for which the namespace's committed state was known (what the percentiles cover).
    pub compared: u64,
    /// Reads served behind the committed state.
    pub behind_reads: u64,
    /// Behind committed in states: p50 and p99 within 1/16 (exact below 16), max exact.
    pub behind_states: Option<Percentiles>,
    pub behind_seconds: Option<Percentiles>,
}

/// The rollups merged per (cluster, namespace, node), in that order.
pub fn staleness_by_node(rollups: &[ReadRollup]) -> Vec<NodeStaleness> {
    // (cluster, namespace, node)
    type Scope = (Option<String>, Option<String>, Option<String>);
    let mut merged: BTreeMap<Scope, ReadRollup> = BTreeMap::new();
    for rollup in rollups {
        let scope = (rollup.cluster.clone(), rollup.namespace.clone(), rollup.node.clone());
        merged.entry(scope).or_default().merge(rollup);
    }
    merged
        .into_iter()
        .map(|((cluster, namespace, node), rollup)| {
            let spread = |histogram: &lagscope_model::LogHistogram, scale: f64, max: Option<f64>| {
                Some(Percentiles {
                    p50: histogram.quantile(0.5)? * scale,
                    p99: histogram.quantile(0.99)? * scale,
                    max: max?,
                })
            };
            NodeStaleness {
                cluster,
                namespace,
                node,
                reads: rollup.reads,
                compared: rollup.compared,
                behind_reads: rollup.behind_reads,
                behind_states: spread(&rollup.behind_states, 1.0, rollup.max_behind_states.map(|max| max as f64)),
                behind_seconds: spread(&rollup.behind_millis, 1e-3, rollup.max_behind_seconds),
            }
        })
        .collect()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StalenessParams {
    cluster: Option<String>,
    namespace: Option<String>,
    from: Option<String>,
    to: Option<String>,
}

/// `GET /api/v1/staleness?cluster=&namespace=&from=&to=`: per node, the staleness of the reads
/// it served in the range, from the per-minute rollups the live analyzer writes (every whole
/// minute starting in the range, the one holding `from` included): cheap for any range,
/// where `/api/v1/lag` reads the raw telemetry.
pub(crate) async fn staleness(
    State(state): State<ApiState>,
    params: Result<Query<StalenessParams>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(params) = params.map_err(|rejection| ApiError::BadRequest(rejection.body_text()))?;
    let (from, to) = query_range(params.from.as_deref(), params.to.as_deref())?;
    let minutes = TimeRange { from: rollup_step_of(from), to };
    let rollups = state.store.read_rollups(minutes, MAX_ROLLUPS).await?;
    let truncated = rollups.len() >= MAX_ROLLUPS as usize;
    let wanted = |value: &Option<String>, filter: &Option<String>| {
        filter.as_deref().filter(|text| !text.is_empty()).is_none_or(|filter| value.as_deref() == Some(filter))
    };
    let selected: Vec<ReadRollup> = rollups
        .into_iter()
        .filter(|rollup| wanted(&rollup.cluster, &params.cluster) && wanted(&rollup.namespace, &params.namespace))
        .collect();
    Ok(Json(json!({
        "from_unix_nano": minutes.from,
        "to_unix_nano": to,
        "node_minutes": selected.len(),
        "truncated": truncated,
        "nodes": staleness_by_node(&selected),
    })))
}

/// `from` and `to` of a range query: both optional, the last hour up to now by default.
fn query_range(from: Option<&str>, to: Option<&str>) -> Result<(i64, i64), ApiError> {
    let to = match to {
        Some(text) => parse_time("to", text).map_err(ApiError::BadRequest)?,
        None => jiff::Timestamp::now().as_nanosecond() as i64,
    };
    let from = match from {
        Some(text) => parse_time("from", text).map_err(ApiError::BadRequest)?,
        None => to.saturating_sub(DEFAULT_RANGE),
    };
    if from >= to {
        return Err(ApiError::BadRequest("parameter from must be before to".to_string()));
    }
    Ok((from, to))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LagParams {
    cluster: Option<String>,
    namespace: Option<String>,
    from: Option<String>,
    to: Option<String>,
    /// Bucket width: seconds, or a number with `s`, `m`, `h` or `d`.
    step: Option<String>,
}

pub(crate) async fn lag(
    State(state): State<ApiState>,
    params: Result<Query<LagParams>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(params) = params.map_err(|rejection| ApiError::BadRequest(rejection.body_text()))?;
    let (from, to) = query_range(params.from.as_deref(), params.to.as_deref())?;
    let step_seconds = params.step.as_deref().map(parse_step).transpose().map_err(ApiError::BadRequest)?;
    if let Some(step) = step_seconds {
        let buckets = (to - from) / step.saturating_mul(1_000_000_000);
        if buckets > MAX_BUCKETS {
            return Err(ApiError::BadRequest(format!(
                "parameter step: {step} s makes {buckets} buckets over the range, more than {MAX_BUCKETS}"
            )));
        }
    }
    let query = LagQuery {
        cluster: params.cluster.filter(|text| !text.is_empty()),
        namespace: params.namespace.filter(|text| !text.is_empty()),
        from_unix_nano: from,
        to_unix_nano: to,
        step_seconds,
    };
    let Some(aggregate) = state.lag.clone() else {
        return Err(ApiError::Unavailable("lag analytics are not enabled in this build".to_string()));
    };
    let Some(turn) = state.lag_turns.take().await else {
        state.metrics.api_lag_requests_refused.add(1);
        return Err(state.lag_turns.busy());
    };
    // On a task of its own that keeps the turn until the rows are read and aggregated, even if
    // the client goes away meanwhile: the memory is held until then.
    let (store, horizon) = (state.store.clone(), state.call_horizon);
    let work = tokio::spawn(async move {
        let _turn = turn;
        let loaded = load_lag_rows(&store, &query, MAX_LAG_SPANS, MAX_LAG_SAMPLES, horizon).await?;
        tokio::task::spawn_blocking(move || aggregate(&loaded.rows, &query).map(|report| (report, loaded)))
            .await
            .map_err(|error| ApiError::Analysis(error.to_string()))?
            .map_err(ApiError::Analysis)
    });
    let (report, loaded) = work.await.map_err(|error| ApiError::Analysis(error.to_string()))??;
    let mut value = serde_json::to_value(&report).map_err(|error| ApiError::Analysis(error.to_string()))?;
    if let Value::Object(object) = &mut value {
        object.insert(
            "input".to_string(),
            json!({
                "spans": loaded.spans,
                "samples": loaded.samples,
                "truncated": loaded.truncated,
                "complete_before_unix_nano": loaded.complete_before,
            }),
        );
    }
    Ok(Json(value))
}

/// `30` or `30s`, `5m`, `1h`, `1d`: a whole number of seconds, at least 1.
pub fn parse_step(text: &str) -> Result<i64, String> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(index) => text.split_at(index),
        None => (text, "s"),
    };
    let multiplier = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        _ => return Err(format!("parameter step: {text:?} is not a duration (use seconds, or 30s, 5m, 1h, 1d)")),
    };
    let value: i64 = number
        .parse()
        .map_err(|_| format!("parameter step: {text:?} is not a duration (use seconds, or 30s, 5m, 1h, 1d)"))?;
    match value.checked_mul(multiplier) {
        Some(seconds) if (1..=366 * 86_400).contains(&seconds) => Ok(seconds),
        _ => Err(format!("parameter step: {text:?} must be between 1 s and 366 d")),
    }
}

#[cfg(test)]
mod tests {
    use super::{complete_before, cut_at, parse_step};

    #[test]
    fn a_cut_range_is_whole_before_the_earlier_cut() {
        assert_eq!(cut_at(2, 3, Some(5)), None, "under the limit");
        assert_eq!(cut_at(3, 3, Some(5)), Some(5), "at the limit");
        assert_eq!(cut_at(0, 0, None), None, "nothing read");
        assert_eq!(complete_before(None, None), None);
        assert_eq!(complete_before(Some(5), None), Some(5));
        assert_eq!(complete_before(None, Some(3)), Some(3));
        assert_eq!(complete_before(Some(5), Some(3)), Some(3), "the earlier cut");
    }

    #[test]
    fn steps_parse_with_units_and_name_the_bad_ones() {
        assert_eq!(parse_step("30"), Ok(30));
        assert_eq!(parse_step("30s"), Ok(30));
        assert_eq!(parse_step("5m"), Ok(300));
        assert_eq!(parse_step("1h"), Ok(3_600));
        assert_eq!(parse_step("2d"), Ok(172_800));
        for bad in ["0", "-5", "5x", "m", "", "1.5m", "99999999999999999999"] {
            let error = parse_step(bad).expect_err(bad);
            assert!(error.contains("step"), "{error}");
        }
    }
}
