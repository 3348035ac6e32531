//! Which CPU GEMM kiln uses: `gemm` (rayon) against `matrixmultiply`, on
//! row-major operands of three sizes: 1024^3 `f32`, 64x784x128 `f32` (the
//! quickstart MLP layer) and 1024^3 `f64`.
//!
//! `matrixmultiply`'s `threading` feature is one crate-wide switch (cargo
//! unifies features), and with it on every `sgemm` call spawns onto its own
//! pool, so the two matrixmultiply variants need two builds:
//!
//! * `cargo bench --bench gemm_choice --features gemm-choice,mm-threading -- --warm-up-time 2 --measurement-time 8`
//!   measures `gemm_rayon` and `matrixmultiply_threads` (its own pool,
//!   `MATMUL_NUM_THREADS` = every logical core);
//! * `cargo bench --bench gemm_choice --features gemm-choice -- --warm-up-time 2 --measurement-time 8`
//!   measures `gemm_rayon` and `matrixmultiply_rayon_rows` (single-threaded
//!   matrixmultiply on row blocks of A split across rayon, what kiln runs).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
#[cfg(not(feature = "mm-threading"))]
use rayon::prelude::*;
use std::hint::black_box;

/// The two float types, with their matrixmultiply entry points.
trait Float: Copy + Send + Sync + Default + 'static {
    const NAME: &'static str;
    fn from_f32(x: f32) -> Self;
    /// # Safety
    /// As `matrixmultiply::sgemm`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn mm(
        m: usize,
        k: usize,
        n: usize,
        a: *const Self,
        rsa: isize,
        csa: isize,
        b: *const Self,
        rsb: isize,
        csb: isize,
        c: *mut Self,
        rsc: isize,
        csc: isize,
    );
}

impl Float for f32 {
    const NAME: &'static str = "f32";
    fn from_f32(x: f32) -> Self {
        x
    }
    unsafe fn mm(
        m: usize,
        k: usize,
        n: usize,
        a: *const f32,
        rsa: isize,
        csa: isize,
        b: *const f32,
        rsb: isize,
        csb: isize,
        c: *mut f32,
        rsc: isize,
        csc: isize,
    ) {
        matrixmultiply::sgemm(m, k, n, 1.0, a, rsa, csa, b, rsb, csb, 0.0, c, rsc, csc)
    }
}

impl Float for f64 {
    const NAME: &'static str = "f64";
    fn from_f32(x: f32) -> Self {
        x as f64
    }
    unsafe fn mm(
        m: usize,
        k: usize,
        n: usize,
        a: *const f64,
        rsa: isize,
        csa: isize,
        b: *const f64,
        rsb: isize,
        csb: isize,
        c: *mut f64,
        rsc: isize,
        csc: isize,
    ) {
        matrixmultiply::dgemm(m, k, n, 1.0, a, rsa, csa, b, rsb, csb, 0.0, c, rsc, csc)
    }
}

/// One GEMM variant: m, k, n, A, B, C (all dense row-major).
type Kernel<T> = fn(usize, usize, usize, &[T], &[T], &mut [T]);

fn operands<T: Float>(m: usize, k: usize, n: usize) -> (Vec<T>, Vec<T>) {
    let a = (0..m * k).map(|i| T::from_f32(((i * 7919) % 1000) as f32 / 1000.0 - 0.5)).collect();
    let b = (0..k * n).map(|i| T::from_f32(((i * 104_729) % 1000) as f32 / 1000.0 - 0.5)).collect();
    (a, b)
}

fn gemm_rayon<T: Float>(m: usize, k: usize, n: usize, a: &[T], b: &[T], dst: &mut [T]) {
    // SAFETY: dense row-major m x k, k x n and m x n buffers; T is f32/f64.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.as_ptr(),
            1,
            k as isize,
            b.as_ptr(),
            1,
            n as isize,
            T::default(),
            T::from_f32(1.0),
            false,
            false,
            false,
            gemm::Parallelism::Rayon(0),
        )
    }
}

/// One matrixmultiply call; with `mm-threading` it uses its own pool.
#[cfg(feature = "mm-threading")]
fn mm_threads<T: Float>(m: usize, k: usize, n: usize, a: &[T], b: &[T], dst: &mut [T]) {
    // SAFETY: dense row-major m x k, k x n and m x n buffers.
    unsafe {
        T::mm(m, k, n, a.as_ptr(), k as isize, 1, b.as_ptr(), n as isize, 1, dst.as_mut_ptr(), n as isize, 1)
    }
}

/// Single-threaded matrixmultiply on row blocks of A (and C) across rayon:
/// `current_num_threads()` blocks, but none smaller than 64 rows.
#[cfg(not(feature = "mm-threading"))]
fn mm_rayon_rows<T: Float>(m: usize, k: usize, n: usize, a: &[T], b: &[T], dst: &mut [T]) {
    let rows = m.div_ceil(rayon::current_num_threads()).max(64).min(m);
    dst.par_chunks_mut(rows * n).enumerate().for_each(|(i, c)| {
        let r0 = i * rows;
        let mr = c.len() / n;
        // SAFETY: rows r0..r0+mr of the dense row-major A, all of B, and the
        // disjoint mr x n block `c` of the output.
        unsafe {
            T::mm(
                mr,
                k,
                n,
                a[r0 * k..].as_ptr(),
                k as isize,
                1,
                b.as_ptr(),
                n as isize,
                1,
                c.as_mut_ptr(),
                n as isize,
                1,
            )
        }
    });
}

fn bench_size<T: Float>(c: &mut Criterion, m: usize, k: usize, n: usize) {
    let (a, b) = operands::<T>(m, k, n);
    let mut dst = vec![T::default(); m * n];
    let mut group = c.benchmark_group(format!("{}_{m}x{k}x{n}", T::NAME));
    group.sample_size(if m * k * n >= 1 << 27 { 10 } else { 100 });
    let mut variant = |name: &str, f: Kernel<T>| {
        group.bench_function(BenchmarkId::from_parameter(name), |bench| {
            bench.iter(|| {
                f(m, k, n, &a, &b, &mut dst);
                black_box(&dst);
            })
        });
    };
    variant("gemm_rayon", gemm_rayon::<T>);
    #[cfg(feature = "mm-threading")]
    variant("matrixmultiply_threads", mm_threads::<T>);
    #[cfg(not(feature = "mm-threading"))]
    variant("matrixmultiply_rayon_rows", mm_rayon_rows::<T>);
    group.finish();
}

fn gemm_choice(c: &mut Criterion) {
    // matrixmultiply's pool defaults to the number of *physical* cores, which
    // a small VM may report as 1; give it every logical core, as rayon has.
    if cfg!(feature = "mm-threading") && std::env::var_os("MATMUL_NUM_THREADS").is_none() {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        std::env::set_var("MATMUL_NUM_THREADS", threads.to_string());
    }
    bench_size::<f32>(c, 1024, 1024, 1024);
    bench_size::<f32>(c, 64, 784, 128);
    bench_size::<f64>(c, 1024, 1024, 1024);
}

criterion_group!(benches, gemm_choice);
criterion_main!(benches);
