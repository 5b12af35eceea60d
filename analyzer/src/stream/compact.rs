//! Compact joined attempts and calls (the streaming counterparts of `TimelineAttempt` and
//! `TimelineCall`), turned into the model's types only when an anomaly needs them.

use lagscope_model::{Op, Outcome, SpanRef, StateId, TimelineAttempt, TimelineCall, TimelineJoin, UnixNanos};

use smallvec::SmallVec;

use super::intern::{Interner, Sym, known};
use super::record::{CallId, HopRec, SpanKey, SpanRec};

/// A span reference in compact form.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ref {
    pub(crate) id: SpanKey,
    pub(crate) service: Sym,
    pub(crate) node: Sym,
}

impl Ref {
    pub(crate) fn of(span: &SpanRec) -> Self {
        Self { id: span.id, service: span.service, node: span.node }
    }

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
        Ref { id: SpanKey { trace_id, span_id: self.span_id }, service: self.service, node: self.node }
    }
}

/// One attempt joined across client, router and server (a compact `TimelineAttempt`).
#[derive(Debug, Clone)]
pub(crate) struct Attempt {
    pub(crate) attempt: Option<i64>,
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
    pub(crate) carried: Option<StateId>,
    pub(crate) router_carried: Option<StateId>,
    pub(crate) router_state: Option<StateId>,
    pub(crate) served: Option<StateId>,
    pub(crate) returned: Option<StateId>,
    pub(crate) committed: Option<StateId>,
    pub(crate) consistency: Sym,
    pub(crate) follower_read: Option<bool>,
    pub(crate) server_address: Sym,
    pub(crate) ok: bool,
    pub(crate) outcome: Sym,
    pub(crate) error_type: Sym,
    pub(crate) requeues: Option<i64>,
}

impl Attempt {
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
        let states = [
            self.attempt,
            self.carried,
            self.router_carried,
            self.router_state,
            self.served,
            self.returned,
            self.committed,
            self.requeues,
        ];
        (self.client_span.id.trace_id as u64 ^ self.client_span.id.span_id)
            .wrapping_add(self.start as u64 ^ self.end as u64)
            .wrapping_add(symbols.iter().map(|sym| u64::from(sym.0)).sum::<u64>())
            .wrapping_add(super::record::sum_states(&states))
            .wrapping_add(self.hops.len() as u64 + u64::from(self.routers) + self.join as u64)
            .wrapping_add(u64::from(self.ok) + u64::from(self.follower_read.unwrap_or_default()))
    }

    pub(crate) fn materialize(&self, interner: &Interner) -> TimelineAttempt {
        let outcome =
            if self.ok { Outcome::Ok } else { interner.get(self.outcome).map_or(Outcome::Error, Outcome::parse) };
        TimelineAttempt {
            attempt: self.attempt,
            start_unix_nano: self.start,
            end_unix_nano: self.end,
            client_span: self.client_span.materialize(interner),
            router_spans: self.hops[..usize::from(self.routers)]
                .iter()
                .map(|span| span.in_trace(self.client_span.id.trace_id).materialize(interner))
                .collect(),
            server_spans: self.hops[usize::from(self.routers)..]
                .iter()
                .map(|span| span.in_trace(self.client_span.id.trace_id).materialize(interner))
                .collect(),
            join: self.join,
            target_node: interner.owned(self.target_node),
            target_role: interner.owned(self.target_role),
            router_node: interner.owned(self.router_node),
            served_by: interner.owned(self.served_by),
            served_role: interner.owned(self.served_role),
            carried: self.carried,
            router_carried: self.router_carried,
            router_state: self.router_state,
            served: self.served,
            returned: self.returned,
            committed: self.committed,
            consistency: interner.owned(self.consistency),
            follower_read: self.follower_read,
            server_address: interner.owned(self.server_address),
            outcome: Some(outcome),
            error_type: interner.owned(self.error_type),
            requeues: self.requeues,
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
    pub(crate) attempts: Vec<Attempt>,
}

impl Call {
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

/// One attempt from its client span and the router and server spans joined to it, choosing
/// the executing server and the router hop as the batch join does.
pub(crate) fn build_attempt(client: &SpanRec, hops: &mut [HopRec], join: TimelineJoin) -> Attempt {
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
    Attempt {
        attempt: client.attempt,
        start: client.start,
        end: client.end,
        client_span: Ref::of(client),
        hops: refs,
        routers: u8::try_from(router_count).unwrap_or(u8::MAX),
        join,
        target_node: client.target_node,
        target_role: client.target_role,
        router_node: router.map_or(Sym::NONE, |span| span.node),
        served_by: server.map_or(Sym::NONE, |span| span.node),
        served_role: server.map_or(Sym::NONE, |span| span.node_role),
        carried: client.carried,
        router_carried: router.and_then(HopRec::carried),
        router_state: router.and_then(HopRec::router_state),
        served: server.and_then(HopRec::served).or(client.served),
        returned: client
            .returned
            .or_else(|| router.and_then(HopRec::returned))
            .or_else(|| server.and_then(HopRec::returned)),
        committed: server.and_then(HopRec::committed).or(client.committed),
        consistency: client.consistency,
        follower_read: client.follower_read,
        server_address: client.server_address,
        ok: client.ok,
        outcome: client.outcome,
        error_type: client.error_type,
        requeues: server.and_then(HopRec::requeues),
    }
}
