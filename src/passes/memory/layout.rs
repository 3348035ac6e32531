//! Offsets for values with step windows: the two layouts the memory pass
//! tries, each O(m log m) plus the pairs of values whose windows overlap.

use crate::ir::lifetimes::ALIGN;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

/// A value (or an in-place group) to place: it holds `bytes` bytes for
/// the inclusive steps `start..=end`. Items come sorted by `start`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Item {
    pub start: u32,
    pub end: u32,
    pub bytes: u64,
}

fn align_up(x: u64) -> u64 {
    x.div_ceil(ALIGN) * ALIGN
}

/// The lowest aligned offset where `bytes` fits between `taken` ranges
/// (sorted by start).
fn first_gap(taken: &[(u64, u64)], bytes: u64) -> u64 {
    let mut at = 0;
    for &(lo, hi) in taken {
        if at + bytes <= lo {
            break;
        }
        at = at.max(align_up(hi));
    }
    at
}

/// The arena size of a layout.
pub(super) fn arena_size(items: &[Item], offsets: &[u64]) -> u64 {
    items.iter().zip(offsets).map(|(it, &o)| o + it.bytes).max().unwrap_or(0)
}

/// Greedy by size (TFLite's arena planner): largest first, each at the
/// lowest offset clear of every placed value whose window overlaps.
pub(super) fn greedy_by_size(items: &[Item]) -> Vec<u64> {
    let m = items.len();
    let mut by_size: Vec<usize> = (0..m).collect();
    by_size.sort_by_key(|&i| (Reverse(items[i].bytes), i));
    // A max-of-end segment tree over items (sorted by start) finds the
    // windows that overlap a query without visiting the others.
    let size = m.next_power_of_two().max(1);
    let mut tree = vec![0u32; 2 * size];
    let mut any = vec![false; 2 * size];
    for (i, it) in items.iter().enumerate() {
        tree[size + i] = it.end;
        any[size + i] = true;
    }
    for v in (1..size).rev() {
        tree[v] = tree[2 * v].max(tree[2 * v + 1]);
        any[v] = any[2 * v] || any[2 * v + 1];
    }
    let mut offsets = vec![0u64; m];
    let mut placed = vec![false; m];
    let mut found = Vec::new();
    let mut taken = Vec::new();
    for &i in &by_size {
        let it = items[i];
        // Windows starting at or before `end` and ending at or after `start`.
        let limit = items.partition_point(|x| x.start <= it.end);
        found.clear();
        collect(&tree, &any, 1, 0, size, limit, it.start, &mut found);
        taken.clear();
        taken
            .extend(found.iter().filter(|&&j| placed[j]).map(|&j| (offsets[j], offsets[j] + items[j].bytes)));
        taken.sort_unstable();
        offsets[i] = first_gap(&taken, it.bytes);
        placed[i] = true;
    }
    offsets
}

#[allow(clippy::too_many_arguments)]
fn collect(
    tree: &[u32],
    any: &[bool],
    v: usize,
    lo: usize,
    hi: usize,
    limit: usize,
    start: u32,
    out: &mut Vec<usize>,
) {
    if lo >= limit || !any[v] || tree[v] < start {
        return;
    }
    if hi - lo == 1 {
        out.push(lo);
        return;
    }
    let mid = (lo + hi) / 2;
    collect(tree, any, 2 * v, lo, mid, limit, start, out);
    collect(tree, any, 2 * v + 1, mid, hi, limit, start, out);
}

/// First fit in schedule order: each value, as its window opens, at the
/// lowest offset clear of the values still open.
pub(super) fn first_fit_in_order(items: &[Item]) -> Vec<u64> {
    let mut offsets = vec![0u64; items.len()];
    let mut open: BTreeMap<(u64, usize), u64> = BTreeMap::new();
    let mut expiry: BinaryHeap<Reverse<(u32, u64, usize)>> = BinaryHeap::new();
    let mut taken = Vec::new();
    for (i, it) in items.iter().enumerate() {
        while let Some(&Reverse((end, off, j))) = expiry.peek() {
            if end >= it.start {
                break;
            }
            expiry.pop();
            open.remove(&(off, j));
        }
        taken.clear();
        taken.extend(open.iter().map(|(&(lo, _), &hi)| (lo, hi)));
        offsets[i] = first_gap(&taken, it.bytes);
        open.insert((offsets[i], i), offsets[i] + it.bytes);
        expiry.push(Reverse((it.end, offsets[i], i)));
    }
    offsets
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(items: &[Item], offsets: &[u64]) {
        for i in 0..items.len() {
            assert_eq!(offsets[i] % ALIGN, 0);
            for j in 0..i {
                let (a, b) = (items[i], items[j]);
                let time = a.start <= b.end && b.start <= a.end;
                let space = offsets[i] < offsets[j] + b.bytes && offsets[j] < offsets[i] + a.bytes;
                assert!(!(time && space), "{i} and {j} overlap");
            }
        }
    }

    #[test]
    fn both_layouts_are_valid_and_reuse() {
        let items = [
            Item { start: 0, end: 1, bytes: 100 },
            Item { start: 1, end: 2, bytes: 64 },
            Item { start: 2, end: 3, bytes: 100 },
            Item { start: 3, end: 5, bytes: 10 },
            Item { start: 4, end: 5, bytes: 300 },
        ];
        for offsets in [greedy_by_size(&items), first_fit_in_order(&items)] {
            check(&items, &offsets);
            assert!(arena_size(&items, &offsets) < items.iter().map(|i| i.bytes).sum::<u64>());
        }
    }
}
