//! Streaming analysis: compact records, the `lscap` capture format, and an engine whose
//! memory is bounded by what is in flight and by per-client state, not by history.
//!
//! The engine runs the per-attempt detectors listed in [`STREAMED_KINDS`]; their anomalies
//! are built by the batch detectors' own constructors and must equal the batch path's.

pub mod codec;
mod engine;
mod intern;
mod record;

pub use engine::{Engine, EngineStats, STREAMED_KINDS};
pub use intern::{Interner, Sym, known};
pub use record::{SpanKey, SpanRec};
