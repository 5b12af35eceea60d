//! Adds to each attempt what the metrics said at that moment: the executing node's reported
//! role and applied state, and the namespace's committed state.

use lagscope_model::ClientTimeline;
use lagscope_model::Sample;
use lagscope_model::conventions::{METRIC_APPLIED_STATE, METRIC_COMMITTED_STATE, METRIC_ROLE, NODE_ROLE};

use crate::committed::NamespaceKey;
use crate::series::{series_of, value_at};

/// Fills `reported` on every attempt from `samples` (nothing changes without samples).
pub fn enrich(timelines: &mut [ClientTimeline], samples: &[Sample]) {
    if samples.is_empty() {
        return;
    }
    let applied = series_of(samples, METRIC_APPLIED_STATE, &[]);
    let roles = series_of(samples, METRIC_ROLE, &[NODE_ROLE]);
    let mut committed: std::collections::BTreeMap<NamespaceKey, Vec<(i64, f64)>> = std::collections::BTreeMap::new();
    for ((scope, _), points) in series_of(samples, METRIC_COMMITTED_STATE, &[]) {
        committed.entry((scope.cluster, scope.namespace)).or_default().extend(points);
    }
    for points in committed.values_mut() {
        points.sort_by_key(|(time, _)| *time);
    }
    for timeline in timelines.iter_mut() {
        let namespace_key = (timeline.cluster.clone(), timeline.namespace.clone());
        for attempt in timeline.calls.iter_mut().flat_map(|call| call.attempts.iter_mut()) {
            let at = attempt.start_unix_nano;
            attempt.reported.namespace_committed =
                committed.get(&namespace_key).and_then(|points| value_at(points, at)).map(|value| value as i64);
            let Some(node) = attempt.served_by.clone() else { continue };
            let on_node = |scope: &crate::series::Scope| {
                scope.node.as_deref() == Some(node.as_str()) && scope.cluster == timeline.cluster
            };
            attempt.reported.node_applied = applied
                .iter()
                .filter(|((scope, _), _)| {
                    on_node(scope) && (scope.namespace.is_none() || scope.namespace == timeline.namespace)
                })
                .find_map(|(_, points)| value_at(points, at))
                .map(|value| value as i64);
            attempt.reported.node_role = roles
                .iter()
                .filter(|((scope, _), _)| on_node(scope))
                .filter_map(|((_, labels), points)| {
                    let index = points.partition_point(|(time, _)| *time <= at);
                    index.checked_sub(1).map(|index| (points[index].0, labels[0].clone()))
                })
                .max()
                .map(|(_, role)| role);
        }
    }
}
