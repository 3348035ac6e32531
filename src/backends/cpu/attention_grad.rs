//! The attention backward on the CPU: [`Op::AttentionStats`] and
//! [`Op::AttentionGrad`](crate::ir::Op::AttentionGrad) (see their docs),
//! a row or a key at a time, so no `[sq, sk]` matrix is stored.
//!
//! - Stats: per query row, the scores of the keys it keeps, their maximum
//!   `m` and `lse = m + ln Σ e^(s - m)` (`+inf` for a row that keeps no
//!   key), and `delta = o · g`.
//! - `wrt=q`: per query row, `dq = scale Σ_j p_j (g · v_j - delta) k_j`
//!   with `p_j = e^(s_j - lse)`.
//! - `wrt=kv`: per key, `dk = scale Σ_i p_ij (g_i · v - delta_i) q_i` and
//!   `dv = Σ_i p_ij g_i` over the query rows that keep it.
//!
//! Removed keys are skipped (the forward kernels never read them either).
//! f16, bf16 and f32 accumulate in f32, f64 in f64, as the forward does;
//! NaN and inf flow through the arithmetic (a NaN score makes its row's
//! `lse` NaN, so every probability of the row is NaN).
//!
//! [`Op::AttentionStats`]: crate::ir::Op::AttentionStats

use super::attention::{dense, Acc, Dims, MaskRead};
use super::storage::{Elem, Out};
use super::CpuBuffer;
use crate::ir::{AttnMask, AttnWrt, DType};
use crate::{Error, Result};
use rayon::prelude::*;

/// What both kernels read: the attention's settings and operands as
/// dense accumulator-type values.
struct Operands<A> {
    n: Dims,
    q: Vec<A>,
    k: Vec<A>,
    scale: A,
    causal: bool,
}

impl<A: Acc> Operands<A> {
    /// Row `i`'s score of key `j` in head `(b, h)` (`bh` its index), or
    /// `None` for a removed key.
    #[inline]
    fn score(&self, read: &MaskRead<'_, A>, bh: usize, i: usize, j: usize) -> Option<A> {
        let n = &self.n;
        if self.causal && j > i {
            return None;
        }
        let add = read.at(bh / n.h.max(1), bh % n.h.max(1), i, j)?;
        let qi = &self.q[(bh * n.sq + i) * n.d..][..n.d];
        let kj = &self.k[(bh * n.sk + j) * n.d..][..n.d];
        Some(dot(qi, kj) * self.scale + add)
    }
}

/// `Σ a_c b_c` in order.
#[inline]
fn dot<A: Acc>(a: &[A], b: &[A]) -> A {
    a.iter().zip(b).fold(A::ZERO, |s, (&x, &y)| s + x * y)
}

/// The mask reader of `mask` (`kind`), as [`MaskRead`] wants it.
fn mask_read<'a, A: Acc>(mask: Option<&'a CpuBuffer>, kind: AttnMask) -> Result<MaskRead<'a, A>> {
    if kind != AttnMask::None && mask.is_none() {
        return Err(Error::Backend("cpu: attention lacks its mask operand".into()));
    }
    MaskRead::new(mask, kind)
}

/// `attention_stats q, k, o, g [, mask]` into `out` (f32 `[b, h, sq, 2]`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn stats(
    q: &CpuBuffer,
    k: &CpuBuffer,
    o: &CpuBuffer,
    g: &CpuBuffer,
    mask: Option<&CpuBuffer>,
    kind: AttnMask,
    scale: f64,
    causal: bool,
    out: Out<'_>,
) -> Result<()> {
    let n = Dims::of(q, k, o)?;
    match q.dtype() {
        DType::F64 => stats_run::<f64, f64>([q, k, o, g], mask, kind, scale, causal, n, out),
        DType::F32 => stats_run::<f32, f32>([q, k, o, g], mask, kind, scale, causal, n, out),
        DType::F16 => stats_run::<half::f16, f32>([q, k, o, g], mask, kind, scale, causal, n, out),
        DType::BF16 => stats_run::<half::bf16, f32>([q, k, o, g], mask, kind, scale, causal, n, out),
        d => Err(Error::Backend(format!("cpu: attention_stats is not defined on {d}"))),
    }
}

fn stats_run<T: Elem, A: Acc + Elem>(
    [q, k, o, g]: [&CpuBuffer; 4],
    mask: Option<&CpuBuffer>,
    kind: AttnMask,
    scale: f64,
    causal: bool,
    n: Dims,
    out: Out<'_>,
) -> Result<()> {
    let read = mask_read::<A>(mask, kind)?;
    let (o, g) = (dense::<T, A>(o)?, dense::<T, A>(g)?);
    let ops = Operands { q: dense::<T, A>(q)?, k: dense::<T, A>(k)?, scale: A::of(scale), causal, n };
    let out = out.get::<A>()?;
    let (sq, sk, dv) = (ops.n.sq, ops.n.sk, ops.n.dv);
    if out.len() != ops.n.b * ops.n.h * sq * 2 {
        return Err(Error::Backend("cpu: attention_stats output of the wrong size".into()));
    }
    out.par_chunks_mut(2).enumerate().for_each(|(row, pair)| {
        let (bh, i) = (row / sq.max(1), row % sq.max(1));
        let scores: Vec<A> = (0..sk).filter_map(|j| ops.score(&read, bh, i, j)).collect();
        // NaN wins the maximum, as in the forward kernel.
        let m =
            scores.iter().fold(A::NEG_INF, |m, &s| if s > m || s.is_nan() && !m.is_nan() { s } else { m });
        let lse = if m == A::NEG_INF {
            f64::INFINITY
        } else {
            let sum = scores.iter().fold(A::ZERO, |l, &s| l + (s - m).exp());
            m.wide() + sum.wide().ln()
        };
        let at = row * dv;
        pair[0] = A::of(lse);
        pair[1] = dot(&o[at..at + dv], &g[at..at + dv]);
    });
    Ok(())
}

/// `attention_delta o, g, lse` into `out` (`[b, h, sq, 2]`): the stats
/// from the log-sum-exp the forward wrote, and `delta = o · g` as
/// [`stats`] computes it.
pub(crate) fn delta(o: &CpuBuffer, g: &CpuBuffer, lse: &CpuBuffer, out: Out<'_>) -> Result<()> {
    match o.dtype() {
        DType::F64 => delta_run::<f64, f64>(o, g, lse, out),
        DType::F32 => delta_run::<f32, f32>(o, g, lse, out),
        DType::F16 => delta_run::<half::f16, f32>(o, g, lse, out),
        DType::BF16 => delta_run::<half::bf16, f32>(o, g, lse, out),
        d => Err(Error::Backend(format!("cpu: attention_delta is not defined on {d}"))),
    }
}

fn delta_run<T: Elem, A: Acc + Elem>(
    o: &CpuBuffer,
    g: &CpuBuffer,
    lse: &CpuBuffer,
    out: Out<'_>,
) -> Result<()> {
    let dv = o.shape().0.get(3).copied().unwrap_or(0);
    let (o, g, lse) = (dense::<T, A>(o)?, dense::<T, A>(g)?, dense::<A, A>(lse)?);
    let out = out.get::<A>()?;
    if out.len() != lse.len() * 2 || o.len() != lse.len() * dv {
        return Err(Error::Backend("cpu: attention_delta operands of the wrong sizes".into()));
    }
    out.par_chunks_mut(2).zip(&lse).enumerate().for_each(|(row, (pair, &l))| {
        let at = row * dv;
        pair[0] = l;
        pair[1] = dot(&o[at..at + dv], &g[at..at + dv]);
    });
    Ok(())
}

/// `attention_grad q, k, v, g, stats [, mask] wrt=...` into `out`, and
/// for `wrt=kv+q` the queries' gradient into `dq_out` (its `extra
/// output=1`, where the plan reads it).
#[allow(clippy::too_many_arguments)]
pub(crate) fn grad(
    operands: [&CpuBuffer; 5],
    mask: Option<&CpuBuffer>,
    kind: AttnMask,
    scale: f64,
    causal: bool,
    wrt: AttnWrt,
    out: Out<'_>,
    dq_out: Option<Out<'_>>,
) -> Result<()> {
    let [q, k, v, _, _] = operands;
    let n = Dims::of(q, k, v)?;
    let outs = (out, dq_out);
    match q.dtype() {
        DType::F64 => grad_run::<f64, f64>(operands, mask, kind, scale, causal, wrt, n, outs),
        DType::F32 => grad_run::<f32, f32>(operands, mask, kind, scale, causal, wrt, n, outs),
        DType::F16 => grad_run::<half::f16, f32>(operands, mask, kind, scale, causal, wrt, n, outs),
        DType::BF16 => grad_run::<half::bf16, f32>(operands, mask, kind, scale, causal, wrt, n, outs),
        d => Err(Error::Backend(format!("cpu: attention_grad is not defined on {d}"))),
    }
}

#[allow(clippy::too_many_arguments)]
fn grad_run<T: Elem, A: Acc + Elem>(
    [q, k, v, g, st]: [&CpuBuffer; 5],
    mask: Option<&CpuBuffer>,
    kind: AttnMask,
    scale: f64,
    causal: bool,
    wrt: AttnWrt,
    n: Dims,
    (out, dq_out): (Out<'_>, Option<Out<'_>>),
) -> Result<()> {
    let read = mask_read::<A>(mask, kind)?;
    let (v, g) = (dense::<T, A>(v)?, dense::<T, A>(g)?);
    let st = dense::<A, A>(st)?;
    let ops = Operands { q: dense::<T, A>(q)?, k: dense::<T, A>(k)?, scale: A::of(scale), causal, n };
    let (sq, sk, d, dv) = (ops.n.sq, ops.n.sk, ops.n.d, ops.n.dv);
    let out = out.get::<T>()?;
    // `p` and `p (dP - delta)` of row `i` and key `j`, or `None` for a
    // removed key.
    let weights = |bh: usize, i: usize, j: usize| {
        let s = ops.score(&read, bh, i, j)?;
        let (lse, delta) = (st[(bh * sq + i) * 2], st[(bh * sq + i) * 2 + 1]);
        let p = (s - lse).exp();
        let dp = dot(&g[(bh * sq + i) * dv..][..dv], &v[(bh * sk + j) * dv..][..dv]);
        Some((p, p * (dp - delta)))
    };
    let (b, h) = (ops.n.b, ops.n.h);
    let want = match wrt {
        AttnWrt::Query => b * h * sq * d,
        AttnWrt::KeyValue | AttnWrt::KeyValueAndQuery => b * h * sk * (d + dv),
        AttnWrt::QueryKeyValue => 3 * b * h * sq * d,
    };
    if out.len() != want || wrt == AttnWrt::QueryKeyValue && (sq != sk || d != dv) {
        return Err(Error::Backend("cpu: attention_grad output of the wrong size".into()));
    }
    let query = |out: &mut [T]| {
        out.par_chunks_mut(d.max(1)).enumerate().for_each(|(row, dq)| {
            let (bh, i) = (row / sq.max(1), row % sq.max(1));
            let mut acc = vec![A::ZERO; d];
            for j in 0..sk {
                let Some((_, ds)) = weights(bh, i, j) else { continue };
                for (a, &kc) in acc.iter_mut().zip(&ops.k[(bh * sk + j) * d..][..d]) {
                    *a = *a + ds * kc;
                }
            }
            for (o, a) in dq.iter_mut().zip(acc) {
                *o = T::from_f64((a * ops.scale).wide());
            }
        });
    };
    let key_value = |out: &mut [T]| {
        let w = d + dv;
        out.par_chunks_mut(w.max(1)).enumerate().for_each(|(key, dkv)| {
            let (bh, j) = (key / sk.max(1), key % sk.max(1));
            let (mut dk, mut dvs) = (vec![A::ZERO; d], vec![A::ZERO; dv]);
            for i in 0..sq {
                let Some((p, ds)) = weights(bh, i, j) else { continue };
                for (a, &qc) in dk.iter_mut().zip(&ops.q[(bh * sq + i) * d..][..d]) {
                    *a = *a + ds * qc;
                }
                for (a, &gc) in dvs.iter_mut().zip(&g[(bh * sq + i) * dv..][..dv]) {
                    *a = *a + p * gc;
                }
            }
            for (o, a) in dkv[..d].iter_mut().zip(dk) {
                *o = T::from_f64((a * ops.scale).wide());
            }
            for (o, a) in dkv[d..].iter_mut().zip(dvs) {
                *o = T::from_f64(a.wide());
            }
        });
    };
    match wrt {
        AttnWrt::Query => query(out),
        AttnWrt::KeyValue => key_value(out),
        AttnWrt::KeyValueAndQuery => {
            key_value(out);
            if let Some(dq) = dq_out {
                let dq = dq.get::<T>()?;
                if dq.len() != b * h * sq * d {
                    return Err(Error::Backend("cpu: attention_grad's dq output of the wrong size".into()));
                }
                query(dq);
            }
        }
        AttnWrt::QueryKeyValue => {
            // `[b, h, s, d]` and `[b, h, s, 2d]`, then each row of d to
            // its place in `[b, s, 3, h, d]`.
            let (mut dq, mut dkv) =
                (vec![T::default(); b * h * sq * d], vec![T::default(); b * h * sk * 2 * d]);
            query(&mut dq);
            key_value(&mut dkv);
            for (row, x) in dq.chunks_exact(d.max(1)).enumerate() {
                let (bh, i) = (row / sq, row % sq);
                let at = ((bh / h * sq + i) * 3 * h + bh % h) * d;
                out[at..at + d].copy_from_slice(x);
            }
            for (row, x) in dkv.chunks_exact(2 * d.max(1)).enumerate() {
                let (bh, j) = (row / sk, row % sk);
                let at = ((bh / h * sk + j) * 3 * h + h + bh % h) * d;
                out[at..at + d].copy_from_slice(&x[..d]);
                out[at + h * d..at + h * d + d].copy_from_slice(&x[d..]);
            }
        }
    }
    Ok(())
}
