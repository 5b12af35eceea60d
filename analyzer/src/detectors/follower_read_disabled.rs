//! `follower_read_disabled`: a client that served reads from followers stops for good after
//! a follower rejected one read, and its later reads change consistency or go only to the
//! leader (HDDS-17548 MC-1: `disableFollowerRead` is client-wide and never reset).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use lagscope_model::{Anomaly, AnomalyKind, ClientTimeline, Op, Outcome, Severity, TimelineAttempt, TimelineCall};

use super::evidence::{attempt_fingerprint, evidence, span_ids};
use crate::log_events::{LogEvent, LogEventKind};
use crate::{AnalysisInput, AnalyzerConfig};

pub fn detect(input: &AnalysisInput, config: &AnalyzerConfig) -> Vec<Anomaly> {
    let min_reads_after = config.follower_read_disabled.min_reads_after;
    let logged = logged_disables(&input.log_events);
    input
        .timelines
        .iter()
        .filter_map(|timeline| {
            disabled(timeline, min_reads_after).or_else(|| {
                let lines = logged.get(timeline.client_id.as_str())?;
                disabled_logged(timeline, lines, min_reads_after)
            })
        })
        .collect()
}

/// The clients' `Disable OM follower read and retry OM leader directly` lines, per client:
/// (time, the OM that answered OMNotLeaderException), in time order.
fn logged_disables(events: &[Arc<LogEvent>]) -> BTreeMap<&str, Vec<(i64, Option<&str>)>> {
    let mut logged: BTreeMap<&str, Vec<(i64, Option<&str>)>> = BTreeMap::new();
    for event in events.iter().map(Arc::as_ref).filter(|event| event.kind == LogEventKind::FollowerReadDisabled) {
        if let Some(client) = event.client_id.as_deref() {
            logged
                .entry(client)
                .or_default()
                .push((event.time_unix_nano, event.fields.get("peer").map(String::as_str)));
        }
    }
    logged
}

/// The client said it turned follower read off (its provider's log line, e.g. when the
/// rejection was retried inside the client and left no attempt of its own): the same test
/// as for a rejection seen in the spans, from the last such line after which no read went to
/// a follower. The reads are walked as the streaming engine walks them, each line taking
/// effect before the first read that starts after it.
fn disabled_logged<'a>(
    timeline: &ClientTimeline,
    lines: &[(i64, Option<&'a str>)],
    min_reads_after: usize,
) -> Option<Anomaly> {
    struct Logged<'a> {
        time: i64,
        peer: Option<&'a str>,
        used_followers_before: bool,
        consistency_before: Option<String>,
        reads_after: usize,
        consistencies_after: BTreeSet<String>,
        last_end: i64,
    }
    // A line takes effect: follower reads off from its time, with what the client had done.
    let start = |(time, peer): (i64, Option<&'a str>), used: bool, consistency: &Option<String>| Logged {
        time,
        peer,
        used_followers_before: used,
        consistency_before: consistency.clone(),
        reads_after: 0,
        consistencies_after: BTreeSet::new(),
        last_end: time,
    };
    let mut used = false;
    let mut last_consistency: Option<String> = None;
    let mut current: Option<Logged<'_>> = None;
    let mut next = 0;
    let reads = timeline.calls.iter().filter(|call| call.op == Some(Op::Read)).flat_map(|call| &call.attempts);
    for attempt in reads {
        while let Some(&line) = lines.get(next).filter(|(time, _)| *time <= attempt.start_unix_nano) {
            current = Some(start(line, used, &last_consistency));
            next += 1;
        }
        if served_by_follower(attempt) {
            used = true;
            last_consistency = attempt.consistency.clone();
            current = None;
        } else if let Some(logged) =
            current.as_mut().filter(|logged| counts_after(attempt, logged.consistency_before.as_deref()))
        {
            logged.reads_after += 1;
            logged.consistencies_after.extend(attempt.consistency.clone());
            logged.last_end = logged.last_end.max(attempt.end_unix_nano);
        }
    }
    // The lines after the last read take effect now; the last one is in force.
    if let Some(&line) = lines[next..].last() {
        current = Some(start(line, used, &last_consistency));
    }
    let logged = current.filter(|logged| logged.used_followers_before && logged.reads_after >= min_reads_after)?;
    Some(disabled_as_logged(
        timeline,
        logged.time,
        logged.peer.map(str::to_string),
        logged.reads_after,
        logged.consistency_before,
        logged.consistencies_after,
        logged.last_end,
    ))
}

/// The anomaly for a client whose own log line says it turned follower read off at `time`
/// after `peer` answered OMNotLeaderException. Shared with the streaming engine.
pub(crate) fn disabled_as_logged(
    timeline: &ClientTimeline,
    time: i64,
    peer: Option<String>,
    reads_after: usize,
    before_consistency: Option<String>,
    after_consistencies: BTreeSet<String>,
    last_end: i64,
) -> Anomaly {
    let after_consistencies: Vec<String> = after_consistencies.into_iter().collect();
    let follower = peer.as_deref().unwrap_or("a follower");
    Anomaly {
        kind: AnomalyKind::FollowerReadDisabled,
        severity: Severity::Warning,
        cluster: timeline.cluster.clone(),
        namespace: timeline.namespace.clone(),
        client_id: Some(timeline.client_id.clone()),
        node_id: peer.clone(),
        start_unix_nano: time,
        end_unix_nano: last_end,
        summary: format!(
            "client {} turned follower reads off after {follower} answered OMNotLeaderException (its log says so): \
             0 of its {reads_after} later reads went to a follower",
            timeline.client_id
        ),
        cause: format!(
            "follower read disabled for the client's life: the OMNotLeaderException from {follower} turned follower read \
             off client-wide and nothing turns it back on (HDDS-17548 MC-1); unhinted reads now take the leader \
             consistency"
        ),
        evidence: evidence!({
            "rejected_by": peer,
            "rejection_error": "OMNotLeaderException",
            "source": "client log",
            "logged_at_unix_nano": time,
            "consistency_before": before_consistency,
            "consistencies_after": after_consistencies,
            "reads_after": reads_after,
            "reads_after_on_followers": 0,
        }),
        open: false,
        fingerprint: format!(
            "follower_read_disabled|{}|{}|{}|log@{time}",
            timeline.cluster.as_deref().unwrap_or(""),
            timeline.namespace.as_deref().unwrap_or(""),
            timeline.client_id
        ),
    }
}

/// Whether a read after follower reads were turned off counts as one that went elsewhere:
/// answered, and by a server known (its span joined) or at another consistency than the
/// follower reads' before (`before`). One at the same consistency whose server span has not
/// joined (a live pass may judge before it comes, or it was lost) could have been a follower's.
fn counts_after(attempt: &TimelineAttempt, before: Option<&str>) -> bool {
    let consistency_changed =
        attempt.consistency.as_deref().is_some_and(|consistency| before.is_some_and(|before| consistency != before));
    attempt.outcome == Some(Outcome::Ok) && (attempt.served_by.is_some() || consistency_changed)
}

pub(crate) fn on_follower(attempt: &TimelineAttempt) -> bool {
    matches!(attempt.served_role.as_deref(), Some("follower" | "observer"))
}

/// A read served by a follower in the client's follower-read mode (`lagscope.follower_read`);
/// systems without such a mode (HDFS observer reads) never count.
pub(crate) fn served_by_follower(attempt: &TimelineAttempt) -> bool {
    attempt.outcome == Some(Outcome::Ok) && on_follower(attempt) && attempt.follower_read == Some(true)
}

/// The calls a timeline's follower-read history hangs on, by index: the last read a follower
/// served, and the last rejection by a follower after it (follower reads off since, so far).
/// What [`crate::HeldTimelines::settle`] keeps of the calls it lets go of.
pub(crate) fn follower_history(calls: &[TimelineCall]) -> (Option<usize>, Option<usize>) {
    let reads = || calls.iter().enumerate().filter(|(_, call)| call.op == Some(Op::Read));
    let last_follower_read =
        reads().rev().find(|(_, call)| call.attempts.iter().any(served_by_follower)).map(|(index, _)| index);
    let rejection = reads()
        .rev()
        .take_while(|(index, _)| last_follower_read.is_none_or(|last| last <= *index))
        .find(|(_, call)| {
            call.attempts.iter().any(|attempt| {
                attempt.outcome != Some(Outcome::Ok) && on_follower(attempt) && attempt.follower_read == Some(true)
            })
        })
        .map(|(index, _)| index);
    (last_follower_read, rejection)
}

fn disabled(timeline: &ClientTimeline, min_reads_after: usize) -> Option<Anomaly> {
    let reads: Vec<(&TimelineCall, &TimelineAttempt)> = timeline
        .calls
        .iter()
        .filter(|call| call.op == Some(Op::Read))
        .flat_map(|call| call.attempts.iter().map(move |attempt| (call, attempt)))
        .collect();
    // The last rejection by a follower after which no read is served by a follower again.
    let last_follower_read = reads.iter().rposition(|(_, attempt)| served_by_follower(attempt));
    let rejection_index = reads.iter().enumerate().rposition(|(index, (_, attempt))| {
        attempt.outcome != Some(Outcome::Ok)
            && on_follower(attempt)
            && attempt.follower_read == Some(true)
            && last_follower_read.is_none_or(|last| last < index)
    })?;
    let used_followers_before = reads[..rejection_index].iter().any(|(_, attempt)| served_by_follower(attempt));
    let before_consistency = reads[..rejection_index]
        .iter()
        .rev()
        .find(|(_, attempt)| served_by_follower(attempt))
        .and_then(|(_, attempt)| attempt.consistency.clone());
    let later: Vec<&TimelineAttempt> = reads[rejection_index + 1..]
        .iter()
        .filter(|(call, attempt)| {
            counts_after(attempt, before_consistency.as_deref()) && reads[rejection_index].0.call_id != call.call_id
        })
        .map(|(_, attempt)| *attempt)
        .collect();
    if !used_followers_before || later.len() < min_reads_after {
        return None;
    }
    let (call, rejected) = reads[rejection_index];
    let after_consistencies: BTreeSet<String> =
        later.iter().filter_map(|attempt| attempt.consistency.clone()).collect();
    let last_end = later.iter().map(|attempt| attempt.end_unix_nano).max().unwrap_or(rejected.end_unix_nano);
    Some(disabled_for_good(timeline, call, rejected, later.len(), before_consistency, after_consistencies, last_end))
}

/// The anomaly: `rejected` (of `call`) turned follower reads off; `reads_after` later reads,
/// the last ending at `last_end`, went elsewhere. Shared with the streaming engine.
pub(crate) fn disabled_for_good(
    timeline: &ClientTimeline,
    call: &TimelineCall,
    rejected: &TimelineAttempt,
    reads_after: usize,
    before_consistency: Option<String>,
    after_consistencies: BTreeSet<String>,
    last_end: i64,
) -> Anomaly {
    let after_consistencies: Vec<String> = after_consistencies.into_iter().collect();
    let consistency_changed =
        before_consistency.as_ref().is_some_and(|before| after_consistencies.iter().any(|after| after != before));
    let node = rejected.served_by.clone();
    let follower = node.as_deref().unwrap_or("a follower");
    Anomaly {
        kind: AnomalyKind::FollowerReadDisabled,
        severity: Severity::Warning,
        cluster: timeline.cluster.clone(),
        namespace: timeline.namespace.clone(),
        client_id: Some(timeline.client_id.clone()),
        node_id: node.clone(),
        start_unix_nano: rejected.start_unix_nano,
        end_unix_nano: last_end,
        summary: format!(
            "client {} stopped using follower reads after {follower} rejected a {} read: 0 of its {} later reads went to a follower{}",
            timeline.client_id,
            rejected.consistency.as_deref().unwrap_or("follower"),
            reads_after,
            if consistency_changed {
                format!(
                    ", and their consistency changed from {} to {}",
                    before_consistency.as_deref().unwrap_or("-"),
                    after_consistencies.join("/")
                )
            } else {
                String::new()
            }
        ),
        cause: format!(
            "follower read disabled for the client's life: the {} answer from {follower} turned follower read off client-wide and \
             nothing turns it back on (HDDS-17548 MC-1); unhinted reads now take the leader consistency",
            rejected.error_type.as_deref().and_then(|error| error.rsplit('.').next()).unwrap_or("rejection"),
        ),
        evidence: evidence!({
            "rejected_by": node,
            "rejection_error": rejected.error_type,
            "rejected_consistency": rejected.consistency,
            "consistency_before": before_consistency,
            "consistencies_after": after_consistencies,
            "reads_after": reads_after,
            "reads_after_on_followers": 0,
            "spans": span_ids(rejected),
        }),
        open: false,
        fingerprint: attempt_fingerprint("follower_read_disabled", timeline, call, rejected),
    }
}
