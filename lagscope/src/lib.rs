//! The `lagscope` binary's library half: configuration, the `serve` wiring (receivers, live
//! analyzer, API over one store) and the offline commands (`analyze`, `eval`, `export`).
//!
//! This crate wires; it holds no domain logic. Integration tests start the same [`Server`]
//! the binary starts, in-process, on port 0.

pub mod alerting;
pub mod analyze;
pub mod auth;
mod client_cache;
pub mod config;
pub mod delivery;
pub mod dump;
pub mod eval;
pub mod export;
mod held;
mod line_cache;
mod live;
pub mod lscap;
pub mod migrate;
pub mod native_server;
pub mod output;
pub mod progress;
mod retention;
mod sample_cache;
mod scope_cache;
pub mod server;
pub mod sim_cmd;
mod stored;
pub mod tenants;

/// A throwaway PostgreSQL for the unit tests that need one (the store's test harness).
#[cfg(test)]
#[path = "../../store/tests/support/postgres.rs"]
mod postgres_support;

pub use config::Config;
pub use server::Server;
