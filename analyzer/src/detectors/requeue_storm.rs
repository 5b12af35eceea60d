//! `requeue_storm`: a server requeues calls (waiting for its applied state to reach the
//! calls' states) at a high rate for at least `min_seconds`: its queue-time operations outrun
//! its processing-time operations and the callers' handlers are held.

use lagscope_model::conventions::{METRIC_REQUEUE_CALLS, METRIC_RPC_PROCESSING_OPS, METRIC_RPC_QUEUE_OPS};
use lagscope_model::{Anomaly, AnomalyKind, Severity};

use super::evidence::{NO_SPANS, evidence};
use crate::series::{Scope, rates, runs_through_dips, value_at};
use crate::{AnalysisInput, AnalyzerConfig};

pub fn detect(input: &AnalysisInput, config: &AnalyzerConfig) -> Vec<Anomaly> {
    let settings = &config.requeue_storm;
    let queue_ops = input.series().series_of(METRIC_RPC_QUEUE_OPS, &[]);
    let processing_ops = input.series().series_of(METRIC_RPC_PROCESSING_OPS, &[]);
    let mut anomalies = Vec::new();
    for (key, points) in input.series().series_of(METRIC_REQUEUE_CALLS, &[]) {
        let requeue_rates = rates(&points);
        let processed_rates = processing_ops.get(&key).map(|points| rates(points)).unwrap_or_default();
        // High: many requeues per second, and many per call the server got through (short
        // waits behind a fresh write requeue a few times each; a stalled server, hundreds).
        let (min_nanos, max_dip_nanos) =
            (settings.min_seconds * 1_000_000_000, settings.max_dip_seconds * 1_000_000_000);
        let storms = runs_through_dips(&requeue_rates, min_nanos, max_dip_nanos, |at, rate| {
            // The rates' times rise strictly (a series' points, one per time).
            let processed = processed_rates
                .binary_search_by_key(&at, |(time, _)| *time)
                .map_or(0.0, |index| processed_rates[index].1);
            rate >= settings.min_requeues_per_second
                && rate >= settings.min_requeues_per_processed_call * processed.max(1.0)
        });
        let (scope, _) = &key;
        for (start, end) in storms {
            let in_window: Vec<f64> =
                requeue_rates.iter().filter(|(at, _)| (start..=end).contains(at)).map(|(_, rate)| *rate).collect();
            let peak = in_window.iter().copied().fold(0.0, f64::max);
            let requeued = value_at(&points, end).unwrap_or(0.0) - value_at(&points, start).unwrap_or(0.0);
            let delta = |series: Option<&Vec<(i64, f64)>>| {
                series
                    .map_or(0.0, |points| value_at(points, end).unwrap_or(0.0) - value_at(points, start).unwrap_or(0.0))
            };
            let queued = delta(queue_ops.get(&key));
            let processed = delta(processing_ops.get(&key));
            anomalies.push(storm(scope, start, end, peak, requeued, queued, processed));
        }
    }
    anomalies
}

/// The anomaly for a storm on `scope`'s server from `start` to `end`. Shared with the
/// streaming engine.
pub(crate) fn storm(
    scope: &Scope,
    start: i64,
    end: i64,
    peak: f64,
    requeued: f64,
    queued: f64,
    processed: f64,
) -> Anomaly {
    let node = scope.node.as_deref().unwrap_or("a server");
    let seconds = (end - start) as f64 / 1e9;
    Anomaly {
        kind: AnomalyKind::RequeueStorm,
        severity: Severity::Critical,
        cluster: scope.cluster.clone(),
        namespace: scope.namespace.clone(),
        client_id: None,
        node_id: scope.node.clone(),
        start_unix_nano: start,
        end_unix_nano: end,
        summary: format!(
            "{node} requeued {requeued:.0} calls in {seconds:.0} s (peak {peak:.0}/s): {queued:.0} queue-time ops against {processed:.0} processed"
        ),
        cause: format!(
            "requeue storm: calls carry states {node} has not applied, so it requeues them until its applied state catches \
             up; its applied state is stalled or far behind (see apply_lag), holding callers' and routers' handlers"
        ),
        evidence: evidence!({
            "requeued": requeued,
            "peak_requeues_per_second": peak,
            "queue_time_ops": queued,
            "processing_time_ops": processed,
            "excess_queue_ops": queued - processed,
            "window_seconds": seconds,
            "spans": NO_SPANS,
        }),
        open: false,
        fingerprint: format!(
            "requeue_storm|{}|{}|{node}|{start}",
            scope.cluster.as_deref().unwrap_or(""),
            scope.namespace.as_deref().unwrap_or("")
        ),
    }
}
