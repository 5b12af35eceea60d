//! `pinned_retry`: consecutive attempts of one call all go to the same server with the same
//! rejection while another server of the namespace was serving (HDDS-17548 MC-4: LOCAL_LEASE
//! reads retried only on a not-ready new leader).
//!
//! Only attempts a client sends to a server directly count: behind a router, the router
//! picks the server and a stuck choice is the router's (see `no_namenodes_window`).
//!
//! An attempt's node is the server that answered it, or, when no server span joined it (lost
//! on the way), the node its client span says it was sent to, unless that was a router: a
//! pinned call whose middle attempt lost its server span is still one run, not two.

use std::collections::{BTreeMap, BTreeSet};

use lagscope_model::{Anomaly, AnomalyKind, ClientTimeline, Outcome, Severity, TimelineAttempt, TimelineCall};

use super::evidence::{Spans, attempt_fingerprint, evidence, method};
use crate::{AnalysisInput, AnalyzerConfig};

/// (cluster, namespace).
type NamespaceOf<'a> = (Option<&'a str>, Option<&'a str>);

/// (cluster, namespace) → (time, node) of every successful answer.
type Served<'a> = BTreeMap<NamespaceOf<'a>, Vec<(i64, &'a str)>>;

pub fn detect(input: &AnalysisInput, config: &AnalyzerConfig) -> Vec<Anomaly> {
    // The pinned runs first: usually there are none, and then no answer need be gathered.
    let runs: Vec<(&ClientTimeline, &TimelineCall, Vec<&TimelineAttempt>)> = input
        .timelines
        .iter()
        .flat_map(|timeline| timeline.calls.iter().map(move |call| (timeline, call)))
        .flat_map(|(timeline, call)| {
            pinned_runs(call, config.pinned_retry.min_attempts).into_iter().map(move |run| (timeline, call, run))
        })
        .collect();
    if runs.is_empty() {
        return Vec::new();
    }
    let wanted: BTreeSet<NamespaceOf> =
        runs.iter().map(|(timeline, _, _)| (timeline.cluster.as_deref(), timeline.namespace.as_deref())).collect();
    let served = served_answers(input, &wanted);
    let mut anomalies = Vec::new();
    for (timeline, call, run) in runs {
        let key = (timeline.cluster.as_deref(), timeline.namespace.as_deref());
        let node = answered_by(run[0]).unwrap_or_default();
        let (start, end) = (run[0].start_unix_nano, run[run.len() - 1].end_unix_nano);
        let others: BTreeSet<&str> = served
            .get(&key)
            .into_iter()
            .flatten()
            .filter(|(at, other)| *other != node && (start..=end).contains(at))
            .map(|(_, other)| *other)
            .collect();
        if !others.is_empty() {
            anomalies.push(pinned(timeline, call, &run, node, &others));
        }
    }
    anomalies
}

/// The successful answers of the `wanted` namespaces.
fn served_answers<'a>(input: &'a AnalysisInput, wanted: &BTreeSet<NamespaceOf<'a>>) -> Served<'a> {
    let mut served = Served::new();
    for timeline in &input.timelines {
        let key = (timeline.cluster.as_deref(), timeline.namespace.as_deref());
        if !wanted.contains(&key) {
            continue;
        }
        for attempt in timeline.calls.iter().flat_map(|call| &call.attempts) {
            if let (Some(Outcome::Ok), Some(node)) = (&attempt.outcome, attempt.served_by.as_deref()) {
                served.entry(key).or_default().push((attempt.end_unix_nano, node));
            }
        }
    }
    served
}

/// Runs of at least `min_attempts` consecutive refused attempts, sent straight to one server,
/// refused the same way.
fn pinned_runs(call: &TimelineCall, min_attempts: usize) -> Vec<Vec<&TimelineAttempt>> {
    let runs = run_indexes(
        &call.attempts,
        min_attempts,
        |attempt| {
            attempt.outcome != Some(Outcome::Ok) && attempt.router_node.is_none() && answered_by(attempt).is_some()
        },
        |last, attempt| answered_by(last) == answered_by(attempt) && last.error_type == attempt.error_type,
    );
    runs.into_iter().map(|run| run.into_iter().map(|index| &call.attempts[index]).collect()).collect()
}

/// The node that answered `attempt` (see the module documentation; the streaming engine's
/// compact attempts say the same in `Attempt::answered_by`).
fn answered_by(attempt: &TimelineAttempt) -> Option<&str> {
    attempt.served_by.as_deref().or_else(|| {
        attempt.target_node.as_deref().filter(|_| attempt.target_role.as_deref().is_some_and(|role| role != "router"))
    })
}

/// Maximal runs (as indexes) of at least `min` consecutive items that are `candidate`s, each
/// `continues` the one before. The pinned-run scan of both the batch and the streaming path.
pub(crate) fn run_indexes<T>(
    items: &[T],
    min: usize,
    candidate: impl Fn(&T) -> bool,
    continues: impl Fn(&T, &T) -> bool,
) -> Vec<Vec<usize>> {
    let mut runs = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    for (index, item) in items.iter().enumerate() {
        let is_candidate = candidate(item);
        let extends = current.last().is_some_and(|last| continues(&items[*last], item));
        if is_candidate && (current.is_empty() || extends) {
            current.push(index);
            continue;
        }
        if current.len() >= min {
            runs.push(std::mem::take(&mut current));
        }
        current.clear();
        if is_candidate {
            current.push(index);
        }
    }
    if current.len() >= min {
        runs.push(current);
    }
    runs
}

/// The anomaly for a pinned `run` of `call`'s attempts to `node` while `others` served.
/// Shared with the streaming engine.
pub(crate) fn pinned(
    timeline: &ClientTimeline,
    call: &TimelineCall,
    run: &[&TimelineAttempt],
    node: &str,
    others: &BTreeSet<&str>,
) -> Anomaly {
    let error = run[0].error_type.as_deref().unwrap_or("the same error");
    let short_error = error.rsplit('.').next().unwrap_or(error);
    let others_text = others.iter().copied().collect::<Vec<_>>().join(", ");
    Anomaly {
        kind: AnomalyKind::PinnedRetry,
        severity: Severity::Warning,
        cluster: timeline.cluster.clone(),
        namespace: timeline.namespace.clone(),
        client_id: Some(timeline.client_id.clone()),
        node_id: Some(node.to_string()),
        start_unix_nano: run[0].start_unix_nano,
        end_unix_nano: run[run.len() - 1].end_unix_nano,
        summary: format!(
            "client {} retried {} {} times, every attempt to {node} answering {short_error}, while {others_text} served",
            timeline.client_id,
            method(call),
            run.len(),
        ),
        cause: format!(
            "pinned retry: the client's retry and failover choice kept selecting {node}; {others_text} could have served \
             (a not-ready new leader retried as the believed leader, HDDS-17548 MC-4)"
        ),
        evidence: evidence!({
            "attempts": run.len(),
            "node": node,
            "error_type": run[0].error_type,
            "consistency": run[0].consistency,
            "served_meanwhile_by": others,
            "call_id": call.call_id,
            "spans": Spans::of(run.iter().copied()),
        }),
        open: false,
        fingerprint: attempt_fingerprint("pinned_retry", timeline, call, run[0]),
    }
}
