//! `apply_lag`: a follower or observer whose applied state is behind the namespace's
//! committed state by more than `max_lag_states`, or has stopped advancing while the
//! committed state advanced, for at least `min_seconds`. The lag is reported in states and in
//! seconds (estimated from the commit rate), with a Burrow-style status.

use std::collections::BTreeMap;

use lagscope_model::conventions::{METRIC_APPLIED_STATE, METRIC_COMMITTED_STATE, METRIC_ROLE, NODE_ROLE};
use lagscope_model::{Anomaly, AnomalyKind, Severity};
use serde_json::json;

use super::evidence::{NO_SPANS, evidence};
use crate::series::{Points, Scope, value_at};
use crate::{AnalysisInput, AnalyzerConfig};

pub(crate) const LEADER_ROLES: &[&str] = &["active", "leader", "primary"];

pub fn detect(input: &AnalysisInput, config: &AnalyzerConfig) -> Vec<Anomaly> {
    let settings = &config.apply_lag;
    let applied = input.series().series_of(METRIC_APPLIED_STATE, &[]);
    let committed = committed_by_namespace(input);
    let roles = input.series().series_of(METRIC_ROLE, &[NODE_ROLE]);
    let mut anomalies = Vec::new();
    for ((scope, _), points) in &applied {
        let Some(committed_points) = committed.get(&(scope.cluster.clone(), scope.namespace.clone())) else { continue };
        let node_roles = roles_of(&roles, scope);
        let is_leader = |at: i64| role_at(&node_roles, at).is_some_and(|role| LEADER_ROLES.contains(&role));
        let mut last_change: Option<(i64, f64)> = None;
        let mut open: Option<Episode> = None;
        for &(at, value) in points {
            let Some(committed_now) = value_at(committed_points, at) else { continue };
            if last_change.is_none_or(|(_, previous)| value > previous) {
                last_change = Some((at, value));
            }
            let (changed_at, _) = last_change.unwrap_or((at, value));
            let committed_then = value_at(committed_points, changed_at).unwrap_or(committed_now);
            let lag = committed_now - value;
            let stalled = at - changed_at >= settings.min_seconds * 1_000_000_000 && committed_now > committed_then;
            let lagging = lag > settings.max_lag_states as f64;
            // Caught up: close enough and applying again. A stalled follower's lag can stay
            // under the threshold for long at a low commit rate; its stall is still one episode.
            let caught_up = lag <= settings.caught_up_states as f64 && !stalled;
            if is_leader(at) {
                continue;
            }
            match &mut open {
                None if stalled || lagging => {
                    open = Some(Episode {
                        start: if stalled { changed_at } else { at },
                        end: at,
                        max_lag: lag,
                        stalled,
                        applied_at_stall: value,
                    });
                }
                Some(episode) if caught_up => {
                    episode.end = at;
                    anomalies.push(raise(scope, episode, committed_points, settings.min_seconds));
                    open = None;
                }
                Some(episode) => {
                    episode.end = at;
                    episode.max_lag = episode.max_lag.max(lag);
                    episode.stalled |= stalled;
                }
                None => {}
            }
        }
        if let Some(episode) = open {
            anomalies.push(raise(scope, &episode, committed_points, settings.min_seconds));
        }
    }
    anomalies.retain(|anomaly| anomaly.end_unix_nano - anomaly.start_unix_nano >= settings.min_seconds * 1_000_000_000);
    anomalies
}

/// A follower's run of lag or stall.
#[derive(Debug)]
pub(crate) struct Episode {
    pub(crate) start: i64,
    pub(crate) end: i64,
    pub(crate) max_lag: f64,
    pub(crate) stalled: bool,
    pub(crate) applied_at_stall: f64,
}

/// The namespace's committed state over time: the highest any node reported.
fn committed_by_namespace(input: &AnalysisInput) -> BTreeMap<(Option<String>, Option<String>), Points> {
    let mut merged: BTreeMap<(Option<String>, Option<String>), Points> = BTreeMap::new();
    for ((scope, _), points) in input.series().series_of(METRIC_COMMITTED_STATE, &[]) {
        merged.entry((scope.cluster, scope.namespace)).or_default().extend(points);
    }
    for points in merged.values_mut() {
        points.sort_by_key(|(time, _)| *time);
        let mut highest = f64::MIN;
        for point in points.iter_mut() {
            highest = highest.max(point.1);
            point.1 = highest;
        }
    }
    merged
}

/// The role series of `scope`'s node: each role's label with its points.
fn roles_of<'a>(roles: &'a BTreeMap<(Scope, Vec<String>), Points>, scope: &Scope) -> Vec<(&'a str, &'a Points)> {
    roles
        .iter()
        .filter(|((role_scope, _), _)| role_scope.node == scope.node && role_scope.cluster == scope.cluster)
        .map(|((_, labels), points)| (labels[0].as_str(), points))
        .collect()
}

/// The role a node reported last at `at` (of two reported at the same time, the greater).
fn role_at<'a>(roles: &[(&'a str, &Points)], at: i64) -> Option<&'a str> {
    roles
        .iter()
        .filter_map(|(role, points)| {
            let index = points.partition_point(|(time, _)| *time <= at);
            index.checked_sub(1).map(|index| (points[index].0, *role))
        })
        .max()
        .map(|(_, role)| role)
}

fn raise(scope: &Scope, episode: &Episode, committed: &Points, min_seconds: i64) -> Anomaly {
    let rate = commit_rate(value_at(committed, episode.start), value_at(committed, episode.end), episode);
    episode_anomaly(scope, episode, rate, min_seconds)
}

/// The commit rate over the episode (states per second), to turn states into seconds.
pub(crate) fn commit_rate(first: Option<f64>, last: Option<f64>, episode: &Episode) -> f64 {
    match (first, last) {
        (Some(first), Some(last)) if episode.end > episode.start => {
            (last - first) / ((episode.end - episode.start) as f64 / 1e9)
        }
        _ => 0.0,
    }
}

/// The anomaly for a follower's episode. Shared with the streaming engine.
pub(crate) fn episode_anomaly(scope: &Scope, episode: &Episode, rate: f64, min_seconds: i64) -> Anomaly {
    let node = scope.node.as_deref().unwrap_or("a follower");
    let namespace = scope.namespace.as_deref().unwrap_or("its namespace");
    let lag_seconds = if rate > 0.0 { episode.max_lag / rate } else { f64::NAN };
    let status = if episode.stalled { "stall" } else { "warn" };
    let duration = (episode.end - episode.start) as f64 / 1e9;
    Anomaly {
        kind: AnomalyKind::ApplyLag,
        severity: if episode.stalled { Severity::Critical } else { Severity::Warning },
        cluster: scope.cluster.clone(),
        namespace: scope.namespace.clone(),
        client_id: None,
        node_id: scope.node.clone(),
        start_unix_nano: episode.start,
        end_unix_nano: episode.end,
        summary: format!(
            "{node} fell {:.0} states{} behind the committed state of {namespace} for {duration:.0} s{}",
            episode.max_lag,
            // (Without commits over the episode, states do not turn into seconds.)
            if lag_seconds.is_finite() { format!(" (~{lag_seconds:.1} s)") } else { String::new() },
            if episode.stalled {
                format!(", its applied state stuck at {:.0}", episode.applied_at_stall)
            } else {
                String::new()
            }
        ),
        cause: if episode.stalled {
            format!(
                "apply stalled: {node} stopped applying (edit tailing or its state machine stuck) while the committed state kept \
                 advancing for {min_seconds} s or more; reads it serves lag and requeued reads pile up"
            )
        } else {
            format!("apply lag: {node} applies slower than the namespace commits")
        },
        evidence: evidence!({
            "max_lag_states": episode.max_lag,
            "max_lag_seconds": if lag_seconds.is_finite() { json!(lag_seconds) } else { json!(null) },
            "commit_rate_per_second": rate,
            "status": status,
            "applied_when_stalled": episode.applied_at_stall,
            "window_seconds": duration,
            "spans": NO_SPANS,
        }),
        open: false,
        fingerprint: format!(
            "apply_lag|{}|{}|{}|{}",
            scope.cluster.as_deref().unwrap_or(""),
            namespace,
            node,
            episode.start
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn episode() -> Episode {
        Episode { start: 0, end: 20_000_000_000, max_lag: 12_000.0, stalled: true, applied_at_stall: 500.0 }
    }

    fn scope() -> Scope {
        Scope { cluster: Some("prod".into()), namespace: Some("ns1".into()), node: Some("nn-obs1".into()) }
    }

    #[test]
    fn the_lag_in_seconds_is_said_only_when_something_was_committed_meanwhile() {
        let anomaly = episode_anomaly(&scope(), &episode(), 2_000.0, 10);
        assert!(anomaly.summary.starts_with("nn-obs1 fell 12000 states (~6.0 s) behind"), "{}", anomaly.summary);
        assert_eq!(anomaly.evidence["max_lag_seconds"], 6.0);
        // Nothing committed over the episode (the committed state reported did not move):
        // states cannot be turned into seconds, and the summary does not pretend to.
        let anomaly = episode_anomaly(&scope(), &episode(), 0.0, 10);
        assert!(anomaly.summary.starts_with("nn-obs1 fell 12000 states behind the committed"), "{}", anomaly.summary);
        assert!(!anomaly.summary.contains("NaN"), "{}", anomaly.summary);
        assert!(anomaly.evidence["max_lag_seconds"].is_null());
    }
}
