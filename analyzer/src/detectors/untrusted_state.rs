//! `untrusted_state`: a request carried a state beyond the highest committed state any
//! server of the namespace has reported (by more than the in-flight margin). Routers forward
//! it through their connection pools (HDFS-16834's boundary: the pool, not the global state,
//! is poisoned), so the evidence lists the pools and the other clients it reached.

use std::collections::BTreeSet;

use lagscope_model::{Anomaly, AnomalyKind, ClientTimeline, Severity, TimelineAttempt, TimelineCall};
use serde_json::json;

use super::evidence::{attempt_fingerprint, evidence, span_ids};
use crate::committed::ReportsThrough;
use crate::{AnalysisInput, AnalyzerConfig};

pub fn detect(input: &AnalysisInput, config: &AnalyzerConfig) -> Vec<Anomaly> {
    // Each new highest state when first reported: the highest known at a time is the last of
    // these before it (a search, not a scan of every report before it for every attempt).
    let reports = input.committed();
    let margin = config.untrusted_state.margin_states;
    let mut anomalies = Vec::new();
    for timeline in &input.timelines {
        let key = (timeline.cluster.clone(), timeline.namespace.clone());
        let Some(known) = reports.get(&key) else { continue };
        let mut through = ReportsThrough::new(known);
        let mut highest_known = |at: i64| through.at(at).checked_sub(1).map(|last| known[last].1);
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
    // Pool poisoning: other clients' requests forwarded with the untrusted state, from the
    // client's first such request on (a pool cannot pass on a state before it was sent; the
    // pool keeps it after the client stops).
    let victims: BTreeSet<&str> = input
        .timelines
        .iter()
        .filter(|other| {
            other.client_id != timeline.client_id
                && other.namespace == timeline.namespace
                && other.cluster == timeline.cluster
        })
        .filter(|other| {
            other
                .calls
                .iter()
                .flat_map(|call| &call.attempts)
                .filter(|attempt| attempt.start_unix_nano >= first.start_unix_nano)
                .any(|attempt| poisoned(attempt.router_carried, attempt.carried, committed.saturating_add(margin)))
        })
        .map(|other| other.client_id.as_str())
        .collect();
    let refused =
        offending.iter().filter(|(_, attempt, _)| attempt.outcome != Some(lagscope_model::Outcome::Ok)).count();
    let run = Untrusted {
        first_call,
        first,
        committed,
        last_end: last.end_unix_nano,
        carried,
        requests: offending.len(),
        refused,
        pools,
        victims: victims.into_iter().map(str::to_string).collect(),
    };
    Some(untrusted(timeline, &run, margin))
}

/// Whether a request forwarded at `forwarded` by a router, for a client that itself carried
/// `own`, passed on a state beyond `limit` the client did not carry (a poisoned pool).
pub(crate) fn poisoned(forwarded: Option<i64>, own: Option<i64>, limit: i64) -> bool {
    forwarded.is_some_and(|forwarded| forwarded > limit) && own.is_none_or(|own| own <= limit)
}

/// A client's run of untrusted requests, summed up.
pub(crate) struct Untrusted<'a> {
    pub first_call: &'a TimelineCall,
    pub first: &'a TimelineAttempt,
    /// The highest committed state known when the first one left.
    pub committed: i64,
    pub last_end: i64,
    /// The highest state carried.
    pub carried: i64,
    pub requests: usize,
    pub refused: usize,
    /// (router, server) pools the requests went through.
    pub pools: BTreeSet<(String, String)>,
    /// Other clients whose requests those pools forwarded with an untrusted state.
    pub victims: BTreeSet<String>,
}

/// The anomaly for a client's run of untrusted requests. Shared with the streaming engine.
pub(crate) fn untrusted(timeline: &ClientTimeline, run: &Untrusted<'_>, margin: i64) -> Anomaly {
    let Untrusted { first_call, first, committed, last_end, carried, requests, refused, pools, victims } = run;
    let (committed, carried) = (*committed, *carried);
    let namespace = timeline.namespace.as_deref().unwrap_or("its namespace");
    Anomaly {
        kind: AnomalyKind::UntrustedState,
        severity: Severity::Critical,
        cluster: timeline.cluster.clone(),
        namespace: timeline.namespace.clone(),
        client_id: Some(timeline.client_id.clone()),
        node_id: None,
        start_unix_nano: first.start_unix_nano,
        end_unix_nano: *last_end,
        summary: format!(
            "client {} carried state {carried} in {namespace}, {} beyond the highest committed state any server reported ({committed}); {} requests, {refused} refused",
            timeline.client_id,
            carried.saturating_sub(committed),
            requests,
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
        evidence: evidence!({
            "carried": carried,
            "highest_committed_reported": committed,
            "margin": margin,
            "requests": requests,
            "refused": refused,
            "pools": pools.iter().map(|(router, target)| json!({"router": router, "target": target})).collect::<Vec<_>>(),
            "clients_affected_through_pools": victims,
            "spans": span_ids(first),
        }),
        open: false,
        fingerprint: attempt_fingerprint("untrusted_state", timeline, *first_call, first),
    }
}
