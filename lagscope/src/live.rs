//! The live analyzer: re-analyzes each client whose spans were just committed and stores
//! what it finds. Same detectors as `lagscope analyze`, over the store instead of a file.
//!
//! On SQLite (one process) the receivers' in-memory marks say what to look at. On PostgreSQL
//! several instances may share the database: marks are committed with the data, the work is
//! split into shards held under leases ([`lagscope_store::Coordinator`]), and each instance
//! analyses the marks of its shards, whoever ingested them.
//!
//! This file runs the passes and stores what they find; `pass.rs` is one pass (`analysis_pass`:
//! what it reads, in which order), `shards.rs` holds the shards and routes clients on
//! PostgreSQL, `analysis.rs` the clients' and scopes' analyses a pass runs, `lines.rs` the log
//! lines it reads and whose they are, `written.rs` what it has written.

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lagscope_analyzer::log_events::{LogEvent, LogEventKind, classify, take_once};
use lagscope_analyzer::{
    AnalysisInput, HeldTimelines, SpanKey, analyze_held_kinds, analyze_kinds, growing, read_rollups,
};
use lagscope_collector::{DirtyClients, Pending};
use lagscope_model::{AnomalyKind, ROLLUP_STEP, ReadRollup, UnixNanos, rollup_step_of};
use lagscope_selfmetrics::{Counter, SelfMetrics};
use lagscope_store::{Coordinator, Mark, Store, TimeRange};
use tokio::sync::watch;

use crate::Config;
use crate::client_cache::{ClientCache, Loaded};
use crate::held::{LateSpans, Settling};
use crate::line_cache::LineCache;
use crate::sample_cache::SampleCache;
use crate::scope_cache::{ScopeCache, Source};

mod analysis;
mod lines;
mod pass;
pub(crate) mod shards;
#[cfg(test)]
mod tests;
mod written;

use analysis::{
    ClientWork, SCOPES_AT_ONCE, ScopeWork, Spans, client_analysis, client_probes, cluster_analysis, on_threads,
    scope_analysis,
};
use lines::{AddressCallers, Process, ProcessOwners, RecognisedLines};
use pass::analysis_pass;
use shards::{route_clients, run_coordinated};
use written::{Findings, NEW_ANOMALIES_LOG_INTERVAL, Recorder, ScopeKey, take_late};

/// Marks analysed per pass on PostgreSQL: a pass is short enough that newly committed data
/// and lease changes are looked at again soon.
const MARKS_PER_PASS: u32 = 2_000;

/// After a failed pass, the marks stay; the next try waits this long.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(1);

pub async fn run_live_analyzer(
    store: Arc<dyn Store>,
    dirty: Arc<DirtyClients>,
    metrics: Arc<SelfMetrics>,
    config: Config,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    if store.coordinator().is_some() {
        return run_coordinated(store, dirty, metrics, config, shutdown).await;
    }
    let mut shutdown = shutdown;
    // The marks of this process's commits carry their sample times: scopes' samples are held.
    let mut kept = Kept::new(&config, config.live.scope_cache_samples, &metrics);
    // Each pass's findings are stored while the next pass analyses: most of a write is the
    // wait for the store's one writer (ingest holds it) and the log's sync, time in which the
    // next pass would otherwise stand still. At most one pass's findings wait to be written;
    // they are written in pass order.
    let (to_writer, passes) = tokio::sync::mpsc::channel(1);
    let writer = tokio::spawn(write_passes(Arc::clone(&store), Arc::clone(&metrics), passes));
    loop {
        let pending = tokio::select! {
            pending = dirty.take() => pending,
            _ = shutdown.wait_for(|stop| *stop) => break,
        };
        let started = Instant::now();
        let (through_batch, first_queued) = (pending.through_batch, pending.first_queued);
        let findings = analysis_pass(store.as_ref(), &metrics, &config, &mut kept, pending, None).await;
        let analysed = Analysed { findings, started, analysed: started.elapsed(), first_queued, through_batch };
        if to_writer.send(analysed).await.is_err() {
            break;
        }
    }
    // What the last passes found is stored before the analyzer stops.
    drop(to_writer);
    writer.await?;
    Ok(())
}

/// One pass's findings on their way to the store, and when the pass ran.
struct Analysed {
    /// `Err`: the pass failed; nothing to store.
    findings: Result<Findings, lagscope_store::StoreError>,
    started: Instant,
    /// The pass's analysis, without its write.
    analysed: Duration,
    first_queued: Option<Instant>,
    through_batch: u64,
}

/// Stores each pass's findings in pass order; a pass's batches count as analysed (and its
/// delay is measured) once its findings are stored.
async fn write_passes(
    store: Arc<dyn Store>,
    metrics: Arc<SelfMetrics>,
    mut passes: tokio::sync::mpsc::Receiver<Analysed>,
) {
    let mut recorder = Recorder::default();
    loop {
        let analysed = tokio::select! {
            analysed = passes.recv() => match analysed {
                Some(analysed) => analysed,
                None => break,
            },
            // What the last passes found is logged even when nothing more arrives.
            () = tokio::time::sleep(NEW_ANOMALIES_LOG_INTERVAL), if recorder.found.count > 0 => {
                recorder.found.log_every(NEW_ANOMALIES_LOG_INTERVAL);
                continue;
            }
        };
        let waited = analysed.started.elapsed().saturating_sub(analysed.analysed);
        let writing = Instant::now();
        let outcome = match analysed.findings {
            Ok(findings) => recorder.store(store.as_ref(), &metrics, findings).await,
            Err(error) => Err(error),
        };
        let writes = writing.elapsed();
        recorder.found.log_every(NEW_ANOMALIES_LOG_INTERVAL);
        match outcome {
            Ok(()) => metrics.analysis_passes.add(1),
            Err(error) => {
                // The data is committed; the next pass for these clients will find it again.
                metrics.analysis_errors.add(1);
                tracing::error!(%error, "live analysis pass failed");
            }
        }
        metrics.analysis_latency.observe(analysed.started.elapsed());
        let delay = analysed.first_queued.map(|queued| queued.elapsed());
        if let Some(delay) = delay {
            metrics.analysis_delay.observe(delay);
        }
        metrics.batches_analyzed.raise_to(analysed.through_batch);
        tracing::debug!(
            // From the pass's end to its write's start: the write of the pass before.
            waited_ms = waited.as_millis(),
            writes_ms = writes.as_millis(),
            delay_ms = delay.unwrap_or_default().as_millis(),
            "pass findings stored"
        );
    }
    recorder.found.log_every(Duration::ZERO);
}

/// What the live analyzer keeps from one pass to the next.
struct Kept {
    lines: RecognisedLines,
    scope_spans: ScopeCache,
    client_spans: ClientCache,
    samples: SampleCache,
    /// How far behind the newest span the held timelines are settled, widened by late spans.
    settling: Settling,
    /// Which clients called cluster URLs from which processes.
    callers: AddressCallers,
}

impl Kept {
    /// Holding at most `samples` metric samples between passes (0: none); the settling's gauge
    /// set to where it starts.
    fn new(config: &Config, samples: usize, metrics: &SelfMetrics) -> Self {
        let horizon = config.analyzer.stream.horizon();
        let settling = Settling::new(config.live.settle_seconds, config.live.max_settle_seconds, Instant::now());
        metrics.analysis_settle_seconds.set(settling.seconds());
        Self {
            lines: RecognisedLines::default(),
            scope_spans: ScopeCache::new(config.live.scope_cache_spans, horizon),
            client_spans: ClientCache::new(config.live.client_cache_spans, horizon),
            samples: SampleCache::new(samples),
            settling,
            callers: AddressCallers::default(),
        }
    }
}

/// The wall clock in Unix nanoseconds.
pub fn now_unix_nano() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_nanos() as i64)
}
