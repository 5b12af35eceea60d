//! Series and sample rows.

use std::collections::BTreeMap;

use lagscope_model::conventions::{CLUSTER, NAMESPACE, NODE_ID};
use lagscope_model::{PointValue, Sample, SeriesKey, SeriesMeta};
use sqlx::{Sqlite, SqlitePool, Transaction};

use crate::rows::{
    BucketPointsRow, SampleRow, SeriesRow, point_value, series_identity, series_with_buckets, to_json_text,
};
use crate::{Reduce, Result, SeriesSamples, TimeRange, bucket_width};

/// Inserts samples, creating their series on first sight. A sample re-sent for the same
/// series and time replaces the stored one.
pub(super) async fn insert(transaction: &mut Transaction<'_, Sqlite>, samples: &[Sample]) -> Result<u64> {
    let mut series_ids: BTreeMap<&SeriesKey, i64> = BTreeMap::new();
    let mut written = 0;
    for sample in samples {
        let series_id = match series_ids.get(&*sample.series) {
            Some(id) => *id,
            None => {
                let id = upsert_series(transaction, &sample.series, &sample.meta).await?;
                series_ids.insert(&*sample.series, id);
                id
            }
        };
        let (value, distribution) = match &sample.value {
            PointValue::Number(number) => (Some(*number).filter(|number| number.is_finite()), None),
            PointValue::Distribution(point) => (None, Some(to_json_text(point))),
        };
        let result = sqlx::query(
            "INSERT INTO samples (series_id, time_unix_nano, start_time_unix_nano, value, distribution)
             VALUES (?, ?, ?, ?, ?)
             ON CONFLICT (series_id, time_unix_nano) DO UPDATE SET
                 start_time_unix_nano = excluded.start_time_unix_nano,
                 value = excluded.value,
                 distribution = excluded.distribution",
        )
        .bind(series_id)
        .bind(sample.time_unix_nano)
        .bind(sample.start_time_unix_nano)
        .bind(value)
        .bind(distribution)
        .execute(&mut **transaction)
        .await?;
        written += result.rows_affected();
    }
    Ok(written)
}

async fn upsert_series(transaction: &mut Transaction<'_, Sqlite>, key: &SeriesKey, meta: &SeriesMeta) -> Result<i64> {
    let (id,): (i64,) = sqlx::query_as(
        "INSERT INTO series (name, labels, kind, unit, description, cluster, namespace, node_id)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?)
         ON CONFLICT (name, labels) DO UPDATE SET
             kind = excluded.kind,
             unit = coalesce(excluded.unit, series.unit),
             description = coalesce(excluded.description, series.description)
         RETURNING id",
    )
    .bind(&key.name)
    .bind(to_json_text(&key.labels))
    .bind(meta.kind.as_str())
    .bind(&meta.unit)
    .bind(&meta.description)
    .bind(key.label(CLUSTER))
    .bind(key.label(NAMESPACE))
    .bind(key.label(NODE_ID))
    .fetch_one(&mut **transaction)
    .await?;
    Ok(id)
}

/// The series of a metric whose labels include every matcher, in id order.
async fn matching_series(pool: &SqlitePool, name: &str, matchers: &[(String, String)]) -> Result<Vec<SeriesRow>> {
    let matcher_object: BTreeMap<&str, &str> =
        matchers.iter().map(|(label, value)| (label.as_str(), value.as_str())).collect();
    // Every matcher must equal the series' label of the same key.
    Ok(sqlx::query_as(
        "SELECT id, name, labels, kind, unit, description FROM series
         WHERE name = ?1
           AND NOT EXISTS (
               SELECT 1 FROM json_each(?2) AS wanted
               WHERE json_extract(series.labels, '$.\"' || wanted.key || '\"') IS NOT wanted.value
           )
         ORDER BY id",
    )
    .bind(name)
    .bind(to_json_text(&matcher_object))
    .fetch_all(pool)
    .await?)
}

pub(super) async fn series_range(
    pool: &SqlitePool,
    name: &str,
    matchers: &[(String, String)],
    range: TimeRange,
) -> Result<Vec<SeriesSamples>> {
    let series_rows = matching_series(pool, name, matchers).await?;
    let ids = ids_json(&series_rows);
    // One row per series, its samples as one JSON array (see `series_buckets`).
    let rows: Vec<(i64, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT series_id,
                json_group_array(json_array(time_unix_nano, {VALUE_TEXT}, distribution) ORDER BY time_unix_nano)
         FROM samples
         WHERE series_id IN (SELECT value FROM json_each(?1)) AND time_unix_nano >= ?2 AND time_unix_nano < ?3
         GROUP BY series_id"
    )))
    .bind(ids)
    .bind(range.from)
    .bind(range.to)
    .fetch_all(pool)
    .await?;
    let mut by_series: std::collections::HashMap<i64, String> = rows.into_iter().collect();
    let mut result = Vec::with_capacity(series_rows.len());
    for row in series_rows {
        let samples = match by_series.remove(&row.id) {
            Some(text) => samples_of_json(row.id, &text)?,
            None => Vec::new(),
        };
        result.push(row.into_series(samples)?);
    }
    Ok(result)
}

/// The series' ids as a JSON array, for `json_each`.
fn ids_json(series: &[SeriesRow]) -> String {
    serde_json::json!(series.iter().map(|row| row.id).collect::<Vec<_>>()).to_string()
}

/// A sample's value as text that parses back to the same double: whole values as integers,
/// others at 17 significant digits (NULL stays NULL).
const VALUE_TEXT: &str = "CASE WHEN value IS NULL THEN NULL
     WHEN value = CAST(value AS INTEGER) THEN CAST(CAST(value AS INTEGER) AS TEXT)
     ELSE printf('%!.17g', value) END";

/// Samples from a JSON array of `[time, value text, distribution text]`.
fn samples_of_json(series_id: i64, text: &str) -> Result<Vec<SampleRow>> {
    let corrupt = |detail: String| crate::StoreError::Corrupt { what: "samples", detail };
    let triples: Vec<(i64, Option<String>, Option<String>)> =
        serde_json::from_str(text).map_err(|error| corrupt(format!("series {series_id} as JSON: {error}")))?;
    triples
        .into_iter()
        .map(|(time_unix_nano, value, distribution)| {
            let value = match value {
                Some(text) => Some(text.parse().map_err(|_| corrupt(format!("series {series_id}: value {text:?}")))?),
                None => None,
            };
            Ok(SampleRow { time_unix_nano, value, distribution })
        })
        .collect()
}

pub(super) async fn series_buckets(
    pool: &SqlitePool,
    name: &str,
    matchers: &[(String, String)],
    range: TimeRange,
    buckets: u32,
    reduce: Reduce,
) -> Result<Vec<SeriesSamples>> {
    let series_rows = matching_series(pool, name, matchers).await?;
    let Some(width) = bucket_width(range, buckets) else {
        return series_with_buckets(series_rows, Vec::new());
    };
    let ids = ids_json(&series_rows);
    // One row per series, its points as text (`time value,...`, values as `VALUE_TEXT`):
    // SQLite's driver costs microseconds a row, which for charts of tens of thousands of
    // points was most of a dashboard's time.
    let rows: Vec<BucketPointsRow> = match reduce {
        // A slice's last sample is one seek backwards from the slice's end on the primary key
        // (series, time): the cost is series times slices, however dense the samples are.
        Reduce::Last => {
            sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "WITH RECURSIVE slices(slice_end) AS (
                     SELECT ?2 + ?4 UNION ALL SELECT slice_end + ?4 FROM slices WHERE slice_end < ?3
                 ),
                 ids AS (SELECT value AS id FROM json_each(?1)),
                 points AS (
                 SELECT ids.id AS series_id, samples.time_unix_nano, samples.value
                 FROM slices JOIN ids JOIN samples
                   ON samples.series_id = ids.id
                  AND samples.time_unix_nano = (
                      SELECT max(time_unix_nano) FROM samples AS last
                      WHERE last.series_id = ids.id
                        AND last.time_unix_nano >= slices.slice_end - ?4
                        AND last.time_unix_nano < min(slices.slice_end, ?3)
                        AND last.value IS NOT NULL))
                 SELECT series_id, group_concat(time_unix_nano || ' ' || {VALUE_TEXT}, ',') AS points
                 FROM points GROUP BY series_id",
            )))
            .bind(ids)
            .bind(range.from)
            .bind(range.to)
            .bind(width)
            .fetch_all(pool)
            .await?
        }
        Reduce::Min | Reduce::Max => {
            let value = if reduce == Reduce::Min { "min(samples.value)" } else { "max(samples.value)" };
            // `value` is one of the two fragments above: nothing of the caller reaches the text.
            sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "WITH points AS (
                     SELECT series_id, max(time_unix_nano) AS time_unix_nano, {value} AS value FROM samples
                     WHERE series_id IN (SELECT value FROM json_each(?1))
                       AND time_unix_nano >= ?2 AND time_unix_nano < ?3 AND samples.value IS NOT NULL
                     GROUP BY series_id, (time_unix_nano - ?2) / ?4
                 )
                 SELECT series_id, group_concat(time_unix_nano || ' ' || {VALUE_TEXT}, ',') AS points
                 FROM points GROUP BY series_id"
            )))
            .bind(ids)
            .bind(range.from)
            .bind(range.to)
            .bind(width)
            .fetch_all(pool)
            .await?
        }
    };
    let mut points = Vec::new();
    for row in rows {
        row.append_to(&mut points)?;
    }
    series_with_buckets(series_rows, points)
}

/// Samples of `cluster`'s series naming `namespace` or none (`Namespaces::Every`: the series of
/// the given names in every namespace), from `window` before the latest of them on and from
/// `from` on, each with its series' id, in time order (samples of one time in series order).
///
/// One row per series, its samples as one JSON array: SQLite's driver costs microseconds a row,
/// and each row named its series again (its labels parsed again for every sample). The live
/// analyzer reads every busy scope's window of samples on each pass. The latest sample is
/// found series by series through the primary key: a `max` over the join walked the time index
/// back from the newest sample of any series, through the whole table when the scope had none
/// (a cluster without shard metrics, on every pass: 75 ms at 870 000 samples).
pub(super) async fn for_scope(
    pool: &SqlitePool,
    cluster: Option<&str>,
    namespaces: crate::Namespaces<'_>,
    window: i64,
    from: i64,
) -> Result<Vec<(i64, Sample)>> {
    let (namespace, names) = namespaces.binds();
    let rows: Vec<ScopeSeriesRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "WITH scope AS (
             SELECT id, name, labels, kind, unit, description FROM series
             WHERE cluster IS ?1
               AND CASE WHEN ?4 IS NULL THEN namespace IS ?2 OR namespace IS NULL
                        ELSE name IN (SELECT value FROM json_each(?4)) END
         ),
         latest AS (
             SELECT max((SELECT max(time_unix_nano) FROM samples WHERE series_id = scope.id)) AS at FROM scope
         )
         SELECT scope.id, scope.name, scope.labels, scope.kind, scope.unit, scope.description,
                json_group_array(json_array(samples.time_unix_nano, samples.start_time_unix_nano,
                                            {VALUE_TEXT}, samples.distribution)) AS points
         FROM samples JOIN scope ON scope.id = samples.series_id, latest
         WHERE samples.time_unix_nano >= max(latest.at - ?3, ?5)
         GROUP BY scope.id
         ORDER BY scope.id"
    )))
    .bind(cluster)
    .bind(namespace)
    .bind(window)
    .bind(names)
    .bind(from)
    .fetch_all(pool)
    .await?;
    in_time_order(rows)
}

/// A series of a scope with its samples of the window, as
/// `[[time, start time, value text, distribution text], ...]`.
#[derive(sqlx::FromRow)]
struct ScopeSeriesRow {
    id: i64,
    name: String,
    labels: String,
    kind: String,
    unit: Option<String>,
    description: Option<String>,
    points: String,
}

impl ScopeSeriesRow {
    fn append_to(self, samples: &mut Vec<(i64, Sample)>) -> Result<()> {
        let corrupt = |detail: String| crate::StoreError::Corrupt { what: "samples", detail };
        let (key, meta) = series_identity(self.name, &self.labels, &self.kind, self.unit, self.description)?;
        type Point = (i64, Option<i64>, Option<String>, Option<String>);
        let points: Vec<Point> = serde_json::from_str(&self.points)
            .map_err(|error| corrupt(format!("series {} as JSON: {error}", self.id)))?;
        samples.reserve(points.len());
        for (time_unix_nano, start_time_unix_nano, value, distribution) in points {
            let value = match value {
                Some(text) => Some(text.parse().map_err(|_| corrupt(format!("series {}: value {text:?}", self.id)))?),
                None => None,
            };
            let sample = Sample {
                series: key.clone(),
                meta: meta.clone(),
                time_unix_nano,
                start_time_unix_nano,
                value: point_value(value, distribution.as_deref())?,
            };
            samples.push((self.id, sample));
        }
        Ok(())
    }
}

/// Samples of series in `cluster`/`namespace` (`None` = any; a namespace also matches series
/// that name none) whose time lies in `range`, oldest first, at most `limit`.
pub(super) async fn in_range(
    pool: &SqlitePool,
    cluster: Option<&str>,
    namespace: Option<&str>,
    range: TimeRange,
    limit: u32,
) -> Result<Vec<Sample>> {
    let rows: Vec<ScopeSeriesRow> = sqlx::query_as(sqlx::AssertSqlSafe(picked_by_series(
        "(?1 IS NULL OR series.cluster = ?1)
           AND (?2 IS NULL OR series.namespace = ?2 OR series.namespace IS NULL)
           AND samples.time_unix_nano >= ?3 AND samples.time_unix_nano < ?4
         ORDER BY samples.time_unix_nano, samples.series_id LIMIT ?5",
    )))
    .bind(cluster)
    .bind(namespace)
    .bind(range.from)
    .bind(range.to)
    .bind(i64::from(limit))
    .fetch_all(pool)
    .await?;
    Ok(in_time_order(rows)?.into_iter().map(|(_, sample)| sample).collect())
}

/// Samples of the series named `names` whose time lies in `range`, oldest first, at most `limit`.
pub(super) async fn named_in_range(
    pool: &SqlitePool,
    names: &[&str],
    range: TimeRange,
    limit: u32,
) -> Result<Vec<Sample>> {
    let names = to_json_text(&names);
    let rows: Vec<ScopeSeriesRow> = sqlx::query_as(sqlx::AssertSqlSafe(picked_by_series(
        "series.name IN (SELECT value FROM json_each(?1))
           AND samples.time_unix_nano >= ?2 AND samples.time_unix_nano < ?3
         ORDER BY samples.time_unix_nano, samples.series_id LIMIT ?4",
    )))
    .bind(names)
    .bind(range.from)
    .bind(range.to)
    .bind(i64::from(limit))
    .fetch_all(pool)
    .await?;
    Ok(in_time_order(rows)?.into_iter().map(|(_, sample)| sample).collect())
}

/// The samples that `pick` (a condition on `samples` joined to `series`, with its order and
/// limit) picks, read a row per series: its columns once and its picked samples as one JSON
/// array ([`ScopeSeriesRow`]). A row per sample repeated its series' columns, each parsed
/// again into a series key, and sqlx hands SQLite's rows over one at a time: 223 420 samples
/// took 3.8 s.
fn picked_by_series(pick: &str) -> String {
    format!(
        "WITH picked AS (
             SELECT samples.series_id, samples.time_unix_nano, samples.start_time_unix_nano, samples.value,
                    samples.distribution
             FROM samples JOIN series ON series.id = samples.series_id
             WHERE {pick}
         )
         SELECT series.id, series.name, series.labels, series.kind, series.unit, series.description,
                json_group_array(json_array(picked.time_unix_nano, picked.start_time_unix_nano,
                                            {VALUE_TEXT}, picked.distribution)) AS points
         FROM picked JOIN series ON series.id = picked.series_id
         GROUP BY series.id"
    )
}

/// The samples of rows a series each ([`for_scope`], [`picked_by_series`]), with their series'
/// ids, by time, then series (a series' points come in no particular order: the aggregate
/// does not order them, which would sort every series' points once more).
fn in_time_order(rows: Vec<ScopeSeriesRow>) -> Result<Vec<(i64, Sample)>> {
    let mut samples = Vec::new();
    for row in rows {
        row.append_to(&mut samples)?;
    }
    samples.sort_unstable_by_key(|(series, sample)| (sample.time_unix_nano, *series));
    Ok(samples)
}
