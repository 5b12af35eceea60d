//! `failover_flapping`: a client switches between clusters more often than its
//! switchBackDelay allows (seed 004: `failoverDelay` and `switchBackDelay` exist so that a
//! client settles on one cluster). Switches are read from the cluster URL (`server.address`)
//! its consecutive calls went to, or, for a client whose log lines report its switches (the
//! Pulsar client's `... switch to the service {url} ...` and `... switch back to the primary
//! service`), from those lines: a client that logs its switches is judged by them, which are
//! its own decisions, rather than by where its calls happened to go. A switch line that names
//! no client (`lagscope.client.id`) is the switch of the client whose calls to cluster URLs come
//! from the process that logged it (the same cluster and node), when that process holds one
//! such client: the Pulsar client logs through its application's logger, which seldom adds the
//! client's id.

use std::borrow::Borrow;
use std::collections::BTreeMap;

use lagscope_model::{Anomaly, AnomalyKind, ClientTimeline, Severity, TimelineAttempt};

use lagscope_model::conventions::METRIC_PROBE_UP;

use super::blind_failover_probe::{CLIENT_ID, PROBE_KIND, SERVER_ADDRESS};
use super::evidence::{Spans, evidence};
use crate::log_events::{LogEvent, LogEventKind};
use crate::{AnalysisInput, AnalyzerConfig};

pub fn detect(input: &AnalysisInput, config: &AnalyzerConfig) -> Vec<Anomaly> {
    let min_gap = config.failover_flapping.switch_back_delay_nanos();
    let probes = input.series().series_of(METRIC_PROBE_UP, &[SERVER_ADDRESS, PROBE_KIND, CLIENT_ID]);
    let mut anomalies = Vec::new();
    let mut owners = SwitchOwners::default();
    for (cluster, node, client) in address_callers(&input.timelines) {
        owners.note((cluster, node), client);
    }
    let logged = logged_switches(&input.log_events, |cluster, node| owners.owner(&(cluster, node)).copied());
    // A client's verdicts on the cluster at an address.
    let verdicts_of = |client: &str, address: &str| {
        probe_verdicts(
            probes.iter().map(|((_, labels), points)| (labels[0].as_str(), labels[2].as_str(), points.iter().copied())),
            address,
            client,
        )
    };
    for (index, timeline) in input.timelines.iter().enumerate() {
        if logged.keys().any(|(_, client)| *client == timeline.client_id) {
            continue;
        }
        // (Of a settled timeline, what follows its cut: the witnesses before are no steps.)
        let attempts: Vec<&TimelineAttempt> = input
            .consecutive_calls(index)
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
        let verdicts = |address: &str| verdicts_of(&timeline.client_id, address);
        let mut flush = |run: &mut Vec<&(i64, &str, &str, &TimelineAttempt)>| {
            if run.len() >= 2 {
                let early =
                    run.iter().find_map(|(at, from, to, _)| early_switch_back(*at, from, to, min_gap, verdicts));
                anomalies.push(flapping(timeline, run, min_gap, early));
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
        let verdicts = |address: &str| verdicts_of(client, address);
        let switches: Vec<&LogEvent> = switches.iter().map(|event| &***event).collect();
        for run in runs(&switches, min_gap, |switch| switch.time_unix_nano) {
            let early = run.iter().find_map(|event| logged_early(event, min_gap, verdicts));
            anomalies.push(flapping_logged(*cluster, client, &run, min_gap, early));
        }
    }
    anomalies
}

/// [`early_switch_back`] of a logged switch (its `from` and `to` URLs).
pub(crate) fn logged_early(
    event: &LogEvent,
    min_gap: i64,
    verdicts: impl Fn(&str) -> Vec<(i64, f64)>,
) -> Option<EarlySwitch> {
    let (from, to) = (event.fields.get("from")?, event.fields.get("to")?);
    early_switch_back(event.time_unix_nano, from, to, min_gap, verdicts)
}

/// The switch lines of clients, per (cluster, client), in the order of `events`: a line's
/// client is the one it names (`lagscope.client.id`), else `owner` of the cluster and node that
/// logged it ([`SwitchOwners`]); a line with neither is no one's.
pub(crate) fn logged_switches<'a, E: Borrow<LogEvent>>(
    events: &'a [E],
    owner: impl Fn(Option<&str>, &str) -> Option<&'a str>,
) -> BTreeMap<(Option<&'a str>, &'a str), Vec<&'a E>> {
    let mut logged: BTreeMap<(Option<&str>, &str), Vec<&E>> = BTreeMap::new();
    for item in events {
        let event: &LogEvent = item.borrow();
        if event.kind != LogEventKind::ClusterSwitch {
            continue;
        }
        let client = (event.client_id.as_deref())
            .or_else(|| event.node_id.as_deref().and_then(|node| owner(event.cluster.as_deref(), node)));
        if let Some(client) = client {
            logged.entry((event.cluster.as_deref(), client)).or_default().push(item);
        }
    }
    logged
}

/// (cluster, node, client) of each attempt to a cluster URL (`server.address`) from a known
/// node: the process it came from, and its client.
pub(crate) fn address_callers(timelines: &[ClientTimeline]) -> impl Iterator<Item = (Option<&str>, &str, &str)> {
    timelines.iter().flat_map(|timeline| {
        timeline.calls.iter().flat_map(|call| &call.attempts).filter_map(|attempt| {
            attempt.server_address.as_ref()?;
            Some((timeline.cluster.as_deref(), attempt.client_span.node_id.as_deref()?, timeline.client_id.as_str()))
        })
    })
}

/// Per process (cluster and node), the one client whose calls to cluster URLs
/// (`server.address`) came from it, or no one when several did: whose switches the lines a
/// process logs without a client id are. Several clients in one process may each have a
/// failover provider of their own, and a line does not say whose it is.
#[derive(Debug)]
pub(crate) struct SwitchOwners<N, C>(BTreeMap<N, Option<C>>);

impl<N, C> Default for SwitchOwners<N, C> {
    fn default() -> Self {
        Self(BTreeMap::new())
    }
}

impl<N: Ord, C: PartialEq> SwitchOwners<N, C> {
    /// `client` called a cluster URL from `node` (a process).
    pub(crate) fn note(&mut self, node: N, client: C) {
        match self.0.entry(node) {
            std::collections::btree_map::Entry::Vacant(entry) => {
                entry.insert(Some(client));
            }
            std::collections::btree_map::Entry::Occupied(mut entry) => {
                if entry.get().as_ref().is_some_and(|known| *known != client) {
                    entry.insert(None);
                }
            }
        }
    }

    /// The one client of `node`.
    pub(crate) fn owner<Q: Ord + ?Sized>(&self, node: &Q) -> Option<&C>
    where
        N: Borrow<Q>,
    {
        self.0.get(node)?.as_ref()
    }

    /// Every node with one client, and its client.
    pub(crate) fn owned(&self) -> impl Iterator<Item = (&N, &C)> {
        self.0.iter().filter_map(|(node, client)| Some((node, client.as_ref()?)))
    }
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

/// The host of a cluster address, so that a URL a client logs (`pulsar://pulsar-east:6650`)
/// and the `server.address` of its calls and probes (`pulsar-east`) name the same cluster.
pub(crate) fn host(address: &str) -> &str {
    let rest = address.split_once("://").map_or(address, |(_, rest)| rest);
    let rest = rest.split(['/', ',']).next().unwrap_or(rest);
    match rest.rsplit_once(':') {
        Some((host, port))
            if !host.is_empty() && !port.is_empty() && port.bytes().all(|byte| byte.is_ascii_digit()) =>
        {
            host
        }
        _ => rest,
    }
}

/// A client's probe verdicts (time, 1 up / 0 down) on the cluster at `address`, from its
/// probe series (`(address, client id or empty for every client, points)`), in time order.
pub(crate) fn probe_verdicts<'a, P: Iterator<Item = (i64, f64)>>(
    series: impl Iterator<Item = (&'a str, &'a str, P)>,
    address: &str,
    client: &str,
) -> Vec<(i64, f64)> {
    let mut verdicts: Vec<(i64, f64)> = series
        .filter(|(probed, probe_client, _)| {
            host(probed) == host(address) && (probe_client.is_empty() || *probe_client == client)
        })
        .flat_map(|(_, _, points)| points)
        .collect();
    verdicts.sort_by(|left, right| left.0.cmp(&right.0).then(left.1.total_cmp(&right.1)));
    verdicts
}

/// A switch that did not wait as a switch-back delay says: the client moved to `to` while its
/// probe of `from`, the cluster it left, still said "up", `up_for` nanoseconds after its probe
/// first saw `to` up again.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct EarlySwitch {
    pub(crate) at: i64,
    pub(crate) from: String,
    pub(crate) to: String,
    pub(crate) up_for: i64,
}

/// The switch at `at` from `from` to `to`, with how long before it the client's probe of `to`
/// had come back up, when that is less than `min_gap` and its probe of `from` still said "up"
/// (a switch back, not a failover): the switch-back clock did not measure this recovery.
/// `verdicts(address)`: [`probe_verdicts`]. `None` also when the probes do not show a
/// recovery of `to` (no "down" verdict on it before the switch).
pub(crate) fn early_switch_back(
    at: i64,
    from: &str,
    to: &str,
    min_gap: i64,
    verdicts: impl Fn(&str) -> Vec<(i64, f64)>,
) -> Option<EarlySwitch> {
    let up = |value: f64| value >= 0.5;
    let left = verdicts(from);
    if !left.iter().rev().find(|(time, _)| *time <= at).is_some_and(|(_, value)| up(*value)) {
        return None;
    }
    let entered = verdicts(to);
    let before = &entered[..entered.partition_point(|(time, _)| *time <= at)];
    let last_down = before.iter().rposition(|(_, value)| !up(*value))?;
    let up_since = before.get(last_down + 1)?.0;
    let up_for = at - up_since;
    (up_for < min_gap).then(|| EarlySwitch { at, from: from.to_string(), to: to.to_string(), up_for })
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

/// The switch back that did not wait, as evidence.
#[derive(serde::Serialize)]
struct EarlyEvidence<'a> {
    at_unix_nano: i64,
    from: &'a str,
    to: &'a str,
    probe_up_seconds: f64,
}

impl<'a> EarlyEvidence<'a> {
    fn of(early: &'a EarlySwitch) -> Self {
        Self { at_unix_nano: early.at, from: &early.from, to: &early.to, probe_up_seconds: early.up_for as f64 / 1e9 }
    }
}

/// The cause when a switch of the run went back to a cluster sooner after it recovered than
/// the delay allows, with the cluster left still up.
fn early_cause(early: &EarlySwitch, min_gap: i64) -> String {
    format!(
        "failover flapping: the client switched back to {} {:.0} s after its probe saw it up again, though {} was \
         still up and the switch-back delay is {} s: its switch-back clock was already running before this \
         recovery, so it returned to a cluster that had not stayed up (AutoClusterFailover's recoverTimestamp, \
         started when an earlier failover landed on the primary and never reset: apache/pulsar#14442)",
        early.to,
        early.up_for as f64 / 1e9,
        early.from,
        min_gap / 1_000_000_000
    )
}

/// The anomaly for a run of switches the client logged, with the first of them that did not
/// wait as a switch-back delay says, if one did not. Shared with the streaming engine.
pub(crate) fn flapping_logged(
    cluster: Option<&str>,
    client: &str,
    run: &[&LogEvent],
    min_gap: i64,
    early: Option<EarlySwitch>,
) -> Anomaly {
    let (start, end) = (run[0].time_unix_nano, run[run.len() - 1].time_unix_nano);
    let field = |event: &LogEvent, key: &str| event.fields.get(key).cloned().unwrap_or_else(|| "?".to_string());
    let path: Vec<String> =
        std::iter::once(field(run[0], "from")).chain(run.iter().map(|event| field(event, "to"))).collect();
    let times: Vec<i64> = run.iter().map(|event| event.time_unix_nano).collect();
    let lines: Vec<&str> = run.iter().map(|event| event.text.as_str()).collect();
    let (cause, evidence) = match &early {
        Some(early) => (
            early_cause(early, min_gap),
            evidence!({
                "switches": run.len(),
                "path": path,
                "switch_times_unix_nano": times,
                "source": "client log",
                "lines": lines,
                "early_switch_back": EarlyEvidence::of(early),
            }),
        ),
        None => (
            CAUSE.to_string(),
            evidence!({
                "switches": run.len(),
                "path": path,
                "switch_times_unix_nano": times,
                "source": "client log",
                "lines": lines,
            }),
        ),
    };
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
        cause,
        evidence,
        open: false,
        fingerprint: format!("failover_flapping|{}|{client}|{start}", cluster.unwrap_or("")),
    }
}

/// One switch: (time, from address, to address, the attempt that went to the new one).
pub(crate) type Switch<'a> = (i64, &'a str, &'a str, &'a TimelineAttempt);

/// The anomaly for a run of at least two switches each closer than `min_gap` to the last.
/// Shared with the streaming engine.
pub(crate) fn flapping(
    timeline: &ClientTimeline,
    run: &[&Switch<'_>],
    min_gap: i64,
    early: Option<EarlySwitch>,
) -> Anomaly {
    let times: Vec<i64> = run.iter().map(|switch| switch.0).collect();
    // (In call order, a switch may come before the one listed ahead of it: a call whose
    // attempts go on past later calls' starts. The window is the run's earliest to latest.)
    let (start, end) =
        (times.iter().copied().min().unwrap_or_default(), times.iter().copied().max().unwrap_or_default());
    let path: Vec<String> =
        std::iter::once(run[0].1.to_string()).chain(run.iter().map(|switch| switch.2.to_string())).collect();
    let spans = Spans::of(run.iter().map(|switch| switch.3));
    let (cause, evidence) = match &early {
        Some(early) => (
            early_cause(early, min_gap),
            evidence!({
                "switches": run.len(),
                "path": path,
                "switch_times_unix_nano": times,
                "spans": spans,
                "early_switch_back": EarlyEvidence::of(early),
            }),
        ),
        None => (
            CAUSE.to_string(),
            evidence!({ "switches": run.len(), "path": path, "switch_times_unix_nano": times, "spans": spans }),
        ),
    };
    Anomaly {
        kind: AnomalyKind::FailoverFlapping,
        severity: Severity::Warning,
        cluster: timeline.cluster.clone(),
        // The client's, whatever it sent (as the runs of its lines): one incident whether
        // found from its calls or its lines (the live analyzer stores the earlier of the two).
        namespace: None,
        client_id: Some(timeline.client_id.clone()),
        node_id: None,
        start_unix_nano: start,
        end_unix_nano: end,
        summary: summary(&timeline.client_id, run.len(), end - start, &path, min_gap),
        cause,
        evidence,
        open: false,
        fingerprint: format!(
            "failover_flapping|{}|{}|{start}",
            timeline.cluster.as_deref().unwrap_or(""),
            timeline.client_id
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_logged_url_and_a_span_address_name_one_host() {
        assert_eq!(host("pulsar://pulsar-east:6650"), "pulsar-east");
        assert_eq!(host("pulsar+ssl://broker.west.example:6651/"), "broker.west.example");
        assert_eq!(host("pulsar-east"), "pulsar-east");
        assert_eq!(host("[2001:db8::1]:6650"), "[2001:db8::1]");
    }

    #[test]
    fn only_a_switch_back_to_a_fresh_recovery_from_a_cluster_still_up_did_not_wait() {
        const S: i64 = 1_000_000_000;
        let verdicts = |east: Vec<(i64, f64)>, west: Vec<(i64, f64)>| {
            move |address: &str| if address == "east" { east.clone() } else { west.clone() }
        };
        let recovered_at_20 = vec![(0, 1.0), (10 * S, 0.0), (20 * S, 1.0)];
        let west_up = vec![(0, 1.0), (20 * S, 1.0)];
        let early =
            early_switch_back(25 * S, "west", "east", 60 * S, verdicts(recovered_at_20.clone(), west_up.clone()));
        assert_eq!(early.map(|early| early.up_for), Some(5 * S));
        // Up long enough: it waited.
        assert_eq!(early_switch_back(80 * S, "west", "east", 60 * S, verdicts(recovered_at_20.clone(), west_up)), None);
        // The cluster left was down: a failover.
        let west_down = vec![(0, 1.0), (20 * S, 0.0)];
        assert_eq!(early_switch_back(25 * S, "west", "east", 60 * S, verdicts(recovered_at_20, west_down)), None);
        // No recovery seen (never down), or down at the switch: nothing to say.
        assert_eq!(early_switch_back(25 * S, "west", "east", 60 * S, verdicts(vec![(0, 1.0)], vec![(0, 1.0)])), None);
        let still_down = vec![(0, 1.0), (10 * S, 0.0)];
        assert_eq!(early_switch_back(25 * S, "west", "east", 60 * S, verdicts(still_down, vec![(0, 1.0)])), None);
    }
}
