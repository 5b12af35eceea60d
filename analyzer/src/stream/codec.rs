//! `lscap`: lagscope's compact analysis capture. Spans and numeric samples as the analyzer
//! reads them, with strings in a dictionary written once, in blocks a reader decodes one at a
//! time (memory bounded by a block, not by the file).
//!
//! ```text
//! file   = MAGIC block*
//! block  = u32 LE payload length, payload (items; no item crosses a block)
//! item   = 1 string  (varint length, UTF-8 bytes)          -> next string index, from 1
//!        | 2 span    (see `Encoder::span`)
//!        | 3 series  (name index, u8 metric kind, label count, (key index, value index)*)
//!                                                       -> next series index
//!        | 4 sample  (series index, i64 LE time, f64 LE value)
//!        | 5 log     (varint length, a recognised log line as JSON)
//!        | 6 hop     (a span with ids that is not a client attempt: a span item with four
//!                     symbols, component, service, node and node role, instead of sixteen,
//!                     and no call id or follower-read flag)
//! ```
//! Integers are LEB128 varints (zigzag for signed ones); string index 0 means "absent".
//! This module is pure: it turns records into bytes and bytes into records.
//!
//! A hop carries what the engine reads of a router, server or intermediate span that joins
//! its client attempt through the trace ([`HopRec`](super::record::HopRec)'s fields): its other
//! symbols and its call id are not read for such a span (the call id only joins spans without
//! trace context), and two thirds of a capture's spans are hops. Written this way a capture is
//! ~15% smaller and its hops decode without a call id's UTF-8 check or twelve symbol lookups
//! (~4% of `analyze`'s instructions); read back, the fields left out are absent. Captures
//! written before hops existed (every span an item 2) read as they always did.

use lagscope_model::MetricKind;
use rustc_hash::FxHashMap;

use super::intern::{Interner, Sym};
use super::record::{SpanKey, SpanRec};

#[cfg(test)]
mod tests;

pub const MAGIC: &[u8; 8] = b"LSCAP01\n";
/// A writer starts a new block when the current one reaches this size.
pub const BLOCK_TARGET_BYTES: usize = 256 * 1024;
/// Readers refuse blocks larger than this (a corrupt length must not allocate gigabytes).
pub const MAX_BLOCK_BYTES: usize = 64 * 1024 * 1024;

const TAG_STRING: u8 = 1;
const TAG_SPAN: u8 = 2;
const TAG_SERIES: u8 = 3;
const TAG_SAMPLE: u8 = 4;
/// A recognised log line ([`crate::log_events::LogEvent`]) as JSON: they are few, and kept
/// whole.
const TAG_LOG_EVENT: u8 = 5;
const TAG_HOP: u8 = 6;

/// A metric series: its name and labels (symbols of the reader's interner).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SeriesDef {
    pub name: Sym,
    pub kind: MetricKind,
    pub labels: Vec<(Sym, Sym)>,
}

const KINDS: [MetricKind; 7] = [
    MetricKind::Gauge,
    MetricKind::CumulativeCounter,
    MetricKind::DeltaCounter,
    MetricKind::UpDownCounter,
    MetricKind::Histogram,
    MetricKind::ExponentialHistogram,
    MetricKind::Summary,
];

/// One numeric point of a series (the series index is the reader's, in definition order).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampleRec {
    pub series: u32,
    pub time: i64,
    pub value: f64,
}

/// What a block held.
// Spans are nearly every item: boxing them would cost an allocation each.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    Span(SpanRec),
    Series(SeriesDef),
    Sample(SampleRec),
    LogEvent(Box<crate::log_events::LogEvent>),
}

/// Decoded items, a few at a time, in memory reused from one call of
/// [`Decoder::decode_some`] to the next: a span is decoded over the one that had its place
/// before (a `SpanRec` is ~270 bytes: no default written and then copied for each).
#[derive(Debug, Default)]
pub struct Batch {
    items: Vec<Item>,
    len: usize,
}

impl Batch {
    /// What the latest [`Decoder::decode_some`] decoded, in order.
    pub fn items(&self) -> &[Item] {
        &self.items[..self.len]
    }

    /// The next place, as a span (the one there kept, to be overwritten whole).
    fn next_span(&mut self) -> &mut SpanRec {
        if self.len == self.items.len() {
            self.items.push(Item::Span(SpanRec::default()));
        } else if !matches!(self.items[self.len], Item::Span(_)) {
            self.items[self.len] = Item::Span(SpanRec::default());
        }
        match &mut self.items[self.len] {
            Item::Span(span) => span,
            _ => unreachable!("made a span above"),
        }
    }

    /// Puts `sample` in the next place (over a sample there, without moving a whole `Item`,
    /// which is a span's size).
    fn push_sample(&mut self, sample: SampleRec) {
        match self.items.get_mut(self.len) {
            Some(Item::Sample(place)) => *place = sample,
            Some(place) => *place = Item::Sample(sample),
            None => self.items.push(Item::Sample(sample)),
        }
        self.len += 1;
    }

    /// Puts `item` in the next place.
    fn push(&mut self, item: Item) {
        if self.len == self.items.len() {
            self.items.push(item);
        } else {
            self.items[self.len] = item;
        }
        self.len += 1;
    }
}

/// Turns records into blocks. Strings are written the first time a block needs them.
#[derive(Debug, Default)]
pub struct Encoder {
    /// Writer-side symbol -> index in the file's dictionary.
    written: FxHashMap<Sym, u32>,
    next_string: u32,
    series: FxHashMap<SeriesDef, u32>,
    block: Vec<u8>,
}

impl Encoder {
    /// Appends a span; `interner` resolves the record's symbols. A span with ids that is not a
    /// client attempt is written as a hop (see the module documentation).
    pub fn span(&mut self, span: &SpanRec, interner: &Interner) {
        let hop = span.is_trace_hop();
        let all = span.symbols();
        let syms: &[Sym] = if hop { &span.hop_symbols() } else { &all };
        let mut indexes = [0_u32; 16];
        for (index, sym) in indexes.iter_mut().zip(syms) {
            *index = self.string(*sym, interner);
        }
        let call_id = if hop { None } else { span.call_id.as_ref() };
        let follower_read = if hop { None } else { span.follower_read };
        let optional_states =
            [span.carried, span.returned, span.served, span.committed, span.router_state, span.requeues];
        let mut flags: u64 = 0;
        flags |= u64::from(span.id.is_some());
        flags |= u64::from(span.parent_span_id != 0) << 1;
        flags |= u64::from(span.ok) << 2;
        flags |= u64::from(call_id.is_some()) << 3;
        flags |= u64::from(span.attempt.is_some()) << 4;
        flags |= u64::from(follower_read.is_some()) << 5;
        flags |= u64::from(follower_read == Some(true)) << 6;
        for (bit, state) in optional_states.iter().enumerate() {
            flags |= u64::from(state.is_some()) << (7 + bit);
        }
        let out = &mut self.block;
        out.push(if hop { TAG_HOP } else { TAG_SPAN });
        put_varint(out, flags);
        if span.id.is_some() {
            out.extend_from_slice(&span.id.trace_id().to_le_bytes());
            out.extend_from_slice(&span.id.span_id.to_le_bytes());
        }
        if span.parent_span_id != 0 {
            out.extend_from_slice(&span.parent_span_id.to_le_bytes());
        }
        out.extend_from_slice(&span.start.to_le_bytes());
        put_signed(out, span.end.wrapping_sub(span.start));
        for index in &indexes[..syms.len()] {
            put_varint(out, u64::from(*index));
        }
        if let Some(call_id) = call_id {
            put_varint(out, call_id.len() as u64);
            out.extend_from_slice(call_id.as_bytes());
        }
        if let Some(attempt) = span.attempt {
            put_signed(out, attempt);
        }
        for state in optional_states.into_iter().flatten() {
            put_signed(out, state);
        }
    }

    /// Appends a recognised log line.
    pub fn log_event(&mut self, event: &crate::log_events::LogEvent) {
        let json = serde_json::to_vec(event).unwrap_or_default();
        self.block.push(TAG_LOG_EVENT);
        put_varint(&mut self.block, json.len() as u64);
        self.block.extend_from_slice(&json);
    }

    /// Appends a numeric sample of the series `name{labels}`.
    pub fn sample(
        &mut self,
        name: &str,
        kind: MetricKind,
        labels: &[(&str, &str)],
        time: i64,
        value: f64,
        interner: &mut Interner,
    ) {
        let definition = SeriesDef {
            name: interner.intern(name),
            kind,
            labels: labels.iter().map(|(key, value)| (interner.intern(key), interner.intern(value))).collect(),
        };
        let series = match self.series.get(&definition) {
            Some(index) => *index,
            None => {
                let name_index = self.string(definition.name, interner);
                let label_indexes: Vec<(u32, u32)> = definition
                    .labels
                    .iter()
                    .map(|(key, value)| (self.string(*key, interner), self.string(*value, interner)))
                    .collect();
                let out = &mut self.block;
                out.push(TAG_SERIES);
                put_varint(out, u64::from(name_index));
                out.push(KINDS.iter().position(|known| *known == kind).unwrap_or(0) as u8);
                put_varint(out, label_indexes.len() as u64);
                for (key, value) in label_indexes {
                    put_varint(out, u64::from(key));
                    put_varint(out, u64::from(value));
                }
                let index = u32::try_from(self.series.len()).expect("fewer than 2^32 series");
                self.series.insert(definition, index);
                index
            }
        };
        let out = &mut self.block;
        out.push(TAG_SAMPLE);
        put_varint(out, u64::from(series));
        out.extend_from_slice(&time.to_le_bytes());
        out.extend_from_slice(&value.to_le_bytes());
    }

    /// The current block, framed, if it reached the target size (or `force`); the caller
    /// writes it. Start every file with [`MAGIC`].
    pub fn take_block(&mut self, force: bool) -> Option<Vec<u8>> {
        if self.block.is_empty() || (!force && self.block.len() < BLOCK_TARGET_BYTES) {
            return None;
        }
        let length = u32::try_from(self.block.len()).expect("a block is far smaller than 4 GiB");
        let mut framed = Vec::with_capacity(self.block.len() + 4);
        framed.extend_from_slice(&length.to_le_bytes());
        framed.append(&mut self.block);
        Some(framed)
    }

    fn string(&mut self, sym: Sym, interner: &Interner) -> u32 {
        if !sym.is_some() {
            return 0;
        }
        if let Some(index) = self.written.get(&sym) {
            return *index;
        }
        let text = interner.get(sym).unwrap_or_default();
        self.block.push(TAG_STRING);
        put_varint(&mut self.block, text.len() as u64);
        self.block.extend_from_slice(text.as_bytes());
        self.next_string += 1;
        self.written.insert(sym, self.next_string);
        self.next_string
    }
}

/// Decodes blocks of one file, mapping its dictionary onto the reader's interner.
#[derive(Debug, Default)]
pub struct Decoder {
    /// File string index -> reader symbol (index 0 is "absent").
    strings: Vec<Sym>,
    series_count: u32,
}

/// What was wrong with a block: the item's offset in the block and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    pub offset: usize,
    pub message: String,
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "byte {} of the block: {}", self.offset, self.message)
    }
}

impl Decoder {
    pub fn new() -> Self {
        Self { strings: vec![Sym::NONE], series_count: 0 }
    }

    /// Decodes one block's payload (without its length), calling `each` for every span,
    /// series definition and sample in order. Series definitions are numbered from 0 in the
    /// order they appear in the file.
    pub fn decode_block(
        &mut self,
        payload: &[u8],
        interner: &mut Interner,
        each: impl FnMut(Item),
    ) -> Result<(), DecodeError> {
        let mut batch = Batch::default();
        self.decode_some(payload, &mut 0, interner, &mut batch, usize::MAX)?;
        batch.items.truncate(batch.len);
        batch.items.into_iter().for_each(each);
        Ok(())
    }

    /// Decodes from byte `at` of a block's payload until `limit` items (spans, series
    /// definitions, samples, log events) are in `batch` (in place of what it held) or the
    /// payload ends, and moves `at` past them: a consumer that owns the interner (the engine)
    /// takes a block a few items at a time, which stay in cache between decoding and use.
    pub fn decode_some(
        &mut self,
        payload: &[u8],
        at: &mut usize,
        interner: &mut Interner,
        batch: &mut Batch,
        limit: usize,
    ) -> Result<(), DecodeError> {
        let mut cursor = Cursor { bytes: payload, at: *at };
        batch.len = 0;
        while cursor.at < payload.len() && batch.len < limit {
            let item_start = cursor.at;
            let fail = |message: String| DecodeError { offset: item_start, message };
            let tag = cursor.byte().map_err(fail)?;
            match tag {
                TAG_STRING => {
                    let text = cursor.text().map_err(fail)?;
                    self.strings.push(interner.intern(text));
                }
                TAG_SPAN => {
                    self.span::<16>(&mut cursor, batch.next_span()).map_err(fail)?;
                    batch.len += 1;
                }
                TAG_HOP => {
                    self.span::<4>(&mut cursor, batch.next_span()).map_err(fail)?;
                    batch.len += 1;
                }
                TAG_SERIES => {
                    let name = self.sym(&mut cursor).map_err(fail)?;
                    let kind_index = cursor.byte().map_err(fail)?;
                    let kind = *KINDS
                        .get(kind_index as usize)
                        .ok_or_else(|| fail(format!("unknown metric kind {kind_index}")))?;
                    let count = cursor.varint().map_err(fail)?;
                    if count > 1024 {
                        return Err(fail(format!("series with {count} labels (at most 1024)")));
                    }
                    let mut labels = Vec::with_capacity(count as usize);
                    for _ in 0..count {
                        labels.push((self.sym(&mut cursor).map_err(fail)?, self.sym(&mut cursor).map_err(fail)?));
                    }
                    self.series_count += 1;
                    batch.push(Item::Series(SeriesDef { name, kind, labels }));
                }
                TAG_SAMPLE => {
                    let series = cursor.varint().map_err(fail)?;
                    if series >= u64::from(self.series_count) {
                        return Err(fail(format!("sample of undefined series {series}")));
                    }
                    let time = cursor.i64().map_err(fail)?;
                    if time < 0 {
                        return Err(fail(format!("sample with a negative time ({time})")));
                    }
                    let value = f64::from_bits(cursor.i64().map_err(fail)? as u64);
                    batch.push_sample(SampleRec { series: series as u32, time, value });
                }
                TAG_LOG_EVENT => {
                    let text = cursor.text().map_err(fail)?;
                    let event: crate::log_events::LogEvent =
                        serde_json::from_str(text).map_err(|error| fail(format!("invalid log event: {error}")))?;
                    batch.push(Item::LogEvent(Box::new(event)));
                }
                other => return Err(fail(format!("unknown item tag {other}"))),
            }
        }
        *at = cursor.at;
        Ok(())
    }

    #[inline]
    fn sym(&self, cursor: &mut Cursor<'_>) -> Result<Sym, String> {
        let index = cursor.varint()?;
        self.strings
            .get(index as usize)
            .copied()
            .ok_or_else(|| format!("string {index} used before it was defined ({} so far)", self.strings.len() - 1))
    }

    /// Decodes a span (`SYMBOLS` 16) or a hop (4) over `span`, every field of which it sets (it
    /// may hold the previous batch's span).
    fn span<const SYMBOLS: usize>(&self, cursor: &mut Cursor<'_>, span: &mut SpanRec) -> Result<(), String> {
        let flags = match self.head_in_window::<SYMBOLS>(cursor, span) {
            Some(flags) => flags,
            None => self.head::<SYMBOLS>(cursor, span)?,
        };
        let bit = |index: u32| flags & (1 << index) != 0;
        span.call_id = if bit(3) { Some(cursor.text()?.into()) } else { None };
        span.attempt = if bit(4) { Some(cursor.signed()?) } else { None };
        span.follower_read = bit(5).then(|| bit(6));
        let mut states = [None; 6];
        for (index, state) in states.iter_mut().enumerate() {
            if bit(7 + index as u32) {
                *state = Some(cursor.signed()?);
            }
        }
        [span.carried, span.returned, span.served, span.committed, span.router_state, span.requeues] = states;
        Ok(())
    }

    /// A span's head (flags, ids, times, its `SYMBOLS` symbols; what comes before its call id),
    /// checking every read: the path for the end of a block and for anything
    /// [`Decoder::head_in_window`] leaves. Returns the flags.
    fn head<const SYMBOLS: usize>(&self, cursor: &mut Cursor<'_>, span: &mut SpanRec) -> Result<u64, String> {
        let flags = cursor.varint()?;
        let bit = |index: u32| flags & (1 << index) != 0;
        span.id = if bit(0) { SpanKey::new(cursor.u128()?, cursor.i64()? as u64) } else { SpanKey::default() };
        span.parent_span_id = if bit(1) { cursor.i64()? as u64 } else { 0 };
        span.ok = bit(2);
        span.start = cursor.i64()?;
        span.end = span.start.wrapping_add(cursor.signed()?);
        if span.start < 0 || span.end < 0 {
            return Err(format!("span with a negative time ({}..{})", span.start, span.end));
        }
        let mut syms = [Sym::NONE; SYMBOLS];
        for sym in &mut syms {
            *sym = self.sym(cursor)?;
        }
        set_symbols(span, syms);
        Ok(flags)
    }

    /// [`Decoder::head`] over the next [`WINDOW`] bytes of the block, without a bounds check or
    /// an error path per field: positions are taken modulo the window (so every read is in
    /// it) and checked once, at the end. Anything out of the ordinary (a symbol index longer
    /// than two bytes or not yet defined, a negative time, a head longer than the window)
    /// returns `None` with the cursor where it was, and [`Decoder::head`] decodes the head
    /// again, with its errors. The head is most of a span's fields: this halves decoding.
    #[inline]
    fn head_in_window<const SYMBOLS: usize>(&self, cursor: &mut Cursor<'_>, span: &mut SpanRec) -> Option<u64> {
        let window: &[u8; WINDOW] = cursor.bytes.get(cursor.at..)?.first_chunk()?;
        let mut at = 0;
        let flags = short_varint(window, &mut at)?;
        let bit = |index: u32| flags & (1 << index) != 0;
        span.id = SpanKey::default();
        if bit(0) {
            let trace_id = u128::from_le_bytes(*window.get(at..)?.first_chunk()?);
            let span_id = u64::from_le_bytes(*window.get(at + 16..)?.first_chunk()?);
            span.id = SpanKey::new(trace_id, span_id);
            at += 24;
        }
        span.parent_span_id = 0;
        if bit(1) {
            span.parent_span_id = u64::from_le_bytes(*window.get(at..)?.first_chunk()?);
            at += 8;
        }
        span.ok = bit(2);
        span.start = i64::from_le_bytes(*window.get(at..)?.first_chunk()?);
        at += 8;
        // The duration: up to eight bytes, from one word.
        let word = u64::from_le_bytes(*window.get(at..)?.first_chunk()?);
        let (raw, length) = word_varint(word)?;
        at += length;
        span.end = span.start.wrapping_add((raw >> 1) as i64 ^ -((raw & 1) as i64));
        if span.start < 0 || span.end < 0 {
            return None;
        }
        let mut syms = [Sym::NONE; SYMBOLS];
        for sym in &mut syms {
            let index = short_varint(window, &mut at)?;
            *sym = *self.strings.get(index as usize)?;
        }
        if at > WINDOW {
            return None;
        }
        set_symbols(span, syms);
        cursor.at += at;
        Some(flags)
    }
}

/// Sets a span's symbols from a span item's sixteen, or a hop's four (the others absent).
#[inline(always)]
fn set_symbols<const SYMBOLS: usize>(span: &mut SpanRec, syms: [Sym; SYMBOLS]) {
    match syms[..] {
        [component, service, node, node_role] => span.set_hop_symbols([component, service, node, node_role]),
        _ => {
            const { assert!(SYMBOLS == 16 || SYMBOLS == 4) };
            let mut all = [Sym::NONE; 16];
            all.copy_from_slice(&syms);
            span.set_symbols(all);
        }
    }
}

/// The bytes [`Decoder::head_in_window`] reads a span's head from: more than the longest head
/// it takes (a 2-byte flags varint, 24 bytes of ids, 8 of parent, 8 of start, an 8-byte
/// duration, sixteen 2-byte symbols: 82).
const WINDOW: usize = 128;

/// A varint of one or two bytes at `at` (modulo the window), else `None`.
#[inline(always)]
fn short_varint(window: &[u8; WINDOW], at: &mut usize) -> Option<u64> {
    let first = window[*at % WINDOW];
    if first < 0x80 {
        *at += 1;
        return Some(u64::from(first));
    }
    let second = window[(*at + 1) % WINDOW];
    if second < 0x80 {
        *at += 2;
        return Some(u64::from(first & 0x7f) | (u64::from(second) << 7));
    }
    None
}

/// A varint of up to eight bytes from the little-endian `word` it starts: (value, length),
/// else `None` (longer).
#[inline(always)]
fn word_varint(word: u64) -> Option<(u64, usize)> {
    let stops = !word & 0x8080_8080_8080_8080;
    if stops == 0 {
        return None;
    }
    let length = stops.trailing_zeros() as usize / 8 + 1;
    let kept = if length == 8 { u64::MAX } else { (1u64 << (8 * length)) - 1 };
    let groups = word & kept & 0x7f7f_7f7f_7f7f_7f7f;
    let pairs = (groups & 0x007f_007f_007f_007f) | ((groups & 0x7f00_7f00_7f00_7f00) >> 1);
    let quads = (pairs & 0x0000_3fff_0000_3fff) | ((pairs & 0x3fff_0000_3fff_0000) >> 2);
    let value = (quads & 0x0000_0000_0fff_ffff) | ((quads & 0x0fff_ffff_0000_0000) >> 4);
    Some((value, length))
}

struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    #[inline]
    fn take(&mut self, count: usize) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(count).filter(|end| *end <= self.bytes.len()).ok_or_else(|| {
            format!("truncated: {count} bytes needed at byte {}, {} left", self.at, self.bytes.len() - self.at)
        })?;
        let taken = &self.bytes[self.at..end];
        self.at = end;
        Ok(taken)
    }

    #[inline]
    fn byte(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    #[inline]
    fn i64(&mut self) -> Result<i64, String> {
        Ok(i64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    #[inline]
    fn u128(&mut self) -> Result<u128, String> {
        Ok(u128::from_le_bytes(self.take(16)?.try_into().expect("16 bytes")))
    }

    /// A LEB128 integer. Most are string indexes and flags: one or two bytes, inline.
    #[inline]
    fn varint(&mut self) -> Result<u64, String> {
        match self.bytes.get(self.at..).unwrap_or_default() {
            [first, ..] if *first < 0x80 => {
                self.at += 1;
                Ok(u64::from(*first))
            }
            [first, second, ..] if *second < 0x80 => {
                self.at += 2;
                Ok(u64::from(first & 0x7f) | (u64::from(*second) << 7))
            }
            _ => self.long_varint(),
        }
    }

    /// A varint the inline path did not take (three bytes or more, or cut short): up to eight
    /// bytes at once from one little-endian word (the stop byte found by its clear high bit,
    /// the 7-bit groups packed by shifts), else byte by byte near the end of the block and for
    /// 9- and 10-byte varints.
    #[inline(never)]
    fn long_varint(&mut self) -> Result<u64, String> {
        let rest = self.bytes.get(self.at..).unwrap_or_default();
        if let Some((value, length)) = rest.first_chunk::<8>().and_then(|word| word_varint(u64::from_le_bytes(*word))) {
            self.at += length;
            return Ok(value);
        }
        let mut value: u64 = 0;
        for (index, &byte) in rest.iter().take(10).enumerate() {
            value |= u64::from(byte & 0x7f) << (7 * index);
            if byte & 0x80 == 0 {
                self.at += index + 1;
                return Ok(value);
            }
        }
        Err(if rest.len() < 10 {
            format!("truncated: a varint runs past the end at byte {} ({} bytes left)", self.at, rest.len())
        } else {
            "varint longer than 10 bytes".to_string()
        })
    }

    #[inline]
    fn signed(&mut self) -> Result<i64, String> {
        let raw = self.varint()?;
        Ok((raw >> 1) as i64 ^ -((raw & 1) as i64))
    }

    fn text(&mut self) -> Result<&'a str, String> {
        let length = self.varint()?;
        if length > 1 << 20 {
            return Err(format!("string of {length} bytes (at most 1 MiB)"));
        }
        let bytes = self.take(length as usize)?;
        std::str::from_utf8(bytes).map_err(|error| format!("string not UTF-8: {error}"))
    }
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn put_signed(out: &mut Vec<u8>, value: i64) {
    put_varint(out, ((value << 1) ^ (value >> 63)) as u64);
}
