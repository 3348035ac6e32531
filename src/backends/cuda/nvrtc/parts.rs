//! Splitting a plan's missing kernels into programs compiled on threads
//! of their own (see the parent module's docs for why and what it gains).

use crate::backends::cuda::codegen::Kernel;

/// Threads compiling one plan's kernels at most, by default.
pub(super) const MAX_THREADS: usize = 8;

/// Some of a plan's kernels, compiled as one program and cached under
/// `key` (their keys joined) at `hash`.
pub(super) struct Part {
    pub kernels: Vec<usize>,
    pub key: String,
    pub hash: String,
}

/// Threads for one plan's kernels: `KILN_COMPILE_THREADS`, else the
/// host's cores up to [`MAX_THREADS`].
pub(super) fn compile_threads() -> usize {
    match std::env::var("KILN_COMPILE_THREADS").ok().and_then(|v| v.parse::<usize>().ok()) {
        Some(n) => n.max(1),
        None => std::thread::available_parallelism().map_or(1, |n| n.get()).min(MAX_THREADS),
    }
}

/// Splits `todo` (indices into `kernels`) into at most `threads` parts,
/// balanced by source length: the longest kernel goes to the lightest part
/// first. A part per kernel is best while there are threads for them (each
/// program's fixed 20 ms runs in parallel too); past 8 threads NVRTC's
/// threads slow each other (`benches/nvrtc_probe.py`: 72 kernels in 0.51 s
/// on 8, 0.66 s on 16). Each part keeps the order of `todo`, so the same
/// kernels and threads give the same parts.
pub(super) fn partition(kernels: &[Kernel], todo: &[usize], threads: usize) -> Vec<Vec<usize>> {
    let count = threads.min(todo.len()).max(1);
    // A kernel's cost: its length, plus what ptxas spends on any kernel.
    let cost = |i: usize| kernels[i].source.len() + 1000;
    let mut by_cost: Vec<(usize, usize)> = todo.iter().copied().enumerate().collect();
    by_cost.sort_by_key(|&(_, i)| std::cmp::Reverse(cost(i)));
    let mut load = vec![0usize; count];
    let mut parts: Vec<Vec<(usize, usize)>> = vec![Vec::new(); count];
    for (at, i) in by_cost {
        let lightest = (0..count).min_by_key(|&p| load[p]).unwrap_or(0);
        load[lightest] += cost(i);
        parts[lightest].push((at, i));
    }
    parts
        .into_iter()
        .filter(|p| !p.is_empty())
        .map(|mut p| {
            p.sort_unstable();
            p.into_iter().map(|(_, i)| i).collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::partition;
    use crate::backends::cuda::codegen::Kernel;

    fn kernel_of_length(i: usize, len: usize) -> Kernel {
        Kernel::new(&format!("k{i}"), "x".repeat(len), 1, 32, vec![])
    }

    /// A plan's kernels split into parts: every kernel in exactly one part,
    /// no more parts than threads or kernels, each part in the
    /// order it was given, the costs balanced, and the same split twice.
    #[test]
    fn a_plans_kernels_split_into_balanced_parts() {
        let lengths = [9000, 100, 200, 4000, 50, 50, 3000, 700, 800, 60, 70, 5000, 10, 20, 30, 40, 2000];
        let kernels: Vec<Kernel> = lengths.iter().enumerate().map(|(i, &l)| kernel_of_length(i, l)).collect();
        let todo: Vec<usize> = (0..kernels.len()).rev().collect();
        for threads in [1, 2, 3, 8, 64] {
            let parts = partition(&kernels, &todo, threads);
            assert_eq!(parts, partition(&kernels, &todo, threads), "not deterministic");
            assert!(parts.len() <= threads && parts.len() <= todo.len());
            let mut seen: Vec<usize> = parts.concat();
            seen.sort_unstable();
            assert_eq!(seen, (0..kernels.len()).collect::<Vec<_>>(), "{threads} threads: {parts:?}");
            for p in &parts {
                let at: Vec<usize> = p.iter().map(|i| todo.iter().position(|t| t == i).unwrap()).collect();
                assert!(at.windows(2).all(|w| w[0] < w[1]), "a part out of order: {p:?}");
            }
            let cost = |p: &Vec<usize>| p.iter().map(|&i| kernels[i].source.len() + 1000).sum::<usize>();
            let (lo, hi) = (parts.iter().map(cost).min().unwrap(), parts.iter().map(cost).max().unwrap());
            // Longest first onto the lightest: no part exceeds another by
            // more than the longest kernel.
            assert!(hi - lo <= 9000 + 1000 + 20, "{threads} threads: costs {lo}..{hi}");
        }
        assert_eq!(
            partition(&kernels, &todo[..3], 8).len(),
            3,
            "three kernels on eight threads: a part each"
        );
        assert_eq!(partition(&kernels, &todo[..1], 8), vec![vec![todo[0]]]);
    }
}
