//! Aggregate lag analytics, as the API serves them (`GET /api/v1/lag`): per namespace, node
//! and time step, how far behind the committed state reads were served and followers applied,
//! and how many writes shards rejected per role.

use serde::{Deserialize, Serialize};

use crate::UnixNanos;

/// What to aggregate: a scope (absent = every cluster / namespace), a time range and a step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LagQuery {
    pub cluster: Option<String>,
    pub namespace: Option<String>,
    pub from_unix_nano: UnixNanos,
    pub to_unix_nano: UnixNanos,
    /// Bucket width; `None` puts the whole range in one bucket per group.
    pub step_seconds: Option<i64>,
}

impl LagQuery {
    /// The start of the bucket `time` falls in.
    pub fn bucket_of(&self, time: UnixNanos) -> UnixNanos {
        match self.step_seconds {
            Some(step) if step > 0 => {
                let width = step.saturating_mul(1_000_000_000);
                self.from_unix_nano + (time - self.from_unix_nano).div_euclid(width) * width
            }
            _ => self.from_unix_nano,
        }
    }
}

/// Percentiles of one quantity within a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

/// Reads served by one node of one namespace within one bucket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReadStalenessBucket {
    pub cluster: Option<String>,
    pub namespace: Option<String>,
    pub node: Option<String>,
    pub bucket_start_unix_nano: UnixNanos,
    /// Reads served (whether or not a committed state was known to compare them with).
    pub reads: u64,
    /// Reads served below the committed state known at the time.
    pub stale_reads: u64,
    /// Served vs committed at read time, over the reads a committed state was known for.
    pub behind_states: Option<Percentiles>,
    pub behind_seconds: Option<Percentiles>,
}

/// A follower's applied-vs-committed lag within one bucket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApplyLagBucket {
    pub cluster: Option<String>,
    pub namespace: Option<String>,
    pub node: Option<String>,
    pub bucket_start_unix_nano: UnixNanos,
    pub reports: u64,
    pub behind_states: Percentiles,
    pub behind_seconds: Percentiles,
}

/// Writes one shard rejected for one role within one bucket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RejectionBucket {
    pub cluster: Option<String>,
    pub namespace: Option<String>,
    pub node: Option<String>,
    pub role: String,
    pub bucket_start_unix_nano: UnixNanos,
    pub rejections: f64,
}

/// The answer to a [`LagQuery`]; rows ordered by group, then bucket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LagReport {
    pub query: LagQuery,
    pub reads: Vec<ReadStalenessBucket>,
    pub apply_lag: Vec<ApplyLagBucket>,
    pub rejections: Vec<RejectionBucket>,
}
