//! The metric-only detectors (apply_lag, requeue_storm, shard_pressure, unfair_rejection),
//! one sample at a time. Samples are released in time order (a `lateness` after the latest
//! sample time seen); at each timestamp every series is updated first, then the detectors
//! step, so "the value of another series at this time" is its current value, exactly what the
//! batch detectors' `value_at` reads. State is per series: current value, last rate, the open
//! run or episode; nothing grows with the length of the history.

use std::collections::BTreeMap;

use lagscope_model::conventions::{
    CLUSTER, METRIC_APPLIED_STATE, METRIC_COMMITTED_STATE, METRIC_REQUEUE_CALLS, METRIC_ROLE,
    METRIC_RPC_PROCESSING_OPS, METRIC_RPC_QUEUE_OPS, METRIC_SHARD_INFLIGHT_BYTES, METRIC_SHARD_LIMIT_BYTES,
    METRIC_SHARD_REJECTIONS, NAMESPACE, NODE_ID, NODE_ROLE,
};
use lagscope_model::{Anomaly, AnomalyKind, MetricKind, UnixNanos};
use rustc_hash::FxHashMap;

use super::codec::SeriesDef;
use super::intern::{Interner, Sym};
use super::queue::{TimeQueue, Timed};
use crate::AnalyzerConfig;
use crate::detectors::apply_lag::{self, Episode};
use crate::detectors::shard_pressure::{self, SHARD_ROLE};
use crate::detectors::{requeue_storm, unfair_rejection};
use crate::series::Scope;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Which {
    Applied,
    Committed,
    Role,
    Requeues,
    QueueOps,
    ProcessingOps,
    Inflight,
    Limit,
    Rejections,
}

impl Which {
    fn of(name: &str) -> Option<Self> {
        Some(match name {
            METRIC_APPLIED_STATE => Self::Applied,
            METRIC_COMMITTED_STATE => Self::Committed,
            METRIC_ROLE => Self::Role,
            METRIC_REQUEUE_CALLS => Self::Requeues,
            METRIC_RPC_QUEUE_OPS => Self::QueueOps,
            METRIC_RPC_PROCESSING_OPS => Self::ProcessingOps,
            METRIC_SHARD_INFLIGHT_BYTES => Self::Inflight,
            METRIC_SHARD_LIMIT_BYTES => Self::Limit,
            METRIC_SHARD_REJECTIONS => Self::Rejections,
            _ => return None,
        })
    }
}

/// A series as the batch detectors group them: metric, (cluster, namespace, node) and the one
/// extra label they key by (the node role of role series, the shard role of shard series).
type Key = (Which, Sym, Sym, Sym, Sym);

/// A run of points satisfying a condition (requeue storms, shard pressure).
#[derive(Debug, Clone, Copy)]
struct Run {
    start: UnixNanos,
    end: UnixNanos,
    peak: f64,
    /// Values when the run started and at its latest point (requeue storms: requeued, queue
    /// ops, processing ops; shard pressure: the limit at the end).
    at_start: [Option<f64>; 3],
    at_end: [Option<f64>; 3],
    /// Whether a point since `end` failed the condition (a dip the run may go on through).
    dipped: bool,
    /// The highest value of that dip's points: part of the run's peak if the run goes on
    /// (the batch detectors take the peak over every point from its start to its end).
    dip_peak: f64,
}

/// An apply-lag episode in progress, with the committed state at its start and at its end.
#[derive(Debug)]
struct OpenEpisode {
    episode: Episode,
    committed_start: f64,
    committed_end: f64,
}

/// Unfair rejections of one shard so far.
#[derive(Debug, Default)]
struct Unfair {
    first: Option<UnixNanos>,
    last: UnixNanos,
    rejected: f64,
    holders: BTreeMap<String, f64>,
    /// The node's heaviest holder other than this shard, and its share, at the counter's
    /// latest point (`unfair_rejection::heaviest_holder`): the one at the start of the next
    /// interval.
    holder: Option<(String, f64)>,
}

#[derive(Debug)]
struct Series {
    key: Key,
    delta: bool,
    /// The latest point (a running total for delta counters).
    current: Option<(UnixNanos, f64)>,
    /// The rate at the latest point, from the point before.
    rate: Option<(UnixNanos, f64)>,
    /// Shard series: in-flight bytes over the limit at the latest point with a limit, and
    /// when.
    ratio: Option<(UnixNanos, f64)>,
    /// The highest of those ratios since the shard's rejection counter was last read, and the
    /// one in force then (what `unfair_rejection` judges the rejections in between by).
    ratio_peak: Option<f64>,
    // apply_lag
    last_change: Option<(UnixNanos, f64)>,
    committed_at_change: f64,
    episode: Option<OpenEpisode>,
    // requeue_storm, shard_pressure
    run: Option<Run>,
    // unfair_rejection
    unfair: Unfair,
}

/// A sample waiting for the lateness: (time, arrival, series, value bits).
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Point(UnixNanos, u64, u32, u64);

impl Timed for Point {
    fn time(&self) -> i64 {
        self.0
    }
}

/// The metric detectors' state.
pub(crate) struct Metrics {
    lateness: i64,
    watermark: UnixNanos,
    sequence: u64,
    /// Samples not yet processed, released in time (then arrival) order.
    queue: TimeQueue<Point>,
    series: Vec<Series>,
    index: FxHashMap<Key, u32>,
    /// Engine series id -> ours.
    of_engine: Vec<Option<u32>>,
    /// Per (cluster, namespace): the highest committed state reported so far.
    committed: FxHashMap<(Sym, Sym), f64>,
    /// Per (cluster, node): the latest role reported (time, role).
    roles: FxHashMap<(Sym, Sym), (UnixNanos, String)>,
    /// Per (cluster, node, shard role): the in-flight series of the node's shards.
    shards: FxHashMap<(Sym, Sym, Sym), Vec<u32>>,
    pub(crate) held_peak: usize,
    anomalies: Vec<Anomaly>,
}

impl Metrics {
    pub(crate) fn new(lateness: i64) -> Self {
        Self {
            lateness,
            watermark: i64::MIN,
            sequence: 0,
            queue: TimeQueue::default(),
            series: Vec::new(),
            index: FxHashMap::default(),
            of_engine: Vec::new(),
            committed: FxHashMap::default(),
            roles: FxHashMap::default(),
            shards: FxHashMap::default(),
            held_peak: 0,
            anomalies: Vec::new(),
        }
    }

    /// Learns an engine series (its id is `id`); series of other metrics are ignored.
    pub(crate) fn define(&mut self, id: u32, def: &SeriesDef, interner: &Interner) {
        let id = id as usize;
        if self.of_engine.len() <= id {
            self.of_engine.resize(id + 1, None);
        }
        let Some(which) = interner.get(def.name).and_then(Which::of) else { return };
        let label = |key: &str| {
            def.labels.iter().find(|(name, _)| interner.get(*name) == Some(key)).map_or(Sym::NONE, |(_, v)| *v)
        };
        let extra = match which {
            Which::Role => label(NODE_ROLE),
            Which::Inflight | Which::Limit | Which::Rejections => label(SHARD_ROLE),
            _ => Sym::NONE,
        };
        let key = (which, label(CLUSTER), label(NAMESPACE), label(NODE_ID), extra);
        let ours = match self.index.get(&key) {
            Some(ours) => *ours,
            None => {
                let ours = u32::try_from(self.series.len()).expect("fewer than 2^32 series");
                self.index.insert(key, ours);
                self.series.push(Series {
                    key,
                    delta: def.kind == MetricKind::DeltaCounter,
                    current: None,
                    rate: None,
                    ratio: None,
                    ratio_peak: None,
                    last_change: None,
                    committed_at_change: 0.0,
                    episode: None,
                    run: None,
                    unfair: Unfair::default(),
                });
                if which == Which::Inflight {
                    self.shards.entry((key.1, key.3, key.4)).or_default().push(ours);
                }
                ours
            }
        };
        self.of_engine[id] = Some(ours);
    }

    pub(crate) fn push(&mut self, id: u32, time: UnixNanos, value: f64, interner: &Interner, config: &AnalyzerConfig) {
        let Some(Some(ours)) = self.of_engine.get(id as usize) else { return };
        self.sequence += 1;
        self.queue.push(Point(time, self.sequence, *ours, value.to_bits()));
        self.held_peak = self.held_peak.max(self.queue.len());
        self.watermark = self.watermark.max(time);
        self.release(self.watermark.saturating_sub(self.lateness), interner, config);
    }

    /// Processes every sample up to the end, closes what is open, returns the anomalies.
    pub(crate) fn finish(mut self, interner: &Interner, config: &AnalyzerConfig) -> Vec<Anomaly> {
        self.release(i64::MAX, interner, config);
        for index in 0..self.series.len() {
            self.close(index, interner, config);
        }
        let min_nanos = config.apply_lag.min_seconds * 1_000_000_000;
        self.anomalies.retain(|anomaly| {
            anomaly.kind != AnomalyKind::ApplyLag
                || anomaly.end_unix_nano.saturating_sub(anomaly.start_unix_nano) >= min_nanos
        });
        self.anomalies
    }

    /// Processes the samples up to `until`, one timestamp at a time: every series first,
    /// then the detectors.
    fn release(&mut self, until: UnixNanos, interner: &Interner, config: &AnalyzerConfig) {
        let mut group: Vec<(u32, f64)> = Vec::new();
        while let Some(Point(time, _, series, bits)) = self.queue.pop_through(until) {
            group.clear();
            group.push((series, f64::from_bits(bits)));
            // Nothing earlier is left: what else comes out through `time` is at `time`.
            while let Some(Point(_, _, series, bits)) = self.queue.pop_through(time) {
                group.push((series, f64::from_bits(bits)));
            }
            // A series keeps its first point of a timestamp (as the batch grouping does).
            let mut updated: Vec<u32> = Vec::with_capacity(group.len());
            for &(series, value) in &group {
                if updated.contains(&series) {
                    continue;
                }
                updated.push(series);
                self.update(series as usize, time, value, interner);
            }
            // Shard ratios read the limits as of this timestamp.
            for &series in &updated {
                let (which, cluster, namespace, node, extra) = self.series[series as usize].key;
                if which != Which::Inflight {
                    continue;
                }
                let limit = self.current((Which::Limit, cluster, namespace, node, extra)).filter(|limit| *limit > 0.0);
                let bytes = self.series[series as usize].current.map(|(_, bytes)| bytes);
                if let (Some(limit), Some(bytes)) = (limit, bytes) {
                    let series = &mut self.series[series as usize];
                    let ratio = bytes / limit;
                    series.ratio = Some((time, ratio));
                    series.ratio_peak = Some(series.ratio_peak.map_or(ratio, |peak| peak.max(ratio)));
                }
            }
            for series in updated {
                self.step(series as usize, time, interner, config);
            }
        }
    }

    /// Records a point: the series' current value and rate, and what other series read.
    fn update(&mut self, index: usize, time: UnixNanos, raw: f64, interner: &Interner) {
        let series = &mut self.series[index];
        let value = match (series.delta, series.current) {
            (true, Some((_, total))) => total + raw,
            _ => raw,
        };
        if let Some((previous_time, previous)) = series.current {
            let seconds = time.saturating_sub(previous_time) as f64 / 1e9;
            let increase = if value >= previous { value - previous } else { value };
            series.rate = (seconds > 0.0).then(|| (time, increase / seconds));
        }
        series.current = Some((time, value));
        let (which, cluster, namespace, node, extra) = series.key;
        match which {
            Which::Committed => {
                let highest = self.committed.entry((cluster, namespace)).or_insert(f64::MIN);
                *highest = highest.max(value);
            }
            Which::Role => {
                let role = interner.get(extra).unwrap_or_default();
                let entry = self.roles.entry((cluster, node)).or_insert((i64::MIN, String::new()));
                if (time, role) > (entry.0, entry.1.as_str()) {
                    *entry = (time, role.to_string());
                }
            }
            _ => {}
        }
    }

    fn current(&self, key: Key) -> Option<f64> {
        self.index.get(&key).and_then(|index| self.series[*index as usize].current).map(|(_, value)| value)
    }

    /// One detector step at the latest point of series `index`.
    fn step(&mut self, index: usize, time: UnixNanos, interner: &Interner, config: &AnalyzerConfig) {
        let (which, cluster, namespace, node, extra) = self.series[index].key;
        match which {
            Which::Applied => self.apply_lag(index, time, interner, config),
            Which::Requeues => {
                let Some((at, rate)) = self.series[index].rate.filter(|(at, _)| *at == time) else { return };
                let processed = self
                    .index
                    .get(&(Which::ProcessingOps, cluster, namespace, node, Sym::NONE))
                    .and_then(|other| self.series[*other as usize].rate)
                    .filter(|(other_at, _)| *other_at == at)
                    .map_or(0.0, |(_, rate)| rate);
                let settings = &config.requeue_storm;
                let storming = rate >= settings.min_requeues_per_second
                    && rate >= settings.min_requeues_per_processed_call * processed.max(1.0);
                let values = [
                    self.series[index].current.map(|(_, value)| value),
                    self.current((Which::QueueOps, cluster, namespace, node, Sym::NONE)),
                    self.current((Which::ProcessingOps, cluster, namespace, node, Sym::NONE)),
                ];
                let max_dip = settings.max_dip_seconds.saturating_mul(1_000_000_000);
                self.run_step(index, at, storming, max_dip, rate, values, interner, config);
            }
            Which::Inflight => {
                let Some((_, ratio)) = self.series[index].ratio.filter(|(at, _)| *at == time) else { return };
                let limit = self.current((Which::Limit, cluster, namespace, node, extra));
                let pressed = ratio >= config.shard_pressure.yellow_ratio;
                self.run_step(index, time, pressed, 0, ratio, [limit, None, None], interner, config);
            }
            Which::Rejections => self.unfair_step(index, time, interner, config),
            _ => {}
        }
    }

    fn apply_lag(&mut self, index: usize, at: UnixNanos, interner: &Interner, config: &AnalyzerConfig) {
        let (_, cluster, namespace, node, _) = self.series[index].key;
        let Some(&committed_now) = self.committed.get(&(cluster, namespace)) else { return };
        let is_leader =
            self.roles.get(&(cluster, node)).is_some_and(|(_, role)| apply_lag::LEADER_ROLES.contains(&role.as_str()));
        let settings = &config.apply_lag;
        let series = &mut self.series[index];
        let Some((_, value)) = series.current else { return };
        if series.last_change.is_none_or(|(_, previous)| value > previous) {
            series.last_change = Some((at, value));
            series.committed_at_change = committed_now;
        }
        let (changed_at, _) = series.last_change.unwrap_or((at, value));
        let committed_then = series.committed_at_change;
        let lag = committed_now - value;
        let stalled = at.saturating_sub(changed_at) >= settings.min_seconds.saturating_mul(1_000_000_000)
            && committed_now > committed_then;
        let lagging = lag > settings.max_lag_states as f64;
        // As the batch detector: caught up once close enough and applying again.
        let caught_up = lag <= settings.caught_up_states as f64 && !stalled;
        if is_leader {
            return;
        }
        match &mut series.episode {
            None if stalled || lagging => {
                series.episode = Some(OpenEpisode {
                    episode: Episode {
                        start: if stalled { changed_at } else { at },
                        end: at,
                        max_lag: lag,
                        stalled,
                        applied_at_stall: value,
                    },
                    committed_start: if stalled { committed_then } else { committed_now },
                    committed_end: committed_now,
                });
            }
            Some(open) if caught_up => {
                open.episode.end = at;
                open.committed_end = committed_now;
                let open = series.episode.take();
                if let Some(open) = open {
                    let anomaly = episode(&series.key, &open, interner, config);
                    self.anomalies.push(anomaly);
                }
            }
            Some(open) => {
                open.episode.end = at;
                open.committed_end = committed_now;
                open.episode.max_lag = open.episode.max_lag.max(lag);
                open.episode.stalled |= stalled;
            }
            None => {}
        }
    }

    /// Extends or ends the run of series `index` (requeue storms, shard pressure).
    #[allow(clippy::too_many_arguments)]
    fn run_step(
        &mut self,
        index: usize,
        at: UnixNanos,
        holds: bool,
        max_dip: i64,
        value: f64,
        values: [Option<f64>; 3],
        interner: &Interner,
        config: &AnalyzerConfig,
    ) {
        // As `series::runs_through_dips`: a run goes on through a dip of at most `max_dip`.
        if let Some(run) = &self.series[index].run
            && !holds | run.dipped
            && at.saturating_sub(run.end) > max_dip
        {
            self.close(index, interner, config);
        }
        let series = &mut self.series[index];
        if holds {
            let run = series.run.get_or_insert(Run {
                start: at,
                end: at,
                peak: 0.0,
                at_start: values,
                at_end: values,
                dipped: false,
                dip_peak: 0.0,
            });
            run.end = at;
            run.peak = run.peak.max(value).max(run.dip_peak);
            run.at_end = values;
            run.dipped = false;
            run.dip_peak = 0.0;
        } else if let Some(run) = series.run.as_mut() {
            run.dipped = true;
            run.dip_peak = run.dip_peak.max(value);
        }
    }

    /// Ends whatever is open on series `index` and raises what it amounts to.
    fn close(&mut self, index: usize, interner: &Interner, config: &AnalyzerConfig) {
        let series = &mut self.series[index];
        let key = series.key;
        let (which, _, _, _, extra) = key;
        let scope = scope(&key, interner);
        if let Some(run) = series.run.take() {
            match which {
                Which::Requeues
                    if run.end.saturating_sub(run.start)
                        >= config.requeue_storm.min_seconds.saturating_mul(1_000_000_000) =>
                {
                    let delta = |slot: usize| run.at_end[slot].unwrap_or(0.0) - run.at_start[slot].unwrap_or(0.0);
                    self.anomalies.push(requeue_storm::storm(
                        &scope,
                        run.start,
                        run.end,
                        run.peak,
                        delta(0),
                        delta(1),
                        delta(2),
                    ));
                }
                Which::Inflight
                    if run.end.saturating_sub(run.start)
                        >= config.shard_pressure.min_seconds.saturating_mul(1_000_000_000) =>
                {
                    let role = interner.get(extra).unwrap_or_default();
                    self.anomalies.push(shard_pressure::pressure(
                        &scope,
                        role,
                        run.start,
                        run.end,
                        run.peak,
                        run.at_end[0],
                        &config.shard_pressure,
                    ));
                }
                _ => {}
            }
        }
        if let Some(open) = series.episode.take() {
            let anomaly = episode(&key, &open, interner, config);
            self.anomalies.push(anomaly);
        }
        if let Some(first) = series.unfair.first.take() {
            let unfair = std::mem::take(&mut series.unfair);
            let heaviest =
                unfair.holders.iter().max_by(|left, right| left.1.total_cmp(right.1)).map(|(shard, _)| shard.clone());
            let role = interner.get(extra).unwrap_or_default();
            self.anomalies.push(unfair_rejection::unfair_anomaly(
                &scope,
                role,
                first,
                unfair.last,
                unfair.rejected,
                heaviest,
                &config.unfair_rejection,
            ));
        }
    }

    fn unfair_step(&mut self, index: usize, time: UnixNanos, interner: &Interner, config: &AnalyzerConfig) {
        let (_, cluster, namespace, node, extra) = self.series[index].key;
        let own_key = (Which::Inflight, cluster, namespace, node, extra);
        let own_index = self.index.get(&own_key).map(|own| *own as usize);
        // The shard's highest pressure since the counter's previous point (the rejections
        // counted now happened in between), and from now on the one in force now.
        let own = own_index.and_then(|own| {
            let series = &mut self.series[own];
            std::mem::replace(&mut series.ratio_peak, series.ratio.map(|(_, ratio)| ratio))
        });
        let own_series = own_index.map(|own| &self.series[own]);
        let own_bytes = own_series.and_then(|series| series.current).map_or(0.0, |(_, bytes)| bytes);
        // The node's other shards, in the order the batch detector meets them.
        let mut others: Vec<(Option<&str>, Option<f64>)> = self
            .shards
            .get(&(cluster, node, extra))
            .into_iter()
            .flatten()
            .map(|other| &self.series[*other as usize])
            .filter(|other| other.key.2 != namespace)
            .map(|other| (interner.get(other.key.2), other.current.map(|(_, bytes)| bytes)))
            .collect();
        others.sort_by(|left, right| left.0.cmp(&right.0));
        let now = unfair_rejection::heaviest_holder(own_bytes, others.into_iter());
        let since = std::mem::replace(
            &mut self.series[index].unfair.holder,
            now.map(|(shard, share)| (shard.to_string(), share)),
        );
        let Some((at, rate)) = self.series[index].rate.filter(|(at, _)| *at == time) else { return };
        if rate <= 0.0 {
            return;
        }
        let since = since.as_ref().map(|(shard, share)| (shard.as_str(), *share));
        let holder = unfair_rejection::unfair_holder(own.unwrap_or(0.0), now, || since, &config.unfair_rejection);
        if let Some(other_shard) = holder {
            let other_shard = other_shard.to_string();
            let unfair = &mut self.series[index].unfair;
            unfair.first.get_or_insert(at);
            unfair.last = at;
            unfair.rejected += rate;
            *unfair.holders.entry(other_shard).or_default() += rate;
        }
    }
}

fn scope(key: &Key, interner: &Interner) -> Scope {
    Scope { cluster: interner.owned(key.1), namespace: interner.owned(key.2), node: interner.owned(key.3) }
}

fn episode(key: &Key, open: &OpenEpisode, interner: &Interner, config: &AnalyzerConfig) -> Anomaly {
    let rate = apply_lag::commit_rate(Some(open.committed_start), Some(open.committed_end), &open.episode);
    apply_lag::episode_anomaly(&scope(key, interner), &open.episode, rate, config.apply_lag.min_seconds)
}
