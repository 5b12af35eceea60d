//! What the per-attempt anomaly constructors read of a call and its attempts: the batch
//! analyzer's timeline types, or the streaming engine's compact records read through its
//! interner. One constructor serves both; the engine no longer builds a `TimelineCall` (a
//! string for every name and id) for each anomaly it raises, only to write its evidence.

use lagscope_model::{StateId, TimelineAttempt, TimelineCall, UnixNanos};

/// A span id as evidence cites it: text as received, or an integer written as lowercase hex
/// digits (as OTLP writes ids).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Id<'a> {
    Text(&'a str),
    Hex { value: u128, digits: usize },
}

impl Id<'_> {
    /// Appends the id as a JSON string.
    pub(crate) fn push_json(self, out: &mut String) {
        match self {
            Id::Text(text) => lagscope_model::json::push_str(out, text),
            Id::Hex { value, digits } => {
                out.push('"');
                push_hex(out, value, digits);
                out.push('"');
            }
        }
    }

    /// Appends the id as plain text.
    pub(crate) fn push_text(self, out: &mut String) {
        match self {
            Id::Text(text) => out.push_str(text),
            Id::Hex { value, digits } => push_hex(out, value, digits),
        }
    }
}

/// Appends the last `digits` (at most 32) of `value`'s 32 lowercase hex digits
/// (`format!("{value:0digits$x}")` without the formatting machinery).
pub(crate) fn push_hex(out: &mut String, value: u128, digits: usize) {
    let mut text = [0u8; 32];
    text[..16].copy_from_slice(&hex_digits((value >> 64) as u64));
    text[16..].copy_from_slice(&hex_digits(value as u64));
    // Hex digits are ASCII: the check cannot fail (and is a word at a time).
    out.push_str(std::str::from_utf8(&text[32 - digits.min(32)..]).unwrap_or_default());
}

/// The 16 lowercase hex digits of `value`, most significant first, made a word at a time
/// (every id an anomaly cites is written this way): each nibble is spread into a byte of its
/// own, then turned into its digit (`'0' + n`, plus the distance to `'a'` for n above 9).
fn hex_digits(value: u64) -> [u8; 16] {
    const LOW_NIBBLES: u128 = 0x0f0f_0f0f_0f0f_0f0f_0f0f_0f0f_0f0f_0f0f;
    let ones = LOW_NIBBLES / 0x0f;
    let mut spread = u128::from(value);
    spread = (spread | (spread << 32)) & 0x0000_0000_ffff_ffff_0000_0000_ffff_ffff;
    spread = (spread | (spread << 16)) & 0x0000_ffff_0000_ffff_0000_ffff_0000_ffff;
    spread = (spread | (spread << 8)) & 0x00ff_00ff_00ff_00ff_00ff_00ff_00ff_00ff;
    spread = (spread | (spread << 4)) & LOW_NIBBLES;
    // 1 in each byte whose nibble is above 9 (n + 6 reaches 16); no byte carries into the next.
    let letters = ((spread + 6 * ones) >> 4) & ones;
    (spread + 0x30 * ones + letters * (b'a' - b'0' - 10) as u128).to_be_bytes()
}

/// One span an attempt cites: `{trace_id, span_id, service_name, node_id}`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SpanView<'a> {
    pub(crate) trace_id: Option<Id<'a>>,
    pub(crate) span_id: Option<Id<'a>>,
    pub(crate) service_name: Option<&'a str>,
    pub(crate) node_id: Option<&'a str>,
}

/// An attempt as the constructors read it (the fields of [`TimelineAttempt`] they use).
pub(crate) trait AttemptView {
    /// The attempt's number (`TimelineAttempt::attempt`).
    fn number(&self) -> Option<i64>;
    fn start(&self) -> UnixNanos;
    fn end(&self) -> UnixNanos;
    fn carried(&self) -> Option<StateId>;
    fn router_carried(&self) -> Option<StateId>;
    fn router_state(&self) -> Option<StateId>;
    fn served(&self) -> Option<StateId>;
    fn returned(&self) -> Option<StateId>;
    fn committed(&self) -> Option<StateId>;
    fn target_node(&self) -> Option<&str>;
    fn router_node(&self) -> Option<&str>;
    fn served_by(&self) -> Option<&str>;
    fn served_role(&self) -> Option<&str>;
    /// The client span, then the router spans, then the server spans, to `each`.
    fn each_span(&self, each: &mut dyn FnMut(SpanView<'_>));
    /// The client span's trace and span ids, when it has both.
    fn client_span_ids(&self) -> Option<(Id<'_>, Id<'_>)>;
}

/// A call as the constructors read it.
pub(crate) trait CallView {
    type Attempt<'a>: AttemptView
    where
        Self: 'a;

    fn call_id(&self) -> Option<&str>;
    fn op(&self) -> Option<&str>;
    fn rpc_method(&self) -> Option<&str>;
    /// When the client had the response (the last attempt's end).
    fn end(&self) -> UnixNanos;
    /// The attempt at `index` (in start order).
    fn attempt(&self, index: usize) -> Self::Attempt<'_>;
    fn attempts(&self) -> impl DoubleEndedIterator<Item = Self::Attempt<'_>>;
}

impl<T: CallView + ?Sized> CallView for &T {
    type Attempt<'a>
        = T::Attempt<'a>
    where
        Self: 'a;

    fn call_id(&self) -> Option<&str> {
        (**self).call_id()
    }
    fn op(&self) -> Option<&str> {
        (**self).op()
    }
    fn rpc_method(&self) -> Option<&str> {
        (**self).rpc_method()
    }
    fn end(&self) -> UnixNanos {
        (**self).end()
    }
    fn attempt(&self, index: usize) -> Self::Attempt<'_> {
        (**self).attempt(index)
    }
    fn attempts(&self) -> impl DoubleEndedIterator<Item = Self::Attempt<'_>> {
        (**self).attempts()
    }
}

impl<T: AttemptView + ?Sized> AttemptView for &T {
    fn number(&self) -> Option<i64> {
        (**self).number()
    }
    fn start(&self) -> UnixNanos {
        (**self).start()
    }
    fn end(&self) -> UnixNanos {
        (**self).end()
    }
    fn carried(&self) -> Option<StateId> {
        (**self).carried()
    }
    fn router_carried(&self) -> Option<StateId> {
        (**self).router_carried()
    }
    fn router_state(&self) -> Option<StateId> {
        (**self).router_state()
    }
    fn served(&self) -> Option<StateId> {
        (**self).served()
    }
    fn returned(&self) -> Option<StateId> {
        (**self).returned()
    }
    fn committed(&self) -> Option<StateId> {
        (**self).committed()
    }
    fn target_node(&self) -> Option<&str> {
        (**self).target_node()
    }
    fn router_node(&self) -> Option<&str> {
        (**self).router_node()
    }
    fn served_by(&self) -> Option<&str> {
        (**self).served_by()
    }
    fn served_role(&self) -> Option<&str> {
        (**self).served_role()
    }
    fn each_span(&self, each: &mut dyn FnMut(SpanView<'_>)) {
        (**self).each_span(each)
    }
    fn client_span_ids(&self) -> Option<(Id<'_>, Id<'_>)> {
        (**self).client_span_ids()
    }
}

impl AttemptView for TimelineAttempt {
    fn number(&self) -> Option<i64> {
        self.attempt
    }
    fn start(&self) -> UnixNanos {
        self.start_unix_nano
    }
    fn end(&self) -> UnixNanos {
        self.end_unix_nano
    }
    fn carried(&self) -> Option<StateId> {
        self.carried
    }
    fn router_carried(&self) -> Option<StateId> {
        self.router_carried
    }
    fn router_state(&self) -> Option<StateId> {
        self.router_state
    }
    fn served(&self) -> Option<StateId> {
        self.served
    }
    fn returned(&self) -> Option<StateId> {
        self.returned
    }
    fn committed(&self) -> Option<StateId> {
        self.committed
    }
    fn target_node(&self) -> Option<&str> {
        self.target_node.as_deref()
    }
    fn router_node(&self) -> Option<&str> {
        self.router_node.as_deref()
    }
    fn served_by(&self) -> Option<&str> {
        self.served_by.as_deref()
    }
    fn served_role(&self) -> Option<&str> {
        self.served_role.as_deref()
    }
    fn each_span(&self, each: &mut dyn FnMut(SpanView<'_>)) {
        for span in std::iter::once(&self.client_span).chain(&self.router_spans).chain(&self.server_spans) {
            each(SpanView {
                trace_id: span.trace_id.as_deref().map(Id::Text),
                span_id: span.span_id.as_deref().map(Id::Text),
                service_name: span.service_name.as_deref(),
                node_id: span.node_id.as_deref(),
            });
        }
    }
    fn client_span_ids(&self) -> Option<(Id<'_>, Id<'_>)> {
        match (&self.client_span.trace_id, &self.client_span.span_id) {
            (Some(trace_id), Some(span_id)) => Some((Id::Text(trace_id), Id::Text(span_id))),
            _ => None,
        }
    }
}

impl CallView for TimelineCall {
    type Attempt<'a> = &'a TimelineAttempt;

    fn call_id(&self) -> Option<&str> {
        self.call_id.as_deref()
    }
    fn op(&self) -> Option<&str> {
        self.op.as_ref().map(|op| op.as_str())
    }
    fn rpc_method(&self) -> Option<&str> {
        self.rpc_method.as_deref()
    }
    fn end(&self) -> UnixNanos {
        self.end_unix_nano
    }
    fn attempt(&self, index: usize) -> &TimelineAttempt {
        &self.attempts[index]
    }
    fn attempts(&self) -> impl DoubleEndedIterator<Item = &TimelineAttempt> {
        self.attempts.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::push_hex;

    /// Hex ids are written as `format!` writes them, zero-padded to their digits.
    #[test]
    fn hex_ids_are_written_as_format_writes_them() {
        let mut values =
            vec![0_u128, 1, 0xabc, u128::from(u64::MAX), u128::MAX, 0x0af7_6519_16cd_43dd_8448_eb21_1c80_319c];
        // Every digit in every place: 0123456789abcdef, f0123456789abcde, ... in both halves.
        let ascending = (0..32).fold(0_u128, |value, place| value << 4 | (place % 16) as u128);
        values.extend((0..16).map(|turn| ascending.rotate_left(4 * turn)));
        for value in values {
            for digits in [16, 32] {
                let mut text = String::new();
                push_hex(&mut text, value, digits);
                let expected = format!("{value:032x}");
                assert_eq!(text, expected[32 - digits..], "{value:#x} in {digits} digits");
            }
        }
    }
}
