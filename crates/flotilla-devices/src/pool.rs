//! A caching device-memory pool: freed blocks are kept and handed out again.
//!
//! Device allocation (`cuMemAlloc`, and `cuMemFree`, which synchronises the device) costs
//! tens of microseconds to milliseconds, while a tiled algorithm allocates and frees the same
//! few tile sizes thousands of times. [`MemPool`], a simplified version of PyTorch's caching
//! allocator, sits between a device and its raw allocator ([`RawAlloc`]) and recycles blocks.
//!
//! # Design
//!
//! - **Size classes.** A request is rounded up to a multiple of 512 B up to 1 MiB, and to a
//!   multiple of 2 MiB above ([`size_class`]): fine granules where waste would be a large
//!   fraction of a small block, coarse ones where they make more requests share a class
//!   (tiles of nearly equal size) at a waste of at most 2 MiB per block. Blocks are never
//!   split or merged, so the pool needs no address arithmetic and works with opaque handles.
//! - **Free lists.** A freed block goes to its class's free list (LIFO, so the most recently
//!   used, cache-warm block comes back first); a request is served from its own class only.
//! - **Returning blocks.** [`MemPool::alloc`] hands out a [`PoolBlock`], which goes back to
//!   the pool when dropped; [`MemPool::trim`] frees every cached block to the raw allocator.
//! - **Out of memory.** When the raw allocator reports [`DevicesError::OutOfMemory`], the pool
//!   trims its cache and retries once (when trimming freed anything): cached memory never
//!   makes an allocation fail that would succeed without the pool.
//! - **Soft cap.** With [`MemPool::with_soft_cap`], a request that must allocate fresh memory
//!   first trims the cache when blocks in use + cached + the new block would exceed the cap,
//!   so the pool does not hold cached memory beyond a device's memory limit. Blocks in use
//!   are never limited by the pool: the device's own accounting decides what may be used.
//! - **Locking.** One mutex guards the free lists and counters; raw allocations and frees run
//!   outside it, so a slow `cuMemAlloc` does not stall other threads' frees. The soft cap is
//!   therefore checked against a snapshot and may be exceeded briefly under concurrency.
//!
//! ```
//! use flotilla_devices::pool::{MemPool, RawAlloc};
//!
//! struct Heap;
//! impl RawAlloc for Heap {
//!     type Block = Vec<u8>;
//!     fn alloc(&self, bytes: usize) -> flotilla_devices::Result<Vec<u8>> {
//!         Ok(vec![0; bytes])
//!     }
//!     fn free(&self, _block: Vec<u8>) {}
//! }
//!
//! let pool = MemPool::new("heap", Heap);
//! let a = pool.alloc(1000)?;
//! assert_eq!(a.class_bytes(), 1024);
//! drop(a);
//! let _b = pool.alloc(700)?; // the same 1024-byte class: served from the cache
//! assert_eq!((pool.stats().hits, pool.stats().misses), (1, 1));
//! # Ok::<(), flotilla_devices::DevicesError>(())
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::{DevicesError, Result};

/// Requests up to this many bytes use [`SMALL_GRANULE`].
pub const SMALL_LIMIT: usize = 1 << 20;
/// The rounding of requests up to [`SMALL_LIMIT`].
pub const SMALL_GRANULE: usize = 512;
/// The rounding of requests above [`SMALL_LIMIT`].
pub const LARGE_GRANULE: usize = 2 << 20;

/// The size class of a request of `bytes`: `bytes` rounded up to a multiple of
/// [`SMALL_GRANULE`] (at least one granule) up to [`SMALL_LIMIT`], of [`LARGE_GRANULE`]
/// above. `None` when the rounded size does not fit in `usize`.
pub fn size_class(bytes: usize) -> Option<usize> {
    let granule = if bytes <= SMALL_LIMIT {
        SMALL_GRANULE
    } else {
        LARGE_GRANULE
    };
    bytes.max(1).checked_next_multiple_of(granule)
}

/// The raw allocator under a [`MemPool`]: a device's malloc and free.
pub trait RawAlloc: Send + Sync + 'static {
    /// A handle to one allocation (e.g. a device pointer); dropping it must not free memory
    /// the pool still counts, so the pool always passes it to [`RawAlloc::free`].
    type Block: Send + Sync + 'static;

    /// Allocates `bytes` bytes (always a size class). Fails with
    /// [`DevicesError::OutOfMemory`] when memory is short, which makes the pool trim its
    /// cache and retry; any other error is passed to the caller.
    fn alloc(&self, bytes: usize) -> Result<Self::Block>;

    /// Frees a block returned by [`RawAlloc::alloc`].
    fn free(&self, block: Self::Block);
}

/// Counters of a [`MemPool`]; bytes are size-class bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Requests served from the cache.
    pub hits: u64,
    /// Requests that went to the raw allocator.
    pub misses: u64,
    /// Raw out-of-memory failures retried after trimming the cache.
    pub oom_retries: u64,
    /// Bytes of blocks handed out and not yet returned.
    pub bytes_in_use: u64,
    /// Blocks handed out and not yet returned.
    pub blocks_in_use: u64,
    /// Bytes of returned blocks kept for reuse.
    pub bytes_cached: u64,
    /// Returned blocks kept for reuse.
    pub blocks_cached: u64,
}

struct State<B> {
    free: BTreeMap<usize, Vec<B>>,
    stats: PoolStats,
}

/// A caching pool over a [`RawAlloc`]; see the [module docs](self).
pub struct MemPool<A: RawAlloc> {
    name: String,
    raw: A,
    soft_cap: Option<u64>,
    state: Mutex<State<A::Block>>,
}

impl<A: RawAlloc> MemPool<A> {
    /// A pool over `raw`, for the device `name` (used in errors), without a soft cap.
    pub fn new(name: impl Into<String>, raw: A) -> Arc<Self> {
        Self::build(name.into(), raw, None)
    }

    /// A pool that trims its cache before a fresh allocation would make blocks in use plus
    /// cached exceed `cap` bytes.
    pub fn with_soft_cap(name: impl Into<String>, raw: A, cap: u64) -> Arc<Self> {
        Self::build(name.into(), raw, Some(cap))
    }

    fn build(name: String, raw: A, soft_cap: Option<u64>) -> Arc<Self> {
        Arc::new(MemPool {
            name,
            raw,
            soft_cap,
            state: Mutex::new(State {
                free: BTreeMap::new(),
                stats: PoolStats::default(),
            }),
        })
    }

    /// The raw allocator.
    pub fn raw(&self) -> &A {
        &self.raw
    }

    /// The counters now.
    pub fn stats(&self) -> PoolStats {
        self.state.lock().stats
    }

    /// A block of at least `bytes` bytes (its [`size_class`]), from the cache when one of the
    /// class is free, else from the raw allocator, trimming the cache and retrying once if
    /// that is out of memory. The contents are unspecified.
    ///
    /// # Errors
    /// [`DevicesError::OutOfMemory`] when the raw allocator has no room even after the trim,
    /// or the raw allocator's other errors.
    pub fn alloc(self: &Arc<Self>, bytes: usize) -> Result<PoolBlock<A>> {
        let class = size_class(bytes).ok_or_else(|| DevicesError::OutOfMemory {
            device: self.name.clone(),
            requested: bytes as u64,
            available: 0,
        })?;
        let class_u64 = class as u64;
        let over_cap = {
            let mut s = self.state.lock();
            if let Some(block) = Self::pop_free(&mut s, class) {
                s.stats.hits += 1;
                s.stats.bytes_cached -= class_u64;
                s.stats.blocks_cached -= 1;
                s.stats.bytes_in_use += class_u64;
                s.stats.blocks_in_use += 1;
                return Ok(self.guard(block, class));
            }
            s.stats.misses += 1;
            // Count the block as in use now, so concurrent soft-cap checks see it.
            let held = s.stats.bytes_in_use + s.stats.bytes_cached;
            s.stats.bytes_in_use += class_u64;
            s.stats.blocks_in_use += 1;
            self.soft_cap
                .is_some_and(|cap| held.saturating_add(class_u64) > cap)
        };
        if over_cap {
            self.trim();
        }
        let result = match self.raw.alloc(class) {
            // Trim, and retry only when the trim gave memory back.
            Err(DevicesError::OutOfMemory { .. }) if self.trim() > 0 => {
                self.state.lock().stats.oom_retries += 1;
                self.raw.alloc(class)
            }
            other => other,
        };
        match result {
            Ok(block) => Ok(self.guard(block, class)),
            Err(e) => {
                let mut s = self.state.lock();
                s.stats.bytes_in_use -= class_u64;
                s.stats.blocks_in_use -= 1;
                Err(e)
            }
        }
    }

    /// Frees every cached block to the raw allocator; returns the bytes freed.
    pub fn trim(&self) -> u64 {
        let blocks = {
            let mut s = self.state.lock();
            let freed = std::mem::take(&mut s.free);
            s.stats.bytes_cached = 0;
            s.stats.blocks_cached = 0;
            freed
        };
        let mut bytes = 0u64;
        for (class, list) in blocks {
            for block in list {
                bytes += class as u64;
                self.raw.free(block);
            }
        }
        bytes
    }

    fn pop_free(s: &mut State<A::Block>, class: usize) -> Option<A::Block> {
        let list = s.free.get_mut(&class)?;
        let block = list.pop();
        if list.is_empty() {
            s.free.remove(&class);
        }
        block
    }

    fn guard(self: &Arc<Self>, block: A::Block, class: usize) -> PoolBlock<A> {
        PoolBlock {
            block: Some(block),
            class,
            pool: Arc::clone(self),
        }
    }

    /// Puts a returned block on its class's free list.
    fn give_back(&self, block: A::Block, class: usize) {
        let mut s = self.state.lock();
        let class_u64 = class as u64;
        s.stats.bytes_in_use -= class_u64;
        s.stats.blocks_in_use -= 1;
        s.stats.bytes_cached += class_u64;
        s.stats.blocks_cached += 1;
        s.free.entry(class).or_default().push(block);
    }
}

impl<A: RawAlloc> Drop for MemPool<A> {
    fn drop(&mut self) {
        // Blocks in use hold an `Arc` to the pool, so only cached blocks are left.
        self.trim();
    }
}

impl<A: RawAlloc> fmt::Debug for MemPool<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemPool")
            .field("name", &self.name)
            .field("soft_cap", &self.soft_cap)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// A block handed out by a [`MemPool`]; returned to the pool's cache when dropped.
pub struct PoolBlock<A: RawAlloc> {
    /// `Some` until dropped.
    block: Option<A::Block>,
    class: usize,
    pool: Arc<MemPool<A>>,
}

impl<A: RawAlloc> PoolBlock<A> {
    /// The raw allocation.
    pub fn get(&self) -> &A::Block {
        self.block
            .as_ref()
            .expect("a PoolBlock holds its block until dropped")
    }

    /// The block's size: the size class of the request.
    pub fn class_bytes(&self) -> usize {
        self.class
    }
}

impl<A: RawAlloc> Drop for PoolBlock<A> {
    fn drop(&mut self) {
        if let Some(block) = self.block.take() {
            self.pool.give_back(block, self.class);
        }
    }
}

impl<A: RawAlloc> fmt::Debug for PoolBlock<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolBlock")
            .field("class", &self.class)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashSet;

    /// A fake device allocator: unique ids, a byte capacity, and a log of what is live.
    #[derive(Default)]
    struct Fake {
        capacity: u64,
        inner: Arc<Mutex<FakeState>>,
    }

    #[derive(Default)]
    struct FakeState {
        next_id: u64,
        live: BTreeMap<u64, usize>,
        allocs: u64,
        frees: u64,
        /// Fail the next allocation with this error (not OutOfMemory).
        fail_next: bool,
    }

    impl Fake {
        fn new(capacity: u64) -> Self {
            Fake {
                capacity,
                ..Fake::default()
            }
        }
        fn live_bytes(&self) -> u64 {
            self.inner.lock().live.values().map(|&b| b as u64).sum()
        }
    }

    impl RawAlloc for Fake {
        type Block = (u64, usize);
        fn alloc(&self, bytes: usize) -> Result<(u64, usize)> {
            let mut s = self.inner.lock();
            if std::mem::take(&mut s.fail_next) {
                return Err(DevicesError::bad_args("alloc", "injected failure"));
            }
            let live: u64 = s.live.values().map(|&b| b as u64).sum();
            if live + bytes as u64 > self.capacity {
                return Err(DevicesError::OutOfMemory {
                    device: "fake".into(),
                    requested: bytes as u64,
                    available: self.capacity - live,
                });
            }
            s.next_id += 1;
            s.allocs += 1;
            let id = s.next_id;
            s.live.insert(id, bytes);
            Ok((id, bytes))
        }
        fn free(&self, (id, bytes): (u64, usize)) {
            let mut s = self.inner.lock();
            s.frees += 1;
            assert_eq!(s.live.remove(&id), Some(bytes), "double or foreign free");
        }
    }

    #[test]
    fn size_classes_round_up_to_their_granule() {
        assert_eq!(size_class(0), Some(512));
        assert_eq!(size_class(1), Some(512));
        assert_eq!(size_class(512), Some(512));
        assert_eq!(size_class(513), Some(1024));
        assert_eq!(size_class(SMALL_LIMIT), Some(SMALL_LIMIT));
        assert_eq!(size_class(SMALL_LIMIT + 1), Some(2 << 20));
        assert_eq!(size_class((2 << 20) + 1), Some(4 << 20));
        assert_eq!(size_class(usize::MAX), None);
    }

    #[test]
    fn freed_blocks_are_reused_by_their_class_only() {
        let pool = MemPool::new("fake", Fake::new(1 << 30));
        let a = pool.alloc(1000).expect("alloc");
        let a_id = a.get().0;
        drop(a);
        let s = pool.stats();
        assert_eq!(
            (s.bytes_cached, s.blocks_cached, s.bytes_in_use),
            (1024, 1, 0)
        );
        // Another class misses; the same class hits and gets the same block back.
        let b = pool.alloc(2000).expect("alloc");
        let c = pool.alloc(600).expect("alloc");
        assert_ne!(b.get().0, a_id);
        assert_eq!(c.get().0, a_id);
        assert_eq!(c.class_bytes(), 1024);
        let s = pool.stats();
        assert_eq!((s.hits, s.misses), (1, 2));
        assert_eq!((s.bytes_in_use, s.blocks_in_use), (1024 + 2048, 2));
        assert_eq!(s.bytes_cached, 0);
        drop((b, c));
        assert_eq!(pool.trim(), 1024 + 2048);
        assert_eq!(pool.raw().live_bytes(), 0);
        assert_eq!(pool.stats().bytes_cached, 0);
    }

    #[test]
    fn out_of_memory_trims_the_cache_and_retries_once() {
        let pool = MemPool::new("fake", Fake::new(4096));
        let a = pool.alloc(2048).expect("alloc");
        let b = pool.alloc(2048).expect("alloc");
        drop((a, b));
        // 4096 bytes are cached, so a 3000-byte class (3072) only fits after the trim.
        let c = pool.alloc(3000).expect("fits after trimming");
        let s = pool.stats();
        assert_eq!(
            (s.oom_retries, s.bytes_cached, s.bytes_in_use),
            (1, 0, 3072)
        );
        assert_eq!(pool.raw().inner.lock().frees, 2);
        // Truly out of memory: the error passes through, the accounting is unchanged, and
        // with nothing cached there is no retry.
        let err = pool.alloc(2048).expect_err("no room");
        assert!(matches!(err, DevicesError::OutOfMemory { .. }), "{err:?}");
        let s = pool.stats();
        assert_eq!(
            (s.oom_retries, s.bytes_in_use, s.blocks_in_use),
            (1, 3072, 1)
        );
        drop(c);
    }

    #[test]
    fn other_raw_errors_pass_through_without_trimming() {
        let pool = MemPool::new("fake", Fake::new(1 << 20));
        drop(pool.alloc(100).expect("alloc"));
        pool.raw().inner.lock().fail_next = true;
        let err = pool.alloc(5000).expect_err("injected");
        assert!(matches!(err, DevicesError::BadArgs { .. }), "{err:?}");
        let s = pool.stats();
        assert_eq!((s.bytes_in_use, s.blocks_cached, s.oom_retries), (0, 1, 0));
        assert!(pool.alloc(usize::MAX).is_err());
    }

    #[test]
    fn soft_cap_trims_before_a_fresh_allocation() {
        let pool = MemPool::with_soft_cap("fake", Fake::new(1 << 30), 4096);
        drop(pool.alloc(2048).expect("alloc"));
        drop(pool.alloc(1024).expect("alloc"));
        assert_eq!(pool.stats().bytes_cached, 3072);
        // 3072 cached + 1536 new > 4096: the cache is trimmed first.
        let a = pool.alloc(1500).expect("alloc");
        assert_eq!(pool.stats().bytes_cached, 0);
        assert_eq!(pool.raw().live_bytes(), 1536);
        // Under the cap, cached blocks stay.
        drop(a);
        let _b = pool.alloc(512).expect("alloc");
        assert_eq!(pool.stats().bytes_cached, 1536);
        assert_eq!(pool.raw().live_bytes(), 1536 + 512);
        // Blocks in use are not limited by the cap.
        let _c = pool.alloc(8192).expect("alloc beyond the cap");
    }

    #[test]
    fn blocks_keep_the_pool_alive_and_its_drop_frees_the_cache() {
        let pool = MemPool::new("fake", Fake::new(1 << 20));
        let raw = Arc::clone(&pool.raw().inner);
        let a = pool.alloc(10).expect("alloc");
        drop(pool.alloc(20_000).expect("alloc"));
        let weak = Arc::downgrade(&pool);
        drop(pool);
        assert!(weak.upgrade().is_some(), "a block still out keeps the pool");
        assert_eq!(raw.lock().live.len(), 2);
        drop(a);
        assert!(weak.upgrade().is_none());
        assert!(
            raw.lock().live.is_empty(),
            "the pool's drop freed its cache"
        );
    }

    #[derive(Debug, Clone)]
    enum Op {
        Alloc(usize),
        Free(usize),
        Trim,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => prop_oneof![1usize..3000, (1usize << 20)..(5 << 20)].prop_map(Op::Alloc),
            3 => any::<usize>().prop_map(Op::Free),
            1 => Just(Op::Trim),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, rng_seed: proptest::test_runner::RngSeed::Fixed(7), ..ProptestConfig::default() })]

        /// Random alloc/free/trim sequences against a fake allocator of 16 MiB: no block is
        /// handed out twice, the in-use and cached counters match what is live, a trim frees
        /// exactly the cache, and an allocation fails only when it would not fit even with
        /// nothing cached.
        #[test]
        fn pool_accounting_is_exact(ops in proptest::collection::vec(op(), 1..120)) {
            let pool = MemPool::new("fake", Fake::new(16 << 20));
            let mut held: Vec<PoolBlock<Fake>> = Vec::new();
            for op in ops {
                match op {
                    Op::Alloc(bytes) => {
                        let in_use_before = pool.stats().bytes_in_use;
                        match pool.alloc(bytes) {
                            Ok(b) => {
                                prop_assert!(b.class_bytes() >= bytes);
                                prop_assert_eq!(Some(b.class_bytes()), size_class(bytes));
                                prop_assert_eq!(b.get().1, b.class_bytes());
                                held.push(b);
                            }
                            Err(DevicesError::OutOfMemory { .. }) => {
                                prop_assert!(in_use_before + size_class(bytes).unwrap_or(0) as u64 > 16 << 20);
                                prop_assert_eq!(pool.stats().bytes_cached, 0);
                            }
                            Err(e) => prop_assert!(false, "unexpected error {e:?}"),
                        }
                    }
                    Op::Free(i) if !held.is_empty() => {
                        let i = i % held.len();
                        drop(held.swap_remove(i));
                    }
                    Op::Free(_) => {}
                    Op::Trim => {
                        let cached = pool.stats().bytes_cached;
                        prop_assert_eq!(pool.trim(), cached);
                        prop_assert_eq!(pool.stats().bytes_cached, 0);
                    }
                }
                let ids: HashSet<u64> = held.iter().map(|b| b.get().0).collect();
                prop_assert_eq!(ids.len(), held.len(), "a block was handed out twice");
                let s = pool.stats();
                let in_use: u64 = held.iter().map(|b| b.class_bytes() as u64).sum();
                prop_assert_eq!(s.bytes_in_use, in_use);
                prop_assert_eq!(s.blocks_in_use, held.len() as u64);
                prop_assert_eq!(s.bytes_in_use + s.bytes_cached, pool.raw().live_bytes());
                prop_assert_eq!(s.blocks_in_use + s.blocks_cached, pool.raw().inner.lock().live.len() as u64);
            }
            let in_use = pool.stats().bytes_in_use;
            pool.trim();
            prop_assert_eq!(pool.raw().live_bytes(), in_use);
            drop(held);
            prop_assert_eq!(pool.stats().bytes_in_use, 0);
        }
    }
}
