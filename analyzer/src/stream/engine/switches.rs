//! Logged Pulsar switch lines: judged once the data has passed them (whose client they are,
//! whether each went back sooner than the switch-back delay allows), and turned into
//! `failover_flapping` runs at the end.

use super::*;

impl Engine<'_> {
    /// The runs of the switches clients logged, now that every line and whose node is whose
    /// is known; a client found logging keeps no run found from its calls' addresses (held to
    /// the end for this: [`Engine::drain_found`]).
    pub(super) fn judge_logged_switches(&mut self) {
        let mut log_switches = std::mem::take(&mut self.log_switches);
        log_switches.sort_by_key(|line| line.event.time_unix_nano);
        let interner = &self.interner;
        let owners: BTreeMap<(Option<&str>, &str), &str> = self
            .switch_owners
            .owned()
            .filter_map(|((cluster, node), client)| {
                Some(((interner.get(*cluster), interner.get(*node)?), interner.get(*client)?))
            })
            .collect();
        let logged =
            failover_flapping::logged_switches(&log_switches, |cluster, node| owners.get(&(cluster, node)).copied());
        let logging: FxHashSet<&str> = logged.keys().map(|(_, client)| *client).collect();
        // Every flapping found so far was found from addresses.
        let from_logging = |anomaly: &Anomaly| {
            anomaly.kind == AnomalyKind::FailoverFlapping
                && anomaly.client_id.as_deref().is_some_and(|client| logging.contains(client))
        };
        self.windows_found.retain(|anomaly| !from_logging(anomaly));
        self.anomalies.retain(|anomaly| !from_logging(anomaly));
        let min_gap = self.config.failover_flapping.switch_back_delay_nanos();
        for ((cluster, client), switches) in &logged {
            for run in failover_flapping::runs(switches, min_gap, |line| line.event.time_unix_nano) {
                // Judged as the data passed it, for the client it turned out to be (the probes it
                // read are pruned since), else with what is left of them.
                let early = run.iter().find_map(|line| match &line.judged {
                    Some((judged_for, early)) if interner.get(*judged_for) == Some(*client) => early.clone(),
                    _ => logged_early(&self.probes, client, &line.event, min_gap),
                });
                let events: Vec<&crate::log_events::LogEvent> = run.iter().map(|line| &line.event).collect();
                self.anomalies.push(failover_flapping::flapping_logged(*cluster, client, &events, min_gap, early));
            }
        }
    }

    /// Judges, once the data has passed them (`before`: every call that started earlier is
    /// processed, and every probe verdict up to then is in), the logged switch lines whose
    /// client is known by then (named, or the one client calling cluster URLs from their
    /// process so far): whether each went back sooner than the switch-back delay allows
    /// ([`failover_flapping::logged_early`]), read before the probes it reads are pruned. A line
    /// whose client is still unknown a retention later is left to the end.
    pub(super) fn judge_switch_lines(&mut self, before: UnixNanos) {
        if self.unjudged_switches.is_empty() {
            return;
        }
        let min_gap = self.config.failover_flapping.switch_back_delay_nanos();
        let forget_before = before.saturating_sub(self.retention);
        let (lines, owners, probes, interner) =
            (&mut self.log_switches, &self.switch_owners, &self.probes, &self.interner);
        self.unjudged_switches.retain(|&index| {
            let line = &mut lines[index];
            if line.event.time_unix_nano >= before {
                return true;
            }
            let client = if line.named.is_some() { Some(line.named) } else { owners.owner(&line.process).copied() };
            match client.and_then(|client| Some((client, interner.get(client)?))) {
                Some((client, name)) => {
                    line.judged = Some((client, logged_early(probes, name, &line.event, min_gap)));
                    false
                }
                None => line.event.time_unix_nano >= forget_before,
            }
        });
    }
}

/// A logged switch line: the process that logged it and the client it names (interned), and,
/// once judged ([`Engine::judge_switch_lines`]), the client it was taken to be and whether it
/// went back sooner than the switch-back delay allows.
#[derive(Debug)]
pub(super) struct SwitchLine {
    pub(super) event: crate::log_events::LogEvent,
    pub(super) process: (Sym, Sym),
    pub(super) named: Sym,
    pub(super) judged: Option<(Sym, Option<failover_flapping::EarlySwitch>)>,
}

impl std::borrow::Borrow<crate::log_events::LogEvent> for SwitchLine {
    fn borrow(&self) -> &crate::log_events::LogEvent {
        &self.event
    }
}

/// `client`'s probe verdicts on the cluster at `address` ([`failover_flapping::probe_verdicts`]).
pub(super) fn verdicts_of(
    probes: &BTreeMap<ProbeKey, VecDeque<(UnixNanos, f64)>>,
    address: &str,
    client: &str,
) -> Vec<(UnixNanos, f64)> {
    failover_flapping::probe_verdicts(
        probes.iter().map(|((_, _, _, probed, _, probe_client), points)| {
            (probed.as_str(), probe_client.as_str(), points.iter().copied())
        }),
        address,
        client,
    )
}

/// [`failover_flapping::logged_early`] of `client`'s line, by the probes held.
fn logged_early(
    probes: &BTreeMap<ProbeKey, VecDeque<(UnixNanos, f64)>>,
    client: &str,
    event: &crate::log_events::LogEvent,
    min_gap: i64,
) -> Option<failover_flapping::EarlySwitch> {
    failover_flapping::logged_early(event, min_gap, |address| verdicts_of(probes, address, client))
}
