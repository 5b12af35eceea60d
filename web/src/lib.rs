//! lagscope's HTTP API: anomalies, client timelines, lag analytics, health and the service's own metrics.
//!
//! Handlers read through the [`Store`](lagscope_store::Store) trait and the analyzer's pure
//! functions; they never write telemetry. Every parameter is validated and answered with a
//! JSON error naming it; every value reaches SQL bound, never spliced.

mod api;
mod enrichment;
mod error;
mod lag;
mod prometheus;
mod query;
mod time_param;
pub mod ui;

pub use api::{ApiState, router};
pub use enrichment::{MAX_ENRICHMENT_SAMPLES, enrich_timeline};
pub use error::ApiError;
pub use lag::{
    LAG_TURN_WAIT, LagAggregator, LagTurns, LoadedRows, MAX_LAG_SAMPLES, MAX_LAG_SPANS, RangeTelemetry, load_lag_rows,
    parse_step, read_range,
};
pub use query::OPENAPI;
pub use time_param::parse_time;
