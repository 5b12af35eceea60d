//! Telemetry is untrusted: every value a sender can put in a span or a sample that the OTLP
//! conversion accepts (any 64-bit state, attempt or count; any time from 0 to `i64::MAX`, an
//! end before its start; ids missing, repeated or pointing at themselves; strings empty, long
//! or foreign; metric values that are NaN or infinite) must go through every analysis path
//! without a panic: the batch analysis, the streaming engine, the lscap codec, the live
//! analyzer's held timelines and their settling, the lag rows and their polars aggregates.
//! Tests build with overflow checks, so an arithmetic overflow on such a value is a panic
//! here (in a release build it would be a wrong number).
//!
//! Each run takes a simulator scenario's telemetry and changes a few percent of its records
//! at random (a seeded generator: a failure names its seed and the changes, and reruns
//! alike). Runs whose changes leave the times, ids and parents alone ([`VALUE_CHANGES`];
//! samples changed any way but their times) must also keep the streamed analysis equal to the
//! batch analysis, field for field, as on clean telemetry, and the live analyzer's passes that
//! settle (let go of what no later call can change) finding what passes holding every span
//! find, as a store keeps it.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

mod support;

use lagscope_analyzer::{AnalyzerConfig, analyze, lag_rows};
use lagscope_model::{Anomaly, AnomalyKind, Component, LagQuery, Op, Outcome, PointValue, Sample, Span, SpanEvent};
use lagscope_sim::{SimConfig, scenarios};
use support::records::{Record, batch, batch_input, live_passes, records_of, streamed, streamed_through_codec};

/// The simulator's seeded generator (the same on every machine), with the draws these tests
/// make of it.
struct Rng(lagscope_sim::Rng);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(lagscope_sim::Rng::new(seed))
    }

    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    fn below(&mut self, bound: usize) -> usize {
        (self.next() % bound as u64) as usize
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// A 64-bit value a sender may send: the extremes, around zero, or anything.
    fn int(&mut self) -> i64 {
        match self.below(8) {
            0 => i64::MAX,
            1 => i64::MIN,
            2 => 0,
            3 => -1,
            4 => i64::MAX - self.below(3) as i64,
            5 => i64::MIN + self.below(3) as i64,
            6 => self.below(2_000_001) as i64 - 1_000_000,
            _ => self.next() as i64,
        }
    }

    /// A time the conversion accepts (0 to `i64::MAX`), often near `near`.
    fn time(&mut self, near: i64) -> i64 {
        match self.below(6) {
            0 => 0,
            1 => i64::MAX,
            2 => i64::MAX - self.below(1_000) as i64,
            3 => near.saturating_sub(self.below(200_000_000_000) as i64).max(0),
            4 => near.saturating_add(self.below(200_000_000_000) as i64),
            _ => (self.next() >> 1) as i64,
        }
    }

    fn text(&mut self) -> String {
        match self.below(6) {
            0 => String::new(),
            1 => "x".repeat(20_000),
            2 => "ns1\u{0}\u{202e}<script>\"'\\".to_string(),
            3 => "名前空間/シャード".to_string(),
            4 => " ".to_string(),
            _ => format!("hostile-{}", self.below(4)),
        }
    }

    fn float(&mut self) -> f64 {
        *self.pick(&[
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::MAX,
            f64::MIN,
            -1.0,
            0.0,
            -0.0,
            f64::MIN_POSITIVE,
            9.3e18,
            -9.3e18,
            1e300,
        ])
    }

    /// None, one of `known`, or `other` of a hostile text, each as likely.
    fn variant<T: Clone>(&mut self, known: &[T], other: impl FnOnce(String) -> T) -> Option<T> {
        match self.below(known.len() + 2) {
            0 => None,
            index if index <= known.len() => Some(known[index - 1].clone()),
            _ => Some(other(self.text())),
        }
    }

    fn hex(&mut self, bytes: usize) -> String {
        (0..bytes).map(|_| format!("{:02x}", self.next() as u8)).collect()
    }
}

/// Changes that leave a span's times, identity and place in its trace alone (its component
/// and call id may change): whatever their values, the streamed analysis must equal the batch
/// one.
const VALUE_CHANGES: &[usize] = &[0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18];

/// Every change, those to times (19-21) and other spans' ids and parents (8) too: the
/// streaming engine's join then depends on when spans arrive (a span claiming the ids of
/// another, or a parent in another trace, joins what it reaches before the lateness passes;
/// the batch analysis sees every span at once), so only the absence of panics is asked.
const ALL_CHANGES: &[usize] = &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21];

/// One change to a span, of one of the `kinds` of change: a field set to a hostile value.
fn change_span(rng: &mut Rng, span: &mut Span, others: &[Record], kinds: &[usize]) -> String {
    let with_times = kinds.contains(&19);
    let other = || others.iter().filter_map(Record::span);
    match *rng.pick(kinds) {
        0 => {
            let value = Some(rng.int());
            let state = &mut span.call.state;
            let field = *rng.pick(&["carried", "returned", "served", "committed", "router"]);
            match field {
                "carried" => state.carried = value,
                "returned" => state.returned = value,
                "served" => state.served = value,
                "committed" => state.committed = value,
                _ => state.router = value,
            }
            format!("state.{field} = {value:?}")
        }
        1 => {
            span.call.attempt = if rng.chance(20) { None } else { Some(rng.int()) };
            format!("attempt = {:?}", span.call.attempt)
        }
        2 => {
            let value = Some(rng.int());
            match rng.below(3) {
                0 => span.call.requeues = value,
                1 => span.call.retry_delay_ms = value,
                _ => span.call.bytes = value,
            }
            format!("requeues/retry_delay_ms/bytes = {value:?}")
        }
        3 => {
            span.call.call_id = match rng.below(3) {
                0 => None,
                1 => Some(String::new()),
                _ => other().nth(rng.below(others.len().max(1))).and_then(|span| span.call.call_id.clone()),
            };
            format!("call_id = {:?}", span.call.call_id)
        }
        4 => {
            span.call.client_id = match rng.below(3) {
                0 => None,
                1 => Some(rng.text()),
                _ => other().nth(rng.below(others.len().max(1))).and_then(|span| span.call.client_id.clone()),
            };
            format!("client_id changed ({} bytes)", span.call.client_id.as_ref().map_or(0, String::len))
        }
        5 => {
            span.call.namespace = if rng.chance(50) { None } else { Some(rng.text()) };
            "namespace changed".to_string()
        }
        6 => {
            span.trace_id = None;
            span.span_id = None;
            "trace context dropped".to_string()
        }
        7 => {
            span.parent_span_id = span.span_id.clone();
            "its own parent".to_string()
        }
        8 => {
            // Another span's ids: a second span of the same identity, or a parent cycle.
            if let Some(twin) = other().nth(rng.below(others.len().max(1))) {
                if rng.chance(50) {
                    span.trace_id = twin.trace_id.clone();
                    span.span_id = twin.span_id.clone();
                    format!("the ids of another span ({:?}/{:?})", twin.trace_id, twin.span_id)
                } else {
                    span.trace_id = twin.trace_id.clone();
                    span.parent_span_id = twin.span_id.clone();
                    format!("moved under another span ({:?}/{:?})", twin.trace_id, twin.span_id)
                }
            } else {
                "no other span".to_string()
            }
        }
        9 => {
            span.trace_id = Some(rng.hex(16));
            span.parent_span_id = Some(rng.hex(8));
            "trace and parent made up".to_string()
        }
        10 => {
            span.call.op = rng.variant(&[Op::Read, Op::Write, Op::Msync, Op::Probe], Op::Other);
            format!("op = {:?}", span.call.op.as_ref().map(Op::as_str))
        }
        11 => {
            span.call.outcome =
                rng.variant(&[Outcome::Ok, Outcome::Rejected, Outcome::Error, Outcome::Timeout], Outcome::Other);
            span.status_code = rng.below(4) as i32 - 1;
            format!("outcome = {:?}, status {}", span.call.outcome.as_ref().map(Outcome::as_str), span.status_code)
        }
        12 => {
            span.resource.component =
                rng.variant(&[Component::Client, Component::Router, Component::Server], Component::Other);
            format!("component = {:?}", span.resource.component.as_ref().map(Component::as_str))
        }
        13 => {
            let text = Some(rng.text());
            match rng.below(5) {
                0 => span.call.target_node = text,
                1 => span.call.target_role = text,
                2 => span.call.node_role = text,
                3 => span.resource.node_id = text,
                _ => span.call.consistency = text,
            }
            "node, role or consistency changed".to_string()
        }
        14 => {
            span.resource.cluster = if rng.chance(50) { None } else { Some(rng.text()) };
            span.resource.system = if rng.chance(50) { None } else { Some(rng.text()) };
            "cluster and system changed".to_string()
        }
        15 => {
            span.call.error_type = Some(
                (*rng.pick(&[
                    "org.apache.hadoop.hdfs.server.federation.router.NoNamenodesAvailableException",
                    "org.apache.hadoop.ozone.om.exceptions.OMLeaderNotReadyException",
                    "org.apache.hadoop.ipc.RetriableException",
                    "org.apache.hadoop.ipc.StandbyException",
                    "",
                ]))
                .to_string(),
            );
            "error type set".to_string()
        }
        16 => {
            span.call.follower_read = if rng.chance(30) { None } else { Some(rng.chance(50)) };
            "follower read flag changed".to_string()
        }
        17 => {
            let time = if with_times { rng.time(span.start_unix_nano) } else { span.start_unix_nano };
            let name = (*rng.pick(&[
                "lagscope.follower_read.disabled",
                "lagscope.failover",
                "lagscope.cache.refresh",
                "exception",
            ]))
            .to_string();
            let mut attributes = lagscope_model::Attributes::default();
            attributes.insert("lagscope.failover.from".to_string(), serde_json::json!(rng.text()));
            attributes.insert("lagscope.failover.to".to_string(), serde_json::json!(rng.int()));
            span.events.push(SpanEvent { time_unix_nano: time, name: name.clone(), attributes });
            format!("event {name} at {time}")
        }
        18 => {
            span.call.rpc_method = if rng.chance(30) { None } else { Some(rng.text()) };
            "rpc method changed".to_string()
        }
        19 => {
            span.end_unix_nano = rng.time(span.end_unix_nano);
            format!("end = {}", span.end_unix_nano)
        }
        20 => {
            span.start_unix_nano = rng.time(span.start_unix_nano);
            format!("start = {}", span.start_unix_nano)
        }
        _ => {
            std::mem::swap(&mut span.start_unix_nano, &mut span.end_unix_nano);
            "start and end swapped".to_string()
        }
    }
}

fn change_sample(rng: &mut Rng, sample: &mut Sample, with_times: bool) -> String {
    match rng.below(if with_times { 4 } else { 3 }) {
        0 => {
            let value = rng.float();
            sample.value = PointValue::Number(value);
            format!("{} = {value}", sample.series.name)
        }
        1 => {
            let mut series = (*sample.series).clone();
            let key =
                (*rng.pick(&["lagscope.cluster", "lagscope.namespace", "lagscope.node.id", "lagscope.node.role"]))
                    .to_string();
            if rng.chance(50) {
                series.labels.remove(&key);
            } else {
                series.labels.insert(key, rng.text());
            }
            sample.series = Arc::new(series);
            format!("{}: a label changed", sample.series.name)
        }
        2 => {
            sample.start_time_unix_nano = if rng.chance(50) { None } else { Some(rng.time(sample.time_unix_nano)) };
            format!("{}: start time changed", sample.series.name)
        }
        _ => {
            sample.time_unix_nano = rng.time(sample.time_unix_nano);
            format!("{} at {}", sample.series.name, sample.time_unix_nano)
        }
    }
}

/// `records` with about `percent` of them changed (by changes of `kinds`) and three sent
/// twice a little later; the changes made, for the failure message.
fn mutate(records: &[Record], seed: u64, percent: u64, kinds: &[usize]) -> (Vec<Record>, Vec<String>) {
    let with_times = kinds.contains(&19);
    let mut rng = Rng::new(seed);
    let mut out = records.to_vec();
    let mut changes = Vec::new();
    for (index, record) in out.iter_mut().enumerate() {
        if !rng.chance(percent) {
            continue;
        }
        let change = match record {
            Record::Span(span) => change_span(&mut rng, span, records, kinds),
            Record::Sample(sample) => change_sample(&mut rng, sample, with_times),
        };
        changes.push(format!("record {index}: {change}"));
    }
    // A few records sent twice, out of their place (telemetry is delivered at least once).
    for _ in 0..3 {
        // Near their place: a copy arriving later than the lateness is judged late, by design.
        let from = rng.below(out.len());
        let to = (from + rng.below(20)).min(out.len());
        let copy = out[from].clone();
        out.insert(to, copy);
        changes.push(format!("record {from} sent again at {to}"));
    }
    (out, changes)
}

/// The fields in which two anomalies differ, as `path: left | right`.
fn differences(left: &Anomaly, right: &Anomaly) -> String {
    fn walk(path: String, left: &serde_json::Value, right: &serde_json::Value, out: &mut Vec<String>) {
        use serde_json::Value;
        match (left, right) {
            (Value::Object(left), Value::Object(right)) => {
                for (key, value) in left {
                    walk(format!("{path}.{key}"), value, right.get(key).unwrap_or(&Value::Null), out);
                }
            }
            (Value::Array(left), Value::Array(right)) if left.len() == right.len() => {
                for (index, (left, right)) in left.iter().zip(right).enumerate() {
                    walk(format!("{path}[{index}]"), left, right, out);
                }
            }
            (Value::String(left_text), Value::String(right_text))
                if left_text.starts_with('{') && right_text.starts_with('{') =>
            {
                match (serde_json::from_str(left_text), serde_json::from_str(right_text)) {
                    (Ok(left), Ok(right)) => walk(path, &left, &right, out),
                    _ => out.push(format!("{path}: {left} | {right}")),
                }
            }
            _ if left != right => out.push(format!("{path}: {left} | {right}")),
            _ => {}
        }
    }
    let mut out = Vec::new();
    let value = |anomaly| serde_json::to_value(anomaly).unwrap_or_default();
    walk(String::new(), &value(left), &value(right), &mut out);
    out.join("; ")
}

thread_local! {
    /// The last panic on this thread: its message and where it was raised.
    static LAST_PANIC: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// `run`'s result, or the message and place of the panic it raised: a panic on a thread it
/// scoped (a capture's decode threads) comes back through it. The default hook reports each
/// panic too.
fn caught<T>(run: impl FnOnce() -> T) -> Result<T, String> {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let message = info
                .payload()
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| info.payload().downcast_ref::<&str>().map(|text| text.to_string()))
                .unwrap_or_default();
            let place = info.location().map(|at| format!(" at {}:{}", at.file(), at.line())).unwrap_or_default();
            LAST_PANIC.with(|last| *last.borrow_mut() = Some(format!("{message}{place}")));
            default(info);
        }));
    });
    catch_unwind(AssertUnwindSafe(run))
        .map_err(|_| LAST_PANIC.with(|last| last.borrow_mut().take()).unwrap_or_default())
}

/// Runs every path over `records`; the paths that panicked, with their messages, and whether
/// the streamed analyses differ from the batch one.
fn every_path(records: &[Record], config: &AnalyzerConfig) -> (Vec<String>, Option<String>) {
    let mut panics = Vec::new();
    let mut guarded = |path: &str, run: &mut dyn FnMut()| {
        if let Err(panic) = caught(run) {
            panics.push(format!("{path} panicked: {panic}"));
        }
    };
    let (mut expected, mut input) = (None, None);
    guarded("the batch analysis", &mut || {
        let analysed = batch_input(records, config);
        expected = Some(analyze(&analysed, config));
        input = Some(analysed);
    });
    let (mut direct, mut through_codec) = (None, None);
    guarded("the streaming engine", &mut || direct = Some(streamed(records, config)));
    guarded("the streaming engine through lscap", &mut || {
        through_codec = Some(streamed_through_codec(records, config))
    });
    // (A pass every 1 000 records, settling 10 s behind the newest span, and the same passes
    // holding every span: what they found must be what a store keeps of it alike.)
    let mut live = None;
    guarded("the live analyzer's passes over held timelines, settling and holding every span", &mut || {
        live = Some(live_found(records, config));
    });
    let live_differs = live.and_then(|(settling, whole)| live_apart(&settling, &whole, 2));
    if let Some(input) = &input {
        guarded("the lag rows and their aggregates", &mut || {
            let rows = lag_rows(input);
            for step_seconds in [None, Some(1), Some(60)] {
                let query = LagQuery {
                    cluster: None,
                    namespace: None,
                    from_unix_nano: i64::MIN,
                    to_unix_nano: i64::MAX,
                    step_seconds,
                };
                // An error is an answer (a 400 or 500 to name); only a panic fails here.
                let _ = lagscope_analytics::aggregate(&rows, &query);
            }
        });
    }
    let differs = match (&expected, &direct, &through_codec) {
        (Some(expected), Some(direct), Some(through_codec)) if expected != direct || expected != through_codec => {
            let only = |of: &[Anomaly], not_in: &[Anomaly]| {
                of.iter()
                    .filter(|anomaly| !not_in.contains(anomaly))
                    .take(2)
                    .map(|anomaly| match not_in.iter().find(|other| other.fingerprint == anomaly.fingerprint) {
                        Some(other) => format!("{}: {}", anomaly.fingerprint, differences(anomaly, other)),
                        None => format!("{anomaly:?}"),
                    })
                    .collect::<Vec<_>>()
            };
            Some(format!(
                "batch {} anomalies, stream {}, through lscap {}; only in batch: {:?}; only in stream: {:?}",
                expected.len(),
                direct.len(),
                through_codec.len(),
                only(expected, direct),
                only(direct, expected),
            ))
        }
        _ => None,
    };
    (panics, differs.into_iter().chain(live_differs).reduce(|stream, live| format!("{stream}\n  {live}")))
}

/// The rounds run per scenario: 0..3, or, for a longer hunt by hand, as many as
/// `LAGSCOPE_HOSTILE_ROUNDS` says from `LAGSCOPE_HOSTILE_FIRST_ROUND` on (a failure's seed is
/// the test's first seed + 10 000 x its scenario's index + its round).
fn rounds() -> std::ops::Range<u64> {
    let number = |name: &str| std::env::var(name).ok().and_then(|value| value.parse().ok());
    let first = number("LAGSCOPE_HOSTILE_FIRST_ROUND").unwrap_or(0);
    first..first + number("LAGSCOPE_HOSTILE_ROUNDS").unwrap_or(3)
}

fn scenario_names() -> Vec<&'static str> {
    let names: Vec<&str> = scenarios().into_iter().map(|info| info.name).filter(|name| *name != "mixed").collect();
    assert!(names.len() >= 15, "the simulator's scenarios: {names:?}");
    names
}

#[test]
fn hostile_values_break_no_analysis_and_keep_stream_and_batch_equal() {
    every_scenario_changed(1_000, 3, VALUE_CHANGES, true);
}

#[test]
fn hostile_times_ids_and_parents_break_no_analysis() {
    // Times anywhere from 0 to i64::MAX, ends before starts, spans with another's ids or
    // parent: the streaming engine then judges what arrives behind a far-future span as late,
    // and joins what it reaches before the lateness passes, so only the absence of panics is
    // asked ([`ALL_CHANGES`]).
    every_scenario_changed(5_000, 2, ALL_CHANGES, false);
}

/// Every scenario, three times, with `percent` of its records changed by changes of `kinds`
/// (seeds from `first_seed` on): no path may panic, and, if `equal`, the streamed analyses must
/// equal the batch one.
fn every_scenario_changed(first_seed: u64, percent: u64, kinds: &[usize], equal: bool) {
    let config = AnalyzerConfig::default();
    let (mut failures, mut runs) = (Vec::new(), 0);
    // Every scenario, or only `LAGSCOPE_HOSTILE_SCENARIO` (a hunt by hand: its failures list
    // every change, to find the one that matters).
    let only = std::env::var("LAGSCOPE_HOSTILE_SCENARIO").ok();
    for (index, name) in scenario_names().iter().enumerate() {
        if only.as_deref().is_some_and(|only| only != *name) {
            continue;
        }
        let records = records_of(&SimConfig::new(name));
        for round in rounds() {
            let seed = first_seed + index as u64 * 10_000 + round;
            let (changed, changes) = mutate(&records, seed, percent, kinds);
            let (panics, differs) = every_path(&changed, &config);
            let differs = differs.filter(|_| equal);
            runs += 1;
            if !panics.is_empty() || differs.is_some() {
                let shown = if only.is_some() { changes.len() } else { 6 };
                failures.push(format!(
                    "{name}, seed {seed} ({} changes, first: {:?}):\n  {}{}",
                    changes.len(),
                    &changes[..changes.len().min(shown)],
                    panics.join("\n  "),
                    differs.map(|text| format!("\n  the analyses differ: {text}")).unwrap_or_default(),
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{} of {runs} runs failed:\n{}", failures.len(), failures.join("\n\n"));
}

#[test]
fn a_storms_peak_counts_the_points_of_a_dip_it_goes_on_through() {
    // A server requeueing 1 000 calls a second for a minute while processing one; at 30 s a
    // second of 50 000 requeues with 1 000 processed: not storm-like on its own (50 per call
    // processed), a dip the storm goes on through, and the storm's peak. Both analyses must
    // say 50 000/s (the streaming engine used to leave the dip's points out of the peak).
    use lagscope_model::conventions::{CLUSTER, METRIC_REQUEUE_CALLS, METRIC_RPC_PROCESSING_OPS, NAMESPACE, NODE_ID};
    use lagscope_model::{MetricKind, SeriesKey, SeriesMeta};
    let series = |name: &str| {
        let labels = [(CLUSTER, "hdfs-prod"), (NAMESPACE, "ns1"), (NODE_ID, "nn-obs1")]
            .into_iter()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect();
        Arc::new(SeriesKey { name: name.to_string(), labels })
    };
    let meta = Arc::new(SeriesMeta { kind: MetricKind::CumulativeCounter, unit: None, description: None });
    let (requeues, processed) = (series(METRIC_REQUEUE_CALLS), series(METRIC_RPC_PROCESSING_OPS));
    let mut records = Vec::new();
    let (mut requeued, mut done) = (0.0, 0.0);
    for second in 0..=60_i64 {
        (requeued, done) =
            if second == 30 { (requeued + 50_000.0, done + 1_000.0) } else { (requeued + 1_000.0, done + 1.0) };
        let time_unix_nano = 1_767_225_600_000_000_000 + second * 1_000_000_000;
        for (series, value) in [(&requeues, requeued), (&processed, done)] {
            records.push(Record::Sample(Sample {
                series: series.clone(),
                meta: meta.clone(),
                time_unix_nano,
                start_time_unix_nano: Some(1_767_225_600_000_000_000),
                value: PointValue::Number(value),
            }));
        }
    }
    let config = AnalyzerConfig::default();
    let expected = batch(&records, &config);
    let peaks = |anomalies: &[Anomaly]| -> Vec<String> {
        anomalies.iter().map(|anomaly| format!("{:?}: {}", anomaly.kind, anomaly.summary)).collect()
    };
    assert_eq!(peaks(&expected).len(), 1, "one storm: {:?}", peaks(&expected));
    assert!(peaks(&expected)[0].contains("(peak 50000/s)"), "{:?}", peaks(&expected));
    assert_eq!(peaks(&streamed(&records, &config)), peaks(&expected));
    assert_eq!(peaks(&streamed_through_codec(&records, &config)), peaks(&expected));
}

/// The golden fixture's requests as the Collector's file exporter writes them with `format:
/// proto`: each protobuf request after its length (4 bytes, big-endian), zstd-compressed on
/// its own when `zstd` is given.
fn length_prefixed(text: &str, zstd: bool) -> Vec<u8> {
    use opentelemetry_proto::tonic::collector::{
        logs::v1::ExportLogsServiceRequest, metrics::v1::ExportMetricsServiceRequest,
        trace::v1::ExportTraceServiceRequest,
    };
    use prost::Message;
    let mut bytes = Vec::new();
    for line in text.lines() {
        let mut request = if line.starts_with(r#"{"resourceSpans""#) {
            serde_json::from_str::<ExportTraceServiceRequest>(line).expect("traces").encode_to_vec()
        } else if line.starts_with(r#"{"resourceMetrics""#) {
            serde_json::from_str::<ExportMetricsServiceRequest>(line).expect("metrics").encode_to_vec()
        } else {
            serde_json::from_str::<ExportLogsServiceRequest>(line).expect("logs").encode_to_vec()
        };
        if zstd {
            request = ::zstd::encode_all(&request[..], 3).expect("zstd");
        }
        bytes.extend_from_slice(&u32::try_from(request.len()).expect("small").to_be_bytes());
        bytes.extend_from_slice(&request);
    }
    bytes
}

/// `bytes` damaged one to four ways: bytes flipped or set to the values parsers trip on, the
/// file cut short, a stretch repeated or removed, bytes inserted.
fn damage(rng: &mut Rng, bytes: &[u8]) -> (Vec<u8>, Vec<String>) {
    let mut out = bytes.to_vec();
    let mut done = Vec::new();
    for _ in 0..1 + rng.below(4) {
        if out.is_empty() {
            break;
        }
        let at = rng.below(out.len());
        match rng.below(6) {
            0 => {
                out[at] ^= 1 << rng.below(8);
                done.push(format!("a bit of byte {at} flipped"));
            }
            1 => {
                let value = *rng.pick(&[0x00_u8, 0xFF, 0x7F, 0x80, b'{', b'"', b'\\', b'\n']);
                out[at] = value;
                done.push(format!("byte {at} set to {value:#04x}"));
            }
            2 => {
                out.truncate(at);
                done.push(format!("cut at byte {at}"));
            }
            3 => {
                let end = (at + 1 + rng.below(64)).min(out.len());
                let stretch = out[at..end].to_vec();
                out.splice(at..at, stretch);
                done.push(format!("bytes {at}..{end} repeated"));
            }
            4 => {
                let end = (at + 1 + rng.below(64)).min(out.len());
                out.drain(at..end);
                done.push(format!("bytes {at}..{end} removed"));
            }
            _ => {
                let inserted: Vec<u8> = (0..1 + rng.below(8)).map(|_| rng.next() as u8).collect();
                done.push(format!("{} bytes inserted at {at}", inserted.len()));
                out.splice(at..at, inserted);
            }
        }
    }
    (out, done)
}

#[test]
fn damaged_captures_are_read_or_refused_by_name_never_a_panic() {
    // The golden fixture in each layout `analyze` reads (OTLP JSON lines, plain and gzip;
    // length-prefixed protobuf, plain and zstd per request; lscap), damaged at random many
    // times over: each damaged file is analysed, or refused with an error that names it; no
    // panic on any thread, and none of the decoders' arithmetic overflows.
    let directory = tempfile::tempdir().expect("temp dir");
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hdfs-rbf-capture.jsonl");
    let text = std::fs::read_to_string(&fixture).expect("fixture");
    let gzip = {
        use std::io::Write;
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(text.as_bytes()).expect("gzip");
        encoder.finish().expect("gzip")
    };
    let lscap = {
        let path = directory.path().join("fixture.lscap");
        lagscope::lscap::convert(&[&fixture], &path, lagscope::progress::Progress::Off).expect("converts");
        std::fs::read(&path).expect("lscap")
    };
    let layouts = [
        ("jsonl", text.clone().into_bytes()),
        ("jsonl.gz", gzip),
        ("binpb", length_prefixed(&text, false)),
        ("binpb-zstd", length_prefixed(&text, true)),
        ("lscap", lscap),
    ];
    let config = AnalyzerConfig::default();
    let (mut failures, mut refused, mut read) = (Vec::new(), 0, 0);
    for (layout_index, (layout, bytes)) in layouts.iter().enumerate() {
        // Undamaged, each layout reads (the damage is what fails, not the layout).
        let path = directory.path().join(format!("whole.{layout}"));
        std::fs::write(&path, bytes).expect("write");
        lagscope::analyze::analyze_paths(&[&path], &config).unwrap_or_else(|error| panic!("{layout}: {error:#}"));
        for round in 0..150_u64 {
            let seed = 9_000 + layout_index as u64 * 1_000 + round;
            let (damaged, how) = damage(&mut Rng::new(seed), bytes);
            let name = format!("damaged-{seed}.{layout}");
            let path = directory.path().join(&name);
            std::fs::write(&path, &damaged).expect("write");
            match caught(|| lagscope::analyze::analyze_paths(&[&path], &config)) {
                Err(panic) => failures.push(format!("{name} ({how:?}): panicked: {panic}")),
                Ok(Ok(_)) => read += 1,
                Ok(Err(error)) => {
                    refused += 1;
                    let message = format!("{error:#}");
                    if !message.contains(&name) {
                        failures.push(format!("{name} ({how:?}): refused without naming the file: {message}"));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} damaged captures failed:\n{}", failures.len(), failures.join("\n"));
    // Both outcomes were met (damage that leaves a capture readable, and damage that does not).
    assert!(refused > 100 && read > 10, "{refused} refused, {read} read");
}

#[test]
fn a_call_is_named_by_its_first_attempt_whichever_arrives_first() {
    // Every retry's client span moved before its call's first attempt (a retry's export may
    // arrive first) and given a method of its own: the call is still named by its first
    // attempt (lowest attempt number, then start), in the stream as in the batch analysis
    // (the engine used to name a call by the attempt that arrived first).
    let config = AnalyzerConfig::default();
    let (mut moved, mut failures) = (0, Vec::new());
    for name in ["ozone-pinned-retry", "hdfs-no-namenodes", "es-node-level-pressure"] {
        let mut records = records_of(&SimConfig::new(name));
        let first_attempts: std::collections::HashMap<(String, String), usize> = records
            .iter()
            .enumerate()
            .filter_map(|(index, record)| match record {
                Record::Span(span) if span.call.attempt == Some(0) && span.call.client_id.is_some() => {
                    Some(((span.call.client_id.clone()?, span.call.call_id.clone()?), index))
                }
                _ => None,
            })
            .collect();
        let mut index = 0;
        while index < records.len() {
            let Record::Span(span) = &records[index] else {
                index += 1;
                continue;
            };
            let first = (span.call.attempt.unwrap_or(0) > 0)
                .then(|| first_attempts.get(&(span.call.client_id.clone()?, span.call.call_id.clone()?)).copied())
                .flatten()
                .filter(|first| *first < index);
            let within = first.is_some_and(|first| match &records[first] {
                Record::Span(first) => span.end_unix_nano - first.end_unix_nano < 5_000_000_000,
                Record::Sample(_) => false,
            });
            if let (Some(first), true) = (first, within) {
                let Record::Span(mut retry) = records.remove(index) else { unreachable!() };
                retry.call.rpc_method = Some("retriedMethod".to_string());
                records.insert(first, Record::Span(retry));
                moved += 1;
            }
            index += 1;
        }
        let expected = batch(&records, &config);
        if let Some(differs) = every_path(&records, &config).1 {
            failures.push(format!("{name}: {differs}"));
        }
        assert!(
            expected.iter().all(|anomaly| !anomaly.summary.contains("retriedMethod")),
            "{name}: a call named by a retry"
        );
    }
    assert!(moved > 20, "{moved} retries moved");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_committed_state_reported_through_a_call_id_join_counts_for_a_retry_begun_before_it() {
    // hdfs-future-state: a client carries a state no server has. One of its retried calls is
    // picked, and another client's call begun after it and ended before its retry: that call's
    // server now reports the carried state as committed (so from the retry on, the state is
    // trusted), and the call's router span came without trace context (so the attempt joins
    // its hops by call id, and the engine learns the report only when that call is processed,
    // after the retried call). The engine must still count the retry as the batch analysis
    // does: as trusted.
    let config = AnalyzerConfig::default();
    let mut records = records_of(&SimConfig::new("hdfs-future-state"));
    let before = batch(&records, &config);
    let untrusted = |anomalies: &[Anomaly]| {
        anomalies.iter().find(|anomaly| anomaly.kind == AnomalyKind::UntrustedState).cloned().expect("an untrusted run")
    };
    let found = untrusted(&before);
    let carried = found.evidence["carried"].as_i64().expect("the carried state");
    let attempts: Vec<&Span> =
        records.iter().filter_map(Record::span).filter(|span| span.component() == Some(Component::Client)).collect();
    let call_start = |of: &Span| {
        attempts
            .iter()
            .filter(|span| span.call.client_id == of.call.client_id && span.call.call_id == of.call.call_id)
            .map(|span| span.start_unix_nano)
            .min()
    };
    // The untrusted client's first retry with another client's attempt in the namespace that
    // began after the retry's call and ended before the retry.
    let (other, retry_start) = attempts
        .iter()
        .filter(|span| span.call.client_id == found.client_id && span.call.namespace == found.namespace)
        .filter(|retry| retry.call.attempt.unwrap_or(0) > 0)
        .find_map(|retry| {
            let call_start = call_start(retry)?;
            attempts
                .iter()
                .find(|span| {
                    span.call.client_id != found.client_id
                        && span.call.namespace == found.namespace
                        && span.start_unix_nano > call_start
                        && span.end_unix_nano < retry.start_unix_nano
                })
                .map(|span| ((*span).clone(), retry.start_unix_nano))
        })
        .expect("another client's call within a retried call");
    let trace = other.trace_id.clone();
    let (mut reports, mut untraced) = (0, 0);
    for record in &mut records {
        let Record::Span(span) = record else { continue };
        if span.trace_id != trace || span.span_id == other.span_id {
            continue;
        }
        if span.component() == Some(Component::Server) && span.call.state.committed.is_some() {
            span.call.state.committed = Some(carried);
            reports += 1;
        }
        if span.call.call_id == other.call.call_id && span.call.client_id == other.call.client_id {
            span.parent_span_id = None;
            untraced += 1;
        }
    }
    assert!(reports > 0 && untraced > 0, "{reports} servers reporting, {untraced} hops untraced");
    let after = untrusted(&batch(&records, &config));
    assert!(
        after.evidence["requests"].as_i64() < found.evidence["requests"].as_i64(),
        "the report at {} before the retry at {retry_start} makes requests trusted: {} then {}",
        other.end_unix_nano,
        found.evidence["requests"],
        after.evidence["requests"],
    );
    let (panics, differs) = every_path(&records, &config);
    assert!(panics.is_empty(), "{panics:?}");
    assert_eq!(differs, None);
}

/// Anomalies by fingerprint.
type Found = std::collections::BTreeMap<String, Anomaly>;

/// What a store keeps of the anomalies live passes found: of those one incident
/// ([`lagscope_store::same_incident`]), the earliest start.
fn as_stored(found: Found) -> Found {
    let mut all: Vec<Anomaly> = found.into_values().collect();
    all.sort_by_key(|anomaly| (anomaly.start_unix_nano, anomaly.fingerprint.clone()));
    let mut kept: Vec<Anomaly> = Vec::new();
    for anomaly in all {
        if !kept.iter().any(|earlier| lagscope_store::same_incident(earlier, &anomaly)) {
            kept.push(anomaly);
        }
    }
    kept.into_iter().map(|anomaly| (anomaly.fingerprint.clone(), anomaly)).collect()
}

/// What live passes over `records` find, as a store keeps it: settling 10 s behind the newest
/// span, and holding every span.
fn live_found(records: &[Record], config: &AnalyzerConfig) -> (Found, Found) {
    let settling = live_passes(records, &[], config, 1_000, Some(10_000_000_000)).0;
    (as_stored(settling), as_stored(live_passes(records, &[], config, 1_000, None).0))
}

/// How what the settling passes found differs from what those holding every span found, with
/// at most `shown` anomalies of each side; `None` when it does not.
fn live_apart(settling: &Found, whole: &Found, shown: usize) -> Option<String> {
    if settling == whole {
        return None;
    }
    let only = |of: &Found, not: &Found| {
        of.iter()
            .filter(|(key, anomaly)| not.get(*key) != Some(anomaly))
            .take(shown)
            .map(|(key, anomaly)| match not.get(key) {
                Some(other) => format!("{key}: {}", differences(anomaly, other)),
                None => format!("{anomaly:?}"),
            })
            .collect::<Vec<_>>()
    };
    Some(format!(
        "live passes settling {} anomalies, holding every span {}; only settling: {:?}; only holding every span: {:?}",
        settling.len(),
        whole.len(),
        only(settling, whole),
        only(whole, settling)
    ))
}

/// A hunt's tool: the fewest changes of a failing run (`LAGSCOPE_MIN_SCENARIO`,
/// `LAGSCOPE_MIN_SEED`) that still keep the settling live passes apart from those holding every
/// span, each printed where it changed its record, then the anomalies that differ. Run by hand:
/// `cargo test -p lagscope --test hostile_telemetry fewest_changes -- --ignored`.
#[test]
#[ignore = "a hunt's tool, run by hand on a failing seed"]
fn fewest_changes_that_keep_live_settling_apart() {
    let name = std::env::var("LAGSCOPE_MIN_SCENARIO").expect("LAGSCOPE_MIN_SCENARIO names the failing scenario");
    let seed: u64 = std::env::var("LAGSCOPE_MIN_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .expect("LAGSCOPE_MIN_SEED gives the failing seed");
    let config = AnalyzerConfig::default();
    let records = records_of(&SimConfig::new(&name));
    let (mut changed, changes) = mutate(&records, seed, 3, VALUE_CHANGES);
    // Without the three copies sent again (the last changes, "... sent again at N"): the
    // records then correspond index for index.
    for change in changes.iter().rev().take(3) {
        let at = change.rsplit(' ').next().and_then(|at| at.parse::<usize>().ok()).expect("a copy's place");
        changed.remove(at);
    }
    assert_eq!(changed.len(), records.len());
    let text = |record: &Record| match record {
        Record::Span(span) => format!("{span:?}"),
        Record::Sample(sample) => format!("{sample:?}"),
    };
    let with = |kept: &[usize]| {
        let mut run = records.clone();
        for &index in kept {
            run[index] = changed[index].clone();
        }
        run
    };
    let apart = |kept: &[usize]| {
        let (settling, whole) = live_found(&with(kept), &config);
        settling != whole
    };
    let mut kept: Vec<usize> =
        (0..records.len()).filter(|&index| text(&records[index]) != text(&changed[index])).collect();
    assert!(apart(&kept), "the run without its copies keeps no live passes apart");
    // Chunks of the changes undone while the passes stay apart, the chunks halved in turn.
    let mut chunk = kept.len() / 2;
    while chunk >= 1 {
        let mut from = 0;
        while from < kept.len() {
            let trial: Vec<usize> = (kept.iter().enumerate())
                .filter(|(place, _)| *place < from || *place >= from + chunk)
                .map(|(_, index)| *index)
                .collect();
            if apart(&trial) {
                kept = trial;
            } else {
                from += chunk;
            }
        }
        chunk /= 2;
    }
    for &index in &kept {
        let (was, now) = (text(&records[index]), text(&changed[index]));
        let at = was.bytes().zip(now.bytes()).position(|(left, right)| left != right).unwrap_or(0);
        let shown = |text: &str| {
            text.get(at.saturating_sub(150).min(text.len())..).unwrap_or(text).chars().take(400).collect::<String>()
        };
        eprintln!("record {index}:\n  was ...{}\n  now ...{}", shown(&was), shown(&now));
    }
    let (settling, whole) = live_found(&with(&kept), &config);
    eprintln!("{}", live_apart(&settling, &whole, usize::MAX).unwrap_or_default());
    panic!("{} changes keep the passes apart", kept.len());
}
