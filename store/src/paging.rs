//! Reading a time-ordered table (`Store::spans_in_range`, `samples_in_range`, `logs`) a page
//! at a time ([`Pager`]), and ahead of whoever takes its rows ([`Ahead`]): pages read and
//! decoded by tasks of the runtime while the caller works on the rows before them.
//!
//! One table's pages are read one after the other (the next starts at the last row of the one
//! before), so the spans, which cost most to read (the store's query, then the parsing), are
//! cut into consecutive slices of time ([`spans_ahead`]), read by several tasks in turn and
//! handed over in order.

use std::collections::VecDeque;
use std::sync::Arc;

use lagscope_model::{LogRecord, Sample, Span};
use tokio::sync::mpsc::{Receiver, channel};

use crate::{Result, Store, StoreError, TimeRange};

/// Rows read per query.
pub const PAGE: u32 = 10_000;

/// Reads every row of `range` that a time-ordered range read returns (`Store::spans_in_range`,
/// `samples_in_range`, `logs`), a page at a time. The next page starts at the last row's time
/// and skips the rows of that time already seen (range reads order rows totally, so the same
/// rows come first again); a page all of one instant is read again twice as large.
pub struct Pager {
    from: i64,
    to: i64,
    /// Rows at `from` already handed out.
    skip: usize,
    limit: u32,
    done: bool,
}

impl Pager {
    pub fn new(range: TimeRange) -> Self {
        Self { from: range.from, to: range.to, skip: 0, limit: PAGE, done: false }
    }

    /// The next rows in the table's order; empty once every row was handed out.
    pub async fn next<T, Page: Future<Output = Result<Vec<T>>>>(
        &mut self,
        mut fetch: impl FnMut(TimeRange, u32) -> Page,
        time_of: impl Fn(&T) -> i64,
    ) -> Result<Vec<T>> {
        while !self.done {
            let page = fetch(TimeRange { from: self.from, to: self.to }, self.limit).await?;
            let full = page.len() >= self.limit as usize;
            let last = page.last().map(&time_of);
            let at_last = page.iter().rev().take_while(|row| Some(time_of(row)) == last).count();
            if full && at_last == page.len() {
                self.limit = self.limit.checked_mul(2).ok_or(StoreError::InstantTooLarge)?;
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

/// Pages read ahead, at most, per task.
pub const PAGES_AHEAD: usize = 2;

/// A slice of the spans is cut to hold about this many pages, judged by the first page.
const PAGES_PER_SLICE: i64 = 4;

/// At most this many slices, whatever the data's density (a store of a busy hour and a
/// stray span a year older is cut into slices of a year over this, not of four pages).
const MAX_SLICES: i64 = 1024;

/// One table's rows as its reading tasks hand them over, in the table's order.
pub struct Ahead<T> {
    what: &'static str,
    /// The rows received and not taken yet.
    pub rows: VecDeque<T>,
    /// Each task's pages: slice `k` comes from `pages[k % pages.len()]`, ended by an empty page.
    pages: Vec<Receiver<Result<Vec<T>>>>,
    /// The slice being received, and how many there are.
    slice: usize,
    slices: usize,
}

impl<T: Send + 'static> Ahead<T> {
    /// Starts `readers` tasks on the current runtime reading `slices` (consecutive ranges, in
    /// order) a page at a time: slice `k` by task `k % readers`, each at most [`PAGES_AHEAD`]
    /// pages ahead. `what` names the rows in errors.
    pub fn spawn<Page: Future<Output = Result<Vec<T>>> + Send + 'static>(
        what: &'static str,
        slices: Vec<TimeRange>,
        readers: usize,
        fetch: impl FnMut(TimeRange, u32) -> Page + Clone + Send + 'static,
        time_of: impl Fn(&T) -> i64 + Clone + Send + Sync + 'static,
    ) -> Self {
        let readers = readers.clamp(1, slices.len().max(1));
        let count = slices.len();
        let pages = (0..readers)
            .map(|reader| {
                let (sender, received) = channel(PAGES_AHEAD);
                let mine: Vec<TimeRange> = slices.iter().copied().skip(reader).step_by(readers).collect();
                let (mut fetch, time_of) = (fetch.clone(), time_of.clone());
                tokio::spawn(async move {
                    for slice in mine {
                        let mut pager = Pager::new(slice);
                        loop {
                            let page = pager.next(&mut fetch, &time_of).await;
                            let (last, failed) = (matches!(&page, Ok(rows) if rows.is_empty()), page.is_err());
                            // (Nobody receiving: the reader stopped early, on an error of its own.)
                            if sender.send(page).await.is_err() || failed {
                                return;
                            }
                            if last {
                                break;
                            }
                        }
                    }
                });
                received
            })
            .collect();
        Self { what, rows: VecDeque::new(), pages, slice: 0, slices: count }
    }

    /// Rows already read: handed over as they are, with nothing more to come.
    pub fn ready(what: &'static str, rows: Vec<T>) -> Self {
        Self { what, rows: rows.into(), pages: Vec::new(), slice: 0, slices: 0 }
    }

    /// Receives the next rows once those received are all taken (none after the last slice).
    pub async fn refill(&mut self) -> Result<()> {
        while self.rows.is_empty() && self.slice < self.slices {
            let readers = self.pages.len();
            match self.pages[self.slice % readers].recv().await {
                Some(Ok(page)) if page.is_empty() => self.slice += 1,
                Some(Ok(page)) => self.rows = page.into(),
                Some(Err(error)) => return Err(error),
                None => return Err(StoreError::ReadStopped { what: self.what }),
            }
        }
        Ok(())
    }
}

/// The spans of `cluster`/`namespace` (`None`: any) in `range`, read ahead by `readers` tasks
/// on the current runtime: the first page read here, then the rest in slices of about
/// [`PAGES_PER_SLICE`] pages each as dense as the first page, at most [`MAX_SLICES`] up to
/// `last` (the latest time the store held), the last slice open to `range.to` (for rows stored
/// since).
pub async fn spans_ahead(
    store: Arc<dyn Store>,
    cluster: Option<String>,
    namespace: Option<String>,
    range: TimeRange,
    last: i64,
    readers: usize,
) -> Result<Ahead<Span>> {
    let mut first_page = store.spans_in_range(cluster.as_deref(), namespace.as_deref(), range, PAGE).await?;
    if first_page.len() < PAGE as usize {
        return Ok(Ahead::ready("spans", first_page));
    }
    let (first, page_end) = (first_page[0].start_unix_nano, first_page[first_page.len() - 1].start_unix_nano);
    // The page holds every span of the range before its last instant: those are handed over as
    // they are, and the slices start at that instant (whose spans it may not hold all of).
    first_page.truncate(first_page.partition_point(|span| span.start_unix_nano < page_end));
    let slices = slices(TimeRange { from: page_end, to: range.to }, (first, page_end), last);
    let fetch = move |range, limit| {
        let (store, cluster, namespace) = (store.clone(), cluster.clone(), namespace.clone());
        async move { store.spans_in_range(cluster.as_deref(), namespace.as_deref(), range, limit).await }
    };
    let mut ahead = Ahead::spawn("spans", slices, readers, fetch, |span: &Span| span.start_unix_nano);
    ahead.rows = first_page.into();
    Ok(ahead)
}

/// The metric samples of every scope in `range`, read ahead by one task on the current
/// runtime.
pub fn samples_ahead(store: Arc<dyn Store>, range: TimeRange) -> Ahead<Sample> {
    let fetch = move |range, limit| {
        let store = store.clone();
        async move { store.samples_in_range(None, None, range, limit).await }
    };
    Ahead::spawn("metric samples", vec![range], 1, fetch, |sample: &Sample| sample.time_unix_nano)
}

/// The log records in `range`, read ahead by one task on the current runtime.
pub fn logs_ahead(store: Arc<dyn Store>, range: TimeRange) -> Ahead<LogRecord> {
    let fetch = move |range, limit| {
        let store = store.clone();
        async move { store.logs(range, limit).await }
    };
    Ahead::spawn("log records", vec![range], 1, fetch, |log: &LogRecord| log.time_unix_nano)
}

/// [`spans_ahead`]'s slices of `range` once its first page is read, full: `first_page` is its
/// first and last rows' times (the slices' width is judged from them).
fn slices(range: TimeRange, (first, page_end): (i64, i64), last: i64) -> Vec<TimeRange> {
    let width = (page_end.saturating_sub(first).max(1).saturating_mul(PAGES_PER_SLICE))
        .max(last.saturating_sub(first) / MAX_SLICES + 1);
    let mut slices = Vec::new();
    let mut from = range.from;
    let mut to = first.saturating_add(width);
    while to < last.min(range.to) {
        slices.push(TimeRange { from, to });
        from = to;
        to = to.saturating_add(width);
    }
    slices.push(TimeRange { from, to: range.to });
    slices
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

    /// A table of `times` (in order) read ahead in `cut`'s slices by `readers` tasks, failing
    /// at the read that starts at `failing_from`: the rows received, then the error that ended
    /// them.
    async fn drain(
        times: Vec<i64>,
        cut: Vec<TimeRange>,
        readers: usize,
        failing_from: Option<i64>,
    ) -> (Vec<i64>, Option<String>) {
        let table = Arc::new(times);
        let fetch = move |range: TimeRange, limit: u32| {
            let table = table.clone();
            async move {
                if failing_from == Some(range.from) {
                    return Err(StoreError::Corrupt { what: "span", detail: format!("row at {}", range.from) });
                }
                let (from, to) =
                    (table.partition_point(|time| *time < range.from), table.partition_point(|time| *time < range.to));
                Ok(table[from..to].iter().copied().take(limit as usize).collect())
            }
        };
        let mut ahead = Ahead::spawn("spans", cut, readers, fetch, |time: &i64| *time);
        let mut rows = Vec::new();
        loop {
            if let Err(error) = ahead.refill().await {
                return (rows, Some(error.to_string()));
            }
            if ahead.rows.is_empty() {
                return (rows, None);
            }
            rows.extend(ahead.rows.drain(..));
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pages_read_ahead_come_in_order_whatever_the_slices_and_an_error_ends_them_by_name() {
        // Several pages, seven rows an instant (a page ends inside an instant's rows).
        let page = PAGE as i64;
        let times: Vec<i64> = (0..page * 10 + page / 2).map(|row| row / 7).collect();
        let end = times[times.len() - 1];
        let whole = vec![TimeRange::ALL];
        // Slices as the first page cuts them (four pages a slice: two, and the last), and a
        // thousand slices of a few instants each, the last half empty.
        let cut = slices(TimeRange::ALL, (times[0], times[PAGE as usize - 1]), end);
        assert_eq!(cut.len(), 3, "{cut:?}");
        let narrow = slices(TimeRange::ALL, (0, 0), end * 2);
        assert!(narrow.len() >= 1000, "{}", narrow.len());
        for (cut, readers) in [(&whole, 1), (&whole, 2), (&cut, 2), (&narrow, 2), (&narrow, 3)] {
            let (rows, error) = drain(times.clone(), cut.clone(), readers, None).await;
            assert!(rows == times && error.is_none(), "{readers}: {} of {} rows, {error:?}", rows.len(), times.len());
        }
        assert_eq!(drain(Vec::new(), whole.clone(), 1, None).await, (Vec::new(), None));
        // The second page's read (from the first page's last instant on) fails: the first
        // page's rows came, then the error, by name.
        let first = &times[..PAGE as usize];
        let second_from = first[first.len() - 1];
        let (rows, error) = drain(times.clone(), whole, 1, Some(second_from)).await;
        assert!(rows == first, "{} rows, {} expected", rows.len(), first.len());
        assert_eq!(error, Some(format!("stored span is corrupt: row at {second_from}")));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reading_task_that_dies_is_an_error_not_the_end_of_the_rows() {
        let fetch = |_: TimeRange, _: u32| async { panic!("a reading task's panic, on purpose") };
        let mut ahead = Ahead::<i64>::spawn("spans", vec![TimeRange::ALL], 1, fetch, |time: &i64| *time);
        let error = ahead.refill().await.expect_err("the task died");
        assert_eq!(error.to_string(), "the reading of the spans stopped before their last page");
    }

    #[test]
    fn slices_are_consecutive_cover_the_range_and_are_bounded_in_number() {
        let range = TimeRange { from: 100, to: 1_000_000 };
        for (first_page, last) in [((150, 160), 900), ((150, 150), 999_999), ((150, 160), 120)] {
            let cut = slices(range, first_page, last);
            assert_eq!(cut[0].from, range.from);
            assert_eq!(cut[cut.len() - 1].to, range.to);
            assert!(cut.windows(2).all(|pair| pair[0].to == pair[1].from && pair[0].from < pair[0].to));
            assert!(cut.len() as i64 <= MAX_SLICES + 1, "{}", cut.len());
        }
        // Ten per page: 40 a slice, from the first row on.
        let cut = slices(range, (150, 160), 900);
        assert_eq!((cut[0].to, cut[1].to), (190, 230));
        // Nothing stored past a slice's worth: one slice.
        assert_eq!(slices(range, (150, 160), 120), vec![range]);
    }
}
