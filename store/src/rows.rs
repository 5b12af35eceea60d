//! Rows as both backends read them: one struct per table, column for column (sqlx's
//! `FromRow` derive is generic over the database), turned into domain types here. Private to
//! the store: the rest of the workspace sees only the model's types.

use std::collections::HashMap;

use lagscope_model::{
    Anomaly, AnomalyKind, CallFields, LogRecord, MetricKind, Op, Outcome, PointValue, Sample, SeriesKey, SeriesMeta,
    Severity, Span, SpanKind, StateFields,
};
use sqlx::FromRow;

use crate::{Result, StoreError, StoredAnomaly};

/// A stored span, column for column. Private: the rest of the workspace sees [`Span`].
/// Deserialized from a JSON array too, the fields in this order (SQLite's
/// [`crate::sqlite`] reads many spans as one JSON text: see `SPAN_JSON_ARRAY_WITH_IDS` there).
#[derive(FromRow, serde::Deserialize)]
pub(crate) struct SpanRow {
    pub(crate) trace_id: Option<String>,
    pub(crate) span_id: Option<String>,
    pub(crate) parent_span_id: Option<String>,
    pub(crate) name: String,
    pub(crate) kind: i32,
    pub(crate) start_unix_nano: i64,
    pub(crate) end_unix_nano: i64,
    pub(crate) status_code: i32,
    pub(crate) status_message: Option<String>,
    #[sqlx(flatten)]
    pub(crate) resource: ResourceRow,
    pub(crate) scope_name: Option<String>,
    pub(crate) scope_version: Option<String>,
    pub(crate) scope_attributes: String,
    pub(crate) client_id: Option<String>,
    pub(crate) call_id: Option<String>,
    pub(crate) attempt: Option<i64>,
    pub(crate) namespace: Option<String>,
    pub(crate) op: Option<String>,
    pub(crate) rpc_method: Option<String>,
    pub(crate) target_node: Option<String>,
    pub(crate) target_role: Option<String>,
    pub(crate) node_role: Option<String>,
    pub(crate) consistency: Option<String>,
    pub(crate) follower_read: Option<bool>,
    pub(crate) state_carried: Option<i64>,
    pub(crate) state_returned: Option<i64>,
    pub(crate) state_served: Option<i64>,
    pub(crate) state_committed: Option<i64>,
    pub(crate) state_router: Option<i64>,
    pub(crate) outcome: Option<String>,
    pub(crate) error_type: Option<String>,
    pub(crate) requeues: Option<i64>,
    pub(crate) retry_delay_ms: Option<i64>,
    pub(crate) bytes: Option<i64>,
    pub(crate) attributes: String,
    pub(crate) events: String,
    pub(crate) links: String,
}

impl SpanRow {
    pub(crate) fn into_span(self) -> Result<Span> {
        Ok(Span {
            trace_id: self.trace_id,
            span_id: self.span_id,
            parent_span_id: self.parent_span_id,
            name: self.name,
            kind: SpanKind::from_otlp(self.kind),
            start_unix_nano: self.start_unix_nano,
            end_unix_nano: self.end_unix_nano,
            status_code: self.status_code,
            status_message: self.status_message,
            resource: self.resource.into_fields("spans.resource_attributes")?,
            scope_name: self.scope_name,
            scope_version: self.scope_version,
            scope_attributes: from_json_text("spans.scope_attributes", &self.scope_attributes)?,
            call: CallFields {
                client_id: self.client_id,
                call_id: self.call_id,
                attempt: self.attempt,
                namespace: self.namespace,
                op: self.op.as_deref().map(Op::parse),
                rpc_method: self.rpc_method,
                target_node: self.target_node,
                target_role: self.target_role,
                node_role: self.node_role,
                consistency: self.consistency,
                follower_read: self.follower_read,
                state: StateFields {
                    carried: self.state_carried,
                    returned: self.state_returned,
                    served: self.state_served,
                    committed: self.state_committed,
                    router: self.state_router,
                },
                outcome: self.outcome.as_deref().map(Outcome::parse),
                error_type: self.error_type,
                requeues: self.requeues,
                retry_delay_ms: self.retry_delay_ms,
                bytes: self.bytes,
            },
            attributes: from_json_text("spans.attributes", &self.attributes)?,
            events: from_json_text("spans.events", &self.events)?,
            links: from_json_text("spans.links", &self.links)?,
        })
    }
}

/// The resource columns spans and log records share.
#[derive(FromRow, serde::Deserialize)]
pub(crate) struct ResourceRow {
    pub(crate) service_name: Option<String>,
    pub(crate) system: Option<String>,
    pub(crate) cluster: Option<String>,
    pub(crate) component: Option<String>,
    pub(crate) node_id: Option<String>,
    pub(crate) resource_attributes: String,
}

impl ResourceRow {
    /// `what` names the table in a corruption error.
    pub(crate) fn into_fields(self, what: &'static str) -> Result<lagscope_model::ResourceFields> {
        Ok(lagscope_model::ResourceFields {
            service_name: self.service_name,
            system: self.system,
            cluster: self.cluster,
            component: self.component.as_deref().map(lagscope_model::Component::parse),
            node_id: self.node_id,
            attributes: from_json_text(what, &self.resource_attributes)?,
        })
    }
}

/// Renders JSON for a TEXT column.
pub(crate) fn to_json_text<T: serde::Serialize>(value: &T) -> String {
    // Serializing plain data (maps, vectors, numbers, strings) to a String cannot fail.
    serde_json::to_string(value).unwrap_or_else(|_| "null".to_string())
}

/// Parses a JSON TEXT column back, naming the column when it is corrupt.
pub(crate) fn from_json_text<T: serde::de::DeserializeOwned>(what: &'static str, text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|error| StoreError::Corrupt { what, detail: error.to_string() })
}

#[derive(FromRow)]
pub(crate) struct SeriesRow {
    pub(crate) id: i64,
    pub(crate) name: String,
    pub(crate) labels: String,
    pub(crate) kind: String,
    pub(crate) unit: Option<String>,
    pub(crate) description: Option<String>,
}

#[derive(FromRow)]
pub(crate) struct SampleRow {
    pub(crate) time_unix_nano: i64,
    pub(crate) value: Option<f64>,
    pub(crate) distribution: Option<String>,
}

/// One point of a series cut into buckets.
#[derive(FromRow)]
pub(crate) struct BucketRow {
    pub(crate) series_id: i64,
    pub(crate) time_unix_nano: i64,
    pub(crate) value: Option<f64>,
}

/// One series' bucket points as `time value` pairs joined by commas, each value written as an
/// integer when whole, else with 17 significant digits (SQLite: one row per series instead of
/// one per point).
#[derive(FromRow)]
pub(crate) struct BucketPointsRow {
    pub(crate) series_id: i64,
    pub(crate) points: String,
}

impl BucketPointsRow {
    pub(crate) fn append_to(self, out: &mut Vec<BucketRow>) -> Result<()> {
        let what = format!("bucket points of series {}", self.series_id);
        for (time_unix_nano, value) in number_pairs(&self.points, &what)? {
            out.push(BucketRow { series_id: self.series_id, time_unix_nano, value: Some(value) });
        }
        Ok(())
    }
}

/// Pairs of numbers from SQLite's `group_concat(a || ' ' || b, ',')` text (one row for what
/// would be many: sqlx's SQLite driver costs microseconds a row); none from NULL or ''.
pub(crate) fn number_pairs<A: std::str::FromStr, B: std::str::FromStr>(text: &str, what: &str) -> Result<Vec<(A, B)>> {
    text.split(',')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            pair.split_once(' ')
                .and_then(|(first, second)| Some((first.parse().ok()?, second.parse().ok()?)))
                .ok_or_else(|| StoreError::Corrupt { what: "number pairs", detail: format!("{what}: {pair:?}") })
        })
        .collect()
}

/// The series with their bucket points, in the order of `series`.
pub(crate) fn series_with_buckets(series: Vec<SeriesRow>, points: Vec<BucketRow>) -> Result<Vec<crate::SeriesSamples>> {
    let mut by_series: std::collections::HashMap<i64, Vec<SampleRow>> = std::collections::HashMap::new();
    for point in points {
        by_series.entry(point.series_id).or_default().push(SampleRow {
            time_unix_nano: point.time_unix_nano,
            value: point.value,
            distribution: None,
        });
    }
    series
        .into_iter()
        .map(|row| {
            let mut samples = by_series.remove(&row.id).unwrap_or_default();
            samples.sort_by_key(|sample| sample.time_unix_nano);
            row.into_series(samples)
        })
        .collect()
}

/// A series' key and metadata from its stored columns (labels as canonical JSON text).
pub(crate) fn series_identity(
    name: String,
    labels: &str,
    kind: &str,
    unit: Option<String>,
    description: Option<String>,
) -> Result<(std::sync::Arc<SeriesKey>, std::sync::Arc<SeriesMeta>)> {
    let kind =
        MetricKind::parse(kind).ok_or_else(|| StoreError::Corrupt { what: "series.kind", detail: kind.to_string() })?;
    Ok((
        std::sync::Arc::new(SeriesKey { name, labels: from_json_text("series.labels", labels)? }),
        std::sync::Arc::new(SeriesMeta { kind, unit, description }),
    ))
}

/// A sample's value from its stored columns: a distribution as JSON text, else the number
/// (NULL for NaN).
pub(crate) fn point_value(value: Option<f64>, distribution: Option<&str>) -> Result<PointValue> {
    Ok(match distribution {
        Some(text) => PointValue::Distribution(from_json_text("samples.distribution", text)?),
        None => PointValue::Number(value.unwrap_or(f64::NAN)),
    })
}

/// A sample of a range read, without its series' columns (PostgreSQL: the series are read
/// apart, once each, [`samples_of_series`]; SQLite reads a range's samples a row per series,
/// `sqlite/samples.rs`).
#[derive(FromRow)]
pub(crate) struct RangeSampleRow {
    pub(crate) series_id: i64,
    pub(crate) time_unix_nano: i64,
    pub(crate) start_time_unix_nano: Option<i64>,
    pub(crate) value: Option<f64>,
    pub(crate) distribution: Option<String>,
}

/// The samples of `rows`, in their order, each with its series from `series` (which must hold
/// every series the rows name), the samples of one series sharing its key and meta: a range's
/// hundreds of thousands of samples of a few thousand series carry and parse each series'
/// labels once, not once a sample.
pub(crate) fn samples_of_series(rows: Vec<RangeSampleRow>, series: Vec<SeriesRow>) -> Result<Vec<Sample>> {
    let mut identities = HashMap::with_capacity(series.len());
    for row in series {
        identities.insert(row.id, series_identity(row.name, &row.labels, &row.kind, row.unit, row.description)?);
    }
    rows.into_iter()
        .map(|row| {
            let (key, meta) = identities.get(&row.series_id).ok_or_else(|| StoreError::Corrupt {
                what: "samples.series_id",
                detail: format!("series {} of a sample is not stored", row.series_id),
            })?;
            Ok(Sample {
                series: key.clone(),
                meta: meta.clone(),
                time_unix_nano: row.time_unix_nano,
                start_time_unix_nano: row.start_time_unix_nano,
                value: point_value(row.value, row.distribution.as_deref())?,
            })
        })
        .collect()
}

#[derive(FromRow)]
pub(crate) struct LogRow {
    pub(crate) time_unix_nano: i64,
    pub(crate) observed_time_unix_nano: Option<i64>,
    pub(crate) severity_number: i32,
    pub(crate) severity_text: Option<String>,
    pub(crate) body: String,
    pub(crate) event_name: Option<String>,
    pub(crate) trace_id: Option<String>,
    pub(crate) span_id: Option<String>,
    #[sqlx(flatten)]
    pub(crate) resource: ResourceRow,
    pub(crate) scope_name: Option<String>,
    pub(crate) scope_version: Option<String>,
    pub(crate) attributes: String,
}

impl LogRow {
    pub(crate) fn into_record(self) -> Result<LogRecord> {
        Ok(LogRecord {
            time_unix_nano: self.time_unix_nano,
            observed_time_unix_nano: self.observed_time_unix_nano,
            severity_number: self.severity_number,
            severity_text: self.severity_text,
            body: from_json_text("logs.body", &self.body)?,
            event_name: self.event_name,
            trace_id: self.trace_id,
            span_id: self.span_id,
            resource: self.resource.into_fields("logs.resource_attributes")?,
            scope_name: self.scope_name,
            scope_version: self.scope_version,
            attributes: from_json_text("logs.attributes", &self.attributes)?,
        })
    }
}

/// A log record's JSON columns and its identity, computed once for its insert.
pub(crate) struct LogColumns {
    pub(crate) body: String,
    pub(crate) resource_attributes: String,
    pub(crate) attributes: String,
    /// The first eight bytes of a SHA-256 over every field of the record (its times to the
    /// nanosecond, severity, body, ids, resource and scope), stored beside the record's time
    /// under a unique index: OTLP log records carry no ids, and a record identical to a stored
    /// one in every field is that record sent again (an exporter retrying a request whose
    /// acknowledgement it lost). A cryptographic digest, so that no sender can make another's
    /// record look like its own; fixed, so that every instance and version agrees on it.
    pub(crate) identity: i64,
}

impl LogColumns {
    pub(crate) fn of(record: &LogRecord) -> Self {
        let body = to_json_text(&record.body);
        let resource_attributes = to_json_text(&record.resource.attributes);
        let attributes = to_json_text(&record.attributes);
        let resource = &record.resource;
        let identity = LogFields {
            time_unix_nano: record.time_unix_nano,
            observed_time_unix_nano: record.observed_time_unix_nano,
            severity_number: record.severity_number,
            severity_text: record.severity_text.as_deref(),
            body: &body,
            event_name: record.event_name.as_deref(),
            trace_id: record.trace_id.as_deref(),
            span_id: record.span_id.as_deref(),
            service_name: resource.service_name.as_deref(),
            system: resource.system.as_deref(),
            cluster: resource.cluster.as_deref(),
            component: resource.component.as_ref().map(lagscope_model::Component::as_str),
            node_id: resource.node_id.as_deref(),
            resource_attributes: &resource_attributes,
            scope_name: record.scope_name.as_deref(),
            scope_version: record.scope_version.as_deref(),
            attributes: &attributes,
        }
        .identity();
        Self { body, resource_attributes, attributes, identity }
    }
}

/// A log record's columns as stored (its JSON as text): what its identity is a digest of, the
/// same whether computed for its insert or from a row stored without one.
pub(crate) struct LogFields<'a> {
    pub(crate) time_unix_nano: i64,
    pub(crate) observed_time_unix_nano: Option<i64>,
    pub(crate) severity_number: i32,
    pub(crate) severity_text: Option<&'a str>,
    pub(crate) body: &'a str,
    pub(crate) event_name: Option<&'a str>,
    pub(crate) trace_id: Option<&'a str>,
    pub(crate) span_id: Option<&'a str>,
    pub(crate) service_name: Option<&'a str>,
    pub(crate) system: Option<&'a str>,
    pub(crate) cluster: Option<&'a str>,
    pub(crate) component: Option<&'a str>,
    pub(crate) node_id: Option<&'a str>,
    pub(crate) resource_attributes: &'a str,
    pub(crate) scope_name: Option<&'a str>,
    pub(crate) scope_version: Option<&'a str>,
    pub(crate) attributes: &'a str,
}

impl LogFields<'_> {
    /// See [`LogColumns::identity`].
    pub(crate) fn identity(&self) -> i64 {
        use sha2::{Digest, Sha256};
        let mut digest = Sha256::new();
        // Every variable-length field with its presence and length in front, so that no two
        // different records write the same bytes.
        let mut field = |value: Option<&str>| match value {
            None => digest.update([0]),
            Some(text) => {
                digest.update([1]);
                digest.update((text.len() as u64).to_le_bytes());
                digest.update(text.as_bytes());
            }
        };
        field(self.severity_text);
        field(Some(self.body));
        field(self.event_name);
        field(self.trace_id);
        field(self.span_id);
        field(self.service_name);
        field(self.system);
        field(self.cluster);
        field(self.component);
        field(self.node_id);
        field(Some(self.resource_attributes));
        field(self.scope_name);
        field(self.scope_version);
        field(Some(self.attributes));
        digest.update(self.time_unix_nano.to_le_bytes());
        match self.observed_time_unix_nano {
            None => digest.update([0]),
            Some(observed) => {
                digest.update([1]);
                digest.update(observed.to_le_bytes());
            }
        }
        digest.update(self.severity_number.to_le_bytes());
        let hash = digest.finalize();
        let mut first = [0_u8; 8];
        first.copy_from_slice(&hash[..8]);
        i64::from_le_bytes(first)
    }
}

/// A log row with its key: for the store to give a row stored before log records had an
/// identity (SQLite migration 0013, PostgreSQL 0008) one, and for the log feed
/// ([`crate::SpanFeed::recognised_logs_after`]).
#[derive(FromRow)]
pub(crate) struct LogRowWithId {
    pub(crate) id: i64,
    #[sqlx(flatten)]
    pub(crate) row: LogRow,
}

impl LogRowWithId {
    /// The identity its insert would have given it (its columns are the text the insert wrote).
    pub(crate) fn identity(&self) -> i64 {
        let (row, resource) = (&self.row, &self.row.resource);
        LogFields {
            time_unix_nano: row.time_unix_nano,
            observed_time_unix_nano: row.observed_time_unix_nano,
            severity_number: row.severity_number,
            severity_text: row.severity_text.as_deref(),
            body: &row.body,
            event_name: row.event_name.as_deref(),
            trace_id: row.trace_id.as_deref(),
            span_id: row.span_id.as_deref(),
            service_name: resource.service_name.as_deref(),
            system: resource.system.as_deref(),
            cluster: resource.cluster.as_deref(),
            component: resource.component.as_deref(),
            node_id: resource.node_id.as_deref(),
            resource_attributes: &resource.resource_attributes,
            scope_name: row.scope_name.as_deref(),
            scope_version: row.scope_version.as_deref(),
            attributes: &row.attributes,
        }
        .identity()
    }
}

#[derive(FromRow)]
pub(crate) struct AnomalyRow {
    pub(crate) id: i64,
    pub(crate) fingerprint: String,
    pub(crate) kind: String,
    pub(crate) severity: String,
    pub(crate) cluster: Option<String>,
    pub(crate) namespace: Option<String>,
    pub(crate) client_id: Option<String>,
    pub(crate) node_id: Option<String>,
    pub(crate) start_unix_nano: i64,
    pub(crate) end_unix_nano: i64,
    pub(crate) summary: String,
    pub(crate) cause: String,
    pub(crate) evidence: String,
    pub(crate) first_seen_unix_nano: i64,
    pub(crate) last_seen_unix_nano: i64,
    pub(crate) open: bool,
    pub(crate) superseded_by: Option<i64>,
}

impl AnomalyRow {
    pub(crate) fn into_stored(self) -> Result<StoredAnomaly> {
        let kind = AnomalyKind::parse(&self.kind)
            .ok_or_else(|| StoreError::Corrupt { what: "anomalies.kind", detail: self.kind.clone() })?;
        let severity = Severity::parse(&self.severity)
            .ok_or_else(|| StoreError::Corrupt { what: "anomalies.severity", detail: self.severity.clone() })?;
        Ok(StoredAnomaly {
            id: self.id,
            anomaly: Anomaly {
                kind,
                severity,
                cluster: self.cluster,
                namespace: self.namespace,
                client_id: self.client_id,
                node_id: self.node_id,
                start_unix_nano: self.start_unix_nano,
                end_unix_nano: self.end_unix_nano,
                summary: self.summary,
                cause: self.cause,
                evidence: from_json_text("anomalies.evidence", &self.evidence)?,
                open: self.open,
                fingerprint: self.fingerprint,
            },
            first_seen_unix_nano: self.first_seen_unix_nano,
            last_seen_unix_nano: self.last_seen_unix_nano,
            superseded_by: self.superseded_by,
        })
    }
}

impl SeriesRow {
    /// The series with its points (a distribution's point as JSON).
    pub(crate) fn into_series(self, samples: Vec<SampleRow>) -> Result<crate::SeriesSamples> {
        let points = samples
            .into_iter()
            .map(|sample| {
                let distribution: Option<serde_json::Value> = sample
                    .distribution
                    .as_deref()
                    .map(|text| from_json_text("samples.distribution", text))
                    .transpose()?;
                Ok((sample.time_unix_nano, sample.value, distribution))
            })
            .collect::<Result<Vec<_>>>()?;
        let kind = MetricKind::parse(&self.kind)
            .ok_or_else(|| StoreError::Corrupt { what: "series.kind", detail: self.kind.clone() })?;
        Ok(crate::SeriesSamples {
            key: SeriesKey { name: self.name, labels: from_json_text("series.labels", &self.labels)? },
            meta: SeriesMeta { kind, unit: self.unit, description: self.description },
            points,
        })
    }
}

/// A read rollup as stored (absent scope parts as '').
#[derive(FromRow)]
pub(crate) struct RollupRow {
    pub(crate) minute_unix_nano: i64,
    pub(crate) cluster: String,
    pub(crate) namespace: String,
    pub(crate) node_id: String,
    pub(crate) reads: i64,
    pub(crate) compared: i64,
    pub(crate) behind_reads: i64,
    pub(crate) behind_states: String,
    pub(crate) behind_millis: String,
    pub(crate) max_behind_states: Option<i64>,
    pub(crate) max_behind_seconds: Option<f64>,
}

fn absent_as_empty(value: &Option<String>) -> String {
    value.clone().unwrap_or_default()
}

fn empty_as_absent(value: String) -> Option<String> {
    (!value.is_empty()).then_some(value)
}

impl RollupRow {
    pub(crate) fn from_rollup(rollup: &lagscope_model::ReadRollup) -> Self {
        RollupRow {
            minute_unix_nano: rollup.minute_unix_nano,
            cluster: absent_as_empty(&rollup.cluster),
            namespace: absent_as_empty(&rollup.namespace),
            node_id: absent_as_empty(&rollup.node),
            reads: rollup.reads as i64,
            compared: rollup.compared as i64,
            behind_reads: rollup.behind_reads as i64,
            behind_states: to_json_text(&rollup.behind_states),
            behind_millis: to_json_text(&rollup.behind_millis),
            max_behind_states: rollup.max_behind_states,
            max_behind_seconds: rollup.max_behind_seconds,
        }
    }

    pub(crate) fn into_rollup(self) -> Result<lagscope_model::ReadRollup> {
        Ok(lagscope_model::ReadRollup {
            cluster: empty_as_absent(self.cluster),
            namespace: empty_as_absent(self.namespace),
            node: empty_as_absent(self.node_id),
            minute_unix_nano: self.minute_unix_nano,
            reads: self.reads.max(0) as u64,
            compared: self.compared.max(0) as u64,
            behind_reads: self.behind_reads.max(0) as u64,
            behind_states: from_json_text("read_rollups.behind_states", &self.behind_states)?,
            behind_millis: from_json_text("read_rollups.behind_millis", &self.behind_millis)?,
            max_behind_states: self.max_behind_states,
            max_behind_seconds: self.max_behind_seconds,
        })
    }
}
