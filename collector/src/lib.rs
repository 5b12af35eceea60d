//! lagscope's collectors: the receivers telemetry arrives through, and the pure decoders
//! that turn what they receive into the domain model.
//!
//! A receiver acknowledges data only after the store has committed it, and refuses a body it
//! cannot read whole with a message naming what was wrong, writing nothing of it. Decoders
//! (`otlp::decode`, `otlp::*_from_request`, `capture`) do no I/O of their own.

pub mod capture;
mod dirty;
mod error;
pub mod otlp;
pub mod queue;
pub mod scrape;

pub use dirty::{DirtyClients, Pending};
pub use error::DecodeError;
