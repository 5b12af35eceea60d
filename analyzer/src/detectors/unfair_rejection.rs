//! `unfair_rejection`: writes rejected for a shard whose own pressure was low while another
//! shard on the same node held most of the node's in-flight bytes (seed 003: node-level
//! limits punish healthy shards).

use std::collections::BTreeMap;

use lagscope_model::conventions::{METRIC_SHARD_INFLIGHT_BYTES, METRIC_SHARD_LIMIT_BYTES, METRIC_SHARD_REJECTIONS};
use lagscope_model::{Anomaly, AnomalyKind, Severity};

use super::evidence::{NO_SPANS, evidence};
use super::shard_pressure::{SHARD_ROLE, ratios};
use crate::series::{Scope, interval_rates, peak_over, value_at};
use crate::{AnalysisInput, AnalyzerConfig};

pub fn detect(input: &AnalysisInput, config: &AnalyzerConfig) -> Vec<Anomaly> {
    let settings = &config.unfair_rejection;
    let inflight = input.series().series_of(METRIC_SHARD_INFLIGHT_BYTES, &[SHARD_ROLE]);
    let limits = input.series().series_of(METRIC_SHARD_LIMIT_BYTES, &[SHARD_ROLE]);
    let mut anomalies = Vec::new();
    for (key, rejections) in input.series().series_of(METRIC_SHARD_REJECTIONS, &[SHARD_ROLE]) {
        let (scope, labels) = &key;
        let own_ratio = ratios(inflight.get(&key).map_or(&Vec::new(), |points| points), limits.get(&key));
        // The node's other shards (same cluster, node and role).
        let others: Vec<_> = inflight
            .iter()
            .filter(|((other, other_labels), _)| {
                other.cluster == scope.cluster
                    && other.node == scope.node
                    && other.namespace != scope.namespace
                    && *other_labels == *labels
            })
            .collect();
        let mut unfair: Vec<(i64, f64)> = Vec::new();
        let mut holder: BTreeMap<String, f64> = BTreeMap::new();
        for (since, at, rate) in interval_rates(&rejections) {
            if rate <= 0.0 {
                continue;
            }
            // The rejections happened somewhere since the counter's previous point: the shard's
            // own pressure must have been low all that time, not only when the counter was read
            // (a shard at its limit until just before then was rejected fairly).
            let own = peak_over(&own_ratio, since, at).unwrap_or(0.0);
            let holder_at = |time: i64| {
                let own_bytes = inflight.get(&key).and_then(|points| value_at(points, time)).unwrap_or(0.0);
                let others =
                    others.iter().map(|((other, _), points)| (other.namespace.as_deref(), value_at(points, time)));
                heaviest_holder(own_bytes, others)
            };
            if let Some(other_shard) = unfair_holder(own, holder_at(at), || holder_at(since), settings) {
                unfair.push((at, rate));
                *holder.entry(other_shard.to_string()).or_default() += rate;
            }
        }
        let (Some(first), Some(last)) = (unfair.first(), unfair.last()) else { continue };
        let rejected: f64 = unfair.iter().map(|(_, rate)| rate).sum();
        let heaviest = holder.iter().max_by(|left, right| left.1.total_cmp(right.1)).map(|(shard, _)| shard.clone());
        anomalies.push(unfair_anomaly(scope, &labels[0], first.0, last.0, rejected, heaviest, settings));
    }
    anomalies
}

/// The shard holding the most of a node's bytes at one moment, and its share of them, from the
/// bytes of the shard judged (`own`) and of the node's other shards then (in name order; those
/// without a name or a value yet count for nothing).
pub(crate) fn heaviest_holder<'a>(
    own: f64,
    others: impl Iterator<Item = (Option<&'a str>, Option<f64>)>,
) -> Option<(&'a str, f64)> {
    let mut node_bytes = own;
    let mut heaviest: Option<(&str, f64)> = None;
    for (shard, bytes) in others {
        let Some(bytes) = bytes else { continue };
        node_bytes += bytes;
        if let Some(shard) = shard
            && heaviest.is_none_or(|(_, most)| bytes.total_cmp(&most).is_ge())
        {
            heaviest = Some((shard, bytes));
        }
    }
    let (shard, bytes) = heaviest?;
    (node_bytes > 0.0).then(|| (shard, bytes / node_bytes))
}

/// The shard that held the node's bytes while rejections were counted for a shard whose own
/// pressure peaked at `own` since the counter's previous point: the rejections are unfair when
/// that stayed under `max_own_ratio` and another shard held at least `min_holder_share` of the
/// node's bytes, at the counter's point (`at`) or, when not then, at its previous point
/// (`since`): the rejections happened somewhere between, and a holder that let go just before
/// the counter was read (its operations completed, or failed all at once) still held them.
pub(crate) fn unfair_holder<'a>(
    own: f64,
    at: Option<(&'a str, f64)>,
    since: impl FnOnce() -> Option<(&'a str, f64)>,
    settings: &crate::config::UnfairRejectionConfig,
) -> Option<&'a str> {
    if own >= settings.max_own_ratio {
        return None;
    }
    let held = |holder: &(&str, f64)| holder.1 >= settings.min_holder_share;
    at.filter(held).or_else(|| since().filter(held)).map(|(shard, _)| shard)
}

/// The anomaly for `role` writes to `scope`'s shard rejected unfairly from `first` to `last`
/// (`rejected` in all), the node's bytes held by `heaviest`. Shared with the streaming engine.
pub(crate) fn unfair_anomaly(
    scope: &Scope,
    role: &str,
    first: i64,
    last: i64,
    rejected: f64,
    heaviest: Option<String>,
    settings: &crate::config::UnfairRejectionConfig,
) -> Anomaly {
    let shard = scope.namespace.as_deref().unwrap_or("a shard");
    let node = scope.node.as_deref().unwrap_or("a node");
    Anomaly {
        kind: AnomalyKind::UnfairRejection,
        severity: Severity::Warning,
        cluster: scope.cluster.clone(),
        namespace: scope.namespace.clone(),
        client_id: None,
        node_id: scope.node.clone(),
        start_unix_nano: first,
        end_unix_nano: last,
        summary: format!(
            "about {rejected:.0} {} writes to {shard} on {node} were rejected while {shard} itself was under {:.0}% of its limit; {} held the node's bytes",
            role,
            settings.max_own_ratio * 100.0,
            heaviest.as_deref().unwrap_or("another shard")
        ),
        cause: format!(
            "unfair rejection: the node's indexing budget is shared by all its shards, so {}'s stuck operations rejected \
             {shard}'s healthy ones; shard-level accounting (OpenSearch shard indexing backpressure) isolates them",
            heaviest.as_deref().unwrap_or("another shard")
        ),
        evidence: evidence!({
            "role": role,
            "rejected": rejected,
            "pressure_held_by": heaviest,
            "window_seconds": (last - first) as f64 / 1e9,
            "spans": NO_SPANS,
        }),
        open: false,
        fingerprint: format!(
            "unfair_rejection|{}|{shard}|{node}|{}|{}",
            scope.cluster.as_deref().unwrap_or(""),
            role,
            first
        ),
    }
}
