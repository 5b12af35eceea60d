//! `failover_flapping`: a client switches between clusters more often than its
//! switchBackDelay allows (seed 004: `failoverDelay` and `switchBackDelay` exist so that a
//! client settles on one cluster). Switches are read from the cluster URL (`server.address`)
//! its consecutive calls went to, or, for a client whose log lines report its switches (the
//! Pulsar client's `... switch to the service {url} ...` and `... switch back to the primary
//! service`), from those lines: a client that logs its switches is judged by them, which are
//! its own decisions, rather than by where its calls happened to go.

use std::collections::BTreeMap;

use lagscope_model::{Anomaly, AnomalyKind, ClientTimeline, Severity, TimelineAttempt};

use super::evidence::{Spans, evidence};
use crate::log_events::{LogEvent, LogEventKind};
use crate::{AnalysisInput, AnalyzerConfig};

pub fn detect(input: &AnalysisInput, config: &AnalyzerConfig) -> Vec<Anomaly> {
    let min_gap = config.failover_flapping.switch_back_delay_seconds * 1_000_000_000;
    let mut anomalies = Vec::new();
    let logged = logged_switches(&input.log_events);
    for timeline in &input.timelines {
        if logged.keys().any(|(_, client)| *client == timeline.client_id) {
            continue;
        }
        let attempts: Vec<&TimelineAttempt> = timeline
            .calls
            .iter()
            .flat_map(|call| &call.attempts)
            .filter(|attempt| attempt.server_address.is_some())
            .collect();
        // (time, from, to, attempt) of every switch.
        let switches: Vec<(i64, &str, &str, &TimelineAttempt)> = attempts
            .windows(2)
            .filter(|pair| pair[0].server_address != pair[1].server_address)
            .map(|pair| {
                (
                    pair[1].start_unix_nano,
                    pair[0].server_address.as_deref().unwrap_or_default(),
                    pair[1].server_address.as_deref().unwrap_or_default(),
                    pair[1],
                )
            })
            .collect();
        // Runs of switches each closer than the delay to the previous one.
        let mut run: Vec<&(i64, &str, &str, &TimelineAttempt)> = Vec::new();
        let mut flush = |run: &mut Vec<&(i64, &str, &str, &TimelineAttempt)>| {
            if run.len() >= 2 {
                anomalies.push(flapping(timeline, run, min_gap));
            }
            run.clear();
        };
        for switch in &switches {
            if run.last().is_some_and(|previous| switch.0 - previous.0 >= min_gap) {
                flush(&mut run);
            }
            run.push(switch);
        }
        flush(&mut run);
    }
    for ((cluster, client), switches) in &logged {
        for run in runs(switches, min_gap, |switch| switch.time_unix_nano) {
            anomalies.push(flapping_logged(*cluster, client, &run, min_gap));
        }
    }
    anomalies
}

/// The switch lines of clients that name themselves (`lagscope.client.id`), per (cluster,
/// client), in time order.
pub(crate) fn logged_switches(events: &[LogEvent]) -> BTreeMap<(Option<&str>, &str), Vec<&LogEvent>> {
    let mut logged: BTreeMap<(Option<&str>, &str), Vec<&LogEvent>> = BTreeMap::new();
    for event in events.iter().filter(|event| event.kind == LogEventKind::ClusterSwitch) {
        if let Some(client) = event.client_id.as_deref() {
            logged.entry((event.cluster.as_deref(), client)).or_default().push(event);
        }
    }
    logged
}

/// Runs of at least two switches, each closer than `min_gap` to the one before.
pub(crate) fn runs<T: Copy>(switches: &[T], min_gap: i64, time: impl Fn(T) -> i64) -> Vec<Vec<T>> {
    let mut found = Vec::new();
    let mut run: Vec<T> = Vec::new();
    for switch in switches.iter().copied() {
        if run.last().is_some_and(|previous| time(switch).saturating_sub(time(*previous)) >= min_gap) {
            if run.len() >= 2 {
                found.push(std::mem::take(&mut run));
            }
            run.clear();
        }
        run.push(switch);
    }
    if run.len() >= 2 {
        found.push(run);
    }
    found
}

const CAUSE: &str = "failover flapping: the client's failover and switch-back decisions do not wait long enough (or \
                     its probe's verdicts flip), so it moves between clusters while neither is settled";

fn summary(client: &str, switches: usize, nanos: i64, path: &[String], min_gap: i64) -> String {
    format!(
        "client {client} switched clusters {switches} times in {:.0} s ({}), faster than a switch-back delay of {} s allows",
        nanos as f64 / 1e9,
        path.join(" → "),
        min_gap / 1_000_000_000
    )
}

/// The anomaly for a run of switches the client logged. Shared with the streaming engine.
pub(crate) fn flapping_logged(cluster: Option<&str>, client: &str, run: &[&LogEvent], min_gap: i64) -> Anomaly {
    let (start, end) = (run[0].time_unix_nano, run[run.len() - 1].time_unix_nano);
    let field = |event: &LogEvent, key: &str| event.fields.get(key).cloned().unwrap_or_else(|| "?".to_string());
    let path: Vec<String> =
        std::iter::once(field(run[0], "from")).chain(run.iter().map(|event| field(event, "to"))).collect();
    Anomaly {
        kind: AnomalyKind::FailoverFlapping,
        severity: Severity::Warning,
        cluster: cluster.map(str::to_string),
        namespace: None,
        client_id: Some(client.to_string()),
        node_id: None,
        start_unix_nano: start,
        end_unix_nano: end,
        summary: summary(client, run.len(), end - start, &path, min_gap),
        cause: CAUSE.to_string(),
        evidence: evidence!({
            "switches": run.len(),
            "path": path,
            "switch_times_unix_nano": run.iter().map(|event| event.time_unix_nano).collect::<Vec<_>>(),
            "source": "client log",
            "lines": run.iter().map(|event| event.text.as_str()).collect::<Vec<_>>(),
        }),
        open: false,
        fingerprint: format!("failover_flapping|{}|{client}|{start}", cluster.unwrap_or("")),
    }
}

/// One switch: (time, from address, to address, the attempt that went to the new one).
pub(crate) type Switch<'a> = (i64, &'a str, &'a str, &'a TimelineAttempt);

/// The anomaly for a run of at least two switches each closer than `min_gap` to the last.
/// Shared with the streaming engine.
pub(crate) fn flapping(timeline: &ClientTimeline, run: &[&Switch<'_>], min_gap: i64) -> Anomaly {
    let (start, end) = (run[0].0, run[run.len() - 1].0);
    let path: Vec<String> =
        std::iter::once(run[0].1.to_string()).chain(run.iter().map(|switch| switch.2.to_string())).collect();
    Anomaly {
        kind: AnomalyKind::FailoverFlapping,
        severity: Severity::Warning,
        cluster: timeline.cluster.clone(),
        namespace: timeline.namespace.clone(),
        client_id: Some(timeline.client_id.clone()),
        node_id: None,
        start_unix_nano: start,
        end_unix_nano: end,
        summary: summary(&timeline.client_id, run.len(), end - start, &path, min_gap),
        cause: CAUSE.to_string(),
        evidence: evidence!({
            "switches": run.len(),
            "path": path,
            "switch_times_unix_nano": run.iter().map(|switch| switch.0).collect::<Vec<_>>(),
            "spans": Spans::of(run.iter().map(|switch| switch.3)),
        }),
        open: false,
        fingerprint: format!(
            "failover_flapping|{}|{}|{start}",
            timeline.cluster.as_deref().unwrap_or(""),
            timeline.client_id
        ),
    }
}
