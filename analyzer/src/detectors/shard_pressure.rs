//! `shard_pressure`: a shard's in-flight bytes for a role at or above `yellow_ratio` of its
//! limit (yellow) or at the limit (red) for at least `min_seconds` (seed 003).

use lagscope_model::conventions::{METRIC_SHARD_INFLIGHT_BYTES, METRIC_SHARD_LIMIT_BYTES};
use lagscope_model::{Anomaly, AnomalyKind, Severity};

use super::evidence::{NO_SPANS, evidence};
use crate::series::{Points, Scope, runs, value_at};
use crate::{AnalysisInput, AnalyzerConfig};

pub const SHARD_ROLE: &str = "lagscope.shard.role";

/// In-flight bytes as a share of the limit, per point of the in-flight series.
pub fn ratios(inflight: &Points, limit: Option<&Points>) -> Points {
    inflight
        .iter()
        .filter_map(|(at, bytes)| {
            let limit = value_at(limit?, *at).filter(|limit| *limit > 0.0)?;
            Some((*at, bytes / limit))
        })
        .collect()
}

pub fn detect(input: &AnalysisInput, config: &AnalyzerConfig) -> Vec<Anomaly> {
    let settings = &config.shard_pressure;
    let limits = input.series().series_of(METRIC_SHARD_LIMIT_BYTES, &[SHARD_ROLE]);
    let mut anomalies = Vec::new();
    for (key, inflight) in input.series().series_of(METRIC_SHARD_INFLIGHT_BYTES, &[SHARD_ROLE]) {
        let ratio_points = ratios(&inflight, limits.get(&key));
        let (scope, labels) = &key;
        let role = labels[0].as_str();
        for (start, end) in
            runs(&ratio_points, settings.min_seconds * 1_000_000_000, |_, ratio| ratio >= settings.yellow_ratio)
        {
            let peak = ratio_points
                .iter()
                .filter(|(at, _)| (start..=end).contains(at))
                .map(|(_, ratio)| *ratio)
                .fold(0.0, f64::max);
            let limit = limits.get(&key).and_then(|points| value_at(points, end));
            anomalies.push(pressure(scope, role, start, end, peak, limit, settings));
        }
    }
    anomalies
}

/// The anomaly for `scope`'s shard holding `peak` of its `role` limit from `start` to `end`.
/// Shared with the streaming engine.
pub(crate) fn pressure(
    scope: &Scope,
    role: &str,
    start: i64,
    end: i64,
    peak: f64,
    limit: Option<f64>,
    settings: &crate::config::ShardPressureConfig,
) -> Anomaly {
    let red = peak >= settings.red_ratio;
    let shard = scope.namespace.as_deref().unwrap_or("a shard");
    let node = scope.node.as_deref().unwrap_or("a node");
    let seconds = (end - start) as f64 / 1e9;
    Anomaly {
        kind: AnomalyKind::ShardPressure,
        severity: if red { Severity::Critical } else { Severity::Warning },
        cluster: scope.cluster.clone(),
        namespace: scope.namespace.clone(),
        client_id: None,
        node_id: scope.node.clone(),
        start_unix_nano: start,
        end_unix_nano: end,
        summary: format!(
            "{shard} held {:.0}% of its {role} indexing limit on {node} for {seconds:.0} s ({})",
            peak * 100.0,
            if red { "red: at the limit, writes rejected" } else { "yellow" }
        ),
        cause: format!(
            "shard pressure: {shard}'s {role} operations hold their bytes until they complete; a slow path (a slow or \
             unreachable replica, a hot shard) keeps them in flight"
        ),
        evidence: evidence!({
            "role": role,
            "peak_ratio": peak,
            "status": if red { "red" } else { "yellow" },
            "limit_bytes": limit,
            "window_seconds": seconds,
            "spans": NO_SPANS,
        }),
        open: false,
        fingerprint: format!("shard_pressure|{}|{shard}|{node}|{role}|{start}", scope.cluster.as_deref().unwrap_or("")),
    }
}
