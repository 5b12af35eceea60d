//! OTLP metric requests to domain samples.

use std::collections::BTreeMap;

use lagscope_model::{ExponentialBuckets, HistogramPoint, MetricKind, PointValue, Sample, SeriesKey, SeriesMeta};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{self as proto, metric::Data, number_data_point};

use super::attributes::{key_values_to_json, label_text};
use super::{Converted, Rejection, unix_nanos};

/// OTLP's AggregationTemporality: 1 delta, 2 cumulative.
const TEMPORALITY_DELTA: i32 = 1;

/// Converts every data point of a request to a sample. A point without a value or with a
/// time out of range is rejected alone, with a message naming it.
pub fn samples_from_request(request: &ExportMetricsServiceRequest) -> Converted<Sample> {
    let mut converted = Converted::default();
    for (resource_index, resource_metrics) in request.resource_metrics.iter().enumerate() {
        let resource_labels =
            labels_of(resource_metrics.resource.as_ref().map_or(&[][..], |resource| &resource.attributes[..]));
        for (scope_index, scope_metrics) in resource_metrics.scope_metrics.iter().enumerate() {
            let mut base_labels = resource_labels.clone();
            add_scope_labels(&mut base_labels, scope_metrics.scope.as_ref());
            for (metric_index, metric) in scope_metrics.metrics.iter().enumerate() {
                // (Written only for a point refused: most are not.)
                let path =
                    || format!("resourceMetrics[{resource_index}].scopeMetrics[{scope_index}].metrics[{metric_index}]");
                convert_metric(metric, &base_labels, &path, &mut converted);
            }
        }
    }
    converted
}

fn convert_metric(
    metric: &proto::Metric,
    base_labels: &BTreeMap<String, String>,
    path: &dyn Fn() -> String,
    out: &mut Converted<Sample>,
) {
    let Some(data) = &metric.data else {
        out.rejections.push(Rejection { path: path(), message: format!("metric {:?} has no data", metric.name) });
        return;
    };
    let meta = |kind| SeriesMeta {
        kind,
        unit: Some(metric.unit.clone()).filter(|unit| !unit.is_empty()),
        description: Some(metric.description.clone()).filter(|text| !text.is_empty()),
    };
    let mut push =
        |index: usize, attributes: &[KeyValue], start: u64, time: u64, kind, value: Result<PointValue, String>| {
            let sample = value.and_then(|value| {
                Ok(Sample {
                    series: SeriesKey { name: metric.name.clone(), labels: merged_labels(base_labels, attributes) }
                        .into(),
                    meta: meta(kind).into(),
                    time_unix_nano: unix_nanos(time, "timeUnixNano")?,
                    start_time_unix_nano: Some(unix_nanos(start, "startTimeUnixNano")?).filter(|start| *start != 0),
                    value,
                })
            });
            match sample {
                Ok(sample) => out.items.push(sample),
                Err(message) => {
                    out.rejections.push(Rejection { path: format!("{}.dataPoints[{index}]", path()), message })
                }
            }
        };
    match data {
        Data::Gauge(gauge) => {
            for (index, point) in gauge.data_points.iter().enumerate() {
                let value = number_value(point, &metric.name);
                push(
                    index,
                    &point.attributes,
                    point.start_time_unix_nano,
                    point.time_unix_nano,
                    MetricKind::Gauge,
                    value,
                );
            }
        }
        Data::Sum(sum) => {
            let kind = match (sum.is_monotonic, sum.aggregation_temporality) {
                (false, _) => MetricKind::UpDownCounter,
                (true, TEMPORALITY_DELTA) => MetricKind::DeltaCounter,
                (true, _) => MetricKind::CumulativeCounter,
            };
            for (index, point) in sum.data_points.iter().enumerate() {
                let value = number_value(point, &metric.name);
                push(index, &point.attributes, point.start_time_unix_nano, point.time_unix_nano, kind, value);
            }
        }
        Data::Histogram(histogram) => {
            for (index, point) in histogram.data_points.iter().enumerate() {
                let value = PointValue::Distribution(Box::new(HistogramPoint {
                    count: point.count,
                    sum: point.sum,
                    min: point.min,
                    max: point.max,
                    explicit_bounds: point.explicit_bounds.clone(),
                    bucket_counts: point.bucket_counts.clone(),
                    ..HistogramPoint::default()
                }));
                push(
                    index,
                    &point.attributes,
                    point.start_time_unix_nano,
                    point.time_unix_nano,
                    MetricKind::Histogram,
                    Ok(value),
                );
            }
        }
        Data::ExponentialHistogram(histogram) => {
            for (index, point) in histogram.data_points.iter().enumerate() {
                let positive = point.positive.as_ref();
                let negative = point.negative.as_ref();
                let value = PointValue::Distribution(Box::new(HistogramPoint {
                    count: point.count,
                    sum: point.sum,
                    min: point.min,
                    max: point.max,
                    exponential: Some(ExponentialBuckets {
                        scale: point.scale,
                        zero_count: point.zero_count,
                        zero_threshold: point.zero_threshold,
                        positive_offset: positive.map_or(0, |buckets| buckets.offset),
                        positive_counts: positive.map(|buckets| buckets.bucket_counts.clone()).unwrap_or_default(),
                        negative_offset: negative.map_or(0, |buckets| buckets.offset),
                        negative_counts: negative.map(|buckets| buckets.bucket_counts.clone()).unwrap_or_default(),
                    }),
                    ..HistogramPoint::default()
                }));
                push(
                    index,
                    &point.attributes,
                    point.start_time_unix_nano,
                    point.time_unix_nano,
                    MetricKind::ExponentialHistogram,
                    Ok(value),
                );
            }
        }
        Data::Summary(summary) => {
            for (index, point) in summary.data_points.iter().enumerate() {
                let value = PointValue::Distribution(Box::new(HistogramPoint {
                    count: point.count,
                    sum: Some(point.sum),
                    quantiles: point
                        .quantile_values
                        .iter()
                        .map(|quantile| (quantile.quantile, quantile.value))
                        .collect(),
                    ..HistogramPoint::default()
                }));
                push(
                    index,
                    &point.attributes,
                    point.start_time_unix_nano,
                    point.time_unix_nano,
                    MetricKind::Summary,
                    Ok(value),
                );
            }
        }
    }
}

fn number_value(point: &proto::NumberDataPoint, name: &str) -> Result<PointValue, String> {
    match point.value {
        Some(number_data_point::Value::AsDouble(value)) => Ok(PointValue::Number(value)),
        Some(number_data_point::Value::AsInt(value)) => Ok(PointValue::Number(value as f64)),
        None => Err(format!("data point of {name:?} has neither asDouble nor asInt")),
    }
}

fn labels_of(attributes: &[KeyValue]) -> BTreeMap<String, String> {
    key_values_to_json(attributes).iter().map(|(key, value)| (key.clone(), label_text(value))).collect()
}

/// Scope name, version and attributes become `otel.scope.*` labels, as Prometheus' OTLP
/// translation does, so that nothing the sender said is lost.
fn add_scope_labels(labels: &mut BTreeMap<String, String>, scope: Option<&InstrumentationScope>) {
    let Some(scope) = scope else { return };
    if !scope.name.is_empty() {
        labels.insert("otel.scope.name".to_string(), scope.name.clone());
    }
    if !scope.version.is_empty() {
        labels.insert("otel.scope.version".to_string(), scope.version.clone());
    }
    for (key, value) in labels_of(&scope.attributes) {
        labels.insert(format!("otel.scope.{key}"), value);
    }
}

/// Resource labels overlaid with the data point's (the data point wins).
fn merged_labels(base: &BTreeMap<String, String>, attributes: &[KeyValue]) -> BTreeMap<String, String> {
    let mut labels = base.clone();
    labels.extend(labels_of(attributes));
    labels
}
