//! The streaming engine's own promises: spans arriving out of order within the lateness still
//! join, what arrives too late is counted rather than silently lost, and what it holds stays
//! bounded by the horizon however long the history.

use lagscope_analyzer::AnalyzerConfig;
use lagscope_analyzer::stream::{Engine, Interner, SpanKey, SpanRec, known};
use lagscope_model::{Anomaly, AnomalyKind};

const SECOND: i64 = 1_000_000_000;

/// A client attempt of `call` (one attempt, its own trace) and the server span under it.
fn call(interner: &mut Interner, index: u64, start: i64, op: &str, served: i64, returned: i64) -> (SpanRec, SpanRec) {
    let trace_id = u128::from(index) + 1;
    let client = SpanRec {
        id: SpanKey::new(trace_id, 1),
        start,
        end: start + SECOND / 100,
        component: known::CLIENT,
        ok: true,
        cluster: interner.intern("prod"),
        system: interner.intern("hdfs-rbf"),
        node: interner.intern("client-host"),
        client: interner.intern("c1"),
        call_id: Some(format!("call-{index}").into()),
        attempt: Some(1),
        namespace: interner.intern("ns1"),
        op: interner.intern(op),
        outcome: known::OK,
        returned: Some(returned),
        ..SpanRec::default()
    };
    let server = SpanRec {
        id: SpanKey::new(trace_id, 2),
        parent_span_id: 1,
        start: start + SECOND / 1000,
        end: start + SECOND / 200,
        component: known::SERVER,
        ok: true,
        cluster: client.cluster,
        node: interner.intern(if op == "read" { "observer-1" } else { "active-1" }),
        node_role: interner.intern(if op == "read" { "observer" } else { "active" }),
        namespace: client.namespace,
        served: Some(served),
        returned: Some(returned),
        ..SpanRec::default()
    };
    (client, server)
}

fn stale_reads(anomalies: &[Anomaly]) -> usize {
    anomalies.iter().filter(|anomaly| anomaly.kind == AnomalyKind::StaleRead).count()
}

/// A write, then a read of the same client served below it on an observer: everything but
/// the read's server span, which the caller delivers.
fn stale_read_awaiting_its_server(config: &AnalyzerConfig) -> (Engine<'_>, SpanRec) {
    let mut engine = Engine::new(config, |_| true);
    let (write, write_server) = call(&mut engine.interner, 0, 0, "write", 100, 100);
    let (read, read_server) = call(&mut engine.interner, 1, SECOND, "read", 90, 100);
    engine.push_span(&write_server);
    engine.push_span(&write);
    engine.push_span(&read);
    (engine, read_server)
}

#[test]
fn a_server_span_arriving_after_its_client_span_within_the_lateness_still_joins() {
    let config = AnalyzerConfig::default();
    let (mut engine, read_server) = stale_read_awaiting_its_server(&config);
    // Five seconds of other traffic pass before the read's server span is exported.
    engine.push_span(&SpanRec { end: 6 * SECOND, start: 6 * SECOND, ..SpanRec::default() });
    engine.push_span(&read_server);
    let (anomalies, stats) = engine.finish();
    assert_eq!(stale_reads(&anomalies), 1, "{anomalies:#?}");
    assert_eq!(anomalies[0].node_id.as_deref(), Some("observer-1"));
    assert_eq!(stats.unjoined_hops, 0);
}

#[test]
fn a_server_span_later_than_the_horizon_is_counted_not_joined() {
    let config = AnalyzerConfig::default();
    let (mut engine, read_server) = stale_read_awaiting_its_server(&config);
    // Traffic moves the data 200 s on (past lateness and horizon) before the server span comes.
    for step in 1..=200 {
        engine.push_span(&SpanRec { start: step * SECOND, end: step * SECOND, ..SpanRec::default() });
    }
    engine.push_span(&read_server);
    engine.push_span(&SpanRec { start: 400 * SECOND, end: 400 * SECOND, ..SpanRec::default() });
    let (anomalies, stats) = engine.finish();
    // Without its server span the read reports no served state: nothing to judge.
    assert_eq!(stale_reads(&anomalies), 0, "{anomalies:#?}");
    assert_eq!(stats.unjoined_hops, 1);
}

#[test]
fn what_the_engine_holds_is_bounded_by_the_horizon_not_the_history() {
    let config = AnalyzerConfig::default();
    let mut peaks = Vec::new();
    for seconds in [1_000, 10_000] {
        let mut engine = Engine::new(&config, |_| true);
        for index in 0..seconds {
            let start = index as i64 * SECOND;
            let op = if index % 2 == 0 { "write" } else { "read" };
            let (client, server) = call(&mut engine.interner, index, start, op, 100 + index as i64, 100 + index as i64);
            engine.push_span(&server);
            engine.push_span(&client);
        }
        let (anomalies, stats) = engine.finish();
        assert!(anomalies.is_empty(), "{anomalies:#?}");
        assert_eq!(stats.calls, seconds);
        peaks.push((stats.peak_open_calls, stats.peak_pending_spans));
    }
    // One call a second and a 90 s horizon: about 90 open calls, whether 1 000 or 10 000 s.
    assert!(peaks[0].0 <= 100 && peaks[1].0 <= 100, "{peaks:?}");
    assert_eq!(peaks[0], peaks[1]);
}

#[test]
fn clients_idle_longer_than_the_retention_are_finished_and_forgotten() {
    let config = AnalyzerConfig::default();
    let mut engine = Engine::new(&config, |_| true);
    // 200 short-lived clients, one after another, 100 s apart: ten calls each.
    let mut index = 0;
    for client in 0..200_i64 {
        let name = engine.interner.intern(&format!("short-lived-{client}"));
        for call_number in 0..10_i64 {
            let start = client * 100 * SECOND + call_number * SECOND;
            let op = if call_number % 2 == 0 { "write" } else { "read" };
            let state = 1_000 + index as i64;
            let (mut attempt, mut server) = call(&mut engine.interner, index, start, op, state, state);
            attempt.client = name;
            server.client = name;
            engine.push_span(&server);
            engine.push_span(&attempt);
            index += 1;
        }
    }
    let (anomalies, stats) = engine.finish();
    assert!(anomalies.is_empty(), "{anomalies:#?}");
    assert_eq!(stats.clients, 200);
    // A horizon plus the retention (690 s) of 100 s lives: a handful at a time, not 200.
    assert!(stats.peak_clients <= 10, "{stats:?}");
    assert!(stats.evicted_clients >= 190, "{stats:?}");
}

/// Retries join their call however many calls opened and closed in between (the open-call
/// index leaves closed calls' entries behind and sweeps them out thousands at a time), and a
/// call id used again after its call was processed starts a call of its own.
#[test]
fn retries_find_their_call_across_thousands_of_closed_calls() {
    let config = AnalyzerConfig::default();
    let mut engine = Engine::new(&config, |_| true);
    let calls = 20_000_u64;
    // Each call: a refused first attempt, then a retry exported 5 s later (after ~500 more
    // calls have opened), both under the same call id.
    let mut retries = std::collections::VecDeque::new();
    for index in 0..calls {
        let start = index as i64 * SECOND / 100;
        let (mut first, _) = call(&mut engine.interner, index, start, "write", 0, 0);
        first.ok = false;
        first.outcome = engine.interner.intern("error");
        first.returned = None;
        let mut retry = first.clone();
        retry.id = SpanKey::new(u128::from(index) + 1, 3);
        retry.attempt = Some(2);
        retry.ok = true;
        retry.outcome = known::OK;
        retry.start = first.end + SECOND / 1000;
        retry.end = retry.start + SECOND / 100;
        engine.push_span(&first);
        retries.push_back((start + 5 * SECOND, retry));
        while retries.front().is_some_and(|(due, _)| *due <= start) {
            let (_, retry) = retries.pop_front().expect("a retry is due");
            engine.push_span(&retry);
        }
    }
    for (_, retry) in retries {
        engine.push_span(&retry);
    }
    // Call 0's id once more, long after call 0 was processed: a call of its own.
    let (mut again, _) = call(&mut engine.interner, 0, (calls as i64 / 100 + 200) * SECOND, "write", 0, 0);
    again.id = SpanKey::new(u128::from(calls) + 1, 1);
    engine.push_span(&again);
    let (_, stats) = engine.finish();
    assert_eq!(stats.calls, calls + 1, "{stats:?}");
    assert_eq!(stats.late_attempts, 0, "{stats:?}");
    assert_eq!(stats.spans, 2 * calls + 1);
}

/// Deterministic pseudo-random bytes (xorshift), so a failure reproduces.
fn noise(seed: &mut u64, length: usize) -> Vec<u8> {
    (0..length)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            (*seed >> 24) as u8
        })
        .collect()
}

#[test]
fn damaged_lscap_blocks_are_refused_or_read_never_a_panic() {
    use lagscope_analyzer::stream::codec::{Decoder, Encoder, Item};
    // A valid block to damage.
    let mut writer = Interner::default();
    let mut encoder = Encoder::default();
    for index in 0..50 {
        let (client, server) = call(&mut writer, index, index as i64 * SECOND, "read", 5, 5);
        encoder.span(&server, &writer);
        encoder.span(&client, &writer);
    }
    let labels = [("lagscope.cluster", "prod"), ("lagscope.node.id", "nn1")];
    encoder.sample("lagscope.server.applied_state", lagscope_model::MetricKind::Gauge, &labels, 0, 1.0, &mut writer);
    let block = encoder.take_block(true).expect("a block");
    let payload = &block[4..];
    let config = AnalyzerConfig::default();
    let mut seed = 0x9e37_79b9_7f4a_7c15;
    let (mut refused, mut read) = (0, 0);
    for round in 0..6_000 {
        let damaged = if round % 2 == 0 {
            // Flip a few bytes of the valid block.
            let mut bytes = payload.to_vec();
            for position in noise(&mut seed, 4).chunks(2) {
                let at = (usize::from(position[0]) * 256 + usize::from(position[1])) % bytes.len();
                bytes[at] ^= noise(&mut seed, 1)[0] | 1;
            }
            bytes
        } else {
            // Cut it short, or pure noise.
            let length = usize::from(noise(&mut seed, 1)[0]) * 4;
            if round % 4 == 1 { payload[..length.min(payload.len())].to_vec() } else { noise(&mut seed, length) }
        };
        let mut engine = Engine::new(&config, |_| true);
        let mut items = Vec::new();
        match Decoder::new().decode_block(&damaged, &mut engine.interner, |item| items.push(item)) {
            Ok(()) => read += 1,
            Err(error) => {
                assert!(error.offset <= damaged.len(), "{error}");
                refused += 1;
            }
        }
        let mut series = Vec::new();
        for item in items {
            match item {
                Item::Span(span) => engine.push_span(&span),
                Item::LogEvent(event) => engine.push_log_event(&event),
                Item::Series(definition) => series.push(engine.define_series(&definition)),
                Item::Sample(mut sample) => {
                    if let Some(id) = series.get(sample.series as usize) {
                        sample.series = *id;
                        engine.push_sample(sample);
                    }
                }
            }
        }
        engine.finish();
    }
    assert!(refused > 100 && read > 10, "both paths exercised: {refused} refused, {read} read");
}
