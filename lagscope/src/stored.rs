//! The offline commands' access to a store (`analyze`, `export`, `export --dump`, `import`):
//! opening it by `--data-dir` or `--database-url`, and reading a time-ordered table of it a
//! page at a time.

use std::path::Path;

use anyhow::{Context, bail};
use lagscope_store::{PgStore, SqliteStore, Store, TimeRange};

/// Rows read from the store per query.
pub(crate) const PAGE: u32 = 10_000;

/// The store at `database_url` (PostgreSQL) or in `data_dir` (SQLite), and how to name it in
/// messages. `missing`: when there is no SQLite store in `data_dir`, refuse with this advice
/// instead of creating an empty one.
pub(crate) async fn open(
    database_url: Option<&str>,
    data_dir: &Path,
    missing: Option<&str>,
) -> anyhow::Result<(String, Box<dyn Store>)> {
    match database_url {
        Some(url) => {
            let name = format!("PostgreSQL {}", lagscope_store::redact_url(url));
            let store = PgStore::connect(url).await.with_context(|| format!("cannot open {name}"))?;
            Ok((name, Box::new(store)))
        }
        None => {
            let file = data_dir.join(lagscope_store::sqlite_database_file());
            if let Some(advice) = missing
                && !file.exists()
            {
                bail!("no store at {} ({advice})", file.display());
            }
            let store = SqliteStore::open_dir(data_dir)
                .await
                .with_context(|| format!("cannot open the store in {}", data_dir.display()))?;
            Ok((file.display().to_string(), Box::new(store)))
        }
    }
}

/// The single-threaded runtime the offline commands run their store queries on.
pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().context("cannot start the async runtime")
}

/// A runtime whose tasks run on `threads` threads of their own (what `block_on` runs stays on
/// the calling thread).
pub(crate) fn runtime_on_threads(threads: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name("lagscope-read")
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// Reads every row of `range` that a time-ordered range read returns (`Store::spans_in_range`,
/// `samples_in_range`, `logs`), a page at a time. The next page starts at the last row's time
/// and skips the rows of that time already seen (range reads order rows totally, so the same
/// rows come first again); a page all of one instant is read again twice as large.
pub(crate) struct Pager {
    from: i64,
    to: i64,
    /// Rows at `from` already handed out.
    skip: usize,
    limit: u32,
    done: bool,
}

impl Pager {
    pub(crate) fn new(range: TimeRange) -> Self {
        Self { from: range.from, to: range.to, skip: 0, limit: PAGE, done: false }
    }

    /// The next rows in the table's order; empty once every row was handed out.
    pub(crate) async fn next<T, Page: Future<Output = lagscope_store::Result<Vec<T>>>>(
        &mut self,
        mut fetch: impl FnMut(TimeRange, u32) -> Page,
        time_of: impl Fn(&T) -> i64,
    ) -> anyhow::Result<Vec<T>> {
        while !self.done {
            let page = fetch(TimeRange { from: self.from, to: self.to }, self.limit).await?;
            let full = page.len() >= self.limit as usize;
            let last = page.last().map(&time_of);
            let at_last = page.iter().rev().take_while(|row| Some(time_of(row)) == last).count();
            if full && at_last == page.len() {
                self.limit = self.limit.checked_mul(2).context("more rows share one instant than one read can hold")?;
                continue;
            }
            let skip = self.skip;
            match last {
                Some(last) if full => {
                    self.from = last;
                    self.skip = at_last;
                }
                _ => self.done = true,
            }
            let rows: Vec<T> = page.into_iter().skip(skip).collect();
            if !rows.is_empty() {
                return Ok(rows);
            }
        }
        Ok(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table of `(time, row)` pairs read as a store reads it: rows of `range` in order, at
    /// most `limit`.
    fn fetch_from(table: &[(i64, u32)], range: TimeRange, limit: u32) -> Vec<(i64, u32)> {
        table.iter().copied().filter(|(time, _)| *time >= range.from && *time < range.to).take(limit as usize).collect()
    }

    async fn read_all(table: &[(i64, u32)], range: TimeRange) -> Vec<(i64, u32)> {
        let mut pager = Pager::new(range);
        pager.limit = 3;
        let mut rows = Vec::new();
        loop {
            let page = pager
                .next(async |range, limit| Ok(fetch_from(table, range, limit)), |row: &(i64, u32)| row.0)
                .await
                .expect("the table reads");
            if page.is_empty() {
                return rows;
            }
            rows.extend(page);
        }
    }

    #[tokio::test]
    async fn every_row_comes_once_in_order_whatever_the_page_boundaries() {
        // Runs of one instant shorter than, as long as and longer than a page of 3.
        let times = [1, 2, 2, 3, 3, 3, 4, 5, 5, 5, 5, 5, 5, 5, 6, 7, 7];
        let table: Vec<(i64, u32)> = times.iter().zip(0..).map(|(time, row)| (*time, row)).collect();
        assert_eq!(read_all(&table, TimeRange::ALL).await, table);
        let within: Vec<(i64, u32)> = table.iter().copied().filter(|(time, _)| (3..6).contains(time)).collect();
        assert_eq!(read_all(&table, TimeRange { from: 3, to: 6 }).await, within);
        assert!(read_all(&[], TimeRange::ALL).await.is_empty());
    }
}
