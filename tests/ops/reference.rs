//! Test helpers: a seeded PRNG, random inputs per dtype, host <-> tensor
//! conversion, a small strided N-d array for computing references in f64 (or
//! i64 for integers, so that wrap-around is exact), and dtype-aware
//! comparisons.

use half::{bf16, f16};
use kiln::prelude::*;
use std::cell::Cell;
use std::rc::Rc;
use std::sync::OnceLock;

// ---------------------------------------------------------------------------
// Backends: every test runs once per available backend, from one source.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Which {
    Cpu,
    Cuda,
    /// The CUDA backend's programs on the CPU (`KILN_TEST_EMULATE=1` with
    /// `--features cuda-emulator`).
    #[allow(dead_code)]
    Emulated,
}

thread_local! {
    static CURRENT: Cell<Which> = const { Cell::new(Which::Cpu) };
}

/// The backends of this machine: the CPU, and CUDA device 0 when the build
/// has the `cuda` feature and a GPU answers. Without one the CUDA runs are
/// skipped with a message; with `KILN_REQUIRE_CUDA=1` that is a failure.
fn available() -> &'static [Which] {
    static AVAILABLE: OnceLock<Vec<Which>> = OnceLock::new();
    AVAILABLE.get_or_init(|| {
        #[allow(unused_mut)]
        let mut which = match Context::cuda(0) {
            Ok(_) => vec![Which::Cpu, Which::Cuda],
            Err(e) => {
                if std::env::var("KILN_REQUIRE_CUDA").is_ok_and(|v| v == "1") {
                    panic!("KILN_REQUIRE_CUDA=1 but CUDA is not usable: {e}");
                }
                eprintln!("tests/ops: CUDA skipped ({})", e.to_string().lines().next().unwrap_or_default());
                vec![Which::Cpu]
            }
        };
        if std::env::var("KILN_TEST_EMULATE").is_ok_and(|v| v == "1") {
            #[cfg(feature = "cuda-emulator")]
            which.push(Which::Emulated);
            #[cfg(not(feature = "cuda-emulator"))]
            panic!("KILN_TEST_EMULATE=1 needs --features cuda-emulator");
        }
        which
    })
}

/// A fresh context on the backend the current [`each_backend`] pass tests.
pub fn dev() -> Context {
    match CURRENT.with(Cell::get) {
        Which::Cpu => Context::cpu(),
        Which::Cuda => Context::cuda(0).unwrap_or_else(|e| panic!("CUDA went away: {e}")),
        #[cfg(feature = "cuda-emulator")]
        Which::Emulated => Context::cuda_emulated(),
        #[cfg(not(feature = "cuda-emulator"))]
        Which::Emulated => unreachable!("only with the cuda-emulator feature"),
    }
}

/// Whether the current [`each_backend`] pass is the CUDA emulator's.
pub fn emulated() -> bool {
    CURRENT.with(Cell::get) == Which::Emulated
}

/// Says which backend a failing pass ran on.
struct Announce(Which);

impl Drop for Announce {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("(this failure is on the {:?} backend)", self.0);
        }
        CURRENT.with(|c| c.set(Which::Cpu));
    }
}

/// Runs `f` once per available backend; [`dev`] makes its contexts.
pub fn each_backend(f: impl Fn()) {
    for &which in available() {
        CURRENT.with(|c| c.set(which));
        let _announce = Announce(which);
        f();
    }
}

/// Every float dtype.
pub const FLOATS: [DType; 4] = [DType::F16, DType::BF16, DType::F32, DType::F64];
/// Every integer dtype.
pub const INTS: [DType; 3] = [DType::U8, DType::I32, DType::I64];
/// Every dtype with arithmetic.
pub const NUMERIC: [DType; 7] =
    [DType::F16, DType::BF16, DType::F32, DType::F64, DType::U8, DType::I32, DType::I64];

/// splitmix64: small, seeded, good enough for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 0x9E37_79B9_7F4A_7C15)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform on [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform();
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }

    /// Uniform integer in `lo..hi` (`hi` exclusive, `lo < hi`).
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        let span = (hi as i128 - lo as i128) as u128;
        (lo as i128 + (self.next_u64() as u128 % span) as i128) as i64
    }

    pub fn bool(&mut self) -> bool {
        self.next_u64() & 1 == 1
    }
}

/// The value `v` rounded to float `dtype` (identity for others).
pub fn round(dtype: DType, v: f64) -> f64 {
    match dtype {
        DType::F16 => f16::from_f64(v).to_f64(),
        DType::BF16 => bf16::from_f64(v).to_f64(),
        DType::F32 => v as f32 as f64,
        _ => v,
    }
}

/// The integer `v` wrapped to `dtype` (two's complement; bool is `!= 0`).
pub fn wrap(dtype: DType, v: i64) -> i64 {
    match dtype {
        DType::U8 => v as u8 as i64,
        DType::I32 => v as i32 as i64,
        DType::Bool => (v != 0) as i64,
        _ => v,
    }
}

/// Relative tolerance of one rounding-ish error in `dtype` (0 for exact dtypes).
pub fn rtol(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-12,
        DType::F32 => 1e-5,
        DType::F16 => 2e-3,
        DType::BF16 => 1.6e-2,
        _ => 0.0,
    }
}

// ---------------------------------------------------------------------------
// N-d reference arrays

/// A strided N-d array over shared data: views are cheap, as kiln's are.
#[derive(Clone, Debug)]
pub struct Nd<T> {
    pub shape: Vec<usize>,
    pub strides: Vec<usize>,
    pub offset: usize,
    pub data: Rc<Vec<T>>,
}

fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![0; shape.len()];
    let mut acc = 1;
    for i in (0..shape.len()).rev() {
        s[i] = acc;
        acc *= shape[i];
    }
    s
}

/// Calls `f` with every multi-index of `shape`, row-major.
pub fn for_each_index(shape: &[usize], mut f: impl FnMut(&[usize])) {
    let n: usize = shape.iter().product();
    let mut idx = vec![0; shape.len()];
    for _ in 0..n {
        f(&idx);
        for d in (0..shape.len()).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// The numpy broadcast of two shapes (panics if they do not broadcast).
pub fn broadcast_shape(a: &[usize], b: &[usize]) -> Vec<usize> {
    let r = a.len().max(b.len());
    (0..r)
        .map(|i| {
            let x = if i + a.len() >= r { a[i + a.len() - r] } else { 1 };
            let y = if i + b.len() >= r { b[i + b.len() - r] } else { 1 };
            match (x, y) {
                (x, y) if x == y => x,
                (1, y) => y,
                (x, 1) => x,
                _ => panic!("reference: {a:?} and {b:?} do not broadcast"),
            }
        })
        .collect()
}

impl<T: Copy> Nd<T> {
    pub fn new(data: Vec<T>, shape: &[usize]) -> Nd<T> {
        assert_eq!(data.len(), shape.iter().product::<usize>(), "reference: data length for {shape:?}");
        Nd { shape: shape.to_vec(), strides: contiguous_strides(shape), offset: 0, data: Rc::new(data) }
    }

    pub fn from_fn(shape: &[usize], mut f: impl FnMut(&[usize]) -> T) -> Nd<T> {
        let mut v = Vec::with_capacity(shape.iter().product());
        for_each_index(shape, |i| v.push(f(i)));
        Nd::new(v, shape)
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn get(&self, idx: &[usize]) -> T {
        let at: usize = idx.iter().zip(&self.strides).map(|(i, s)| i * s).sum();
        self.data[self.offset + at]
    }

    pub fn to_vec(&self) -> Vec<T> {
        let mut v = Vec::with_capacity(self.numel());
        for_each_index(&self.shape, |i| v.push(self.get(i)));
        v
    }

    pub fn contiguous(&self) -> Nd<T> {
        Nd::new(self.to_vec(), &self.shape)
    }

    pub fn map<U: Copy>(&self, mut f: impl FnMut(T) -> U) -> Nd<U> {
        Nd::new(self.to_vec().into_iter().map(&mut f).collect(), &self.shape)
    }

    pub fn permute(&self, perm: &[usize]) -> Nd<T> {
        Nd {
            shape: perm.iter().map(|&p| self.shape[p]).collect(),
            strides: perm.iter().map(|&p| self.strides[p]).collect(),
            offset: self.offset,
            data: self.data.clone(),
        }
    }

    pub fn transpose(&self, a: usize, b: usize) -> Nd<T> {
        let mut perm: Vec<usize> = (0..self.shape.len()).collect();
        perm.swap(a, b);
        self.permute(&perm)
    }

    pub fn slice(&self, dim: usize, start: usize, step: usize, len: usize) -> Nd<T> {
        assert!(len == 0 || start + (len - 1) * step < self.shape[dim]);
        let mut out = self.clone();
        out.offset += start * self.strides[dim];
        out.strides[dim] *= step;
        out.shape[dim] = len;
        out
    }

    pub fn expand(&self, shape: &[usize]) -> Nd<T> {
        let r = shape.len();
        let k = self.shape.len();
        assert!(k <= r);
        let mut strides = vec![0; r];
        for i in 0..k {
            let (d, t) = (self.shape[i], shape[r - k + i]);
            assert!(d == t || d == 1, "reference: cannot expand {:?} to {shape:?}", self.shape);
            strides[r - k + i] = if d == t { self.strides[i] } else { 0 };
        }
        Nd { shape: shape.to_vec(), strides, offset: self.offset, data: self.data.clone() }
    }

    pub fn reshape(&self, shape: &[usize]) -> Nd<T> {
        Nd::new(self.to_vec(), shape)
    }

    /// `f(a, b)` with numpy broadcasting.
    pub fn zip<U: Copy, V: Copy>(&self, other: &Nd<U>, mut f: impl FnMut(T, U) -> V) -> Nd<V> {
        let shape = broadcast_shape(&self.shape, &other.shape);
        let (a, b) = (self.expand(&shape), other.expand(&shape));
        Nd::from_fn(&shape, |i| f(a.get(i), b.get(i)))
    }

    /// Reduces `dims` (sorted, distinct): `f` gets the reduced elements in
    /// row-major order of the reduced dims.
    pub fn reduce<U: Copy>(&self, dims: &[usize], keepdim: bool, mut f: impl FnMut(&[T]) -> U) -> Nd<U> {
        let kept: Vec<usize> = (0..self.shape.len()).filter(|d| !dims.contains(d)).collect();
        let kept_shape: Vec<usize> = kept.iter().map(|&d| self.shape[d]).collect();
        let red_shape: Vec<usize> = dims.iter().map(|&d| self.shape[d]).collect();
        let mut out = Vec::new();
        for_each_index(&kept_shape, |k| {
            let mut vals = Vec::new();
            let mut full = vec![0; self.shape.len()];
            for (j, &d) in kept.iter().enumerate() {
                full[d] = k[j];
            }
            for_each_index(&red_shape, |r| {
                for (j, &d) in dims.iter().enumerate() {
                    full[d] = r[j];
                }
                vals.push(self.get(&full));
            });
            out.push(f(&vals));
        });
        let out_shape: Vec<usize> = (0..self.shape.len())
            .filter_map(|d| {
                if !dims.contains(&d) {
                    Some(self.shape[d])
                } else if keepdim {
                    Some(1)
                } else {
                    None
                }
            })
            .collect();
        Nd::new(out, &out_shape)
    }
}

/// PyTorch's layer norm of the rows of `x` (its last dim, `w.len()`
/// wide) in f64: `(v - mean) / sqrt(var + eps) * w + b`, the variance
/// biased.
pub fn layer_norm_ref(x: &Nd<f64>, w: &[f64], b: &[f64], eps: f64) -> Nd<f64> {
    let n = w.len();
    let rows: Vec<f64> = x
        .to_vec()
        .chunks(n)
        .flat_map(|row| {
            let mean = row.iter().sum::<f64>() / n as f64;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n as f64;
            let inv = 1.0 / (var + eps).sqrt();
            row.iter().enumerate().map(move |(j, v)| (v - mean) * inv * w[j] + b[j]).collect::<Vec<_>>()
        })
        .collect();
    Nd::new(rows, &x.shape)
}

/// Batched matmul of `[.., m, k] x [.., k, n]` with broadcast batch dims
/// (rank >= 2 both); `acc` folds one product into the accumulator.
pub fn matmul_ref<T: Copy>(a: &Nd<T>, b: &Nd<T>, zero: T, mut acc: impl FnMut(T, T, T) -> T) -> Nd<T> {
    let (ra, rb) = (a.shape.len(), b.shape.len());
    let (m, k, n) = (a.shape[ra - 2], a.shape[ra - 1], b.shape[rb - 1]);
    assert_eq!(k, b.shape[rb - 2]);
    let batch = broadcast_shape(&a.shape[..ra - 2], &b.shape[..rb - 2]);
    let with = |x: usize, y: usize| {
        let mut s = batch.clone();
        s.extend([x, y]);
        s
    };
    let (a, b) = (a.expand(&with(m, k)), b.expand(&with(k, n)));
    let r = batch.len();
    Nd::from_fn(&with(m, n), |i| {
        let mut ia = i.to_vec();
        let mut ib = i.to_vec();
        let mut s = zero;
        for kk in 0..k {
            ia[r + 1] = kk;
            ib[r] = kk;
            s = acc(s, a.get(&ia), b.get(&ib));
        }
        s
    })
}

// ---------------------------------------------------------------------------
// Random inputs

/// Random float values (roughly normal, std `scale`), rounded to `dtype`.
pub fn rand_f(rng: &mut Rng, dtype: DType, shape: &[usize], scale: f64) -> Nd<f64> {
    let n: usize = shape.iter().product();
    let mut v: Vec<f64> = (0..n).map(|_| round(dtype, rng.normal() * scale)).collect();
    if v.iter().all(|&x| x == 0.0) && n > 0 {
        v[0] = 1.0;
    }
    Nd::new(v, shape)
}

/// Random positive float values (for log, sqrt, pow bases).
pub fn rand_pos(rng: &mut Rng, dtype: DType, shape: &[usize]) -> Nd<f64> {
    let n: usize = shape.iter().product();
    Nd::new((0..n).map(|_| round(dtype, rng.normal().abs() * 2.0 + 0.125)).collect(), shape)
}

/// Random integers (as i64) over the whole range of `dtype`, so that
/// arithmetic wraps; bool is 0/1.
pub fn rand_i(rng: &mut Rng, dtype: DType, shape: &[usize]) -> Nd<i64> {
    let n: usize = shape.iter().product();
    let v: Vec<i64> = (0..n)
        .map(|_| match dtype {
            DType::U8 => rng.range(0, 256),
            DType::I32 => rng.range(i32::MIN as i64, i32::MAX as i64 + 1),
            DType::I64 => rng.next_u64() as i64,
            DType::Bool => rng.bool() as i64,
            d => panic!("rand_i of {d}"),
        })
        .collect();
    Nd::new(v, shape)
}

/// Random integers in `lo..hi`, wrapped to `dtype`.
pub fn rand_small_i(rng: &mut Rng, dtype: DType, shape: &[usize], lo: i64, hi: i64) -> Nd<i64> {
    let n: usize = shape.iter().product();
    Nd::new((0..n).map(|_| wrap(dtype, rng.range(lo, hi))).collect(), shape)
}

// ---------------------------------------------------------------------------
// Tensors <-> host

/// A tensor of float `dtype` from f64 values (rounded to the dtype).
#[track_caller]
pub fn tensor_f(ctx: &Context, dtype: DType, a: &Nd<f64>) -> Tensor {
    let v = a.to_vec();
    let s = a.shape.clone();
    match dtype {
        DType::F16 => ctx.tensor(&v.iter().map(|&x| f16::from_f64(x)).collect::<Vec<_>>(), s),
        DType::BF16 => ctx.tensor(&v.iter().map(|&x| bf16::from_f64(x)).collect::<Vec<_>>(), s),
        DType::F32 => ctx.tensor(&v.iter().map(|&x| x as f32).collect::<Vec<_>>(), s),
        DType::F64 => ctx.tensor(&v, s),
        d => panic!("tensor_f of {d}"),
    }
}

/// A tensor of integer or bool `dtype` from i64 values (which must fit).
#[track_caller]
pub fn tensor_i(ctx: &Context, dtype: DType, a: &Nd<i64>) -> Tensor {
    let v = a.to_vec();
    let s = a.shape.clone();
    match dtype {
        DType::U8 => ctx.tensor(&v.iter().map(|&x| u8::try_from(x).unwrap()).collect::<Vec<_>>(), s),
        DType::I32 => ctx.tensor(&v.iter().map(|&x| i32::try_from(x).unwrap()).collect::<Vec<_>>(), s),
        DType::I64 => ctx.tensor(&v, s),
        DType::Bool => ctx.tensor(&v.iter().map(|&x| x != 0).collect::<Vec<_>>(), s),
        d => panic!("tensor_i of {d}"),
    }
}

/// A random tensor of any dtype and its values as the host reference.
pub enum Host {
    F(Nd<f64>),
    I(Nd<i64>),
}

impl Host {
    pub fn f(&self) -> &Nd<f64> {
        match self {
            Host::F(a) => a,
            Host::I(_) => panic!("Host::f of integer data"),
        }
    }
}

/// A tensor holding host values of `dtype`.
#[track_caller]
pub fn upload(ctx: &Context, dtype: DType, h: &Host) -> Tensor {
    match h {
        Host::F(a) => tensor_f(ctx, dtype, a),
        Host::I(a) => tensor_i(ctx, dtype, a),
    }
}

/// Fresh random values of `dtype` (floats ~N(0, 2^2), ints over their
/// whole range, bools random) and the tensor holding them.
#[track_caller]
pub fn rand_tensor(ctx: &Context, rng: &mut Rng, dtype: DType, shape: &[usize]) -> (Tensor, Host) {
    if dtype.is_float() {
        let a = rand_f(rng, dtype, shape, 2.0);
        (tensor_f(ctx, dtype, &a), Host::F(a))
    } else {
        let a = rand_i(rng, dtype, shape);
        (tensor_i(ctx, dtype, &a), Host::I(a))
    }
}

/// Reads any tensor back as f64 (exact for every dtype but large i64).
#[track_caller]
pub fn read_f(t: &Tensor) -> Nd<f64> {
    let v: Vec<f64> = match t.dtype() {
        DType::F16 => t.to_vec::<f16>().map(|v| v.into_iter().map(|x| x.to_f64()).collect()),
        DType::BF16 => t.to_vec::<bf16>().map(|v| v.into_iter().map(|x| x.to_f64()).collect()),
        DType::F32 => t.to_vec::<f32>().map(|v| v.into_iter().map(|x| x as f64).collect()),
        DType::F64 => t.to_vec::<f64>(),
        DType::U8 => t.to_vec::<u8>().map(|v| v.into_iter().map(|x| x as f64).collect()),
        DType::I32 => t.to_vec::<i32>().map(|v| v.into_iter().map(|x| x as f64).collect()),
        DType::I64 => t.to_vec::<i64>().map(|v| v.into_iter().map(|x| x as f64).collect()),
        DType::Bool => t.to_vec::<bool>().map(|v| v.into_iter().map(|x| x as u8 as f64).collect()),
    }
    .unwrap_or_else(|e| panic!("reading {t:?} failed:\n{e}"));
    Nd::new(v, t.shape())
}

/// Reads an integer or bool tensor back exactly, as i64.
#[track_caller]
pub fn read_i(t: &Tensor) -> Nd<i64> {
    let v: Vec<i64> = match t.dtype() {
        DType::U8 => t.to_vec::<u8>().map(|v| v.into_iter().map(|x| x as i64).collect()),
        DType::I32 => t.to_vec::<i32>().map(|v| v.into_iter().map(|x| x as i64).collect()),
        DType::I64 => t.to_vec::<i64>(),
        DType::Bool => t.to_vec::<bool>().map(|v| v.into_iter().map(|x| x as i64).collect()),
        d => panic!("read_i of {d}"),
    }
    .unwrap_or_else(|e| panic!("reading {t:?} failed:\n{e}"));
    Nd::new(v, t.shape())
}

// ---------------------------------------------------------------------------
// Comparisons

fn check_meta(got: &Tensor, dtype: DType, shape: &[usize], what: &str) {
    if let Some(e) = got.error() {
        panic!("{what}: the op failed when recorded:\n{e}");
    }
    assert_eq!(got.dtype(), dtype, "{what}: dtype");
    assert_eq!(got.shape(), shape, "{what}: shape");
}

/// Elementwise closeness for `dtype`: `|got - want| <= rtol * (|want| + scale)`;
/// NaN matches NaN, infinities must match exactly; exact for ints and bool.
pub fn assert_close(got: &[f64], want: &[f64], dtype: DType, scale: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: element count");
    let tol = rtol(dtype);
    let mut bad = Vec::new();
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = if w.is_nan() {
            g.is_nan()
        } else if w.is_infinite() || tol == 0.0 {
            g == w
        } else {
            (g - w).abs() <= tol * (w.abs() + scale)
        };
        if !ok {
            bad.push((i, g, w));
        }
    }
    if !bad.is_empty() {
        let shown: Vec<String> =
            bad.iter().take(8).map(|(i, g, w)| format!("[{i}] got {g:e}, want {w:e}")).collect();
        panic!(
            "{what} ({dtype}): {} of {} elements differ (rtol {tol:e}, scale {scale}):\n  {}",
            bad.len(),
            got.len(),
            shown.join("\n  ")
        );
    }
}

/// Checks a float result: dtype, shape, then values (reference rounded to
/// `dtype` first). `scale` is the absolute magnitude errors are relative to
/// (1 for elementwise ops on O(1) data; more for reductions and matmul).
#[track_caller]
pub fn check_f(got: &Tensor, dtype: DType, want: &Nd<f64>, scale: f64, what: &str) {
    check_meta(got, dtype, &want.shape, what);
    let g = read_f(got).to_vec();
    let w: Vec<f64> = want.to_vec().into_iter().map(|x| round(dtype, x)).collect();
    assert_close(&g, &w, dtype, scale, what);
}

/// Checks an integer or bool result exactly; `want` is wrapped to `dtype`.
#[track_caller]
pub fn check_i(got: &Tensor, dtype: DType, want: &Nd<i64>, what: &str) {
    check_meta(got, dtype, &want.shape, what);
    let g = read_i(got).to_vec();
    let w: Vec<i64> = want.to_vec().into_iter().map(|x| wrap(dtype, x)).collect();
    if g != w {
        let bad: Vec<String> = g
            .iter()
            .zip(&w)
            .enumerate()
            .filter(|(_, (a, b))| a != b)
            .take(8)
            .map(|(i, (a, b))| format!("[{i}] got {a}, want {b}"))
            .collect();
        panic!(
            "{what} ({dtype}): {} of {} elements differ:\n  {}",
            g.iter().zip(&w).filter(|(a, b)| a != b).count(),
            g.len(),
            bad.join("\n  ")
        );
    }
}

/// Checks `got` against a host value of its kind.
#[track_caller]
pub fn check(got: &Tensor, dtype: DType, want: &Host, scale: f64, what: &str) {
    match want {
        Host::F(w) => check_f(got, dtype, w, scale, what),
        Host::I(w) => check_i(got, dtype, w, what),
    }
}

/// Largest |x|, at least 1.
pub fn max_abs(a: &Nd<f64>) -> f64 {
    a.to_vec().into_iter().filter(|x| x.is_finite()).fold(1.0, |m, x| m.max(x.abs()))
}
