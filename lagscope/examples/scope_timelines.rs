//! What joining a scope's spans into timelines costs: a measure for BENCHMARKS.md, not part of
//! lagscope.
//!
//! ```text
//! cargo run --release -p lagscope --example scope_timelines -- [SCENARIO] [SECONDS] [RUNS]
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

use std::collections::BTreeMap;
use std::time::Instant;

use lagscope_analyzer::AnalysisInput;
use lagscope_model::Span;
use lagscope_sim::emit::Request;

// The allocator `lagscope serve` runs with: the join allocates many small strings.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `live.max_spans_per_scope`'s default.
const SCOPE_LIMIT: usize = 50_000;
/// `analyzer.stream.horizon_seconds`' default.
const HORIZON: i64 = 90_000_000_000;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let scenario = args.next().unwrap_or_else(|| "mixed".to_string());
    let number = |text: Option<String>, default: i64, what: &str| -> anyhow::Result<i64> {
        text.map_or(Ok(default), |text| text.parse().map_err(|error| anyhow::anyhow!("{what} {text:?}: {error}")))
    };
    let seconds = number(args.next(), 120, "SECONDS")?;
    let runs = number(args.next(), 5, "RUNS")?.max(1);

    let simulating = Instant::now();
    let mut config = lagscope_sim::SimConfig::new(&scenario);
    config.duration = Some(seconds * lagscope_sim::SECOND);
    let mut requests: Vec<Request> = Vec::new();
    lagscope_sim::run(&config, &mut requests).map_err(|error| anyhow::anyhow!("simulating {scenario}: {error}"))?;
    let mut scopes: BTreeMap<(Option<String>, Option<String>), Vec<Span>> = BTreeMap::new();
    for request in &requests {
        if let Request::Traces(request) = request {
            for span in lagscope_collector::otlp::spans_from_request(request).items {
                scopes.entry((span.resource.cluster.clone(), span.call.namespace.clone())).or_default().push(span);
            }
        }
    }
    drop(requests);
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

    let mut times = Vec::new();
    for run in 1..=runs {
        let started = Instant::now();
        let mut calls = 0;
        for spans in scopes.values() {
            let refs: Vec<&Span> = spans.iter().collect();
            let input = AnalysisInput::from_span_refs(&refs, Vec::new(), HORIZON);
            calls += input.timelines.iter().map(|timeline| timeline.calls.len()).sum::<usize>();
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
    Ok(())
}
