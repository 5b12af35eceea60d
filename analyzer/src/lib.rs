//! lagscope's analyzer: reconstructs per-client causal timelines from spans and runs the
//! detector catalogue over them.
//!
//! The same code runs live (the service re-analyzes a client when its spans arrive) and
//! offline (`lagscope analyze` over a capture), so it is pure: no I/O, no clock, no async
//! runtime. Given the same spans it returns the same anomalies, with the same fingerprints.

mod committed;
mod config;
pub mod detectors;
mod enrich;
mod floor;
mod held;
mod lag;
pub mod log_events;
mod open;
mod series;
pub mod stream;
#[cfg(test)]
mod testing;
mod timeline;

use std::sync::Arc;

use lagscope_model::{Anomaly, AnomalyKind, ClientTimeline, Sample, Span, TimelineCall, UnixNanos};

pub use config::{
    AnalyzerConfig, ApplyLagConfig, BlindFailoverProbeConfig, FailoverFlappingConfig, FollowerReadDisabledConfig,
    NoNamenodesWindowConfig, PinnedRetryConfig, RequeueStormConfig, StaleReadConfig, StatesBehindConfig, StreamConfig,
    UntrustedStateConfig,
};
pub use enrich::enrich;
pub use floor::{CallFloors, FloorContribution, FloorSource, floors, seen_before};
pub use held::{CallVerdicts, HeldTimelines, SpanKey, growing};
pub use lag::{
    ApplyLagPoint, FirstAttempts, LagRows, ReadLag, RejectionCount, WindowedLag, apply_lag_rows, lag_rows, reach,
    read_rollups,
};
pub use series::IndexedSamples;
pub use timeline::{build_timelines, for_timelines};

/// What the detectors look at.
#[derive(Debug, Default)]
pub struct AnalysisInput {
    /// Not to be changed once built ([`AnalysisInput::timelines`]): what the detectors share
    /// is derived from them once ([`AnalysisInput::committed`]).
    pub(crate) timelines: Vec<ClientTimeline>,
    /// The metric samples, grouped by series once for every detector; not to be changed
    /// once given ([`AnalysisInput::samples`]).
    samples: IndexedSamples,
    /// The recognised log lines ([`log_events`]), in time order.
    /// Shared: the live analyzer hands one cluster's lines to many passes.
    pub log_events: Vec<Arc<log_events::LogEvent>>,
    /// Per timeline (in order), what the per-call detectors found in the calls that did not
    /// change since an earlier pass ([`HeldTimelines::take_verdicts`]), for
    /// [`analyze_held_kinds`]; empty: every call is judged.
    pub verdicts: Vec<CallVerdicts>,
    /// Per timeline (in order), where a settle of the held timelines cut it
    /// ([`HeldTimelines::settled_from`]): its calls that start before are the witnesses kept
    /// for the later calls' floors and states, not its history. Empty: none was cut.
    cuts: Vec<UnixNanos>,
    /// Per namespace, when each committed state was first reported, on the timelines'
    /// attempts and in the samples: taken by several detectors and the read rollups,
    /// gathered on first use.
    committed: std::sync::OnceLock<committed::CommittedReports>,
}

impl AnalysisInput {
    /// Builds the timelines of every client in `spans`, a call id naming one call for
    /// `horizon` ([`StreamConfig::horizon`], see [`build_timelines`]).
    pub fn from_telemetry(spans: &[Span], samples: impl Into<IndexedSamples>, horizon: UnixNanos) -> Self {
        Self::of(build_timelines(spans, horizon), samples)
    }

    /// [`AnalysisInput::from_telemetry`] of spans held elsewhere (the live analyzer's caches).
    pub fn from_span_refs(spans: &[&Span], samples: impl Into<IndexedSamples>, horizon: UnixNanos) -> Self {
        Self::of(timeline::build_timelines_of(spans, horizon), samples)
    }

    /// The input of timelines kept between passes ([`HeldTimelines::take_timelines`]): what
    /// the metrics said at each attempt is filled in again from `samples` (every field of
    /// `reported` written anew, [`enrich::enrich_from`]).
    pub fn from_held_timelines(timelines: Vec<ClientTimeline>, samples: impl Into<IndexedSamples>) -> Self {
        Self::of(timelines, samples)
    }

    /// The input of `held`'s timelines, taken ([`HeldTimelines::take_timelines`]; refresh
    /// them first): as [`AnalysisInput::from_held_timelines`], but only the attempts what the
    /// metrics said may have changed for since the last pass are told again
    /// ([`enrich::enrich_changed`]). Give the timelines back to `held` as the analysis leaves
    /// them.
    pub fn from_held(held: &mut HeldTimelines, samples: impl Into<IndexedSamples>) -> Self {
        let samples = samples.into();
        let unenriched_from = held.unenriched_from();
        let cuts = held.cuts();
        let mut timelines = held.take_timelines();
        enrich::enrich_changed(&mut timelines, &unenriched_from, samples.index(), &mut held.told);
        Self { timelines, samples, cuts, ..Self::default() }
    }

    /// `timelines` filled in from `samples` ([`enrich`]).
    fn of(mut timelines: Vec<ClientTimeline>, samples: impl Into<IndexedSamples>) -> Self {
        let samples = samples.into();
        enrich::enrich_from(&mut timelines, samples.index());
        Self { timelines, samples, ..Self::default() }
    }

    /// The timelines the detectors look at.
    pub fn timelines(&self) -> &[ClientTimeline] {
        &self.timelines
    }

    /// The calls of the timeline at `index` that tell its history in order: from the last call
    /// before its settle cut on (the one a later call follows); every call when it was never
    /// cut. Before that call are only witnesses of older calls, kept for their floors and
    /// states: one followed by the next kept call is no step of the client's (a switch of
    /// cluster between them, say, is none the client made).
    pub(crate) fn consecutive_calls(&self, index: usize) -> &[TimelineCall] {
        let calls = &self.timelines[index].calls;
        match self.cuts.get(index) {
            Some(&cut) if cut > UnixNanos::MIN => {
                &calls[calls.partition_point(|call| call.start_unix_nano < cut).saturating_sub(1)..]
            }
            _ => calls,
        }
    }

    /// (cluster, node, client) of every client that called a cluster URL (`server.address`)
    /// from a process, once each: whose switch lines that name no client a process logs
    /// (`failover_flapping`).
    pub fn address_callers(&self) -> std::collections::BTreeSet<(Option<&str>, &str, &str)> {
        detectors::failover_flapping::address_callers(&self.timelines).collect()
    }

    /// Per namespace, when each committed state was first reported ([`committed::first_seen`]
    /// of [`committed::committed_reports`]).
    pub(crate) fn committed(&self) -> &committed::CommittedReports {
        self.committed.get_or_init(|| committed::first_seen(committed::committed_reports(self)))
    }

    /// The metric samples it was given.
    pub fn samples(&self) -> &[Sample] {
        self.samples.samples()
    }

    /// Its timelines and samples (with their index, to be kept for a later pass), given back.
    pub fn into_parts(self) -> (Vec<ClientTimeline>, IndexedSamples) {
        (self.timelines, self.samples)
    }

    /// The samples grouped by series.
    pub(crate) fn series(&self) -> &series::SeriesIndex {
        self.samples.index()
    }

    /// Adds the events of the log records that carry one; a line sent again
    /// ([`log_events::LogEvent::identity`]) is taken once.
    pub fn with_logs(mut self, logs: &[lagscope_model::LogRecord]) -> Self {
        self.log_events.extend(logs.iter().filter_map(log_events::classify).map(Arc::new));
        log_events::take_once(&mut self.log_events);
        self.log_events.sort_by_key(|event| event.time_unix_nano);
        self
    }
}

/// Runs every detector, returning their anomalies ordered by start time, then kind, then
/// fingerprint (a stable order for output and golden files).
pub fn analyze(input: &AnalysisInput, config: &AnalyzerConfig) -> Vec<Anomaly> {
    analyze_kinds(input, config, |_| true)
}

/// [`analyze`] with only the detectors whose kind `wanted` accepts.
pub fn analyze_kinds(
    input: &AnalysisInput,
    config: &AnalyzerConfig,
    wanted: impl Fn(AnomalyKind) -> bool,
) -> Vec<Anomaly> {
    let mut anomalies: Vec<Anomaly> = detectors::REGISTRY
        .iter()
        .filter(|detector| wanted(detector.kind))
        .flat_map(|detector| (detector.detect)(input, config))
        .collect();
    finish(input, &mut anomalies, config);
    sort_anomalies(&mut anomalies);
    anomalies
}

/// [`analyze_kinds`] over held timelines, with what earlier passes found in them
/// (`input.verdicts`): the per-call detectors ([`detectors::Detector::judge`]) judge only the
/// calls that changed since, and take the anomalies of the others from the verdicts, which
/// are left holding this pass's. The same anomalies as [`analyze_kinds`], in the same order;
/// those taken from the verdicts shared, not copied.
pub fn analyze_held_kinds(
    input: &mut AnalysisInput,
    config: &AnalyzerConfig,
    wanted: impl Fn(AnomalyKind) -> bool,
) -> Vec<Arc<Anomaly>> {
    let judged: u64 = detectors::REGISTRY
        .iter()
        .enumerate()
        .filter(|(_, detector)| detector.judge.is_some() && wanted(detector.kind))
        .fold(0, |bits, (place, _)| bits | 1 << place);
    let mut verdicts = std::mem::take(&mut input.verdicts);
    if verdicts.len() != input.timelines.len() {
        verdicts = input.timelines.iter().map(|_| CallVerdicts::default()).collect();
    }
    for verdicts in &mut verdicts {
        verdicts.keep_unchanged(judged);
    }
    // In the order `analyze_kinds` finds them in (detector, timeline, call): a stable sort of
    // the same anomalies then gives the same order.
    // (`None`: the next of the other detectors' anomalies.)
    let (mut others, mut found): (Vec<Anomaly>, Vec<Option<Arc<Anomaly>>>) = (Vec::new(), Vec::new());
    for (place, detector) in detectors::REGISTRY.iter().enumerate().filter(|(_, detector)| wanted(detector.kind)) {
        let Some(judge) = detector.judge else {
            let anomalies = (detector.detect)(input, config);
            found.extend(std::iter::repeat_n(None, anomalies.len()));
            others.extend(anomalies);
            continue;
        };
        for (timeline, verdicts) in input.timelines.iter().zip(&mut verdicts) {
            verdicts.judge(place, judge, timeline, config);
            found.extend(verdicts.of(place).map(|anomaly| Some(Arc::clone(anomaly))));
        }
    }
    finish(input, &mut others, config);
    let mut others = others.into_iter();
    let mut anomalies: Vec<Arc<Anomaly>> = found
        .into_iter()
        .map(|anomaly| anomaly.unwrap_or_else(|| Arc::new(others.next().expect("one for each place"))))
        .collect();
    sort_anomalies(&mut anomalies);
    input.verdicts = verdicts;
    anomalies
}

/// What every pass does to the anomalies its detectors found: windows marked open or
/// resolved, log lines attached as evidence.
fn finish(input: &AnalysisInput, anomalies: &mut [Anomaly], config: &AnalyzerConfig) {
    mark_open(input, anomalies, config);
    // The evidence lines are gathered only when an anomaly that takes them was found.
    if anomalies.iter().any(|anomaly| log_events::evidence_of(anomaly.kind).is_some()) {
        let evidence: Vec<&log_events::LogEvent> =
            input.log_events.iter().map(Arc::as_ref).filter(|event| event.kind.is_evidence()).collect();
        log_events::attach_evidence(anomalies, &evidence);
    }
}

/// The order anomalies are reported in: start time, then kind, then fingerprint.
pub fn sort_anomalies<A: std::borrow::Borrow<Anomaly>>(anomalies: &mut [A]) {
    anomalies.sort_by(|left, right| {
        let (left, right) = (left.borrow(), right.borrow());
        (left.start_unix_nano, left.kind, &left.fingerprint).cmp(&(
            right.start_unix_nano,
            right.kind,
            &right.fingerprint,
        ))
    });
}

/// A window anomaly is open while its window reaches the end of the telemetry it is found in
/// (within `grace`): the condition held at the last data that could show it ending
/// ([`open::DataEnds`]). Otherwise it is resolved.
fn mark_open(input: &AnalysisInput, anomalies: &mut [Anomaly], config: &AnalyzerConfig) {
    use lagscope_model::conventions::{CLUSTER, NODE_ID};
    let mut ends: open::DataEnds<Option<&str>> = open::DataEnds::default();
    for timeline in &input.timelines {
        if let Some(end) = timeline.calls.iter().map(|call| call.end_unix_nano).max() {
            ends.call_or_line(timeline.cluster.as_deref(), end);
        }
    }
    for (series, latest) in input.series().latest() {
        ends.sample(series.label(CLUSTER), series.label(NODE_ID).map(Some), latest);
    }
    for event in &input.log_events {
        ends.call_or_line(event.cluster.as_deref(), event.time_unix_nano);
    }
    let (grace, silence) = (config.open_grace_seconds * 1_000_000_000, config.open_silence_seconds * 1_000_000_000);
    for anomaly in anomalies.iter_mut() {
        let (cluster, node) = (anomaly.cluster.as_deref(), anomaly.node_id.as_deref().map(Some));
        anomaly.open = ends.is_open(anomaly.kind, cluster, node, anomaly.end_unix_nano, grace, silence);
    }
}
