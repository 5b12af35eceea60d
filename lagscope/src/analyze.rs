//! `lagscope analyze`: the detectors over captures (OTLP JSON, lscap) or a store's contents, offline.

use std::collections::BTreeMap;
use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{Context, bail};
use flate2::read::MultiGzDecoder;
use lagscope_analyzer::AnalyzerConfig;
use lagscope_analyzer::stream::codec::{Batch, Decoder, Item, SampleRec};
use lagscope_analyzer::stream::{Engine, EngineStats, SpanRec};
use lagscope_collector::capture::{Capture, Decoded, stream_requests, stream_requests_decoding_on};
use lagscope_model::{Anomaly, AnomalyKind, LogRecord, Sample, Span, UnixNanos};
use lagscope_store::paging::{logs_ahead, samples_ahead, spans_ahead};
use lagscope_store::{Store, TimeRange};

use crate::progress::{Position, Progress, Reporter};

/// How `analyze` prints what it found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// `{"anomalies": [...]}`, ordered by start time.
    Json,
    /// One anomaly per line. From lscap captures, written as found (memory stays bounded by
    /// the engine's windows, not by how many anomalies there are); otherwise ordered.
    Jsonl,
    Table,
}

/// What `analyze` read and found.
#[derive(Debug)]
pub struct Report {
    /// OTLP export requests read, from `otlp_files` capture files.
    pub requests: usize,
    pub otlp_files: usize,
    /// lscap files read (they hold records, not export requests).
    pub lscap_files: usize,
    pub spans: usize,
    pub samples: usize,
    pub log_records: usize,
    /// The anomalies, unless they were written as found.
    pub anomalies: Vec<Anomaly>,
    pub anomaly_count: usize,
    /// Wall time of each stage: reading and decoding, the engine, writing the anomalies.
    pub timings: Timings,
    /// What the streaming engine did.
    pub stream: Option<EngineStats>,
    /// The store read, when the analysis read one (`--data-dir`, `--database-url`) instead of
    /// captures.
    pub store: Option<String>,
}

/// How long each stage of an offline analysis took, in seconds.
#[derive(Debug, Default, Clone, Copy)]
pub struct Timings {
    pub read: f64,
    pub detectors: f64,
    /// Handing anomalies to the caller's `emit` as they are found (serializing and writing
    /// them, for `analyze --format jsonl`).
    pub writing: f64,
    /// The threads that decoded OTLP (JSON or protobuf), when some was read: then `read` is the
    /// time the engine waited for them, not the time they took.
    pub otlp_decode_threads: Option<usize>,
    /// Whether a store's pages were read and decoded on other threads, ahead of the engine:
    /// then `read` is the time the engine waited for them.
    pub read_ahead: bool,
}

impl Report {
    /// What was read, for the summary line: the store, or the OTLP files' export requests
    /// and the lscap files (which hold records, not requests).
    pub fn what_was_read(&self) -> String {
        if let Some(store) = &self.store {
            return format!("read {store}");
        }
        let requests = format!("read {} export requests from {} file(s)", self.requests, self.otlp_files);
        match (self.otlp_files, self.lscap_files) {
            (_, 0) => requests,
            (0, lscap) => format!("read {lscap} lscap file(s)"),
            (_, lscap) => format!("{requests} and {lscap} lscap file(s)"),
        }
    }
}

/// Reads every capture, runs every detector, returns what was read and found.
pub fn analyze_paths(paths: &[impl AsRef<Path>], config: &AnalyzerConfig) -> anyhow::Result<Report> {
    analyze_paths_kinds(paths, config, &[])
}

/// [`analyze_paths`] with only the detectors of `kinds` (empty: all).
pub fn analyze_paths_kinds(
    paths: &[impl AsRef<Path>],
    config: &AnalyzerConfig,
    kinds: &[AnomalyKind],
) -> anyhow::Result<Report> {
    analyze_paths_emitting(paths, config, kinds, None, default_decode_threads(), Progress::Off)
}

/// How many threads decode OTLP JSON by default: the machine's cores, up to 8 (decoding is
/// most of the work of reading OTLP JSON; the engine runs beside them on the caller's).
pub fn default_decode_threads() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get).min(8)
}

/// Where anomalies go as they are found.
pub type Emit<'a> = &'a mut dyn FnMut(&Anomaly) -> anyhow::Result<()>;

/// [`analyze_paths_kinds`], handing the anomalies to `emit` as they are found when it is
/// given (their order is then the order found; otherwise they are returned in order).
///
/// Every capture goes through the streaming engine, one export request (OTLP JSON lines) or
/// one block (lscap) at a time: memory holds what is in flight, not the capture. OTLP JSON is
/// decoded on `decode_threads` threads (1: on the caller's alone), handed to the engine in
/// the file's order. `progress` says how it reports its progress on stderr.
pub fn analyze_paths_emitting(
    paths: &[impl AsRef<Path>],
    config: &AnalyzerConfig,
    kinds: &[AnomalyKind],
    emit: Option<Emit<'_>>,
    decode_threads: usize,
    progress: Progress,
) -> anyhow::Result<Report> {
    if paths.is_empty() {
        bail!("no capture given: {CAPTURE_KINDS}; or lscap files");
    }
    let mut run = Run::new(config, kinds, emit, decode_threads, Reporter::new("analyze", progress, paths.len()));
    for path in paths {
        let path = path.as_ref();
        run.progress.file(path);
        if crate::lscap::is_lscap(path) {
            run.lscap_files += 1;
            run.lscap(path)?;
        } else {
            run.otlp_files += 1;
            run.otlp_json(path)?;
        }
    }
    run.finish(None)
}

/// The store `analyze --data-dir` or `--database-url` reads, and what of it.
#[derive(Debug, Clone)]
pub struct StoreSource {
    /// PostgreSQL; otherwise the SQLite store in `data_dir`.
    pub database_url: Option<String>,
    pub data_dir: PathBuf,
    /// The spans that start, and the samples and log records timed, in this range.
    pub range: TimeRange,
}

impl StoreSource {
    /// Opens the store, and how to name it in messages (a `--data-dir` that holds none is
    /// refused, not made a new store).
    pub(crate) async fn open(&self) -> anyhow::Result<(String, Box<dyn lagscope_store::Store>)> {
        crate::stored::open(
            self.database_url.as_deref(),
            &self.data_dir,
            Some("--data-dir takes the directory `lagscope serve --data-dir` keeps its store in"),
        )
        .await
    }
}

/// [`analyze_paths_emitting`] over what a store holds: its spans, metric samples and log
/// records in `source.range`, read a page at a time and handed to the same engine in the order
/// they ended (as exporters deliver them), so memory stays bounded by what is in flight
/// whatever the store holds. What a store holds is what a capture of the same telemetry
/// holds, and the two analyses find the same anomalies.
pub fn analyze_store_emitting(
    source: &StoreSource,
    config: &AnalyzerConfig,
    kinds: &[AnomalyKind],
    emit: Option<Emit<'_>>,
    progress: Progress,
) -> anyhow::Result<Report> {
    anyhow::ensure!(source.range.from < source.range.to, "--from must be before --to");
    let mut run = Run::new(config, kinds, emit, 1, Reporter::new("analyze", progress, 0));
    // The engine runs on this thread; the runtime's threads read and decode the store's pages.
    let name = crate::stored::runtime_on_threads(READ_AHEAD_THREADS)?.block_on(async {
        let (name, store) = source.open().await?;
        run.store(Arc::from(store), source.range).await.with_context(|| format!("cannot analyze {name}"))?;
        anyhow::Ok(name)
    })?;
    run.finish(Some(name))
}

/// The threads that read and decode a store's pages ahead of the engine, and the tasks that
/// read its spans.
const READ_AHEAD_THREADS: usize = 2;

/// One offline analysis in progress.
struct Run<'c, 'e> {
    engine: Engine<'c>,
    emit: Option<Emit<'e>>,
    decode_threads: usize,
    /// Whether an OTLP capture (JSON or protobuf) was read.
    otlp_read: bool,
    /// Whether a store's pages were read ahead.
    read_ahead: bool,
    anomaly_count: usize,
    requests: usize,
    otlp_files: usize,
    lscap_files: usize,
    log_records: usize,
    /// Seconds spent reading and decoding, in the engine, and writing anomalies as found.
    read: f64,
    detect: f64,
    writing: f64,
    progress: Reporter,
}

impl<'c, 'e> Run<'c, 'e> {
    fn new(
        config: &'c AnalyzerConfig,
        kinds: &[AnomalyKind],
        emit: Option<Emit<'e>>,
        decode_threads: usize,
        progress: Reporter,
    ) -> Self {
        Run {
            engine: Engine::new(config, |kind| kinds.is_empty() || kinds.contains(&kind)),
            emit,
            decode_threads: decode_threads.max(1),
            otlp_read: false,
            read_ahead: false,
            anomaly_count: 0,
            requests: 0,
            otlp_files: 0,
            lscap_files: 0,
            log_records: 0,
            read: 0.0,
            detect: 0.0,
            writing: 0.0,
            progress,
        }
    }

    /// Ends the analysis: the engine's last anomalies, and the report (`store`: the store
    /// read, when it was one).
    fn finish(self, store: Option<String>) -> anyhow::Result<Report> {
        let finishing = Instant::now();
        let Run {
            engine,
            mut emit,
            decode_threads,
            otlp_read,
            read_ahead,
            mut anomaly_count,
            requests,
            otlp_files,
            lscap_files,
            log_records,
            read,
            mut detect,
            mut writing,
            progress,
        } = self;
        // Its line erased: the engine's last anomalies and the summary come next.
        drop(progress);
        let (mut anomalies, stats) = engine.finish();
        detect += finishing.elapsed().as_secs_f64();
        anomaly_count += anomalies.len();
        if let Some(emit) = emit.as_mut() {
            let emitting = Instant::now();
            for anomaly in anomalies.drain(..) {
                emit(&anomaly)?;
            }
            writing += emitting.elapsed().as_secs_f64();
        }
        Ok(Report {
            requests,
            otlp_files,
            lscap_files,
            spans: stats.spans as usize,
            samples: stats.samples as usize,
            log_records,
            anomalies,
            anomaly_count,
            timings: Timings {
                read,
                detectors: detect,
                writing,
                otlp_decode_threads: otlp_read.then_some(decode_threads),
                read_ahead,
            },
            stream: Some(stats),
            store,
        })
    }

    /// Writes what the engine has settled, when anomalies are written as found.
    fn emit_found(&mut self) -> anyhow::Result<()> {
        if let Some(emit) = self.emit.as_mut()
            && self.engine.has_found()
        {
            let emitting = Instant::now();
            let count = &mut self.anomaly_count;
            self.engine.drain_found(|anomaly| emit(&anomaly).map(|()| *count += 1))?;
            self.writing += emitting.elapsed().as_secs_f64();
        }
        Ok(())
    }

    /// An lscap capture, block by block, a few items at a time (decoded into a small buffer
    /// that stays in cache, then handed to the engine).
    fn lscap(&mut self, path: &Path) -> anyhow::Result<()> {
        /// Items decoded at a time: a few tens of kilobytes.
        const CHUNK: usize = 64;
        let mut decoder = Decoder::new();
        // This file's series numbers -> the engine's.
        let mut series: Vec<u32> = Vec::new();
        let mut batch = Batch::default();
        // Reading the file counts with decoding: from the end of the previous block's work.
        let mut started = Instant::now();
        crate::lscap::read_lscap_blocks(path, |block, payload| {
            let mut at = 0;
            while at < payload.len() {
                decoder
                    .decode_some(payload, &mut at, &mut self.engine.interner, &mut batch, CHUNK)
                    .map_err(|error| anyhow::anyhow!("{error}"))?;
                let decoded = Instant::now();
                self.read += (decoded - started).as_secs_f64();
                self.engine.warm_spans(batch.items().iter().filter_map(|item| match item {
                    Item::Span(span) => Some(span),
                    _ => None,
                }));
                for item in batch.items() {
                    match item {
                        Item::Span(span) => self.engine.push_span(span),
                        Item::LogEvent(event) => self.engine.push_log_event(event),
                        Item::Series(definition) => series.push(self.engine.define_series(definition)),
                        Item::Sample(sample) => {
                            let Some(id) = series.get(sample.series as usize) else {
                                bail!("sample of series {} before its definition", sample.series);
                            };
                            self.engine.push_sample(SampleRec { series: *id, ..*sample });
                        }
                    }
                }
                started = Instant::now();
                self.detect += (started - decoded).as_secs_f64();
                // Written while their text is in cache (see `Engine::drain_found`).
                if self.emit.is_some() && self.engine.has_found() {
                    self.emit_found()?;
                    started = Instant::now();
                }
            }
            let emitted = self.emit_found();
            started = Instant::now();
            if self.progress.due(started) {
                // Through this block: its offset, its length's four bytes and its payload.
                let through = block.offset + 4 + payload.len() as u64;
                self.progress.report(started, through, self.engine.stats().spans, Some(self.anomaly_count));
            }
            emitted
        })
    }

    /// What a store holds in `range`: its spans (a store reads them in start order, held
    /// back until no span still to come can have ended before them), metric samples and log
    /// records, merged into one stream in the order they ended, a page of each at a time.
    async fn store(&mut self, store: Arc<dyn Store>, range: TimeRange) -> anyhow::Result<()> {
        // For progress: how far through the data the reading is.
        let last = store.latest_time().await?.unwrap_or(i64::MIN).min(range.to);
        // Each table's pages are read and decoded on the runtime's threads, ahead of the
        // engine, which runs on this one.
        let mut spans = spans_ahead(store.clone(), None, None, range, last, READ_AHEAD_THREADS)
            .await
            .context("cannot read the spans")?;
        let mut samples = samples_ahead(store.clone(), range);
        let mut logs = logs_ahead(store.clone(), range);
        self.read_ahead = true;
        // Spans read, waiting for their turn by (end, order read).
        let mut ending: BTreeMap<(UnixNanos, u64), Span> = BTreeMap::new();
        let mut read_spans = 0u64;
        let mut first = None;
        let started = Instant::now();
        let (read_before, writing_before) = (self.read, self.writing);
        loop {
            let reading = Instant::now();
            spans.refill().await.context("cannot read the spans")?;
            samples.refill().await.context("cannot read the metric samples")?;
            logs.refill().await.context("cannot read the log records")?;
            self.read += reading.elapsed().as_secs_f64();
            // Every span still to come starts at or after the next one in start order: a span
            // waiting that ended before that is the next to end.
            if let Some(next) = spans.rows.front()
                && ending.first_key_value().is_none_or(|((end, _), _)| *end > next.start_unix_nano)
            {
                let span = spans.rows.pop_front().expect("a span is next");
                first.get_or_insert(span.start_unix_nano);
                ending.insert((span.end_unix_nano.max(span.start_unix_nano), read_spans), span);
                read_spans += 1;
                continue;
            }
            let span_at = ending.first_key_value().map(|((end, _), _)| *end);
            let sample_at = samples.rows.front().map(|sample: &Sample| sample.time_unix_nano);
            let log_at = logs.rows.front().map(|log: &LogRecord| log.time_unix_nano);
            let at = [span_at, sample_at, log_at].into_iter().flatten().min();
            let Some(at) = at else { break };
            if span_at == Some(at) {
                let (_, span) = ending.pop_first().expect("a span is waiting");
                let record = SpanRec::from_span(&span, &mut self.engine.interner);
                self.engine.push_span(&record);
            } else if sample_at == Some(at) {
                let sample = samples.rows.pop_front().expect("a sample is next");
                first.get_or_insert(sample.time_unix_nano);
                self.engine.push_model_sample(&sample);
            } else {
                let log = logs.rows.pop_front().expect("a log record is next");
                first.get_or_insert(log.time_unix_nano);
                self.log_records += 1;
                if let Some(event) = lagscope_analyzer::log_events::classify(&log) {
                    self.engine.push_log_event(&event);
                }
            }
            self.emit_found()?;
            let now = Instant::now();
            if self.progress.due(now) {
                let position = Position::Stored { at, first: first.unwrap_or(at).max(range.from), last: last.max(at) };
                self.progress.report_at(now, position, self.engine.stats().spans, Some(self.anomaly_count));
            }
        }
        let elapsed = started.elapsed().as_secs_f64();
        self.detect += elapsed - (self.read - read_before) - (self.writing - writing_before);
        Ok(())
    }

    /// An OTLP capture (JSON or length-prefixed, compressed or not), one export request at a time.
    fn otlp_json(&mut self, path: &Path) -> anyhow::Result<()> {
        let (reader, bytes_read) = open_capture_counted(path)?;
        self.otlp_read = true;
        let mut started = Instant::now();
        let mut failure = None;
        let requests =
            stream_requests_decoding_on(self.decode_threads, &path.display().to_string(), reader, |decoded| {
                let decoded_at = Instant::now();
                self.read += (decoded_at - started).as_secs_f64();
                if self.progress.due(decoded_at) {
                    let (bytes, spans) = (bytes_read.load(Ordering::Relaxed), self.engine.stats().spans);
                    self.progress.report(decoded_at, bytes, spans, Some(self.anomaly_count));
                }
                push_decoded(&mut self.engine, &decoded);
                self.log_records += decoded.logs.len();
                self.detect += decoded_at.elapsed().as_secs_f64();
                let emitted = self.emit_found().map_err(|error| {
                    let message = format!("cannot write the anomalies: {error}");
                    failure = Some(error);
                    message
                });
                started = Instant::now();
                emitted
            });
        if let Some(error) = failure {
            return Err(error);
        }
        self.requests += requests?;
        Ok(())
    }
}

/// The capture files `paths` name: each as given, but a directory's files (not its hidden ones,
/// nor those of its subdirectories) in the order of their names, as a Collector's file exporter
/// leaves them when it rotates (`otlp-2026-12-07T10-00-00.000.json` before `otlp.json`).
pub fn capture_files(paths: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::with_capacity(paths.len());
    for path in paths {
        if path == Path::new("-") || !path.is_dir() {
            files.push(path.clone());
            continue;
        }
        let mut found = Vec::new();
        for entry in std::fs::read_dir(path).with_context(|| format!("cannot read the directory {}", path.display()))? {
            let entry = entry.with_context(|| format!("cannot read the directory {}", path.display()))?;
            let hidden = entry.file_name().to_string_lossy().starts_with('.');
            if !hidden && entry.path().is_file() {
                found.push(entry.path());
            }
        }
        if found.is_empty() {
            bail!("{}: a directory without capture files", path.display());
        }
        found.sort();
        files.extend(found);
    }
    Ok(files)
}

/// A capture file for reading request by request (`-`: the standard input): gunzipped when it
/// is gzip, inflated when it is zstd (the Collector file exporter's `compression: zstd` with
/// its native compression), both known by their first bytes, not by the file's name.
pub fn open_capture(path: &Path) -> anyhow::Result<Box<dyn std::io::BufRead + Send>> {
    Ok(open_capture_counted(path)?.0)
}

/// [`open_capture`], with a count of the bytes read from the file so far (compressed bytes,
/// for a compressed file): how far through it the reading is, from any thread.
pub(crate) fn open_capture_counted(path: &Path) -> anyhow::Result<(Box<dyn std::io::BufRead + Send>, Arc<AtomicU64>)> {
    const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
    let file: Box<dyn Read + Send> = if path == Path::new("-") {
        Box::new(std::io::stdin())
    } else {
        Box::new(std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?)
    };
    let bytes_read = Arc::new(AtomicU64::new(0));
    let mut file = std::io::BufReader::with_capacity(1 << 20, Counted { inner: file, bytes_read: bytes_read.clone() });
    let head = file.fill_buf().with_context(|| format!("cannot read {}", path.display()))?;
    let reader: Box<dyn std::io::BufRead + Send> = if head.starts_with(&GZIP_MAGIC) {
        Box::new(std::io::BufReader::with_capacity(1 << 20, MultiGzDecoder::new(file)))
    } else if head.starts_with(&lagscope_collector::capture::ZSTD_MAGIC) {
        let inflated = zstd::stream::read::Decoder::with_buffer(file)
            .with_context(|| format!("cannot read {} as zstd", path.display()))?;
        Box::new(std::io::BufReader::with_capacity(1 << 20, inflated))
    } else {
        Box::new(file)
    };
    Ok((reader, bytes_read))
}

/// A reader counting the bytes read through it.
struct Counted<R> {
    inner: R,
    bytes_read: Arc<AtomicU64>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        let read = self.inner.read(buffer)?;
        self.bytes_read.fetch_add(read as u64, Ordering::Relaxed);
        Ok(read)
    }
}

/// Hands one decoded export request's spans and samples to the engine, in their order.
pub fn push_decoded(engine: &mut Engine<'_>, decoded: &Decoded) {
    for span in &decoded.spans {
        let record = SpanRec::from_span(span, &mut engine.interner);
        engine.push_span(&record);
    }
    for sample in &decoded.samples {
        engine.push_model_sample(sample);
    }
    for event in decoded.logs.iter().filter_map(lagscope_analyzer::log_events::classify) {
        engine.push_log_event(&event);
    }
}

/// Reads capture files whole (as [`open_capture`] and `stream_requests` read them).
pub fn read_captures(paths: &[impl AsRef<Path>]) -> anyhow::Result<Capture> {
    if paths.is_empty() {
        bail!("no capture given: {CAPTURE_KINDS}");
    }
    let mut capture = Capture::default();
    for path in paths {
        let path = path.as_ref();
        let reader = open_capture(path)?;
        capture.requests += stream_requests(&path.display().to_string(), reader, |decoded| {
            capture.spans.extend(decoded.spans);
            capture.samples.extend(decoded.samples);
            capture.logs.extend(decoded.logs);
            Ok(())
        })?;
    }
    Ok(capture)
}

/// What `analyze` and `read_captures` take, for the message when given none.
const CAPTURE_KINDS: &str = "pass OTLP JSON files (one request, or JSON lines of them) or the OpenTelemetry Collector \
                             file exporter's length-prefixed captures (`format: proto`, or `compression: zstd`), \
                             compressed (gzip, zstd) or not";

/// Writes the anomalies as `{"anomalies":[...]}`.
pub fn write_json(out: &mut impl Write, anomalies: &[Anomaly]) -> anyhow::Result<()> {
    #[derive(serde::Serialize)]
    struct Output<'a> {
        anomalies: &'a [Anomaly],
    }
    // Through a Value, so that each anomaly's evidence (kept as compact JSON text) is indented
    // with the rest; `--format jsonl` is the fast path that writes it as it is.
    let document = serde_json::to_value(Output { anomalies })?;
    serde_json::to_writer_pretty(&mut *out, &document)?;
    writeln!(out)?;
    out.flush()?;
    Ok(())
}

/// Writes the anomalies as an aligned table, one per line.
pub fn write_table(out: &mut impl Write, anomalies: &[Anomaly]) -> anyhow::Result<()> {
    let header = ["START", "KIND", "SEVERITY", "CLUSTER", "NAMESPACE", "CLIENT", "NODE", "SUMMARY"];
    let rows: Vec<[String; 8]> = anomalies
        .iter()
        .map(|anomaly| {
            [
                rfc3339(anomaly.start_unix_nano),
                anomaly.kind.as_str().to_string(),
                anomaly.severity.as_str().to_string(),
                anomaly.cluster.clone().unwrap_or_else(|| "-".to_string()),
                anomaly.namespace.clone().unwrap_or_else(|| "-".to_string()),
                anomaly.client_id.clone().unwrap_or_else(|| "-".to_string()),
                anomaly.node_id.clone().unwrap_or_else(|| "-".to_string()),
                anomaly.summary.clone(),
            ]
        })
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|title| title.len()).collect();
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row.iter()).take(7) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        cells
            .iter()
            .enumerate()
            .map(
                |(index, cell)| {
                    if index < 7 { format!("{cell:<width$}", width = widths[index]) } else { cell.to_string() }
                },
            )
            .collect::<Vec<_>>()
            .join("  ")
    };
    writeln!(out, "{}", line(header.to_vec()))?;
    for row in &rows {
        writeln!(out, "{}", line(row.iter().map(String::as_str).collect()))?;
    }
    Ok(())
}

fn rfc3339(unix_nano: i64) -> String {
    jiff::Timestamp::from_nanosecond(i128::from(unix_nano))
        .map_or_else(|_| unix_nano.to_string(), |time| time.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_names_lscap_files_apart_from_export_requests() {
        let report = |requests, otlp_files, lscap_files, store: Option<&str>| Report {
            requests,
            otlp_files,
            lscap_files,
            spans: 0,
            samples: 0,
            log_records: 0,
            anomalies: Vec::new(),
            anomaly_count: 0,
            timings: Timings::default(),
            stream: None,
            store: store.map(str::to_string),
        };
        assert_eq!(report(12, 2, 0, None).what_was_read(), "read 12 export requests from 2 file(s)");
        assert_eq!(report(0, 0, 1, None).what_was_read(), "read 1 lscap file(s)");
        assert_eq!(report(5, 1, 2, None).what_was_read(), "read 5 export requests from 1 file(s) and 2 lscap file(s)");
        assert_eq!(report(0, 0, 0, Some("the store in data")).what_was_read(), "read the store in data");
    }

    #[test]
    fn a_directory_stands_for_its_files_in_the_order_of_their_names() {
        let directory = tempfile::tempdir().expect("temp dir");
        let root = directory.path();
        for name in ["otlp.json", "otlp-2026-12-07T10-00-00.000.json", "otlp-2026-12-07T09-00-00.000.json", ".swap"] {
            std::fs::write(root.join(name), b"{}").expect("write");
        }
        std::fs::create_dir(root.join("older")).expect("mkdir");
        std::fs::write(root.join("older/otlp.json"), b"{}").expect("write");
        let given = [PathBuf::from("-"), root.to_path_buf(), PathBuf::from("missing.jsonl")];
        let names: Vec<String> = capture_files(&given)
            .expect("files")
            .iter()
            .map(|path| path.strip_prefix(root).unwrap_or(path).display().to_string())
            .collect();
        assert_eq!(
            names,
            [
                "-",
                "otlp-2026-12-07T09-00-00.000.json",
                "otlp-2026-12-07T10-00-00.000.json",
                "otlp.json",
                "missing.jsonl"
            ]
        );
        std::fs::remove_file(root.join("older/otlp.json")).expect("remove");
        let error = capture_files(&[root.join("older")]).expect_err("an empty directory");
        assert!(error.to_string().contains("a directory without capture files"), "{error}");
    }
}
