//! The metric samples a client timeline is enriched from (`lagscope_analyzer::enrich`): the
//! applied state, committed state and role series of the timeline's cluster, over the time
//! its attempts cover (plus a minute before, for the value in force at the first attempt).
//! Three metrics read by series, not every sample of the namespace.

use lagscope_model::conventions::{CLUSTER, METRIC_APPLIED_STATE, METRIC_COMMITTED_STATE, METRIC_ROLE};
use lagscope_model::{ClientTimeline, PointValue, Sample};
use lagscope_store::{Store, StoreError, TimeRange};

/// Samples one timeline's enrichment reads at most.
pub const MAX_ENRICHMENT_SAMPLES: usize = 100_000;
/// How far before the first attempt the samples go.
const LOOKBACK: i64 = 60 * 1_000_000_000;

/// Fills `reported` on every attempt of `timeline` from the store's metrics.
pub async fn enrich_timeline(store: &dyn Store, timeline: &mut ClientTimeline) -> Result<(), StoreError> {
    let attempts = timeline.calls.iter().flat_map(|call| call.attempts.iter());
    let (first, last) = attempts.fold((i64::MAX, i64::MIN), |(first, last), attempt| {
        (first.min(attempt.start_unix_nano), last.max(attempt.start_unix_nano))
    });
    if first > last {
        return Ok(());
    }
    let matchers: Vec<(String, String)> =
        timeline.cluster.iter().map(|cluster| (CLUSTER.to_string(), cluster.clone())).collect();
    let range = TimeRange { from: first.saturating_sub(LOOKBACK), to: last.saturating_add(1) };
    let mut samples = Vec::new();
    'metrics: for metric in [METRIC_APPLIED_STATE, METRIC_COMMITTED_STATE, METRIC_ROLE] {
        for series in store.series_samples(metric, &matchers, range).await? {
            let (key, meta) = (std::sync::Arc::new(series.key), std::sync::Arc::new(series.meta));
            for (at, value, _) in &series.points {
                let Some(value) = value else { continue };
                if samples.len() >= MAX_ENRICHMENT_SAMPLES {
                    break 'metrics;
                }
                samples.push(Sample {
                    series: key.clone(),
                    meta: meta.clone(),
                    time_unix_nano: *at,
                    start_time_unix_nano: None,
                    value: PointValue::Number(*value),
                });
            }
        }
    }
    lagscope_analyzer::enrich(std::slice::from_mut(timeline), &samples);
    Ok(())
}
