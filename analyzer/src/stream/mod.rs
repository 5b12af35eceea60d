//! Streaming analysis: compact records, the `lscap` capture format, and an engine whose
//! memory is bounded by what is in flight and by per-client state, not by history.
//!
//! The engine runs the whole detector catalogue; its anomalies are built by the batch
//! detectors' own constructors and equal the batch path's.

mod client;
pub mod codec;
mod compact;
mod engine;
mod intern;
mod metrics;
mod namespace;
mod queue;
mod record;

pub use engine::{Engine, EngineStats};
pub use intern::{Interner, Sym, known};
pub use record::{SpanKey, SpanRec};

/// Deterministic pseudo-random numbers below a bound (xorshift from `seed`), for tests whose
/// failures must reproduce.
#[cfg(test)]
fn xorshift(mut seed: u64) -> impl FnMut(u64) -> u64 {
    move |bound| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % bound
    }
}
