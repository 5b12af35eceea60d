//! A store's time-ordered tables (`Store::spans_in_range`, `samples_in_range`, `logs`) read
//! and decoded by tasks of a runtime, a few pages ahead of the analysis that takes their rows
//! on a thread of its own.
//!
//! One table's pages are read one after the other (the next starts at the last row of the one
//! before), so a table that costs more to read than the analysis costs to run is cut into
//! consecutive slices of time, read by several tasks in turn and handed over in order.

use std::collections::VecDeque;

use anyhow::bail;
use lagscope_store::{Store, TimeRange};
use tokio::sync::mpsc::{Receiver, channel};

use crate::stored::{PAGE, Pager};

/// Pages read ahead of the analysis, at most, per task.
pub(crate) const PAGES_AHEAD: usize = 2;

/// A slice of the spans is cut to hold about this many pages, judged by the first page.
const PAGES_PER_SLICE: i64 = 4;

/// At most this many slices, whatever the data's density (a store of a busy hour and a
/// stray span a year older is cut into slices of a year over this, not of four pages).
const MAX_SLICES: i64 = 1024;

/// One table's rows as its reading tasks hand them over, in the table's order.
pub(crate) struct Ahead<T> {
    what: &'static str,
    /// The rows received and not taken yet.
    pub(crate) rows: VecDeque<T>,
    /// Each task's pages: slice `k` comes from `pages[k % pages.len()]`, ended by an empty page.
    pages: Vec<Receiver<anyhow::Result<Vec<T>>>>,
    /// The slice being received, and how many there are.
    slice: usize,
    slices: usize,
}

impl<T: Send + 'static> Ahead<T> {
    /// Starts `readers` tasks on the current runtime reading `slices` (consecutive ranges, in
    /// order) a page at a time: slice `k` by task `k % readers`, each at most [`PAGES_AHEAD`]
    /// pages ahead. `what` names the rows in errors.
    pub(crate) fn spawn<Page: Future<Output = lagscope_store::Result<Vec<T>>> + Send + 'static>(
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
                            // (Nobody receiving: the analysis ended early, on an error of its own.)
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

    /// Receives the next rows once those received are all taken (none after the last slice).
    pub(crate) async fn refill(&mut self) -> anyhow::Result<()> {
        while self.rows.is_empty() && self.slice < self.slices {
            let readers = self.pages.len();
            match self.pages[self.slice % readers].recv().await {
                Some(Ok(page)) if page.is_empty() => self.slice += 1,
                Some(Ok(page)) => self.rows = page.into(),
                Some(Err(error)) => return Err(error.context(format!("cannot read the {}", self.what))),
                None => bail!("the reading of the {} stopped before their last page", self.what),
            }
        }
        Ok(())
    }
}

/// The slices [`Ahead::spawn`] reads the spans of `range` in: about [`PAGES_PER_SLICE`] pages
/// each as dense as the first page (read here to tell), at most [`MAX_SLICES`] up to `last`
/// (the latest time the store held), the last slice open to `range.to` (for rows stored
/// since).
pub(crate) async fn span_slices(store: &dyn Store, range: TimeRange, last: i64) -> anyhow::Result<Vec<TimeRange>> {
    let first_page = store.spans_in_range(None, None, range, PAGE).await?;
    let (Some(first), Some(page_end)) = (first_page.first(), first_page.last()) else {
        return Ok(vec![range]);
    };
    let full = first_page.len() >= PAGE as usize;
    Ok(slices(range, full.then_some((first.start_unix_nano, page_end.start_unix_nano)), last))
}

/// [`span_slices`] once the first page is read: `first_page` is its first and last rows'
/// times when it was full (none: the range holds one page at most, read as one slice).
fn slices(range: TimeRange, first_page: Option<(i64, i64)>, last: i64) -> Vec<TimeRange> {
    let Some((first, page_end)) = first_page else { return vec![range] };
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
    use std::sync::Arc;

    use lagscope_store::StoreError;

    use super::*;

    /// A table of `times` (in order) read ahead in `cut`'s slices by `readers` tasks, failing at the read
    /// that starts at `failing_from`: the rows received, then the error that ended them.
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
                return (rows, Some(format!("{error:#}")));
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
        let cut = slices(TimeRange::ALL, Some((times[0], times[PAGE as usize - 1])), end);
        assert_eq!(cut.len(), 3, "{cut:?}");
        let narrow = slices(TimeRange::ALL, Some((0, 0)), end * 2);
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
        assert_eq!(error, Some(format!("cannot read the spans: stored span is corrupt: row at {second_from}")));
    }

    #[test]
    fn slices_are_consecutive_cover_the_range_and_are_bounded_in_number() {
        let range = TimeRange { from: 100, to: 1_000_000 };
        for (first_page, last) in
            [(Some((150, 160)), 900), (Some((150, 150)), 999_999), (None, 900), (Some((150, 160)), 120)]
        {
            let cut = slices(range, first_page, last);
            assert_eq!(cut[0].from, range.from);
            assert_eq!(cut[cut.len() - 1].to, range.to);
            assert!(cut.windows(2).all(|pair| pair[0].to == pair[1].from && pair[0].from < pair[0].to));
            assert!(cut.len() as i64 <= MAX_SLICES + 1, "{}", cut.len());
        }
        // Ten per page: 40 a slice, from the first row on.
        let cut = slices(range, Some((150, 160)), 900);
        assert_eq!((cut[0].to, cut[1].to), (190, 230));
        assert_eq!(slices(range, None, 900), vec![range]);
    }
}
