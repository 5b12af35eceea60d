//! `lagscope export --parquet DIR`: lag analytics (raw rows and per-step aggregates) and the
//! spans they came from, as Parquet files for notebooks, DuckDB, Spark or polars.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use lagscope_analytics::{Exported, export_parquet, export_spans_parquet};
use lagscope_analyzer::{AnalysisInput, LagRows, lag_rows};
use lagscope_model::{LagQuery, Span};
use lagscope_store::TimeRange;

/// What to export and where from.
#[derive(Debug, Clone)]
pub struct ExportRequest {
    pub dir: PathBuf,
    /// Capture files to read; empty: read the store (PostgreSQL at `database_url`, else
    /// SQLite in `data_dir`).
    pub captures: Vec<PathBuf>,
    pub data_dir: PathBuf,
    pub database_url: Option<String>,
    pub cluster: Option<String>,
    pub namespace: Option<String>,
    pub from: Option<i64>,
    pub to: Option<i64>,
    pub step_seconds: Option<i64>,
    /// The most spans (and samples) read from the store.
    pub max_spans: u32,
}

/// What an export read and wrote.
#[derive(Debug)]
pub struct ExportReport {
    pub source: String,
    pub spans: usize,
    pub samples: usize,
    pub truncated: bool,
    pub files: Vec<Exported>,
}

pub fn export(request: &ExportRequest) -> anyhow::Result<ExportReport> {
    let range = TimeRange { from: request.from.unwrap_or(i64::MIN), to: request.to.unwrap_or(i64::MAX) };
    anyhow::ensure!(range.from < range.to, "--from must be before --to");
    let (source, spans, samples, truncated) = if request.captures.is_empty() {
        read_store(request, range)?
    } else {
        if let Some(lscap) = request.captures.iter().find(|path| crate::lscap::is_lscap(path)) {
            anyhow::bail!(
                "{}: an lscap capture, which keeps only what the detectors read (not what the Parquet \
                 files hold); export --parquet reads OTLP JSON captures (.json, .jsonl, optionally .gz) or the \
                 store: pass the OTLP JSON capture it was made from",
                lscap.display()
            );
        }
        let capture = crate::analyze::read_captures(&request.captures)?;
        // The store's semantics: a namespace filter takes spans of that namespace, and samples
        // of that namespace or of none.
        let cluster_ok =
            |cluster: Option<&str>| request.cluster.as_deref().is_none_or(|wanted| cluster == Some(wanted));
        let namespace_is =
            |namespace: Option<&str>| request.namespace.as_deref().is_none_or(|wanted| namespace == Some(wanted));
        let in_range = |time: i64| time >= range.from && time < range.to;
        let spans: Vec<Span> = capture
            .spans
            .into_iter()
            .filter(|span| cluster_ok(span.resource.cluster.as_deref()) && namespace_is(span.call.namespace.as_deref()))
            .filter(|span| in_range(span.start_unix_nano))
            .collect();
        let samples = capture
            .samples
            .into_iter()
            .filter(|sample| {
                let namespace = sample.series.label(lagscope_model::conventions::NAMESPACE);
                cluster_ok(sample.series.label(lagscope_model::conventions::CLUSTER))
                    && (namespace.is_none() || namespace_is(namespace))
            })
            .filter(|sample| in_range(sample.time_unix_nano))
            .collect();
        let names: Vec<String> = request.captures.iter().map(|path| path.display().to_string()).collect();
        (names.join(", "), spans, samples, false)
    };
    let (n_spans, n_samples) = (spans.len(), samples.len());
    // (Export takes no configuration: the calls are those the default analyzer sees.)
    // The timelines go once their rows are made: the spans' own file is written after.
    let rows =
        lag_rows(&AnalysisInput::from_telemetry(&spans, samples, lagscope_analyzer::StreamConfig::default().horizon()));
    let query = query_for(request, &rows, &spans);
    let mut files = export_parquet(&request.dir, &rows, &query)?;
    files.push(export_spans_parquet(&request.dir, &spans)?);
    Ok(ExportReport { source, spans: n_spans, samples: n_samples, truncated, files })
}

type Telemetry = (String, Vec<Span>, Vec<lagscope_model::Sample>, bool);

fn read_store(request: &ExportRequest, range: TimeRange) -> anyhow::Result<Telemetry> {
    // The spans are read by tasks on the runtime's threads.
    crate::stored::runtime_on_threads(2)?.block_on(async {
        let (source, store) = crate::stored::open(
            request.database_url.as_deref(),
            &request.data_dir,
            Some("pass --data-dir or --database-url, or capture files"),
        )
        .await?;
        let (cluster, namespace) = (request.cluster.as_deref(), request.namespace.as_deref());
        let lagscope_web::RangeTelemetry { spans, samples, truncated, .. } = lagscope_web::read_range(
            &Arc::from(store),
            cluster,
            namespace,
            range,
            request.max_spans,
            request.max_spans,
        )
        .await?;
        Ok((source, spans, samples, truncated))
    })
}

/// The query the aggregates are cut by: the requested range, or the data's own.
fn query_for(request: &ExportRequest, rows: &LagRows, spans: &[Span]) -> LagQuery {
    let times = rows
        .reads
        .iter()
        .map(|row| row.time_unix_nano)
        .chain(rows.apply.iter().map(|row| row.time_unix_nano))
        .chain(rows.rejections.iter().map(|row| row.time_unix_nano))
        .chain(spans.iter().map(|span| span.start_unix_nano));
    let (first, last) = times.fold((i64::MAX, i64::MIN), |(first, last), time| (first.min(time), last.max(time)));
    let from = request.from.unwrap_or(if first == i64::MAX { 0 } else { first });
    let to = request.to.unwrap_or(if last == i64::MIN { from + 1 } else { last.saturating_add(1) });
    LagQuery {
        cluster: request.cluster.clone(),
        namespace: request.namespace.clone(),
        from_unix_nano: from,
        to_unix_nano: to.max(from + 1),
        step_seconds: request.step_seconds,
    }
}

/// Prints what was written, one file per line.
pub fn print_report(report: &ExportReport, dir: &Path) {
    eprintln!("read {} spans and {} samples from {}", report.spans, report.samples, report.source);
    if report.truncated {
        eprintln!("warning: the read limit was reached; raise --max-spans or narrow --from/--to");
    }
    for file in &report.files {
        println!("{}\t{} rows", file.path.display(), file.rows);
    }
    eprintln!("wrote {} files to {}", report.files.len(), dir.display());
}
