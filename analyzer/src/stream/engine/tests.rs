use super::*;

/// Two open calls whose ids share a hash (forced here: the index entry of one id is given
/// to the other's call) each keep their own attempts.
#[test]
fn calls_whose_ids_share_a_hash_keep_their_own_attempts() {
    let config = AnalyzerConfig::default();
    let mut engine = Engine::new(&config, |_| true);
    let client = engine.interner.intern("c1");
    let namespace = engine.interner.intern("ns1");
    let attempt = |call_id: &str, attempt: i64, start: i64| SpanRec {
        id: SpanKey::new(u128::from(start as u64) + 1, 1),
        start,
        end: start + 1_000_000,
        component: known::CLIENT,
        ok: attempt == 2,
        client,
        namespace,
        call_id: Some(call_id.into()),
        attempt: Some(attempt),
        ..SpanRec::default()
    };
    engine.push_span(&attempt("a", 1, 0));
    let a = engine.find_open(client, namespace, "a", 0).expect("call a is open");
    engine.open_index.insert(call_key(client, namespace, "b"), a);
    engine.push_span(&attempt("b", 1, 2_000_000));
    assert_eq!(engine.open_collisions.len(), 1);
    engine.push_span(&attempt("b", 2, 4_000_000));
    engine.push_span(&attempt("a", 2, 6_000_000));
    let b = engine.find_open(client, namespace, "b", 4_000_000).expect("call b is open");
    assert_ne!(a, b);
    for (call, id) in [(a, "a"), (b, "b")] {
        let open = engine.current(call).expect("open");
        assert_eq!(engine.call_ids[call.slot()].as_deref(), Some(id));
        assert_eq!(open.held.len(), 2, "call {id}");
    }
    let (_, stats) = engine.finish();
    assert_eq!(stats.calls, 2);
}

/// An attempt of a call id that starts more than a horizon after the open call of that id
/// began is another call (a client restarted under its client id counts its calls again),
/// even when it arrives before the engine has processed the first; the open index then
/// finds the later call for the later call's attempts.
#[test]
fn a_call_id_again_after_a_horizon_is_another_call() {
    let config = AnalyzerConfig::default();
    let horizon = config.stream.horizon();
    let mut engine = Engine::new(&config, |_| true);
    let client = engine.interner.intern("c1");
    let namespace = engine.interner.intern("ns1");
    let attempt = |attempt: i64, start: i64| SpanRec {
        id: SpanKey::new(u128::from(start as u64) + 1, 1),
        start,
        end: start + 1_000_000,
        component: known::CLIENT,
        client,
        namespace,
        call_id: Some("1".into()),
        attempt: Some(attempt),
        ..SpanRec::default()
    };
    engine.push_span(&attempt(0, 0));
    let first = engine.find_open(client, namespace, "1", 0).expect("the first call is open");
    let later = horizon + 1;
    assert_eq!(engine.find_open(client, namespace, "1", later), None);
    // Checked before the push processes the first call: its attempt opens a call of its own.
    engine.push_attempt(&attempt(0, later));
    let second = engine.find_open(client, namespace, "1", later).expect("the later call is open");
    assert_ne!(first, second);
    engine.push_attempt(&attempt(1, later + 1_000_000));
    assert_eq!(engine.current(second).expect("open").held.len(), 2);
    assert_eq!(engine.current(first).expect("open").held.len(), 1);
    let (_, stats) = engine.finish();
    assert_eq!(stats.calls, 2);
}

/// Router/server spans whose client attempt never comes are dropped a horizon after they
/// ended and counted, and their traces are forgotten: the table of waiting traces stays
/// bounded however long such spans keep coming.
#[test]
fn hops_that_never_join_are_dropped_counted_and_their_traces_forgotten() {
    let config = AnalyzerConfig::default();
    let mut engine = Engine::new(&config, |_| true);
    let mut most = 0;
    for second in 0..2_000_i64 {
        let start = second * 1_000_000_000;
        engine.push_span(&SpanRec {
            id: SpanKey::new(second as u128 + 1, 7),
            parent_span_id: 3,
            start,
            end: start + 1_000_000,
            component: known::SERVER,
            ..SpanRec::default()
        });
        most = most.max(engine.traces.places.len());
    }
    // One a second: a horizon's worth (90) waiting, and at most a minute's dropped ones
    // whose traces the next pruning sweeps out.
    assert!((90..=160).contains(&most), "{most} traces waiting at most");
    let (_, stats) = engine.finish();
    assert_eq!(stats.unjoined_hops, 2_000);
}

/// A call whose attempt ended less than the lateness ago when its horizon passed (a retry
/// begun near the horizon's end) waits for that attempt's hops, which may still come, and is
/// processed once the lateness has passed its end; but not for an attempt that claims to end
/// far in the future, which the data's time may never pass by the lateness.
#[test]
fn a_call_waits_for_the_hops_of_an_attempt_that_ended_late_but_not_forever() {
    const SECOND: i64 = 1_000_000_000;
    let config = AnalyzerConfig::default();
    for far in [false, true] {
        let mut engine = Engine::new(&config, |_| true);
        let client = engine.interner.intern("c1");
        let namespace = engine.interner.intern("ns1");
        let attempt = |call_id: &str, attempt: i64, start: i64, end: i64| SpanRec {
            id: SpanKey::new(u128::from(start as u64) + 1, 1),
            start,
            end,
            component: known::CLIENT,
            client,
            namespace,
            call_id: Some(call_id.into()),
            attempt: Some(attempt),
            ..SpanRec::default()
        };
        engine.push_span(&attempt("r", 0, 0, SECOND / 1000));
        let end = if far { i64::MAX - 5 } else { 91 * SECOND };
        let retry = attempt("r", 1, 85 * SECOND, end);
        engine.push_span(&retry);
        if far {
            assert_eq!(engine.stats.calls, 1, "a call does not wait for an end far in the future");
            continue;
        }
        assert_eq!(engine.stats.calls, 0, "the call waits for its retry's hops");
        // The retry's server span, exported after it.
        engine.push_span(&SpanRec {
            id: SpanKey::new(retry.id.trace_id(), 2),
            parent_span_id: 1,
            start: 85 * SECOND + 1,
            end: 91 * SECOND + 2,
            component: known::SERVER,
            ..SpanRec::default()
        });
        engine.push_span(&attempt("w", 0, 102 * SECOND, 102 * SECOND + 1));
        assert_eq!(engine.stats.calls, 1, "processed once the lateness passed the retry's end");
        let (_, stats) = engine.finish();
        assert_eq!((stats.calls, stats.unjoined_hops), (2, 0));
    }
}
