//! What the live analyzer's two span caches ([`crate::scope_cache`], [`crate::client_cache`])
//! share: when an entry is let go, how much one catch-up reads, and the budget.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

use lagscope_model::Span;
use lagscope_store::{SpanFeed, StoreError};

/// The most spans one catch-up reads; when more were committed since the last one, every
/// held entry is let go instead (and read anew when next passed): a stall longer than that
/// is cheaper read anew per entry than as one text of everything committed since.
pub const CATCH_UP_LIMIT: usize = 100_000;

/// An entry not passed for this long is let go (a scope or client is passed whenever it gets
/// telemetry, so it has gone quiet).
pub const IDLE_AFTER: Duration = Duration::from_secs(120);

/// Everything committed between two span ids, as one catch-up read it ([`SpanFeed::spans_between`],
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

/// A cache entry: how much it holds (spans, or samples) and when it was last passed.
pub trait Held {
    fn size(&self) -> usize;
    fn last_passed(&self) -> Instant;
}

/// The first step of a catch-up: lets go of entries not passed for [`IDLE_AFTER`], and of
/// every entry if span ids went back below `through` (they do not come back, [`SpanFeed`];
/// a store replaced underneath would break that). Returns the store's latest span id.
pub async fn start_catch_up<K, V: Held>(
    entries: &mut HashMap<K, V>,
    through: i64,
    feed: &dyn SpanFeed,
    now: Instant,
    cache: &str,
) -> Result<i64, StoreError> {
    entries.retain(|_, held| now.duration_since(held.last_passed()) < IDLE_AFTER);
    let latest = feed.latest_span_id().await?;
    if latest < through {
        tracing::warn!(latest, through, cache, "span ids went back; the cache starts again");
        entries.clear();
    }
    Ok(latest)
}

/// Lets entries go, least recently passed first, until they hold at most `budget` (spans, or
/// samples); returns what they hold.
pub fn shed<K: Clone + Eq + Hash, V: Held>(entries: &mut HashMap<K, V>, budget: usize) -> usize {
    let mut held: usize = entries.values().map(Held::size).sum();
    while held > budget {
        let oldest = entries.iter().min_by_key(|(_, entry)| entry.last_passed()).map(|(key, _)| key.clone());
        let Some(entry) = oldest.and_then(|oldest| entries.remove(&oldest)) else { break };
        held -= entry.size();
    }
    held
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
