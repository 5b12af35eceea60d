//! `no_namenodes_window`: a router answers NoNamenodesAvailable for a namespace continuously
//! for at least `min_window` (seed 002, HDFS-17166: the membership cache says "no active"
//! after the failover finished, and every request goes to the real standby first).

use std::collections::{BTreeMap, BTreeSet};

use lagscope_model::conventions::{CLUSTER, METRIC_ROLE, NAMESPACE, NODE_ID, NODE_ROLE};
use lagscope_model::{Anomaly, AnomalyKind, ClientTimeline, Outcome, Severity};
use rustc_hash::{FxHashMap, FxHashSet};

use super::evidence::evidence;
use crate::{AnalysisInput, AnalyzerConfig};

pub(crate) const NO_NAMENODES: &str = "NoNamenodesAvailableException";

/// One router answer for a namespace.
struct Answer<'a> {
    start: i64,
    end: i64,
    no_namenodes: bool,
    client: &'a str,
    tried: Option<&'a str>,
    /// From a log line without trace context, not from a traced attempt.
    logged: bool,
}

type Key<'a> = (Option<&'a str>, Option<&'a str>, &'a str);

pub fn detect(input: &AnalysisInput, config: &AnalyzerConfig) -> Vec<Anomaly> {
    let settings = &config.no_namenodes_window;
    // Most routers answered every request: only the answers of those that answered
    // NoNamenodesAvailable at least once are gathered (a scope pass's timelines hold a few
    // hundred thousand attempts, nearly all answered).
    let failing: FxHashSet<Key<'_>> =
        router_answers(input, |_| true).filter(|(_, answer)| answer.no_namenodes).map(|(key, _)| key).collect();
    if failing.is_empty() {
        return Vec::new();
    }
    let namespaces: FxHashSet<(Option<&str>, Option<&str>)> =
        failing.iter().map(|(cluster, namespace, _)| (*cluster, *namespace)).collect();
    // Hashed while gathered (an entry per answer), ordered when judged.
    let mut answers: FxHashMap<Key<'_>, Vec<Answer<'_>>> = FxHashMap::default();
    for (key, answer) in router_answers(input, |timeline| {
        namespaces.contains(&(timeline.cluster.as_deref(), timeline.namespace.as_deref()))
    }) {
        if failing.contains(&key) {
            answers.entry(key).or_default().push(answer);
        }
    }
    let mut anomalies = Vec::new();
    let answers: BTreeMap<Key<'_>, Vec<Answer<'_>>> = answers.into_iter().collect();
    for ((cluster, namespace, router), mut list) in answers {
        list.sort_by_key(|answer| answer.start);
        let mut window: Vec<&Answer<'_>> = Vec::new();
        let mut flush = |window: &mut Vec<&Answer<'_>>| {
            if let (Some(first), Some(last)) = (window.first(), window.last())
                && last.start - first.start >= settings.min_window_seconds * 1_000_000_000
            {
                anomalies.push(raise(input, cluster, namespace, router, window));
            }
            window.clear();
        };
        for answer in &list {
            let gap_too_long =
                window.last().is_some_and(|last| answer.start - last.start > settings.max_gap_seconds * 1_000_000_000);
            if !answer.no_namenodes || gap_too_long {
                flush(&mut window);
            }
            if answer.no_namenodes {
                window.push(answer);
            }
        }
        flush(&mut window);
    }
    anomalies
}

/// Every router answer for a namespace, keyed by (cluster, namespace, router): the traced
/// attempts of the timelines `wanted` accepts (a router answers with a NoNamenodesAvailable
/// error or a success), then the lines of routers that log the answer without tracing it (log
/// lines with trace context belong to a router span counted above). A router may do both:
/// then its lines and its spans tell of the same answers, and each window counts them once
/// ([`raise`]).
fn router_answers<'a>(
    input: &'a AnalysisInput,
    wanted: impl Fn(&ClientTimeline) -> bool,
) -> impl Iterator<Item = (Key<'a>, Answer<'a>)> {
    let traced = input.timelines.iter().filter(move |timeline| wanted(timeline)).flat_map(|timeline| {
        timeline.calls.iter().flat_map(|call| &call.attempts).filter_map(move |attempt| {
            let router = attempt.router_node.as_deref()?;
            let no_namenodes = attempt.error_type.as_deref().is_some_and(|error| error.ends_with(NO_NAMENODES));
            if !no_namenodes && attempt.outcome != Some(Outcome::Ok) {
                return None;
            }
            let answer = Answer {
                start: attempt.start_unix_nano,
                end: attempt.end_unix_nano,
                no_namenodes,
                client: &timeline.client_id,
                tried: attempt.served_by.as_deref(),
                logged: false,
            };
            Some(((timeline.cluster.as_deref(), timeline.namespace.as_deref(), router), answer))
        })
    });
    let logged = input.log_events.iter().filter_map(|event| {
        let router = event.router_answer()?;
        let answer = Answer {
            start: event.time_unix_nano,
            end: event.time_unix_nano,
            no_namenodes: true,
            client: "",
            tried: event.fields.get("namenode").map(String::as_str),
            logged: true,
        };
        Some(((event.cluster.as_deref(), event.namespace.as_deref(), router), answer))
    });
    traced.chain(logged)
}

fn raise(
    input: &AnalysisInput,
    cluster: Option<&str>,
    namespace: Option<&str>,
    router: &str,
    window: &[&Answer<'_>],
) -> Anomaly {
    // The last answer to end (answers in start order: a span and a line of one answer start
    // together and end apart).
    let (start, end) = (window[0].start, window.iter().map(|answer| answer.end).max().unwrap_or(window[0].end));
    // Log lines do not name the client.
    let clients: BTreeSet<&str> =
        window.iter().map(|answer| answer.client).filter(|client| !client.is_empty()).collect();
    let mut tried: [BTreeMap<&str, usize>; 2] = Default::default();
    let mut counts = [0_usize; 2];
    for answer in window {
        counts[usize::from(answer.logged)] += 1;
        if let Some(node) = answer.tried {
            *tried[usize::from(answer.logged)].entry(node).or_default() += 1;
        }
    }
    let (attempts, tried_first) = counted(counts, tried);
    let active = active_reported(input, cluster, namespace, start, end);
    let found = Window {
        start,
        end,
        seconds: (window[window.len() - 1].start - window[0].start) as f64 / 1e9,
        attempts,
        clients: clients.into_iter().map(str::to_string).collect(),
        tried_first: tried_first.map(str::to_string),
        active,
    };
    window_anomaly(cluster, namespace, router, &found)
}

/// A window's answers and the NameNode tried first, from its traced answers (index 0) and its
/// logged ones (index 1), counted apart with the NameNodes each named. A router that traces
/// its answers and logs them tells of each twice: the window has the more of the two counts
/// (either may miss some: sampled traces, rate-limited logs), and the NameNode the spans name
/// most (a node id), else the lines' (an address). Shared with the streaming engine.
pub(crate) fn counted(counts: [usize; 2], tried: [BTreeMap<&str, usize>; 2]) -> (usize, Option<&str>) {
    let tried = if tried[0].is_empty() { &tried[1] } else { &tried[0] };
    let first = tried.iter().max_by_key(|(_, count)| **count).map(|(node, _)| *node);
    (counts[0].max(counts[1]), first)
}

/// A router's NoNamenodesAvailable window, summed up.
pub(crate) struct Window {
    /// First answer's start, the latest end of its answers.
    pub start: i64,
    pub end: i64,
    /// From the first answer's start to the last one's.
    pub seconds: f64,
    pub attempts: usize,
    pub clients: BTreeSet<String>,
    /// The NameNode most answers were tried on.
    pub tried_first: Option<String>,
    /// A NameNode of the namespace that reported ACTIVE during the window.
    pub active: Option<String>,
}

/// The anomaly for `router`'s window. Shared with the streaming engine.
pub(crate) fn window_anomaly(cluster: Option<&str>, namespace: Option<&str>, router: &str, window: &Window) -> Anomaly {
    let Window { start, end, seconds, attempts, clients, tried_first, active } = window;
    let (start, end, seconds) = (*start, *end, *seconds);
    let tried_first = tried_first.as_deref();
    let namespace_text = namespace.unwrap_or("the namespace");
    let cause = match &active {
        Some(node) => format!(
            "stale membership cache: {node} already reported ACTIVE while {router} kept answering NoNamenodesAvailable and sending \
             every request to {} first; the router's cache still said 'no active' and it did not rotate the failing NameNode \
             (HDFS-17166)",
            tried_first.unwrap_or("a standby")
        ),
        None => format!(
            "no NameNode of {namespace_text} reported ACTIVE in the window: the nameservice had no active (failover in progress)"
        ),
    };
    Anomaly {
        kind: AnomalyKind::NoNamenodesWindow,
        severity: Severity::Critical,
        cluster: cluster.map(str::to_string),
        namespace: namespace.map(str::to_string),
        client_id: None,
        node_id: Some(router.to_string()),
        start_unix_nano: start,
        end_unix_nano: end,
        summary: format!(
            "{router} answered NoNamenodesAvailable for {namespace_text} for {seconds:.0} s ({} attempts, {} clients){}",
            attempts,
            clients.len(),
            active.as_ref().map_or(String::new(), |node| format!(" while {node} was ACTIVE"))
        ),
        cause,
        evidence: evidence!({
            "window_start_unix_nano": start,
            "window_end_unix_nano": end,
            "window_seconds": seconds,
            "attempts": attempts,
            "clients_affected": clients,
            "namenode_tried_first": tried_first,
            "active_reported_by": active,
        }),
        open: false,
        fingerprint: format!(
            "no_namenodes_window|{}|{}|{router}|{start}",
            cluster.unwrap_or(""),
            namespace.unwrap_or("")
        ),
    }
}

/// A NameNode of the namespace that reported ACTIVE during the window: its role metric, or a
/// successful execution as the active.
fn active_reported(
    input: &AnalysisInput,
    cluster: Option<&str>,
    namespace: Option<&str>,
    start: i64,
    end: i64,
) -> Option<String> {
    let from_metrics = input.samples().iter().find_map(|sample| {
        let labels = &sample.series;
        (labels.name == METRIC_ROLE
            && labels.label(NODE_ROLE) == Some("active")
            && labels.label(CLUSTER) == cluster
            && labels.label(NAMESPACE) == namespace
            && (start..=end).contains(&sample.time_unix_nano))
        .then(|| labels.label(NODE_ID).map(str::to_string))
        .flatten()
    });
    from_metrics.or_else(|| {
        input
            .timelines
            .iter()
            .filter(|timeline| timeline.cluster.as_deref() == cluster && timeline.namespace.as_deref() == namespace)
            .flat_map(|timeline| timeline.calls.iter().flat_map(|call| &call.attempts))
            .find(|attempt| {
                attempt.outcome == Some(Outcome::Ok)
                    && attempt.served_role.as_deref() == Some("active")
                    && (start..=end).contains(&attempt.start_unix_nano)
            })
            .and_then(|attempt| attempt.served_by.clone())
    })
}
