//! What joining a scope's spans into timelines costs: a measure for BENCHMARKS.md, not part of
//! lagscope.
//!
//! ```text
//! cargo run --release -p lagscope --example scope_timelines -- [SCENARIO] [SECONDS] [RUNS] [STEP_MS]
//! ```
//!
//! Under `serve --demo` most of a live scope pass is building its timelines again
//! (`scope_timelines_ms` in the pass's debug line): each pass joins the newest
//! `live.max_spans_per_scope` (50 000) spans of each busy (cluster, namespace). This runs the
//! simulator's SCENARIO (default `mixed`) for SECONDS of simulated time (default 120), converts
//! its trace exports as the OTLP receivers do, keeps each scope's newest 50 000 spans by start
//! as the scope pass reads them, and times `AnalysisInput::from_span_refs` over every scope
//! (no metrics: enriching is measured apart in the pass's line), RUNS times (default 5). It
//! prints the median, and per span.
//!
//! Then what a pass costs with the timelines held between passes ([`HeldTimelines`], as the
//! scope cache holds them): "now" is the scope's latest start; each scope holds the spans that had
//! ended STEP_MS before now (default 1 000 ms, a pass's worth of arrivals under `serve
//! --demo`), joined untimed; timed is adding those that ended since, in end order (as commits
//! bring them), keeping the newest 50 000, and joining what changed. The first run checks
//! that the held timelines are those a new join builds.

use std::time::Instant;

use lagscope_analyzer::{AnalysisInput, HeldTimelines, build_timelines};
use lagscope_model::Span;

mod replay;
use replay::{HORIZON, SCOPE_LIMIT, number, spans_by_scope};

// The allocator `lagscope serve` runs with: the join allocates many small strings.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let scenario = args.next().unwrap_or_else(|| "mixed".to_string());
    let seconds = number(args.next(), 120, "SECONDS")?;
    let runs = number(args.next(), 5, "RUNS")?.max(1);
    let step = number(args.next(), 1_000, "STEP_MS")? * 1_000_000;

    let simulating = Instant::now();
    let mut scopes = spans_by_scope(&scenario, seconds)?;
    let mut total = 0;
    for spans in scopes.values_mut() {
        spans.sort_by_key(|span| span.start_unix_nano);
        let cut = spans.len().saturating_sub(SCOPE_LIMIT);
        spans.drain(..cut);
        total += spans.len();
    }
    eprintln!(
        "{scenario}, {seconds} s: {} scopes, {total} spans held as scope passes read them (built in {:.1} s, not timed)",
        scopes.len(),
        simulating.elapsed().as_secs_f64()
    );

    eprintln!("resident memory with the spans decoded: {} MiB", resident_mib());
    let mut times = Vec::new();
    for run in 1..=runs {
        let started = Instant::now();
        let mut calls = 0;
        for spans in scopes.values() {
            let refs: Vec<&Span> = spans.iter().collect();
            let input = AnalysisInput::from_span_refs(&refs, Vec::new(), HORIZON);
            calls += input.timelines().iter().map(|timeline| timeline.calls.len()).sum::<usize>();
        }
        let elapsed = started.elapsed().as_secs_f64();
        eprintln!("run {run}: {calls} calls in {elapsed:.3} s");
        times.push(elapsed);
    }
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    println!(
        "scope timelines: median {median:.3} s over {runs} runs, {total} spans, {:.2} µs a span",
        median * 1e6 / total.max(1) as f64
    );

    // Held between passes: the last STEP_MS of arrivals joined into what was held. "Now" is
    // the scope's latest start (`mixed` runs its scenarios' clusters one after another): a
    // span has arrived once it ended (later ones are not counted).
    let mut times = Vec::new();
    let mut added = 0;
    for run in 1..=runs {
        let mut held_scopes = Vec::new();
        for spans in scopes.values() {
            let mut held = HeldTimelines::new(HORIZON);
            let now = spans.iter().map(|span| span.start_unix_nano).max().unwrap_or_default();
            let (before, mut after): (Vec<&Span>, Vec<&Span>) = spans
                .iter()
                .filter(|span| span.end_unix_nano <= now)
                .partition(|span| span.end_unix_nano <= now - step);
            for span in before {
                held.insert(span.clone());
            }
            held.refresh();
            after.sort_by_key(|span| span.end_unix_nano);
            held_scopes.push((held, after.into_iter().cloned().collect::<Vec<Span>>()));
        }
        added = held_scopes.iter().map(|(_, after)| after.len()).sum::<usize>();
        if run == 1 {
            eprintln!("resident memory with the scopes held: {} MiB", resident_mib());
        }
        let started = Instant::now();
        let mut adding = std::time::Duration::ZERO;
        for (held, after) in &mut held_scopes {
            let adding_started = Instant::now();
            for span in after.drain(..) {
                held.insert(span);
            }
            held.keep_newest(SCOPE_LIMIT, None);
            adding += adding_started.elapsed();
            held.refresh();
            let timelines = held.take_timelines();
            held.give_back(timelines);
        }
        let elapsed = started.elapsed().as_secs_f64();
        eprintln!(
            "run {run}: {added} spans added to what was held in {:.4} s, joined in {elapsed:.4} s in all",
            adding.as_secs_f64()
        );
        times.push(elapsed);
        if run == 1 {
            for (held, _) in &mut held_scopes {
                let spans: Vec<Span> = held.spans().cloned().collect();
                let timelines = held.take_timelines();
                anyhow::ensure!(timelines == build_timelines(&spans, HORIZON), "held timelines differ from a new join");
                held.give_back(timelines);
            }
        }
    }
    times.sort_by(f64::total_cmp);
    let held_median = times[times.len() / 2];
    println!(
        "held timelines, {} ms of arrivals ({added} spans): median {held_median:.4} s over {runs} runs, {:.1}x less than joining anew",
        step / 1_000_000,
        median / held_median.max(1e-9)
    );
    Ok(())
}

/// The process's resident memory (Linux), MiB.
fn resident_mib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|line| line.starts_with("VmRSS:"))
                .and_then(|line| line.split_whitespace().nth(1).and_then(|kib| kib.parse::<u64>().ok()))
        })
        .map_or(0, |kib| kib / 1024)
}
