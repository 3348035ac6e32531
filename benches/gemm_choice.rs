//! Which CPU GEMM crate kiln uses: `gemm` (rayon) against
//! `matrixmultiply::sgemm` (its own threads), on one 1024x1024x1024 `f32`
//! product with row-major operands, both given every logical core. Run:
//! `cargo bench --bench gemm_choice -- --warm-up-time 1 --measurement-time 5`.

use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;

const N: usize = 1024;

fn operands() -> (Vec<f32>, Vec<f32>) {
    let a = (0..N * N).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
    let b = (0..N * N).map(|i| ((i * 104_729) % 1000) as f32 / 1000.0 - 0.5).collect();
    (a, b)
}

fn gemm_choice(c: &mut Criterion) {
    // matrixmultiply defaults to the number of *physical* cores, which a
    // small VM may report as 1; give it every logical core, as rayon has.
    if std::env::var_os("MATMUL_NUM_THREADS").is_none() {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        std::env::set_var("MATMUL_NUM_THREADS", threads.to_string());
    }
    let (a, b) = operands();
    let mut dst = vec![0f32; N * N];
    let mut group = c.benchmark_group("sgemm_1024");
    group.sample_size(10);
    group.bench_function("gemm_rayon", |bench| {
        bench.iter(|| {
            // SAFETY: all three matrices are dense N x N row-major buffers.
            unsafe {
                gemm::gemm(
                    N,
                    N,
                    N,
                    dst.as_mut_ptr(),
                    1,
                    N as isize,
                    false,
                    a.as_ptr(),
                    1,
                    N as isize,
                    b.as_ptr(),
                    1,
                    N as isize,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    gemm::Parallelism::Rayon(0),
                )
            };
            black_box(&dst);
        })
    });
    group.bench_function("matrixmultiply", |bench| {
        bench.iter(|| {
            // SAFETY: all three matrices are dense N x N row-major buffers.
            unsafe {
                matrixmultiply::sgemm(
                    N,
                    N,
                    N,
                    1.0,
                    a.as_ptr(),
                    N as isize,
                    1,
                    b.as_ptr(),
                    N as isize,
                    1,
                    0.0,
                    dst.as_mut_ptr(),
                    N as isize,
                    1,
                )
            };
            black_box(&dst);
        })
    });
    group.finish();
}

criterion_group!(benches, gemm_choice);
criterion_main!(benches);
