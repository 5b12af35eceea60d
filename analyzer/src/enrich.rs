//! Adds to each attempt what the metrics said at that moment: the executing node's reported
//! role and applied state, and the namespace's committed state.

use lagscope_model::ClientTimeline;
use lagscope_model::Sample;
use lagscope_model::conventions::{METRIC_APPLIED_STATE, METRIC_COMMITTED_STATE, METRIC_ROLE, NODE_ROLE};

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use crate::committed::NamespaceKey;
use crate::series::{Points, Scope, SeriesIndex, value_at};

/// Fills `reported` on every attempt from `samples` (nothing changes without samples).
///
/// The live analyzer runs this over every held timeline on every pass (tens of thousands of
/// attempts in a busy scope): a node's series are looked up once for each run of a timeline's
/// attempts it served, not once per attempt, and the lookups hash with Fx.
pub fn enrich(timelines: &mut [ClientTimeline], samples: &[Sample]) {
    if !samples.is_empty() {
        enrich_from(timelines, &SeriesIndex::of(samples));
    }
}

/// [`enrich`] from samples grouped by series already: every field of every attempt's
/// `reported` is written (`None` where the samples do not say), whatever it held before.
pub(crate) fn enrich_from(timelines: &mut [ClientTimeline], samples: &SeriesIndex) {
    let applied = samples.series_of(METRIC_APPLIED_STATE, &[]);
    let roles = samples.series_of(METRIC_ROLE, &[NODE_ROLE]);
    let committed = committed_by_namespace(samples);
    tell(timelines, (&applied, &roles, &committed), |_, _, _| true);
}

/// [`enrich_from`] for timelines told by an earlier call of it (held between passes): only
/// the attempts whose `reported` may differ from what they hold are told, those of the calls
/// that start at or after their timeline's `unenriched_from` (built again since, holding
/// nothing), and those that start where a series the attempts are told from says something
/// else than it did at the last call (`told` remembers them, and is brought up to date).
/// Returns how many attempts were told.
///
/// Invariant (tested against [`enrich_from`]): every attempt of a call that starts before
/// `unenriched_from` holds what `enrich_from` told it from the series `told` remembers.
pub(crate) fn enrich_changed(
    timelines: &mut [ClientTimeline],
    unenriched_from: &[i64],
    samples: &SeriesIndex,
    told: &mut Told,
) -> usize {
    let applied = samples.series_of(METRIC_APPLIED_STATE, &[]);
    let roles = samples.series_of(METRIC_ROLE, &[NODE_ROLE]);
    let committed = committed_by_namespace(samples);
    let changed = told.update(&applied, &roles, &committed);
    let whole = unenriched_from.len() != timelines.len();
    let mut count = 0;
    tell(timelines, (&applied, &roles, &committed), |timeline, call_start, at| {
        let wanted = whole || call_start >= unenriched_from[timeline] || changed.contains(at);
        count += usize::from(wanted);
        wanted
    });
    count
}

/// The series attempts are told from: applied states, roles, each namespace's committed states.
type Told3<'a> = (
    &'a BTreeMap<(Scope, Vec<String>), Points>,
    &'a BTreeMap<(Scope, Vec<String>), Points>,
    &'a BTreeMap<NamespaceKey, Points>,
);

/// Tells the attempts `wanted` (timeline's place, its call's start, its start) takes.
fn tell(
    timelines: &mut [ClientTimeline],
    (applied, roles, committed): Told3<'_>,
    mut wanted: impl FnMut(usize, i64, i64) -> bool,
) {
    let (applied, roles) = (by_node(applied), by_node(roles));
    let none: &[NodeSeries<'_>] = &[];
    for (place, timeline) in timelines.iter_mut().enumerate() {
        let committed = committed.get(&(timeline.cluster.clone(), timeline.namespace.clone()));
        // The series of the node that served the attempt before (a client's attempts mostly
        // go to a few nodes, one after another), its applied states those of the timeline's
        // namespace or of none.
        let mut last: Option<NodeAt<'_>> = None;
        let attempts = timeline.calls.iter_mut().flat_map(|call| {
            let start = call.start_unix_nano;
            call.attempts.iter_mut().map(move |attempt| (start, attempt))
        });
        for (call_start, attempt) in attempts {
            let at = attempt.start_unix_nano;
            if !wanted(place, call_start, at) {
                continue;
            }
            let reported = &mut attempt.reported;
            reported.namespace_committed = committed.and_then(|points| value_at(points, at)).map(|value| value as i64);
            let Some(node) = attempt.served_by.as_deref() else {
                (reported.node_applied, reported.node_role) = (None, None);
                continue;
            };
            if last.as_ref().is_none_or(|(last_node, _, _)| last_node != node) {
                let key = (timeline.cluster.as_deref(), node);
                let node_applied = applied.get(&key).map_or(none, Vec::as_slice);
                let of_namespace = node_applied
                    .iter()
                    .filter(|(scope, _, _)| scope.namespace.is_none() || scope.namespace == timeline.namespace)
                    .map(|(_, _, points)| *points)
                    .collect();
                last = Some((node.to_string(), of_namespace, roles.get(&key).map_or(none, Vec::as_slice)));
            }
            let Some((_, node_applied, node_roles)) = &last else { continue };
            reported.node_applied =
                node_applied.iter().find_map(|points| value_at(points, at)).map(|value| value as i64);
            // Held timelines keep what the last pass told them: the role is copied only when
            // it changed.
            match role_at(node_roles, at) {
                Some(role) if reported.node_role.as_deref() != Some(role.as_str()) => {
                    reported.node_role = Some(role.clone());
                }
                Some(_) => {}
                None => reported.node_role = None,
            }
        }
    }
}

/// The role a node's role series reported last at `at` (of two at one time, the greater).
fn role_at<'a>(roles: &[NodeSeries<'a>], at: i64) -> Option<&'a String> {
    roles
        .iter()
        .filter_map(|(_, labels, points)| {
            let index = points.partition_point(|(time, _)| *time <= at);
            index.checked_sub(1).map(|index| (points[index].0, &labels[0]))
        })
        .max()
        .map(|(_, role)| role)
}

/// What a node's series (`applied` states, `roles`) said at `at`: its applied state (from a
/// series of `namespace` or of none), and the role it reported last. (The reference the
/// tests hold [`enrich_from`] to.)
#[cfg(test)]
fn node_reported(
    applied: &[NodeSeries<'_>],
    roles: &[NodeSeries<'_>],
    namespace: &Option<String>,
    at: i64,
) -> (Option<i64>, Option<String>) {
    let applied = applied
        .iter()
        .filter(|(scope, _, _)| scope.namespace.is_none() || scope.namespace == *namespace)
        .find_map(|(_, _, points)| value_at(points, at))
        .map(|value| value as i64);
    (applied, role_at(roles, at).cloned())
}

/// The series [`enrich_changed`] last told attempts from, each with its points.
#[derive(Debug, Default)]
pub struct Told {
    series: Vec<(ToldKey, Points)>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum ToldKey {
    Applied(Scope, Vec<String>),
    Role(Scope, Vec<String>),
    Committed(NamespaceKey),
}

impl Told {
    /// Remembers the series given, and returns where what they say differs from what the
    /// series remembered said (a series not there says nothing).
    fn update(
        &mut self,
        applied: &BTreeMap<(Scope, Vec<String>), Points>,
        roles: &BTreeMap<(Scope, Vec<String>), Points>,
        committed: &BTreeMap<NamespaceKey, Points>,
    ) -> Ranges {
        // In key order, as the variants and the maps order them.
        let applied =
            applied.iter().map(|((scope, labels), points)| (ToldKey::Applied(scope.clone(), labels.clone()), points));
        let roles =
            roles.iter().map(|((scope, labels), points)| (ToldKey::Role(scope.clone(), labels.clone()), points));
        let committed = committed.iter().map(|(key, points)| (ToldKey::Committed(key.clone()), points));
        let now: Vec<(ToldKey, &Points)> = applied.chain(roles).chain(committed).collect();
        let mut differ = Vec::new();
        let (mut old, mut new) = (self.series.iter().peekable(), now.iter().peekable());
        loop {
            match (old.peek(), new.peek()) {
                (None, None) => break,
                (Some((old_key, old_points)), Some((new_key, new_points))) if old_key == new_key => {
                    differences(old_points, new_points, &mut differ);
                    old.next();
                    new.next();
                }
                (Some((old_key, old_points)), next) if next.is_none_or(|(new_key, _)| old_key < new_key) => {
                    differences(old_points, &[], &mut differ);
                    old.next();
                }
                (_, Some((_, new_points))) => {
                    differences(&[], new_points, &mut differ);
                    new.next();
                }
                (_, None) => unreachable!("an old series left is taken above"),
            }
        }
        self.series = now.into_iter().map(|(key, points)| (key, points.clone())).collect();
        Ranges::of(differ)
    }
}

/// Times in half-open ranges, sorted and apart (`i64::MAX` as an end: no end).
#[derive(Debug, PartialEq)]
struct Ranges(Vec<(i64, i64)>);

impl Ranges {
    fn of(mut ranges: Vec<(i64, i64)>) -> Self {
        ranges.sort_unstable();
        let mut merged: Vec<(i64, i64)> = Vec::with_capacity(ranges.len());
        for (from, until) in ranges {
            match merged.last_mut() {
                Some(last) if from <= last.1 => last.1 = last.1.max(until),
                _ => merged.push((from, until)),
            }
        }
        Self(merged)
    }

    fn contains(&self, at: i64) -> bool {
        let index = self.0.partition_point(|(from, _)| *from <= at);
        index.checked_sub(1).is_some_and(|index| at < self.0[index].1 || self.0[index].1 == i64::MAX)
    }
}

/// Adds to `differ` the times at which [`value_at`] of `old` and of `new` differ (both sorted
/// by time; of points at one time the last counts), as half-open ranges.
fn differences(old: &[(i64, f64)], new: &[(i64, f64)], differ: &mut Vec<(i64, i64)>) {
    let (mut i, mut j) = (0, 0);
    let (mut old_value, mut new_value): (Option<u64>, Option<u64>) = (None, None);
    let mut open: Option<i64> = None;
    loop {
        let next = match (old.get(i), new.get(j)) {
            (None, None) => break,
            (Some(point), None) | (None, Some(point)) => point.0,
            (Some(old), Some(new)) => old.0.min(new.0),
        };
        while let Some(point) = old.get(i).filter(|point| point.0 == next) {
            old_value = Some(point.1.to_bits());
            i += 1;
        }
        while let Some(point) = new.get(j).filter(|point| point.0 == next) {
            new_value = Some(point.1.to_bits());
            j += 1;
        }
        match (open, old_value != new_value) {
            (None, true) => open = Some(next),
            (Some(from), false) => {
                differ.push((from, next));
                open = None;
            }
            _ => {}
        }
    }
    if let Some(from) = open {
        differ.push((from, i64::MAX));
    }
}

/// Each namespace's committed states, as every node of it reported them, in time order.
fn committed_by_namespace(samples: &SeriesIndex) -> BTreeMap<NamespaceKey, Points> {
    let mut committed: BTreeMap<NamespaceKey, Points> = BTreeMap::new();
    for ((scope, _), points) in samples.series_of(METRIC_COMMITTED_STATE, &[]) {
        committed.entry((scope.cluster, scope.namespace)).or_default().extend(points);
    }
    for points in committed.values_mut() {
        points.sort_by_key(|(time, _)| *time);
    }
    committed
}

/// A node, its applied states of one namespace (or of none), and its role series.
type NodeAt<'a> = (String, SmallVec<[&'a Points; 2]>, &'a [NodeSeries<'a>]);

/// One series of a node: its scope, its extra labels, its points.
type NodeSeries<'a> = (&'a Scope, &'a Vec<String>, &'a Points);

/// Series by (cluster, node): each node's, in the order [`SeriesIndex::series_of`](crate::series::SeriesIndex::series_of) gives them.
type ByNode<'a> = FxHashMap<(Option<&'a str>, &'a str), Vec<NodeSeries<'a>>>;

fn by_node(series: &BTreeMap<(Scope, Vec<String>), Points>) -> ByNode<'_> {
    let mut by_node = ByNode::default();
    for ((scope, labels), points) in series {
        if let Some(node) = &scope.node {
            by_node.entry((scope.cluster.as_deref(), node.as_str())).or_default().push((scope, labels, points));
        }
    }
    by_node
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use lagscope_model::conventions::{CLUSTER, NAMESPACE, NODE_ID};
    use lagscope_model::{
        MetricKind, PointValue, SeriesKey, SeriesMeta, SpanRef, TimelineAttempt, TimelineCall, TimelineJoin,
    };

    use super::*;
    use crate::series::series_of_samples;
    use crate::testing::Random;

    /// `enrich` as it was written first: every attempt looks its node's series up on its own.
    /// The reference the faster version, which looks them up once per run of a node's
    /// attempts, must agree with.
    fn enrich_one_by_one(timelines: &mut [ClientTimeline], samples: &[Sample]) {
        let applied = series_of_samples(samples, METRIC_APPLIED_STATE, &[]);
        let roles = series_of_samples(samples, METRIC_ROLE, &[NODE_ROLE]);
        let committed = committed_by_namespace(&SeriesIndex::of(samples));
        let (applied_by, roles_by) = (by_node(&applied), by_node(&roles));
        for timeline in timelines.iter_mut() {
            let committed = committed.get(&(timeline.cluster.clone(), timeline.namespace.clone()));
            for attempt in timeline.calls.iter_mut().flat_map(|call| call.attempts.iter_mut()) {
                let at = attempt.start_unix_nano;
                attempt.reported.namespace_committed =
                    committed.and_then(|points| value_at(points, at)).map(|value| value as i64);
                let Some(node) = attempt.served_by.as_deref() else { continue };
                let key = (timeline.cluster.as_deref(), node);
                let node_applied = applied_by.get(&key).map(Vec::as_slice).unwrap_or_default();
                let node_roles = roles_by.get(&key).map(Vec::as_slice).unwrap_or_default();
                (attempt.reported.node_applied, attempt.reported.node_role) =
                    node_reported(node_applied, node_roles, &timeline.namespace, at);
            }
        }
    }

    fn gauge(name: &str, labels: &[(&str, &str)], at: i64, value: f64) -> Sample {
        Sample {
            series: Arc::new(SeriesKey {
                name: name.to_string(),
                labels: labels.iter().map(|(key, value)| (key.to_string(), value.to_string())).collect(),
            }),
            meta: Arc::new(SeriesMeta { kind: MetricKind::Gauge, unit: None, description: None }),
            time_unix_nano: at,
            start_time_unix_nano: None,
            value: PointValue::Number(value),
        }
    }

    fn attempt(start: i64, served_by: Option<&str>) -> TimelineAttempt {
        let span = SpanRef { trace_id: None, span_id: None, service_name: None, node_id: None };
        TimelineAttempt {
            attempt: None,
            start_unix_nano: start,
            end_unix_nano: start + 5,
            client_span: span,
            router_spans: Vec::new(),
            server_spans: Vec::new(),
            join: TimelineJoin::ClientOnly,
            target_node: None,
            target_role: None,
            router_node: None,
            served_by: served_by.map(str::to_string),
            served_role: None,
            carried: None,
            router_carried: None,
            router_state: None,
            served: None,
            returned: None,
            committed: None,
            consistency: None,
            follower_read: None,
            server_address: None,
            outcome: None,
            error_type: None,
            requeues: None,
            reported: Default::default(),
        }
    }

    /// Over random timelines (attempts served by a few nodes, in runs and alternating, some by
    /// none) and random series (applied states with and without a namespace, roles, committed
    /// states of several nodes, in two clusters and without one), every attempt is told what
    /// the one-by-one lookup tells it.
    #[test]
    fn each_attempt_is_told_what_a_lookup_of_its_own_node_tells_it() {
        let mut random = Random(0x9e37_79b9_7f4a_7c15);
        let clusters = ["c1", "c2", ""];
        let namespaces = ["ns1", "ns2", ""];
        let nodes = ["nn-a", "nn-b", "nn-c", "nn-d"];
        let mut told = 0;
        let mut before: Vec<Sample> = Vec::new();
        for _ in 0..200 {
            let mut samples = Vec::new();
            for _ in 0..random.below(40) {
                let (cluster, namespace, node) =
                    (random.pick(&clusters), random.pick(&namespaces), random.pick(&nodes));
                let mut labels = vec![(NODE_ID, node)];
                if !cluster.is_empty() {
                    labels.push((CLUSTER, cluster));
                }
                if !namespace.is_empty() {
                    labels.push((NAMESPACE, namespace));
                }
                let (at, value) = (random.below(100) as i64, random.below(1000) as f64);
                match random.below(3) {
                    0 => samples.push(gauge(METRIC_APPLIED_STATE, &labels, at, value)),
                    1 => {
                        labels.push((NODE_ROLE, random.pick(&["active", "observer", "standby"])));
                        samples.push(gauge(METRIC_ROLE, &labels, at, 1.0));
                    }
                    _ => samples.push(gauge(METRIC_COMMITTED_STATE, &labels, at, value)),
                }
            }
            let mut timelines: Vec<ClientTimeline> = (0..random.below(4))
                .map(|index| {
                    let text = |value: &str| (!value.is_empty()).then(|| value.to_string());
                    let calls = (0..random.below(12))
                        .map(|_| {
                            let attempts: Vec<TimelineAttempt> = (0..1 + random.below(3))
                                .map(|_| {
                                    let node = (random.below(5) != 0).then(|| random.pick(&nodes));
                                    attempt(random.below(110) as i64, node)
                                })
                                .collect();
                            TimelineCall {
                                call_id: None,
                                op: None,
                                rpc_method: None,
                                start_unix_nano: attempts[0].start_unix_nano,
                                end_unix_nano: attempts[0].end_unix_nano,
                                attempts,
                                floor: None,
                            }
                        })
                        .collect();
                    ClientTimeline {
                        client_id: format!("client-{index}"),
                        namespace: text(random.pick(&namespaces)),
                        cluster: text(random.pick(&clusters)),
                        system: None,
                        calls,
                    }
                })
                .collect();
            let mut expected = timelines.clone();
            enrich_one_by_one(&mut expected, &samples);
            // Held timelines come back with what the last pass told them (here, of the last
            // case's samples, every attempt served by some node): all of it is told anew.
            let mut held = timelines.clone();
            for attempt in held.iter_mut().flat_map(|timeline| &mut timeline.calls).flat_map(|call| &mut call.attempts)
            {
                let mut served = attempt.clone();
                served.served_by = Some(random.pick(&nodes).to_string());
                let mut timeline = ClientTimeline {
                    client_id: String::new(),
                    namespace: None,
                    cluster: None,
                    system: None,
                    calls: vec![TimelineCall {
                        call_id: None,
                        op: None,
                        rpc_method: None,
                        start_unix_nano: served.start_unix_nano,
                        end_unix_nano: served.end_unix_nano,
                        attempts: vec![served],
                        floor: None,
                    }],
                };
                enrich_from(std::slice::from_mut(&mut timeline), &SeriesIndex::of(&before));
                attempt.reported = timeline.calls.remove(0).attempts.remove(0).reported;
            }
            enrich_from(&mut held, &SeriesIndex::of(&samples));
            assert_eq!(held, expected, "told again");
            enrich(&mut timelines, &samples);
            assert_eq!(timelines, expected);
            before = samples;
            told += timelines
                .iter()
                .flat_map(|timeline| &timeline.calls)
                .flat_map(|call| &call.attempts)
                .filter(|attempt| attempt.reported.node_applied.is_some() || attempt.reported.node_role.is_some())
                .count();
        }
        // The cases reach the lookups (not only attempts no series speaks of).
        assert!(told > 500, "only {told} attempts were told a node's applied state or role");
    }

    /// Held timelines told pass after pass while their calls are built again from some start
    /// on (holding nothing, served by other nodes) and new ones come, and while the series
    /// move (points added, the oldest cut, a value changed anywhere, series coming and going,
    /// a node's role changing): telling only the attempts that may have changed
    /// (`enrich_changed`) tells every attempt what telling all of them (`enrich_from`) does.
    #[test]
    fn telling_only_what_changed_tells_what_telling_all_does() {
        let mut random = Random(0x2545_f491_4f6c_dd1d);
        let nodes = ["nn-a", "nn-b", "nn-c"];
        let namespaces = ["ns1", "ns2", ""];
        let roles = ["active", "observer", "standby"];
        let (mut told_in_all, mut attempts_in_all) = (0, 0);
        for case in 0..40 {
            // (metric, node, namespace, role): each series' samples are in `samples`.
            let mut series: Vec<(usize, &str, &str, &str)> = Vec::new();
            let mut samples: Vec<Sample> = Vec::new();
            let mut timelines: Vec<ClientTimeline> = (0..1 + random.below(3))
                .map(|index| ClientTimeline {
                    client_id: format!("client-{index}"),
                    namespace: Some(random.pick(&namespaces))
                        .filter(|namespace| !namespace.is_empty())
                        .map(str::to_string),
                    cluster: (random.below(4) != 0).then(|| "c1".to_string()),
                    system: None,
                    calls: Vec::new(),
                })
                .collect();
            let mut unenriched = vec![i64::MIN; timelines.len()];
            let mut told = Told::default();
            for pass in 0..30_i64 {
                let now = pass * 10;
                // The series move.
                if series.is_empty() || random.below(4) == 0 {
                    let role = if random.below(3) == 0 { random.pick(&roles) } else { "" };
                    series.push((random.below(3) as usize, random.pick(&nodes), random.pick(&namespaces), role));
                }
                if random.below(8) == 0 {
                    let gone = series.swap_remove(random.below(series.len() as u64) as usize);
                    samples.retain(|sample| sample.series.name != metric(gone.0) || !same(sample, gone));
                }
                for &(kind, node, namespace, role) in &series {
                    for _ in 0..random.below(3) {
                        let mut labels = vec![(NODE_ID, node), (CLUSTER, "c1")];
                        if !namespace.is_empty() {
                            labels.push((NAMESPACE, namespace));
                        }
                        let role = if kind == 1 { if role.is_empty() { "active" } else { role } } else { "" };
                        if kind == 1 {
                            labels.push((NODE_ROLE, role));
                        }
                        let at = now + random.below(12) as i64 - 2;
                        samples.push(gauge(metric(kind), &labels, at, (now + random.below(50) as i64) as f64));
                    }
                }
                samples.retain(|sample| sample.time_unix_nano >= now - 60);
                if !samples.is_empty() && random.below(5) == 0 {
                    let changed = random.below(samples.len() as u64) as usize;
                    samples[changed].value = PointValue::Number(random.below(1000) as f64);
                }
                samples.sort_by_key(|sample| sample.time_unix_nano);
                // Calls built again from some start on, and new ones.
                for (place, timeline) in timelines.iter_mut().enumerate() {
                    if random.below(3) == 0 {
                        let from = random.below(now as u64 + 20) as i64;
                        for call in timeline.calls.iter_mut().filter(|call| call.start_unix_nano >= from) {
                            for attempt in &mut call.attempts {
                                attempt.reported = Default::default();
                                attempt.served_by = (random.below(5) != 0).then(|| random.pick(&nodes).to_string());
                            }
                        }
                        unenriched[place] = unenriched[place].min(from);
                    }
                    for _ in 0..random.below(4) {
                        let start = now + random.below(10) as i64;
                        let attempts: Vec<TimelineAttempt> = (0..1 + random.below(3))
                            .map(|retry| {
                                let node = (random.below(5) != 0).then(|| random.pick(&nodes));
                                attempt(start + 3 * retry as i64, node)
                            })
                            .collect();
                        timeline.calls.push(TimelineCall {
                            call_id: None,
                            op: None,
                            rpc_method: None,
                            start_unix_nano: start,
                            end_unix_nano: start + 10,
                            attempts,
                            floor: None,
                        });
                        unenriched[place] = unenriched[place].min(start);
                    }
                }
                let index = SeriesIndex::of(&samples);
                told_in_all += enrich_changed(&mut timelines, &unenriched, &index, &mut told);
                let mut expected = timelines.clone();
                enrich_from(&mut expected, &index);
                assert_eq!(timelines, expected, "case {case}, pass {pass}");
                unenriched.fill(i64::MAX);
                attempts_in_all += timelines
                    .iter()
                    .flat_map(|timeline| &timeline.calls)
                    .map(|call| call.attempts.len())
                    .sum::<usize>();
            }
        }
        // Most attempts were left as they were.
        assert!(told_in_all * 3 < attempts_in_all, "told {told_in_all} of {attempts_in_all}");
    }

    fn metric(kind: usize) -> &'static str {
        [METRIC_APPLIED_STATE, METRIC_ROLE, METRIC_COMMITTED_STATE][kind]
    }

    fn same(sample: &Sample, (_, node, namespace, role): (usize, &str, &str, &str)) -> bool {
        let labels = &sample.series;
        labels.label(NODE_ID) == Some(node)
            && labels.label(NAMESPACE).unwrap_or("") == namespace
            && (role.is_empty() || labels.label(NODE_ROLE) == Some(role))
    }
}
