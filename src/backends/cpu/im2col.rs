//! A convolution's column matrix (im2col): the input's planes copied once
//! with their padding, then every window row copied into its place.
//!
//! Before issue 38's twelfth session the input was first made dense and
//! cast (`map1`, a gather for the permuted input of a weight gradient),
//! then copied again with its padding into a freshly zeroed vector, and
//! each window row (3-8 elements in the digits CNN) was a copy of its own
//! length: a few branches and a short copy per 3-8 elements, about 0.7 ns
//! an element, a fifth of the CNN's step on the calling thread. Now:
//!
//! - [`padded_planes`] reads the input through its strides (any view) and
//!   casts while it writes the padded planes, into reused scratch (only
//!   the padding is zeroed);
//! - an image's window rows for one column-matrix row are one loop whose
//!   row length is a constant (a loop per length, 1 to [`WIDE`]), so each
//!   row is a few moves and the loop a few instructions, where the index
//!   arithmetic, the branches and a copy of run-time length were per row.
//!
//! Nothing here computes: the column matrix holds the same values as
//! before, so the products (and the bits of every output) are the same.

use super::elementwise::copy_short;
use super::matmul::{as_f32, as_f32_mut, FEW_ROWS};
use super::sgemm::{self, blocks};
use super::storage::{cast_elem, Elem, View};
use crate::{Error, Result};
use rayon::prelude::*;

/// The longest window row copied with its length known.
const WIDE: usize = 8;

/// The shapes an im2col needs.
pub(super) struct Geometry {
    pub c: usize,
    pub h: usize,
    pub wi: usize,
    pub cg: usize,
    pub kh: usize,
    pub kw: usize,
    pub oh: usize,
    pub ow: usize,
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
}

impl Geometry {
    /// Elements of the padded planes of `n` images.
    pub(super) fn padded_len(&self, n: usize) -> usize {
        n * self.c * (self.h + 2 * self.padding[0]) * (self.wi + 2 * self.padding[1])
    }

    /// The column matrix of images `b0..b0 + nb`, group `gi`, into `col`
    /// (every element written): row `(ci, ky, kx)`, column `(b, oy, ox)`,
    /// so one product by the group's `[og, kk]` weights gives every
    /// image's outputs. `xp` is [`padded_planes`]' output. Rows split
    /// across threads when large.
    pub(super) fn im2col<R: Copy + Send + Sync>(
        &self,
        xp: &[R],
        gi: usize,
        b0: usize,
        nb: usize,
        col: &mut [R],
    ) {
        let (pp, cols) = (self.oh * self.ow, nb * self.oh * self.ow);
        let (hp, wp) = (self.h + 2 * self.padding[0], self.wi + 2 * self.padding[1]);
        let [sh, sw] = self.stride;
        let [dh, dw] = self.dilation;
        let (oh, ow) = (self.oh, self.ow);
        if pp == 0 || col.is_empty() {
            return;
        }
        // One image's window rows of one column-matrix row: `oh` rows of
        // `ow`, `sh * wp` apart in the plane, from the first window's row.
        let span = (oh - 1) * sh * wp + (ow - 1) * sw + 1;
        let fill = |r: usize, row: &mut [R]| {
            let (ci, ky, kx) = (r / (self.kh * self.kw), (r / self.kw) % self.kh, r % self.kw);
            let first = ky * dh * wp + kx * dw;
            for (bi, seg) in row.chunks_exact_mut(pp).enumerate() {
                let at = ((b0 + bi) * self.c + gi * self.cg + ci) * hp * wp + first;
                windows(seg, &xp[at..at + span], ow, sh * wp, sw);
            }
        };
        if col.len() >= super::index::COPY_PAR_THRESHOLD {
            col.par_chunks_mut(cols).enumerate().for_each(|(r, row)| fill(r, row));
        } else {
            col.chunks_mut(cols).enumerate().for_each(|(r, row)| fill(r, row));
        }
    }
}

/// Columns of the product per block of [`Geometry::product`]: 16
/// slivers of B (at most 256 x 256 floats packed, in L2).
const SPAN: usize = 256;

impl Geometry {
    /// `prod = wg x col` (`og x kk` by `kk x nb * oh * ow`) for images
    /// `b0..b0 + nb`, group `gi`, without the column matrix: each block of
    /// B is packed straight from `xp` (the [`padded_planes`]) into
    /// `sgemm`'s 16-column slivers, each sliver row sixteen loads from the
    /// places its columns start at (a table per block; a copy per window
    /// row cost its loop and checks per 3-4 elements), and multiplied on
    /// the calling thread. `false` (nothing
    /// written) where it does not apply: not `f32`, no AVX2+FMA, or a
    /// product of at most `matmul::FEW_ROWS` rows (which `gemm_rows`
    /// computes another way).
    ///
    /// Same bits as [`Geometry::im2col`] then `gemm_rowmajor`: B holds the
    /// same elements, the inner dimension is cut into `sgemm`'s slices
    /// ([`blocks::slice_depth`]) added in order by the same register
    /// kernel, whose chains do not depend on the column blocks.
    ///
    /// Why: the column matrix (73-590 KB for the digits CNN) was written
    /// by im2col and read back by the packing, both out of L1 and L2, and
    /// its stores were the slowest part of the convolution.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn product<R: Elem>(
        &self,
        xp: &[R],
        wg: &[R],
        og: usize,
        gi: usize,
        b0: usize,
        nb: usize,
        prod: &mut [R],
    ) -> bool {
        let (Some(xp), Some(wg), Some(prod)) = (as_f32(xp), as_f32(wg), as_f32_mut(prod)) else {
            return false;
        };
        let (kk, pp) = (self.cg * self.kh * self.kw, self.oh * self.ow);
        let cols = nb * pp;
        if !sgemm::available() || og <= FEW_ROWS || kk == 0 || cols == 0 || prod.len() != og * cols {
            return false;
        }
        let (hp, wp) = (self.h + 2 * self.padding[0], self.wi + 2 * self.padding[1]);
        let (plane, image) = (hp * wp, self.c * hp * wp);
        let [sh, sw] = self.stride;
        let [dh, dw] = self.dilation;
        // Where row r of B starts in a plane group, and column j in xp.
        let row_at: Vec<usize> = (0..kk)
            .map(|r| {
                let (ci, ky, kx) = (r / (self.kh * self.kw), (r / self.kw) % self.kh, r % self.kw);
                ci * plane + ky * dh * wp + kx * dw
            })
            .collect();
        let first = (b0 * self.c + gi * self.cg) * plane;
        let col_at = |j: usize| {
            let (b, q) = (j / pp, j % pp);
            first + b * image + (q / self.ow) * sh * wp + (q % self.ow) * sw
        };
        let depth = blocks::slice_depth(kk);
        let slices: Vec<(usize, usize)> = (0..kk).step_by(depth).map(|p0| (p0, depth.min(kk - p0))).collect();
        let a = sgemm::Mat { data: wg, base: 0, rs: kk, cs: 1 };
        let packed_a: Vec<Vec<f32>> = slices
            .iter()
            .map(|&(p0, kc)| {
                let mut v = Vec::new();
                blocks::pack_a(a, 0, og, p0, kc, &mut v);
                v
            })
            .collect();
        let wide = blocks::wide_available();
        let mut pb = Vec::new();
        let mut at = Vec::new();
        for j0 in (0..cols).step_by(SPAN) {
            let nw = SPAN.min(cols - j0);
            // Where each column of the block starts, relative to a row's
            // start; past the block's last column, its first column's.
            at.clear();
            at.extend((0..nw.div_ceil(16) * 16).map(|j| col_at(j0 + if j < nw { j } else { 0 })));
            for (si, &(p0, kc)) in slices.iter().enumerate() {
                pb.resize(blocks::packed_b_len(kc, nw), 0.0);
                for ((s, sliver), at) in pb.chunks_exact_mut(16 * kc).enumerate().zip(at.chunks_exact(16)) {
                    let Ok(at) = <&[usize; 16]>::try_from(at) else { continue };
                    let hi = at.iter().copied().max().unwrap_or(0);
                    let width = 16.min(nw - 16 * s);
                    for (row, &ra) in sliver.chunks_exact_mut(16).zip(&row_at[p0..p0 + kc]) {
                        let src = &xp[ra..=ra + hi];
                        for (v, &k) in row.iter_mut().zip(at) {
                            // SAFETY: `k <= hi` and `src` holds `hi + 1` elements.
                            *v = unsafe { *src.get_unchecked(k) };
                        }
                        row[width..].fill(0.0);
                    }
                }
                blocks::multiply(&packed_a[si], &pb, kc, og, nw, &mut prod[j0..], cols, si > 0, wide);
            }
        }
        true
    }
}

/// `dst` (rows of `ow`) from the rows of `src` `step` apart, `sw` apart
/// within a row. Rows of up to [`WIDE`] elements copy with their length
/// known, so each is a few moves and the loop a few instructions.
fn windows<R: Copy>(dst: &mut [R], src: &[R], ow: usize, step: usize, sw: usize) {
    if sw != 1 {
        for (oy, d) in dst.chunks_exact_mut(ow).enumerate() {
            for (j, v) in d.iter_mut().enumerate() {
                *v = src[oy * step + j * sw];
            }
        }
        return;
    }
    match ow {
        1 => rows_of::<R, 1>(dst, src, step),
        2 => rows_of::<R, 2>(dst, src, step),
        3 => rows_of::<R, 3>(dst, src, step),
        4 => rows_of::<R, 4>(dst, src, step),
        5 => rows_of::<R, 5>(dst, src, step),
        6 => rows_of::<R, 6>(dst, src, step),
        7 => rows_of::<R, 7>(dst, src, step),
        WIDE => rows_of::<R, WIDE>(dst, src, step),
        _ => {
            for (oy, d) in dst.chunks_exact_mut(ow).enumerate() {
                copy_short(d, &src[oy * step..oy * step + ow]);
            }
        }
    }
}

/// [`windows`] of rows of `W` adjacent elements.
#[inline(always)]
fn rows_of<R: Copy, const W: usize>(dst: &mut [R], src: &[R], step: usize) {
    for oy in 0..dst.len() / W {
        dst[oy * W..oy * W + W].copy_from_slice(&src[oy * step..oy * step + W]);
    }
}

/// `x` (`[n, c, h, w]`, any strides) cast to `R`, as planes with `ph`
/// rows and `pw` columns of zeros around each (`[n, c, h + 2 ph, w + 2
/// pw]`): into `dst`, every element written.
pub(super) fn padded_planes<T: Elem, R: Elem>(
    x: &View<'_, T>,
    ph: usize,
    pw: usize,
    dst: &mut [R],
) -> Result<()> {
    let (d, st) = (&x.layout.shape.0, &x.layout.strides);
    if d.len() != 4 || st.len() != 4 {
        return Err(Error::Backend(format!("cpu: im2col of {}", x.layout.shape)));
    }
    let (h, w) = (d[2], d[3]);
    let (hp, wp) = (h + 2 * ph, w + 2 * pw);
    let planes = d[0] * d[1];
    // The last element the view reads, so no index below can be out of
    // bounds (a layout that reaches past its storage is an error).
    let last =
        d.iter().zip(st).try_fold(x.layout.offset, |a, (&n, &s)| a.checked_add(n.saturating_sub(1) * s));
    if dst.len() != planes * hp * wp || (planes * h * w > 0 && last.is_none_or(|l| l >= x.data.len())) {
        return Err(Error::Backend(format!("cpu: im2col of {} into {} elements", x.layout.shape, dst.len())));
    }
    let zero = R::from_f64(0.0);
    for (i, out) in dst.chunks_mut(hp * wp.max(1)).enumerate() {
        let base = x.layout.offset + (i / d[1]) * st[0] + (i % d[1]) * st[1];
        out[..ph * wp].fill(zero);
        out[(ph + h) * wp..].fill(zero);
        for y in 0..h {
            let o = &mut out[(ph + y) * wp..][..wp];
            o[..pw].fill(zero);
            o[pw + w..].fill(zero);
            let at = base + y * st[2];
            if st[3] == 1 {
                for (v, &s) in o[pw..pw + w].iter_mut().zip(&x.data[at..at + w]) {
                    *v = cast_elem::<T, R>(s);
                }
            } else {
                for (j, v) in o[pw..pw + w].iter_mut().enumerate() {
                    *v = cast_elem::<T, R>(x.data[at + j * st[3]]);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::matmul::gemm_rowmajor;
    use super::*;
    use crate::backends::layout::Layout;
    use crate::ir::{window_out, Shape};

    /// The column matrix element by element, from `x` read through its
    /// layout: the definition, with no padded copy and no blocks.
    fn reference(x: &View<'_, f32>, g: &Geometry, gi: usize, b0: usize, nb: usize) -> Vec<f32> {
        let st = &x.layout.strides;
        let kk = g.cg * g.kh * g.kw;
        let mut out = Vec::with_capacity(kk * nb * g.oh * g.ow);
        for r in 0..kk {
            let (ci, ky, kx) = (r / (g.kh * g.kw), (r / g.kw) % g.kh, r % g.kw);
            for b in b0..b0 + nb {
                for oy in 0..g.oh {
                    for ox in 0..g.ow {
                        let iy = (oy * g.stride[0] + ky * g.dilation[0]) as isize - g.padding[0] as isize;
                        let ix = (ox * g.stride[1] + kx * g.dilation[1]) as isize - g.padding[1] as isize;
                        let inside = (0..g.h as isize).contains(&iy) && (0..g.wi as isize).contains(&ix);
                        out.push(if inside {
                            let c = gi * g.cg + ci;
                            x.data[x.layout.offset
                                + b * st[0]
                                + c * st[1]
                                + iy as usize * st[2]
                                + ix as usize * st[3]]
                        } else {
                            0.0
                        });
                    }
                }
            }
        }
        out
    }

    /// Every column matrix of `x` (a batch of `nb` from `b0`, every
    /// group) against [`reference`], bit for bit, written over a
    /// column matrix full of NaN (so a place left unwritten shows).
    #[allow(clippy::too_many_arguments)]
    fn check(
        x: &View<'_, f32>,
        cg: usize,
        k: [usize; 2],
        s: [usize; 2],
        p: [usize; 2],
        dl: [usize; 2],
        nb: usize,
    ) {
        let d = &x.layout.shape.0;
        let (n, c, h, wi) = (d[0], d[1], d[2], d[3]);
        let (Some(oh), Some(ow)) =
            (window_out(h, k[0], s[0], p[0], dl[0]), window_out(wi, k[1], s[1], p[1], dl[1]))
        else {
            return;
        };
        let g = Geometry { c, h, wi, cg, kh: k[0], kw: k[1], oh, ow, stride: s, padding: p, dilation: dl };
        let mut xp = vec![f32::NAN; g.padded_len(n)];
        padded_planes(x, p[0], p[1], &mut xp).unwrap();
        for gi in 0..c / cg {
            for b0 in (0..n).step_by(nb) {
                let nb = nb.min(n - b0);
                let want = reference(x, &g, gi, b0, nb);
                let mut col = vec![f32::NAN; want.len()];
                g.im2col(&xp, gi, b0, nb, &mut col);
                let same = col.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "im2col of {:?} (strides {:?}) k {k:?} s {s:?} p {p:?} d {dl:?} groups of {cg}, images {b0}+{nb}, group {gi}:\n{col:?}\nwant\n{want:?}",
                    x.layout.shape, x.layout.strides
                );
            }
        }
    }

    fn values(n: usize) -> Vec<f32> {
        // Distinct values, -0.0 among them, so a misplaced copy shows.
        (0..n).map(|i| if i == 3 { -0.0 } else { i as f32 * 0.5 - 7.25 }).collect()
    }

    #[test]
    fn column_matrices_match_the_definition_on_every_geometry() {
        for &(n, c, h, w) in
            &[(1, 1, 1, 1), (2, 3, 5, 7), (3, 2, 4, 4), (2, 2, 8, 8), (1, 4, 3, 17), (2, 1, 9, 12)]
        {
            let data = values(n * c * h * w + 5);
            let layout =
                Layout { shape: Shape(vec![n, c, h, w]), strides: vec![c * h * w, h * w, w, 1], offset: 5 };
            let x = View { data: &data, layout: &layout };
            for k in [[1, 1], [3, 3], [2, 3], [1, 5], [4, 4], [8, 8]] {
                for s in [[1, 1], [2, 2], [1, 3]] {
                    for p in [[0, 0], [1, 1], [2, 0], [0, 3]] {
                        for dl in [[1, 1], [2, 1]] {
                            for nb in [1, 2, n] {
                                check(&x, c, k, s, p, dl, nb);
                                if c % 2 == 0 {
                                    check(&x, c / 2, k, s, p, dl, nb);
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn column_matrices_of_permuted_and_strided_inputs() {
        // A weight gradient's input: [n, c, h, w] read as [c, n, h, w].
        let (n, c, h, w) = (5, 3, 4, 4);
        let data = values(n * c * h * w);
        let layout =
            Layout { shape: Shape(vec![c, n, h, w]), strides: vec![h * w, c * h * w, w, 1], offset: 0 };
        let x = View { data: &data, layout: &layout };
        for (k, p) in [([4, 4], [1, 1]), ([3, 3], [1, 1]), ([2, 2], [0, 0])] {
            check(&x, n, k, [1, 1], p, [1, 1], c);
            check(&x, n, k, [1, 1], p, [1, 1], 1);
        }
        // Rows and columns transposed, columns of the plane 12 apart, the
        // image stride 0 (expanded): [1, 2, 6, 5] over a 120-element storage.
        let data = values(130);
        let layout = Layout { shape: Shape(vec![1, 2, 6, 5]), strides: vec![0, 60, 1, 12], offset: 1 };
        let x = View { data: &data, layout: &layout };
        check(&x, 2, [3, 3], [1, 1], [1, 1], [1, 1], 1);
        check(&x, 1, [2, 3], [2, 1], [0, 2], [1, 2], 1);
    }

    #[test]
    fn a_layout_past_its_storage_is_an_error() {
        let data = values(20);
        let layout = Layout { shape: Shape(vec![1, 1, 4, 5]), strides: vec![20, 20, 5, 1], offset: 1 };
        let x = View { data: &data, layout: &layout };
        let mut xp = vec![0.0f32; 4 * 5];
        assert!(padded_planes(&x, 0, 0, &mut xp).is_err());
        let layout = Layout { offset: 0, ..layout };
        let x = View { data: &data, layout: &layout };
        padded_planes(&x, 0, 0, &mut xp).unwrap();
        assert!(padded_planes(&x, 1, 0, &mut xp).is_err(), "a destination of the wrong length");
    }

    /// [`Geometry::product`] against the column matrix and `gemm_rowmajor`,
    /// bit for bit: several column blocks and inner slices, a last
    /// partial sliver, more rows than a tile, strides, dilation, groups;
    /// and refused where it does not apply (few rows).
    #[test]
    fn a_product_packed_from_the_planes_is_the_column_matrixs() {
        if !sgemm::available() {
            return;
        }
        type Case = ([usize; 4], [usize; 4], usize, [usize; 2], [usize; 2], [usize; 2]);
        let cases: &[Case] = &[
            // x [n, c, h, w], w [o, cg, kh, kw], groups, stride, padding, dilation
            ([32, 16, 4, 4], [32, 16, 3, 3], 1, [1, 1], [1, 1], [1, 1]),
            ([32, 1, 8, 8], [16, 1, 3, 3], 1, [1, 1], [1, 1], [1, 1]),
            ([16, 32, 4, 4], [32, 32, 4, 4], 1, [1, 1], [1, 1], [1, 1]),
            ([1, 32, 8, 8], [16, 32, 8, 8], 1, [1, 1], [1, 1], [1, 1]),
            ([3, 6, 11, 9], [150, 3, 3, 2], 2, [2, 1], [1, 0], [1, 2]),
            ([2, 4, 7, 7], [5, 4, 1, 1], 1, [1, 3], [0, 2], [1, 1]),
            ([5, 3, 6, 21], [8, 3, 5, 5], 1, [1, 1], [2, 2], [1, 1]),
        ];
        for &(xs, ws, groups, s, p, dl) in cases {
            let [n, c, h, wi] = xs;
            let [o, cg, kh, kw] = ws;
            let (Some(oh), Some(ow)) =
                (window_out(h, kh, s[0], p[0], dl[0]), window_out(wi, kw, s[1], p[1], dl[1]))
            else {
                panic!("bad case");
            };
            let g = Geometry { c, h, wi, cg, kh, kw, oh, ow, stride: s, padding: p, dilation: dl };
            let data: Vec<f32> =
                (0..n * c * h * wi).map(|i| ((i * 7919) % 1009) as f32 / 97.0 - 5.0).collect();
            let wv: Vec<f32> =
                (0..o * cg * kh * kw).map(|i| ((i * 104729) % 997) as f32 / 89.0 - 5.5).collect();
            let layout = Layout::contiguous(Shape(xs.to_vec()));
            let x = View { data: &data, layout: &layout };
            let mut xp = vec![f32::NAN; g.padded_len(n)];
            padded_planes(&x, p[0], p[1], &mut xp).unwrap();
            let (og, kk) = (o / groups, cg * kh * kw);
            for gi in 0..groups {
                let wg = &wv[gi * og * kk..][..og * kk];
                for (b0, nb) in [(0, n), (n - 1, 1)] {
                    let cols = nb * oh * ow;
                    let mut col = vec![0f32; kk * cols];
                    g.im2col(&xp, gi, b0, nb, &mut col);
                    let mut want = vec![0f32; og * cols];
                    gemm_rowmajor(og, kk, cols, wg, &col, &mut want, false).unwrap();
                    let mut got = vec![f32::NAN; og * cols];
                    assert!(g.product(&xp, wg, og, gi, b0, nb, &mut got), "{xs:?} {ws:?}: not taken");
                    let same = got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "{xs:?} * {ws:?} groups {groups} s {s:?} p {p:?} d {dl:?}, images {b0}+{nb}"
                    );
                }
            }
        }
        // Few rows (gemm_rows' own path) and f64 are left to the column matrix.
        let g = Geometry {
            c: 1,
            h: 4,
            wi: 4,
            cg: 1,
            kh: 3,
            kw: 3,
            oh: 2,
            ow: 2,
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
        };
        let xp = vec![1f32; g.padded_len(1)];
        assert!(!g.product(&xp, &[1.0; 36], 4, 0, 0, 1, &mut [0.0; 16]));
        let xp = vec![1f64; g.padded_len(1)];
        assert!(!g.product(&xp, &[1.0; 45], 5, 0, 0, 1, &mut [0.0; 20]));
    }
}
