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
                // In 128 bits: a time and a range's start may be anywhere in 64 (telemetry's
                // times are the senders', and `from` may be the earliest time there is).
                let (from, width) = (i128::from(self.from_unix_nano), i128::from(step.saturating_mul(1_000_000_000)));
                let bucket = from + (i128::from(time) - from).div_euclid(width) * width;
                i64::try_from(bucket).unwrap_or(if bucket < 0 { i64::MIN } else { i64::MAX })
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

#[cfg(test)]
mod tests {
    use super::LagQuery;

    fn query(from_unix_nano: i64, step_seconds: i64) -> LagQuery {
        LagQuery {
            cluster: None,
            namespace: None,
            from_unix_nano,
            to_unix_nano: i64::MAX,
            step_seconds: Some(step_seconds),
        }
    }

    #[test]
    fn buckets_start_at_the_range_start_in_steps() {
        let minute = query(1_000_000_000_000, 60);
        assert_eq!(minute.bucket_of(1_000_000_000_000), 1_000_000_000_000);
        assert_eq!(minute.bucket_of(1_059_999_999_999), 1_000_000_000_000);
        assert_eq!(minute.bucket_of(1_060_000_000_000), 1_060_000_000_000);
        // Before the range's start: the bucket before it.
        assert_eq!(minute.bucket_of(999_999_999_999), 940_000_000_000);
    }

    #[test]
    fn buckets_of_times_anywhere_in_64_bits() {
        // A range from the earliest time there is, and a time a sender made up at the other end.
        // (2^64 - 1 ns after i64::MIN, in whole seconds: 18 446 744 073 of them.)
        assert_eq!(query(i64::MIN, 1).bucket_of(i64::MAX), 9_223_372_036_145_224_192);
        assert_eq!(query(i64::MAX, 1).bucket_of(i64::MIN), i64::MIN);
        // A step of i64::MAX seconds: one bucket from 0 up to i64::MAX ns, the next from there.
        assert_eq!(query(0, i64::MAX).bucket_of(i64::MAX - 1), 0);
        assert_eq!(query(0, i64::MAX).bucket_of(i64::MAX), i64::MAX);
    }
}
