//! A hint to start loading a cache line without waiting for it (x86's `prefetcht0`; nothing
//! elsewhere). Unlike a load, a prefetch retires at once: the processor goes on working while
//! the line comes in, so the records of the next batch can be on their way while this batch
//! is worked on.

/// Starts loading the cache line holding the start of `value` into every level of the cache.
#[inline(always)]
pub(crate) fn prefetch<T>(value: &T) {
    #[cfg(all(any(target_arch = "x86", target_arch = "x86_64"), target_feature = "sse"))]
    safe_arch::prefetch_t0(value);
    #[cfg(not(all(any(target_arch = "x86", target_arch = "x86_64"), target_feature = "sse")))]
    let _ = value;
}
