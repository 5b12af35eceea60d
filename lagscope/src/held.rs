//! What the live analyzer's two span caches ([`crate::scope_cache`], [`crate::client_cache`])
//! share: when an entry is let go, how much one catch-up reads, the budget, and what is done
//! with spans too late for an entry.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::OnceLock;
use std::sync::mpsc::{self, Sender};
use std::time::{Duration, Instant};

use lagscope_model::{Span, UnixNanos};

/// The most spans one catch-up reads; when more were committed since the last one, every
/// held entry is let go instead (and read anew when next passed): a stall longer than that
/// is cheaper read anew per entry than as one text of everything committed since.
pub const CATCH_UP_LIMIT: usize = 100_000;

/// An entry not passed for this long is let go (a scope or client is passed whenever it gets
/// telemetry, so it has gone quiet).
pub const IDLE_AFTER: Duration = Duration::from_secs(120);

/// Everything committed between two span ids, as one catch-up read it ([`lagscope_store::SpanFeed::spans_between`],
/// the client cache's): the scope cache's catch-up takes its part of it from here instead of
/// reading and decoding those spans again.
#[derive(Debug)]
pub struct Committed {
    /// The spans have ids in `after..=through`: all of them, not a first `limit`.
    pub after: i64,
    pub through: i64,
    /// With their ids, ordered by start time, then id.
    pub spans: Vec<(i64, Span)>,
}

/// The spans that reached a cache's held entries too late for them
/// ([`lagscope_analyzer::HeldTimelines::is_late`]: what they belong to was let go, or judged
/// without them), and the entries let go for them, to be read anew from the store.
#[derive(Debug)]
pub struct LateSpans<K> {
    /// Late spans since the last [`LateSpans::take`].
    count: u64,
    /// The most any of them since the last [`LateSpans::take`] needed the
    /// settling to be to hold it ([`lagscope_analyzer::HeldTimelines::settling_to_hold`]).
    wanted: Option<UnixNanos>,
    /// Each entry let go for late spans, until it is passed: from when its anomalies may have
    /// changed ([`LateSpans::judged_from`]).
    reread_from: HashMap<K, UnixNanos>,
    /// A call id names one call for this long.
    horizon: UnixNanos,
}

impl<K: Eq + Hash + std::fmt::Debug> LateSpans<K> {
    pub fn new(horizon: UnixNanos) -> Self {
        Self { count: 0, wanted: None, reread_from: HashMap::new(), horizon }
    }

    /// `spans` late spans of `key`'s entry, the earliest starting at `earliest`, held had the
    /// settling been `to_hold` ([`lagscope_analyzer::HeldTimelines::settling_to_hold`]): the
    /// entry is to be let go, and read anew when passed.
    pub fn note(&mut self, key: K, spans: u64, earliest: UnixNanos, to_hold: UnixNanos) {
        tracing::debug!(entry = ?key, spans, earliest, settling_to_hold = to_hold, "late spans: read anew");
        self.count += spans;
        self.wanted = self.wanted.max(Some(to_hold));
        let from = earliest.saturating_sub(self.horizon.saturating_mul(2));
        let judged_from = self.reread_from.entry(key).or_insert(from);
        *judged_from = (*judged_from).min(from);
    }

    /// How many spans were late since the last call (the self-metrics' counter), and the
    /// settling the latest of them needed to be held (none: no span was late), for
    /// [`Settling::observe`].
    pub fn take(&mut self) -> (u64, Option<UnixNanos>) {
        (std::mem::take(&mut self.count), std::mem::take(&mut self.wanted))
    }

    /// For an entry let go for late spans (and so read anew), the time from which its
    /// anomalies may have changed: two horizons before the earliest late span (the call it
    /// belongs to starts within that, and only that call and later ones are judged by it).
    /// Its pass reports what ends from then on; what ended before was reported by the passes
    /// before, judged with the history they held, which a read anew, cut at its span limit,
    /// may not reach. Taken once, by the entry's pass.
    pub fn judged_from(&mut self, key: &K) -> Option<UnixNanos> {
        self.reread_from.remove(key)
    }
}

/// How far behind a held client's or scope's newest span its calls are settled
/// ([`lagscope_analyzer::HeldTimelines::settle`]): `live.settle_seconds`, widened when spans
/// arrive later than that, up to `live.max_settle_seconds`, and narrowed back, by half, after
/// [`NARROW_AFTER`] without late spans.
///
/// A late span costs its client's (or scope's) held timelines: they are let go and read anew
/// from the store, and while the lateness lasts (an exporter or collector that delivers later
/// than the settling) every pass does that for every client it reaches. Held that much longer,
/// such spans join their calls as on-time spans do, for the price of the seconds held and
/// judged again by each pass.
#[derive(Debug)]
pub struct Settling {
    /// `live.settle_seconds` and `live.max_settle_seconds`, in nanoseconds.
    base: UnixNanos,
    most: UnixNanos,
    /// What passes settle behind now.
    now: UnixNanos,
    /// When a span was last late, or the settling last narrowed.
    since: Instant,
}

/// Without late spans for this long, the settling narrows by half (towards
/// `live.settle_seconds`).
pub const NARROW_AFTER: Duration = Duration::from_secs(300);

impl Settling {
    /// Settling `base_seconds` behind the newest span, widened to at most `most_seconds`.
    pub fn new(base_seconds: i64, most_seconds: i64, now: Instant) -> Self {
        let base = base_seconds.max(0).saturating_mul(1_000_000_000);
        Self { base, most: most_seconds.saturating_mul(1_000_000_000).max(base), now: base, since: now }
    }

    /// How far behind the newest span the passes settle now, in nanoseconds (0: nothing is
    /// settled).
    pub fn after(&self) -> UnixNanos {
        self.now
    }

    /// [`Settling::after`] in whole seconds (the self-metrics' gauge).
    pub fn seconds(&self) -> u64 {
        u64::try_from(self.now / 1_000_000_000).unwrap_or(0)
    }

    /// After a catch-up whose latest late span would have been held by settling `wanted`
    /// behind the newest span ([`LateSpans::take`]; none: no span was late):
    /// widens the settling to that and a quarter more, and a second (whole seconds, at most
    /// `live.max_settle_seconds`), so that such spans are held from now on; or narrows it by
    /// half when no span was late for [`NARROW_AFTER`]. Says so in the log when it changes.
    pub fn observe(&mut self, wanted: Option<UnixNanos>, at: Instant) {
        if self.base == 0 {
            // Nothing is settled: nothing can be late.
            return;
        }
        let second = 1_000_000_000;
        let before = self.now;
        match wanted {
            Some(wanted) => {
                self.since = at;
                let wanted = seconds_up(wanted.saturating_add(wanted / 4).saturating_add(second));
                if wanted > self.most && before < self.most {
                    tracing::warn!(
                        wanted_seconds = wanted / second,
                        settle_seconds = self.most / second,
                        "spans arrive later than live.max_settle_seconds allows for: their clients and scopes are \
                         read anew from the store on each pass that gets them"
                    );
                }
                self.now = self.now.max(wanted.min(self.most));
            }
            None if self.now > self.base && at.duration_since(self.since) >= NARROW_AFTER => {
                self.since = at;
                self.now = seconds_up(self.now / 2).max(self.base);
            }
            None => {}
        }
        if self.now > before {
            tracing::info!(
                settle_seconds = self.now / second,
                "spans arrived later than the live analysis settles: it settles further behind the newest span"
            );
        } else if self.now < before {
            tracing::info!(
                settle_seconds = self.now / second,
                "no span arrived late for five minutes: the live analysis settles closer to the newest span"
            );
        }
    }
}

/// `nanos` (not negative) rounded up to whole seconds.
fn seconds_up(nanos: UnixNanos) -> UnixNanos {
    let second = 1_000_000_000;
    (nanos / second + UnixNanos::from(nanos % second > 0)).saturating_mul(second)
}

/// A cache entry: how much it holds (spans, or samples) and when it was last passed.
pub trait Held {
    fn size(&self) -> usize;
    fn last_passed(&self) -> Instant;
}

/// The first step of a catch-up to `latest` (a [`lagscope_store::SpanFeed::latest_span_id`] the pass read once
/// for both caches): lets go of entries not passed for [`IDLE_AFTER`], and of every entry if
/// span ids went back below `through` (they do not come back, [`lagscope_store::SpanFeed`]; a store replaced
/// underneath would break that).
pub fn start_catch_up<K: Send + 'static, V: Held + Send + 'static>(
    entries: &mut HashMap<K, V>,
    through: i64,
    latest: i64,
    now: Instant,
    cache: &str,
) {
    let_go_idle(entries, now);
    if latest < through {
        tracing::warn!(latest, through, cache, "span ids went back; the cache starts again");
        let_go_all(entries);
    }
}

/// Lets go of every entry (a cache starting again).
pub fn let_go_all<K: Send + 'static, V: Send + 'static>(entries: &mut HashMap<K, V>) {
    release(entries.drain().collect());
}

/// Lets go of the entries not passed for [`IDLE_AFTER`].
pub fn let_go_idle<K: Send + 'static, V: Held + Send + 'static>(entries: &mut HashMap<K, V>, now: Instant) {
    let idle: Vec<(K, V)> =
        entries.extract_if(|_, held| now.duration_since(held.last_passed()) >= IDLE_AFTER).collect();
    release(idle);
}

/// Lets entries go, least recently passed first, until they hold at most `budget` (spans, or
/// samples); returns what they hold.
pub fn shed<K: Clone + Eq + Hash + Send + 'static, V: Held + Send + 'static>(
    entries: &mut HashMap<K, V>,
    budget: usize,
) -> usize {
    let mut held: usize = entries.values().map(Held::size).sum();
    let mut gone = Vec::new();
    while held > budget {
        let oldest = entries.iter().min_by_key(|(_, entry)| entry.last_passed()).map(|(key, _)| key.clone());
        let Some(entry) = oldest.and_then(|oldest| entries.remove(&oldest)) else { break };
        held -= entry.size();
        gone.push(entry);
    }
    release(gone);
    held
}

/// Frees what a cache lets go of on a thread of its own, not in the pass that let it go.
///
/// A cache entry is a client's or scope's spans with the timelines they join into: many small
/// allocations. When a demo round's clients went quiet together, the pass that let them go
/// spent ~0.5 s in the client cache and ~0.3-0.4 s in the scope cache freeing them (a 900 s
/// run of `serve --demo`: its three passes over 0.8 s were those), and telemetry queued
/// behind that pass waited over the live analyzer's 1 s. Empty collections are dropped here
/// (nothing to free). If the thread cannot be started, or has stopped, the caller frees it.
pub fn release<T: Send + 'static>(gone: Vec<T>) {
    /// The thread's end of the channel: whatever is sent is dropped there.
    static RELEASER: OnceLock<Option<Sender<Box<dyn Send>>>> = OnceLock::new();
    if gone.is_empty() {
        return;
    }
    let releaser = RELEASER.get_or_init(|| {
        let (sender, receiver) = mpsc::channel::<Box<dyn Send>>();
        let started = std::thread::Builder::new()
            .name("cache-release".to_string())
            .spawn(move || receiver.into_iter().for_each(drop));
        started.ok().map(|_| sender)
    });
    if let Some(sender) = releaser {
        // A send that fails hands `gone` back inside its error, dropped here.
        let _ = sender.send(Box::new(gone));
    }
}

/// A deterministic stream of numbers for the caches' randomized tests.
#[cfg(test)]
pub struct Numbers(pub u64);

#[cfg(test)]
impl Numbers {
    pub fn below(&mut self, bound: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % bound
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread::{self, ThreadId};

    /// Says, when dropped, on which thread.
    struct Tells(Sender<ThreadId>);

    impl Drop for Tells {
        fn drop(&mut self) {
            let _ = self.0.send(thread::current().id());
        }
    }

    struct Entry {
        size: usize,
        last_passed: Instant,
        _tells: Tells,
    }

    impl Held for Entry {
        fn size(&self) -> usize {
            self.size
        }

        fn last_passed(&self) -> Instant {
            self.last_passed
        }
    }

    /// The threads `count` values were dropped on (waits for them: a value never dropped
    /// fails the test instead of hanging it).
    fn dropped_on(receiver: &mpsc::Receiver<ThreadId>, count: usize) -> Vec<ThreadId> {
        (0..count)
            .map(|_| receiver.recv_timeout(Duration::from_secs(60)).expect("a value let go was never freed"))
            .collect()
    }

    #[test]
    fn what_a_cache_lets_go_of_is_freed_but_not_by_the_pass() {
        let (sender, receiver) = mpsc::channel();
        release(vec![Tells(sender.clone()), Tells(sender)]);
        let here = thread::current().id();
        assert!(dropped_on(&receiver, 2).iter().all(|there| *there != here));
        release(Vec::<Tells>::new());
    }

    #[test]
    fn idle_entries_and_the_least_recently_passed_over_budget_are_let_go() {
        let (sender, receiver) = mpsc::channel();
        let start = Instant::now();
        let entry = |size, passed: Duration| Entry { size, last_passed: start + passed, _tells: Tells(sender.clone()) };
        let mut entries: HashMap<u32, Entry> = HashMap::from([
            (1, entry(10, Duration::ZERO)),
            (2, entry(20, Duration::from_secs(1))),
            (3, entry(30, Duration::from_secs(2))),
            (4, entry(40, Duration::from_secs(3))),
        ]);
        // At IDLE_AFTER past the first's pass, only the first has been idle that long.
        let_go_idle(&mut entries, start + IDLE_AFTER);
        let mut left: Vec<u32> = entries.keys().copied().collect();
        left.sort_unstable();
        assert_eq!(left, [2, 3, 4]);
        assert_ne!(dropped_on(&receiver, 1), [thread::current().id()]);
        // 90 held, 70 allowed: the least recently passed (2, 20) leaves, and that is enough.
        assert_eq!(shed(&mut entries, 70), 70);
        let mut left: Vec<u32> = entries.keys().copied().collect();
        left.sort_unstable();
        assert_eq!(left, [3, 4]);
        assert_ne!(dropped_on(&receiver, 1), [thread::current().id()]);
        assert_eq!(shed(&mut entries, 70), 70, "nothing more to shed");
        assert!(receiver.try_recv().is_err(), "only what was let go is freed");
    }

    const SECOND: UnixNanos = 1_000_000_000;

    /// The most any late span of a catch-up needed the settling to be, and none when no span
    /// was late.
    #[test]
    fn late_spans_tell_the_settling_they_needed_once() {
        let mut late: LateSpans<&str> = LateSpans::new(90 * SECOND);
        assert_eq!(late.take(), (0, None));
        late.note("a", 2, 100 * SECOND, 13 * SECOND);
        late.note("b", 1, 150 * SECOND, 0);
        late.note("a", 1, 120 * SECOND, 17 * SECOND);
        assert_eq!(late.take(), (4, Some(17 * SECOND)));
        assert_eq!(late.take(), (0, None), "taken");
        late.note("b", 1, 150 * SECOND, 0);
        assert_eq!(late.take(), (1, Some(0)), "a span late by nothing is still late");
        // Judged from two horizons before each entry's earliest late span.
        assert_eq!(late.judged_from(&"a"), Some(100 * SECOND - 180 * SECOND));
        assert_eq!(late.judged_from(&"a"), None);
    }

    /// Late spans widen the settling to what they needed and a quarter more, plus a second,
    /// in whole seconds, up to the most allowed (the same spans told twice widen it once); five
    /// minutes without any narrow it by half, never below the base. A base of 0 (nothing
    /// settled) never widens; a most below the base keeps it fixed.
    #[test]
    fn the_settling_widens_for_late_spans_and_narrows_back_without_them() {
        let start = Instant::now();
        let mut settling = Settling::new(10, 120, start);
        assert_eq!((settling.after(), settling.seconds()), (10 * SECOND, 10));
        settling.observe(None, start + NARROW_AFTER);
        assert_eq!(settling.seconds(), 10, "nothing late, nothing to narrow");
        // Held by 30 s: 30 + 7.5 + 1, up to a whole second.
        settling.observe(Some(30 * SECOND), start);
        assert_eq!(settling.seconds(), 39);
        settling.observe(Some(30 * SECOND), start);
        assert_eq!(settling.seconds(), 39, "the same lateness told by the other cache");
        // Needing less than it settles by (a span whose hops a settle before the widening let
        // go): no change.
        settling.observe(Some(12 * SECOND), start);
        assert_eq!(settling.seconds(), 39);
        settling.observe(Some(36 * SECOND), start);
        assert_eq!(settling.seconds(), 46);
        // Not narrowed before five minutes without late spans, then by half, then to the base.
        settling.observe(None, start + NARROW_AFTER - Duration::from_secs(1));
        assert_eq!(settling.seconds(), 46);
        settling.observe(None, start + NARROW_AFTER);
        assert_eq!(settling.seconds(), 23);
        settling.observe(None, start + NARROW_AFTER * 2 - Duration::from_secs(1));
        assert_eq!(settling.seconds(), 23, "five minutes from the last narrowing");
        settling.observe(None, start + NARROW_AFTER * 2);
        assert_eq!(settling.seconds(), 12);
        settling.observe(None, start + NARROW_AFTER * 3);
        assert_eq!(settling.seconds(), 10, "not below the base");
        // Very late: capped.
        settling.observe(Some(1_000 * SECOND), start);
        assert_eq!(settling.seconds(), 120);
        // Nothing settled: nothing widens. A most below the base: fixed at the base.
        let mut never = Settling::new(0, 120, start);
        never.observe(Some(30 * SECOND), start);
        assert_eq!(never.after(), 0);
        let mut fixed = Settling::new(10, 0, start);
        fixed.observe(Some(30 * SECOND), start);
        assert_eq!(fixed.seconds(), 10);
    }
}
