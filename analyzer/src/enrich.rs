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
    let (applied, roles) = (by_node(&applied), by_node(&roles));
    let none: &[NodeSeries<'_>] = &[];
    for timeline in timelines.iter_mut() {
        let committed = committed.get(&(timeline.cluster.clone(), timeline.namespace.clone()));
        // The series of the node that served the attempt before (a client's attempts mostly
        // go to a few nodes, one after another), its applied states those of the timeline's
        // namespace or of none.
        let mut last: Option<NodeAt<'_>> = None;
        for attempt in timeline.calls.iter_mut().flat_map(|call| call.attempts.iter_mut()) {
            let at = attempt.start_unix_nano;
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

/// Series by (cluster, node): each node's, in the order [`series_of`] gives them.
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
}
