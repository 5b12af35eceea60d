//! What a columnar stale-read check would cost: a measure for BENCHMARKS.md, not part of
//! lagscope.
//!
//! ```text
//! cargo run --release -p lagscope --example stale_read_columnar -- CAPTURE.lscap [RUNS]
//! ```
//!
//! Three checks, none of which builds an anomaly, over the capture's spans decoded into
//! memory first (not timed), each timed RUNS times (default 7), medians printed:
//!
//! - `duckdb-semantics`: what `scripts/bench/stale_read_duckdb.py`'s query counts (per attempt,
//!   each trace's highest served state), columnar: project, hash join, two sorts, one sweep;
//! - `calls`: the check as lagscope defines it, whole-capture rather than streamed: attempts
//!   grouped into calls by call id (a horizon apart at most, copies of one span taken once),
//!   each joined at arrival to the router and server spans under it in its trace (served state
//!   from the last successful server, a write's returned state from its router or server when
//!   the client span has none), each session's calls judged in start order against the floors
//!   of the calls completed before each started (read-your-writes, monotonic reads). It keeps
//!   ~48 bytes per attempt and nothing to explain a stale read with;
//! - `calls+detail`: the same, with a 128-byte record written per attempt (what keeping every
//!   attempt's evidence would write).
//!
//! Then the `calls` check where it would run: fed each batch as it is decoded (the file's
//! blocks held in memory), against decoding alone.
//!
//! Not handled (the engine handles them): hops without trace context (joined by call id),
//! consistency exemptions, the cross-client bound, calls spread over more than a horizon of
//! arrival, and everything an anomaly says.

use std::time::Instant;

use lagscope_analyzer::stream::codec::{Batch, Decoder, Item};
use lagscope_analyzer::stream::{Interner, SpanRec, known};
use rustc_hash::FxHashMap;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let usage = || anyhow::anyhow!("usage: stale_read_columnar CAPTURE.lscap [RUNS]");
    let path = args.next().ok_or_else(usage)?;
    let runs: usize = match args.next() {
        Some(runs) => runs.parse().map_err(|error| anyhow::anyhow!("RUNS {runs:?}: {error}"))?,
        None => 7,
    };
    let blocks = read_blocks(&path)?;
    let spans = decode(&blocks, true, |_| {})?;
    println!("{path}: {} spans", spans.len());
    let checks: [(&str, &Check); 3] = [
        ("duckdb-semantics", &count),
        ("calls", &|spans| feed::<false>(spans)),
        ("calls+detail", &|spans| feed::<true>(spans)),
    ];
    for (name, check) in checks {
        let (median, stale) = timed(runs, || check(&spans));
        println!("{name}: median {median:.4} s over {runs} runs, {stale} stale reads");
    }
    let (alone, _) = timed(runs, || decode(&blocks, false, |span| _ = std::hint::black_box(span)).map_or(0, |_| 0));
    let (fed, stale) = timed(runs, || {
        let mut sink = Sink::<false>::default();
        decode(&blocks, false, |span| sink.push(span)).map_or(0, |_| sink.finish())
    });
    println!(
        "in the pipeline: decoding alone median {alone:.4} s, decoding and the calls check {fed:.4} s \
         ({stale} stale reads): the check adds {:.4} s",
        fed - alone
    );
    Ok(())
}

/// A check over spans in memory: the stale reads it counted.
type Check = dyn Fn(&[SpanRec]) -> usize;

/// Runs `check` `runs` times: the median seconds and what the last run returned.
fn timed(runs: usize, mut check: impl FnMut() -> usize) -> (f64, usize) {
    let mut times = Vec::new();
    let mut found = 0;
    for _ in 0..runs.max(1) {
        let started = Instant::now();
        found = check();
        times.push(started.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    (times[times.len() / 2], found)
}

/// The capture's blocks, in memory.
fn read_blocks(path: &str) -> anyhow::Result<Vec<Vec<u8>>> {
    let mut blocks = Vec::new();
    lagscope::lscap::read_lscap_blocks(std::path::Path::new(path), |_, payload| {
        blocks.push(payload.to_vec());
        Ok(())
    })?;
    Ok(blocks)
}

/// Decodes the blocks, handing each span to `each` where it was decoded; returns them all
/// when `keep`.
fn decode(blocks: &[Vec<u8>], keep: bool, mut each: impl FnMut(&SpanRec)) -> anyhow::Result<Vec<SpanRec>> {
    let (mut interner, mut decoder, mut batch) = (Interner::default(), Decoder::new(), Batch::default());
    let mut spans = Vec::new();
    for (index, payload) in blocks.iter().enumerate() {
        let mut offset = 0;
        while offset < payload.len() {
            decoder
                .decode_some(payload, &mut offset, &mut interner, &mut batch, 1024)
                .map_err(|error| anyhow::anyhow!("block {index}: {error}"))?;
            for item in batch.items() {
                if let Item::Span(span) = item {
                    each(span);
                    if keep {
                        spans.push(span.clone());
                    }
                }
            }
        }
    }
    Ok(spans)
}

fn feed<const DETAIL: bool>(spans: &[SpanRec]) -> usize {
    let mut sink = Sink::<DETAIL>::default();
    for span in spans {
        sink.push(span);
    }
    sink.finish()
}

/// An attempt as DuckDB's query sees it.
#[derive(Clone, Copy)]
struct Row {
    session: u32,
    flags: u32, // 1 read, 2 ok, 4 has state
    start: i64,
    end: i64,
    state: i64,
}

/// The DuckDB query's count (per attempt, a trace's highest served state, no calls), columnar:
/// project, join, sort by (session, start) and by (session, end), sweep.
fn count(spans: &[SpanRec]) -> usize {
    let mut sessions: FxHashMap<(u32, u32), u32> = FxHashMap::default();
    let mut rows: Vec<Row> = Vec::with_capacity(spans.len() / 2);
    let mut traces: Vec<u128> = Vec::with_capacity(spans.len() / 2);
    let mut served: FxHashMap<u128, i64> = FxHashMap::default();
    for span in spans {
        if span.is_client_attempt() && (span.op == known::READ || span.op == known::WRITE) {
            let next = sessions.len() as u32;
            let session = *sessions.entry((span.client.0, span.namespace.0)).or_insert(next);
            let read = span.op == known::READ;
            let state = if read { span.served } else { span.returned };
            rows.push(Row {
                session,
                flags: read as u32 | (span.ok as u32) << 1 | (state.is_some() as u32) << 2,
                start: span.start,
                end: span.end,
                state: state.unwrap_or(0),
            });
            traces.push(span.id.trace_id());
        } else if span.component == known::SERVER
            && let Some(state) = span.served
        {
            let e = served.entry(span.id.trace_id()).or_insert(state);
            *e = (*e).max(state);
        }
    }
    for (row, trace) in rows.iter_mut().zip(&traces) {
        if row.flags & 1 != 0
            && let Some(state) = served.get(trace)
        {
            row.state = *state;
            row.flags |= 4;
        }
    }
    // by session, then start
    let mut order: Vec<u32> = (0..rows.len() as u32).collect();
    order.sort_unstable_by_key(|i| (rows[*i as usize].session, rows[*i as usize].start));
    let mut by_end: Vec<u32> = (0..rows.len() as u32).filter(|i| rows[*i as usize].flags & 6 == 6).collect();
    by_end.sort_unstable_by_key(|i| (rows[*i as usize].session, rows[*i as usize].end));
    let mut stale = 0;
    let mut next = 0;
    let mut floor: Option<i64> = None;
    let mut session = u32::MAX;
    for &i in &order {
        let row = rows[i as usize];
        if row.session != session {
            session = row.session;
            floor = None;
            while next < by_end.len() && rows[by_end[next] as usize].session < session {
                next += 1;
            }
        }
        while next < by_end.len() {
            let c = rows[by_end[next] as usize];
            if c.session != session || c.end > row.start {
                break;
            }
            floor = Some(floor.map_or(c.state, |f: i64| f.max(c.state)));
            next += 1;
        }
        if row.flags & 7 == 7 && floor.is_some_and(|f| row.state < f) {
            stale += 1;
        }
    }
    stale
}

/// A router or server span waiting for its attempt.
#[derive(Clone, Copy)]
struct Hop {
    span_id: u64,
    parent: u64,
    server: bool,
    ok: bool,
    start: i64,
    served: Option<i64>,
    returned: Option<i64>,
}

/// A client read or write attempt, as the check keeps it.
#[derive(Clone, Copy)]
struct AttemptRow {
    start: i64,
    end: i64,
    span_id: u64,
    /// A read's served state, a write's returned state (i64::MIN: none).
    state: i64,
    /// The call's next attempt (`u32::MAX`: none).
    next: u32,
    read: bool,
    ok: bool,
}

/// A call: its attempts are a list through `AttemptRow::next`.
struct CallRow {
    key: u64,
    start: i64,
    first: u32,
    last: u32,
}

/// The call-level check, fed span by span as a decoder hands them over, then finished. With
/// `DETAIL`, each attempt also writes a 128-byte record (what keeping every attempt's evidence
/// would write, as the engine keeps a compact attempt for each).
#[derive(Default)]
struct Sink<const DETAIL: bool> {
    sessions: FxHashMap<(u32, u32), u32>,
    session_calls: Vec<Vec<CallRow>>,
    open: FxHashMap<u64, (u32, u32)>,
    atts: Vec<AttemptRow>,
    slab: Vec<(Hop, u32)>,
    free: Vec<u32>,
    waiting: FxHashMap<u128, u32>,
    list: Vec<u32>,
    under: Vec<u64>,
    detail: Vec<[u64; 16]>,
}

impl<const DETAIL: bool> Sink<DETAIL> {
    #[inline]
    fn push(&mut self, span: &SpanRec) {
        use std::hash::BuildHasher;
        const HORIZON: i64 = 90_000_000_000;
        const NIL: u32 = u32::MAX;
        if span.is_client_attempt() {
            if span.op != known::READ && span.op != known::WRITE {
                return;
            }
            let next = self.sessions.len() as u32;
            let session_calls = &mut self.session_calls;
            let session = *self.sessions.entry((span.client.0, span.namespace.0)).or_insert_with(|| {
                session_calls.push(Vec::new());
                next
            });
            let read = span.op == known::READ;
            let mut state = if read { span.served } else { span.returned };
            let trace = span.id.trace_id();
            if let Some(head) = self.waiting.remove(&trace) {
                self.under.clear();
                self.under.push(span.id.span_id);
                self.list.clear();
                let mut at = head;
                while at != NIL {
                    self.list.push(at);
                    at = self.slab[at as usize].1;
                }
                let slab = &self.slab;
                if self.list.len() > 1 {
                    self.list.sort_unstable_by_key(|i| slab[*i as usize].0.start);
                }
                let (mut server, mut router): (Option<Hop>, Option<Hop>) = (None, None);
                for &i in &self.list {
                    let hop = slab[i as usize].0;
                    if self.under.contains(&hop.parent) {
                        self.under.push(hop.span_id);
                        if hop.server {
                            if hop.ok || server.is_none_or(|s| !s.ok) {
                                server = Some(hop);
                            }
                        } else {
                            router = Some(hop);
                        }
                    }
                    self.free.push(i);
                }
                if read {
                    state = server.and_then(|s| s.served).or(state);
                } else if state.is_none() {
                    state = router.and_then(|r| r.returned).or(server.and_then(|s| s.returned));
                }
            }
            if DETAIL {
                self.detail.push([
                    span.start as u64,
                    span.end as u64,
                    span.id.span_id,
                    u64::from(span.client.0),
                    u64::from(span.namespace.0),
                    u64::from(span.service.0),
                    u64::from(span.node.0),
                    u64::from(span.target_node.0),
                    u64::from(span.consistency.0),
                    span.carried.unwrap_or(0) as u64,
                    span.committed.unwrap_or(0) as u64,
                    u64::from(span.outcome.0),
                    u64::from(span.error_type.0),
                    self.list.len() as u64,
                    self.under.len() as u64,
                    0,
                ]);
            }
            let index = self.atts.len() as u32;
            self.atts.push(AttemptRow {
                start: span.start,
                end: span.end,
                span_id: span.id.span_id,
                state: state.unwrap_or(i64::MIN),
                next: NIL,
                read,
                ok: span.ok,
            });
            let key = span
                .call_id
                .as_deref()
                .map(|id| rustc_hash::FxBuildHasher.hash_one((span.client.0, span.namespace.0, id)));
            let existing = key.and_then(|key| {
                self.open.get(&key).copied().filter(|(s, c)| {
                    let call = &self.session_calls[*s as usize][*c as usize];
                    *s == session && call.key == key && span.start <= call.start + HORIZON
                })
            });
            let calls = &mut self.session_calls[session as usize];
            match existing {
                Some((_, c)) => {
                    let call = &mut calls[c as usize];
                    let mut at = call.first;
                    let mut dup = false;
                    while at != NIL {
                        let a = &self.atts[at as usize];
                        if a.span_id == span.id.span_id && a.start == span.start {
                            dup = true;
                            break;
                        }
                        at = a.next;
                    }
                    if dup {
                        self.atts.pop();
                    } else {
                        self.atts[call.last as usize].next = index;
                        call.last = index;
                        call.start = call.start.min(span.start);
                    }
                }
                None => {
                    let c = calls.len() as u32;
                    calls.push(CallRow { key: key.unwrap_or(0), start: span.start, first: index, last: index });
                    if let Some(key) = key {
                        self.open.insert(key, (session, c));
                    }
                }
            }
        } else if span.component == known::ROUTER || span.component == known::SERVER {
            let trace = span.id.trace_id();
            let hop = Hop {
                span_id: span.id.span_id,
                parent: span.parent_span_id,
                server: span.component == known::SERVER,
                ok: span.ok,
                start: span.start,
                served: span.served,
                returned: span.returned,
            };
            let head = self.waiting.entry(trace).or_insert(NIL);
            let at = match self.free.pop() {
                Some(at) => {
                    self.slab[at as usize] = (hop, *head);
                    at
                }
                None => {
                    self.slab.push((hop, *head));
                    self.slab.len() as u32 - 1
                }
            };
            *head = at;
        }
    }

    fn finish(mut self) -> usize {
        std::hint::black_box(&self.detail);
        const NIL: u32 = u32::MAX;
        let mut stale = 0;
        let mut contributions: Vec<(i64, i64, bool)> = Vec::new();
        for calls in &mut self.session_calls {
            if !calls.is_sorted_by_key(|c| c.start) {
                calls.sort_by_key(|c| c.start);
            }
            contributions.clear();
            for call in calls.iter() {
                let mut best: Option<(i64, i64, bool)> = None;
                let mut at = call.first;
                while at != NIL {
                    let a = &self.atts[at as usize];
                    if a.ok && a.state != i64::MIN && best.is_none_or(|(s, _, _)| a.state > s) {
                        best = Some((a.state, a.end, !a.read));
                    }
                    at = a.next;
                }
                if let Some((state, end, write)) = best {
                    contributions.push((end, state, write));
                }
            }
            if !contributions.is_sorted_by_key(|c| c.0) {
                contributions.sort_by_key(|c| c.0);
            }
            let (mut next, mut wf, mut rf) = (0, i64::MIN, i64::MIN);
            for call in calls.iter() {
                while next < contributions.len() && contributions[next].0 <= call.start {
                    let (_, state, write) = contributions[next];
                    if write {
                        wf = wf.max(state)
                    } else {
                        rf = rf.max(state)
                    }
                    next += 1;
                }
                let mut at = call.first;
                while at != NIL {
                    let a = &self.atts[at as usize];
                    if a.read && a.ok && a.state != i64::MIN && (a.state < wf || a.state < rf) {
                        stale += 1;
                    }
                    at = a.next;
                }
            }
        }
        stale
    }
}
