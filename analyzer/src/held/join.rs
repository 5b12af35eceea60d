//! The join kept current: a span made part of it or taken out, the attempts and hops it
//! moves, and a group's timeline rebuilt from what it holds.

use super::*;

impl HeldTimelines {
    fn span(&self, key: SpanKey) -> &Span {
        &self.spans[&key].span
    }

    /// Whether `loose` holds exactly the held spans of no call.
    #[cfg(test)]
    pub(super) fn loose_is_exact(&self) -> bool {
        let loose: BTreeSet<SpanKey> = self
            .spans
            .iter()
            .filter(|(key, held)| {
                let of_a_call = held.joined
                    && (is_client_attempt(&held.span) || self.hops.get(key).is_some_and(|hop| hop.attempt.is_some()));
                !of_a_call
            })
            .map(|(key, _)| *key)
            .collect();
        loose == self.loose
    }

    /// The held copies of the span at `key` (itself among them), in key order.
    pub(super) fn copies_of(&self, key: SpanKey, identity: u64) -> Keys {
        let Some(keys) = self.copies.get(&identity) else { return Keys::new() };
        // Most spans are sent once: no other span is looked at.
        if keys.as_slice() == [key] {
            return keys.clone();
        }
        let span = self.span(key);
        let same = |other: &Span| {
            other.start_unix_nano == span.start_unix_nano
                && other.trace_id == span.trace_id
                && other.span_id == span.span_id
        };
        keys.iter().copied().filter(|copy| same(self.span(*copy))).collect()
    }

    /// Makes the span at `key` part of the join.
    pub(super) fn join(&mut self, key: SpanKey) {
        let Some(held) = self.spans.get_mut(&key) else { return };
        held.joined = true;
        let span = &held.span;
        if let Some(ids) = ids_hash(span.trace_id.as_deref(), span.span_id.as_deref()) {
            add_key(&mut self.by_id, ids, key);
        }
        if let Some(trace) = &span.trace_id {
            self.dirty_traces.insert(hash_of(trace));
        }
        if is_client_attempt(span) {
            let (group_key, call_key) = attempt_keys(key, span);
            if let Some(call) = call_hash(span) {
                add_key(&mut self.by_call, call, key);
                self.dirty_calls.insert(call);
            }
            let group = self.groups.entry(group_key).or_insert_with(Group::new);
            group.attempts.insert(key);
            insert_key(&mut group.calls.entry(call_key.clone()).or_default().attempts, key);
            group.dirty.insert(call_key);
            self.loose.remove(&key);
        } else if is_hop(span) {
            if let Some(trace) = &span.trace_id {
                add_key(&mut self.trace_hops, hash_of(trace), key);
            }
            self.hops.insert(key, Hop::default());
            self.unjoined.insert(key);
        }
    }

    /// Takes the span at `key` out of the join (it stays held).
    pub(super) fn leave(&mut self, key: SpanKey) {
        let Some(held) = self.spans.get_mut(&key) else { return };
        held.joined = false;
        self.loose.insert(key);
        let span = &held.span;
        if let Some(ids) = ids_hash(span.trace_id.as_deref(), span.span_id.as_deref()) {
            remove_key(&mut self.by_id, ids, key);
        }
        if let Some(trace) = &span.trace_id {
            self.dirty_traces.insert(hash_of(trace));
        }
        if is_client_attempt(span) {
            let (group_key, call_key) = attempt_keys(key, span);
            if let Some(call) = call_hash(span) {
                remove_key(&mut self.by_call, call, key);
                self.dirty_calls.insert(call);
            }
            if let Some(group) = self.groups.get_mut(&group_key) {
                group.attempts.remove(&key);
                if let Some(entry) = group.calls.get_mut(&call_key)
                    && let Ok(place) = entry.attempts.binary_search(&key)
                {
                    entry.attempts.remove(place);
                }
                group.dirty.insert(call_key);
            }
            // Its hops join again (they are in its trace, or depend on its call), as hops of no
            // attempt: should it join again before they do (a copy that displaced it let go),
            // they find it anew, and are its hops again.
            for (hop, _) in self.attempt_hops.remove(&key).into_iter().flatten() {
                if let Some(hop) = self.hops.get_mut(&hop) {
                    hop.attempt = None;
                }
                self.loose.insert(hop);
                self.unjoined.insert(hop);
            }
        } else if is_hop(span) {
            if let Some(trace) = &span.trace_id {
                remove_key(&mut self.trace_hops, hash_of(trace), key);
            }
            self.unjoined.remove(&key);
            if let Some(hop) = self.hops.remove(&key) {
                if let Some(call) = hop.depends_on {
                    remove_key(&mut self.call_dependents, call, key);
                }
                if let Some((attempt, _)) = hop.attempt {
                    self.take_hop(attempt, key);
                    self.attempt_changed(attempt);
                }
            }
        }
    }

    /// Marks the call of the attempt at `key` (if still joined) to be built again.
    fn attempt_changed(&mut self, key: SpanKey) {
        let Some(held) = self.spans.get(&key).filter(|held| held.joined && is_client_attempt(&held.span)) else {
            return;
        };
        let (group_key, call_key) = attempt_keys(key, &held.span);
        if let Some(group) = self.groups.get_mut(&group_key) {
            group.dirty.insert(call_key);
        }
    }

    /// Joins the hop at `key` again; when the attempt it joins changed, both attempts' calls
    /// are built again.
    pub(super) fn rejoin_hop(&mut self, key: SpanKey) {
        let Some(old) = self.hops.get(&key) else { return };
        let (old_attempt, old_depends_on) = (old.attempt, old.depends_on);
        let (attempt, depends_on) = self.find_attempt(key);
        if old_depends_on != depends_on {
            if let Some(call) = old_depends_on {
                remove_key(&mut self.call_dependents, call, key);
            }
            if let Some(call) = depends_on {
                add_key(&mut self.call_dependents, call, key);
            }
        }
        if let Some(hop) = self.hops.get_mut(&key) {
            *hop = Hop { attempt, depends_on };
        }
        if attempt.is_some() {
            self.loose.remove(&key);
        } else {
            self.loose.insert(key);
        }
        if old_attempt == attempt {
            return;
        }
        if let Some((old_attempt, _)) = old_attempt {
            self.take_hop(old_attempt, key);
            self.attempt_changed(old_attempt);
        }
        if let Some((new_attempt, join)) = attempt {
            let hops = self.attempt_hops.entry(new_attempt).or_default();
            match hops.binary_search_by_key(&key, |(hop, _)| *hop) {
                Ok(place) => hops[place].1 = join,
                Err(place) => hops.insert(place, (key, join)),
            }
            self.attempt_changed(new_attempt);
        }
    }

    /// Takes the hop at `hop` from the attempt at `attempt`'s hops.
    fn take_hop(&mut self, attempt: SpanKey, hop: SpanKey) {
        if let Some(hops) = self.attempt_hops.get_mut(&attempt) {
            hops.retain(|(held, _)| *held != hop);
            if hops.is_empty() {
                self.attempt_hops.remove(&attempt);
            }
        }
    }

    /// The attempt the hop at `key` joins (as `timeline::attach_hops` finds it), and the
    /// (client id, call id) whose attempts that depended on.
    fn find_attempt(&self, key: SpanKey) -> (Option<(SpanKey, TimelineJoin)>, Option<u64>) {
        let span = self.span(key);
        if span.trace_id.is_some() && span.span_id.is_some() && span.parent_span_id.is_some() {
            match self.ancestor(span) {
                Some(Ancestor::Attempt(attempt)) => (Some((attempt, TimelineJoin::TraceContext)), None),
                Some(Ancestor::RootHop(root)) => {
                    let root = self.span(root);
                    (self.nearest_attempt_of_call(root).map(|attempt| (attempt, TimelineJoin::CallId)), call_hash(root))
                }
                None => (None, None),
            }
        } else {
            (self.nearest_attempt_of_call(span).map(|attempt| (attempt, TimelineJoin::CallId)), call_hash(span))
        }
    }

    pub(super) fn ancestor(&self, span: &Span) -> Option<Ancestor> {
        let mut current = span;
        for _ in 0..MAX_PARENT_HOPS {
            let parent_key = self.parent_of(current)?;
            let parent = self.span(parent_key);
            if is_client_attempt(parent) {
                return Some(Ancestor::Attempt(parent_key));
            }
            if parent.parent_span_id.is_none() {
                return is_hop(parent).then_some(Ancestor::RootHop(parent_key));
            }
            current = parent;
        }
        None
    }

    /// Whether `span` is a hop whose trace names an ancestor that is not held: its parent, or
    /// a parent up its chain of held parents (under the parent limit of [`Self::ancestor`]).
    pub(super) fn awaits_ancestor(&self, span: &Span) -> bool {
        if !is_hop(span) {
            return false;
        }
        let mut current = span;
        for _ in 0..MAX_PARENT_HOPS {
            if current.trace_id.is_none() || current.parent_span_id.is_none() {
                return false;
            }
            let Some(parent) = self.parent_of(current).map(|key| self.span(key)) else { return true };
            if is_client_attempt(parent) {
                return false;
            }
            current = parent;
        }
        false
    }

    /// The held span that `span`'s trace and parent ids name (the last of its copies).
    fn parent_of(&self, span: &Span) -> Option<SpanKey> {
        let (trace_id, parent_id) = (span.trace_id.as_deref()?, span.parent_span_id.as_deref()?);
        let candidates = self.by_id.get(&ids_hash(Some(trace_id), Some(parent_id))?)?;
        candidates.iter().rev().copied().find(|candidate| {
            let candidate = self.span(*candidate);
            candidate.trace_id.as_deref() == Some(trace_id) && candidate.span_id.as_deref() == Some(parent_id)
        })
    }

    fn nearest_attempt_of_call(&self, span: &Span) -> Option<SpanKey> {
        let (client_id, call_id) = (span.call.client_id.as_deref()?, span.call.call_id.as_deref()?);
        self.by_call
            .get(&call_hash(span)?)?
            .iter()
            .copied()
            .filter(|candidate| {
                let call = &self.span(*candidate).call;
                call.client_id.as_deref() == Some(client_id)
                    && call.call_id.as_deref() == Some(call_id)
                    && same_attempt_or_unnumbered(call.attempt, span.call.attempt)
            })
            .min_by_key(|candidate| {
                let attempt = self.span(*candidate);
                let distance = distance_to(attempt.start_unix_nano, attempt.end_unix_nano, span.start_unix_nano);
                (attempt.call.attempt != span.call.attempt || span.call.attempt.is_none(), distance)
            })
    }
}

pub(super) enum Ancestor {
    Attempt(SpanKey),
    RootHop(SpanKey),
}

impl Group {
    fn new() -> Self {
        Self {
            attempts: BTreeSet::new(),
            calls: BTreeMap::new(),
            dirty: BTreeSet::new(),
            timeline: empty_timeline(),
            order: Vec::new(),
            changed_from: UnixNanos::MIN,
            unenriched_from: UnixNanos::MIN,
            verdicts: None,
            first_let_go: None,
        }
    }

    /// Builds the dirty calls again, puts them in their places, and the floors. Only the
    /// calls from the first one that changed on are moved (most changes are at the end). Calls
    /// taken out that start before `let_go_before` were let go by a settle: no change to the
    /// later ones ([`HeldTimelines::join_again`]).
    pub(super) fn rebuild(
        &mut self,
        (client_id, namespace): &GroupKey,
        spans: &BTreeMap<SpanKey, Box<Held>>,
        attempt_hops: &HashMap<SpanKey, SmallVec<[(SpanKey, TimelineJoin); 2]>>,
        horizon: UnixNanos,
        let_go_before: UnixNanos,
    ) {
        let span = |key: &SpanKey| &spans[key].span;
        let mut removed: Vec<usize> = Vec::new();
        let mut built: Vec<((UnixNanos, UnixNanos, CallKey), TimelineCall)> = Vec::new();
        for call_key in std::mem::take(&mut self.dirty) {
            let Some(entry) = self.calls.get_mut(&call_key) else { continue };
            for (start, end) in entry.places.drain(..) {
                if let Ok(index) = self.order.binary_search_by(|(s, e, k)| (*s, *e, k).cmp(&(start, end, &call_key))) {
                    removed.push(index);
                }
            }
            if entry.attempts.is_empty() {
                self.calls.remove(&call_key);
                continue;
            }
            let attempts = &entry.attempts;
            // As `timeline::calls_within`: runs of attempts starting within the horizon of
            // the run's first (keys are in start order).
            let mut runs: Vec<Vec<SpanKey>> = Vec::new();
            for &key in attempts {
                match runs.last_mut() {
                    Some(run) if key.0 <= run[0].0.saturating_add(horizon) => run.push(key),
                    _ => runs.push(vec![key]),
                }
            }
            let mut places = SmallVec::new();
            for mut run in runs {
                run.sort_by_key(|key| (span(key).call.attempt, key.0));
                let attempts: Vec<_> = run
                    .iter()
                    .map(|key| {
                        let hops = attempt_hops.get(key);
                        let joined: Vec<&Span> = hops.into_iter().flatten().map(|(hop, _)| span(hop)).collect();
                        let join =
                            hops.and_then(|hops| hops.first()).map_or(TimelineJoin::ClientOnly, |(_, join)| *join);
                        attempt_of(span(key), &joined, join)
                    })
                    .collect();
                let call = call_of(span(&run[0]), attempts);
                places.push((call.start_unix_nano, call.end_unix_nano));
                built.push(((call.start_unix_nano, call.end_unix_nano, call_key.clone()), call));
            }
            if let Some(entry) = self.calls.get_mut(&call_key) {
                entry.places = places;
            }
        }
        built.sort_by(|(left, _), (right, _)| left.cmp(right));
        removed.sort_unstable();
        // A first attempt of another cluster or system: every call is marked changed, and told
        // what its new cluster's metrics say.
        let first = self.attempts.first();
        let (cluster, system) = match &self.first_let_go {
            Some((let_go, cluster, system)) if first.is_none_or(|first| let_go < first) => {
                (cluster.clone(), system.clone())
            }
            _ => {
                let first = first.map(span);
                (
                    first.and_then(|span| span.resource.cluster.clone()),
                    first.and_then(|span| span.resource.system.clone()),
                )
            }
        };
        let changed = removed
            .iter()
            .map(|index| self.order[*index].0)
            .filter(|start| *start >= let_go_before)
            .chain(built.iter().map(|((start, _, _), _)| *start));
        let changed = if cluster != self.timeline.cluster || system != self.timeline.system {
            UnixNanos::MIN
        } else {
            changed.min().unwrap_or(UnixNanos::MAX)
        };
        self.changed_from = self.changed_from.min(changed);
        self.unenriched_from = self.unenriched_from.min(changed);
        // The calls from the first place that changed are merged with the built ones.
        let first_built =
            built.first().map_or(self.order.len(), |(place, _)| self.order.partition_point(|p| p < place));
        let from = removed.first().copied().unwrap_or(usize::MAX).min(first_built);
        if from < self.order.len() || !built.is_empty() {
            let tail_order = self.order.split_off(from);
            let tail_calls = self.timeline.calls.split_off(from);
            let mut removed = removed.into_iter().peekable();
            let mut kept = tail_order.into_iter().zip(tail_calls).enumerate().filter_map(|(offset, item)| {
                if removed.peek() == Some(&(from + offset)) {
                    removed.next();
                    return None;
                }
                Some(item)
            });
            let mut built = built.into_iter().peekable();
            let mut next_kept = kept.next();
            loop {
                let take_built = match (&next_kept, built.peek()) {
                    (Some((place, _)), Some((built_place, _))) => built_place < place,
                    (None, Some(_)) => true,
                    (_, None) => false,
                };
                let (place, call) = if take_built {
                    built.next().expect("peeked")
                } else {
                    let Some(item) = next_kept.take() else { break };
                    next_kept = kept.next();
                    item
                };
                self.order.push(place);
                self.timeline.calls.push(call);
            }
        }
        self.timeline.client_id.clone_from(client_id);
        self.timeline.namespace.clone_from(namespace);
        (self.timeline.cluster, self.timeline.system) = (cluster, system);
        let call_floors = floors(&self.timeline.calls);
        for (call, floor) in self.timeline.calls.iter_mut().zip(call_floors) {
            call.floor = floor.highest().map(|contribution| contribution.state);
        }
    }
}
