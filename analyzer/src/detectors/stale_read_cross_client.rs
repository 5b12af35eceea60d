//! `stale_read` with guarantee `cross_client`: a read served at a state that newer committed
//! data had replaced longer ago than the system's bound. Across clients nothing stronger is
//! promised: HDFS RBF discovers others' writes within `observer.state.id.refresh.period`
//! (15 s), Ozone's LOCAL_LEASE within the lease time (5 s). Staleness up to the bound is
//! expected (the lag analytics report it); beyond it, this raises. Reads that already break a
//! session guarantee are reported by `stale_read` as that.

use lagscope_model::{Anomaly, AnomalyKind, ClientTimeline, Guarantee, Severity, TimelineAttempt, TimelineCall};

use super::evidence::{attempt_fingerprint, evidence, method, operation, span_ids};
use crate::floor::served_reads;
use crate::{AnalysisInput, AnalyzerConfig};

pub fn detect(input: &AnalysisInput, config: &AnalyzerConfig) -> Vec<Anomaly> {
    let bounds = &config.stale_read.cross_client_bounds_seconds;
    if bounds.is_empty() {
        return Vec::new();
    }
    let committed = input.committed();
    let mut anomalies = Vec::new();
    for timeline in &input.timelines {
        let Some(bound) = timeline.system.as_deref().and_then(|system| bounds.get(system)).copied() else { continue };
        let Some(history) = committed.get(&(timeline.cluster.clone(), timeline.namespace.clone())) else { continue };
        for read in served_reads(&timeline.calls) {
            let (call, attempt, served) = (read.call, read.attempt, read.served);
            if read.broken_floor(1).is_some() {
                continue;
            }
            // When a state newer than the one served was first committed.
            let newer = history.partition_point(|(_, state)| *state <= served);
            let Some(&(replaced_at, newer_state)) = history.get(newer) else { continue };
            let staleness = (attempt.end_unix_nano - replaced_at) as f64 / 1e9;
            if staleness <= bound as f64 {
                continue;
            }
            anomalies.push(cross_client(timeline, call, attempt, served, staleness, bound, replaced_at, newer_state));
        }
    }
    anomalies
}

/// The anomaly for a read `attempt` of `call` served at `served`, `staleness` seconds after
/// `newer_state` was first committed (at `replaced_at`), beyond `bound`. Shared with the
/// streaming engine.
#[allow(clippy::too_many_arguments)]
pub(crate) fn cross_client(
    timeline: &ClientTimeline,
    call: &TimelineCall,
    attempt: &TimelineAttempt,
    served: i64,
    staleness: f64,
    bound: i64,
    replaced_at: i64,
    newer_state: i64,
) -> Anomaly {
    let node = attempt.served_by.as_deref().unwrap_or("a node");
    let namespace = timeline.namespace.as_deref().unwrap_or("its namespace");
    Anomaly {
        kind: AnomalyKind::StaleRead,
        severity: Severity::Warning,
        cluster: timeline.cluster.clone(),
        namespace: timeline.namespace.clone(),
        client_id: Some(timeline.client_id.clone()),
        node_id: attempt.served_by.clone(),
        start_unix_nano: attempt.start_unix_nano,
        end_unix_nano: attempt.end_unix_nano,
        summary: format!(
            "client {} read {namespace} ({}) on {node} at state {served}, {staleness:.1} s after newer data ({newer_state}) was committed: beyond the {bound} s bound across clients",
            timeline.client_id,
            method(call),
        ),
        cause: format!(
            "{node} served data older than the system's cross-client bound ({bound} s): it is lagging (see apply_lag) or \
                 the bound's refresh did not happen (HDFS RBF: no call to the active within the refresh period)"
        ),
        evidence: evidence!({
            "guarantee": Guarantee::CrossClient.as_str(),
            "served": served,
            "floor": newer_state,
            "staleness_seconds": staleness,
            "bound_seconds": bound,
            "newer_state_committed_at_unix_nano": replaced_at,
            "served_by": attempt.served_by,
            "read": operation(call, attempt),
            "spans": span_ids(attempt),
        }),
        open: false,
        fingerprint: attempt_fingerprint("stale_read_cross_client", timeline, call, attempt),
    }
}
