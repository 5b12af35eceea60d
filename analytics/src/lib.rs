//! Aggregate lag analytics with polars, and their Parquet export.
//!
//! The analyzer extracts the raw rows (one per served read, applied-state report and rejection
//! count: [`LagRows`]); this crate turns them into data frames, buckets them by namespace, node
//! and time step and takes percentiles ([`aggregate`]), and writes both the rows and the
//! aggregates as Parquet ([`export_parquet`]). It is the only crate that depends on polars,
//! which is most of a release build: the collector, store and API build and test without it.

use std::path::{Path, PathBuf};

use lagscope_analyzer::{ApplyLagPoint, LagRows, ReadLag, RejectionCount};
use lagscope_model::{ApplyLagBucket, LagQuery, LagReport, Percentiles, ReadStalenessBucket, RejectionBucket, Span};
use polars::prelude::*;

#[derive(Debug, thiserror::Error)]
pub enum AnalyticsError {
    #[error("polars: {0}")]
    Polars(#[from] PolarsError),
    #[error("cannot write {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

pub type Result<T> = std::result::Result<T, AnalyticsError>;

const GROUP: [&str; 3] = ["cluster", "namespace", "node"];

/// The raw rows as data frames (times as `i64` nanoseconds since the epoch).
pub struct LagFrames {
    pub reads: DataFrame,
    pub apply: DataFrame,
    pub rejections: DataFrame,
}

impl LagFrames {
    pub fn new(rows: &LagRows) -> Result<Self> {
        Ok(Self {
            reads: reads_frame(&rows.reads)?,
            apply: apply_frame(&rows.apply)?,
            rejections: rejections_frame(&rows.rejections)?,
        })
    }
}

/// The read rows as a frame (`reads.parquet`'s columns).
pub fn reads_frame(reads: &[ReadLag]) -> Result<DataFrame> {
    Ok(df!(
        "cluster" => reads.iter().map(|row| row.cluster.clone()).collect::<Vec<_>>(),
        "namespace" => reads.iter().map(|row| row.namespace.clone()).collect::<Vec<_>>(),
        "node" => reads.iter().map(|row| row.node.clone()).collect::<Vec<_>>(),
        "role" => reads.iter().map(|row| row.role.clone()).collect::<Vec<_>>(),
        "client_id" => reads.iter().map(|row| row.client_id.clone()).collect::<Vec<_>>(),
        "time_unix_nano" => reads.iter().map(|row| row.time_unix_nano).collect::<Vec<_>>(),
        "served" => reads.iter().map(|row| row.served).collect::<Vec<_>>(),
        "committed" => reads.iter().map(|row| row.committed).collect::<Vec<_>>(),
        "behind_states" => reads.iter().map(|row| row.behind_states).collect::<Vec<_>>(),
        "behind_seconds" => reads.iter().map(|row| row.behind_seconds).collect::<Vec<_>>(),
    )?)
}

fn apply_frame(apply: &[ApplyLagPoint]) -> Result<DataFrame> {
    Ok(df!(
        "cluster" => apply.iter().map(|row| row.cluster.clone()).collect::<Vec<_>>(),
        "namespace" => apply.iter().map(|row| row.namespace.clone()).collect::<Vec<_>>(),
        "node" => apply.iter().map(|row| row.node.clone()).collect::<Vec<_>>(),
        "time_unix_nano" => apply.iter().map(|row| row.time_unix_nano).collect::<Vec<_>>(),
        "applied" => apply.iter().map(|row| row.applied).collect::<Vec<_>>(),
        "committed" => apply.iter().map(|row| row.committed).collect::<Vec<_>>(),
        "behind_states" => apply.iter().map(|row| row.behind_states).collect::<Vec<_>>(),
        "behind_seconds" => apply.iter().map(|row| row.behind_seconds).collect::<Vec<_>>(),
    )?)
}

fn rejections_frame(rejections: &[RejectionCount]) -> Result<DataFrame> {
    Ok(df!(
        "cluster" => rejections.iter().map(|row| row.cluster.clone()).collect::<Vec<_>>(),
        "namespace" => rejections.iter().map(|row| row.namespace.clone()).collect::<Vec<_>>(),
        "node" => rejections.iter().map(|row| row.node.clone()).collect::<Vec<_>>(),
        "role" => rejections.iter().map(|row| row.role.clone()).collect::<Vec<_>>(),
        "time_unix_nano" => rejections.iter().map(|row| row.time_unix_nano).collect::<Vec<_>>(),
        "rejections" => rejections.iter().map(|row| row.rejections).collect::<Vec<_>>(),
    )?)
}

/// The aggregates of a query, as data frames (one row per group and bucket).
pub struct LagAggregates {
    pub reads: DataFrame,
    pub apply: DataFrame,
    pub rejections: DataFrame,
}

impl LagAggregates {
    pub fn new(frames: &LagFrames, query: &LagQuery) -> Result<Self> {
        let reads = scoped(frames.reads.clone(), query)?
            .group_by(bucketed(&GROUP))
            .agg([
                len().cast(DataType::UInt64).alias("reads"),
                col("behind_states").gt(lit(0)).sum().cast(DataType::UInt64).alias("stale_reads"),
                col("behind_states").count().cast(DataType::UInt64).alias("compared"),
                percentiles("behind_states"),
                percentiles("behind_seconds"),
            ])
            .sort(bucketed_names(&GROUP), SortMultipleOptions::default())
            .collect()?;
        let apply = scoped(frames.apply.clone(), query)?
            .group_by(bucketed(&GROUP))
            .agg([
                len().cast(DataType::UInt64).alias("reports"),
                percentiles("behind_states"),
                percentiles("behind_seconds"),
            ])
            .sort(bucketed_names(&GROUP), SortMultipleOptions::default())
            .collect()?;
        let rejection_group = ["cluster", "namespace", "node", "role"];
        let rejections = scoped(frames.rejections.clone(), query)?
            .group_by(bucketed(&rejection_group))
            .agg([col("rejections").sum()])
            .sort(bucketed_names(&rejection_group), SortMultipleOptions::default())
            .collect()?;
        Ok(Self {
            reads: reads.unnest(["behind_states", "behind_seconds"], None)?,
            apply: apply.unnest(["behind_states", "behind_seconds"], None)?,
            rejections,
        })
    }
}

/// Rows in the query's scope and range, with the start of their bucket as `bucket_unix_nano`.
fn scoped(frame: DataFrame, query: &LagQuery) -> Result<LazyFrame> {
    let mut keep =
        col("time_unix_nano").gt_eq(lit(query.from_unix_nano)).and(col("time_unix_nano").lt(lit(query.to_unix_nano)));
    if let Some(cluster) = &query.cluster {
        keep = keep.and(col("cluster").eq(lit(cluster.as_str())));
    }
    if let Some(namespace) = &query.namespace {
        keep = keep.and(col("namespace").eq(lit(namespace.as_str())));
    }
    // Bucketed here rather than in an expression: integer floor division needs polars'
    // `round_series` feature, which needs `timezones` (see the stack notes).
    let buckets: Vec<Option<i64>> =
        frame.column("time_unix_nano")?.i64()?.iter().map(|time| time.map(|time| query.bucket_of(time))).collect();
    let mut frame = frame;
    frame.with_column(Column::new("bucket_unix_nano".into(), buckets))?;
    Ok(frame.lazy().filter(keep))
}

fn bucketed(group: &[&str]) -> Vec<Expr> {
    group.iter().map(|name| col(*name)).chain([col("bucket_unix_nano")]).collect()
}

fn bucketed_names(group: &[&str]) -> Vec<PlSmallStr> {
    group.iter().map(|name| PlSmallStr::from(*name)).chain([PlSmallStr::from("bucket_unix_nano")]).collect()
}

/// p50, p99 and max of a column as a struct column named after it (`NAME.p50`... once
/// unnested: fields `NAME_p50`, `NAME_p99`, `NAME_max`).
fn percentiles(name: &str) -> Expr {
    let value = col(name).cast(DataType::Float64);
    as_struct(vec![
        value.clone().quantile(lit(0.5), QuantileMethod::Linear).alias(format!("{name}_p50")),
        value.clone().quantile(lit(0.99), QuantileMethod::Linear).alias(format!("{name}_p99")),
        value.max().alias(format!("{name}_max")),
    ])
    .alias(name)
}

/// Aggregates the rows for `query` into the API's report.
pub fn aggregate(rows: &LagRows, query: &LagQuery) -> Result<LagReport> {
    let aggregates = LagAggregates::new(&LagFrames::new(rows)?, query)?;
    let bucket = |start: Option<i64>| start.unwrap_or(query.from_unix_nano);

    let frame = &aggregates.reads;
    let (cluster, namespace, node) = (texts(frame, "cluster")?, texts(frame, "namespace")?, texts(frame, "node")?);
    let (buckets, reads, stale) =
        (integers(frame, "bucket_unix_nano")?, counts(frame, "reads")?, counts(frame, "stale_reads")?);
    let (states, seconds) = (spreads(frame, "behind_states")?, spreads(frame, "behind_seconds")?);
    let read_buckets = (0..frame.height())
        .map(|row| ReadStalenessBucket {
            cluster: cluster[row].clone(),
            namespace: namespace[row].clone(),
            node: node[row].clone(),
            bucket_start_unix_nano: bucket(buckets[row]),
            reads: reads[row],
            stale_reads: stale[row],
            behind_states: states[row],
            behind_seconds: seconds[row],
        })
        .collect();

    let frame = &aggregates.apply;
    let (cluster, namespace, node) = (texts(frame, "cluster")?, texts(frame, "namespace")?, texts(frame, "node")?);
    let (buckets, reports) = (integers(frame, "bucket_unix_nano")?, counts(frame, "reports")?);
    let (states, seconds) = (spreads(frame, "behind_states")?, spreads(frame, "behind_seconds")?);
    let apply_buckets = (0..frame.height())
        .filter_map(|row| {
            Some(ApplyLagBucket {
                cluster: cluster[row].clone(),
                namespace: namespace[row].clone(),
                node: node[row].clone(),
                bucket_start_unix_nano: bucket(buckets[row]),
                reports: reports[row],
                behind_states: states[row]?,
                behind_seconds: seconds[row]?,
            })
        })
        .collect();

    let frame = &aggregates.rejections;
    let (cluster, namespace, node) = (texts(frame, "cluster")?, texts(frame, "namespace")?, texts(frame, "node")?);
    let (roles, buckets, counted) =
        (texts(frame, "role")?, integers(frame, "bucket_unix_nano")?, floats(frame, "rejections")?);
    let rejection_buckets = (0..frame.height())
        .map(|row| RejectionBucket {
            cluster: cluster[row].clone(),
            namespace: namespace[row].clone(),
            node: node[row].clone(),
            role: roles[row].clone().unwrap_or_default(),
            bucket_start_unix_nano: bucket(buckets[row]),
            rejections: counted[row].unwrap_or(0.0),
        })
        .collect();

    Ok(LagReport { query: query.clone(), reads: read_buckets, apply_lag: apply_buckets, rejections: rejection_buckets })
}

fn texts(frame: &DataFrame, name: &str) -> Result<Vec<Option<String>>> {
    Ok(frame.column(name)?.str()?.iter().map(|value| value.map(str::to_string)).collect())
}

fn integers(frame: &DataFrame, name: &str) -> Result<Vec<Option<i64>>> {
    Ok(frame.column(name)?.cast(&DataType::Int64)?.i64()?.iter().collect())
}

fn floats(frame: &DataFrame, name: &str) -> Result<Vec<Option<f64>>> {
    Ok(frame.column(name)?.cast(&DataType::Float64)?.f64()?.iter().collect())
}

fn counts(frame: &DataFrame, name: &str) -> Result<Vec<u64>> {
    Ok(frame.column(name)?.u64()?.iter().map(Option::unwrap_or_default).collect())
}

/// The `NAME_p50`, `NAME_p99`, `NAME_max` columns as one value per row (`None` where the
/// group had no value to take percentiles of).
fn spreads(frame: &DataFrame, name: &str) -> Result<Vec<Option<Percentiles>>> {
    let [p50, p99, max] = ["p50", "p99", "max"].map(|suffix| floats(frame, &format!("{name}_{suffix}")));
    Ok(p50?
        .into_iter()
        .zip(p99?)
        .zip(max?)
        .map(|((p50, p99), max)| Some(Percentiles { p50: p50?, p99: p99?, max: max? }))
        .collect())
}

/// Spans as a flat frame: one row per span, the telemetry conventions' fields as columns
/// (times as `i64` nanoseconds; events, links and other attributes are left out).
pub fn spans_frame(spans: &[Span]) -> Result<DataFrame> {
    let text =
        |field: fn(&Span) -> Option<&str>| spans.iter().map(|span| field(span).map(str::to_string)).collect::<Vec<_>>();
    let number = |field: fn(&Span) -> Option<i64>| spans.iter().map(field).collect::<Vec<_>>();
    Ok(df!(
        "trace_id" => text(|span| span.trace_id.as_deref()),
        "span_id" => text(|span| span.span_id.as_deref()),
        "parent_span_id" => text(|span| span.parent_span_id.as_deref()),
        "name" => text(|span| Some(span.name.as_str())),
        "start_unix_nano" => number(|span| Some(span.start_unix_nano)),
        "end_unix_nano" => number(|span| Some(span.end_unix_nano)),
        "status_code" => number(|span| Some(i64::from(span.status_code))),
        "service_name" => text(|span| span.resource.service_name.as_deref()),
        "system" => text(|span| span.resource.system.as_deref()),
        "cluster" => text(|span| span.resource.cluster.as_deref()),
        "component" => text(|span| span.resource.component.as_ref().map(|component| component.as_str())),
        "node_id" => text(|span| span.resource.node_id.as_deref()),
        "client_id" => text(|span| span.call.client_id.as_deref()),
        "call_id" => text(|span| span.call.call_id.as_deref()),
        "attempt" => number(|span| span.call.attempt),
        "namespace" => text(|span| span.call.namespace.as_deref()),
        "op" => text(|span| span.call.op.as_ref().map(|op| op.as_str())),
        "rpc_method" => text(|span| span.call.rpc_method.as_deref()),
        "target_node" => text(|span| span.call.target_node.as_deref()),
        "target_role" => text(|span| span.call.target_role.as_deref()),
        "node_role" => text(|span| span.call.node_role.as_deref()),
        "consistency" => text(|span| span.call.consistency.as_deref()),
        "state_carried" => number(|span| span.call.state.carried),
        "state_returned" => number(|span| span.call.state.returned),
        "state_served" => number(|span| span.call.state.served),
        "state_committed" => number(|span| span.call.state.committed),
        "state_router" => number(|span| span.call.state.router),
        "outcome" => text(|span| span.call.outcome.as_ref().map(|outcome| outcome.as_str())),
        "error_type" => text(|span| span.call.error_type.as_deref()),
        "requeues" => number(|span| span.call.requeues),
    )?)
}

/// Writes the spans as `spans.parquet` in `dir` (see [`spans_frame`]).
pub fn export_spans_parquet(dir: &Path, spans: &[Span]) -> Result<Exported> {
    std::fs::create_dir_all(dir).map_err(|source| AnalyticsError::Io { path: dir.to_path_buf(), source })?;
    write_spans(dir.join("spans.parquet"), spans, SPANS_PER_BATCH)
}

/// Spans made a frame and written at a time by [`SpansFile`] (a row group each).
const SPANS_PER_BATCH: usize = 100_000;

/// Writes `spans` to `path`, `per_batch` of them made a frame at a time.
fn write_spans(path: PathBuf, spans: &[Span], per_batch: usize) -> Result<Exported> {
    let mut file = SpansFile::create_batched(path, per_batch)?;
    for chunk in spans.chunks(per_batch) {
        file.write(chunk)?;
    }
    file.finish()
}

/// A Parquet file written a frame at a time, a row group each, with its `time` column
/// (nanoseconds) also as a UTC timestamp ([`with_timestamp`]).
struct FrameFile {
    path: PathBuf,
    writer: polars::io::parquet::write::BatchedWriter<std::fs::File>,
    time: &'static str,
    rows: usize,
}

impl FrameFile {
    /// A file of the columns of `empty`, a frame of no row.
    fn create(path: PathBuf, empty: DataFrame, time: &'static str) -> Result<Self> {
        let file = std::fs::File::create(&path).map_err(|source| AnalyticsError::Io { path: path.clone(), source })?;
        let columns = with_timestamp(empty, time)?;
        let writer =
            ParquetWriter::new(file).with_compression(ParquetCompression::Zstd(None)).batched(columns.schema())?;
        Ok(Self { path, writer, time, rows: 0 })
    }

    fn write(&mut self, frame: DataFrame) -> Result<()> {
        if frame.height() > 0 {
            self.rows += frame.height();
            self.writer.write_batch(&with_timestamp(frame, self.time)?)?;
        }
        Ok(())
    }

    fn finish(self) -> Result<Exported> {
        self.writer.finish()?;
        Ok(Exported { path: self.path, rows: self.rows })
    }
}

/// `spans.parquet` written as the spans come ([`spans_frame`]): a frame of every span at
/// once held about as much memory again as the spans.
pub struct SpansFile {
    file: FrameFile,
    waiting: Vec<Span>,
    per_batch: usize,
}

impl SpansFile {
    pub fn create(path: PathBuf) -> Result<Self> {
        Self::create_batched(path, SPANS_PER_BATCH)
    }

    fn create_batched(path: PathBuf, per_batch: usize) -> Result<Self> {
        Ok(Self {
            file: FrameFile::create(path, spans_frame(&[])?, "start_unix_nano")?,
            waiting: Vec::new(),
            per_batch,
        })
    }

    /// Adds `span`, writing a row group when enough wait.
    pub fn push(&mut self, span: Span) -> Result<()> {
        self.waiting.push(span);
        if self.waiting.len() >= self.per_batch {
            self.file.write(spans_frame(&self.waiting)?)?;
            self.waiting.clear();
        }
        Ok(())
    }

    fn write(&mut self, spans: &[Span]) -> Result<()> {
        self.file.write(spans_frame(spans)?)
    }

    pub fn finish(mut self) -> Result<Exported> {
        if !self.waiting.is_empty() {
            self.file.write(spans_frame(&self.waiting)?)?;
        }
        self.file.finish()
    }
}

/// `reads.parquet` ([`reads_frame`]) written as the rows are completed, in order.
pub struct ReadsFile {
    file: FrameFile,
}

impl ReadsFile {
    pub fn create(path: PathBuf) -> Result<Self> {
        Ok(Self { file: FrameFile::create(path, reads_frame(&[])?, "time_unix_nano")? })
    }

    pub fn write(&mut self, rows: &[ReadLag]) -> Result<()> {
        self.file.write(reads_frame(rows)?)
    }

    pub fn finish(self) -> Result<Exported> {
        self.file.finish()
    }
}

/// One file [`export_parquet`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exported {
    pub path: PathBuf,
    pub rows: usize,
}

/// Writes the raw rows (`reads.parquet`, `apply_lag.parquet`, `rejections.parquet`) and the
/// aggregates of `query` (`reads_by_step.parquet`, `apply_lag_by_step.parquet`,
/// `rejections_by_step.parquet`) into `dir`, creating it. Times are written as UTC
/// nanosecond timestamps.
pub fn export_parquet(dir: &Path, rows: &LagRows, query: &LagQuery) -> Result<Vec<Exported>> {
    std::fs::create_dir_all(dir).map_err(|source| AnalyticsError::Io { path: dir.to_path_buf(), source })?;
    let frames = LagFrames::new(rows)?;
    let aggregates = LagAggregates::new(&frames, query)?;
    let reads = write_frame(&dir.join("reads.parquet"), frames.reads, "time_unix_nano")?;
    write_after_reads(dir, reads, frames.apply, frames.rejections, aggregates)
}

/// With the read rows already written ([`ReadsFile`] at `reads`), writes the rest of
/// [`export_parquet`]'s files into `dir`: the applied-state and rejection rows, and the
/// aggregates of `query`, taken from the read rows read back (only the columns they group and
/// measure). Returns every file, the read rows' first, in [`export_parquet`]'s order.
pub fn export_parquet_with_reads(
    dir: &Path,
    reads: Exported,
    apply: &[ApplyLagPoint],
    rejections: &[RejectionCount],
    query: &LagQuery,
) -> Result<Vec<Exported>> {
    let file =
        std::fs::File::open(&reads.path).map_err(|source| AnalyticsError::Io { path: reads.path.clone(), source })?;
    let columns = ["cluster", "namespace", "node", "time_unix_nano", "behind_states", "behind_seconds"];
    let read_back =
        ParquetReader::new(file).with_columns(Some(columns.iter().map(|name| name.to_string()).collect())).finish()?;
    let frames = LagFrames { reads: read_back, apply: apply_frame(apply)?, rejections: rejections_frame(rejections)? };
    let aggregates = LagAggregates::new(&frames, query)?;
    write_after_reads(dir, reads, frames.apply, frames.rejections, aggregates)
}

/// Writes the files that follow the read rows' (`reads`, written already): the applied-state
/// and rejection rows and the aggregates. Returns every file, `reads` first.
fn write_after_reads(
    dir: &Path,
    reads: Exported,
    apply: DataFrame,
    rejections: DataFrame,
    aggregates: LagAggregates,
) -> Result<Vec<Exported>> {
    let files = [
        ("apply_lag.parquet", apply, "time_unix_nano"),
        ("rejections.parquet", rejections, "time_unix_nano"),
        ("reads_by_step.parquet", aggregates.reads, "bucket_unix_nano"),
        ("apply_lag_by_step.parquet", aggregates.apply, "bucket_unix_nano"),
        ("rejections_by_step.parquet", aggregates.rejections, "bucket_unix_nano"),
    ];
    let written: Result<Vec<Exported>> =
        files.into_iter().map(|(name, frame, time)| write_frame(&dir.join(name), frame, time)).collect();
    Ok(std::iter::once(reads).chain(written?).collect())
}

/// Writes `frame` with its `time` column (nanoseconds) as a timestamp column `time`/`bucket`.
/// (Through the batched writer, as the spans and read rows are: it keeps the timestamp's time
/// zone, which writing a whole frame at once left out.)
fn write_frame(path: &Path, frame: DataFrame, time: &'static str) -> Result<Exported> {
    let mut file = FrameFile::create(path.to_path_buf(), frame.clear(), time)?;
    file.write(frame)?;
    file.finish()
}

/// `frame` with its `time` column (nanoseconds) also as a UTC timestamp column named without
/// the `_unix_nano` (`time`, `bucket`, `start`).
fn with_timestamp(frame: DataFrame, time: &str) -> Result<DataFrame> {
    let timestamp = time.trim_end_matches("_unix_nano");
    Ok(frame
        .lazy()
        .with_column(col(time).cast(DataType::Datetime(TimeUnit::Nanoseconds, Some(TimeZone::UTC))).alias(timestamp))
        .collect()?)
}

#[cfg(test)]
mod tests {
    use lagscope_model::{CallFields, ResourceFields, SpanKind};

    use super::*;

    fn span(index: i64) -> Span {
        Span {
            trace_id: Some(format!("{index:032x}")),
            span_id: Some(format!("{index:016x}")),
            parent_span_id: None,
            name: format!("op-{index}"),
            kind: SpanKind::Client,
            start_unix_nano: 1_000 + index,
            end_unix_nano: 2_000 + index,
            status_code: 0,
            status_message: None,
            resource: ResourceFields::default(),
            scope_name: None,
            scope_version: None,
            scope_attributes: Default::default(),
            call: CallFields { client_id: Some(format!("client-{}", index % 3)), ..CallFields::default() },
            attributes: Default::default(),
            events: Vec::new(),
            links: Vec::new(),
        }
    }

    fn read_back(path: &Path) -> DataFrame {
        ParquetReader::new(std::fs::File::open(path).expect("written")).finish().expect("a Parquet file")
    }

    #[test]
    fn spans_written_in_batches_read_back_whole_and_in_order() {
        let dir = tempfile::tempdir().expect("temp dir");
        let spans: Vec<Span> = (0..7).map(span).collect();
        // 3 + 3 + 1, and all at once: the same frame.
        let batched = write_spans(dir.path().join("batched.parquet"), &spans, 3).expect("batched");
        let whole = write_spans(dir.path().join("whole.parquet"), &spans, 100).expect("whole");
        assert_eq!((batched.rows, whole.rows), (7, 7));
        let (batched, whole) = (read_back(&batched.path), read_back(&whole.path));
        assert!(batched.equals_missing(&whole), "{batched}\n{whole}");
        let names: Vec<String> = (batched.column("name").expect("name").str().expect("text").iter())
            .map(|name| name.expect("a name").to_string())
            .collect();
        assert_eq!(names, (0..7).map(|index| format!("op-{index}")).collect::<Vec<_>>());
        assert!(batched.column("start").expect("a timestamp column").dtype().is_temporal());
        // No span: a file with the columns and no row.
        let empty = write_spans(dir.path().join("empty.parquet"), &[], 3).expect("empty");
        let empty = read_back(&empty.path);
        assert_eq!((empty.height(), empty.width()), (0, whole.width()));
    }
}
