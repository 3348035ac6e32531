//! Weights packed once: a B operand that a product reads again with the
//! same bytes (a linear layer's `w.t()` in every forward of inference)
//! keeps its packed slivers ([`PackedB`]) between calls, so later calls
//! skip packing it.
//!
//! # Why
//!
//! Packing is a copy, but a weight read as `w.t()` is packed through 8x8
//! register transposes from 16 columns at once, and an encoder's weights
//! (42 MB for MiniLM-L6) come from memory every forward: `perf` put the
//! transposes at 4-5% of MiniLM's forward, against a GEMM that is two
//! thirds of it (issue 38, seventh session). Packed, the same bytes are
//! read as one sequential stream by the kernel itself.
//!
//! # When a B is kept
//!
//! The key is the bytes' identity ([`Contents`]: new whenever anything is
//! written into an allocation, never reused in a process) plus where the
//! matrix lies in them (base, strides) and its size. A key is packed into
//! the cache only the second time it is seen (its bytes unchanged in
//! between): a training step's weights change every step and an
//! activation is read once, so they are only remembered (the last 256
//! keys: a second sight must come before 256 other first sights) and
//! packed as before. Products under 2^20
//! multiply-adds do not ask (`matmul.rs`): their packing costs less than
//! the lookup is worth. Packing copies the same floats
//! into the same layout, so a cached product has the bits of an uncached
//! one.
//!
//! # What it holds
//!
//! At most `KILN_CPU_PACKED_WEIGHTS_MB` megabytes (default 256; `0`
//! turns the cache off), outside the device's byte counters. An entry
//! whose storage was dropped is removed on the next lookup; when a new
//! entry does not fit, entries whose storage now holds other bytes (a
//! weight updated in place) are removed, and if it still does not fit it
//! is not kept (no eviction of live weights: a model larger than the
//! budget keeps its first layers packed instead of repacking every layer
//! into the cache in turn).

use super::Mat;
use crate::backends::cpu::Storage;
use crate::backends::Contents;
use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// All of a `k x n` B packed as the product reads it: for each slice of
/// the inner dimension in order (depth [`super::slice_depth`]), its 16-column
/// slivers (`pack_b`'s layout), slice `p0..p0+kc` at `n16 * p0` where
/// `n16` is `n` rounded up to 16.
pub(crate) struct PackedB {
    pub(super) k: usize,
    pub(super) n: usize,
    pub(super) data: Vec<f32>,
}

impl PackedB {
    /// Packs every slice of `b` (`k x n`, each element inside its slice;
    /// an operand out of range panics, as in [`super::sgemm`]), on rayon when
    /// `parallel`. Call only when [`super::available`] is true.
    pub(crate) fn new(k: usize, n: usize, b: Mat<'_>, parallel: bool) -> PackedB {
        let n16 = n.div_ceil(super::NR) * super::NR;
        let mut data = vec![0f32; n16 * k];
        let depth = super::slice_depth(k.max(1));
        for (p0, part) in (0..k).step_by(depth).zip(data.chunks_mut(n16 * depth)) {
            super::pack_b_into(b, p0, depth.min(k - p0), n, part, parallel);
        }
        PackedB { k, n, data }
    }

    /// Bytes it holds.
    pub(crate) fn bytes(&self) -> usize {
        self.data.len() * 4
    }
}

/// Recent keys seen once, remembered to recognise a second sight.
const SEEN: usize = 256;

/// A packed B's identity: its bytes, where the matrix lies in them, its size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Key {
    contents: Contents,
    base: usize,
    rs: usize,
    cs: usize,
    k: usize,
    n: usize,
}

/// The packed operands kept, the keys seen once (in order, and as a set:
/// a training step's every product is a first sight, so that check is
/// one hash lookup, not a scan), and the budget.
pub(crate) struct Cache {
    packed: Vec<(Key, Weak<Storage>, Arc<PackedB>)>,
    seen: VecDeque<Key>,
    seen_set: HashSet<Key>,
    bytes: usize,
    budget: usize,
}

impl Cache {
    /// An empty cache that holds at most `budget` bytes.
    pub(crate) fn new(budget: usize) -> Cache {
        Cache { packed: Vec::new(), seen: VecDeque::new(), seen_set: HashSet::new(), bytes: 0, budget }
    }

    /// Bytes of the packed operands it holds.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Drops the entries whose storage is gone.
    fn drop_dead(&mut self) {
        let bytes = &mut self.bytes;
        self.packed.retain(|(_, storage, p)| {
            let alive = storage.strong_count() > 0;
            if !alive {
                *bytes -= p.bytes();
            }
            alive
        });
    }

    /// What to do for `key`: a kept packing, pack it now (its second
    /// sight, and it fits), or `None`: pack as usual (first sight, over
    /// budget, the cache off).
    fn decide(&mut self, key: Key) -> Option<Step> {
        if self.budget == 0 {
            return None;
        }
        self.drop_dead();
        if let Some((_, _, p)) = self.packed.iter().find(|(k, _, _)| *k == key) {
            return Some(Step::Hit(p.clone()));
        }
        if !self.seen_set.contains(&key) {
            if self.seen.len() == SEEN {
                if let Some(old) = self.seen.pop_front() {
                    self.seen_set.remove(&old);
                }
            }
            self.seen.push_back(key);
            self.seen_set.insert(key);
            return None;
        }
        if !self.fits(key) {
            return None;
        }
        self.seen.retain(|k| *k != key);
        self.seen_set.remove(&key);
        Some(Step::Pack)
    }

    /// Whether `key`'s packing fits the budget, after dropping the
    /// entries of storages written since (their contents moved on: they
    /// will never be asked for again) when it does not.
    fn fits(&mut self, key: Key) -> bool {
        let size = key.n.div_ceil(super::NR) * super::NR * key.k * 4;
        if self.bytes + size > self.budget {
            let bytes = &mut self.bytes;
            self.packed.retain(|(k, storage, p)| {
                let current = storage.upgrade().is_some_and(|s| s.contents() == k.contents);
                if !current {
                    *bytes -= p.bytes();
                }
                current
            });
        }
        self.bytes + size <= self.budget
    }

    /// Keeps `packed` for `key` when it still fits (another thread may have
    /// kept one meanwhile: then that one), and returns what to multiply by.
    fn keep(&mut self, key: Key, storage: &Arc<Storage>, packed: Arc<PackedB>) -> Arc<PackedB> {
        if let Some((_, _, p)) = self.packed.iter().find(|(k, _, _)| *k == key) {
            return p.clone();
        }
        if self.fits(key) {
            self.bytes += packed.bytes();
            self.packed.push((key, Arc::downgrade(storage), packed.clone()));
        }
        packed
    }
}

/// [`Cache::decide`]'s answer when there is something to use.
enum Step {
    /// The kept packing.
    Hit(Arc<PackedB>),
    /// Pack now, then [`Cache::keep`].
    Pack,
}

/// The cached packing of `b` (`k x n`, inside `storage`'s elements, which
/// are `b.data`), or, the second time its key is asked for, `b` packed
/// now and kept when it fits; `None` when `b` is to be packed as usual.
/// The lock is not held while packing: the packing forks rayon tasks, and
/// a worker waiting on them may run another product's task, which asks
/// the cache again (a second lock on the same thread would deadlock).
fn lookup(
    cache: &Mutex<Cache>,
    storage: &Arc<Storage>,
    b: Mat<'_>,
    k: usize,
    n: usize,
    parallel: bool,
) -> Option<Arc<PackedB>> {
    let key = Key { contents: storage.contents(), base: b.base, rs: b.rs, cs: b.cs, k, n };
    let lock = || cache.lock().unwrap_or_else(|e| e.into_inner());
    let step = lock().decide(key)?;
    match step {
        Step::Hit(p) => Some(p),
        Step::Pack => {
            let packed = Arc::new(PackedB::new(k, n, b, parallel));
            Some(lock().keep(key, storage, packed))
        }
    }
}

/// The process's cache (see the module header for its budget).
fn cache() -> &'static Mutex<Cache> {
    static CACHE: OnceLock<Mutex<Cache>> = OnceLock::new();
    CACHE.get_or_init(|| {
        let mb =
            std::env::var("KILN_CPU_PACKED_WEIGHTS_MB").ok().and_then(|v| v.trim().parse::<usize>().ok());
        Mutex::new(Cache::new(mb.unwrap_or(256).saturating_mul(1 << 20)))
    })
}

/// `b` packed, from the process's cache (see [`lookup`]), when `storage`
/// holds `b`'s elements (`b.data` is its slice) and this is at least the
/// second product to read these bytes as this B. Every element of the
/// `k x n` matrix must be inside `b.data` (as for `sgemm`).
pub(crate) fn packed(
    storage: &Arc<Storage>,
    b: Mat<'_>,
    k: usize,
    n: usize,
    parallel: bool,
) -> Option<Arc<PackedB>> {
    lookup(cache(), storage, b, k, n, parallel)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::DeviceStats;
    use crate::ir::HostData;

    fn storage(values: Vec<f32>) -> Arc<Storage> {
        Storage::new(HostData::F32(values), &Arc::new(DeviceStats::default()))
    }

    /// The second sight packs and keeps, the third hits; the bits are
    /// `sgemm`'s; new bytes are a new key; a dropped storage's entry goes;
    /// nothing is kept past the budget.
    #[test]
    fn keeps_a_weight_seen_twice_and_gives_sgemms_bits() {
        if !super::super::available() {
            return;
        }
        let (m, k, n) = (20, 300, 40);
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0).collect();
        let w: Vec<f32> = (0..n * k).map(|i| ((i * 53 % 89) as f32 - 44.0) / 13.0).collect();
        let s = storage(w.clone());
        let data = s.slice::<f32>().expect("f32");
        // `w.t()`: a transposed B, as a linear layer reads its weight.
        let (am, bm) = (Mat { data: &a, base: 0, rs: k, cs: 1 }, Mat { data, base: 0, rs: 1, cs: k });
        let mut want = vec![0f32; m * n];
        super::super::sgemm(m, k, n, am, bm, &mut want, true);
        let cache = Mutex::new(Cache::new(1 << 20));
        let bytes = |c: &Mutex<Cache>| c.lock().expect("lock").bytes();
        assert!(lookup(&cache, &s, bm, k, n, true).is_none(), "first sight");
        let packed = lookup(&cache, &s, bm, k, n, true).expect("second sight packs");
        assert_eq!(bytes(&cache), 48 * k * 4);
        assert!(Arc::ptr_eq(&packed, &lookup(&cache, &s, bm, k, n, true).expect("hit")));
        for parallel in [false, true] {
            let mut got = vec![f32::NAN; m * n];
            super::super::sgemm_packed(m, am, &packed, &mut got, parallel);
            assert!(got.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()), "parallel {parallel}");
        }
        // Few rows (the column-split path) and one row.
        for rows in [1, 7] {
            let mut want = vec![0f32; rows * n];
            super::super::sgemm(rows, k, n, am, bm, &mut want, true);
            let mut got = vec![f32::NAN; rows * n];
            super::super::sgemm_packed(rows, am, &packed, &mut got, true);
            assert!(got.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()), "{rows} rows");
        }
        // The same values in a new storage: new bytes, a new key.
        let other = storage(w);
        let bm = Mat { data: other.slice::<f32>().expect("f32"), ..bm };
        assert!(lookup(&cache, &other, bm, k, n, true).is_none(), "new contents are a first sight");
        drop(packed);
        drop(s);
        assert!(lookup(&cache, &other, bm, k, n, true).is_some());
        assert_eq!(bytes(&cache), 48 * k * 4, "the dropped storage's entry is gone");
        // Over budget: remembered, never kept.
        let small = Mutex::new(Cache::new(1000));
        assert!((0..3).all(|_| lookup(&small, &other, bm, k, n, true).is_none()));
        assert_eq!(bytes(&small), 0);
        // Off.
        let off = Mutex::new(Cache::new(0));
        assert!((0..3).all(|_| lookup(&off, &other, bm, k, n, true).is_none()));
    }
}
