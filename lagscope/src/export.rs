//! `lagscope export --parquet DIR`: lag analytics (raw rows and per-step aggregates) and the
//! spans they came from, as Parquet files for notebooks, DuckDB, Spark or polars.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use anyhow::Context;
use lagscope_analytics::{Exported, ReadsFile, SpansFile, export_parquet_with_reads};
use lagscope_analyzer::{FirstAttempts, WindowedLag, for_timelines};
use lagscope_collector::capture::stream_requests_decoding_on;
use lagscope_model::{LagQuery, Sample, SeriesKey, SeriesMeta, Span};
use lagscope_store::paging::spans_ahead;
use lagscope_store::{Store, TimeRange};

use crate::analyze::default_decode_threads;
use crate::progress::{Position, Progress, Reporter};

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
    /// How a capture's export reports its progress on stderr.
    pub progress: Progress,
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
    if request.captures.is_empty() {
        crate::stored::runtime_on_threads(2)?.block_on(export_store(request, range))
    } else {
        export_captures(request, range)
    }
}

/// [`export`] of a store's range: its spans read in start order a page at a time (at most
/// `max_spans`, the oldest), joined as they come and written to `spans.parquet` once no later
/// step reaches them; its metric samples read whole.
async fn export_store(request: &ExportRequest, range: TimeRange) -> anyhow::Result<ExportReport> {
    let (source, store) = crate::stored::open(
        request.database_url.as_deref(),
        &request.data_dir,
        Some("pass --data-dir or --database-url, or capture files"),
    )
    .await?;
    let store: Arc<dyn Store> = Arc::from(store);
    let (cluster, namespace) = (request.cluster.clone(), request.namespace.clone());
    let most_spans = request.max_spans as usize;
    // The spans' pages are read ahead (on the runtime's threads) while the samples are read.
    let last = store.latest_time().await?.unwrap_or(i64::MIN).min(range.to);
    let mut ahead = spans_ahead(store.clone(), cluster.clone(), namespace.clone(), range, last, 2).await?;
    // (A store's samples share their series' key already: one per series read.)
    let samples = store.samples_in_range(cluster.as_deref(), namespace.as_deref(), range, request.max_spans).await?;
    let (n_samples, samples_cut) = (samples.len(), samples.len() >= most_spans);
    let work = working_directory(&request.dir)?;
    let horizon = lagscope_analyzer::StreamConfig::default().horizon();
    let mut spans_file = SpansFile::create(work.path().join("spans.parquet"))?;
    let mut joiner = Joiner::new(work.path(), samples, FirstAttempts::default(), horizon, Times::default())?;
    let mut reporter = Reporter::new("export", request.progress, 0);
    // The spans read that a step still to join may reach, in start order.
    let mut held: VecDeque<Span> = VecDeque::new();
    let (mut next_step, mut read, mut first) = (None, 0usize, None);
    loop {
        let arrived = if read < most_spans {
            ahead.refill().await.context("cannot read the spans")?;
            ahead.rows.pop_front()
        } else {
            None
        };
        // Every step whose reach ends at or before this span's start (all, at the end) has
        // every span it reaches.
        while let Some(step) = next_step {
            let (_, most) = joiner.reach(step);
            if arrived.as_ref().is_some_and(|span| span.start_unix_nano < most) {
                break;
            }
            joiner.join(step, &held.iter().collect::<Vec<_>>())?;
            let (_, to) = joiner.window(step);
            let next = held.iter().chain(&arrived).map(|span| span.start_unix_nano).find(|start| *start >= to);
            next_step = next.map(|start| joiner.step_of(start));
            // What no later step reaches is done with.
            let keep_from = next_step.map_or(i64::MAX, |step| joiner.reach(step).0);
            while held.front().is_some_and(|span| span.start_unix_nano < keep_from) {
                spans_file.push(held.pop_front().expect("a span held"))?;
            }
        }
        let Some(span) = arrived else { break };
        joiner.note(&span);
        next_step.get_or_insert(joiner.step_of(span.start_unix_nano));
        let first = *first.get_or_insert(span.start_unix_nano);
        let now = Instant::now();
        if reporter.due(now) {
            let position = Position::Stored {
                at: span.start_unix_nano,
                first: first.max(range.from),
                last: last.max(span.start_unix_nano),
            };
            reporter.report_at(now, position, read as u64, None);
        }
        held.push_back(span);
        read += 1;
    }
    for span in held {
        spans_file.push(span)?;
    }
    let spans_written = spans_file.finish()?;
    let files = joiner.finish(request, spans_written)?;
    drop(reporter);
    Ok(ExportReport { source, spans: read, samples: n_samples, truncated: read >= most_spans || samples_cut, files })
}

/// A working directory in `dir` (created if missing), removed when dropped.
fn working_directory(dir: &Path) -> anyhow::Result<tempfile::TempDir> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    tempfile::Builder::new()
        .prefix(".lagscope-export-")
        .tempdir_in(dir)
        .with_context(|| format!("cannot create a working directory in {}", dir.display()))
}

/// [`export`] of capture files.
///
/// The capture is not held: its spans are written to `spans.parquet` as they are read, and
/// set aside on disk (in a directory of `request.dir` that goes at the end) by the window of
/// time they start in. The read rows are then made a window at a time ([`WindowedLag`]), from
/// the spans within its reach, and written as they are completed. Memory holds the metric
/// samples, the spans of a few windows, and the aggregates' columns of the read rows.
/// Every file is written in that directory first and moved into `request.dir` at the end:
/// an export stopped by a bad line leaves no file half written.
fn export_captures(request: &ExportRequest, range: TimeRange) -> anyhow::Result<ExportReport> {
    if let Some(lscap) = request.captures.iter().find(|path| crate::lscap::is_lscap(path)) {
        anyhow::bail!(
            "{}: an lscap capture, which keeps only what the detectors read (not what the Parquet \
             files hold); export --parquet reads OTLP captures (JSON, or the Collector's length-prefixed \
             requests, compressed or not) or the store: pass the OTLP capture it was made from",
            lscap.display()
        );
    }
    let work = working_directory(&request.dir)?;
    let horizon = lagscope_analyzer::StreamConfig::default().horizon();
    let mut reporter = Reporter::new("export", request.progress, request.captures.len());

    // The store's semantics: a namespace filter takes spans of that namespace, and samples
    // of that namespace or of none.
    let cluster_ok = |cluster: Option<&str>| request.cluster.as_deref().is_none_or(|wanted| cluster == Some(wanted));
    let namespace_is =
        |namespace: Option<&str>| request.namespace.as_deref().is_none_or(|wanted| namespace == Some(wanted));
    let in_range = |time: i64| time >= range.from && time < range.to;
    let mut spans_file = SpansFile::create(work.path().join("spans.parquet"))?;
    let mut spill = Spill::new(work.path().join("windows"), horizon)?;
    let mut first_attempts = FirstAttempts::default();
    let (mut samples, mut series): (Vec<Sample>, SharedSeries) = Default::default();
    let mut starts = Times::default();
    let mut read_spans = 0u64;
    for path in &request.captures {
        reporter.file(path);
        let (reader, bytes_read) = crate::analyze::open_capture_counted(path)?;
        let mut failure = None;
        let name = path.display().to_string();
        let read = stream_requests_decoding_on(default_decode_threads(), &name, reader, |decoded| {
            let taken = (|| -> anyhow::Result<()> {
                for span in decoded.spans {
                    if !(cluster_ok(span.resource.cluster.as_deref())
                        && namespace_is(span.call.namespace.as_deref())
                        && in_range(span.start_unix_nano))
                    {
                        continue;
                    }
                    first_attempts.note(&span);
                    starts.add(span.start_unix_nano);
                    spill.push(read_spans, &span)?;
                    read_spans += 1;
                    spans_file.push(span)?;
                }
                let kept = decoded.samples.into_iter().filter(|sample| {
                    let namespace = sample.series.label(lagscope_model::conventions::NAMESPACE);
                    cluster_ok(sample.series.label(lagscope_model::conventions::CLUSTER))
                        && (namespace.is_none() || namespace_is(namespace))
                        && in_range(sample.time_unix_nano)
                });
                samples.extend(kept.map(|sample| series.share(sample)));
                Ok(())
            })();
            let now = Instant::now();
            if reporter.due(now) {
                reporter.report(now, bytes_read.load(Ordering::Relaxed), read_spans, None);
            }
            taken.map_err(|error| {
                let message = format!("{error:#}");
                failure = Some(error);
                message
            })
        });
        if let Some(error) = failure {
            return Err(error);
        }
        read.map_err(anyhow::Error::new)?;
    }
    drop(series);
    let spans_written = spans_file.finish()?;
    spill.finish()?;
    let n_samples = samples.len();

    // The read rows, a step of two spill windows at a time.
    let mut joiner = Joiner::new(work.path(), samples, first_attempts, horizon, starts)?;
    let steps: BTreeSet<i64> = spill.windows().map(|window| window.div_euclid(SPILLED_PER_STEP)).collect();
    let (first_step, last_step) = (steps.first().copied(), steps.last().copied());
    let mut held: BTreeMap<i64, Vec<(u64, Span)>> = BTreeMap::new();
    for &step in &steps {
        let (least, most) = joiner.reach(step);
        let (first_window, last_window) = (least.div_euclid(horizon), (most - 1).div_euclid(horizon));
        held.retain(|window, _| *window >= first_window);
        for window in first_window..=last_window {
            if let std::collections::btree_map::Entry::Vacant(entry) = held.entry(window) {
                entry.insert(spill.read(window)?);
            }
        }
        let mut in_reach: Vec<&(u64, Span)> = held.values().flatten().collect();
        in_reach.sort_unstable_by_key(|(order, _)| *order);
        let in_reach: Vec<&Span> = in_reach.into_iter().map(|(_, span)| span).collect();
        joiner.join(step, &in_reach)?;
        let now = Instant::now();
        if reporter.due(now) {
            let (first, last) = (first_step.unwrap_or(step), last_step.unwrap_or(step));
            let position = Position::Joined { at: step - first, of: last - first + 1 };
            reporter.report_at(now, position, read_spans, None);
        }
    }
    drop(held);
    spill.remove()?;
    let files = joiner.finish(request, spans_written)?;
    drop(reporter);
    let names: Vec<String> = request.captures.iter().map(|path| path.display().to_string()).collect();
    Ok(ExportReport {
        source: names.join(", "),
        spans: read_spans as usize,
        samples: n_samples,
        truncated: false,
        files,
    })
}

/// One copy of each series' key and description, shared by its samples: a sample decoded
/// holds copies of its own (the labels and the description, about a kilobyte).
#[derive(Debug, Default)]
struct SharedSeries {
    of: HashMap<Arc<SeriesKey>, Arc<SeriesMeta>>,
}

impl SharedSeries {
    fn share(&mut self, mut sample: Sample) -> Sample {
        match self.of.get_key_value(&*sample.series) {
            Some((key, meta)) => {
                sample.series = key.clone();
                if **meta == *sample.meta {
                    sample.meta = meta.clone();
                }
            }
            None => {
                self.of.insert(sample.series.clone(), sample.meta.clone());
            }
        }
        sample
    }
}

/// The read rows made a step (two horizons) at a time through [`WindowedLag`], written to
/// `reads.parquet` in the working directory as they are completed.
struct Joiner {
    lag: WindowedLag,
    reads: ReadsFile,
    horizon: i64,
    /// Of every span start and row.
    times: Times,
    work: PathBuf,
}

impl Joiner {
    fn new(
        work: &Path,
        samples: Vec<Sample>,
        first_attempts: FirstAttempts,
        horizon: i64,
        starts: Times,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            lag: WindowedLag::new(samples.into(), first_attempts, horizon),
            reads: ReadsFile::create(work.join("reads.parquet"))?,
            horizon,
            times: starts,
            work: work.to_path_buf(),
        })
    }

    fn width(&self) -> i64 {
        SPILLED_PER_STEP * self.horizon
    }

    /// The step a span that starts at `start` is joined in.
    fn step_of(&self, start: i64) -> i64 {
        start.div_euclid(self.width())
    }

    /// The window of time whose calls `step` joins.
    fn window(&self, step: i64) -> (i64, i64) {
        (step.saturating_mul(self.width()), step.saturating_add(1).saturating_mul(self.width()))
    }

    /// The starts of the spans `step` is joined from.
    fn reach(&self, step: i64) -> (i64, i64) {
        let (from, to) = self.window(step);
        lagscope_analyzer::reach(from, to, self.horizon)
    }

    fn note(&mut self, span: &Span) {
        self.lag.note(span);
        self.times.add(span.start_unix_nano);
    }

    /// Joins `step` from `spans` (those within its reach, more are left out, in their order).
    fn join(&mut self, step: i64, spans: &[&Span]) -> anyhow::Result<()> {
        let (from, to) = self.window(step);
        let rows = self.lag.window(spans, from, to);
        rows.iter().for_each(|row| self.times.add(row.time_unix_nano));
        self.reads.write(&rows)?;
        Ok(())
    }

    /// Writes the rest ([`export_parquet_with_reads`]) and moves every file, `spans` too, from
    /// the working directory into place.
    fn finish(mut self, request: &ExportRequest, spans: Exported) -> anyhow::Result<Vec<Exported>> {
        let rows = self.lag.finish();
        let times = &mut self.times;
        let all_times = (rows.reads.iter().map(|row| row.time_unix_nano))
            .chain(rows.apply.iter().map(|row| row.time_unix_nano))
            .chain(rows.rejections.iter().map(|row| row.time_unix_nano));
        all_times.for_each(|time| times.add(time));
        self.reads.write(&rows.reads)?;
        let reads = self.reads.finish()?;
        let query = query_for(request, self.times);
        let mut files = export_parquet_with_reads(&self.work, reads, &rows.apply, &rows.rejections, &query)?;
        files.push(spans);
        // Into place: every file, or none.
        for file in &mut files {
            let name = file.path.file_name().expect("a file's name").to_owned();
            let place = request.dir.join(name);
            std::fs::rename(&file.path, &place)
                .with_context(|| format!("cannot move {} to {}", file.path.display(), place.display()))?;
            file.path = place;
        }
        Ok(files)
    }
}

/// Spill windows (each a horizon long) whose reads are made at a time: the spans of that many
/// and of the three around them (one before, two after) are held.
const SPILLED_PER_STEP: i64 = 2;

/// The first and last of some times.
#[derive(Debug, Clone, Copy)]
struct Times {
    first: i64,
    last: i64,
}

impl Default for Times {
    fn default() -> Self {
        Self { first: i64::MAX, last: i64::MIN }
    }
}

impl Times {
    fn add(&mut self, time: i64) {
        self.first = self.first.min(time);
        self.last = self.last.max(time);
    }
}

/// The spans of a capture set aside on disk by the window of time (a horizon long) they
/// start in, as MessagePack records of their order read and the span (without what the
/// timelines do not read: [`for_timelines`]).
struct Spill {
    dir: PathBuf,
    width: i64,
    windows: BTreeSet<i64>,
    /// The files being written, the most recently written last.
    open: Vec<(i64, std::io::BufWriter<std::fs::File>)>,
}

/// Spill files kept open at once (a capture in time order writes one or two at a time).
const SPILL_FILES_OPEN: usize = 16;

impl Spill {
    fn new(dir: PathBuf, width: i64) -> anyhow::Result<Self> {
        std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        Ok(Self { dir, width, windows: BTreeSet::new(), open: Vec::new() })
    }

    fn path(&self, window: i64) -> PathBuf {
        self.dir.join(format!("{window}.msgpack"))
    }

    fn push(&mut self, order: u64, span: &Span) -> anyhow::Result<()> {
        let window = span.start_unix_nano.div_euclid(self.width);
        let place = match self.open.iter().rposition(|(open, _)| *open == window) {
            Some(place) => place,
            None => {
                if self.open.len() >= SPILL_FILES_OPEN {
                    let (_, mut file) = self.open.remove(0);
                    file.flush().context("cannot write the spans set aside")?;
                }
                let path = self.path(window);
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .with_context(|| format!("cannot write {}", path.display()))?;
                self.windows.insert(window);
                self.open.push((window, std::io::BufWriter::with_capacity(1 << 16, file)));
                self.open.len() - 1
            }
        };
        let file = &mut self.open[place].1;
        rmp_serde::encode::write(file, &(order, for_timelines(span))).context("cannot write the spans set aside")?;
        Ok(())
    }

    fn finish(&mut self) -> anyhow::Result<()> {
        for (_, mut file) in self.open.drain(..) {
            file.flush().context("cannot write the spans set aside")?;
        }
        Ok(())
    }

    fn windows(&self) -> impl Iterator<Item = i64> + '_ {
        self.windows.iter().copied()
    }

    /// The spans set aside of `window`, with their order read.
    fn read(&self, window: i64) -> anyhow::Result<Vec<(u64, Span)>> {
        if !self.windows.contains(&window) {
            return Ok(Vec::new());
        }
        let path = self.path(window);
        let file = std::fs::File::open(&path).with_context(|| format!("cannot read {}", path.display()))?;
        // A record at a time: the window's bytes are not held beside its spans.
        let mut file = std::io::BufReader::with_capacity(1 << 16, file);
        let mut spans = Vec::new();
        let cannot_read = || format!("cannot read back {}", path.display());
        while !std::io::BufRead::fill_buf(&mut file).with_context(cannot_read)?.is_empty() {
            let record = rmp_serde::decode::from_read(&mut file)
                .with_context(|| format!("{} (record {})", cannot_read(), spans.len()))?;
            spans.push(record);
        }
        Ok(spans)
    }

    fn remove(self) -> anyhow::Result<()> {
        std::fs::remove_dir_all(&self.dir).with_context(|| format!("cannot remove {}", self.dir.display()))
    }
}

/// The query the aggregates are cut by: the requested range, or the data's own (`times`: of
/// every row and span start).
fn query_for(request: &ExportRequest, times: Times) -> LagQuery {
    let (first, last) = (times.first, times.last);
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
