//! `.lscap` files: lagscope's compact analysis capture (see `lagscope_analyzer::stream::codec`
//! for the format). Written by `lagscope sim --out FILE.lscap` and `lagscope convert`; read
//! block by block by `lagscope analyze`, so memory never holds the file.

use std::io::{Read, Write};
use std::path::Path;

use anyhow::{Context, bail};
use lagscope_analyzer::stream::codec::{self, Encoder};
use lagscope_analyzer::stream::{Interner, SpanRec};
use lagscope_model::{PointValue, Sample, Span};

/// Whether `path` names an lscap file (by its extension).
pub fn is_lscap(path: &Path) -> bool {
    path.extension().is_some_and(|extension| extension == "lscap")
}

/// Writes spans and numeric samples as lscap.
pub struct LscapWriter<W: Write> {
    out: W,
    encoder: Encoder,
    interner: Interner,
    pub spans: u64,
    pub samples: u64,
    /// Histogram and summary points: not carried (no detector reads them).
    pub skipped_samples: u64,
    /// Recognised log lines carried (other log records are not: no detector reads them).
    pub log_events: u64,
}

impl<W: Write> LscapWriter<W> {
    pub fn new(mut out: W) -> std::io::Result<Self> {
        out.write_all(codec::MAGIC)?;
        Ok(Self {
            out,
            encoder: Encoder::default(),
            interner: Interner::default(),
            spans: 0,
            samples: 0,
            skipped_samples: 0,
            log_events: 0,
        })
    }

    pub fn span(&mut self, span: &Span) -> std::io::Result<()> {
        let record = SpanRec::from_span(span, &mut self.interner);
        self.encoder.span(&record, &self.interner);
        self.spans += 1;
        self.flush_block(false)
    }

    /// Carries a log record if it is one of the lines the analyzer recognises.
    pub fn log(&mut self, log: &lagscope_model::LogRecord) -> std::io::Result<()> {
        let Some(event) = lagscope_analyzer::log_events::classify(log) else { return Ok(()) };
        self.encoder.log_event(&event);
        self.log_events += 1;
        self.flush_block(false)
    }

    pub fn sample(&mut self, sample: &Sample) -> std::io::Result<()> {
        let PointValue::Number(value) = &sample.value else {
            self.skipped_samples += 1;
            return Ok(());
        };
        let labels: Vec<(&str, &str)> =
            sample.series.labels.iter().map(|(key, value)| (key.as_str(), value.as_str())).collect();
        self.encoder.sample(
            &sample.series.name,
            sample.meta.kind,
            &labels,
            sample.time_unix_nano,
            *value,
            &mut self.interner,
        );
        self.samples += 1;
        self.flush_block(false)
    }

    /// Writes the last block and returns the writer.
    pub fn finish(mut self) -> std::io::Result<W> {
        self.flush_block(true)?;
        self.out.flush()?;
        Ok(self.out)
    }

    fn flush_block(&mut self, force: bool) -> std::io::Result<()> {
        match self.encoder.take_block(force) {
            Some(block) => self.out.write_all(&block),
            None => Ok(()),
        }
    }
}

/// What [`convert`] wrote.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Converted {
    pub requests: usize,
    pub spans: u64,
    pub samples: u64,
    pub skipped_samples: u64,
    pub log_records: usize,
    /// Of those, the failure lines the analyzer reads: carried.
    pub log_events: u64,
}

/// Converts OTLP captures (as `analyze` reads them: JSON lines, length-prefixed requests,
/// compressed or not) into one lscap file, one export request at a time. Refuses to write over
/// a capture it reads.
pub fn convert(
    captures: &[impl AsRef<Path>],
    out: &Path,
    progress: crate::progress::Progress,
) -> anyhow::Result<Converted> {
    if !is_lscap(out) {
        bail!("{}: the output must be an .lscap file", out.display());
    }
    if captures.iter().any(|capture| capture.as_ref() == out) {
        bail!("{}: is also an input", out.display());
    }
    // Replaces `out` only once the conversion succeeded.
    let (file, replacement) =
        crate::output::Replacement::create(out).with_context(|| format!("cannot create {}", out.display()))?;
    let mut writer =
        LscapWriter::new(std::io::BufWriter::new(file)).with_context(|| format!("cannot write {}", out.display()))?;
    let mut converted = Converted::default();
    let mut reporter = crate::progress::Reporter::new("convert", progress, captures.len());
    for capture in captures {
        let path = capture.as_ref();
        reporter.file(path);
        let (reader, bytes_read) = crate::analyze::open_capture_counted(path)?;
        let name = path.display().to_string();
        let threads = crate::analyze::default_decode_threads();
        let requests = lagscope_collector::capture::stream_requests_decoding_on(threads, &name, reader, |decoded| {
            let now = std::time::Instant::now();
            if reporter.due(now) {
                let bytes = bytes_read.load(std::sync::atomic::Ordering::Relaxed);
                reporter.report(now, bytes, writer.spans, None);
            }
            let written: std::io::Result<()> = (|| {
                for span in &decoded.spans {
                    writer.span(span)?;
                }
                for sample in &decoded.samples {
                    writer.sample(sample)?;
                }
                for log in &decoded.logs {
                    writer.log(log)?;
                }
                Ok(())
            })();
            converted.log_records += decoded.logs.len();
            written.map_err(|error| format!("cannot write {}: {error}", out.display()))
        })?;
        converted.requests += requests;
    }
    // Its line erased before the summary.
    drop(reporter);
    converted.spans = writer.spans;
    converted.samples = writer.samples;
    converted.skipped_samples = writer.skipped_samples;
    converted.log_events = writer.log_events;
    writer.finish().with_context(|| format!("cannot write {}", out.display()))?;
    replacement.commit().with_context(|| format!("cannot write {}", out.display()))?;
    Ok(converted)
}

/// Where a block sits in its file, for error messages.
#[derive(Debug, Clone, Copy)]
pub struct BlockAt {
    pub index: u64,
    pub offset: u64,
}

/// Reads an lscap file block by block, handing each block's payload to `each` (decode it
/// with one [`codec::Decoder`] per file). Errors name the file, the block and its byte offset.
pub fn read_lscap_blocks(
    path: &Path,
    mut each: impl FnMut(BlockAt, &[u8]) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    // Read straight from the file into the block's buffer, unbuffered (two reads a block of
    // ~256 KB): a buffer in between would copy every byte once more, through the cache.
    let mut reader = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut magic = [0u8; 8];
    reader.read_exact(&mut magic).with_context(|| format!("{}: too short for an lscap file", path.display()))?;
    if &magic != codec::MAGIC {
        bail!(
            "{}: not an lscap file (expected the header {:?})",
            path.display(),
            String::from_utf8_lossy(codec::MAGIC)
        );
    }
    let mut payload = Vec::new();
    let mut at = BlockAt { index: 0, offset: magic.len() as u64 };
    loop {
        let mut length = [0u8; 4];
        match reader.read_exact(&mut length) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(error) => return Err(error).with_context(|| format!("cannot read {}", path.display())),
        }
        let length = u32::from_le_bytes(length) as usize;
        let where_ = format!("{}: block {} at byte {}", path.display(), at.index, at.offset);
        if length > codec::MAX_BLOCK_BYTES {
            bail!("{where_} claims {length} bytes (at most {})", codec::MAX_BLOCK_BYTES);
        }
        payload.resize(length, 0);
        reader.read_exact(&mut payload).with_context(|| format!("{where_} is truncated"))?;
        each(at, &payload).with_context(|| where_.clone())?;
        at.index += 1;
        at.offset += 4 + length as u64;
    }
}
