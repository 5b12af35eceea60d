//! `untrusted_state`: a request carried a state beyond the highest committed state any
//! server of the namespace has reported (by more than the in-flight margin). Routers forward
//! it through their connection pools (HDFS-16834's boundary: the pool, not the global state,
//! is poisoned), so the evidence lists the pools and the other clients it reached.

use std::collections::BTreeSet;

use lagscope_model::{Anomaly, AnomalyKind, ClientTimeline, Severity, TimelineAttempt, TimelineCall};
use serde_json::json;

use super::evidence::{attempt_fingerprint, span_ids};
use crate::committed::committed_reports;
use crate::{AnalysisInput, AnalyzerConfig};

pub fn detect(input: &AnalysisInput, config: &AnalyzerConfig) -> Vec<Anomaly> {
    let reports = committed_reports(input);
    let margin = config.untrusted_state.margin_states;
    let mut anomalies = Vec::new();
    for timeline in &input.timelines {
        let key = (timeline.cluster.clone(), timeline.namespace.clone());
        let Some(known) = reports.get(&key) else { continue };
        let highest_known = |at: i64| {
            let index = known.partition_point(|(time, _)| *time <= at);
            known[..index].iter().map(|(_, state)| *state).max()
        };
        let offending: Vec<(&TimelineCall, &TimelineAttempt, i64)> = timeline
            .calls
            .iter()
            .flat_map(|call| call.attempts.iter().map(move |attempt| (call, attempt)))
            .filter_map(|(call, attempt)| {
                let carried = attempt.carried?;
                let committed = highest_known(attempt.start_unix_nano)?;
                (carried > committed.saturating_add(margin)).then_some((call, attempt, committed))
            })
            .collect();
        if let Some(anomaly) = window(input, timeline, &offending, margin) {
            anomalies.push(anomaly);
        }
    }
    anomalies
}

/// One anomaly for the client's run of untrusted requests.
fn window(
    input: &AnalysisInput,
    timeline: &ClientTimeline,
    offending: &[(&TimelineCall, &TimelineAttempt, i64)],
    margin: i64,
) -> Option<Anomaly> {
    let (first_call, first, committed) = *offending.first()?;
    let (_, last, _) = *offending.last()?;
    let carried = offending.iter().filter_map(|(_, attempt, _)| attempt.carried).max().unwrap_or_default();
    let pools: BTreeSet<(String, String)> = offending
        .iter()
        .filter_map(|(_, attempt, _)| Some((attempt.router_node.clone()?, attempt.served_by.clone()?)))
        .collect();
    // Pool poisoning: other clients' requests forwarded with the untrusted state.
    let victims: BTreeSet<&str> = input
        .timelines
        .iter()
        .filter(|other| {
            other.client_id != timeline.client_id
                && other.namespace == timeline.namespace
                && other.cluster == timeline.cluster
        })
        .filter(|other| {
            other.calls.iter().flat_map(|call| &call.attempts).any(|attempt| {
                attempt.router_carried.is_some_and(|forwarded| forwarded > committed.saturating_add(margin))
                    && attempt.carried.is_none_or(|own| own <= committed.saturating_add(margin))
            })
        })
        .map(|other| other.client_id.as_str())
        .collect();
    let refused =
        offending.iter().filter(|(_, attempt, _)| attempt.outcome != Some(lagscope_model::Outcome::Ok)).count();
    let namespace = timeline.namespace.as_deref().unwrap_or("its namespace");
    Some(Anomaly {
        kind: AnomalyKind::UntrustedState,
        severity: Severity::Critical,
        cluster: timeline.cluster.clone(),
        namespace: timeline.namespace.clone(),
        client_id: Some(timeline.client_id.clone()),
        node_id: None,
        start_unix_nano: first.start_unix_nano,
        end_unix_nano: last.end_unix_nano,
        summary: format!(
            "client {} carried state {carried} in {namespace}, {} beyond the highest committed state any server reported ({committed}); {} requests, {refused} refused",
            timeline.client_id,
            carried - committed,
            offending.len(),
        ),
        cause: format!(
            "untrusted client state: a state no server of {namespace} has (a restored or foreign client context); routers pass it \
             on through their connection pools, so observers answer 'too far behind' to this client{}",
            if victims.is_empty() {
                String::new()
            } else {
                format!(" and to the other clients sharing those pools ({})", victims.len())
            }
        ),
        evidence: json!({
            "carried": carried,
            "highest_committed_reported": committed,
            "margin": margin,
            "requests": offending.len(),
            "refused": refused,
            "pools": pools.iter().map(|(router, target)| json!({"router": router, "target": target})).collect::<Vec<_>>(),
            "clients_affected_through_pools": victims,
            "spans": span_ids(first),
        }),
        open: false,
        fingerprint: attempt_fingerprint("untrusted_state", timeline, first_call, first),
    })
}
