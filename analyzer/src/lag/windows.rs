//! The lag rows of more spans than memory holds: [`lag_rows`](super::lag_rows) of all of them,
//! built a window of time at a time ([`WindowedLag`]). The metric samples are held whole.
//!
//! Each window's timelines are built from the spans within its [`reach`] (a horizon before it
//! and two after) that can join the calls that start in it ([`of_the_window`]); only those
//! calls give rows. What reaches across windows is carried from one to the next, so that the
//! rows are those of the whole:
//! - which call a call id's attempts belong to: the starts of the calls recently begun, per
//!   call id ([`build_timelines_after`]);
//! - a timeline's cluster and system: those of the client's first attempt in the telemetry's
//!   order ([`FirstAttempts`], gathered as the spans are read);
//! - the committed states: a read's row is completed once every report up to its time is
//!   known, which is when the windows before its time are done.
//!
//! Where spans far apart share ids, a window sees only those within its reach, as the live
//! analyzer and the streaming engine do, where the whole sees all of them:
//! - a router or server span that received no trace context joins the attempt of its call id
//!   nearest to it within the reach, the whole's the nearest of all: the same unless a client
//!   used the call id for another call within a few horizons and the span lies at a reach's
//!   edge;
//! - different spans with the same trace and span ids (a generator that repeats its ids, as
//!   `serve --demo`'s rounds do, 819 s apart): the whole joins a child to the last of them
//!   ([`build_timelines`](crate::build_timelines)), across any time, a window to the one within
//!   its reach.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};

use lagscope_model::{Span, UnixNanos};
use rustc_hash::{FxHashMap, FxHashSet, FxHasher};

use super::{LagRows, ReadLag, apply_lags, behind, read_row, rejections, served_reads_in};
use crate::AnalysisInput;
use crate::committed::{CommittedReports, NamespaceKey, keep_rising, sample_reports};
use crate::series::IndexedSamples;
use crate::timeline::{build_timelines_after, is_client_attempt};

/// Per (client, namespace), the cluster and system of its first client attempt, in the order
/// the spans came: what the whole's timeline of it is named by.
#[derive(Debug, Default)]
pub struct FirstAttempts {
    of: Keyed<(String, Option<String>), ClusterAndSystem>,
}

impl FirstAttempts {
    /// Notes `span`, the next span in the telemetry's order.
    pub fn note(&mut self, span: &Span) {
        if !is_client_attempt(span) {
            return;
        }
        let key = (span.call.client_id.as_deref().unwrap_or_default(), span.call.namespace.as_deref());
        self.of.get_or_insert_with(
            key,
            || (key.0.to_string(), key.1.map(str::to_string)),
            || (span.resource.cluster.clone(), span.resource.system.clone()),
        );
    }
}

/// (cluster, system) of a span's resource.
type ClusterAndSystem = (Option<String>, Option<String>);

/// Values by owned keys, found by borrowed ones ([`Borrowed`]) without copying them: by the
/// hash of the borrowed form (the only one ever hashed), then compared.
#[derive(Debug)]
struct Keyed<K, V> {
    by_hash: FxHashMap<u64, Vec<(K, V)>>,
}

impl<K, V> Default for Keyed<K, V> {
    fn default() -> Self {
        Self { by_hash: FxHashMap::default() }
    }
}

/// A key's borrowed form: hashed to find its bucket, compared with the owned keys there.
trait Borrowed<K>: Hash + Copy {
    fn is(self, owned: &K) -> bool;
}

impl Borrowed<(String, Option<String>)> for (&str, Option<&str>) {
    fn is(self, owned: &(String, Option<String>)) -> bool {
        self.0 == owned.0 && self.1 == owned.1.as_deref()
    }
}

impl Borrowed<(String, Option<String>, String)> for (&str, Option<&str>, &str) {
    fn is(self, owned: &(String, Option<String>, String)) -> bool {
        self.0 == owned.0 && self.1 == owned.1.as_deref() && self.2 == owned.2
    }
}

impl<K, V> Keyed<K, V> {
    fn hash_of(key: impl Hash) -> u64 {
        let mut hasher = FxHasher::default();
        key.hash(&mut hasher);
        hasher.finish()
    }

    fn get<B: Borrowed<K>>(&self, key: B) -> Option<&V> {
        let bucket = self.by_hash.get(&Self::hash_of(key))?;
        bucket.iter().find(|(owned, _)| key.is(owned)).map(|(_, value)| value)
    }

    /// The value of `key` (owned: `owned`), inserted by `new` if it has none.
    fn get_or_insert_with<B: Borrowed<K>>(
        &mut self,
        key: B,
        owned: impl FnOnce() -> K,
        new: impl FnOnce() -> V,
    ) -> &mut V {
        let bucket = self.by_hash.entry(Self::hash_of(key)).or_default();
        let place = match bucket.iter().position(|(held, _)| key.is(held)) {
            Some(place) => place,
            None => {
                bucket.push((owned(), new()));
                bucket.len() - 1
            }
        };
        &mut bucket[place].1
    }

    /// Keeps the entries for which `keep` holds.
    fn retain(&mut self, mut keep: impl FnMut(&mut V) -> bool) {
        self.by_hash.retain(|_, bucket| {
            bucket.retain_mut(|(_, value)| keep(value));
            !bucket.is_empty()
        });
    }
}

/// The spans a window [`from`, `to`) is built from: those that start in [`from` - horizon,
/// `to` + 2 horizons). Its calls' attempts start within a horizon of the call, and their
/// router and server spans within the attempt, which lasts at most a horizon; those before it
/// allow for clocks apart.
pub fn reach(from: UnixNanos, to: UnixNanos, horizon: UnixNanos) -> (UnixNanos, UnixNanos) {
    (from.saturating_sub(horizon), to.saturating_add(horizon.saturating_mul(2)))
}

/// Of `spans`, those within the [`reach`] of the window [`from`, `to`) that the timelines of
/// its calls are built from: a window builds about as many spans as start in it, not the five
/// horizons of its reach (two and a half times as many, in windows of two horizons). Kept:
/// - the client attempts of the call ids that have one starting in the window (all of them
///   within the reach, so that the id's calls are grouped, and its hops without trace
///   context joined, as among the whole reach), and the attempts without a call id that start
///   in the window;
/// - every span of their traces;
/// - the spans without trace context of those call ids, and every span of the traces they
///   begin.
///
/// What is left out cannot join a call that starts in the window: a call's first attempt
/// starts in it, its hops join by trace context (the trace of one of its attempts, or of a
/// hop of its call id that received none) or by call id.
fn of_the_window<'s>(spans: &[&'s Span], from: UnixNanos, to: UnixNanos, horizon: UnixNanos) -> Vec<&'s Span> {
    let (least, most) = reach(from, to, horizon);
    let in_reach: Vec<&Span> =
        spans.iter().copied().filter(|span| span.start_unix_nano >= least && span.start_unix_nano < most).collect();
    let call_of = |span: &'s Span| Some((span.call.client_id.as_deref()?, span.call.call_id.as_deref()?));
    let calls: FxHashSet<(&str, &str)> = (in_reach.iter())
        .filter(|span| (from..to).contains(&span.start_unix_nano) && is_client_attempt(span))
        .filter_map(|span| call_of(span))
        .collect();
    let of_calls = |span: &'s Span| call_of(span).is_some_and(|call| calls.contains(&call));
    // As `attach_hops` tells a hop that received no trace context.
    let without_context =
        |span: &Span| span.trace_id.is_none() || span.span_id.is_none() || span.parent_span_id.is_none();
    // Kept for itself (an attempt of the window's calls, or a hop of their call ids without
    // context); the others only for their traces.
    let own: Vec<bool> = (in_reach.iter())
        .map(|span| match (is_client_attempt(span), &span.call.call_id) {
            (true, Some(_)) => of_calls(span),
            (true, None) => (from..to).contains(&span.start_unix_nano),
            (false, _) => without_context(span) && of_calls(span),
        })
        .collect();
    let traces: FxHashSet<&str> =
        (in_reach.iter().zip(&own)).filter(|(_, own)| **own).filter_map(|(span, _)| span.trace_id.as_deref()).collect();
    (in_reach.into_iter().zip(own))
        .filter(|(span, own)| *own || span.trace_id.as_deref().is_some_and(|trace| traces.contains(trace)))
        .map(|(span, _)| span)
        .collect()
}

/// A read whose row waits for the committed states up to its time.
#[derive(Debug)]
struct Pending {
    row: ReadLag,
    /// Its call's (start, end): the whole's order among reads of one client at one time.
    call: (UnixNanos, UnixNanos),
}

/// [`lag_rows`](super::lag_rows) of spans handed over a window of time at a time.
pub struct WindowedLag {
    horizon: UnixNanos,
    samples: IndexedSamples,
    first_attempts: FirstAttempts,
    /// Per (client, namespace, call id), the starts of its calls of the last two horizons.
    call_starts: Keyed<(String, Option<String>, String), Vec<UnixNanos>>,
    committed: Committed,
    pending: Vec<Pending>,
    /// Where the next window may start.
    next_from: Option<UnixNanos>,
}

impl WindowedLag {
    /// Rows against `samples` (all of them), with `first_attempts` of the spans to come
    /// ([`FirstAttempts`]; or each noted before the windows it is in, [`WindowedLag::note`]), a
    /// call id naming one call for `horizon`.
    pub fn new(samples: IndexedSamples, first_attempts: FirstAttempts, horizon: UnixNanos) -> Self {
        let mut committed_by_samples = sample_reports(samples.index());
        for points in committed_by_samples.values_mut() {
            points.sort_unstable();
        }
        Self {
            horizon,
            samples,
            first_attempts,
            call_starts: Keyed::default(),
            committed: Committed { by_samples: committed_by_samples, ..Committed::default() },
            pending: Vec::new(),
            next_from: None,
        }
    }

    /// Notes a span to come before the windows it is in: spans read in the telemetry's order as
    /// the windows are made, not all before them ([`FirstAttempts::note`]).
    pub fn note(&mut self, span: &Span) {
        self.first_attempts.note(span);
    }

    /// The window [`from`, `to`): `spans` holds every span of the telemetry that starts within
    /// its [`reach`] (more are left out), in the telemetry's order. Windows come in time
    /// order, each from where the last ended or later, when no span starts in between.
    /// Returns the read rows completed: those of the reads served before `to`, in
    /// [`lag_rows`](super::lag_rows)' order.
    pub fn window(&mut self, spans: &[&Span], from: UnixNanos, to: UnixNanos) -> Vec<ReadLag> {
        assert!(self.next_from.is_none_or(|next| next <= from), "windows in time order");
        assert!(from < to, "a window holds time");
        self.next_from = Some(to);
        let horizon = self.horizon;
        let spans = of_the_window(spans, from, to, horizon);
        let call_starts = &self.call_starts;
        let mut timelines = build_timelines_after(&spans, horizon, |call_id, first| {
            let starts = call_starts.get(call_id)?;
            starts.iter().copied().filter(|start| *start < first).max()
        });
        for timeline in &mut timelines {
            if let Some((cluster, system)) =
                self.first_attempts.of.get((timeline.client_id.as_str(), timeline.namespace.as_deref()))
            {
                timeline.cluster.clone_from(cluster);
                timeline.system.clone_from(system);
            }
        }
        let samples = std::mem::take(&mut self.samples);
        let input = AnalysisInput::from_held_timelines(timelines, samples);
        for timeline in input.timelines() {
            let key: NamespaceKey = (timeline.cluster.clone(), timeline.namespace.clone());
            for call in timeline.calls.iter().filter(|call| (from..to).contains(&call.start_unix_nano)) {
                if let Some(call_id) = &call.call_id {
                    let key = (timeline.client_id.as_str(), timeline.namespace.as_deref(), call_id.as_str());
                    let owned = || (key.0.to_string(), key.1.map(str::to_string), key.2.to_string());
                    self.call_starts.get_or_insert_with(key, owned, Vec::new).push(call.start_unix_nano);
                }
                let reports =
                    call.attempts.iter().filter_map(|attempt| Some((attempt.end_unix_nano, attempt.committed?)));
                let mut reports = reports.peekable();
                if reports.peek().is_some() {
                    self.committed.later.entry(key.clone()).or_default().extend(reports);
                }
                for read in served_reads_in(call, &[]) {
                    let row = read_row(timeline, &read, None);
                    self.pending.push(Pending { row, call: (call.start_unix_nano, call.end_unix_nano) });
                }
            }
        }
        let (_, samples) = input.into_parts();
        self.samples = samples;
        // A call id's calls that began two horizons before the next window cannot be open in it.
        let forgotten = to.saturating_sub(horizon.saturating_mul(2));
        self.call_starts.retain(|starts| {
            starts.retain(|start| *start >= forgotten);
            !starts.is_empty()
        });
        // Every call that starts before `to` is in: so is every report before it.
        self.committed.fold_before(Some(to));
        self.complete(Some(to))
    }

    /// The rows of the reads still waiting, the applied-state rows and the rejection rows.
    pub fn finish(mut self) -> LagRows {
        self.committed.fold_before(None);
        let reads = self.complete(None);
        let input = AnalysisInput::from_held_timelines(Vec::new(), std::mem::take(&mut self.samples));
        LagRows { reads, apply: apply_lags(&input, &self.committed.first_seen), rejections: rejections(&input) }
    }

    /// The rows of the pending reads served before `to` (all: `None`), sorted.
    fn complete(&mut self, to: Option<UnixNanos>) -> Vec<ReadLag> {
        let (mut done, waiting): (Vec<Pending>, Vec<Pending>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|pending| to.is_none_or(|to| pending.row.time_unix_nano < to));
        self.pending = waiting;
        // Stable: among reads of a client at one time, the whole's order is its timelines'
        // (by namespace), their calls' (by start, end), then their attempts' (as pushed).
        fn key(pending: &Pending) -> (i64, &String, &Option<String>, (UnixNanos, UnixNanos)) {
            (pending.row.time_unix_nano, &pending.row.client_id, &pending.row.namespace, pending.call)
        }
        done.sort_by(|left, right| key(left).cmp(&key(right)));
        done.into_iter()
            .map(|Pending { mut row, .. }| {
                let key = (row.cluster.clone(), row.namespace.clone());
                let first_seen = self.committed.first_seen.get(&key).map(Vec::as_slice).unwrap_or_default();
                let known = first_seen.partition_point(|(time, _)| *time <= row.time_unix_nano);
                if let Some((committed, states, seconds)) = behind(first_seen, known, row.time_unix_nano, row.served) {
                    (row.committed, row.behind_states, row.behind_seconds) =
                        (Some(committed), Some(states), Some(seconds));
                }
                row
            })
            .collect()
    }
}

/// Per namespace, the committed states reported.
#[derive(Debug, Default)]
struct Committed {
    /// When each state was first known to be committed, from every report before `through`
    /// ([`crate::committed::first_seen`]).
    first_seen: CommittedReports,
    /// Reports of the spans at or after `through`, in no order.
    later: CommittedReports,
    /// Reports of the samples, sorted by time; those before `through` are in `first_seen`.
    by_samples: CommittedReports,
    /// Per namespace, how many of `by_samples` are in `first_seen`.
    samples_taken: BTreeMap<NamespaceKey, usize>,
}

impl Committed {
    /// Folds the reports before `to` (all: `None`) into `first_seen`.
    fn fold_before(&mut self, to: Option<UnixNanos>) {
        let before = |time: i64| to.is_none_or(|to| time < to);
        let mut keys: Vec<NamespaceKey> = self.later.keys().cloned().collect();
        keys.extend(self.by_samples.keys().filter(|key| !self.later.contains_key(*key)).cloned());
        for key in keys {
            let mut points: Vec<(i64, i64)> = Vec::new();
            if let Some(later) = self.later.get_mut(&key) {
                points.extend(later.iter().copied().filter(|(time, _)| before(*time)));
                later.retain(|(time, _)| !before(*time));
                if later.is_empty() {
                    self.later.remove(&key);
                }
            }
            if let Some(sampled) = self.by_samples.get(&key) {
                let taken = self.samples_taken.entry(key.clone()).or_default();
                let through = *taken + sampled[*taken..].partition_point(|(time, _)| before(*time));
                points.extend_from_slice(&sampled[*taken..through]);
                *taken = through;
            }
            if points.is_empty() {
                continue;
            }
            points.sort_unstable();
            keep_rising(self.first_seen.entry(key).or_default(), points);
        }
    }
}

#[cfg(test)]
mod tests {
    use lagscope_model::{Component, Sample};

    use super::*;
    use crate::lag_rows;
    use crate::testing::{Numbers, call_spans, node_sample};

    /// [`WindowedLag`]'s rows of `spans`, in windows of `width` from the first start (those
    /// where a span starts), each handed the spans within its reach in their order.
    fn windowed(spans: &[Span], samples: Vec<Sample>, horizon: UnixNanos, width: i64) -> LagRows {
        let mut first_attempts = FirstAttempts::default();
        spans.iter().for_each(|span| first_attempts.note(span));
        let mut lag = WindowedLag::new(samples.into(), first_attempts, horizon);
        let first = spans.iter().map(|span| span.start_unix_nano).min().unwrap_or(0);
        let last = spans.iter().map(|span| span.start_unix_nano).max().unwrap_or(0);
        let mut reads = Vec::new();
        let mut from = first;
        while from <= last {
            let to = from + width;
            // Windows where no span starts are left out (as `export` does).
            if spans.iter().any(|span| (from..to).contains(&span.start_unix_nano)) {
                let (least, most) = reach(from, to, horizon);
                let reach: Vec<&Span> =
                    spans.iter().filter(|span| span.start_unix_nano >= least && span.start_unix_nano < most).collect();
                reads.extend(lag.window(&reach, from, to));
            }
            from = to;
        }
        let mut rows = lag.finish();
        reads.append(&mut rows.reads);
        rows.reads = reads;
        rows
    }

    /// Random histories: clients that reuse their call ids for calls a horizon apart, or send
    /// router and server spans without trace context (joined by call id), spans sent twice,
    /// attempts named by other clusters, nodes' metrics. Windowed at any width, the rows are
    /// those of the whole history.
    #[test]
    fn windowed_rows_are_the_whole_historys() {
        let (mut reads, mut compared, mut continued) = (0, 0, 0);
        for seed in 0..120 {
            let mut numbers = Numbers(seed * 7_919 + 3);
            let horizon: i64 = [1_000, 30, 45][numbers.below(3) as usize];
            // Hops without trace context join the nearest attempt of their call id in the
            // window's reach, the whole history's join the nearest of all: the same where a call
            // id names one call (see the module's doc).
            let untraced = seed % 2 == 0;
            let (mut next_id, mut next_call) = (0, 0);
            let (mut spans, mut samples): (Vec<Span>, Vec<Sample>) = (Vec::new(), Vec::new());
            for round in 0..40 {
                let now = round * 20;
                for _ in 0..numbers.below(6) {
                    let mut made = call_spans(&mut numbers, &mut next_id, now);
                    if untraced {
                        next_call += 1;
                        for span in &mut made {
                            span.call.call_id = span.call.call_id.as_ref().map(|id| format!("{id}-{next_call}"));
                        }
                    } else {
                        made.retain(|span| {
                            span.parent_span_id.is_some() || span.component() == Some(Component::Client)
                        });
                    }
                    if !spans.is_empty() && numbers.chance(10) {
                        made.push(spans[numbers.below(spans.len() as u64) as usize].clone());
                    }
                    if numbers.chance(50) {
                        made.reverse();
                    }
                    spans.extend(made);
                }
                for _ in 0..numbers.below(5) {
                    samples.push(node_sample(&mut numbers, now));
                }
            }
            let whole = lag_rows(&AnalysisInput::from_telemetry(&spans, samples.clone(), horizon));
            reads += whole.reads.len();
            compared += whole.reads.iter().filter(|row| row.committed.is_some()).count();
            if !untraced {
                // Calls whose first attempts lie before a window's reach: the carry is needed.
                let timelines = crate::build_timelines(&spans, horizon);
                continued += timelines
                    .iter()
                    .flat_map(|timeline| &timeline.calls)
                    .filter(|call| call.attempts.len() > 1)
                    .count();
            }
            for width in [1, 7, horizon / 2, horizon, 3 * horizon, 100_000] {
                let rows = windowed(&spans, samples.clone(), horizon, width);
                assert_eq!(rows, whole, "seed {seed}, horizon {horizon}, width {width}");
            }
        }
        assert!(reads > 2_000 && compared > 1_000 && continued > 300, "{reads} {compared} {continued}");
    }
}
