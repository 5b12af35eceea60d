//! A final call through the per-call and per-client detectors, in client order; the routers'
//! answers fed to their windows; idle clients finished.

use super::*;

impl Engine<'_> {
    /// Runs the per-call and per-client detectors over a processed call, in client order.
    pub(super) fn process(&mut self, client: Sym, namespace: Sym, call: Rc<Call>) {
        let Engine {
            config,
            kinds,
            interner,
            clients,
            namespaces,
            anomalies,
            data_ends,
            answers,
            no_namenodes_errors,
            sequence,
            probes,
            switch_owners,
            logged_disables,
            pinned,
            deferred,
            ..
        } = self;
        let Some(state) = clients.get_mut(&(client, namespace)) else { return };
        data_ends.call_or_line(state.cluster, call.end);
        state.fold(call.start);
        let scope = namespaces.entry((state.cluster, state.namespace)).or_default();
        let bound =
            interner.get(state.system).and_then(|system| config.stale_read.cross_client_bounds_seconds.get(system));
        let floors = CallFloors {
            writes: state.writes.as_ref().map(Contribution::floor),
            reads: state.reads.as_ref().map(Contribution::floor),
        };
        let mut raised = Vec::new();
        for (index, attempt) in call.attempts.iter().enumerate() {
            let at = || AttemptAt { call: call.clone(), index };
            if kinds.carried_state_regression
                && let (Some(seen), Some(carried)) = (&state.seen, attempt.carried())
                && seen.state.saturating_sub(carried) >= config.carried_state_regression.min_states_behind.max(1)
            {
                raised.push(Raise::Regression { index, carried, seen: seen.clone() });
            }
            if kinds.router_state_dropped
                && let (Some(carried), Some(forwarded)) = (attempt.carried(), attempt.router_carried())
                && carried.saturating_sub(forwarded) >= config.router_state_dropped.min_states_behind.max(1)
            {
                raised.push(Raise::Dropped { index, carried, forwarded });
            }
            let served_read = call.op == known::READ && attempt.ok;
            if kinds.stale_read
                && served_read
                && let Some(served) = attempt.served()
            {
                if !stale_read::exempt(interner.get(attempt.consistency), config)
                    && let Some(broken) = floors.broken_by(served, config.stale_read.min_states_behind)
                {
                    let floor = match broken.source {
                        FloorSource::Write => state.writes.clone(),
                        FloorSource::Read => state.reads.clone(),
                    };
                    if let Some(floor) = floor {
                        raised.push(Raise::Stale { index, served, floor });
                    }
                }
                if let Some(&bound) = bound
                    && floors.broken_by(served, 1).is_none()
                {
                    // Reads the reports made a bound before the read ended: put off while a
                    // call begun by then is still to be processed (see `Deferred`).
                    let due = attempt.end.saturating_sub(bound.saturating_mul(1_000_000_000));
                    if due <= call.start {
                        raised.extend(cross_client(&scope.committed, index, attempt, served, bound));
                    } else {
                        state.deferred += 1;
                        deferred.push_back(Deferred {
                            due,
                            key: (client, namespace),
                            check: Check::CrossClient(at(), served, bound),
                        });
                    }
                }
            }
            if kinds.untrusted_state {
                if let Some(carried) = attempt.carried() {
                    // Reads the reports made by the attempt's start: a retry's is after its
                    // call's, and calls begun between are processed later (see `Deferred`).
                    if state.deferred == 0 && attempt.start <= call.start {
                        untrusted(state, &scope.committed, attempt, carried, at, config.untrusted_state.margin_states);
                    } else {
                        state.deferred += 1;
                        // (Bounded: an attempt a horizon from its call's start opens a call of
                        // its own, so none holds the queue long.)
                        deferred.push_back(Deferred {
                            due: attempt.start,
                            key: (client, namespace),
                            check: Check::Untrusted(at(), carried),
                        });
                    }
                }
                if let Some(forwarded) = attempt.router_carried()
                    && attempt.carried().is_none_or(|own| own < forwarded)
                    && scope.forwarded.len() < MAX_FORWARDED
                {
                    scope.forwarded.push((client, forwarded, attempt.carried(), attempt.start));
                }
            }
            if kinds.follower_read_disabled && call.op == known::READ {
                let lines = logged_disables.get(&client).map_or(&[][..], Vec::as_slice);
                follow_logged(state, lines, attempt);
                follow_reads(state, &call, attempt, at);
            }
            if attempt.server_address.is_some() {
                if kinds.blind_failover_probe
                    && let Some(run) = failing_sends(state, attempt, at)
                {
                    raised.push(Raise::Failing(run));
                }
                if kinds.failover_flapping {
                    let min_gap = config.failover_flapping.switch_back_delay_nanos();
                    let early = |time, from: Sym, to: Sym| {
                        let client_id = interner.get(client).unwrap_or_default();
                        let verdicts = |address: &str| verdicts_of(probes, address, client_id);
                        let (from, to) = (interner.get(from).unwrap_or_default(), interner.get(to).unwrap_or_default());
                        failover_flapping::early_switch_back(time, from, to, min_gap, verdicts)
                    };
                    if let Some(run) = switches(state, attempt, at, min_gap, early) {
                        raised.push(Raise::Flapping(run));
                    }
                    if attempt.client_span.node.is_some() {
                        switch_owners.note((state.cluster, attempt.client_span.node), client);
                    }
                }
                state.last_address = attempt.server_address;
            }
            if kinds.no_namenodes_window && attempt.router_node.is_some() {
                let no_namenodes = *no_namenodes_errors.entry(attempt.error_type).or_insert_with(|| {
                    interner
                        .get(attempt.error_type)
                        .is_some_and(|error| error.ends_with(no_namenodes_window::NO_NAMENODES))
                });
                if no_namenodes || attempt.ok {
                    *sequence += 1;
                    let answer = Answer {
                        start: attempt.start,
                        order: *sequence,
                        end: attempt.end,
                        no_namenodes,
                        client,
                        tried: attempt.served_by,
                        logged: false,
                    };
                    answers.push(RouterAnswer(answer, (state.cluster, state.namespace, attempt.router_node)));
                }
            }
        }
        if kinds.pinned_retry {
            // Judged once every call that started by the run's end is processed: the answers
            // of attempts joined by call id are known only then.
            for run in pinned_runs(&call, config.pinned_retry.min_attempts) {
                let first = &call.attempts[run[0]];
                pinned.push(PendingPinned {
                    start: first.start,
                    end: call.attempts[run[run.len() - 1]].end,
                    node: first.answered_by(),
                    scope: (state.cluster, state.namespace),
                    client: identity(interner, state),
                    call: call.clone(),
                    run,
                });
            }
        }
        if !raised.is_empty() {
            anomalies.extend(build_anomalies(interner, state, &call, raised, probes, config));
        }
        state.contribute(&call, known::READ, known::WRITE);
    }

    /// Feeds the routers' answers that started by `until` to their windows, in start order.
    pub(super) fn release_answers(&mut self, until: UnixNanos) {
        let settings = &self.config.no_namenodes_window;
        let max_gap = settings.max_gap_seconds * 1_000_000_000;
        while let Some(RouterAnswer(answer, key)) = self.answers.pop_through(until) {
            let gap_too_long =
                self.windows.get(&key).is_some_and(|window| answer.start.saturating_sub(window.last_start) > max_gap);
            if (!answer.no_namenodes || gap_too_long)
                && let Some(window) = self.windows.remove(&key)
            {
                self.flush_window(key, window);
            }
            if answer.no_namenodes {
                let window = self.windows.entry(key).or_insert_with(|| RouterWindow {
                    first_start: answer.start,
                    last_end: answer.end,
                    ..RouterWindow::default()
                });
                window.last_start = answer.start;
                window.last_end = window.last_end.max(answer.end);
                window.attempts[usize::from(answer.logged)] += 1;
                if answer.client.is_some() {
                    window.clients.insert(answer.client);
                }
                if answer.tried.is_some() {
                    *window.tried[usize::from(answer.logged)].entry(answer.tried).or_default() += 1;
                }
            }
        }
    }

    pub(super) fn flush_window(&mut self, (cluster, namespace, router): RouterKey, window: RouterWindow) {
        let settings = &self.config.no_namenodes_window;
        if window.last_start.saturating_sub(window.first_start)
            < settings.min_window_seconds.saturating_mul(1_000_000_000)
        {
            return;
        }
        let interner = &self.interner;
        let (start, end) = (window.first_start, window.last_end);
        let scope = self.namespaces.get(&(cluster, namespace));
        // The first report in arrival order, else the first execution in the order the batch
        // detector meets them (by client, then in time).
        let from_metrics =
            scope.and_then(|scope| scope.active_reported.within(start, end).min_by_key(|fact| fact.order));
        let active = from_metrics.map(|fact| fact.node).filter(|node| node.is_some()).or_else(|| {
            scope.and_then(|scope| {
                scope
                    .active_served
                    .within(start, end)
                    .filter(|fact| fact.node.is_some())
                    .min_by_key(|fact| (interner.get(fact.client), fact.order))
                    .map(|fact| fact.node)
            })
        });
        let tried = window
            .tried
            .each_ref()
            .map(|tried| tried.iter().filter_map(|(node, count)| Some((interner.get(*node)?, *count))).collect());
        let (attempts, tried_first) = no_namenodes_window::counted(window.attempts, tried);
        let found = no_namenodes_window::Window {
            start,
            end,
            seconds: window.last_start.saturating_sub(window.first_start) as f64 / 1e9,
            attempts,
            // (As the batch detector: an empty client id names no client, as a log line's.)
            clients: window
                .clients
                .iter()
                .filter_map(|client| interner.get(*client).filter(|client| !client.is_empty()))
                .map(str::to_string)
                .collect(),
            tried_first: tried_first.map(str::to_string),
            active: active.and_then(|node| interner.owned(node)),
        };
        let router = interner.get(router).unwrap_or_default();
        self.anomalies.push(no_namenodes_window::window_anomaly(
            interner.get(cluster),
            interner.get(namespace),
            router,
            &found,
        ));
    }

    /// Finishes and forgets the clients whose latest attempt ended before `before` (a horizon
    /// plus the retention ago): their calls are all processed, and what only their whole
    /// history decides is decided now. A client that comes back starts afresh.
    pub(super) fn evict_idle_clients(&mut self, before: UnixNanos) {
        let idle: Vec<(Sym, Sym)> = self
            .clients
            .iter()
            .filter(|(_, state)| state.last_seen < before && state.deferred == 0)
            .map(|(key, _)| *key)
            .collect();
        for key in idle {
            self.finish_client(key);
            self.clients.remove(&key);
            self.stats.evicted_clients += 1;
        }
    }

    /// What only the whole history decides: a client's untrusted run, follower reads off
    /// for good, its last failing run and switches.
    pub(super) fn finish_client(&mut self, key: (Sym, Sym)) {
        let Some(state) = self.clients.get(&key) else { return };
        let mut raised = Vec::new();
        if let Some(run) = &state.failing {
            raised.push(Raise::Failing(FailingRun {
                first: run.first.clone(),
                address: run.address,
                end: run.end,
                sends: run.sends,
            }));
        }
        if state.switches.len() >= 2 {
            raised.push(Raise::Flapping(state.switches.clone()));
        }
        let timeline = identity(&self.interner, state);
        let interner = &self.interner;
        for raise in raised {
            if let Some(anomaly) = raise.build(interner, state, &timeline, None, &self.probes, self.config) {
                self.anomalies.push(anomaly);
            }
        }
        let min_reads_after = self.config.follower_read_disabled.min_reads_after;
        let span_disabled = state.rejection.as_ref().filter(|rejection| rejection.for_good(min_reads_after));
        // The client's lines after its last read take effect now; the last one is in force.
        let lines = self.logged_disables.get(&state.client).map_or(&[][..], Vec::as_slice);
        let after_reads =
            lines.get(state.logged_next..).and_then(<[_]>::last).map(|&origin| logged_disable(state, origin));
        let logged = after_reads.as_ref().or(state.logged.as_ref()).filter(|logged| logged.for_good(min_reads_after));
        if let Some(rejection) = span_disabled {
            let call = rejection.origin.call.materialize(interner);
            self.anomalies.push(follower_read_disabled::disabled_for_good(
                &timeline,
                &call,
                &call.attempts[rejection.origin.index],
                rejection.reads_after,
                interner.owned(rejection.consistency_before),
                rejection.consistencies_after.iter().filter_map(|sym| interner.owned(*sym)).collect(),
                rejection.last_end,
            ));
        } else if let Some(logged) = logged {
            let (time, peer) = logged.origin;
            self.anomalies.push(follower_read_disabled::disabled_as_logged(
                &timeline,
                time,
                interner.owned(peer),
                logged.reads_after,
                interner.owned(logged.consistency_before),
                logged.consistencies_after.iter().filter_map(|sym| interner.owned(*sym)).collect(),
                logged.last_end,
            ));
        }
        if let Some(run) = &state.untrusted {
            let margin = self.config.untrusted_state.margin_states;
            let limit = run.committed.saturating_add(margin);
            let since = run.first.attempt().start;
            let victims: BTreeSet<String> = self
                .namespaces
                .get(&(state.cluster, state.namespace))
                .into_iter()
                .flat_map(|scope| &scope.forwarded)
                .filter(|(other, forwarded, own, start)| {
                    *other != state.client
                        && *start >= since
                        && untrusted_state::poisoned(Some(*forwarded), *own, limit)
                })
                .filter_map(|(other, _, _, _)| interner.owned(*other))
                .collect();
            let call = run.first.call.materialize(interner);
            let summary = untrusted_state::Untrusted {
                first_call: &call,
                first: &call.attempts[run.first.index],
                committed: run.committed,
                last_end: run.last_end,
                carried: run.carried,
                requests: run.requests,
                refused: run.refused,
                pools: run
                    .pools
                    .iter()
                    .filter_map(|(router, server)| Some((interner.owned(*router)?, interner.owned(*server)?)))
                    .collect(),
                victims,
            };
            self.anomalies.push(untrusted_state::untrusted(&timeline, &summary, margin));
        }
    }
}

/// Which namespace facts the running detectors read.
#[derive(Debug, Clone, Copy)]
pub(super) struct Facts {
    /// Committed states (cross-client stale reads, untrusted states).
    pub(super) committed: bool,
    /// Who answered when (pinned retries).
    pub(super) served: bool,
    /// Executions as the active (NoNamenodesAvailable windows).
    pub(super) active: bool,
}

/// Records what a joined attempt tells about its namespace, the `facts` the running detectors
/// read: a committed state reported, an answer served, an execution as the active.
pub(super) fn record_facts(
    facts: Facts,
    scope: &mut NamespaceState,
    attempt: &Attempt,
    client: Sym,
    sequence: &mut u64,
) {
    if facts.committed
        && let Some(committed) = attempt.committed()
    {
        scope.committed.report(attempt.end, committed);
    }
    if attempt.ok && attempt.served_by.is_some() {
        *sequence += 1;
        let fact = Fact { at: attempt.end, node: attempt.served_by, order: *sequence, client };
        if facts.served {
            scope.served.push(fact);
        }
        if facts.active && attempt.served_role == known::ACTIVE {
            scope.active_served.push(Fact { at: attempt.start, ..fact });
        }
    }
}

/// follower_read_disabled, one read attempt at a time: remembers the latest follower
/// rejection after which no read went to a follower, and the reads since.
fn follow_reads(state: &mut ClientState, call: &Call, attempt: &Attempt, at: impl Fn() -> AttemptAt) {
    let on_follower = matches!(attempt.served_role, known::FOLLOWER | known::OBSERVER);
    let follower_mode = attempt.follower_read == Some(true);
    if attempt.ok && on_follower && follower_mode {
        state.used_followers = true;
        state.last_follower_consistency = attempt.consistency;
        state.rejection = None;
        return;
    }
    if !attempt.ok && on_follower && follower_mode {
        state.rejection =
            Some(Rejection::new(at(), state.used_followers, state.last_follower_consistency, attempt.end));
        return;
    }
    if let Some(rejection) = &mut state.rejection
        && attempt.ok
        && rejection.counts(attempt.served_by, attempt.consistency)
        && rejection.origin.call.call_id != call.call_id
    {
        rejection.count(attempt.consistency, attempt.end);
    }
}

/// follower_read_disabled from the client's own log lines, one read attempt at a time (before
/// [`follow_reads`] counts the attempt): each line takes effect before the first read that
/// starts after it, as the batch detector walks them.
fn follow_logged(state: &mut ClientState, lines: &[(UnixNanos, Sym)], attempt: &Attempt) {
    while let Some(&origin) = lines.get(state.logged_next).filter(|(time, _)| *time <= attempt.start) {
        state.logged = Some(logged_disable(state, origin));
        state.logged_next += 1;
    }
    let on_follower = matches!(attempt.served_role, known::FOLLOWER | known::OBSERVER);
    if attempt.ok && on_follower && attempt.follower_read == Some(true) {
        state.logged = None;
    } else if let Some(logged) =
        state.logged.as_mut().filter(|logged| attempt.ok && logged.counts(attempt.served_by, attempt.consistency))
    {
        logged.count(attempt.consistency, attempt.end);
    }
}

fn logged_disable(state: &ClientState, origin: (UnixNanos, Sym)) -> crate::stream::client::LoggedDisable {
    crate::stream::client::LoggedDisable::new(origin, state.used_followers, state.last_follower_consistency, origin.0)
}

/// blind_failover_probe, one attempt to a cluster URL at a time: extends the run of failed
/// sends, or returns the run it ends.
fn failing_sends(state: &mut ClientState, attempt: &Attempt, at: impl Fn() -> AttemptAt) -> Option<FailingRun> {
    let failed = !attempt.ok;
    let same_address = state.failing.as_ref().is_none_or(|run| run.address == attempt.server_address);
    if failed && same_address {
        let run = state.failing.get_or_insert_with(|| FailingRun {
            first: at(),
            address: attempt.server_address,
            end: attempt.end,
            sends: 0,
        });
        run.end = attempt.end;
        run.sends += 1;
        return None;
    }
    let ended = state.failing.take();
    if failed {
        state.failing = Some(FailingRun { first: at(), address: attempt.server_address, end: attempt.end, sends: 1 });
    }
    ended
}

/// failover_flapping, one attempt to a cluster URL at a time: records a switch, and returns
/// the run of quick switches a slow one ends.
pub(super) fn switches(
    state: &mut ClientState,
    attempt: &Attempt,
    at: impl Fn() -> AttemptAt,
    min_gap: i64,
    early: impl Fn(UnixNanos, Sym, Sym) -> Option<failover_flapping::EarlySwitch>,
) -> Option<Vec<crate::stream::client::Switch>> {
    if !state.last_address.is_some() || state.last_address == attempt.server_address {
        return None;
    }
    let (from, to) = (state.last_address, attempt.server_address);
    let switch = (attempt.start, from, to, at(), early(attempt.start, from, to));
    let ended = match state.switches.last() {
        Some(previous) if switch.0.saturating_sub(previous.0) >= min_gap => Some(std::mem::take(&mut state.switches)),
        _ => None,
    };
    state.switches.push(switch);
    ended.filter(|run| run.len() >= 2)
}

/// Runs of at least `min_attempts` consecutive refused attempts of a call, sent straight to
/// one server, refused the same way (indexes into the call's attempts).
fn pinned_runs(call: &Call, min_attempts: usize) -> Vec<Vec<usize>> {
    pinned_retry::run_indexes(
        &call.attempts,
        min_attempts,
        |attempt| !attempt.ok && !attempt.router_node.is_some() && attempt.answered_by().is_some(),
        |last, attempt| last.answered_by() == attempt.answered_by() && last.error_type == attempt.error_type,
    )
}

/// A check of an attempt against the committed states its namespace's servers reported by
/// `due`, put off until every call begun by then is processed. The attempts that report them
/// are mostly known sooner (joined through their traces the lateness after they end), but an
/// attempt that waits to join hops by call id (its client's hops came without trace context)
/// reports only when its call is processed, in start order: a retry, or a read that ended a
/// bound after its call began, is judged without the reports of the calls begun meanwhile
/// unless it waits for them. A client's untrusted run is summed in its calls' order: once one
/// of its checks waits, its `untrusted_state` checks after it wait too.
pub(super) struct Deferred {
    pub(super) due: UnixNanos,
    /// The (client, namespace) of [`Engine::clients`].
    pub(super) key: (Sym, Sym),
    pub(super) check: Check,
}

/// The check put off, with the attempt it judges.
pub(super) enum Check {
    /// `untrusted_state`: the state the attempt carried.
    Untrusted(AttemptAt, StateId),
    /// A read's cross-client staleness: the state served, the system's bound in seconds.
    CrossClient(AttemptAt, StateId, i64),
}

/// untrusted_state, one attempt carrying a state at a time: extends the client's run of
/// requests carrying a state beyond the highest committed state reported by their start.
fn untrusted(
    state: &mut ClientState,
    committed: &Committed,
    attempt: &Attempt,
    carried: StateId,
    at: impl Fn() -> AttemptAt,
    margin: StateId,
) {
    let Some(committed) = committed.highest_at(attempt.start) else { return };
    if carried <= committed.saturating_add(margin) {
        return;
    }
    let run = state.untrusted.get_or_insert_with(|| UntrustedRun {
        first: at(),
        committed,
        last_end: attempt.end,
        carried,
        requests: 0,
        refused: 0,
        pools: BTreeSet::new(),
    });
    run.last_end = attempt.end;
    run.carried = run.carried.max(carried);
    run.requests += 1;
    run.refused += usize::from(!attempt.ok);
    if attempt.router_node.is_some() && attempt.served_by.is_some() {
        run.pools.insert((attempt.router_node, attempt.served_by));
    }
}

/// A read (the attempt at `index`, served `served`) still served after another client's
/// server had reported a newer state for longer than the system's `bound` (seconds).
fn cross_client(committed: &Committed, index: usize, attempt: &Attempt, served: StateId, bound: i64) -> Option<Raise> {
    let (replaced_at, newer_state) = committed.first_above(served)?;
    let staleness = attempt.end.saturating_sub(replaced_at) as f64 / 1e9;
    (staleness > bound as f64).then_some(Raise::CrossClient {
        index,
        served,
        staleness,
        bound,
        replaced_at,
        newer_state,
    })
}

impl Engine<'_> {
    /// Judges the put-off checks ([`Deferred`]) due by `through`, in the order they were put
    /// off: every call begun by then must be processed.
    pub(super) fn judge_deferred(&mut self, through: UnixNanos) {
        let margin = self.config.untrusted_state.margin_states;
        while self.deferred.front().is_some_and(|deferred| deferred.due <= through) {
            let Some(Deferred { key, check, .. }) = self.deferred.pop_front() else { break };
            let Some(state) = self.clients.get_mut(&key) else { continue };
            state.deferred -= 1;
            let Some(scope) = self.namespaces.get(&(state.cluster, state.namespace)) else { continue };
            match check {
                Check::Untrusted(at, carried) => {
                    untrusted(state, &scope.committed, at.attempt(), carried, || at.clone(), margin);
                }
                Check::CrossClient(at, served, bound) => {
                    if let Some(raise) = cross_client(&scope.committed, at.index, at.attempt(), served, bound) {
                        let anomalies =
                            build_anomalies(&self.interner, state, &at.call, vec![raise], &self.probes, self.config);
                        self.anomalies.extend(anomalies);
                    }
                }
            }
        }
    }
}

/// A run of attempts pinned to one node, waiting until the answers given by other nodes
/// within it are all known.
pub(super) struct PendingPinned {
    pub(super) start: UnixNanos,
    pub(super) end: UnixNanos,
    pub(super) node: Sym,
    /// The namespace's (cluster, namespace), whose answers are read.
    pub(super) scope: (Sym, Sym),
    /// The client's identity (its state may be evicted by then).
    pub(super) client: ClientTimeline,
    pub(super) call: Rc<Call>,
    pub(super) run: Vec<usize>,
}

impl PendingPinned {
    /// The anomaly, if another node of the namespace served within the run.
    pub(super) fn judge(self, interner: &Interner, scope: Option<&NamespaceState>) -> Option<Anomaly> {
        let others: BTreeSet<&str> = scope?
            .served
            .within(self.start, self.end)
            .map(|fact| fact.node)
            .filter(|other| *other != self.node)
            .filter_map(|other| interner.get(other))
            .collect();
        if others.is_empty() {
            return None;
        }
        let call = self.call.materialize(interner);
        let attempts: Vec<&lagscope_model::TimelineAttempt> =
            self.run.iter().map(|index| &call.attempts[*index]).collect();
        let node = interner.get(self.node).unwrap_or_default();
        Some(pinned_retry::pinned(&self.client, &call, &attempts, node, &others))
    }
}
