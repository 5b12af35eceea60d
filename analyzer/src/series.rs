//! Metric samples grouped into series, for the detectors that read metrics.

use std::collections::BTreeMap;
use std::sync::Arc;

use lagscope_model::conventions::{CLUSTER, NAMESPACE, NODE_ID};
use lagscope_model::{MetricKind, Sample, SeriesKey};
use rustc_hash::FxHashMap;
use smallvec::SmallVec;

/// Where a series belongs: (cluster, namespace, node).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Scope {
    pub cluster: Option<String>,
    pub namespace: Option<String>,
    pub node: Option<String>,
}

/// The points of one series, oldest first: (time, value).
pub type Points = Vec<(i64, f64)>;

/// A window's samples grouped once into their series: the detectors and `enrich` take the
/// series of one metric at a time, a dozen times a pass over the same samples, and a scope's
/// window holds some 25 000 of them (15 minutes of a few dozen series), while it has a few
/// dozen series. Grouping by series first, each lookup touches the series of its metric only.
///
/// An index can follow its samples as they change at either end ([`IndexedSamples`]): the
/// live analyzer's held scopes drop their oldest samples and take new ones every pass, and
/// grouping the whole window again each pass was a fifth of a scope pass.
///
/// Invariant: an index of samples equals [`SeriesIndex::of`] those samples, however it came
/// to be (`==` compares what the index tells, its series in the order of their first sample).
#[derive(Debug, Default)]
pub struct SeriesIndex {
    /// In the order of their first sample.
    series: Vec<Indexed>,
    /// Each series' place in `series`, by its key's address (the `Arc` its samples share).
    at: FxHashMap<usize, usize>,
    /// Positions are kept as given (`offset` plus the sample's place when it was indexed),
    /// so that letting the oldest samples go renumbers none: a sample's place now is its
    /// position minus `offset`.
    offset: usize,
    /// How many samples are indexed.
    len: usize,
}

/// One series' samples, as the input gave them.
#[derive(Debug)]
struct Indexed {
    key: Arc<SeriesKey>,
    /// Its numeric samples, in the input's order: (time, value); those before `first_point`
    /// were let go.
    points: Points,
    /// Each point's position, and whether its sample was of a delta counter.
    point_at: Vec<(usize, bool)>,
    first_point: usize,
    /// Every sample's position and time, numeric or not; those before `first` were let go.
    every: Vec<(usize, i64)>,
    first: usize,
    /// The times in `every` never went down (its latest is its last).
    in_time_order: bool,
}

impl Indexed {
    fn points(&self) -> &[(i64, f64)] {
        &self.points[self.first_point..]
    }

    fn point_at(&self) -> &[(usize, bool)] {
        &self.point_at[self.first_point..]
    }

    fn every(&self) -> &[(usize, i64)] {
        &self.every[self.first..]
    }

    /// Whether its last numeric sample was of a delta counter.
    fn delta(&self) -> bool {
        self.point_at().last().is_some_and(|(_, delta)| *delta)
    }

    /// The latest time of any of its samples, numeric or not.
    fn latest(&self) -> i64 {
        match self.every() {
            [.., (_, last)] if self.in_time_order => *last,
            every => every.iter().map(|(_, time)| *time).max().unwrap_or(i64::MIN),
        }
    }

    /// Keeps the samples before position `end`.
    fn truncate(&mut self, end: usize) {
        let kept = self.first + self.every().partition_point(|(position, _)| *position < end);
        self.every.truncate(kept);
        let kept = self.first_point + self.point_at().partition_point(|(position, _)| *position < end);
        self.points.truncate(kept);
        self.point_at.truncate(kept);
    }

    /// Lets the samples before position `start` go (moved out only once they are half of
    /// what is kept, so that letting a few go each pass does not move the rest each time).
    fn let_go_before(&mut self, start: usize) {
        self.first += self.every().partition_point(|(position, _)| *position < start);
        self.first_point += self.point_at().partition_point(|(position, _)| *position < start);
        if self.first * 2 > self.every.len() {
            self.every.drain(..self.first);
            self.first = 0;
        }
        if self.first_point * 2 > self.points.len() {
            self.points.drain(..self.first_point);
            self.point_at.drain(..self.first_point);
            self.first_point = 0;
        }
    }

    /// What it tells, positions as places counted from `offset`.
    #[allow(clippy::type_complexity)]
    fn told(&self, offset: usize) -> (&Arc<SeriesKey>, &[(i64, f64)], Vec<(usize, bool)>, Vec<(usize, i64)>) {
        let point_at = self.point_at().iter().map(|(position, delta)| (position - offset, *delta)).collect();
        let every = self.every().iter().map(|(position, time)| (position - offset, *time)).collect();
        (&self.key, self.points(), point_at, every)
    }
}

impl PartialEq for SeriesIndex {
    /// The same series (the same `Arc`s) in the same order, with the same samples at the same
    /// places. (Points that are not a number are equal to nothing, as in `Sample`'s `==`.)
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len
            && self.series.len() == other.series.len()
            && self.series.iter().zip(&other.series).all(|(left, right)| {
                let (left, right) = (left.told(self.offset), right.told(other.offset));
                Arc::ptr_eq(left.0, right.0) && left.1 == right.1 && left.2 == right.2 && left.3 == right.3
            })
    }
}

impl SeriesIndex {
    /// Groups `samples` by series (the `Arc` they share; copies of a key under another `Arc`
    /// are grouped apart and merged by [`SeriesIndex::series_of`] like any two series).
    pub fn of(samples: &[Sample]) -> Self {
        let mut index = Self::default();
        index.extend(samples);
        index
    }

    /// Indexes `samples`, which follow the samples indexed.
    fn extend(&mut self, samples: &[Sample]) {
        // Each sample's series first, counted: the points then go into vectors grown once to
        // their final size (grown sample by sample, their reallocations were most of the cost).
        let mut counts: Vec<(usize, usize)> = vec![(0, 0); self.series.len()];
        let places: Vec<usize> = samples
            .iter()
            .map(|sample| {
                let place = *self.at.entry(Arc::as_ptr(&sample.series) as usize).or_insert_with(|| {
                    self.series.push(Indexed {
                        key: sample.series.clone(),
                        points: Points::new(),
                        point_at: Vec::new(),
                        first_point: 0,
                        every: Vec::new(),
                        first: 0,
                        in_time_order: true,
                    });
                    counts.push((0, 0));
                    self.series.len() - 1
                });
                counts[place].0 += 1;
                counts[place].1 += usize::from(sample.value.as_number().is_some());
                place
            })
            .collect();
        for (series, (every, numbers)) in self.series.iter_mut().zip(counts) {
            series.every.reserve(every);
            series.points.reserve(numbers);
            series.point_at.reserve(numbers);
        }
        let start = self.offset + self.len;
        for (position, (sample, place)) in (start..).zip(samples.iter().zip(places)) {
            let series = &mut self.series[place];
            let time = sample.time_unix_nano;
            if series.every.last().is_some_and(|(_, last)| *last > time) {
                series.in_time_order = false;
            }
            series.every.push((position, time));
            let Some(value) = sample.value.as_number() else { continue };
            series.points.push((time, value));
            series.point_at.push((position, sample.meta.kind == MetricKind::DeltaCounter));
        }
        self.len += samples.len();
    }

    /// Keeps the first `len` samples indexed.
    fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        let end = self.offset + len;
        for series in &mut self.series {
            series.truncate(end);
        }
        self.len = len;
        self.forget_empty_series();
    }

    /// Lets the first `count` samples indexed go.
    fn let_go_first(&mut self, count: usize) {
        let count = count.min(self.len);
        if count == 0 {
            return;
        }
        self.offset += count;
        self.len -= count;
        for series in &mut self.series {
            series.let_go_before(self.offset);
        }
        self.forget_empty_series();
        // A series comes where its first sample now is.
        if !self.series.is_sorted_by_key(|series| series.every()[0].0) {
            self.series.sort_by_key(|series| series.every()[0].0);
            self.place_series();
        }
    }

    /// Drops the series with no sample left.
    fn forget_empty_series(&mut self) {
        if self.series.iter().any(|series| series.every().is_empty()) {
            self.series.retain(|series| !series.every().is_empty());
            self.place_series();
        }
    }

    /// Notes where each series is.
    fn place_series(&mut self) {
        self.at =
            self.series.iter().enumerate().map(|(place, series)| (Arc::as_ptr(&series.key) as usize, place)).collect();
    }

    /// Every series of metric `name`, keyed by its scope plus the extra labels asked for,
    /// numeric points only, sorted by time (of points at the same time, the first given).
    /// Delta counters are accumulated into running totals. Series that share a key are one;
    /// whether it is a delta counter is its last sample's say.
    pub fn series_of(&self, name: &str, extra_labels: &[&str]) -> BTreeMap<(Scope, Vec<String>), Points> {
        // Grouped by borrowed labels (cluster, namespace, node, extra labels; ordered as the
        // owned keys are): one owned key per series.
        let mut grouped: BTreeMap<BorrowedKey, SmallVec<[&Indexed; 1]>> = BTreeMap::new();
        for series in self.with_numbers(name) {
            let labels = &series.key;
            let extra = extra_labels.iter().map(|label| labels.label(label).unwrap_or_default()).collect();
            grouped
                .entry((labels.label(CLUSTER), labels.label(NAMESPACE), labels.label(NODE_ID), extra))
                .or_default()
                .push(series);
        }
        grouped
            .into_iter()
            .map(|(key, members)| {
                let (delta, points) = match members.as_slice() {
                    [one] => (one.delta(), one.points().to_vec()),
                    many => {
                        // Back in the input's order, so that the first of a time stays first.
                        let mut merged: Vec<(usize, (i64, f64))> = many
                            .iter()
                            .flat_map(|series| {
                                series
                                    .point_at()
                                    .iter()
                                    .map(|(position, _)| *position)
                                    .zip(series.points().iter().copied())
                            })
                            .collect();
                        merged.sort_unstable_by_key(|(position, _)| *position);
                        let last = many
                            .iter()
                            .max_by_key(|series| series.point_at().last().map(|(position, _)| *position))
                            .is_some_and(|series| series.delta());
                        (last, merged.into_iter().map(|(_, point)| point).collect())
                    }
                };
                finish(key, delta, points)
            })
            .collect()
    }

    /// Each series of metric `name` that has numeric points, with them, in the input's order.
    pub fn numeric(&self, name: &str) -> impl Iterator<Item = (&SeriesKey, &[(i64, f64)])> {
        self.with_numbers(name).map(|series| (&*series.key, series.points()))
    }

    /// The series of metric `name` that have numeric points (those the others leave out).
    fn with_numbers(&self, name: &str) -> impl Iterator<Item = &Indexed> {
        self.series.iter().filter(move |series| series.key.name == name && !series.points().is_empty())
    }

    /// Each series with the latest time of its samples.
    pub fn latest(&self) -> impl Iterator<Item = (&SeriesKey, i64)> {
        self.series.iter().map(|series| (&*series.key, series.latest()))
    }
}

/// Samples and their [`SeriesIndex`], kept together: changed only at either end, through
/// methods that change the index as they change the samples, so that it stays what
/// [`SeriesIndex::of`] the samples would build.
#[derive(Debug, Default, PartialEq)]
pub struct IndexedSamples {
    samples: Vec<Sample>,
    index: SeriesIndex,
}

impl From<Vec<Sample>> for IndexedSamples {
    fn from(samples: Vec<Sample>) -> Self {
        let index = SeriesIndex::of(&samples);
        Self { samples, index }
    }
}

impl IndexedSamples {
    pub fn samples(&self) -> &[Sample] {
        &self.samples
    }

    pub(crate) fn index(&self) -> &SeriesIndex {
        &self.index
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// Keeps the first `len` samples.
    pub fn truncate(&mut self, len: usize) {
        self.samples.truncate(len);
        self.index.truncate(len);
    }

    /// Adds `samples` after the others.
    pub fn extend(&mut self, samples: impl IntoIterator<Item = Sample>) {
        let from = self.samples.len();
        self.samples.extend(samples);
        self.index.extend(&self.samples[from..]);
    }

    /// Lets the first `count` samples go.
    pub fn let_go_first(&mut self, count: usize) {
        let count = count.min(self.samples.len());
        self.samples.drain(..count);
        self.index.let_go_first(count);
    }

    /// Changes the samples in place as `edit` does (their series, their values), then
    /// indexes them again whole.
    pub fn rewrite(&mut self, edit: impl FnOnce(&mut [Sample])) {
        edit(&mut self.samples);
        self.index = SeriesIndex::of(&self.samples);
    }
}

/// Series labels borrowed from its samples: cluster, namespace, node, the extra labels asked
/// for (ordered as the owned keys are).
type BorrowedKey<'a> = (Option<&'a str>, Option<&'a str>, Option<&'a str>, SmallVec<[&'a str; 2]>);

/// A series' key owned, and its points (in the order given) sorted by time, the first of a
/// time kept, a delta counter's summed into running totals.
fn finish(key: BorrowedKey<'_>, delta: bool, mut points: Points) -> ((Scope, Vec<String>), Points) {
    let (cluster, namespace, node, extra) = key;
    points.sort_by_key(|(time, _)| *time);
    points.dedup_by_key(|(time, _)| *time);
    if delta {
        let mut total = 0.0;
        for point in points.iter_mut() {
            total += point.1;
            point.1 = total;
        }
    }
    let scope = Scope {
        cluster: cluster.map(str::to_string),
        namespace: namespace.map(str::to_string),
        node: node.map(str::to_string),
    };
    ((scope, extra.into_iter().map(str::to_string).collect()), points)
}

/// The latest value at or before `at`.
pub fn value_at(points: &[(i64, f64)], at: i64) -> Option<f64> {
    let index = points.partition_point(|(time, _)| *time <= at);
    index.checked_sub(1).map(|index| points[index].1)
}

/// Per-second rates of a cumulative counter between consecutive points (resets count from 0).
pub fn rates(points: &[(i64, f64)]) -> Vec<(i64, f64)> {
    interval_rates(points).map(|(_, time, rate)| (time, rate)).collect()
}

/// As [`rates`], each with the interval it was measured over: (previous point's time, time,
/// per-second rate). What the counter counted happened somewhere in that interval.
pub fn interval_rates(points: &[(i64, f64)]) -> impl Iterator<Item = (i64, i64, f64)> + '_ {
    points.windows(2).zip(increases(points)).filter_map(|(pair, (time, increase))| {
        let seconds = (time - pair[0].0) as f64 / 1e9;
        (seconds > 0.0).then(|| (pair[0].0, time, increase / seconds))
    })
}

/// The highest value a sampled series held over `(from, to]`: the value in force at `from`
/// and every point after it, up to `to`.
pub fn peak_over(points: &[(i64, f64)], from: i64, to: i64) -> Option<f64> {
    let after = points.partition_point(|(time, _)| *time <= from);
    let through = points.partition_point(|(time, _)| *time <= to);
    let within = points[after..through].iter().map(|(_, value)| *value);
    value_at(points, from).into_iter().chain(within).reduce(f64::max)
}

/// How much a cumulative counter grew between consecutive points, at the later point's time
/// (a reset counts from 0).
pub fn increases(points: &[(i64, f64)]) -> impl Iterator<Item = (i64, f64)> + '_ {
    points.windows(2).map(|pair| {
        let ((_, previous), (time, value)) = (pair[0], pair[1]);
        (time, if value >= previous { value - previous } else { value })
    })
}

/// Maximal runs of consecutive points for which `condition` holds, as (first, last) times,
/// kept when they last at least `min_nanos`.
pub fn runs(points: &[(i64, f64)], min_nanos: i64, condition: impl Fn(i64, f64) -> bool) -> Vec<(i64, i64)> {
    runs_through_dips(points, min_nanos, 0, condition)
}

/// As [`runs`], a run going on through points that fail `condition` as long as they lie no
/// more than `max_dip_nanos` after the run's latest point that held (0: any such point ends
/// it). A run is (its first, its latest point that held).
pub fn runs_through_dips(
    points: &[(i64, f64)],
    min_nanos: i64,
    max_dip_nanos: i64,
    condition: impl Fn(i64, f64) -> bool,
) -> Vec<(i64, i64)> {
    let mut result = Vec::new();
    let mut current: Option<(i64, i64)> = None;
    let mut dipped = false;
    for &(time, value) in points {
        let holds = condition(time, value);
        if let Some(run) = current
            && !holds | dipped
            && time - run.1 > max_dip_nanos
        {
            result.push(run);
            current = None;
        }
        if holds {
            let run = current.get_or_insert((time, time));
            run.1 = time;
            dipped = false;
        } else {
            dipped = current.is_some();
        }
    }
    result.extend(current);
    result.retain(|(start, end)| end - start >= min_nanos);
    result
}

#[cfg(test)]
/// [`SeriesIndex::series_of`] as first written, sample by sample: the reference it must
/// agree with. Every series of metric `name`, keyed by its scope plus the extra labels asked for,
/// numeric points only, sorted by time. Delta counters are accumulated into running totals.
pub(crate) fn series_of_samples(
    samples: &[Sample],
    name: &str,
    extra_labels: &[&str],
) -> BTreeMap<(Scope, Vec<String>), Points> {
    // Grouped by borrowed labels (cluster, namespace, node, extra labels; ordered as the owned
    // keys are): one owned key per series, not per sample. Whether a series is a delta
    // counter is its last sample's say.
    let mut grouped: BTreeMap<BorrowedKey, (bool, Points)> = BTreeMap::new();
    for sample in samples.iter().filter(|sample| sample.series.name == name) {
        let Some(value) = sample.value.as_number() else { continue };
        let labels = &sample.series;
        let extra = extra_labels.iter().map(|label| labels.label(label).unwrap_or_default()).collect();
        let (delta, points) =
            grouped.entry((labels.label(CLUSTER), labels.label(NAMESPACE), labels.label(NODE_ID), extra)).or_default();
        *delta = sample.meta.kind == MetricKind::DeltaCounter;
        points.push((sample.time_unix_nano, value));
    }
    grouped.into_iter().map(|(key, (delta, points))| finish(key, delta, points)).collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use lagscope_model::{PointValue, SeriesKey, SeriesMeta};

    use super::*;
    use crate::testing::Random;

    fn sample(name: &str, labels: &[(&str, &str)], kind: MetricKind, at: i64, value: PointValue) -> Sample {
        Sample {
            series: Arc::new(SeriesKey {
                name: name.to_string(),
                labels: labels.iter().map(|(key, value)| (key.to_string(), value.to_string())).collect(),
            }),
            meta: Arc::new(SeriesMeta { kind, unit: None, description: None }),
            time_unix_nano: at,
            start_time_unix_nano: None,
            value,
        }
    }

    /// Series keyed by scope and the extra labels asked for, in key order; points sorted by
    /// time, one per time (the first sent); delta counters summed; other metrics and
    /// distributions left out.
    #[test]
    fn samples_group_into_series() {
        use MetricKind::{DeltaCounter, Gauge};
        let number = PointValue::Number;
        let a = [(CLUSTER, "prod"), (NAMESPACE, "ns1"), (NODE_ID, "nn-a")];
        let b_x = [(CLUSTER, "prod"), (NODE_ID, "nn-b"), ("role", "x")];
        let b_y = [(CLUSTER, "prod"), (NODE_ID, "nn-b"), ("role", "y")];
        let lone = [("role", "x")];
        let samples = vec![
            sample("m", &a, Gauge, 3, number(30.0)),
            sample("m", &b_y, DeltaCounter, 2, number(5.0)),
            sample("m", &a, Gauge, 1, number(10.0)),
            sample("other", &a, Gauge, 1, number(99.0)),
            sample("m", &b_y, DeltaCounter, 1, number(1.0)),
            sample("m", &a, Gauge, 1, number(11.0)),
            sample("m", &b_x, Gauge, 4, number(4.0)),
            sample("m", &lone, Gauge, 7, number(7.0)),
            sample("m", &a, Gauge, 5, PointValue::Distribution(Default::default())),
        ];
        let scope = |cluster: Option<&str>, namespace: Option<&str>, node: Option<&str>| Scope {
            cluster: cluster.map(str::to_string),
            namespace: namespace.map(str::to_string),
            node: node.map(str::to_string),
        };
        let labels = |values: &[&str]| values.iter().map(|value| value.to_string()).collect::<Vec<_>>();
        let expected: Vec<((Scope, Vec<String>), Points)> = vec![
            ((scope(None, None, None), labels(&["x"])), vec![(7, 7.0)]),
            ((scope(Some("prod"), None, Some("nn-b")), labels(&["x"])), vec![(4, 4.0)]),
            ((scope(Some("prod"), None, Some("nn-b")), labels(&["y"])), vec![(1, 1.0), (2, 6.0)]),
            ((scope(Some("prod"), Some("ns1"), Some("nn-a")), labels(&[""])), vec![(1, 10.0), (3, 30.0)]),
        ];
        let index = SeriesIndex::of(&samples);
        assert_eq!(index.series_of("m", &["role"]).into_iter().collect::<Vec<_>>(), expected);
        assert_eq!(series_of_samples(&samples, "m", &["role"]).into_iter().collect::<Vec<_>>(), expected);
        // Without the extra label, nn-b's two series are one; its last sample, a gauge, says it is not summed.
        let merged = index.series_of("m", &[]);
        assert_eq!(merged, series_of_samples(&samples, "m", &[]));
        assert_eq!(merged.len(), 3);
        assert_eq!(merged[&(scope(Some("prod"), None, Some("nn-b")), Vec::new())], vec![(1, 1.0), (2, 5.0), (4, 4.0)]);
    }

    /// Grouped by series first, the series of a metric are what looking at every sample
    /// finds: over series that share a key (labels the key leaves out, or the same labels under
    /// another `Arc`), points at the same time, delta counters and gauges under one key,
    /// values that are not numbers, and samples in any order.
    #[test]
    fn the_index_finds_what_every_sample_finds() {
        use MetricKind::{DeltaCounter, Gauge};
        let mut random = Random(0x9e37_79b9_7f4a_7c15);
        let names = ["m", "n"];
        let (clusters, nodes, roles, others) = (["c1", "c2"], ["a", "b", ""], ["x", "y", ""], ["1", "2"]);
        for case in 0..300 {
            // A pool of series, some keys under two `Arc`s.
            let mut pool: Vec<(Arc<SeriesKey>, MetricKind)> = Vec::new();
            for _ in 0..1 + random.below(12) {
                let mut labels = Vec::new();
                let mut add = |key: &'static str, values: &[&'static str], random: &mut Random| {
                    let value = values[random.below(values.len() as u64) as usize];
                    if !value.is_empty() {
                        labels.push((key, value));
                    }
                };
                add(CLUSTER, &clusters, &mut random);
                add(NODE_ID, &nodes, &mut random);
                add("role", &roles, &mut random);
                add("other", &others, &mut random);
                if random.below(2) == 0 {
                    labels.push((NAMESPACE, "ns1"));
                }
                let name = names[random.below(2) as usize];
                let kind = if random.below(3) == 0 { DeltaCounter } else { Gauge };
                let key = sample(name, &labels, kind, 0, PointValue::Number(0.0)).series;
                if random.below(4) == 0 {
                    pool.push((Arc::new((*key).clone()), if random.below(2) == 0 { DeltaCounter } else { kind }));
                }
                pool.push((key, kind));
            }
            let samples: Vec<Sample> = (0..random.below(200))
                .map(|_| {
                    let (series, kind) = &pool[random.below(pool.len() as u64) as usize];
                    let value = if random.below(20) == 0 {
                        PointValue::Distribution(Default::default())
                    } else {
                        PointValue::Number(random.below(1000) as f64)
                    };
                    Sample {
                        series: series.clone(),
                        meta: Arc::new(SeriesMeta { kind: *kind, unit: None, description: None }),
                        time_unix_nano: random.below(40) as i64,
                        start_time_unix_nano: None,
                        value,
                    }
                })
                .collect();
            let index = SeriesIndex::of(&samples);
            for name in names {
                for extra in [&[][..], &["role"][..], &["role", "other"][..]] {
                    assert_eq!(
                        index.series_of(name, extra),
                        series_of_samples(&samples, name, extra),
                        "case {case}, {name}, {extra:?}"
                    );
                }
            }
        }
    }

    /// An index that follows its samples as they change at either end (the oldest let go,
    /// the newest replaced, more added, some rewritten in place) is at every step what
    /// indexing the samples anew builds, and finds the same series: over series that vanish
    /// and come back, keys under two `Arc`s, values that are not numbers, delta counters and
    /// gauges under one key, and times mostly but not always in order.
    #[test]
    fn an_index_that_follows_its_samples_is_their_index() {
        use MetricKind::{DeltaCounter, Gauge};
        let mut random = Random(0x2545_f491_4f6c_dd1d);
        let (mut steps, mut let_go, mut truncated, mut unsorted) = (0, 0, 0, 0);
        for case in 0..200 {
            let mut pool: Vec<(Arc<SeriesKey>, MetricKind)> = Vec::new();
            for series in 0..1 + random.below(8) {
                let node = ["a", "b", "c"][random.below(3) as usize];
                let name = ["m", "n"][random.below(2) as usize];
                let kind = if random.below(3) == 0 { DeltaCounter } else { Gauge };
                let labels = [
                    (CLUSTER, "c1"),
                    (NODE_ID, node),
                    ("n", ["1", "2", "3", "4", "5", "6", "7", "8"][series as usize]),
                ];
                let key = sample(name, &labels, kind, 0, PointValue::Number(0.0)).series;
                if random.below(4) == 0 {
                    // The same key under another `Arc`; as often a gauge as its twin's kind.
                    pool.push((Arc::new((*key).clone()), if random.below(2) == 0 { Gauge } else { kind }));
                }
                pool.push((key, kind));
            }
            let mut time = 0_i64;
            let mut next = |random: &mut Random| {
                let (series, kind) = &pool[random.below(pool.len() as u64) as usize];
                time += random.below(3) as i64;
                let at = if random.below(15) == 0 { time - random.below(10) as i64 } else { time };
                let value = if random.below(15) == 0 {
                    PointValue::Distribution(Default::default())
                } else {
                    PointValue::Number(random.below(1000) as f64)
                };
                let kind = if random.below(20) == 0 { Gauge } else { *kind };
                Sample {
                    series: series.clone(),
                    meta: Arc::new(SeriesMeta { kind, unit: None, description: None }),
                    time_unix_nano: at,
                    start_time_unix_nano: None,
                    value,
                }
            };
            let mut indexed = IndexedSamples::default();
            for step in 0..60 {
                match random.below(8) {
                    0 | 1 => {
                        let count = random.below(indexed.len() as u64 / 2 + 2) as usize;
                        let_go += usize::from(count > 0 && !indexed.is_empty());
                        indexed.let_go_first(count);
                    }
                    2 => {
                        let len = indexed.len().saturating_sub(random.below(8) as usize);
                        truncated += usize::from(len < indexed.len());
                        indexed.truncate(len);
                    }
                    3 if !indexed.is_empty() => {
                        let at = random.below(indexed.len() as u64) as usize;
                        let replacement = next(&mut random);
                        indexed.rewrite(|samples| samples[at].series = replacement.series);
                    }
                    _ => {
                        let added: Vec<Sample> = (0..random.below(30)).map(|_| next(&mut random)).collect();
                        indexed.extend(added);
                    }
                }
                steps += 1;
                let anew = IndexedSamples::from(indexed.samples().to_vec());
                assert!(indexed == anew, "case {case}, step {step}: {:#?}\nagainst {:#?}", indexed.index, anew.index);
                unsorted += usize::from(indexed.index.series.iter().any(|series| !series.in_time_order));
                for name in ["m", "n"] {
                    for extra in [&[][..], &["n"][..]] {
                        assert_eq!(
                            indexed.index.series_of(name, extra),
                            series_of_samples(indexed.samples(), name, extra)
                        );
                    }
                    let numeric: Vec<_> = indexed.index.numeric(name).collect();
                    assert_eq!(numeric, anew.index.numeric(name).collect::<Vec<_>>());
                }
                // Each series' latest time, sample by sample, in the order of its first sample.
                let mut expected: Vec<(&SeriesKey, i64)> = Vec::new();
                let mut places: Vec<*const SeriesKey> = Vec::new();
                for sample in indexed.samples() {
                    match places.iter().position(|place| *place == Arc::as_ptr(&sample.series)) {
                        Some(place) => expected[place].1 = expected[place].1.max(sample.time_unix_nano),
                        None => {
                            places.push(Arc::as_ptr(&sample.series));
                            expected.push((&sample.series, sample.time_unix_nano));
                        }
                    }
                }
                assert_eq!(indexed.index.latest().collect::<Vec<_>>(), expected, "case {case}, step {step}");
            }
        }
        assert!(
            let_go > 1_000 && truncated > 1_000 && unsorted > 1_000,
            "{let_go} let go, {truncated} truncated, {unsorted} unsorted of {steps}"
        );
    }

    #[test]
    fn rates_and_runs() {
        let points = vec![(0, 0.0), (1_000_000_000, 10.0), (2_000_000_000, 30.0), (3_000_000_000, 5.0)];
        assert_eq!(rates(&points), vec![(1_000_000_000, 10.0), (2_000_000_000, 20.0), (3_000_000_000, 5.0)]);
        assert_eq!(value_at(&points, 1_500_000_000), Some(10.0));
        assert_eq!(value_at(&points, -1), None);
        let high = runs(&rates(&points), 500_000_000, |_, rate| rate >= 10.0);
        assert_eq!(high, vec![(1_000_000_000, 2_000_000_000)]);
        // High at 0-2 s and 4-5 s, low at 3 s (a dip of 2 s after the last high) and 6-9 s.
        let second = 1_000_000_000;
        let dipping: Vec<(i64, f64)> = [9.0, 9.0, 9.0, 1.0, 9.0, 9.0, 1.0, 1.0, 1.0, 1.0]
            .iter()
            .enumerate()
            .map(|(at, v)| (at as i64 * second, *v))
            .collect();
        assert_eq!(runs_through_dips(&dipping, 0, 2 * second, |_, v| v > 5.0), vec![(0, 5 * second)]);
        assert_eq!(
            runs_through_dips(&dipping, 0, second, |_, v| v > 5.0),
            vec![(0, 2 * second), (4 * second, 5 * second)]
        );
        assert_eq!(runs_through_dips(&dipping, 0, 0, |_, v| v > 5.0), runs(&dipping, 0, |_, v| v > 5.0));
        let intervals: Vec<_> = interval_rates(&points).collect();
        assert_eq!(intervals[1], (1_000_000_000, 2_000_000_000, 20.0));
        // In force at the start (10 from 1 s), then 30 at 2 s; 5 at 3 s is past the end.
        assert_eq!(peak_over(&points, 1_500_000_000, 2_500_000_000), Some(30.0));
        assert_eq!(peak_over(&points, 2_000_000_000, 2_500_000_000), Some(30.0));
        assert_eq!(peak_over(&points, 2_000_000_000, 3_000_000_000), Some(30.0));
        assert_eq!(peak_over(&points, -2, -1), None);
        assert_eq!(peak_over(&points, -1, 0), Some(0.0));
    }
}
