//! Attempts grouped into calls by call id, router and server spans waiting by trace, and the
//! join of each attempt to the spans under it: what [`Engine::advance`] drives.

use super::*;

impl Engine<'_> {
    /// Holds a client attempt in its call: the open call of its id that started within a
    /// horizon before it, else a new one. A copy of an attempt the call holds (an export sent
    /// again) is counted and dropped.
    pub(super) fn push_attempt(&mut self, span: &SpanRec) {
        let state = self
            .clients
            .entry((span.client, span.namespace))
            .or_insert_with(|| ClientState::new(span.client, span.namespace, span.cluster, span.system));
        state.last_seen = state.last_seen.max(span.end);
        self.stats.peak_clients = self.stats.peak_clients.max(self.clients.len());
        if span.start.saturating_add(self.horizon) < self.watermark {
            self.stats.late_attempts += 1;
        }
        let existing = span
            .call_id
            .as_deref()
            .and_then(|call_id| self.find_open(span.client, span.namespace, call_id, span.start));
        if let Some(call) = existing
            && span.id.is_some()
            && self.holds(call, (span.id, span.start))
        {
            self.stats.duplicates += 1;
            return;
        }
        let (call, index_key) = match existing {
            Some(call) => {
                // An attempt before the one that named the call (a retry's span may arrive
                // first; a call id used again within the horizon groups other calls' spans):
                // it names the call now. One that started earlier than every attempt so far
                // moves the call's start, and its turn with it: calls are processed in the
                // order they started (the entry at the later start finds it gone).
                if let Some(open) = self.calls[call.slot()].as_mut() {
                    if (span.attempt, span.start) < open.named_by {
                        (open.op, open.rpc_method, open.named_by) =
                            (span.op, span.rpc_method, (span.attempt, span.start));
                    }
                    if span.start < open.start {
                        open.start = span.start;
                        self.sequence += 1;
                        self.queue.push(Due(span.start, self.sequence, call));
                    }
                }
                (call, None)
            }
            None => self.open_call(span),
        };
        let at = self.held.push(Slot::Raw(ClientRec::of(span)));
        self.calls[call.slot()].as_mut().expect("an indexed call is open").held.push(at);
        // Last: the index is several times the cache, and its entry's store misses. Copies
        // through the stack (as the two above) wait for every store before them to land when
        // one of their loads spans two of their stores: after it, they do not wait for this one.
        if let Some(key) = index_key {
            self.index_call(key, call);
        }
    }

    /// Whether the open call `call` holds an attempt whose span has these ids and start (a
    /// retried export request brings it again; as `build_timelines`, ids alone are not enough).
    pub(super) fn holds(&self, call: CallRef, identity: (SpanKey, UnixNanos)) -> bool {
        self.current(call).is_some_and(|open| {
            open.held.iter().any(|at| self.held.get(*at).is_some_and(|slot| slot.identity() == identity))
        })
    }

    /// The call `call` names, if it is still open.
    pub(super) fn current(&self, call: CallRef) -> Option<&OpenCall> {
        if self.generations.get(call.slot()) != Some(&call.generation()) {
            return None;
        }
        self.calls[call.slot()].as_ref()
    }

    /// The open call of (client, namespace, call id) that an attempt starting at `start`
    /// belongs to, if any (one that started no more than a horizon before it).
    pub(super) fn find_open(&self, client: Sym, namespace: Sym, call_id: &str, start: UnixNanos) -> Option<CallRef> {
        let is_it = |call: &CallRef| {
            self.current(*call).is_some_and(|open| {
                open.client == client
                    && open.namespace == namespace
                    && start <= open.start.saturating_add(self.horizon)
                    && self.call_ids[call.slot()].as_deref() == Some(call_id)
            })
        };
        let indexed = self.open_index.get(&call_key(client, namespace, call_id)).copied().filter(is_it);
        indexed.or_else(|| self.open_collisions.iter().copied().find(is_it))
    }

    /// Opens a call for its first attempt (which the caller then holds): a slab slot and a
    /// place in the queue; returns it and its key ([`call_key`]), for the caller to index it by
    /// ([`Engine::index_call`]).
    fn open_call(&mut self, span: &SpanRec) -> (CallRef, Option<u64>) {
        let slot = match self.free_slots.pop() {
            Some(slot) => slot,
            None => {
                self.calls.push(None);
                self.call_ids.push(None);
                self.generations.push(0);
                u32::try_from(self.calls.len() - 1).expect("fewer than 2^32 open calls")
            }
        };
        let call = CallRef::new(slot, self.generations[slot as usize]);
        let index_key = span.call_id.as_deref().map(|call_id| call_key(span.client, span.namespace, call_id));
        self.call_ids[slot as usize].clone_from(&span.call_id);
        self.sequence += 1;
        self.queue.push(Due(span.start, self.sequence, call));
        self.calls[slot as usize] = Some(OpenCall {
            client: span.client,
            namespace: span.namespace,
            index_key,
            collided: false,
            op: span.op,
            rpc_method: span.rpc_method,
            named_by: (span.attempt, span.start),
            start: span.start,
            held: SmallVec::new(),
        });
        self.open_calls += 1;
        self.stats.peak_open_calls = self.stats.peak_open_calls.max(self.open_calls);
        (call, index_key)
    }

    /// Indexes a call just opened by its key: in `open_index`, or in `open_collisions` when
    /// another open call holds that key.
    fn index_call(&mut self, key: u64, call: CallRef) {
        let generations = &self.generations;
        match self.open_index.entry(key) {
            Entry::Vacant(entry) => {
                entry.insert(call);
            }
            Entry::Occupied(mut entry) => {
                let held = *entry.get();
                if generations.get(held.slot()) == Some(&held.generation()) {
                    self.open_collisions.push(call);
                    if let Some(open) = self.calls[call.slot()].as_mut() {
                        open.collided = true;
                    }
                } else {
                    *entry.get_mut() = call;
                    self.stale_entries = self.stale_entries.saturating_sub(1);
                }
            }
        }
    }

    /// Whether `call` (if it is still open) has an attempt that ended at or after
    /// `join_before`, not joined yet: the hops under it may still be on their way. Not one
    /// that claims to end more than two horizons after its call began (a clock far ahead):
    /// the data's time may never pass it by the lateness, and every call would wait behind.
    pub(super) fn awaits_hops(&self, call: CallRef, join_before: UnixNanos) -> bool {
        self.current(call).is_some_and(|open| {
            let latest = open.start.saturating_add(self.horizon.saturating_mul(2));
            open.held.iter().any(|at| {
                matches!(self.held.get(*at), Some(Slot::Raw(span)) if span.end >= join_before && span.end <= latest)
            })
        })
    }

    /// Takes a call out of the slab, if `call` still names it (its index entry goes stale),
    /// with its call id.
    pub(super) fn close_call(&mut self, call: CallRef) -> Option<(OpenCall, Option<CallId>)> {
        if self.generations.get(call.slot()) != Some(&call.generation()) {
            return None;
        }
        let open = self.calls[call.slot()].take()?;
        let call_id = self.call_ids[call.slot()].clone();
        self.generations[call.slot()] = call.generation().wrapping_add(1);
        self.free_slots.push(call.slot() as u32);
        self.open_calls -= 1;
        if open.collided {
            self.open_collisions.retain(|other| *other != call);
        } else if open.index_key.is_some() {
            self.stale_entries += 1;
            if self.stale_entries > (self.open_calls / 2).max(MIN_STALE_ENTRIES) {
                let generations = &self.generations;
                self.open_index.retain(|_, held| generations.get(held.slot()) == Some(&held.generation()));
                self.stale_entries = 0;
            }
        }
        Some((open, call_id))
    }

    /// Holds a router or server span until its attempt joins it: by trace when it has trace
    /// context, else by (client, call id) until the call is final. A copy is taken once.
    pub(super) fn push_hop(&mut self, span: &SpanRec) {
        let hop = matches!(span.component, known::ROUTER | known::SERVER);
        if span.is_trace_hop() {
            self.traces.push(span.id.trace_id(), HopRec::of(span));
            self.stats.peak_pending_spans = self.stats.peak_pending_spans.max(self.traces.spans.len());
        } else if hop && let (true, Some(call_id)) = (span.client.is_some(), span.call_id.as_ref()) {
            // No trace context reached it (a root of its own trace, or no ids at all): it joins
            // by call id. One with ids sent again is taken once.
            let waiting = self.by_call.entry(span.client).or_default().entry(call_id.clone()).or_default();
            let record = HopRec::of(span);
            if span.id.is_some()
                && waiting.iter().any(|(_, other)| other.span_id == record.span_id && other.start == record.start)
            {
                self.stats.duplicates += 1;
                return;
            }
            let trace_id = if span.id.is_some() { span.id.trace_id() } else { 0 };
            waiting.push((trace_id, record));
            self.waiting.push_back((span.end, span.client, call_id.clone()));
        }
    }

    /// Reads, for a batch of attempts about to be joined, the memory the joins will read: the
    /// attempts' spans, then their traces' waiting hops (every field of each: a record spans
    /// several cache lines). Held for the lateness, all of it has left the
    /// cache; read one join at a time, every miss waits for the one before (a chain of
    /// pointers), while a pass over the batch lets the processor wait for many at once. What is
    /// read is only summed (and kept from being optimized away).
    pub(super) fn warm_joins(&self, batch: &[u64]) {
        let mut sum = 0_u64;
        let mut traces: SmallVec<[u128; BATCH]> = SmallVec::new();
        for at in batch {
            if let Some(Slot::Raw(span)) = self.held.get(*at) {
                sum = sum.wrapping_add(span.touch());
                traces.push(span.id.trace_id());
            }
        }
        for trace in &traces {
            sum = sum.wrapping_add(self.traces.of(*trace).map(HopRec::touch).fold(0, u64::wrapping_add));
        }
        std::hint::black_box(sum);
    }

    /// As [`Engine::warm_joins`], for a batch of calls about to be finalized: their slab
    /// entries and call ids, then their attempts.
    pub(super) fn warm_calls(&self, batch: &[Due]) {
        // First the generations, slab entries and call ids, then what the entries point to.
        let mut sum = batch.iter().fold(0_u64, |sum, Due(_, _, call)| {
            let slot = call.slot();
            let open = self.calls[slot].as_ref().map_or(0, |open| open.held.len() as u64);
            let call_id = self.call_ids[slot].as_ref().map_or(0, |call_id| call_id.len() as u64);
            sum.wrapping_add(u64::from(self.generations[slot])).wrapping_add(open).wrapping_add(call_id)
        });
        for Due(_, _, call) in batch {
            if let Some(open) = &self.calls[call.slot()] {
                for slot in open.held.iter().filter_map(|at| self.held.get(*at)) {
                    sum = sum.wrapping_add(match slot {
                        Slot::Raw(span) => span.touch(),
                        Slot::Joined(attempt) => attempt.touch(),
                        Slot::Waiting(waiting) => waiting.0.touch(),
                    });
                }
                // The oldest of its client's recent calls, which processing this call pushes out
                // (freed then, unless a floor still holds it): last read 16 of the client's
                // calls ago.
                if let Some(state) = self.clients.get(&(open.client, open.namespace))
                    && let Some(oldest) = state.recent.front()
                {
                    sum = sum.wrapping_add(Rc::strong_count(oldest) as u64).wrapping_add(oldest.touch_for_drop());
                }
            }
        }
        std::hint::black_box(sum);
    }

    /// Joins a traced attempt to the router and server spans under it. Untraced attempts
    /// wait for their call to be final (they join by call id, to the nearest attempt).
    pub(super) fn join_slot(&mut self, at: u64) {
        let Some(slot) = self.held.get_mut(at) else { return };
        let Slot::Raw(span) = slot else { return };
        if !span.id.is_some() {
            return;
        }
        // Its call's: a call's attempts share their client and namespace.
        let (client, namespace) = (span.client, span.namespace);
        let mut hops = self.traces.take_under(span.id);
        if !self.waiting.is_empty() && self.by_call.get(&client).is_some_and(|calls| !calls.is_empty()) {
            // The client's hops (some at least) received no trace context and join by call id
            // when the call is final: this attempt waits for them with what its trace gave it.
            *slot = Slot::Waiting(Box::new((*span, hops)));
            return;
        }
        let join = traced_join(&hops);
        let attempt = build_attempt(span, &mut hops, join);
        *slot = Slot::Joined(attempt);
        let Slot::Joined(attempt) = slot else { return };
        let scope = self.clients.get(&(client, namespace)).map(|state| (state.cluster, state.namespace));
        if let Some(scope) = scope {
            record_facts(self.facts, self.namespaces.entry(scope).or_default(), attempt, client, &mut self.sequence);
        }
    }

    /// A call the horizon has passed: its attempts joined (through their traces, and the hops
    /// of its call id to the nearest attempt), then processed ([`Engine::process_call`]).
    pub(super) fn finalize(&mut self, open: OpenCall, call_id: Option<CallId>) {
        self.stats.calls += 1;
        let (client, namespace) = (open.client, open.namespace);
        // Its id's hops that started within the horizon of its start; later ones wait for the
        // later call of that id.
        let last = open.start.saturating_add(self.horizon);
        let untraced = match (&call_id, self.by_call.get_mut(&client)) {
            (Some(call_id), Some(calls)) => match calls.get_mut(call_id) {
                Some(waiting) if waiting.iter().any(|(_, hop)| hop.start > last) => {
                    let (mine, later) = std::mem::take(waiting).into_iter().partition(|(_, hop)| hop.start <= last);
                    *waiting = later;
                    mine
                }
                Some(_) => calls.remove(call_id).unwrap_or_default(),
                None => Vec::new(),
            },
            _ => Vec::new(),
        };
        // Most calls: one attempt, joined through its trace, moved straight into the call's list.
        if untraced.is_empty()
            && let [at] = open.held[..]
            && let Some(Slot::Joined(_)) = self.held.get(at)
            && let Some(Slot::Joined(attempt)) = self.held.take(at)
        {
            self.process_call(&open, call_id, std::iter::once(attempt), 1);
            return;
        }
        // Out of the held attempts into the list that becomes the call's (allocated now, when
        // blocks freed by recently processed calls are at hand).
        let mut slots: Vec<Slot> = Vec::with_capacity(open.held.len());
        slots.extend(open.held.iter().filter_map(|at| self.held.take(*at)));
        slots.sort_by_key(Slot::order);
        let all_joined = slots.iter().all(|slot| matches!(slot, Slot::Joined(_)));
        if all_joined && untraced.is_empty() {
            // Retried calls: every attempt joined through its trace already.
            let count = slots.len();
            let attempts = slots.into_iter().filter_map(|slot| match slot {
                Slot::Joined(attempt) => Some(attempt),
                Slot::Raw(_) | Slot::Waiting(_) => None,
            });
            self.process_call(&open, call_id, attempts, count);
            return;
        }
        // Raw attempts: their traced hops now (waiting ones have theirs), then the untraced hops
        // by call id, with the traces of those that started their own.
        let mut gathered: Vec<Option<Gathered>> = slots
            .iter_mut()
            .map(|slot| {
                let hops = match slot {
                    Slot::Raw(span) => self.traces.take_under(span.id),
                    Slot::Waiting(waiting) => std::mem::take(&mut waiting.1),
                    Slot::Joined(_) => return None,
                };
                Some(Gathered::traced(hops))
            })
            .collect();
        for (trace_id, hop) in untraced {
            let nearest = (0..slots.len())
                .filter(|index| {
                    gathered[*index].is_some() && same_attempt_or_unnumbered(slots[*index].placed().0, hop.attempt())
                })
                .min_by_key(|index| {
                    let (attempt, start, end) = slots[*index].placed();
                    (attempt != hop.attempt() || hop.attempt().is_none(), distance_to(start, end, hop.start))
                });
            match nearest.and_then(|index| gathered[index].as_mut()) {
                Some(into) => {
                    if into.join == TimelineJoin::ClientOnly {
                        into.join = TimelineJoin::CallId;
                    }
                    if trace_id != 0 {
                        // A root of its own trace: the hops under it (its process propagated
                        // context onwards) join with it, named in that trace.
                        let root = SpanKey::new(trace_id, hop.span_id);
                        into.traces.push((hop.span_id, trace_id));
                        into.hops.push(hop);
                        for under in self.traces.take_under(root) {
                            into.traces.push((under.span_id, trace_id));
                            into.hops.push(under);
                        }
                    } else {
                        into.hops.push(hop);
                    }
                }
                None => self.stats.unjoined_hops += 1,
            }
        }
        let scope = self.clients.get(&(client, namespace)).map(|state| (state.cluster, state.namespace));
        let attempts: Vec<Attempt> = slots
            .into_iter()
            .zip(gathered)
            .map(|(slot, gathered)| {
                let span = match slot {
                    Slot::Joined(attempt) => return attempt,
                    Slot::Raw(span) => span,
                    Slot::Waiting(waiting) => waiting.0,
                };
                let Gathered { mut hops, join, traces } = gathered.unwrap_or_else(|| Gathered::traced(Hops::new()));
                let mut attempt = build_attempt(&span, &mut hops, join);
                if !traces.is_empty() {
                    attempt.hop_traces = Some(Box::new(traces));
                }
                if let Some(scope) = scope {
                    let namespace = self.namespaces.entry(scope).or_default();
                    record_facts(self.facts, namespace, &attempt, client, &mut self.sequence);
                }
                attempt
            })
            .collect();
        let count = attempts.len();
        self.process_call(&open, call_id, attempts.into_iter(), count);
    }

    /// A call's joined attempts (`count` of them at most) into a compact call, then through
    /// the detectors. The call is allocated and written before its attempts are moved in: its
    /// fields are built on the stack and read back in wider loads (which wait for every store
    /// before them), and the attempts' copies are stores to memory that may have left the cache.
    fn process_call(
        &mut self,
        open: &OpenCall,
        call_id: Option<CallId>,
        attempts: impl Iterator<Item = Attempt>,
        count: usize,
    ) {
        let (op, rpc_method) = (open.op, open.rpc_method);
        let mut call =
            Rc::new(Call { call_id, op, rpc_method, start: 0, end: 0, attempts: SmallVec::with_capacity(count) });
        let made = Rc::get_mut(&mut call).expect("a call just made has no other owner");
        made.attempts.extend(attempts);
        made.start = made.attempts.iter().map(|attempt| attempt.start).min().unwrap_or_default();
        made.end = made.attempts.iter().map(|attempt| attempt.end).max().unwrap_or_default();
        self.stats.longest_call_nanos = self.stats.longest_call_nanos.max(made.end.saturating_sub(made.start));
        self.process(open.client, open.namespace, call);
    }
}

/// Router, server and intermediate spans with trace context, waiting to be joined: in
/// arrival order in `spans` (see [`Places`]; read at the joins in nearly that order), found by
/// trace through `places` (each trace's places, in arrival order).
#[derive(Debug, Default)]
pub(super) struct TracedHops {
    pub(super) spans: Places<HopRec>,
    pub(super) places: FxHashMap<u128, SmallVec<[u64; 2]>>,
    /// Spans found twice under an attempt ([`EngineStats::duplicates`]).
    pub(super) duplicates: u64,
}

impl TracedHops {
    /// Not through `entry`: its key, a `u128` kept on the stack in two halves, was read back
    /// whole as the new entry was written, a load no store forwards to, which waited for every
    /// store before it (a third of `push_span`'s samples).
    pub(super) fn push(&mut self, trace: u128, span: HopRec) {
        let at = self.spans.push(span);
        match self.places.get_mut(&trace) {
            Some(places) => places.push(at),
            None => {
                self.places.insert(trace, SmallVec::from_buf_and_len([at, 0], 1));
            }
        }
    }

    /// The spans of `trace` waiting.
    pub(super) fn of(&self, trace: u128) -> impl Iterator<Item = &HopRec> {
        self.places.get(&trace).into_iter().flatten().filter_map(|at| self.spans.get(*at))
    }

    /// The router and server spans under the client attempt `root`, taken out of its trace's
    /// waiting spans (intermediate spans are taken too).
    fn take_under(&mut self, root: SpanKey) -> Hops {
        let mut found = Hops::new();
        if !root.is_some() {
            return found;
        }
        let TracedHops { spans, places: by_trace, duplicates } = self;
        let Some(places) = by_trace.get_mut(&root.trace_id()) else { return found };
        // Spans taken so far, by id and start (their ids are parents for the next level), from
        // `level_start` on the latest level's. Traces are small: linear scans beat maps.
        let mut taken: SmallVec<[(u64, UnixNanos); 8]> = SmallVec::new();
        let mut level_start = 0;
        for depth in 0..MAX_PARENT_HOPS {
            let level_end = taken.len();
            let mut index = 0;
            while index < places.len() {
                // A place whose span is gone (dropped unjoined) is forgotten where met.
                let Some(parent) = spans.get(places[index]).map(|span| span.parent_span_id) else {
                    places.remove(index);
                    continue;
                };
                let under = if depth == 0 {
                    parent == root.span_id
                } else {
                    taken[level_start..level_end].iter().any(|(id, _)| *id == parent)
                };
                if under {
                    if let Some(span) = spans.take(places.remove(index)) {
                        // The same span again (an export request delivered twice): taken once.
                        if taken.contains(&(span.span_id, span.start)) {
                            *duplicates += 1;
                            continue;
                        }
                        taken.push((span.span_id, span.start));
                        if matches!(span.component, known::ROUTER | known::SERVER) {
                            found.push(span);
                        }
                    }
                } else {
                    index += 1;
                }
            }
            if taken.len() == level_end {
                break;
            }
            level_start = level_end;
        }
        if places.is_empty() {
            by_trace.remove(&root.trace_id());
        }
        found
    }

    /// Drops the spans that ended before `before` from the queue's front, in arrival order (the
    /// joined ones were taken out already: the front has moved past them), up to the first
    /// that ended later; returns how many were router or server spans (never joined). Their
    /// traces' places are swept out later ([`TracedHops::sweep`]).
    pub(super) fn drop_ended(&mut self, before: UnixNanos) -> u64 {
        let mut unjoined = 0;
        while let Some((at, span)) = self.spans.front()
            && span.end < before
        {
            unjoined += u64::from(matches!(span.component, known::ROUTER | known::SERVER));
            self.spans.take(at);
        }
        unjoined
    }

    /// Forgets the places of spans dropped unjoined from the queue's front, and the traces
    /// left with none (a trace's places are otherwise removed as its spans join).
    pub(super) fn sweep(&mut self) {
        let spans = &self.spans;
        self.places.retain(|_, places| {
            places.retain(|at| spans.get(*at).is_some());
            !places.is_empty()
        });
    }
}

/// An open call's key in the index: the hash of its client, namespace and call id (calls
/// whose keys collide are told apart by their ids).
pub(super) fn call_key(client: Sym, namespace: Sym, call_id: &str) -> u64 {
    use std::hash::BuildHasher;
    rustc_hash::FxBuildHasher.hash_one((client, namespace, call_id))
}
