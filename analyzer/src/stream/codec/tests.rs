use super::{Batch, Cursor, Decoder, Encoder, Item, put_signed, put_varint};
use crate::stream::intern::{Interner, Sym, known};
use crate::stream::record::{SpanKey, SpanRec};
use lagscope_model::MetricKind;

/// Spans of every shape (ids or none, a parent or none, each optional field present or
/// absent, symbol indexes of one, two and three bytes, durations of one to ten bytes, a
/// negative duration) read back as written, block after block: the window path for most
/// heads, the checked path for those it leaves (long indexes and durations, the last
/// spans of a block).
#[test]
fn spans_read_back_whatever_their_shape_and_place_in_the_block() {
    let mut interner = Interner::default();
    // Enough strings that the later ones need three-byte indexes.
    let names: Vec<Sym> = (0..20_000).map(|index| interner.intern(&format!("name-{index}"))).collect();
    let mut random = crate::stream::xorshift(0x2545_f491_4f6c_dd1d);
    let mut next = move || random(u64::MAX);
    let mut spans = Vec::new();
    for index in 0..6_000_u64 {
        let shape = next();
        let bit = |n: u32| shape & (1 << n) != 0;
        let mut symbols = [Sym::NONE; 16];
        for symbol in &mut symbols {
            let pick = next() as usize;
            *symbol = match pick % 4 {
                0 => Sym::NONE,
                1 => names[pick % 100],
                2 => names[pick % 10_000],
                _ => names[pick % names.len()],
            };
        }
        let start = (next() >> 2) as i64;
        let duration = match index % 5 {
            0 => (next() % 100) as i64,
            1 => (next() % 5_000_000) as i64,
            2 => (next() >> 10) as i64 % (start / 2 + 1),
            3 => -((next() % 1_000) as i64).min(start),
            _ => (next() >> 3) as i64 % (i64::MAX - start),
        };
        // attempt, carried, returned, served, committed, router state, requeues: present
        // or not by bits 4 and 7-12, of every magnitude and sign.
        let mut optional = [None; 7];
        for (slot, shape_bit) in optional.iter_mut().zip([4, 7, 8, 9, 10, 11, 12]) {
            if bit(shape_bit) {
                let shift = next() % 64;
                *slot = Some(next() as i64 >> shift);
            }
        }
        let id = if bit(0) {
            let trace_id = u128::from(next()) << 64 | 1;
            SpanKey::new(trace_id, next() | 1)
        } else {
            SpanKey::default()
        };
        let call_id = bit(3).then(|| format!("call-{}", next() % 1_000_000).into());
        let [attempt, carried, returned, served, committed, router_state, requeues] = optional;
        let mut span = SpanRec {
            id,
            start,
            end: start + duration,
            ok: bit(2),
            call_id,
            attempt,
            follower_read: bit(5).then(|| bit(6)),
            carried,
            returned,
            served,
            committed,
            router_state,
            requeues,
            ..SpanRec::default()
        };
        if span.id.is_some() && bit(1) {
            span.parent_span_id = next() | 1;
        }
        // Half of them client attempts (a client component and a client id); the others
        // with ids and a parent are written as hops (roots whole: they join by call id).
        if bit(13) {
            symbols[0] = known::CLIENT;
            symbols[5] = names[next() as usize % 100];
        }
        span.set_symbols(symbols);
        spans.push(span);
    }
    let mut encoder = Encoder::default();
    let mut blocks = Vec::new();
    for (index, span) in spans.iter().enumerate() {
        encoder.span(span, &interner);
        // Samples (and the series they define) between the spans.
        if index % 7 == 3 {
            let labels = [("node.id", "n1")];
            encoder.sample("lagscope.committed_state", MetricKind::Gauge, &labels, index as i64, 1.0, &mut interner);
        }
        blocks.extend(encoder.take_block(false));
    }
    blocks.extend(encoder.take_block(true));
    assert!(blocks.len() > 1, "spans across several blocks");
    let mut reader = Interner::default();
    let mut decoder = Decoder::new();
    let mut read = Vec::new();
    for block in &blocks {
        decoder
            .decode_block(&block[4..], &mut reader, |item| {
                if let Item::Span(span) = item {
                    read.push(span);
                }
            })
            .expect("decodes");
    }
    assert_eq!(read.len(), spans.len());
    // The same blocks a few items at a time into one batch, each span decoded over what
    // the batch held in its place (a span of another shape, a sample, a series definition):
    // the same spans.
    let (mut again_reader, mut again_decoder) = (Interner::default(), Decoder::new());
    let (mut batch, mut again) = (Batch::default(), Vec::new());
    let mut limits = (1..=7).cycle();
    for block in &blocks {
        let (payload, mut at) = (&block[4..], 0);
        while at < payload.len() {
            let limit = limits.next().unwrap_or(1);
            again_decoder.decode_some(payload, &mut at, &mut again_reader, &mut batch, limit).expect("decodes");
            again.extend(batch.items().iter().filter_map(|item| match item {
                Item::Span(span) => Some(span.clone()),
                _ => None,
            }));
        }
    }
    assert!(again == read, "spans decoded over others differ from spans decoded fresh");
    let mut hops = 0;
    for (index, (written, read)) in spans.iter().zip(&read).enumerate() {
        let mut expected = written.clone();
        expected.set_symbols(written.symbols().map(|sym| match interner.get(sym) {
            Some(text) => reader.intern(text),
            None => Sym::NONE,
        }));
        if written.is_trace_hop() {
            // A hop: what the engine reads of it, the rest absent.
            hops += 1;
            expected = SpanRec {
                id: expected.id,
                parent_span_id: expected.parent_span_id,
                start: expected.start,
                end: expected.end,
                ok: expected.ok,
                component: expected.component,
                service: expected.service,
                node: expected.node,
                node_role: expected.node_role,
                attempt: expected.attempt,
                carried: expected.carried,
                returned: expected.returned,
                served: expected.served,
                committed: expected.committed,
                router_state: expected.router_state,
                requeues: expected.requeues,
                ..SpanRec::default()
            };
        }
        assert_eq!(read, &expected, "span {index}");
    }
    assert!((500..1_000).contains(&hops), "{hops} of the 6 000 spans written as hops");
}

/// Every length of varint, the boundaries between lengths, and values with every group
/// set, read back at every offset (the word-at-a-time path and the byte-by-byte one near
/// the end), then refused when cut short or longer than 10 bytes.
#[test]
fn varints_read_back_whatever_their_length_and_place() {
    let mut values = vec![0, 1, 127, 128, 255, 300, 16_383, 16_384, u64::MAX, u64::MAX - 1, i64::MAX as u64];
    for bits in 1..64 {
        values.extend([(1u64 << bits) - 1, 1u64 << bits, (1u64 << bits) + 1, 0x5555_5555_5555_5555 >> (64 - bits)]);
    }
    for lead in 0..3 {
        let mut bytes = vec![0x05; lead];
        for value in &values {
            put_varint(&mut bytes, *value);
        }
        for value in &values {
            put_signed(&mut bytes, *value as i64);
        }
        let mut cursor = Cursor { bytes: &bytes, at: lead };
        for value in &values {
            assert_eq!(cursor.varint(), Ok(*value), "lead {lead}");
        }
        for value in &values {
            assert_eq!(cursor.signed(), Ok(*value as i64), "lead {lead}");
        }
        assert_eq!(cursor.at, bytes.len());
    }
    let mut long = Vec::new();
    put_varint(&mut long, u64::MAX);
    for cut in 1..long.len() {
        let error = Cursor { bytes: &long[..cut], at: 0 }.varint().expect_err("cut short");
        assert!(error.contains("truncated"), "{error}");
    }
    let eleven = [0xff; 11];
    assert_eq!(Cursor { bytes: &eleven, at: 0 }.varint(), Err("varint longer than 10 bytes".to_string()));
}
