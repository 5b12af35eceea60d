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
#[derive(Debug, Default)]
pub struct SeriesIndex {
    series: Vec<Indexed>,
}

/// One series' samples, as the input gave them.
#[derive(Debug)]
struct Indexed {
    key: Arc<SeriesKey>,
    /// Its numeric samples, in the input's order: (time, value).
    points: Points,
    /// Each point's position in the input.
    positions: Vec<usize>,
    /// Whether its last numeric sample was of a delta counter.
    delta: bool,
    /// The latest time of any of its samples, numeric or not.
    latest: i64,
}

impl SeriesIndex {
    /// Groups `samples` by series (the `Arc` they share; copies of a key under another `Arc`
    /// are grouped apart and merged by [`SeriesIndex::series_of`] like any two series).
    pub fn of(samples: &[Sample]) -> Self {
        // Each sample's series first, counted: the points then go into vectors of their
        // final size (grown sample by sample, their reallocations were most of the cost).
        let mut at: FxHashMap<*const SeriesKey, usize> = FxHashMap::default();
        let mut counts: Vec<usize> = Vec::new();
        let indexes: Vec<usize> = samples
            .iter()
            .map(|sample| {
                let index = *at.entry(Arc::as_ptr(&sample.series)).or_insert_with(|| {
                    counts.push(0);
                    counts.len() - 1
                });
                counts[index] += 1;
                index
            })
            .collect();
        let mut series: Vec<Indexed> = Vec::with_capacity(counts.len());
        for (position, (sample, index)) in samples.iter().zip(indexes).enumerate() {
            if index == series.len() {
                series.push(Indexed {
                    key: sample.series.clone(),
                    points: Points::with_capacity(counts[index]),
                    positions: Vec::with_capacity(counts[index]),
                    delta: false,
                    latest: i64::MIN,
                });
            }
            let indexed = &mut series[index];
            indexed.latest = indexed.latest.max(sample.time_unix_nano);
            let Some(value) = sample.value.as_number() else { continue };
            indexed.points.push((sample.time_unix_nano, value));
            indexed.positions.push(position);
            indexed.delta = sample.meta.kind == MetricKind::DeltaCounter;
        }
        Self { series }
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
                    [one] => (one.delta, one.points.clone()),
                    many => {
                        // Back in the input's order, so that the first of a time stays first.
                        let mut merged: Vec<(usize, (i64, f64))> = many
                            .iter()
                            .flat_map(|series| series.positions.iter().copied().zip(series.points.iter().copied()))
                            .collect();
                        merged.sort_unstable_by_key(|(position, _)| *position);
                        let last =
                            many.iter().max_by_key(|series| series.positions.last()).is_some_and(|series| series.delta);
                        (last, merged.into_iter().map(|(_, point)| point).collect())
                    }
                };
                finish(key, delta, points)
            })
            .collect()
    }

    /// Each series of metric `name` that has numeric points, with them, in the input's order.
    pub fn numeric(&self, name: &str) -> impl Iterator<Item = (&SeriesKey, &Points)> {
        self.with_numbers(name).map(|series| (&*series.key, &series.points))
    }

    /// The series of metric `name` that have numeric points (those the others leave out).
    fn with_numbers(&self, name: &str) -> impl Iterator<Item = &Indexed> {
        self.series.iter().filter(move |series| series.key.name == name && !series.points.is_empty())
    }

    /// Each series with the latest time of its samples.
    pub fn latest(&self) -> impl Iterator<Item = (&SeriesKey, i64)> {
        self.series.iter().map(|series| (&*series.key, series.latest))
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
