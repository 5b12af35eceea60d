//! The least the stale-read check can cost: a measure for BENCHMARKS.md, not part of lagscope.
//!
//! ```text
//! cargo run --release -p lagscope --example stale_read_bound -- CAPTURE.lscap [RUNS]
//! ```
//!
//! Counts what `scripts/bench/stale_read_duckdb.py`'s query counts (read-your-writes and
//! monotonic reads, the textbook way: per attempt, no calls, no consistency exemptions, no
//! cross-client bound, no anomalies built), streamed over the capture's spans with the engine's
//! windows (a server's served state joined by trace once the 10 s lateness passed, attempts
//! judged in start order once the 90 s horizon passed). It keeps a few integers per attempt and
//! nothing to explain a stale read with: what it costs is a floor under any check that holds a
//! capture to its order, against which `lagscope analyze --kind stale_read` (which builds
//! every anomaly with its evidence) and DuckDB's query are compared.
//!
//! The spans are decoded into memory first (not timed); the count is timed RUNS times (default
//! 5) and the median printed.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::time::Instant;

use lagscope_analyzer::stream::codec::{Batch, Decoder, Item};
use lagscope_analyzer::stream::{Interner, SpanRec, known};
use rustc_hash::FxHashMap;

const LATENESS: i64 = 10_000_000_000;
const HORIZON: i64 = 90_000_000_000;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or_else(|| anyhow::anyhow!("usage: stale_read_bound CAPTURE.lscap [RUNS]"))?;
    let runs: usize = match args.next() {
        Some(runs) => runs.parse().map_err(|error| anyhow::anyhow!("RUNS {runs:?}: {error}"))?,
        None => 5,
    };
    let decoding = Instant::now();
    let spans = read_spans(&path)?;
    eprintln!("{path}: {} spans decoded in {:.2} s (not timed below)", spans.len(), decoding.elapsed().as_secs_f64());
    let mut times = Vec::new();
    for run in 1..=runs.max(1) {
        let started = Instant::now();
        let stale = count_stale_reads(&spans);
        times.push(started.elapsed().as_secs_f64());
        eprintln!("run {run}: {stale} stale reads in {:.4} s", times[times.len() - 1]);
    }
    times.sort_by(f64::total_cmp);
    println!(
        "stale-read bound: median {:.4} s over {} runs ({} spans)",
        times[times.len() / 2],
        times.len(),
        spans.len()
    );
    Ok(())
}

/// Every span of an lscap capture, in file order.
fn read_spans(path: &str) -> anyhow::Result<Vec<SpanRec>> {
    let (mut interner, mut decoder, mut batch) = (Interner::default(), Decoder::new(), Batch::default());
    let mut spans = Vec::new();
    lagscope::lscap::read_lscap_blocks(std::path::Path::new(path), |at, payload| {
        let mut offset = 0;
        while offset < payload.len() {
            decoder
                .decode_some(payload, &mut offset, &mut interner, &mut batch, 1024)
                .map_err(|error| anyhow::anyhow!("{path}: block {} at byte {}: {error}", at.index, at.offset))?;
            spans.extend(batch.items().iter().filter_map(|item| match item {
                Item::Span(span) => Some(span.clone()),
                _ => None,
            }));
        }
        Ok(())
    })?;
    Ok(spans)
}

/// A client read or write waiting for its server's state (the lateness), then for its turn (the
/// horizon).
#[derive(Clone, Copy)]
struct Attempt {
    session: u32,
    read: bool,
    ok: bool,
    start: i64,
    end: i64,
    trace: u128,
    /// A write's returned state, a read's served state (the server's, once joined).
    state: Option<i64>,
}

/// An attempt in start order (ties in arrival order).
struct Due(i64, u64, Attempt);

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        (self.0, self.1) == (other.0, other.1)
    }
}

impl Eq for Due {}

impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Due {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.0, self.1).cmp(&(other.0, other.1))
    }
}

/// A session's floor: the highest state of its attempts completed by the latest start judged,
/// and those completed later.
struct Session {
    floor: Option<i64>,
    latest_start: i64,
    pending: Vec<(i64, i64)>,
}

fn count_stale_reads(spans: &[SpanRec]) -> usize {
    let mut sessions: FxHashMap<(u32, u32), u32> = FxHashMap::default();
    let mut floors: Vec<Session> = Vec::new();
    // Each trace's highest served state among its server spans waiting to join, and when the
    // latest of them ended (those never joined are forgotten a horizon later).
    let mut served: FxHashMap<u128, (i64, i64)> = FxHashMap::default();
    let mut served_order: VecDeque<(i64, u128)> = VecDeque::new();
    let mut waiting: VecDeque<Attempt> = VecDeque::new();
    let mut due: BinaryHeap<Reverse<Due>> = BinaryHeap::new();
    let (mut sequence, mut watermark, mut stale) = (0_u64, i64::MIN, 0_usize);
    let mut judge = |attempt: Attempt, floors: &mut Vec<Session>| {
        let session = &mut floors[attempt.session as usize];
        session.latest_start = session.latest_start.max(attempt.start);
        let (latest, mut floor) = (session.latest_start, session.floor);
        session.pending.retain(|(completed, state)| {
            let ready = *completed <= latest;
            if ready {
                floor = floor.max(Some(*state));
            }
            !ready
        });
        session.floor = floor;
        if attempt.read && attempt.ok && attempt.state.zip(floor).is_some_and(|(state, floor)| state < floor) {
            stale += 1;
        }
        if attempt.ok
            && let Some(state) = attempt.state
        {
            session.pending.push((attempt.end, state));
        }
    };
    for (index, span) in spans.iter().enumerate() {
        watermark = watermark.max(span.end);
        if span.is_client_attempt() && matches!(span.op, known::READ | known::WRITE) {
            let next = u32::try_from(floors.len()).expect("fewer than 2^32 sessions");
            let session = *sessions.entry((span.client.0, span.namespace.0)).or_insert(next);
            if session == next {
                floors.push(Session { floor: None, latest_start: i64::MIN, pending: Vec::new() });
            }
            let read = span.op == known::READ;
            let state = if read { span.served } else { span.returned };
            let trace = span.id.trace_id();
            waiting.push_back(Attempt { session, read, ok: span.ok, start: span.start, end: span.end, trace, state });
        } else if span.component == known::SERVER
            && let Some(state) = span.served
        {
            let entry = served.entry(span.id.trace_id()).or_insert((state, span.end));
            *entry = (entry.0.max(state), entry.1.max(span.end));
            served_order.push_back((span.end, span.id.trace_id()));
        }
        // Every few hundred spans, as the engine: join, judge, forget.
        if index % 256 != 255 && index + 1 != spans.len() {
            continue;
        }
        let (join_before, final_before) =
            if index + 1 == spans.len() { (i64::MAX, i64::MAX) } else { (watermark - LATENESS, watermark - HORIZON) };
        while waiting.front().is_some_and(|attempt| attempt.end < join_before) {
            let Some(mut attempt) = waiting.pop_front() else { break };
            // Taken by the first attempt that joins, as the engine's join takes a trace's spans.
            if let Some((state, _)) = served.remove(&attempt.trace)
                && attempt.read
            {
                attempt.state = Some(state);
            }
            sequence += 1;
            due.push(Reverse(Due(attempt.start, sequence, attempt)));
        }
        while due.peek().is_some_and(|Reverse(Due(start, ..))| *start < final_before) {
            if let Some(Reverse(Due(_, _, attempt))) = due.pop() {
                judge(attempt, &mut floors);
            }
        }
        while let Some((end, trace)) = served_order.front().copied()
            && end < final_before
        {
            served_order.pop_front();
            if served.get(&trace).is_some_and(|(_, last)| *last <= end) {
                served.remove(&trace);
            }
        }
    }
    stale
}
