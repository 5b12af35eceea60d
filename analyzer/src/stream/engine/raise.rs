//! Anomalies found on compact data, built once with the batch detectors' constructors.

use super::*;

/// An anomaly found on compact data, to be built once with the shared constructors.
pub(super) enum Raise {
    Regression { index: usize, carried: StateId, seen: Contribution },
    Dropped { index: usize, carried: StateId, forwarded: StateId },
    Stale { index: usize, served: StateId, floor: Contribution },
    CrossClient { index: usize, served: StateId, staleness: f64, bound: i64, replaced_at: i64, newer_state: StateId },
    Failing(FailingRun),
    Flapping(Vec<crate::stream::client::Switch>),
}

/// The client's identity as the constructors want it (a timeline without calls).
pub(super) fn identity(interner: &Interner, state: &ClientState) -> ClientTimeline {
    ClientTimeline {
        client_id: interner.owned(state.client).unwrap_or_default(),
        namespace: interner.owned(state.namespace),
        cluster: interner.owned(state.cluster),
        system: interner.owned(state.system),
        calls: Vec::new(),
    }
}

/// The anomalies raised on one processed call of the client `state` keeps, built.
pub(super) fn build_anomalies(
    interner: &Interner,
    state: &ClientState,
    call: &Call,
    raised: Vec<Raise>,
    probes: &BTreeMap<ProbeKey, VecDeque<(UnixNanos, f64)>>,
    config: &AnalyzerConfig,
) -> Vec<Anomaly> {
    let timeline = identity(interner, state);
    raised.into_iter().filter_map(|raise| raise.build(interner, state, &timeline, Some(call), probes, config)).collect()
}

impl Raise {
    pub(super) fn build(
        self,
        interner: &Interner,
        state: &ClientState,
        timeline: &ClientTimeline,
        this: Option<&Call>,
        probes: &BTreeMap<ProbeKey, VecDeque<(UnixNanos, f64)>>,
        config: &AnalyzerConfig,
    ) -> Option<Anomaly> {
        // The call read in place (the constructors of the kinds raised most), or built whole.
        let view = |call| CallIn { call, interner };
        let current = || this.map(view);
        let materialized = || this.map(|call| call.materialize(interner));
        Some(match self {
            Raise::Regression { index, carried, seen } => {
                let this = current()?;
                let attempt = this.attempt(index);
                let seen_floor = seen.floor();
                let earlier = state.recent.iter().rev().map(|earlier| view(earlier));
                let overwriting = carried_state_regression::overwritten_by(earlier, &attempt, carried, &seen_floor);
                carried_state_regression::regression(
                    timeline,
                    &this,
                    &attempt,
                    carried,
                    &seen_floor,
                    &view(&seen.at.call),
                    overwriting.as_ref(),
                )
            }
            Raise::Dropped { index, carried, forwarded } => {
                let this = current()?;
                router_state_dropped::dropped(timeline, &this, &this.attempt(index), carried, forwarded)
            }
            Raise::Stale { index, served, floor } => {
                let this = current()?;
                stale_read::stale_read(
                    timeline,
                    &this,
                    &this.attempt(index),
                    served,
                    &floor.floor(),
                    &view(&floor.at.call),
                )
            }
            Raise::CrossClient { index, served, staleness, bound, replaced_at, newer_state } => {
                let this = &materialized()?;
                stale_read_cross_client::cross_client(
                    timeline,
                    this,
                    &this.attempts[index],
                    served,
                    staleness,
                    bound,
                    replaced_at,
                    newer_state,
                )
            }
            Raise::Failing(run) => {
                let first = run.first.attempt();
                let (start, end) = (first.start, run.end);
                if end.saturating_sub(start) < config.blind_failover_probe.min_seconds.saturating_mul(1_000_000_000) {
                    return None;
                }
                let address = interner.get(run.address).unwrap_or_default();
                let mut verdicts: Vec<(f64, &str)> = Vec::new();
                for ((_, _, _, probe_address, kind, probe_client), points) in probes {
                    if probe_address != address || !(probe_client.is_empty() || *probe_client == timeline.client_id) {
                        continue;
                    }
                    verdicts.extend(
                        points.iter().filter(|(at, _)| (start..=end).contains(at)).map(|(_, up)| (*up, kind.as_str())),
                    );
                }
                if verdicts.is_empty() || verdicts.iter().any(|(up, _)| *up < 0.5) {
                    return None;
                }
                let call = run.first.call.materialize(interner);
                blind_failover_probe::blind(
                    timeline,
                    &call.attempts[run.first.index],
                    run.sends,
                    end,
                    address,
                    verdicts[0].1,
                    verdicts.len(),
                )
            }
            Raise::Flapping(run) => {
                let materialized: Vec<lagscope_model::TimelineAttempt> =
                    run.iter().map(|(_, _, _, at, _)| at.attempt().materialize(interner)).collect();
                let name = |symbol: Sym| interner.get(symbol).unwrap_or_default();
                let switches: Vec<failover_flapping::Switch<'_>> = run
                    .iter()
                    .zip(&materialized)
                    .map(|((time, from, to, _, _), attempt)| (*time, name(*from), name(*to), attempt))
                    .collect();
                let references: Vec<&failover_flapping::Switch<'_>> = switches.iter().collect();
                let min_gap = config.failover_flapping.switch_back_delay_nanos();
                let early = run.iter().find_map(|switch| switch.4.clone());
                failover_flapping::flapping(timeline, &references, min_gap, early)
            }
        })
    }
}
