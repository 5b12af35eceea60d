//! Adds to each attempt what the metrics said at that moment: the executing node's reported
//! role and applied state, and the namespace's committed state.

use lagscope_model::ClientTimeline;
use lagscope_model::Sample;
use lagscope_model::conventions::{METRIC_APPLIED_STATE, METRIC_COMMITTED_STATE, METRIC_ROLE, NODE_ROLE};

use std::collections::{BTreeMap, HashMap};

use crate::committed::NamespaceKey;
use crate::series::{Points, Scope, series_of, value_at};

/// Fills `reported` on every attempt from `samples` (nothing changes without samples).
pub fn enrich(timelines: &mut [ClientTimeline], samples: &[Sample]) {
    if samples.is_empty() {
        return;
    }
    let applied = series_of(samples, METRIC_APPLIED_STATE, &[]);
    let roles = series_of(samples, METRIC_ROLE, &[NODE_ROLE]);
    let mut committed: BTreeMap<NamespaceKey, Vec<(i64, f64)>> = BTreeMap::new();
    for ((scope, _), points) in series_of(samples, METRIC_COMMITTED_STATE, &[]) {
        committed.entry((scope.cluster, scope.namespace)).or_default().extend(points);
    }
    for points in committed.values_mut() {
        points.sort_by_key(|(time, _)| *time);
    }
    let (applied, roles) = (by_node(&applied), by_node(&roles));
    for timeline in timelines.iter_mut() {
        let committed = committed.get(&(timeline.cluster.clone(), timeline.namespace.clone()));
        for attempt in timeline.calls.iter_mut().flat_map(|call| call.attempts.iter_mut()) {
            let at = attempt.start_unix_nano;
            attempt.reported.namespace_committed =
                committed.and_then(|points| value_at(points, at)).map(|value| value as i64);
            let Some(node) = attempt.served_by.as_deref() else { continue };
            let key = (timeline.cluster.as_deref(), node);
            attempt.reported.node_applied = applied
                .get(&key)
                .into_iter()
                .flatten()
                .filter(|(scope, _, _)| scope.namespace.is_none() || scope.namespace == timeline.namespace)
                .find_map(|(_, _, points)| value_at(points, at))
                .map(|value| value as i64);
            attempt.reported.node_role = roles
                .get(&key)
                .into_iter()
                .flatten()
                .filter_map(|(_, labels, points)| {
                    let index = points.partition_point(|(time, _)| *time <= at);
                    index.checked_sub(1).map(|index| (points[index].0, &labels[0]))
                })
                .max()
                .map(|(_, role)| role.clone());
        }
    }
}

/// Series by (cluster, node): each node's, in the order [`series_of`] gives them.
type ByNode<'a> = HashMap<(Option<&'a str>, &'a str), Vec<(&'a Scope, &'a Vec<String>, &'a Points)>>;

fn by_node(series: &BTreeMap<(Scope, Vec<String>), Points>) -> ByNode<'_> {
    let mut by_node = ByNode::new();
    for ((scope, labels), points) in series {
        if let Some(node) = &scope.node {
            by_node.entry((scope.cluster.as_deref(), node.as_str())).or_default().push((scope, labels, points));
        }
    }
    by_node
}
