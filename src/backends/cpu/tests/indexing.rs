//! Indexing kernel tests: gather, index_select and cat over every
//! operand layout, and out-of-range indices as errors.

use super::{assert_close, host, transpose, vals, T};
use crate::ir::*;
use crate::Error;

#[test]
fn gather_index_select_cat() {
    let xv = vals(3 * 5, 15, -9.0, 9.0);
    for idt in [DType::I64, DType::I32] {
        let mut t = T::new();
        let x = t.input(host(&xv, DType::F32), [3, 5]);
        let idx = t.input(host(&[4.0, 0.0, 2.0, 1.0, 1.0, 3.0], idt), [3, 2]);
        let gth = t.op(Op::Gather { dim: 1 }, &[x, idx]);
        let isel_i = t.input(host(&[2.0, 0.0, 2.0, 1.0], idt), [4]);
        let isel = t.op(Op::IndexSelect { dim: 0 }, &[x, isel_i]);
        let xt = t.op(Op::Permute(vec![1, 0]), &[x]);
        let cat = t.op(Op::Cat { dim: 1 }, &[xt, xt, xt]);
        let out = t.run(&[gth, isel, cat]).unwrap();
        let x32: Vec<f64> = xv.iter().map(|&v| v as f32 as f64).collect();
        let gw = [x32[4], x32[0], x32[5 + 2], x32[5 + 1], x32[10 + 1], x32[10 + 3]];
        assert_close(&out[0], &gw, 0.0, "gather");
        let iw: Vec<f64> = [2, 0, 2, 1].iter().flat_map(|&r| x32[r * 5..r * 5 + 5].to_vec()).collect();
        assert_close(&out[1], &iw, 0.0, "index_select");
        let tv = transpose(&x32, 3, 5);
        let cw: Vec<f64> = (0..5).flat_map(|r| [&tv[r * 3..r * 3 + 3]; 3].concat()).collect();
        assert_close(&out[2], &cw, 0.0, "cat");
    }
}

/// `cat` along every dim of a rank-3 shape, each operand in a layout that
/// takes another of its paths: dense, a constant (every stride 0), a
/// slice whose trailing dimensions are runs, a permuted view (element by
/// element), a view expanded along one dimension; small outputs and ones
/// large enough to split across threads (`COPY_PAR_THRESHOLD`); against
/// the logical values.
#[test]
fn cat_writes_every_operand_layout_into_its_blocks() {
    // (the other dims, a multiple of each operand's size along `dim`, dtype)
    let cases = [
        ([3, 5, 7], 1, DType::F32),
        ([3, 5, 7], 1, DType::I64),
        ([3, 5, 7], 1, DType::F16),
        ([64, 64, 64], 8, DType::F32),
    ];
    for (base, m, d) in cases {
        for dim in 0..3 {
            // The output's shape with `k * m` along `dim`.
            let with = |k: usize| {
                let mut s = base;
                s[dim] = k * m;
                s
            };
            let numel = |s: [usize; 3]| s.iter().product::<usize>();
            let at = |s: [usize; 3], i: [usize; 3]| (i[0] * s[1] + i[1]) * s[2] + i[2];
            let mut t = T::new();
            let mut logical: Vec<(Vec<f64>, [usize; 3])> = Vec::new();
            // Dense, 2 along dim.
            let s0 = with(2);
            let v0 = host(&vals(numel(s0), 11 + dim as u64, -9.0, 9.0), d);
            let p0 = t.input(v0.clone(), s0);
            logical.push((v0.to_f64_vec(), s0));
            // A constant, 3 along dim.
            let s1 = with(3);
            let p1 = t.src(Op::Full(Scalar::Float(-2.0)), s1, d);
            logical.push((vec![-2.0; numel(s1)], s1));
            // Columns 1..6 of a wider stored array, 1 along dim.
            let s2 = with(1);
            let wide = [s2[0], s2[1], s2[2] + 3];
            let v2 = host(&vals(numel(wide), 13 + dim as u64, -9.0, 9.0), d);
            let w2 = t.input(v2.clone(), wide);
            let p2 = t.op(Op::Slice { dim: 2, start: 1, step: 1, len: s2[2] }, &[w2]);
            let f2 = v2.to_f64_vec();
            let mut l2 = Vec::new();
            for i in 0..s2[0] {
                for j in 0..s2[1] {
                    for k in 0..s2[2] {
                        l2.push(f2[at(wide, [i, j, k + 1])]);
                    }
                }
            }
            logical.push((l2, s2));
            // A permuted view, 2 along dim: stored as the reverse shape.
            let s3 = with(2);
            let rev = [s3[2], s3[1], s3[0]];
            let v3 = host(&vals(numel(rev), 17 + dim as u64, -9.0, 9.0), d);
            let w3 = t.input(v3.clone(), rev);
            let p3 = t.op(Op::Permute(vec![2, 1, 0]), &[w3]);
            let f3 = v3.to_f64_vec();
            let mut l3 = Vec::new();
            for i in 0..s3[0] {
                for j in 0..s3[1] {
                    for k in 0..s3[2] {
                        l3.push(f3[at(rev, [k, j, i])]);
                    }
                }
            }
            logical.push((l3, s3));
            // A row expanded along dim 1, 1 along dim.
            let s4 = with(1);
            let row = [s4[0], 1, s4[2]];
            let v4 = host(&vals(numel(row), 19 + dim as u64, -9.0, 9.0), d);
            let w4 = t.input(v4.clone(), row);
            let p4 = t.op(Op::Expand(Shape::new(s4.to_vec())), &[w4]);
            let f4 = v4.to_f64_vec();
            let mut l4 = Vec::new();
            for i in 0..s4[0] {
                for _ in 0..s4[1] {
                    for k in 0..s4[2] {
                        l4.push(f4[at(row, [i, 0, k])]);
                    }
                }
            }
            logical.push((l4, s4));
            let y = t.op(Op::Cat { dim }, &[p0, p1, p2, p3, p4]);
            let out_shape = with(9);
            let mut want = vec![0.0; numel(out_shape)];
            let mut offset = 0;
            for (vals, s) in &logical {
                for i in 0..s[0] {
                    for j in 0..s[1] {
                        for k in 0..s[2] {
                            let mut o = [i, j, k];
                            o[dim] += offset;
                            want[at(out_shape, o)] = vals[at(*s, [i, j, k])];
                        }
                    }
                }
                offset += s[dim];
            }
            assert_close(&t.run1(y), &want, 0.0, &format!("cat dim {dim} {d} {base:?} x{m}"));
        }
    }
}

#[test]
fn out_of_range_indices_are_errors() {
    let mut t = T::new();
    let x = t.input(HostData::F32(vec![0.0; 10]), [2, 5]);
    let idx = t.input(HostData::I64(vec![0, 7, 1, 2]), [2, 2]);
    let g = t.op(Op::Gather { dim: 1 }, &[x, idx]);
    let err = t.run(&[g]).unwrap_err();
    assert_eq!(err, Error::Runtime(format!("gather index 7 is out of range for dim 1 of size 5 (node {g})")));
    let mut t = T::new();
    let x = t.input(HostData::F32(vec![0.0; 10]), [2, 5]);
    let idx = t.input(HostData::I32(vec![-1]), [1]);
    let g = t.op(Op::IndexSelect { dim: 0 }, &[x, idx]);
    let err = t.run(&[g]).unwrap_err();
    assert_eq!(
        err,
        Error::Runtime(format!("index_select index -1 is out of range for dim 0 of size 2 (node {g})"))
    );
}
