//! Metric samples and the series they belong to.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::UnixNanos;

/// What kind of instrument produced a series.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MetricKind {
    Gauge,
    /// A monotonic counter whose points are running totals.
    CumulativeCounter,
    /// A monotonic counter whose points are increments since the previous point.
    DeltaCounter,
    /// A sum that may go down (OTLP non-monotonic sum).
    UpDownCounter,
    Histogram,
    ExponentialHistogram,
    Summary,
}

impl MetricKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Gauge => "gauge",
            Self::CumulativeCounter => "cumulative_counter",
            Self::DeltaCounter => "delta_counter",
            Self::UpDownCounter => "up_down_counter",
            Self::Histogram => "histogram",
            Self::ExponentialHistogram => "exponential_histogram",
            Self::Summary => "summary",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "gauge" => Self::Gauge,
            "cumulative_counter" => Self::CumulativeCounter,
            "delta_counter" => Self::DeltaCounter,
            "up_down_counter" => Self::UpDownCounter,
            "histogram" => Self::Histogram,
            "exponential_histogram" => Self::ExponentialHistogram,
            "summary" => Self::Summary,
            _ => return None,
        })
    }
}

/// A series' identity: its metric name and every label (resource attributes merged with the
/// data point's, the data point winning), values rendered as text.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SeriesKey {
    pub name: String,
    pub labels: BTreeMap<String, String>,
}

impl SeriesKey {
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).map(String::as_str)
    }
}

/// What is known about a series besides its identity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SeriesMeta {
    pub kind: MetricKind,
    pub unit: Option<String>,
    pub description: Option<String>,
}

/// A histogram data point (explicit or exponential buckets).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct HistogramPoint {
    pub count: u64,
    pub sum: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub explicit_bounds: Vec<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bucket_counts: Vec<u64>,
    /// Exponential histograms: scale, zero count and the positive/negative buckets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exponential: Option<ExponentialBuckets>,
    /// Summaries: (quantile, value) pairs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quantiles: Vec<(f64, f64)>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct ExponentialBuckets {
    pub scale: i32,
    pub zero_count: u64,
    pub zero_threshold: f64,
    pub positive_offset: i32,
    pub positive_counts: Vec<u64>,
    pub negative_offset: i32,
    pub negative_counts: Vec<u64>,
}

/// The value of one data point. A distribution is boxed: a [`HistogramPoint`] is ~200 bytes,
/// and inline it made every sample that size, numbers (nearly all of them) included; boxed, a
/// [`Sample`] is 56 bytes instead of 248 (what the analyzer, the live caches and `export` hold).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PointValue {
    Number(f64),
    Distribution(Box<HistogramPoint>),
}

impl PointValue {
    pub fn as_number(&self) -> Option<f64> {
        match self {
            Self::Number(value) => Some(*value),
            Self::Distribution(_) => None,
        }
    }
}

/// One data point of one series.
///
/// The series' identity and description are shared by its samples (`Arc`): a store read of a
/// scope's window gives thousands of samples of a few dozen series, and a copy of the labels
/// each was most of what reading them cost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub series: Arc<SeriesKey>,
    pub meta: Arc<SeriesMeta>,
    pub time_unix_nano: UnixNanos,
    pub start_time_unix_nano: Option<UnixNanos>,
    pub value: PointValue,
}
