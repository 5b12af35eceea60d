//! Letting go of what no later call can change: the cuts, what a settle keeps, and what
//! arrives behind a cut.

use super::*;
use join::Ancestor;

impl HeldTimelines {
    /// Lets go of what no later call can change, so that what is held, and what every pass
    /// judges again, follows the telemetry of the last minutes and not the client's whole
    /// history.
    ///
    /// Per timeline, the cut is the latest call start at or before `before` (and before
    /// `hold(namespace)`: an anomaly still growing from an earlier start) that
    /// no earlier call is still running at; every call that starts before it ended by then.
    /// Those calls are let go (their attempts, the hops joined to them, and copies sent again),
    /// except the ones later calls are judged by, which stay as witnesses: the calls that set
    /// the write floor, the read floor and the highest state seen in force at the cut (so the
    /// floors of every later call are exactly those of the whole history: every call let go
    /// completed before any later call started), the last call before the cut (the attempt a
    /// later one switches cluster from), and the last follower read with the rejection that
    /// turned follower reads off after it, and the call a server reported the highest committed
    /// state in (an untrusted state is judged against it). A rejection still in force holds
    /// the cut at its call.
    /// Spans of no call (hops that joined none, other spans) that ended before `before` go too.
    ///
    /// A timeline's cut moves at most [`SETTLE_STEP`] past its last cut (its first call's start
    /// when it was never cut) per settle: a backlog (the calls an anomaly held while it grew,
    /// minutes of a bulk client's spans) is let go over a few settles rather than in one,
    /// which took 0.1-0.2 s for 18 000 spans under load.
    ///
    /// Taking the calls before a cut out does not mark the calls after it changed: what the
    /// per-call detectors found in those stays found ([`CallVerdicts`]), and what the metrics
    /// told them stays told, unless the timeline's first attempt is now of another cluster.
    ///
    /// Anomalies about attempts before a timeline's cut ([`HeldTimelines::settled_from`]), and
    /// those that ended before a cut of their namespace, were judged with the whole history by
    /// the passes before it; judged again over what is left they may differ, and are not to be
    /// reported ([`HeldTimelines::is_settled`]). Returns the spans let go, with their keys.
    pub fn settle(&mut self, before: UnixNanos, hold: impl Fn(Option<&str>) -> UnixNanos) -> Vec<(SpanKey, Span)> {
        self.refresh();
        self.last_settle = before;
        self.last_settle_newest = self.last_start().unwrap_or(before).max(before);
        let mut going: BTreeSet<SpanKey> = BTreeSet::new();
        let mut kept_attempts: HashSet<SpanKey> = HashSet::default();
        let mut cuts: Vec<(GroupKey, UnixNanos)> = Vec::new();
        for (key, group) in &mut self.groups {
            let calls = &group.timeline.calls;
            let Some(first) = calls.first() else { continue };
            // From the last cut, or from the first call when there was none: a timeline whose
            // cut a growing anomaly held from its first call has minutes to let go too.
            let from = self.settled.get(key).copied().unwrap_or(first.start_unix_nano);
            let target = before.min(hold(key.1.as_deref())).min(from.saturating_add(SETTLE_STEP));
            let (_, rejection) = follower_history(calls);
            let target = rejection.map_or(target, |index| target.min(calls[index].start_unix_nano));
            // The latest start no earlier call is still running at.
            let (mut cut, mut running_until) = (None, UnixNanos::MIN);
            for (index, call) in calls.iter().enumerate() {
                if call.start_unix_nano > target {
                    break;
                }
                if running_until <= call.start_unix_nano {
                    cut = Some(index);
                }
                running_until = running_until.max(call.end_unix_nano);
            }
            let Some(cut) = cut.filter(|cut| *cut > 0) else { continue };
            let at = calls[cut].start_unix_nano;
            cuts.push((key.clone(), at));
            // What was found about the calls before the cut is reported no more; what was
            // found about the later ones stays found (`CallVerdicts`).
            if let Some(verdicts) = &mut group.verdicts {
                verdicts.found.retain(|(_, start, _)| *start >= at);
            }
            // A call after the cut's ended after it started: the floors there are the prefix's.
            let prefix = &calls[..calls.partition_point(|call| call.start_unix_nano <= at)];
            let floors_at = floors(prefix)[cut];
            let seen_at = seen_before(prefix)[cut];
            let (follower_read, rejection) = follower_history(&calls[..cut]);
            // The highest committed state a server reported before the cut (the first report
            // of it): what every later attempt's `highest committed known` includes.
            let committed = calls[..cut]
                .iter()
                .enumerate()
                .filter_map(|(index, call)| {
                    Some((call.attempts.iter().filter_map(|attempt| attempt.committed).max()?, index))
                })
                .min_by_key(|(committed, index)| (std::cmp::Reverse(*committed), *index))
                .map(|(_, index)| index);
            let witnesses: BTreeSet<usize> = [floors_at.writes, floors_at.reads, seen_at]
                .into_iter()
                .flatten()
                .map(|contribution| contribution.call_index)
                .chain([Some(cut - 1), follower_read, rejection, committed].into_iter().flatten())
                .filter(|index| *index < cut)
                .collect();
            for index in witnesses {
                let (start, end, call_key) = &group.order[index];
                let entry = &group.calls[call_key];
                kept_attempts.extend(entry.attempts.iter().filter(|attempt| (*start..=*end).contains(&attempt.0)));
            }
            for attempt in group.attempts.range(..(at, 0)) {
                if !kept_attempts.contains(attempt) {
                    // (The earliest let go names the timeline's cluster and system from now on.)
                    let span = &self.spans[attempt].span;
                    if group.first_let_go.as_ref().is_none_or(|(first, _, _)| attempt < first) {
                        let resource = &span.resource;
                        group.first_let_go = Some((*attempt, resource.cluster.clone(), resource.system.clone()));
                    }
                    going.insert(*attempt);
                    going.extend(self.attempt_hops.get(attempt).into_iter().flatten().map(|(hop, _)| *hop));
                    if let Some(call) = call_hash(span) {
                        let start = self.let_go_calls.entry(call).or_insert(attempt.0);
                        *start = (*start).min(attempt.0);
                    }
                }
            }
        }
        // Spans of no call that ended before the cut-off: a hop that joined no attempt, a
        // copy sent again, a span of neither kind. (The hops of the attempts going are going.)
        // A hop whose trace names an ancestor not held yet waits for it up to a horizon, where
        // the clients of its namespace send their attempts: there the ancestor is a span still
        // to come (a router's or a client's of a long call, exported when the call ends, while
        // the hops under its first attempts ended and came long before). Let go, it would make
        // that span late. Where no client of the namespace sends its attempts, the ancestors
        // are spans no one exports, and its hops go at the cut-off. So do the oldest of those
        // waiting past [`MAX_WAITING_HOPS`] (clients that propagate trace context and export
        // nothing, beside clients that export, would otherwise fill what is held).
        let sending: HashSet<&Option<String>> = self.groups.keys().map(|(_, namespace)| namespace).collect();
        let horizon = self.horizon;
        let (mut waiting, mut loose_going) = (Vec::new(), Vec::new());
        for key in self.loose.range(..(before, 0)) {
            let span = &self.spans[key].span;
            if span.end_unix_nano >= before || self.bridges_to_kept(span, &going) {
                continue;
            }
            if span.end_unix_nano.saturating_add(horizon) >= before
                && sending.contains(&span.call.namespace)
                && self.awaits_ancestor(span)
            {
                waiting.push(*key);
            } else {
                loose_going.push(*key);
            }
        }
        loose_going.extend_from_slice(&waiting[..waiting.len().saturating_sub(MAX_WAITING_HOPS)]);
        for key in loose_going {
            going.insert(key);
            let span = &self.spans[&key].span;
            if is_hop(span) {
                let parent = ids_hash(span.trace_id.as_deref(), span.parent_span_id.as_deref());
                for orphan in parent.into_iter().chain(call_hash(span)) {
                    let end = self.orphans.entry(orphan).or_insert(span.end_unix_nano);
                    *end = (*end).max(span.end_unix_nano);
                }
            }
        }
        self.orphans.retain(|_, end| end.saturating_add(horizon) >= before);
        let kept_from = before.saturating_sub(horizon.saturating_mul(2));
        self.let_go_calls.retain(|_, start| *start >= kept_from);
        let mut let_go = Vec::with_capacity(going.len());
        for key in going {
            if let Some(span) = self.remove(key) {
                let_go.push((key, span));
            }
        }
        // Joined again now, knowing which calls the settle let go.
        self.join_again(&cuts.iter().cloned().collect());
        for (key, at) in cuts {
            let in_namespace = self.namespace_cuts.entry(key.1.clone()).or_insert(UnixNanos::MIN);
            *in_namespace = (*in_namespace).max(at);
            let settled = self.settled.entry(key).or_insert(UnixNanos::MIN);
            *settled = (*settled).max(at);
        }
        let groups = &self.groups;
        self.settled.retain(|key, _| groups.contains_key(key));
        let_go
    }

    /// Whether `span`, a span of no call, is a link in the trace between an attempt a settle
    /// keeps and the hops under it (a span of neither kind between a client's attempt and the
    /// router or server under it, which the join walks through): it descends from that
    /// attempt, or from a root hop joined to it. Let go, it would cut the kept attempt from its
    /// hops, and the witness that gives later calls their floors would lose the node and state
    /// that served it; it goes with the attempt.
    fn bridges_to_kept(&self, span: &Span, going: &BTreeSet<SpanKey>) -> bool {
        if is_hop(span) || span.parent_span_id.is_none() {
            return false;
        }
        let attempt = match self.ancestor(span) {
            Some(Ancestor::Attempt(attempt)) => Some(attempt),
            Some(Ancestor::RootHop(root)) => {
                self.hops.get(&root).and_then(|hop| hop.attempt).map(|(attempt, _)| attempt)
            }
            None => None,
        };
        attempt.is_some_and(|attempt| !going.contains(&attempt))
    }

    /// The latest cut of any timeline: before it, some calls were let go (what is computed per
    /// minute over every timeline is partial there).
    pub fn settled_through(&self) -> UnixNanos {
        self.namespace_cuts.values().copied().max().unwrap_or(UnixNanos::MIN)
    }

    /// The `before` of the last [`HeldTimelines::settle`] (`UnixNanos::MIN`: none yet).
    pub fn last_settle(&self) -> UnixNanos {
        self.last_settle
    }

    /// Where `settle` last cut the timeline of (client id, namespace): anomalies about
    /// attempts that start before this are not the held window's to report.
    pub fn settled_from(&self, client_id: &str, namespace: Option<&str>) -> UnixNanos {
        self.settled.get(&(client_id.to_string(), namespace.map(str::to_string))).copied().unwrap_or(UnixNanos::MIN)
    }

    /// Whether `span`, not held yet, arrived too late for these timelines: what it belongs to
    /// was settled before it came (let go, or judged without it). A span naming a client
    /// starts before that client's timeline's cut in its namespace; one naming none (a hop
    /// joined by trace) starts before the latest cut of its namespace, and the attempt (or
    /// root hop) it would join is not held; any span that hops a settle let go while they
    /// waited for it would have joined (their parent, or an attempt of their call); and an
    /// attempt of a call a settle let go, within a horizon of that call's start. Holding it
    /// would not judge it whole: only reading what it belongs to anew from the store does.
    pub fn is_late(&self, span: &Span) -> bool {
        self.settling_to_hold(span).is_some()
    }

    /// For a late span ([`HeldTimelines::is_late`]; none when it is not), how far behind the
    /// newest span the last settle would have had to cut to hold it: as far as it started
    /// before that settle's newest span when hops let go waited for it (they ended before the
    /// cut-off, and it starts before them); when its call was let go, that much further than
    /// the settle cut as its call started before its timeline's cut; when it starts before
    /// its timeline's cut, or its
    /// namespace's, that much further than the settle cut. (The live analyzer widens its
    /// settling by it, `held::Settling`.)
    pub fn settling_to_hold(&self, span: &Span) -> Option<UnixNanos> {
        let start = span.start_unix_nano;
        // A span that hops let go without it would have joined (a parent, an attempt of their
        // call): they are gone. (Rare: a hop whose attempt never came, or came that late.)
        if !self.orphans.is_empty()
            && (ids_hash(span.trace_id.as_deref(), span.span_id.as_deref()).into_iter())
                .chain(call_hash(span))
                .any(|hash| self.orphans.contains_key(&hash))
        {
            return Some(self.last_settle_newest.saturating_sub(start).max(0));
        }
        // An attempt of a call a settle let go (a retry begun long after the call): it was
        // judged without this attempt, which alone would be a call of its own.
        if !self.let_go_calls.is_empty()
            && is_client_attempt(span)
            && let Some(&call_start) = call_hash(span).and_then(|call| self.let_go_calls.get(&call))
            && (call_start..=call_start.saturating_add(self.horizon)).contains(&start)
        {
            // (The settle cut its timeline this far past the call's start.)
            let cut =
                self.settled_from(span.call.client_id.as_deref().unwrap_or_default(), span.call.namespace.as_deref());
            let settled_behind = self.last_settle_newest.saturating_sub(self.last_settle).max(0);
            return Some(settled_behind.saturating_add(cut.saturating_sub(call_start).max(0)));
        }
        // Most spans start after every cut of their namespace: nothing else is looked up.
        let &in_namespace = self.namespace_cuts.get(&span.call.namespace)?;
        if start >= in_namespace {
            return None;
        }
        let cut = match span.call.client_id.as_deref() {
            Some(client_id) => {
                Some(self.settled_from(client_id, span.call.namespace.as_deref())).filter(|cut| start < *cut)
            }
            None => self.ancestor(span).is_none().then_some(in_namespace),
        }?;
        let settled_behind = self.last_settle_newest.saturating_sub(self.last_settle).max(0);
        Some(settled_behind.saturating_add(cut - start))
    }

    /// Whether a settle let go of hops that waited for a span ([`HeldTimelines::is_late`]).
    pub fn has_orphans(&self) -> bool {
        !self.orphans.is_empty()
    }

    /// Whether `anomaly` was judged with the whole history by the passes before, and is not
    /// to be reported from what is left: it is about attempts before its client's timeline's
    /// cut ([`HeldTimelines::settled_from`]), or it ended before the latest cut of any timeline
    /// of its namespace. The latter covers what other clients' calls tell of it (the nodes
    /// that served while a call was pinned, the clients a window affected): a client that
    /// called no more since keeps its own calls, while the others' of that time were let go.
    /// An anomaly that ended that long ago (the cut-off is the detectors' reach behind the
    /// newest span) is found anew only from telemetry that arrived later than that.
    /// So is one of no client, found from spans or lines, that started before that cut (a
    /// router's window): [`growing`] held every cut at or before the start of any such anomaly
    /// that could still grow, so this one had stopped and was judged whole before the cut let
    /// its first calls go. Found again from what is left (later calls, and log lines, which are
    /// not let go with the spans) it would start later: another anomaly, of the same window.
    pub fn is_settled(&self, anomaly: &Anomaly) -> bool {
        let Some(&in_namespace) = self.namespace_cuts.get(&anomaly.namespace) else { return false };
        // Most anomalies a pass finds start after every cut of their namespace, and so after
        // their own timeline's: that one is looked up (its key built) only when it may tell.
        if anomaly.start_unix_nano >= in_namespace {
            return false;
        }
        match anomaly.client_id.as_deref() {
            _ if anomaly.end_unix_nano < in_namespace => true,
            None => !found_in_metrics(anomaly.kind),
            Some(client_id) => anomaly.start_unix_nano < self.settled_from(client_id, anomaly.namespace.as_deref()),
        }
    }
}
