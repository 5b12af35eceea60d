//! What settling a held window costs: a measure for BENCHMARKS.md, not part of lagscope.
//!
//! ```text
//! cargo run --release -p lagscope --example settle -- [SCENARIO] [SECONDS] [RUNS] [HELD_SECONDS]
//! ```
//!
//! Under `serve --demo` with competitors, the slowest analyses left were settles
//! ([`HeldTimelines::settle`]) of busy windows: 70-130 ms each for a few thousand spans let go
//! of 45 000 held, and 20-40 ms for a scope that let go of none. This runs the simulator's
//! SCENARIO (default `mixed`) for SECONDS of simulated time (default 300), converts its trace
//! exports as the OTLP receivers do, and replays each (cluster, namespace)'s spans as a scope
//! cache holds them: each second of simulated time adds the spans that ended in it (in end
//! order, as commits bring them), keeps the newest `live.max_spans_per_scope` (50 000), and
//! joins what changed; every 5 s of telemetry (half of `live.settle_seconds`' default 10) it
//! settles the window 10 s behind its newest span, with the cut held HELD_SECONDS (default 60)
//! further back, as an anomaly that keeps growing holds it (`lagscope_analyzer::growing`):
//! the windows of the demo's busy scopes and bulk clients held 45 000-50 000 spans so.
//! Each pass judges the held calls with the detectors that judge call by call (`stale_read`,
//! `carried_state_regression`, `router_state_dropped`; no metrics), keeping their verdicts
//! as a live pass does. Timed, RUNS times (default 3): each settle, and each pass (join,
//! enrichment, judging), those right after a settle apart. It prints the medians of the runs'
//! sums, and the slowest settle.

use std::time::{Duration, Instant};

use lagscope_analyzer::{AnalysisInput, AnalyzerConfig, HeldTimelines, analyze_held_kinds};
use lagscope_model::{AnomalyKind, Sample};

mod replay;
use replay::{HORIZON, SCOPE_LIMIT, number, spans_by_scope};

// The allocator `lagscope serve` runs with.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SECOND: i64 = 1_000_000_000;
/// `live.settle_seconds`' default: a window settles this far behind its newest span, once
/// per half of it.
const SETTLE_AFTER: i64 = 10 * SECOND;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let scenario = args.next().unwrap_or_else(|| "mixed".to_string());
    let seconds = number(args.next(), 300, "SECONDS")?;
    let runs = number(args.next(), 3, "RUNS")?.max(1);
    let held_back = number(args.next(), 60, "HELD_SECONDS")?.max(0) * SECOND;

    let simulating = Instant::now();
    let mut scopes = spans_by_scope(&scenario, seconds)?;
    let total: usize = scopes.values().map(Vec::len).sum();
    for spans in scopes.values_mut() {
        spans.sort_by_key(|span| span.end_unix_nano);
    }
    eprintln!(
        "{scenario}, {seconds} s: {} scopes, {total} spans (built in {:.1} s, not timed); cuts held {} s back",
        scopes.len(),
        simulating.elapsed().as_secs_f64(),
        held_back / SECOND
    );

    let config = AnalyzerConfig::default();
    let judged = |kind: AnomalyKind| {
        matches!(kind, AnomalyKind::StaleRead | AnomalyKind::CarriedStateRegression | AnomalyKind::RouterStateDropped)
    };
    let mut settling_sums = Vec::new();
    let mut joining_sums = Vec::new();
    let mut passing_sums = Vec::new();
    let mut slowest_of_runs = Vec::new();
    let (mut settles, mut let_go_total) = (0, 0);
    for run in 1..=runs {
        let (mut settling, mut joining, mut passing) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
        let mut found = 0;
        let mut slowest: (Duration, usize, usize) = (Duration::ZERO, 0, 0);
        (settles, let_go_total) = (0, 0);
        for spans in scopes.values() {
            let Some(first) = spans.first() else { continue };
            let mut held = HeldTimelines::new(HORIZON);
            let mut next = 0;
            let mut now = first.end_unix_nano;
            let mut settled_at = i64::MIN;
            while next < spans.len() {
                now += SECOND;
                while next < spans.len() && spans[next].end_unix_nano <= now {
                    held.insert(spans[next].clone());
                    next += 1;
                }
                held.keep_newest(SCOPE_LIMIT, None);
                let started = Instant::now();
                held.refresh();
                let mut input = AnalysisInput::from_held(&mut held, Vec::<Sample>::new());
                input.verdicts = held.take_verdicts();
                found += analyze_held_kinds(&mut input, &config, judged).len();
                let verdicts = std::mem::take(&mut input.verdicts);
                let (timelines, _) = input.into_parts();
                held.give_back(timelines);
                held.give_back_verdicts(verdicts);
                let took = started.elapsed();
                if settled_at == i64::MIN {
                    passing += took;
                } else {
                    // The pass after a settle: what the settle changed is joined and judged.
                    joining += took;
                    settled_at = i64::MIN;
                }
                let Some(newest) = held.last_start() else { continue };
                let before = newest - SETTLE_AFTER;
                if before.saturating_sub(held.last_settle()) < SETTLE_AFTER / 2 {
                    continue;
                }
                let count = held.len();
                let started = Instant::now();
                let let_go = held.settle(before, |_| before - held_back);
                let took = started.elapsed();
                settling += took;
                settles += 1;
                let_go_total += let_go.len();
                if took > slowest.0 {
                    slowest = (took, count, let_go.len());
                }
                settled_at = before;
            }
        }
        eprintln!(
            "run {run}: {settles} settles let go of {let_go_total} spans in {:.4} s, the passes after them took \
             {:.4} s, the others {:.4} s ({found} anomalies found in all); slowest settle {:.1} ms ({} held, {} \
             let go)",
            settling.as_secs_f64(),
            joining.as_secs_f64(),
            passing.as_secs_f64(),
            slowest.0.as_secs_f64() * 1e3,
            slowest.1,
            slowest.2
        );
        settling_sums.push(settling.as_secs_f64());
        joining_sums.push(joining.as_secs_f64());
        passing_sums.push(passing.as_secs_f64());
        slowest_of_runs.push(slowest.0.as_secs_f64());
    }
    let median = |mut values: Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    println!(
        "settling: {settles} settles, {let_go_total} spans let go; median over {runs} runs: settles {:.4} s \
         ({:.1} µs a span let go), the passes after them {:.4} s, the other passes {:.4} s, slowest settle \
         {:.1} ms",
        median(settling_sums.clone()),
        median(settling_sums) * 1e6 / let_go_total.max(1) as f64,
        median(joining_sums),
        median(passing_sums),
        median(slowest_of_runs) * 1e3
    );
    Ok(())
}
