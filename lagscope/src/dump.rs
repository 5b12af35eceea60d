//! `lagscope export --dump FILE` and `lagscope import FILE`: everything a store holds (spans,
//! metric samples with their series, log records, anomalies) as gzip-compressed JSON lines,
//! to move data between backends (SQLite to PostgreSQL and back) or machines.
//!
//! The format: the first line is `{"header":{"format":"lagscope-dump","version":1,...}}`;
//! every other line is one record, `{"span":{...}}`, `{"sample":{...}}`, `{"log":{...}}` or
//! `{"anomaly":{"anomaly":{...},"first_seen_unix_nano":...,"last_seen_unix_nano":...}}`, in the
//! model's own serde form, so nothing a sender sent is lost on the way. Records are read
//! from the store a page at a time and imported a batch at a time: memory stays bounded by
//! the page size whatever the store holds. Importing again stores nothing twice (a span or a
//! log record already stored is skipped, a sample replaces itself, an anomaly is upserted by
//! fingerprint), so an import that stopped can simply be run again (it says how far it got).
//! Anomalies replaced by the whole of their incident (`superseded_by`) are not listed, and so
//! not dumped.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use flate2::Compression;
use flate2::read::MultiGzDecoder;
use flate2::write::GzEncoder;
use lagscope_model::{Anomaly, LogRecord, Sample, Span, UnixNanos};
use lagscope_store::paging::{Ahead, logs_ahead, samples_ahead, spans_ahead};
use lagscope_store::{AnomalyFilter, IngestBatch, Store, TimeRange};
use serde::{Deserialize, Serialize};

use crate::output::ChunkWriter;
use crate::stored::{PAGE, open, runtime, runtime_on_threads};

const FORMAT: &str = "lagscope-dump";
const VERSION: u32 = 1;
/// Records committed per import transaction.
const IMPORT_BATCH: usize = 5_000;
/// Anomalies committed per import transaction, at most: with their evidence they are the
/// largest records (tens of kilobytes), and [`PARSED_AHEAD`] batches wait in memory.
const IMPORT_ANOMALIES: usize = 500;
/// Progress is printed every this many records.
const PROGRESS_EVERY: u64 = 100_000;

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Record {
    Header(Header),
    Span(Box<Span>),
    Sample(Box<Sample>),
    Log(Box<LogRecord>),
    Anomaly(Box<DumpedAnomaly>),
}

#[derive(Debug, Serialize, Deserialize)]
struct Header {
    format: String,
    version: u32,
    source: String,
    lagscope_version: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct DumpedAnomaly {
    anomaly: Anomaly,
    first_seen_unix_nano: UnixNanos,
    last_seen_unix_nano: UnixNanos,
}

/// How many records of each kind a dump or an import carried.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub spans: u64,
    pub samples: u64,
    pub logs: u64,
    pub anomalies: u64,
}

impl Counts {
    fn total(&self) -> u64 {
        self.spans + self.samples + self.logs + self.anomalies
    }

    fn add(&mut self, other: Counts) {
        self.spans += other.spans;
        self.samples += other.samples;
        self.logs += other.logs;
        self.anomalies += other.anomalies;
    }
}

impl std::fmt::Display for Counts {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            formatter,
            "{} spans, {} samples, {} log records, {} anomalies",
            self.spans, self.samples, self.logs, self.anomalies
        )
    }
}

/// Writes everything the store holds to `out`.
pub fn export_dump(out: &Path, data_dir: &Path, database_url: Option<&str>) -> anyhow::Result<Counts> {
    runtime_on_threads(2)?.block_on(async {
        let (source, store) = open(database_url, data_dir, Some("pass --data-dir or --database-url")).await?;
        // Replaces `out` only once the dump is whole: a dump cut short by an error is not
        // left for `import` to take for a complete one.
        let (file, replacement) =
            crate::output::Replacement::create(out).with_context(|| format!("cannot create {}", out.display()))?;
        let gzip = GzipEndingOnFlush(GzEncoder::new(std::io::BufWriter::new(file), Compression::fast()));
        let mut writer = DumpWriter {
            lines: Vec::with_capacity(DUMP_CHUNK + (1 << 14)),
            out: ChunkWriter::spawn(gzip, 4).context("cannot start the thread writing the dump")?,
            path: out.to_path_buf(),
            counts: Counts::default(),
            started: Instant::now(),
        };
        writer.write(&Record::Header(Header {
            format: FORMAT.to_string(),
            version: VERSION,
            source: source.clone(),
            lagscope_version: env!("CARGO_PKG_VERSION").to_string(),
        }))?;
        eprintln!("dumping {source} to {}", out.display());
        // Each table read a page at a time by tasks on the runtime's threads, ahead of the
        // writing here (the spans in slices, by two tasks in turn).
        let store: Arc<dyn Store> = Arc::from(store);
        let last = store.latest_time().await?.unwrap_or(i64::MIN);
        let spans = spans_ahead(store.clone(), None, None, TimeRange::ALL, last, 2).await?;
        let samples = samples_ahead(store.clone(), TimeRange::ALL);
        let logs = logs_ahead(store.clone(), TimeRange::ALL);
        write_all(spans, |span| writer.write(&Record::Span(Box::new(span)))).await?;
        write_all(samples, |sample| writer.write(&Record::Sample(Box::new(sample)))).await?;
        write_all(logs, |log| writer.write(&Record::Log(Box::new(log)))).await?;
        // Anomalies page by id, newest first; written oldest first within each page.
        let mut before_id = None;
        loop {
            let filter = AnomalyFilter { before_id, limit: PAGE, ..AnomalyFilter::default() };
            let page = store.anomalies(&filter).await?;
            let full = page.len() == PAGE as usize;
            before_id = page.last().map(|stored| stored.id);
            for stored in page {
                writer.write(&Record::Anomaly(Box::new(DumpedAnomaly {
                    anomaly: stored.anomaly,
                    first_seen_unix_nano: stored.first_seen_unix_nano,
                    last_seen_unix_nano: stored.last_seen_unix_nano,
                })))?;
            }
            if !full {
                break;
            }
        }
        let counts = writer.counts;
        writer.finish().with_context(|| format!("cannot write {}", out.display()))?;
        replacement.commit().with_context(|| format!("cannot write {}", out.display()))?;
        Ok(counts)
    })
}

/// Serialized records handed over this many bytes at a time to the thread that compresses
/// and writes them (gzip took about half of a dump's time, serializing most of the rest).
const DUMP_CHUNK: usize = 1 << 20;

struct DumpWriter {
    /// Records serialized, a line each, not handed over yet.
    lines: Vec<u8>,
    out: ChunkWriter,
    path: PathBuf,
    counts: Counts,
    started: Instant,
}

impl DumpWriter {
    fn write(&mut self, record: &Record) -> anyhow::Result<()> {
        serde_json::to_writer(&mut self.lines, record)
            .with_context(|| format!("cannot write {}: a record does not serialize", self.path.display()))?;
        self.lines.push(b'\n');
        if self.lines.len() >= DUMP_CHUNK {
            let full = std::mem::take(&mut self.lines);
            self.lines = self.out.write(full).with_context(|| format!("cannot write {}", self.path.display()))?;
        }
        match record {
            Record::Header(_) => return Ok(()),
            Record::Span(_) => self.counts.spans += 1,
            Record::Sample(_) => self.counts.samples += 1,
            Record::Log(_) => self.counts.logs += 1,
            Record::Anomaly(_) => self.counts.anomalies += 1,
        }
        progress(self.counts.total() - 1, &self.counts, self.started, "dumped");
        Ok(())
    }

    /// Hands over the last lines and waits until everything is compressed and written.
    fn finish(mut self) -> std::io::Result<()> {
        if !self.lines.is_empty() {
            self.out.write(std::mem::take(&mut self.lines))?;
        }
        self.out.finish()
    }
}

/// A gzip stream that ends (its trailer written, its file flushed) when flushed:
/// [`ChunkWriter`] flushes its sink once, after the last chunk.
struct GzipEndingOnFlush<W: Write>(GzEncoder<W>);

impl<W: Write> Write for GzipEndingOnFlush<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.try_finish()?;
        self.0.get_mut().flush()
    }
}

/// A progress line when the records counted passed a multiple of [`PROGRESS_EVERY`] since
/// there were `before` of them.
fn progress(before: u64, counts: &Counts, started: Instant, verb: &str) {
    let total = counts.total();
    if before / PROGRESS_EVERY != total / PROGRESS_EVERY {
        let seconds = started.elapsed().as_secs_f64();
        eprintln!("{verb} {total} records in {seconds:.1} s ({:.0}/s)", total as f64 / seconds.max(1e-9));
    }
}

/// Hands every row of a table read ahead to `each`, in the table's order.
async fn write_all<T: Send + 'static>(
    mut rows: Ahead<T>,
    mut each: impl FnMut(T) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    loop {
        rows.refill().await?;
        if rows.rows.is_empty() {
            return Ok(());
        }
        for row in rows.rows.drain(..) {
            each(row)?;
        }
    }
}

/// Imports dump files into the store at `database_url` (PostgreSQL) or in `data_dir`
/// (SQLite, created if missing).
pub fn import(files: &[PathBuf], data_dir: &Path, database_url: Option<&str>) -> anyhow::Result<Counts> {
    runtime()?.block_on(async {
        let (target, store) = open(database_url, data_dir, None).await?;
        let mut counts = Counts::default();
        let started = Instant::now();
        for path in files {
            eprintln!("importing {} into {target}", path.display());
            import_file(path, store.as_ref(), &mut counts, started).await?;
        }
        Ok(counts)
    })
}

/// Batches parsed and waiting for the store, at most (the parsing thread blocks beyond).
const PARSED_AHEAD: usize = 2;

/// One import transaction's records, parsed, and the lines they came from.
#[derive(Default)]
struct Parsed {
    batch: IngestBatch,
    anomalies: Vec<DumpedAnomaly>,
    /// Their first and last line numbers.
    lines: (usize, usize),
}

impl Parsed {
    /// Adds the record of line `number` (not a header).
    fn push(&mut self, number: usize, record: Record) {
        if self.counts().total() == 0 {
            self.lines.0 = number;
        }
        self.lines.1 = number;
        match record {
            Record::Span(span) => self.batch.spans.push(*span),
            Record::Sample(sample) => self.batch.samples.push(*sample),
            Record::Log(log) => self.batch.logs.push(*log),
            Record::Anomaly(anomaly) => self.anomalies.push(*anomaly),
            Record::Header(_) => unreachable!("parse_line refuses headers after the first line"),
        }
    }

    /// Whether it is a transaction's worth.
    fn full(&self) -> bool {
        self.counts().total() >= IMPORT_BATCH as u64 || self.anomalies.len() >= IMPORT_ANOMALIES
    }

    fn counts(&self) -> Counts {
        Counts {
            spans: self.batch.spans.len() as u64,
            samples: self.batch.samples.len() as u64,
            logs: self.batch.logs.len() as u64,
            anomalies: self.anomalies.len() as u64,
        }
    }
}

/// Imports one dump file. A thread of its own decompresses and parses it, a batch of
/// [`IMPORT_BATCH`] records at a time and at most [`PARSED_AHEAD`] batches ahead, while the
/// store commits the batch before: parsing and the store's writes, which took turns on one
/// thread, overlap. The batches are committed in the file's order, so whatever stops the
/// import (a line that does not parse, a batch the store refuses) leaves every line before
/// the batch it was in imported, and the error says which.
async fn import_file(path: &Path, store: &dyn Store, counts: &mut Counts, started: Instant) -> anyhow::Result<()> {
    let reader = open_dump(path)?;
    let (sender, mut receiver) = tokio::sync::mpsc::channel(PARSED_AHEAD);
    let parser = {
        let path = path.to_path_buf();
        std::thread::Builder::new()
            .name("lagscope-import-parse".into())
            .spawn(move || parse_dump(&path, reader, &sender))
            .context("cannot start the thread parsing the dump")?
    };
    // The line after the last batch committed.
    let mut imported_before = None;
    let outcome = async {
        while let Some(parsed) = receiver.recv().await {
            let parsed = parsed.map_err(|error| {
                let imported = match imported_before {
                    Some(line) => format!("the lines before {line} are imported"),
                    None => "nothing of it was imported".to_string(),
                };
                error.context(format!("{}: import stopped; {imported}", path.display()))
            })?;
            let (parsed_counts, lines) = (parsed.counts(), parsed.lines);
            commit(store, parsed.batch, parsed.anomalies).await.with_context(|| {
                format!(
                    "{}:{}-{}: import stopped; the lines before {} are imported",
                    path.display(),
                    lines.0,
                    lines.1,
                    lines.0
                )
            })?;
            imported_before = Some(lines.1 + 1);
            let before = counts.total();
            counts.add(parsed_counts);
            progress(before, counts, started, "imported");
        }
        anyhow::Ok(())
    }
    .await;
    // The parser stops at its next batch once nothing receives them.
    drop(receiver);
    parser.join().map_err(|_| anyhow::anyhow!("{}: the thread parsing the dump panicked", path.display()))?;
    outcome
}

/// Reads and parses a dump's lines (the header checked first), handing each batch of
/// [`IMPORT_BATCH`] records (or [`IMPORT_ANOMALIES`] anomalies) to `batches`; a line that
/// does not parse ends them with its error. Returns when the file is read or nothing receives
/// the batches any more.
fn parse_dump(
    path: &Path,
    reader: Box<dyn BufRead + Send>,
    batches: &tokio::sync::mpsc::Sender<anyhow::Result<Parsed>>,
) {
    let mut parsed = Parsed::default();
    for (index, line) in reader.lines().enumerate() {
        let number = index + 1;
        match parse_line(path, number, line) {
            Ok(None) => {}
            Ok(Some(record)) => {
                parsed.push(number, record);
                if parsed.full() && batches.blocking_send(Ok(std::mem::take(&mut parsed))).is_err() {
                    return;
                }
            }
            Err(error) => {
                let _ = batches.blocking_send(Err(error));
                return;
            }
        }
    }
    if parsed.counts().total() > 0 {
        let _ = batches.blocking_send(Ok(parsed));
    }
}

/// One line of a dump: `None` for the header (checked) and blank lines.
fn parse_line(path: &Path, number: usize, line: std::io::Result<String>) -> anyhow::Result<Option<Record>> {
    let line = line.with_context(|| format!("{}:{number}: cannot read", path.display()))?;
    if line.trim().is_empty() {
        return Ok(None);
    }
    let record: Record = serde_json::from_str(&line)
        .with_context(|| format!("{}:{number}: not a lagscope dump record", path.display()))?;
    match record {
        Record::Header(header) if number == 1 => {
            if header.format != FORMAT || header.version != VERSION {
                bail!(
                    "{}: a {} dump version {}; this lagscope reads {FORMAT} version {VERSION}",
                    path.display(),
                    header.format,
                    header.version
                );
            }
            Ok(None)
        }
        _ if number == 1 => {
            bail!("{}: not a lagscope dump (no header line; see `lagscope export --dump`)", path.display())
        }
        Record::Header(_) => bail!("{}:{number}: a second header line", path.display()),
        record => Ok(Some(record)),
    }
}

/// Ingests the batch and upserts the anomalies, each with its first-seen time (so the
/// anomaly keeps when it was first reported; its last-seen time becomes the same), all of
/// them in one transaction.
async fn commit(store: &dyn Store, batch: IngestBatch, anomalies: Vec<DumpedAnomaly>) -> anyhow::Result<()> {
    if !batch.is_empty() {
        store.ingest(&batch).await.context("the store refused a batch")?;
    }
    if !anomalies.is_empty() {
        let seen: Vec<(Anomaly, UnixNanos)> =
            anomalies.into_iter().map(|dumped| (dumped.anomaly, dumped.first_seen_unix_nano)).collect();
        store.upsert_anomalies_seen_at(&seen).await.context("the store refused a batch of anomalies")?;
    }
    Ok(())
}

/// A dump's lines, gzip-compressed (as `export --dump` writes) or not.
fn open_dump(path: &Path) -> anyhow::Result<Box<dyn BufRead + Send>> {
    let file = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut reader = BufReader::new(file);
    let gzipped =
        reader.fill_buf().with_context(|| format!("cannot read {}", path.display()))?.starts_with(&[0x1f, 0x8b]);
    Ok(if gzipped { Box::new(BufReader::new(MultiGzDecoder::new(reader))) } else { Box::new(reader) })
}

/// Reads a whole dump's records (for tests and tools), header first.
pub fn read_records(path: &Path) -> anyhow::Result<Vec<serde_json::Value>> {
    open_dump(path)?
        .lines()
        .enumerate()
        .map(|(index, line)| {
            let line = line.with_context(|| format!("{}:{}: cannot read", path.display(), index + 1))?;
            serde_json::from_str(&line).with_context(|| format!("{}:{}: not JSON", path.display(), index + 1))
        })
        .collect()
}
