//! Compact joined attempts and calls (the streaming counterparts of `TimelineAttempt` and
//! `TimelineCall`), turned into the model's types only when an anomaly needs them.

use lagscope_model::{Op, Outcome, SpanRef, StateId, TimelineAttempt, TimelineCall, TimelineJoin, UnixNanos};

use smallvec::SmallVec;

use super::intern::{Interner, Sym, known};
use super::record::{CallId, HopRec, Packed, SpanKey, SpanRec, packed_states};
use crate::detectors::view::{AttemptView, CallView, Id, SpanView};

/// A span reference in compact form.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ref {
    pub(crate) id: SpanKey,
    pub(crate) service: Sym,
    pub(crate) node: Sym,
}

impl Ref {
    pub(crate) fn materialize(&self, interner: &Interner) -> SpanRef {
        SpanRef {
            trace_id: self.id.is_some().then(|| self.id.trace_hex()),
            span_id: self.id.is_some().then(|| self.id.span_hex()),
            service_name: interner.owned(self.service),
            node_id: interner.owned(self.node),
        }
    }
}

/// A router or server span of an attempt. Only its span id is kept: a hop with ids was joined
/// through its attempt's trace, so its trace id is the client span's; a hop without (joined by
/// call id) has neither.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HopRef {
    pub(crate) span_id: u64,
    pub(crate) service: Sym,
    pub(crate) node: Sym,
}

impl HopRef {
    fn of(span: &HopRec) -> Self {
        Self { span_id: span.span_id, service: span.service, node: span.node }
    }

    /// The reference in full, in the trace `trace_id` (its attempt's).
    pub(crate) fn in_trace(&self, trace_id: u128) -> Ref {
        let trace_id = if self.span_id == 0 { 0 } else { trace_id };
        Ref { id: SpanKey::new(trace_id, self.span_id), service: self.service, node: self.node }
    }
}

/// A client attempt held until it is joined: what the join and [`build_attempt`] read of its
/// span, packed (no call id, which its call keeps; its optional integers as [`Packed`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClientRec {
    pub(crate) id: SpanKey,
    pub(crate) start: UnixNanos,
    pub(crate) end: UnixNanos,
    /// attempt, carried, served, returned, committed.
    states: Packed<5>,
    pub(crate) client: Sym,
    pub(crate) namespace: Sym,
    pub(crate) service: Sym,
    pub(crate) node: Sym,
    pub(crate) target_node: Sym,
    pub(crate) target_role: Sym,
    pub(crate) consistency: Sym,
    pub(crate) server_address: Sym,
    pub(crate) outcome: Sym,
    pub(crate) error_type: Sym,
    pub(crate) ok: bool,
    pub(crate) follower_read: Option<bool>,
}

impl ClientRec {
    packed_states!(attempt: 0, carried: 1, served: 2, returned: 3, committed: 4);

    #[inline]
    fn state(&self, index: usize) -> Option<i64> {
        self.states.get(index)
    }

    pub(crate) fn of(span: &SpanRec) -> Self {
        Self {
            id: span.id,
            start: span.start,
            end: span.end,
            states: Packed::new([span.attempt, span.carried, span.served, span.returned, span.committed]),
            client: span.client,
            namespace: span.namespace,
            service: span.service,
            node: span.node,
            target_node: span.target_node,
            target_role: span.target_role,
            consistency: span.consistency,
            server_address: span.server_address,
            outcome: span.outcome,
            error_type: span.error_type,
            ok: span.ok,
            follower_read: span.follower_read,
        }
    }

    /// Reads every field, as [`HopRec::touch`].
    pub(crate) fn touch(&self) -> u64 {
        let symbols = [
            self.client,
            self.namespace,
            self.service,
            self.node,
            self.target_node,
            self.target_role,
            self.consistency,
            self.server_address,
            self.outcome,
            self.error_type,
        ];
        (self.id.trace_id() as u64 ^ self.id.span_id)
            .wrapping_add(self.start as u64 ^ self.end as u64)
            .wrapping_add(symbols.iter().map(|sym| u64::from(sym.0)).sum::<u64>())
            .wrapping_add(self.states.sum())
            .wrapping_add(u64::from(self.ok) + u64::from(self.follower_read.unwrap_or_default()))
    }
}

/// One attempt joined across client, router and server (a compact `TimelineAttempt`).
#[derive(Debug, Clone)]
pub(crate) struct Attempt {
    pub(crate) start: UnixNanos,
    pub(crate) end: UnixNanos,
    pub(crate) client_span: Ref,
    /// The router spans, then the server spans, each in start order (a router and a server
    /// inline: no allocation per attempt in the common case).
    pub(crate) hops: SmallVec<[HopRef; 2]>,
    pub(crate) routers: u8,
    pub(crate) join: TimelineJoin,
    pub(crate) target_node: Sym,
    pub(crate) target_role: Sym,
    pub(crate) router_node: Sym,
    pub(crate) served_by: Sym,
    pub(crate) served_role: Sym,
    /// attempt, carried, router carried, router state, served, returned, committed, requeues.
    states: Packed<8>,
    pub(crate) consistency: Sym,
    pub(crate) follower_read: Option<bool>,
    pub(crate) server_address: Sym,
    pub(crate) ok: bool,
    pub(crate) outcome: Sym,
    pub(crate) error_type: Sym,
    /// The trace of each hop that is not in the client span's trace (span id, trace id): hops
    /// whose process received no trace context, joined by call id. None in the common case:
    /// boxed so that every other attempt pays one word for it, not a vector's three.
    #[allow(clippy::box_collection)]
    pub(crate) hop_traces: Option<Box<Vec<(u64, u128)>>>,
}

impl Attempt {
    /// The node that answered it: the server that did, else the node its client span names
    /// unless that was a router (as `pinned_retry` judges a `TimelineAttempt`).
    pub(crate) fn answered_by(&self) -> Sym {
        match self.served_by {
            Sym::NONE if self.target_role != Sym::NONE && self.target_role != known::ROUTER => self.target_node,
            served_by => served_by,
        }
    }

    /// A hop's reference in full, in its own trace (its attempt's, unless it started one).
    pub(crate) fn hop_ref(&self, hop: &HopRef) -> Ref {
        let own = self.hop_traces.as_ref().and_then(|traces| {
            traces.iter().find(|(span_id, _)| *span_id == hop.span_id).map(|(_, trace_id)| *trace_id)
        });
        hop.in_trace(own.unwrap_or_else(|| self.client_span.id.trace_id()))
    }

    packed_states!(
        attempt: 0,
        carried: 1,
        router_carried: 2,
        router_state: 3,
        served: 4,
        returned: 5,
        committed: 6,
        requeues: 7,
    );

    #[inline]
    fn state(&self, index: usize) -> Option<i64> {
        self.states.get(index)
    }

    /// Reads every field, as [`HopRec::touch`].
    pub(crate) fn touch(&self) -> u64 {
        let symbols = [
            self.client_span.service,
            self.client_span.node,
            self.target_node,
            self.target_role,
            self.router_node,
            self.served_by,
            self.served_role,
            self.consistency,
            self.server_address,
            self.outcome,
            self.error_type,
        ];
        (self.client_span.id.trace_id() as u64 ^ self.client_span.id.span_id)
            .wrapping_add(self.start as u64 ^ self.end as u64)
            .wrapping_add(symbols.iter().map(|sym| u64::from(sym.0)).sum::<u64>())
            .wrapping_add(self.states.sum())
            .wrapping_add(self.hops.len() as u64 + u64::from(self.routers) + self.join as u64)
            .wrapping_add(u64::from(self.ok) + u64::from(self.follower_read.unwrap_or_default()))
    }

    pub(crate) fn materialize(&self, interner: &Interner) -> TimelineAttempt {
        let outcome =
            if self.ok { Outcome::Ok } else { interner.get(self.outcome).map_or(Outcome::Error, Outcome::parse) };
        TimelineAttempt {
            attempt: self.attempt(),
            start_unix_nano: self.start,
            end_unix_nano: self.end,
            client_span: self.client_span.materialize(interner),
            router_spans: self.hops[..usize::from(self.routers)]
                .iter()
                .map(|span| self.hop_ref(span).materialize(interner))
                .collect(),
            server_spans: self.hops[usize::from(self.routers)..]
                .iter()
                .map(|span| self.hop_ref(span).materialize(interner))
                .collect(),
            join: self.join,
            target_node: interner.owned(self.target_node),
            target_role: interner.owned(self.target_role),
            router_node: interner.owned(self.router_node),
            served_by: interner.owned(self.served_by),
            served_role: interner.owned(self.served_role),
            carried: self.carried(),
            router_carried: self.router_carried(),
            router_state: self.router_state(),
            served: self.served(),
            returned: self.returned(),
            committed: self.committed(),
            consistency: interner.owned(self.consistency),
            follower_read: self.follower_read,
            server_address: interner.owned(self.server_address),
            outcome: Some(outcome),
            error_type: interner.owned(self.error_type),
            requeues: self.requeues(),
            reported: Default::default(),
        }
    }
}

/// One final call (a compact `TimelineCall`).
#[derive(Debug)]
pub(crate) struct Call {
    pub(crate) call_id: Option<CallId>,
    pub(crate) op: Sym,
    pub(crate) rpc_method: Sym,
    pub(crate) start: UnixNanos,
    pub(crate) end: UnixNanos,
    /// Most calls have one attempt: kept inline, one allocation a call (and a pointer fewer
    /// to follow when it is read or dropped).
    pub(crate) attempts: SmallVec<[Attempt; 1]>,
}

impl Call {
    /// Reads what dropping the call reads (its call id's and attempt list's capacities, each
    /// attempt's hop list's), as the engine's other `touch` methods.
    pub(crate) fn touch_for_drop(&self) -> u64 {
        let ids = self.call_id.as_ref().map_or(0, |call_id| call_id.len() as u64);
        self.attempts.iter().fold(ids + self.attempts.len() as u64, |sum, attempt| sum + attempt.hops.len() as u64)
    }

    pub(crate) fn materialize(&self, interner: &Interner) -> TimelineCall {
        TimelineCall {
            call_id: self.call_id.as_deref().map(str::to_string),
            op: interner.get(self.op).map(Op::parse),
            rpc_method: interner.owned(self.rpc_method),
            start_unix_nano: self.start,
            end_unix_nano: self.end,
            attempts: self.attempts.iter().map(|attempt| attempt.materialize(interner)).collect(),
            floor: None,
        }
    }
}

/// A compact call read through the interner, as the anomaly constructors read calls
/// ([`CallView`]): what [`Call::materialize`] would give, without building it.
#[derive(Clone, Copy)]
pub(crate) struct CallIn<'a> {
    pub(crate) call: &'a Call,
    pub(crate) interner: &'a Interner,
}

/// A compact attempt read through the interner ([`AttemptView`]).
#[derive(Clone, Copy)]
pub(crate) struct AttemptIn<'a> {
    pub(crate) attempt: &'a Attempt,
    pub(crate) interner: &'a Interner,
}

/// A span's trace and span ids as OTLP writes them (32 and 16 hex digits), when it has them.
fn hex_ids(id: SpanKey) -> Option<(Id<'static>, Id<'static>)> {
    id.is_some().then_some((
        Id::Hex { value: id.trace_id(), digits: 32 },
        Id::Hex { value: u128::from(id.span_id), digits: 16 },
    ))
}

impl Ref {
    /// The reference as [`Ref::materialize`] gives it: ids only when the span has them.
    fn view<'a>(&self, interner: &'a Interner) -> SpanView<'a> {
        let ids = hex_ids(self.id);
        SpanView {
            trace_id: ids.map(|(trace_id, _)| trace_id),
            span_id: ids.map(|(_, span_id)| span_id),
            service_name: interner.get(self.service),
            node_id: interner.get(self.node),
        }
    }
}

impl AttemptView for AttemptIn<'_> {
    fn number(&self) -> Option<i64> {
        self.attempt.attempt()
    }
    fn start(&self) -> UnixNanos {
        self.attempt.start
    }
    fn end(&self) -> UnixNanos {
        self.attempt.end
    }
    fn carried(&self) -> Option<StateId> {
        self.attempt.carried()
    }
    fn router_carried(&self) -> Option<StateId> {
        self.attempt.router_carried()
    }
    fn router_state(&self) -> Option<StateId> {
        self.attempt.router_state()
    }
    fn served(&self) -> Option<StateId> {
        self.attempt.served()
    }
    fn returned(&self) -> Option<StateId> {
        self.attempt.returned()
    }
    fn committed(&self) -> Option<StateId> {
        self.attempt.committed()
    }
    fn target_node(&self) -> Option<&str> {
        self.interner.get(self.attempt.target_node)
    }
    fn router_node(&self) -> Option<&str> {
        self.interner.get(self.attempt.router_node)
    }
    fn served_by(&self) -> Option<&str> {
        self.interner.get(self.attempt.served_by)
    }
    fn served_role(&self) -> Option<&str> {
        self.interner.get(self.attempt.served_role)
    }
    fn each_span(&self, each: &mut dyn FnMut(SpanView<'_>)) {
        let attempt = self.attempt;
        each(attempt.client_span.view(self.interner));
        // Router spans, then server spans: the order they are kept in.
        for hop in &attempt.hops {
            each(attempt.hop_ref(hop).view(self.interner));
        }
    }
    fn client_span_ids(&self) -> Option<(Id<'_>, Id<'_>)> {
        hex_ids(self.attempt.client_span.id)
    }
}

impl CallView for CallIn<'_> {
    type Attempt<'b>
        = AttemptIn<'b>
    where
        Self: 'b;

    fn call_id(&self) -> Option<&str> {
        self.call.call_id.as_deref()
    }
    fn op(&self) -> Option<&str> {
        self.interner.get(self.call.op)
    }
    fn rpc_method(&self) -> Option<&str> {
        self.interner.get(self.call.rpc_method)
    }
    fn end(&self) -> UnixNanos {
        self.call.end
    }
    fn attempt(&self, index: usize) -> AttemptIn<'_> {
        AttemptIn { attempt: &self.call.attempts[index], interner: self.interner }
    }
    fn attempts(&self) -> impl DoubleEndedIterator<Item = AttemptIn<'_>> {
        self.call.attempts.iter().map(|attempt| AttemptIn { attempt, interner: self.interner })
    }
}

/// One attempt from its client span and the router and server spans joined to it, choosing
/// the executing server and the router hop as the batch join does.
pub(crate) fn build_attempt(client: &ClientRec, hops: &mut [HopRec], join: TimelineJoin) -> Attempt {
    hops.sort_by_key(|span| span.start);
    let hops = &*hops;
    let routers = || hops.iter().filter(|span| span.component == known::ROUTER);
    let servers = || hops.iter().filter(|span| span.component == known::SERVER);
    let server = servers().rev().find(|span| span.ok).or_else(|| servers().next_back());
    let router = server
        .and_then(|server| routers().find(|router| router.span_id != 0 && router.span_id == server.parent_span_id))
        .or_else(|| routers().next_back());
    let router_count = routers().count();
    let refs: SmallVec<[HopRef; 2]> = routers().chain(servers()).map(HopRef::of).collect();
    let returned =
        client.returned().or_else(|| router.and_then(HopRec::returned)).or_else(|| server.and_then(HopRec::returned));
    Attempt {
        start: client.start,
        end: client.end,
        client_span: Ref { id: client.id, service: client.service, node: client.node },
        hops: refs,
        routers: u8::try_from(router_count).unwrap_or(u8::MAX),
        join,
        target_node: client.target_node,
        target_role: client.target_role,
        router_node: router.map_or(Sym::NONE, |span| span.node),
        served_by: server.map_or(Sym::NONE, |span| span.node),
        served_role: server.map_or(Sym::NONE, |span| span.node_role),
        states: Packed::new([
            client.attempt(),
            client.carried(),
            router.and_then(HopRec::carried),
            router.and_then(HopRec::router_state),
            server.and_then(HopRec::served).or(client.served()),
            returned,
            server.and_then(HopRec::committed).or(client.committed()),
            server.and_then(HopRec::requeues),
        ]),
        consistency: client.consistency,
        follower_read: client.follower_read,
        server_address: client.server_address,
        ok: client.ok,
        outcome: client.outcome,
        error_type: client.error_type,
        hop_traces: None,
    }
}
