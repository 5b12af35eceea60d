//! `carried_state_regression`: a request carried less than the client had already seen in
//! that namespace. Latent: raised whether or not the read was served high enough, because
//! the next read on a lagging observer will be stale.

use lagscope_model::{Anomaly, AnomalyKind, ClientTimeline, Severity, UnixNanos};

use super::evidence::{Spans, attempt_fingerprint, evidence, method, operation};
use super::view::{AttemptView, CallView};
use crate::floor::{FloorContribution, seen_before};
use crate::{AnalysisInput, AnalyzerConfig};

/// A state published this soon after the call that returned it ended is the HDFS-17156 race.
pub(crate) const PUBLISH_RACE_GAP_NANOS: i64 = 10_000_000;

/// How many of the client's calls before a regression are searched for the response that
/// brought the lower state back (HDFS-16837), newest first. Bounded so that the streaming
/// engine keeps a bounded number of calls per client and finds what the batch analysis finds.
/// 16: keeping 64 made the whole analysis 9% slower (the calls kept longer are freed out of
/// cache; BENCHMARKS.md, seventy-second session).
pub(crate) const OVERWRITE_LOOKBACK_CALLS: usize = 16;

pub fn detect(input: &AnalysisInput, config: &AnalyzerConfig) -> Vec<Anomaly> {
    super::every_call(input, config, judge)
}

/// The regressions in `timeline`'s calls that start at or after `from` (what was seen before
/// each from every call), each with its call's start ([`super::JudgeCalls`]).
pub(crate) fn judge(
    timeline: &ClientTimeline,
    from: UnixNanos,
    config: &AnalyzerConfig,
    found: &mut dyn FnMut(UnixNanos, Anomaly),
) {
    for (call_index, (call, seen)) in timeline.calls.iter().zip(seen_before(&timeline.calls)).enumerate() {
        let Some(seen) = seen.filter(|_| call.start_unix_nano >= from) else { continue };
        for attempt in &call.attempts {
            let Some(carried) = attempt.carried else { continue };
            if seen.state.saturating_sub(carried) < config.carried_state_regression.min_states_behind.max(1) {
                continue;
            }
            let seen_call = &timeline.calls[seen.call_index];
            let earlier = timeline.calls[..call_index].iter().rev().take(OVERWRITE_LOOKBACK_CALLS);
            let overwritten_by = overwritten_by(earlier, attempt, carried, &seen);
            found(call.start_unix_nano, regression(timeline, call, attempt, carried, &seen, seen_call, overwritten_by));
        }
    }
}

/// The anomaly for `attempt` of `call` carrying `carried` below `seen`, which `seen_call`
/// returned; `overwritten_by` is the later call whose response brought the lower state back,
/// if any (see [`overwritten_by`]). Shared with the streaming engine.
pub(crate) fn regression<C: CallView>(
    timeline: &ClientTimeline,
    call: &C,
    attempt: &impl AttemptView,
    carried: i64,
    seen: &FloorContribution,
    seen_call: &C,
    overwritten_by: Option<&C>,
) -> Anomaly {
    let seen_attempt = seen_call.attempt(seen.attempt_index);
    let namespace = timeline.namespace.as_deref().unwrap_or("its namespace");
    let cause = cause(overwritten_by, attempt, carried, seen);
    Anomaly {
        kind: AnomalyKind::CarriedStateRegression,
        severity: Severity::Warning,
        cluster: timeline.cluster.clone(),
        namespace: timeline.namespace.clone(),
        client_id: Some(timeline.client_id.clone()),
        node_id: attempt.router_node().or_else(|| attempt.target_node()).map(str::to_string),
        start_unix_nano: attempt.start(),
        end_unix_nano: attempt.end(),
        summary: format!(
            "client {} sent {} to {namespace} carrying state {carried}, {} below the {} its {} {} had already returned",
            timeline.client_id,
            method(call),
            seen.state.saturating_sub(carried),
            seen.state,
            seen_call.op().unwrap_or("call"),
            method(seen_call),
        ),
        cause,
        evidence: {
            let request = operation(call, attempt);
            let seen_from = operation(seen_call, &seen_attempt);
            let spans = Spans::concat([&request.spans, &seen_from.spans]);
            evidence!({
                "carried": carried,
                "seen": seen.state,
                "states_behind": seen.state.saturating_sub(carried),
                "served": attempt.served(),
                "served_by": attempt.served_by(),
                "request": request,
                "seen_from": seen_from,
                "spans": spans,
            })
        },
        open: false,
        fingerprint: attempt_fingerprint("carried_state_regression", timeline, call, attempt),
    }
}

/// The latest of `earlier` (newest first; the [`OVERWRITE_LOOKBACK_CALLS`] before the call)
/// that ended after the client saw `seen` and before `attempt` left, and returned the lower
/// `carried`: the response that overwrote the state.
pub(crate) fn overwritten_by<C: CallView>(
    mut earlier: impl Iterator<Item = C>,
    attempt: &impl AttemptView,
    carried: i64,
    seen: &FloorContribution,
) -> Option<C> {
    earlier.find(|earlier| {
        earlier.end() <= attempt.start()
            && earlier.end() >= seen.completed_unix_nano
            && earlier.attempts().any(|earlier_attempt| earlier_attempt.returned() == Some(carried))
    })
}

/// Which known bug the regression matches: a lower state adopted from a later response
/// (HDFS-16837), or a state not yet published when the next call left (HDFS-17156).
fn cause(
    overwritten_by: Option<&impl CallView>,
    attempt: &impl AttemptView,
    carried: i64,
    seen: &FloorContribution,
) -> String {
    if let Some(earlier) = overwritten_by {
        let router =
            earlier.attempts().rev().find_map(|earlier_attempt| earlier_attempt.router_node().map(str::to_string));
        return format!(
            "stale router response overwrote a newer state: {} answered {carried} after the client had seen {}, and the client \
             kept the lower value instead of the maximum (HDFS-16837)",
            router.as_deref().unwrap_or("a router"),
            seen.state
        );
    }
    let gap = attempt.start() - seen.completed_unix_nano;
    if (0..=PUBLISH_RACE_GAP_NANOS).contains(&gap) {
        return format!(
            "state published after the call returned: this request left {:.1} ms after the response carrying {} and did not \
             carry it yet (HDFS-17156)",
            gap as f64 / 1e6,
            seen.state
        );
    }
    format!("the client's state went back from {} to {carried} without a response that explains it", seen.state)
}
