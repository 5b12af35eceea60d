//! Rollups: per node and minute, how stale the reads it served were. The live analyzer writes
//! them as data arrives, so that a page showing the staleness of a range reads a few rows per
//! node and minute instead of every read of the range.
//!
//! Percentiles come from [`LogHistogram`]s, which merge exactly across minutes and nodes; a
//! percentile is then within 1/16 of the true value (values below 16 are exact). Counts and
//! maxima are exact.

use serde::{Deserialize, Serialize};

use crate::UnixNanos;

/// The width of one rollup: a minute.
pub const ROLLUP_STEP: UnixNanos = 60 * 1_000_000_000;

/// The start of the rollup step holding `at`.
pub fn rollup_step_of(at: UnixNanos) -> UnixNanos {
    at.div_euclid(ROLLUP_STEP) * ROLLUP_STEP
}

/// Sub-buckets per power of two above the exact range (and the size of the exact range).
const SUB_BUCKETS: u64 = 16;
const SUB_BITS: u32 = 4;

/// A histogram of non-negative integers on log-linear buckets: exact below 16, then 16
/// buckets per power of two, so the values sharing a bucket are within 1/16 of each other.
/// Stored sparse: `(bucket, count)` pairs in bucket order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LogHistogram {
    counts: Vec<(u32, u64)>,
}

fn bucket_of(value: u64) -> u32 {
    if value < SUB_BUCKETS {
        return value as u32;
    }
    let exponent = 63 - value.leading_zeros();
    let sub = (value >> (exponent - SUB_BITS)) & (SUB_BUCKETS - 1);
    (SUB_BUCKETS as u32) + (exponent - SUB_BITS) * (SUB_BUCKETS as u32) + sub as u32
}

/// The smallest and largest value of a bucket.
fn bucket_bounds(bucket: u32) -> (u64, u64) {
    if u64::from(bucket) < SUB_BUCKETS {
        return (u64::from(bucket), u64::from(bucket));
    }
    let above = bucket - SUB_BUCKETS as u32;
    let shift = above / SUB_BUCKETS as u32;
    let low = (SUB_BUCKETS + u64::from(above % SUB_BUCKETS as u32)) << shift;
    (low, low + ((1u64 << shift) - 1))
}

impl LogHistogram {
    pub fn record(&mut self, value: u64) {
        self.add(bucket_of(value), 1);
    }

    fn add(&mut self, bucket: u32, count: u64) {
        match self.counts.binary_search_by_key(&bucket, |(b, _)| *b) {
            Ok(index) => self.counts[index].1 += count,
            Err(index) => self.counts.insert(index, (bucket, count)),
        }
    }

    /// Adds every count of `other`.
    pub fn merge(&mut self, other: &LogHistogram) {
        for &(bucket, count) in &other.counts {
            self.add(bucket, count);
        }
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().map(|(_, count)| count).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// The value at quantile `q` (0..=1): the middle of the bucket holding the value of rank
    /// `q * (count - 1)`; `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = (q.clamp(0.0, 1.0) * (total - 1) as f64).floor() as u64;
        let mut seen = 0;
        for &(bucket, count) in &self.counts {
            seen += count;
            if seen > rank {
                let (low, high) = bucket_bounds(bucket);
                return Some((low as f64 + high as f64) / 2.0);
            }
        }
        None
    }
}

/// The reads one node served in one minute, and how far behind its namespace's committed
/// state they were.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReadRollup {
    pub cluster: Option<String>,
    pub namespace: Option<String>,
    pub node: Option<String>,
    /// The start of the minute ([`rollup_step_of`]).
    pub minute_unix_nano: UnixNanos,
    pub reads: u64,
    /// Reads for which the namespace's committed state was known (the histograms' count).
    pub compared: u64,
    /// Reads served behind the committed state.
    pub behind_reads: u64,
    /// How far behind, in states.
    pub behind_states: LogHistogram,
    /// How far behind, in milliseconds.
    pub behind_millis: LogHistogram,
    pub max_behind_states: Option<i64>,
    pub max_behind_seconds: Option<f64>,
}

impl ReadRollup {
    /// Adds another rollup's reads (of any minute or node) to this one.
    pub fn merge(&mut self, other: &ReadRollup) {
        self.reads += other.reads;
        self.compared += other.compared;
        self.behind_reads += other.behind_reads;
        self.behind_states.merge(&other.behind_states);
        self.behind_millis.merge(&other.behind_millis);
        self.max_behind_states = self.max_behind_states.max(other.max_behind_states);
        self.max_behind_seconds = match (self.max_behind_seconds, other.max_behind_seconds) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_exact_below_sixteen_and_within_a_sixteenth_above() {
        for value in (0..5_000u64).chain([1 << 20, (1 << 40) + 12_345, u64::MAX / 3]) {
            let (low, high) = bucket_bounds(bucket_of(value));
            assert!(low <= value && value <= high, "{value} in {low}..={high}");
            if value < 16 {
                assert_eq!((low, high), (value, value));
            } else {
                assert!((high - low) as f64 <= low as f64 / 16.0, "{value}: {low}..={high}");
            }
        }
        // Buckets follow the values' order.
        let buckets: Vec<u32> = (0..10_000u64).map(bucket_of).collect();
        assert!(buckets.windows(2).all(|pair| pair[0] <= pair[1]));
    }

    #[test]
    fn quantiles_of_merged_histograms_match_the_values_within_a_sixteenth() {
        let (mut first, mut second) = (LogHistogram::default(), LogHistogram::default());
        let values: Vec<u64> = (1..=1_000u64).map(|v| v * 37).collect();
        for (index, value) in values.iter().enumerate() {
            if index % 3 == 0 { first.record(*value) } else { second.record(*value) }
        }
        first.merge(&second);
        assert_eq!(first.count(), 1_000);
        for (q, exact) in [(0.5, values[499]), (0.99, values[989]), (1.0, values[999]), (0.0, values[0])] {
            let found = first.quantile(q).expect("values");
            assert!((found - exact as f64).abs() <= exact as f64 / 16.0, "q{q}: {found} against {exact}");
        }
        assert_eq!(LogHistogram::default().quantile(0.5), None);
        let json = serde_json::to_string(&first).expect("json");
        assert_eq!(serde_json::from_str::<LogHistogram>(&json).expect("back"), first);
    }

    #[test]
    fn steps_start_on_the_minute_also_before_1970() {
        assert_eq!(rollup_step_of(ROLLUP_STEP + 5), ROLLUP_STEP);
        assert_eq!(rollup_step_of(-5), -ROLLUP_STEP);
    }
}
