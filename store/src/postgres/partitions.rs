//! Daily time partitions of the large tables, created ahead of time.
//!
//! A partition covers one UTC day of Unix nanoseconds and is named `<table>_pYYYYMMDD`. The
//! store creates yesterday's to three days ahead at start-up, and before each ingest the days
//! the batch brings that lie within [`BACK_DAYS`] before and [`AHEAD_DAYS`] after today, so
//! that a hostile sender's timestamps cannot make it create thousands of tables: rows outside
//! that window land in the DEFAULT partition. Creation races between instances are harmless
//! (`IF NOT EXISTS`, and an error is checked against the catalog).

use std::collections::BTreeSet;
use std::sync::Mutex;

use sqlx::PgPool;

use crate::Result;

/// The partitioned tables and their partition keys.
pub const PARTITIONED_TABLES: [(&str, &str); 3] =
    [("spans", "start_unix_nano"), ("samples", "time_unix_nano"), ("logs", "time_unix_nano")];

pub(crate) const DAY_NANOS: i64 = 86_400 * 1_000_000_000;
/// How far back and ahead of today a batch's days get partitions of their own.
pub(crate) const BACK_DAYS: i64 = 35;
pub(crate) const AHEAD_DAYS: i64 = 7;

/// Days (since the Unix epoch) whose partitions exist or were attempted.
#[derive(Debug, Default)]
pub(crate) struct Partitions {
    done: Mutex<BTreeSet<i64>>,
}

/// The partition of `table` for `day` (days since 1970-01-01).
pub fn day_partition_name(table: &str, day: i64) -> String {
    let (year, month, date) = civil_from_days(day);
    format!("{table}_p{year:04}{month:02}{date:02}")
}

/// Today, in days since the epoch.
pub(crate) fn today() -> i64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(now.as_secs()).unwrap_or_default().div_euclid(86_400)
}

impl Partitions {
    /// A day whose partitions retention dropped: created again if data for it comes back.
    pub(crate) fn forget(&self, day: i64) {
        self.done.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&day);
    }

    pub(crate) async fn ensure_around_now(&self, pool: &PgPool) -> Result<()> {
        let today = today();
        for day in today - 1..=today + 3 {
            self.ensure_day(pool, day).await;
        }
        Ok(())
    }

    /// Creates the partitions for the days of `times` within the window around today.
    pub(crate) async fn ensure_for(&self, pool: &PgPool, times: impl Iterator<Item = i64>) {
        let today = today();
        let wanted: BTreeSet<i64> = {
            let done = self.done.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            times
                .map(|time| time.div_euclid(DAY_NANOS))
                .filter(|day| (today - BACK_DAYS..=today + AHEAD_DAYS).contains(day) && !done.contains(day))
                .collect()
        };
        for day in wanted {
            self.ensure_day(pool, day).await;
        }
    }

    async fn ensure_day(&self, pool: &PgPool, day: i64) {
        if self.done.lock().unwrap_or_else(std::sync::PoisonError::into_inner).contains(&day) {
            return;
        }
        for (table, _) in PARTITIONED_TABLES {
            let name = day_partition_name(table, day);
            let (from, to) = (day.saturating_mul(DAY_NANOS), (day + 1).saturating_mul(DAY_NANOS));
            // Only integers and our own table names reach this text.
            let statement =
                format!("CREATE TABLE IF NOT EXISTS {name} PARTITION OF {table} FOR VALUES FROM ({from}) TO ({to})");
            if let Err(error) = sqlx::query(sqlx::AssertSqlSafe(statement)).execute(pool).await {
                let exists: Option<(Option<String>,)> = sqlx::query_as("SELECT to_regclass($1)::text")
                    .bind(&name)
                    .fetch_optional(pool)
                    .await
                    .ok()
                    .flatten();
                if !matches!(exists, Some((Some(_),))) {
                    // Most often: the DEFAULT partition already holds rows of that day. They
                    // stay there; retention still removes them.
                    tracing::warn!(partition = %name, %error, "cannot create a partition; its rows go to the default partition");
                }
            }
        }
        self.done.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(day);
    }
}

/// The day of a partition named `<table>_pYYYYMMDD`, if `name` is one of `table`'s.
pub(crate) fn partition_day(table: &str, name: &str) -> Option<i64> {
    let date = name.strip_prefix(table)?.strip_prefix("_p")?;
    if date.len() != 8 || !date.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    let (year, month, day) = (date[..4].parse().ok()?, date[4..6].parse().ok()?, date[6..].parse().ok()?);
    let days = days_from_civil(year, month, day);
    (day_partition_name(table, days) == name).then_some(days)
}

/// Drops `table`'s daily partitions that end at or before `cutoff`, then deletes the older
/// rows of its DEFAULT partition in batches. Returns (rows deleted, partitions dropped).
pub(crate) async fn drop_before(
    pool: &PgPool,
    partitions: &Partitions,
    table: &str,
    key: &str,
    cutoff: i64,
) -> Result<(u64, Vec<String>)> {
    let children: Vec<(String,)> = sqlx::query_as(
        "SELECT child.relname::text FROM pg_inherits
         JOIN pg_class child ON child.oid = pg_inherits.inhrelid
         JOIN pg_class parent ON parent.oid = pg_inherits.inhparent
         WHERE parent.relname = $1 ORDER BY 1",
    )
    .bind(table)
    .fetch_all(pool)
    .await?;
    let mut dropped = Vec::new();
    for (name,) in children {
        let Some(day) = partition_day(table, &name) else { continue };
        if (day + 1).saturating_mul(DAY_NANOS) > cutoff {
            continue;
        }
        // `name` was checked to be exactly `<table>_pYYYYMMDD` above.
        sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE IF EXISTS {name}"))).execute(pool).await?;
        partitions.forget(day);
        dropped.push(name);
    }
    let statement = format!(
        "DELETE FROM {table}_default WHERE ctid = ANY(ARRAY(
             SELECT ctid FROM {table}_default WHERE {key} < $1 LIMIT $2))"
    );
    let mut deleted = 0;
    loop {
        let result = sqlx::query(sqlx::AssertSqlSafe(statement.clone()))
            .bind(cutoff)
            .bind(crate::RETENTION_BATCH_ROWS)
            .execute(pool)
            .await?;
        deleted += result.rows_affected();
        if result.rows_affected() < crate::RETENTION_BATCH_ROWS as u64 {
            return Ok((deleted, dropped));
        }
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
pub(crate) fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year.rem_euclid(400);
    let month = i64::from(month);
    let doy = (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// (year, month, day) of a day count since 1970-01-01 (Howard Hinnant's algorithm).
pub(crate) fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = u32::try_from(doy - (153 * mp + 2) / 5 + 1).unwrap_or(1);
    let month = u32::try_from(if mp < 10 { mp + 3 } else { mp - 9 }).unwrap_or(1);
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_names_are_utc_dates() {
        assert_eq!(day_partition_name("spans", 0), "spans_p19700101");
        assert_eq!(day_partition_name("logs", 20_454), "logs_p20260101");
        assert_eq!(day_partition_name("samples", 11_016), "samples_p20000229");
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        for day in [-800_000, -1, 0, 11_016, 20_454, 2_932_896] {
            let (year, month, date) = civil_from_days(day);
            assert_eq!(days_from_civil(year, month, date), day);
        }
        assert_eq!(partition_day("spans", "spans_p20260101"), Some(20_454));
        assert_eq!(partition_day("spans", "spans_default"), None);
        assert_eq!(partition_day("spans", "spans_p20261399"), None);
        assert_eq!(partition_day("logs", "spans_p20260101"), None);
    }
}
