//! A priority queue for items released in time order as a watermark passes them (a calendar
//! queue): the engine's open calls by start, the routers' answers by start.
//!
//! Items land in buckets of [`BUCKET_NANOS`] by time; a bucket is sorted only when it comes
//! due, so pushing costs O(1) and popping O(log b) for a bucket of b items, instead of a
//! binary heap's O(log n) over tens of thousands of open calls with a cache miss per level.
//! Items earlier than the first bucket (late arrivals) join the first bucket; items beyond
//! the ring's reach (a clock far ahead) wait in an overflow heap. The order out is exactly a
//! binary heap's: ascending by the item's full `Ord`, whose leading key must be its time.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// Bucket width: 2^24 ns (~16.8 ms).
const BUCKET_SHIFT: u32 = 24;
pub(crate) const BUCKET_NANOS: i64 = 1 << BUCKET_SHIFT;
/// Buckets the ring holds at most (~18 minutes of data time); later items overflow.
const MAX_BUCKETS: i64 = 1 << 16;

/// An item's time, the leading key of its order.
pub(crate) trait Timed: Ord {
    fn time(&self) -> i64;
}

#[derive(Debug)]
pub(crate) struct TimeQueue<T: Timed> {
    /// Bucket number of `ring[0]`.
    base: i64,
    ring: VecDeque<Vec<T>>,
    /// Whether `ring[0]` is sorted (descending, so its minimum pops off the end).
    front_sorted: bool,
    overflow: BinaryHeap<Reverse<T>>,
    len: usize,
    /// Emptied buckets, kept for reuse.
    spare: Vec<Vec<T>>,
}

impl<T: Timed> Default for TimeQueue<T> {
    fn default() -> Self {
        Self {
            base: 0,
            ring: VecDeque::new(),
            front_sorted: false,
            overflow: BinaryHeap::new(),
            len: 0,
            spare: Vec::new(),
        }
    }
}

impl<T: Timed> TimeQueue<T> {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Inlined: an item passed to a call is built on the stack field by field and read back
    /// in wider loads, which no store forwards to: each waits for every store before it.
    #[inline(always)]
    pub(crate) fn push(&mut self, item: T) {
        self.len += 1;
        let bucket = item.time() >> BUCKET_SHIFT;
        if self.ring.is_empty() {
            self.base = bucket;
            self.front_sorted = false;
        }
        let offset = bucket.saturating_sub(self.base).max(0);
        if offset >= MAX_BUCKETS {
            self.overflow.push(Reverse(item));
            return;
        }
        let offset = offset as usize;
        while self.ring.len() <= offset {
            let spare = self.spare.pop().unwrap_or_default();
            self.ring.push_back(spare);
        }
        if offset == 0 {
            self.front_sorted = false;
        }
        self.ring[offset].push(item);
    }

    /// Removes and returns the least item if its time is at most `until`.
    pub(crate) fn pop_through(&mut self, until: i64) -> Option<T> {
        while let Some(front) = self.ring.front_mut() {
            if front.is_empty() {
                // Nothing in this bucket: move on, unless the next one lies beyond `until`
                // (its items are not due, and the ring would be walked for nothing).
                if (self.base + 1).saturating_mul(BUCKET_NANOS) > until && self.ring.len() > 1 {
                    break;
                }
                if let Some(empty) = self.ring.pop_front() {
                    self.spare.push(empty);
                }
                self.base += 1;
                self.front_sorted = false;
                continue;
            }
            if !self.front_sorted {
                front.sort_unstable_by(|a, b| b.cmp(a));
                self.front_sorted = true;
            }
            break;
        }
        let ring_least = self.ring.front().and_then(|front| front.last());
        let overflow_least = self.overflow.peek().map(|Reverse(item)| item);
        let from_ring = match (ring_least, overflow_least) {
            (None, None) => return None,
            (Some(ring), Some(overflow)) => ring <= overflow,
            (ring, _) => ring.is_some(),
        };
        let least = if from_ring { ring_least } else { overflow_least }?;
        if least.time() > until {
            return None;
        }
        self.len -= 1;
        if from_ring { self.ring.front_mut().and_then(Vec::pop) } else { self.overflow.pop().map(|Reverse(item)| item) }
    }
}

/// Records in arrival order, each at a place (a number that names it while it waits). Taking
/// one out leaves its place empty; empty places are dropped once at the front. Written one
/// after another and read back in nearly the same order, this memory is walked nearly in
/// order, which the processor's prefetchers follow: a block allocated per record (or per call,
/// or per trace) was one the allocator had freed long before, out of cache, written at random.
///
/// The places are kept in blocks of [`PLACES_PER_BLOCK`], a block released once the front has
/// passed it and reused for the next: the queue grows by a block at a time, never by copying
/// what it holds (a ring that doubled copied the client attempts held for the horizon, tens of
/// megabytes, each time it filled, and most of an analysis's early cache misses were those
/// copies).
#[derive(Debug)]
pub(crate) struct Places<T> {
    blocks: VecDeque<Block<T>>,
    /// A released block kept for the next (all its places empty).
    spare: Option<Block<T>>,
    /// The place of `blocks[0][0]`.
    base: u64,
    /// The first place not known to be empty, and the next place to give out.
    front: u64,
    end: u64,
    /// Items waiting (not taken).
    len: usize,
}

/// Places per block of [`Places`] (a power of two: the division is a shift).
const PLACES_PER_BLOCK: u64 = 512;

/// A block of [`Places`] (an array: the index, masked, needs no bounds check).
type Block<T> = Box<[Option<T>; PLACES_PER_BLOCK as usize]>;

impl<T> Default for Places<T> {
    fn default() -> Self {
        Self { blocks: VecDeque::new(), spare: None, base: 0, front: 0, end: 0, len: 0 }
    }
}

impl<T> Places<T> {
    /// Adds `item` at the back; returns its place.
    pub(crate) fn push(&mut self, item: T) -> u64 {
        let at = self.end;
        let (block, offset) = self.position(at);
        if block == self.blocks.len() {
            let fresh = self.spare.take().unwrap_or_else(|| {
                let empty: Box<[Option<T>]> = std::iter::repeat_with(|| None).take(PLACES_PER_BLOCK as usize).collect();
                empty.try_into().unwrap_or_else(|_| unreachable!("a block of PLACES_PER_BLOCK places"))
            });
            self.blocks.push_back(fresh);
        }
        self.blocks[block][offset] = Some(item);
        self.end += 1;
        self.len += 1;
        at
    }

    /// How many items wait.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The block and the index in it of place `at`, which must be at or past `base`.
    fn position(&self, at: u64) -> (usize, usize) {
        let index = at - self.base;
        ((index / PLACES_PER_BLOCK) as usize, (index % PLACES_PER_BLOCK) as usize)
    }

    /// [`Places::position`] of `at` if it is a place still held (from the front on).
    fn locate(&self, at: u64) -> Option<(usize, usize)> {
        (self.front..self.end).contains(&at).then(|| self.position(at))
    }

    /// The slot of place `at`, if it is one still held.
    fn slot(&mut self, at: u64) -> Option<&mut Option<T>> {
        let (block, offset) = self.locate(at)?;
        Some(&mut self.blocks[block][offset])
    }

    /// The place of the oldest item waiting (the next place when none waits).
    pub(crate) fn front_place(&self) -> u64 {
        self.front
    }

    /// The place the next item pushed will have.
    pub(crate) fn next_place(&self) -> u64 {
        self.end
    }

    /// The oldest item waiting, and its place.
    pub(crate) fn front(&self) -> Option<(u64, &T)> {
        Some((self.front, self.get(self.front)?))
    }

    /// The item at place `at`, unless it was taken.
    pub(crate) fn get(&self, at: u64) -> Option<&T> {
        let (block, offset) = self.locate(at)?;
        self.blocks[block][offset].as_ref()
    }

    pub(crate) fn get_mut(&mut self, at: u64) -> Option<&mut T> {
        self.slot(at)?.as_mut()
    }

    /// Takes the item at place `at` out.
    pub(crate) fn take(&mut self, at: u64) -> Option<T> {
        let item = self.slot(at)?.take();
        self.len -= usize::from(item.is_some());
        if at == self.front {
            // Past the empty places at the front, releasing each block passed.
            while self.front < self.end {
                let (block, offset) = self.position(self.front);
                if self.blocks[block][offset].is_some() {
                    break;
                }
                self.front += 1;
                if offset as u64 == PLACES_PER_BLOCK - 1 {
                    self.spare = self.blocks.pop_front();
                    self.base += PLACES_PER_BLOCK;
                }
            }
        }
        item
    }

    /// Blocks held (tests).
    #[cfg(test)]
    fn blocks(&self) -> usize {
        self.blocks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Items taken in any order: every place keeps naming its item until taken, a taken
    /// place reads empty, and the front is dropped only once empty (checked against a map of
    /// what should be there, over thousands of pushes and takes).
    #[test]
    fn places_name_their_items_until_taken() {
        let mut places = Places::default();
        let mut expected = std::collections::BTreeMap::new();
        let mut random = crate::stream::xorshift(7);
        let mut pushed = 0;
        for round in 0..20_000_u64 {
            if random(3) > 0 || expected.is_empty() {
                let at = places.push(round);
                assert_eq!(at, pushed, "places count up from 0");
                pushed += 1;
                expected.insert(at, round);
            } else {
                // Mostly near the front, as calls are processed.
                let pick = random(expected.len().min(8) as u64) as usize;
                let at = *expected.keys().nth(pick).expect("picked");
                assert_eq!(places.take(at), expected.remove(&at));
                assert_eq!(places.get(at), None);
                assert_eq!(places.take(at), None);
            }
            if round % 97 == 0 {
                for (at, item) in &expected {
                    assert_eq!(places.get(*at), Some(item));
                }
                assert_eq!(places.len(), expected.len());
                // The front is dropped up to the first item waiting, a block at a time.
                let first = expected.keys().next().copied().unwrap_or(pushed);
                assert_eq!(places.front, first, "front empty only when all are");
                assert_eq!(places.front(), expected.iter().next().map(|(at, item)| (*at, item)));
                let held = (pushed - places.base).div_ceil(PLACES_PER_BLOCK);
                assert_eq!(places.blocks() as u64, held);
                assert!(places.base <= first && first - places.base < PLACES_PER_BLOCK);
            }
        }
        if let Some((&at, _)) = expected.iter().next() {
            *places.get_mut(at).expect("waiting") += 1;
            assert_eq!(places.get(at), Some(&(expected[&at] + 1)));
        }
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
    struct Item(i64, u64);

    impl Timed for Item {
        fn time(&self) -> i64 {
            self.0
        }
    }

    /// Pushes and pops like the engine (times mostly rising, some late, some far ahead,
    /// negative ones, watermarks advancing), against a binary heap: the same items come out
    /// in the same order.
    #[test]
    fn releases_in_the_order_a_binary_heap_would() {
        let mut random = crate::stream::xorshift(0x2545_f491_4f6c_dd1d_u64);
        for base in [0_i64, -5_000_000_000, 1_700_000_000_000_000_000] {
            let mut queue = TimeQueue::default();
            let mut heap = BinaryHeap::new();
            let mut now = base;
            let mut sequence = 0;
            let mut out = (Vec::new(), Vec::new());
            for _ in 0..20_000 {
                now += random(3_000_000) as i64;
                for _ in 0..random(4) {
                    sequence += 1;
                    let time = match random(20) {
                        0 => now - random(200_000_000_000) as i64, // late
                        1 => now + random(1 << 45) as i64,         // far ahead
                        2 => now - (now - base) % BUCKET_NANOS,    // a bucket's start
                        _ => now - random(1_000_000_000) as i64,
                    };
                    queue.push(Item(time, sequence));
                    heap.push(Reverse(Item(time, sequence)));
                }
                let limit = now - random(90_000_000_000) as i64;
                while let Some(item) = queue.pop_through(limit - 1) {
                    out.0.push(item);
                }
                while heap.peek().is_some_and(|Reverse(item)| item.0 < limit) {
                    out.1.push(heap.pop().map(|Reverse(item)| item).expect("peeked"));
                }
                assert_eq!(queue.len(), heap.len());
            }
            while let Some(item) = queue.pop_through(i64::MAX) {
                out.0.push(item);
            }
            out.1.extend(std::iter::from_fn(|| heap.pop().map(|Reverse(item)| item)));
            assert_eq!(out.0.len(), out.1.len());
            assert!(out.0 == out.1, "the calendar queue's order differs from the heap's");
        }
    }
}
