//! lagscope's HTTP API: anomalies, client timelines, health and the service's own metrics.
//!
//! Handlers read through the [`Store`](lagscope_store::Store) trait and the analyzer's pure
//! functions; they never write telemetry. Every parameter is validated and answered with a
//! JSON error naming it; every value reaches SQL bound, never spliced.

mod api;
mod error;
mod time_param;

pub use api::{ApiState, router};
pub use error::ApiError;
pub use time_param::parse_time;
