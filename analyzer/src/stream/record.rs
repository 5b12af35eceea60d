//! The compact records the streaming engine works on: a span with the conventions' fields as
//! symbols and integers, and a numeric metric sample of an interned series.

use lagscope_model::{Component, Span, StateId, UnixNanos};

use super::intern::{Interner, Sym, known};

/// `symbols()` and `set_symbols()` over the listed fields, in that order (lscap's).
macro_rules! symbol_fields {
    ($($field:ident),+ $(,)?) => {
        /// Every symbol field, in the order lscap writes them.
        pub fn symbols(&self) -> [Sym; 16] {
            [$(self.$field),+]
        }

        /// Sets every symbol field from [`SpanRec::symbols`]' order.
        pub fn set_symbols(&mut self, symbols: [Sym; 16]) {
            [$(self.$field),+] = symbols;
        }
    };
}

/// A call id, inline up to 24 bytes (call ids are unique per call: never interned, and short
/// enough in practice that no span allocates for one).
pub type CallId = compact_str::CompactString;

/// Span ids as integers (OTLP's 16- and 8-byte ids; zero means absent). The trace id is
/// kept as two words, not a `u128`: that would align every record holding a key (the held
/// attempts, most of the engine's memory) to 16 bytes, and pad each of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SpanKey {
    trace: [u64; 2],
    pub span_id: u64,
}

impl SpanKey {
    pub fn new(trace_id: u128, span_id: u64) -> Self {
        Self { trace: [(trace_id >> 64) as u64, trace_id as u64], span_id }
    }

    pub fn trace_id(self) -> u128 {
        u128::from(self.trace[0]) << 64 | u128::from(self.trace[1])
    }

    pub fn is_some(self) -> bool {
        self.span_id != 0
    }

    /// The trace id as OTLP writes it: 32 lowercase hex digits.
    pub fn trace_hex(self) -> String {
        lower_hex(self.trace_id(), 32)
    }

    /// The span id as OTLP writes it: 16 lowercase hex digits.
    pub fn span_hex(self) -> String {
        lower_hex(u128::from(self.span_id), 16)
    }
}

/// `format!("{value:0digits$x}")` for `digits` <= 32, without the formatting machinery.
fn lower_hex(value: u128, digits: usize) -> String {
    let mut text = String::with_capacity(digits);
    crate::detectors::view::push_hex(&mut text, value, digits);
    text
}

/// One span, as the engine needs it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpanRec {
    pub id: SpanKey,
    /// The parent's span id (same trace); 0 when the span is a root or has no context.
    pub parent_span_id: u64,
    pub start: UnixNanos,
    pub end: UnixNanos,
    /// `known::CLIENT`, `ROUTER`, `SERVER` or another component; NONE when unknown.
    pub component: Sym,
    pub ok: bool,
    pub service: Sym,
    pub system: Sym,
    pub cluster: Sym,
    pub node: Sym,
    pub client: Sym,
    /// Call ids are unique per call: kept inline, never interned (the dictionary would grow
    /// with history).
    pub call_id: Option<CallId>,
    pub attempt: Option<i64>,
    pub namespace: Sym,
    pub op: Sym,
    pub rpc_method: Sym,
    pub target_node: Sym,
    pub target_role: Sym,
    pub node_role: Sym,
    pub consistency: Sym,
    pub follower_read: Option<bool>,
    pub outcome: Sym,
    pub error_type: Sym,
    pub server_address: Sym,
    pub carried: Option<StateId>,
    pub returned: Option<StateId>,
    pub served: Option<StateId>,
    pub committed: Option<StateId>,
    pub router_state: Option<StateId>,
    pub requeues: Option<i64>,
}

/// Up to 8 optional integers packed as values and a presence mask: an `Option<i64>` takes 16
/// bytes, and the records held for the horizon are most of the engine's memory (and of its
/// cache misses).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Packed<const N: usize> {
    values: [i64; N],
    present: u8,
}

impl<const N: usize> Packed<N> {
    pub(crate) fn new(optional: [Option<i64>; N]) -> Self {
        let (values, present) = pack(optional);
        Self { values, present }
    }

    #[inline]
    pub(crate) fn get(&self, index: usize) -> Option<i64> {
        unpack(&self.values, self.present, index)
    }

    /// The sum of the values and the mask, wrapping (part of the `touch` methods).
    pub(crate) fn sum(&self) -> u64 {
        packed_sum(&self.values, self.present)
    }
}

/// Optional integers as values (absent ones 0) and a mask of the present ones, straight-line
/// (this runs for every span kept).
fn pack<const N: usize>(optional: [Option<i64>; N]) -> ([i64; N], u8) {
    const { assert!(N <= 8, "a u8 mask") };
    let present = optional.iter().rev().fold(0_u8, |bits, value| bits << 1 | u8::from(value.is_some()));
    (optional.map(Option::unwrap_or_default), present)
}

#[inline]
fn unpack(values: &[i64], present: u8, index: usize) -> Option<i64> {
    (present & (1 << index) != 0).then_some(values[index])
}

fn packed_sum(values: &[i64], present: u8) -> u64 {
    values.iter().fold(u64::from(present), |sum, value| sum.wrapping_add(*value as u64))
}

/// `name()` for a record's packed optional integers, by their place (read through the
/// record's `state(index)`).
macro_rules! packed_states {
    ($($name:ident: $index:literal),+ $(,)?) => {$(
        #[inline]
        pub(crate) fn $name(&self) -> Option<i64> {
            self.state($index)
        }
    )+};
}
pub(crate) use packed_states;

/// A router, server or intermediate span waiting to be joined to its client attempt: only
/// what the join and the attempt read, packed (traces wait the lateness, ~20 000 spans at a
/// time, and are read again cold at the join: 112 bytes instead of a [`SpanRec`]'s 256). Its
/// trace id is its trace's key in the engine's waiting table (a span without ids waits by call
/// id and has none); its optional integers are packed as [`Packed`]'s are, but with the mask
/// beside the values rather than in a `Packed<7>` (whose padding would make the record 120
/// bytes).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HopRec {
    /// 0 when the span has no ids.
    pub span_id: u64,
    pub parent_span_id: u64,
    pub start: UnixNanos,
    pub end: UnixNanos,
    /// attempt, carried, returned, served, committed, router state, requeues (see
    /// [`HopRec::carried`] and its siblings); absent ones are 0 with their bit clear.
    values: [i64; 7],
    present: u8,
    pub ok: bool,
    pub component: Sym,
    pub service: Sym,
    pub node: Sym,
    pub node_role: Sym,
}

impl HopRec {
    packed_states!(attempt: 0, carried: 1, returned: 2, served: 3, committed: 4, router_state: 5, requeues: 6);

    #[inline]
    fn state(&self, index: usize) -> Option<i64> {
        unpack(&self.values, self.present, index)
    }

    /// Reads every field (so every cache line of the record): the engine reads a batch of
    /// records this way before working on them, so that their cache misses overlap.
    pub(crate) fn touch(&self) -> u64 {
        let symbols = [self.component, self.service, self.node, self.node_role];
        (self.span_id ^ self.parent_span_id)
            .wrapping_add(self.start as u64 ^ self.end as u64)
            .wrapping_add(symbols.iter().map(|sym| u64::from(sym.0)).sum::<u64>())
            .wrapping_add(packed_sum(&self.values, self.present))
            .wrapping_add(u64::from(self.ok))
    }

    pub fn of(span: &SpanRec) -> Self {
        let optional =
            [span.attempt, span.carried, span.returned, span.served, span.committed, span.router_state, span.requeues];
        let (values, present) = pack(optional);
        Self {
            span_id: span.id.span_id,
            parent_span_id: span.parent_span_id,
            start: span.start,
            end: span.end,
            values,
            present,
            ok: span.ok,
            component: span.component,
            service: span.service,
            node: span.node,
            node_role: span.node_role,
        }
    }
}

impl SpanRec {
    /// The compact form of a model span. Ids that are not the collector's lowercase hex are
    /// dropped (the span then joins by call id).
    pub fn from_span(span: &Span, interner: &mut Interner) -> Self {
        let trace_id = span.trace_id.as_deref().and_then(|id| u128::from_str_radix(id, 16).ok()).unwrap_or(0);
        let span_id = span.span_id.as_deref().and_then(|id| u64::from_str_radix(id, 16).ok()).unwrap_or(0);
        let parent_span_id =
            span.parent_span_id.as_deref().and_then(|id| u64::from_str_radix(id, 16).ok()).unwrap_or(0);
        let (trace_id, span_id) = if trace_id == 0 || span_id == 0 { (0, 0) } else { (trace_id, span_id) };
        let call = &span.call;
        let component = match span.component() {
            Some(Component::Client) => known::CLIENT,
            Some(Component::Router) => known::ROUTER,
            Some(Component::Server) => known::SERVER,
            Some(Component::Other(other)) => interner.intern(&other),
            None => Sym::NONE,
        };
        Self {
            id: SpanKey::new(trace_id, span_id),
            parent_span_id: if span_id == 0 { 0 } else { parent_span_id },
            start: span.start_unix_nano,
            end: span.end_unix_nano,
            component,
            ok: span.is_ok(),
            service: interner.intern_opt(span.resource.service_name.as_deref()),
            system: interner.intern_opt(span.resource.system.as_deref()),
            cluster: interner.intern_opt(span.resource.cluster.as_deref()),
            node: interner.intern_opt(span.resource.node_id.as_deref()),
            client: interner.intern_opt(call.client_id.as_deref()),
            call_id: call.call_id.as_deref().map(Into::into),
            attempt: call.attempt,
            namespace: interner.intern_opt(call.namespace.as_deref()),
            op: interner.intern_opt(call.op.as_ref().map(|op| op.as_str())),
            rpc_method: interner.intern_opt(call.rpc_method.as_deref()),
            target_node: interner.intern_opt(call.target_node.as_deref()),
            target_role: interner.intern_opt(call.target_role.as_deref()),
            node_role: interner.intern_opt(call.node_role.as_deref()),
            consistency: interner.intern_opt(call.consistency.as_deref()),
            follower_read: call.follower_read,
            outcome: interner.intern_opt(call.outcome.as_ref().map(|outcome| outcome.as_str())),
            error_type: interner.intern_opt(call.error_type.as_deref()),
            server_address: interner
                .intern_opt(span.attributes.get("server.address").and_then(serde_json::Value::as_str)),
            carried: call.state.carried,
            returned: call.state.returned,
            served: call.state.served,
            committed: call.state.committed,
            router_state: call.state.router,
            requeues: call.requeues,
        }
    }

    symbol_fields!(
        component,
        service,
        system,
        cluster,
        node,
        client,
        namespace,
        op,
        rpc_method,
        target_node,
        target_role,
        node_role,
        consistency,
        outcome,
        error_type,
        server_address,
    );

    /// A span with ids and a parent that is not a client attempt: the engine joins it to its
    /// attempt through the trace, and reads of it only what [`HopRec`] keeps. (A root hop, one
    /// whose process received no trace context, joins by call id, as one without ids does.)
    pub fn is_trace_hop(&self) -> bool {
        self.id.is_some() && self.parent_span_id != 0 && !self.is_client_attempt()
    }

    /// The symbols the engine reads of a [trace hop](SpanRec::is_trace_hop) (what [`HopRec`]
    /// keeps): component, service, node, node role.
    pub fn hop_symbols(&self) -> [Sym; 4] {
        [self.component, self.service, self.node, self.node_role]
    }

    /// Sets [`SpanRec::hop_symbols`] and clears every other symbol.
    pub fn set_hop_symbols(&mut self, [component, service, node, node_role]: [Sym; 4]) {
        self.set_symbols([Sym::NONE; 16]);
        (self.component, self.service, self.node, self.node_role) = (component, service, node, node_role);
    }

    /// A client's attempt: the unit timelines are made of.
    pub fn is_client_attempt(&self) -> bool {
        self.component == known::CLIENT && self.client.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::{Packed, SpanKey};

    /// Every combination of present and absent integers (zero, negative and extreme values
    /// among them: an absent one is stored as 0) reads back as it went in.
    #[test]
    fn packed_integers_read_back_as_given() {
        let values = [0, -1, i64::MIN, i64::MAX, 7, 1_000_019, -42, 3];
        for mask in 0..=u8::MAX {
            let optional: [Option<i64>; 8] =
                std::array::from_fn(|index| (mask & (1 << index) != 0).then_some(values[index]));
            let packed = Packed::new(optional);
            let read: [Option<i64>; 8] = std::array::from_fn(|index| packed.get(index));
            assert_eq!(read, optional, "mask {mask:#010b}");
        }
        let five = Packed::new([None, Some(0), None, Some(-5), Some(9)]);
        assert_eq!((0..5).map(|index| five.get(index)).collect::<Vec<_>>(), [None, Some(0), None, Some(-5), Some(9)]);
    }

    #[test]
    fn ids_are_written_as_otlp_hex() {
        for (trace_id, span_id) in
            [(0, 1), (1, u64::MAX), (u128::MAX, 0x00ab_cdef_0123_4567), (0x0af7_6519_16cd_43dd_8448_eb21_1c80_319c, 42)]
        {
            let key = SpanKey::new(trace_id, span_id);
            assert_eq!(key.trace_hex(), format!("{trace_id:032x}"));
            assert_eq!(key.span_hex(), format!("{span_id:016x}"));
        }
    }
}
