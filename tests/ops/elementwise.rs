//! Unary, binary, comparison, `where` and `cast` on every dtype they accept,
//! with broadcasting on every axis, scalar operands on either side, and
//! non-contiguous (view) operands.

use crate::reference::*;
use kiln::prelude::*;

type UnaryFn = fn(&Tensor) -> Tensor;
/// name, kiln op, f64 reference, positive domain only.
type UnaryCase = (&'static str, UnaryFn, fn(f64) -> f64, bool);
type IntUnaryCase = (&'static str, UnaryFn, fn(i64) -> i64);
/// name, kiln op, the f64 derivative.
type GradCase = (&'static str, UnaryFn, fn(f64) -> f64);

/// Every float unary op: name, kiln op, f64 reference, positive domain only.
fn unary_table() -> Vec<UnaryCase> {
    fn sigmoid(x: f64) -> f64 {
        1.0 / (1.0 + (-x).exp())
    }
    /// PyTorch's `gelu(approximate="tanh")`.
    fn gelu_tanh(x: f64) -> f64 {
        let k = (2.0 / std::f64::consts::PI).sqrt();
        0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())
    }
    vec![
        ("neg", |t| t.neg(), |x| -x, false),
        ("abs", |t| t.abs(), f64::abs, false),
        ("exp", |t| t.exp(), f64::exp, false),
        ("log", |t| t.log(), f64::ln, true),
        ("sqrt", |t| t.sqrt(), f64::sqrt, true),
        ("rsqrt", |t| t.rsqrt(), |x| 1.0 / x.sqrt(), true),
        ("recip", |t| t.recip(), |x| 1.0 / x, false),
        ("sin", |t| t.sin(), f64::sin, false),
        ("cos", |t| t.cos(), f64::cos, false),
        ("tanh", |t| t.tanh(), f64::tanh, false),
        ("sigmoid", |t| t.sigmoid(), sigmoid, false),
        ("relu", |t| t.relu(), |x| if x < 0.0 { 0.0 } else { x }, false),
        ("gelu", |t| t.gelu(), |x| 0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2)), false),
        ("gelu_tanh", |t| t.gelu_tanh(), gelu_tanh, false),
        ("silu", |t| t.silu(), |x| x * sigmoid(x), false),
    ]
}

/// Inputs for unary tests: contiguous odd shapes and a non-contiguous view
/// (a transposed, strided slice).
fn unary_inputs(ctx: &Context, rng: &mut Rng, dtype: DType, pos: bool) -> Vec<(String, Tensor, Nd<f64>)> {
    let gen = |rng: &mut Rng, shape: &[usize]| {
        if pos {
            rand_pos(rng, dtype, shape)
        } else {
            rand_f(rng, dtype, shape, 2.0)
        }
    };
    let mut out = Vec::new();
    for shape in [vec![1], vec![129], vec![3, 1, 5]] {
        let a = gen(rng, &shape);
        out.push((format!("{shape:?}"), tensor_f(ctx, dtype, &a), a));
    }
    let base = gen(rng, &[9, 5]);
    let t = tensor_f(ctx, dtype, &base).slice(0, 1, 9, 2).t();
    out.push(("[9,5][1:9:2].t()".into(), t, base.slice(0, 1, 2, 4).transpose(0, 1)));
    out
}

#[test]
fn unary_float_ops_on_every_float_dtype() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(1);
        for dtype in FLOATS {
            for (name, op, reference, pos) in unary_table() {
                for (desc, t, a) in unary_inputs(&ctx, &mut rng, dtype, pos) {
                    check_f(&op(&t), dtype, &a.map(reference), 1.0, &format!("{name} of {desc}"));
                }
            }
        }
    });
}

/// The activations' gradients (one op each, `gelu_tanh_grad` and the
/// rest) against f64 derivatives rounded once to the dtype, as PyTorch's
/// backward kernels compute them for half types: g · f'(x) for random x
/// and g, through `backward`, on every float dtype.
#[test]
fn activation_gradients_round_once_on_every_float_dtype() {
    fn phi(x: f64) -> f64 {
        0.5 * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
    }
    fn sigmoid(x: f64) -> f64 {
        1.0 / (1.0 + (-x).exp())
    }
    fn gelu_tanh_d(x: f64) -> f64 {
        let (k, c) = ((2.0 / std::f64::consts::PI).sqrt(), 0.044715);
        let t = (k * (x + c * x * x * x)).tanh();
        0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * c * x * x)
    }
    let cases: [GradCase; 3] = [
        ("gelu_tanh", |t| t.gelu_tanh(), gelu_tanh_d),
        ("gelu", |t| t.gelu(), |x| phi(x) + x * (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt()),
        ("silu", |t| t.silu(), |x| sigmoid(x) * (1.0 + x * (1.0 - sigmoid(x)))),
    ];
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(31);
        for dtype in FLOATS {
            for (k, (name, op, derivative)) in cases.iter().enumerate() {
                let (xa, ga) =
                    (rand_f(&mut rng, dtype, &[5, 67], 3.0), rand_f(&mut rng, dtype, &[5, 67], 1.0));
                let run = || -> kiln::Result<Tensor> {
                    let x = ctx.variable(&format!("x{k}{dtype}"), tensor_f(&ctx, dtype, &xa))?;
                    let loss = (&op(&x) * &tensor_f(&ctx, dtype, &ga)).sum_all();
                    Ok(loss.backward()?.get(&x).expect("x has a gradient").clone())
                };
                let dx = run().unwrap_or_else(|e| panic!("{name}'s gradient in {dtype}: {e}"));
                let want = xa.zip(&ga, |x, g| g * derivative(x));
                check_f(&dx, dtype, &want, 1.0, &format!("{name}'s gradient"));
            }
        }
    });
}

#[test]
fn unary_float_ops_at_special_values() {
    each_backend(|| {
        let ctx = dev();
        let specials = [0.0, -0.0, 1.0, -1.0, f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 1e-3, -20.0, 20.0];
        for dtype in FLOATS {
            let a = Nd::new(specials.to_vec(), &[specials.len()]);
            let t = tensor_f(&ctx, dtype, &a);
            for (name, op, reference, _) in unary_table() {
                // log/sqrt of negatives are NaN in the reference too.
                check_f(&op(&t), dtype, &a.map(reference), 1.0, &format!("{name} at special values"));
            }
        }
    });
}

#[test]
fn unary_int_ops_wrap() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(2);
        let table: [IntUnaryCase; 3] = [
            ("neg", |t| t.neg(), i64::wrapping_neg),
            ("abs", |t| t.abs(), i64::wrapping_abs),
            ("relu", |t| t.relu(), |x| x.max(0)),
        ];
        for dtype in INTS {
            let mut a = rand_i(&mut rng, dtype, &[129]).to_vec();
            // The values where wrapping shows: MIN, MIN+1, -1, 0, MAX.
            let (min, max) = match dtype {
                DType::U8 => (0, 255),
                DType::I32 => (i32::MIN as i64, i32::MAX as i64),
                _ => (i64::MIN, i64::MAX),
            };
            a[..6].copy_from_slice(&[min, min + 1, wrap(dtype, -1), 0, 1, max]);
            let a = Nd::new(a, &[129]);
            let t = tensor_i(&ctx, dtype, &a);
            let view = tensor_i(&ctx, dtype, &a.reshape(&[3, 43])).t();
            for (name, op, reference) in table {
                check_i(&op(&t), dtype, &a.map(reference), name);
                let want = a.reshape(&[3, 43]).transpose(0, 1).map(reference);
                check_i(&op(&view), dtype, &want, &format!("{name} of a transposed view"));
            }
            check_i(&-&t, dtype, &a.map(i64::wrapping_neg), "unary - operator");
        }
    });
}

#[test]
fn float_only_unary_ops_reject_ints_and_bool() {
    each_backend(|| {
        let ctx = dev();
        for dtype in [DType::U8, DType::I32, DType::I64, DType::Bool] {
            let t = ctx.zeros_dtype([3], dtype);
            for (name, op, _, _) in unary_table() {
                let allowed = dtype != DType::Bool && matches!(name, "neg" | "abs" | "relu");
                let r = op(&t);
                assert_eq!(r.error().is_none(), allowed, "{name} on {dtype}: {:?}", r.error());
                if !allowed {
                    assert!(matches!(r.error(), Some(Error::DType { .. })), "{name} on {dtype}");
                }
            }
        }
    });
}

// ---------------------------------------------------------------------------
// Binary ops

type BinaryFn = fn(&Tensor, &Tensor) -> Tensor;

fn binary_table() -> Vec<(&'static str, BinaryFn)> {
    vec![
        ("add", |a, b| a + b),
        ("sub", |a, b| a - b),
        ("mul", |a, b| a * b),
        ("div", |a, b| a / b),
        ("pow", |a, b| a.pow(b)),
        ("maximum", |a, b| a.maximum(b)),
        ("minimum", |a, b| a.minimum(b)),
    ]
}

fn float_binary(name: &str, a: f64, b: f64) -> f64 {
    match name {
        "add" => a + b,
        "sub" => a - b,
        "mul" => a * b,
        "div" => a / b,
        "pow" => a.powf(b),
        "maximum" if a.is_nan() || b.is_nan() => f64::NAN,
        "minimum" if a.is_nan() || b.is_nan() => f64::NAN,
        "maximum" => a.max(b),
        "minimum" => a.min(b),
        _ => unreachable!(),
    }
}

/// Integer semantics from `ir::eval`: wrapping, truncating division with
/// `x / 0 == 0`, `pow` with a negative exponent as truncated `1 / a`.
fn int_binary(name: &str, a: i64, b: i64) -> i64 {
    match name {
        "add" => a.wrapping_add(b),
        "sub" => a.wrapping_sub(b),
        "mul" => a.wrapping_mul(b),
        "div" if b == 0 => 0,
        "div" => a.wrapping_div(b),
        "pow" if b < 0 => match a {
            1 => 1,
            -1 if b % 2 == 0 => 1,
            -1 => -1,
            _ => 0,
        },
        "pow" => a.wrapping_pow(b as u32),
        "maximum" => a.max(b),
        "minimum" => a.min(b),
        _ => unreachable!(),
    }
}

/// Random operands for `name` on `dtype`, in a domain where the op is
/// interesting (positive pow bases, small integer exponents and divisors).
fn binary_operand(rng: &mut Rng, dtype: DType, shape: &[usize], name: &str, rhs: bool) -> Host {
    if dtype.is_float() {
        Host::F(match (name, rhs) {
            ("pow", false) => rand_pos(rng, dtype, shape),
            ("pow", true) => rand_f(rng, dtype, shape, 1.0),
            _ => rand_f(rng, dtype, shape, 2.0),
        })
    } else {
        let signed = dtype != DType::U8;
        Host::I(match (name, rhs) {
            ("pow", true) => rand_small_i(rng, dtype, shape, if signed { -2 } else { 0 }, 9),
            ("div", true) => rand_small_i(rng, dtype, shape, if signed { -9 } else { 0 }, 10),
            ("pow", false) if signed && rng.bool() => rand_small_i(rng, dtype, shape, -3, 4),
            _ => rand_i(rng, dtype, shape),
        })
    }
}

fn binary_ref(name: &str, a: &Host, b: &Host) -> Host {
    match (a, b) {
        (Host::F(a), Host::F(b)) => Host::F(a.zip(b, |x, y| float_binary(name, x, y))),
        (Host::I(a), Host::I(b)) => Host::I(a.zip(b, |x, y| int_binary(name, x, y))),
        _ => unreachable!(),
    }
}

/// A view of `h`'s tensor: `(description, tensor view, host view)`.
fn views_of(ctx: &Context, dtype: DType, h: &Host) -> Vec<(String, Tensor, Host)> {
    // h has shape [6, 10]; every view below has shape [3, 5].
    let t = upload(ctx, dtype, h);
    let mut out = Vec::new();
    let v = |f: &dyn Fn(&Nd<f64>) -> Nd<f64>, g: &dyn Fn(&Nd<i64>) -> Nd<i64>| match h {
        Host::F(a) => Host::F(f(a)),
        Host::I(a) => Host::I(g(a)),
    };
    out.push((
        "slice step 2 of both dims".into(),
        t.slice(0, 0, 6, 2).slice(1, 1, 10, 2),
        v(&|a| a.slice(0, 0, 2, 3).slice(1, 1, 2, 5), &|a| a.slice(0, 0, 2, 3).slice(1, 1, 2, 5)),
    ));
    out.push((
        "narrow then transpose".into(),
        t.narrow(1, 2, 3).narrow(0, 1, 5).t(),
        v(&|a| a.slice(1, 2, 1, 3).slice(0, 1, 1, 5).transpose(0, 1), &|a| {
            a.slice(1, 2, 1, 3).slice(0, 1, 1, 5).transpose(0, 1)
        }),
    ));
    out.push((
        "expand of a row".into(),
        t.narrow(0, 4, 1).narrow(1, 3, 5).broadcast_to([3, 5]),
        v(&|a| a.slice(0, 4, 1, 1).slice(1, 3, 1, 5).expand(&[3, 5]), &|a| {
            a.slice(0, 4, 1, 1).slice(1, 3, 1, 5).expand(&[3, 5])
        }),
    ));
    out
}

#[test]
fn binary_ops_on_every_numeric_dtype_with_broadcasting() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(3);
        let pairs: [(&[usize], &[usize]); 6] = [
            (&[129], &[129]),
            (&[1], &[7]),
            (&[3, 1, 5], &[1, 4, 1]),
            (&[5], &[3, 4, 5]),
            (&[3, 4, 5], &[]),
            (&[], &[2, 3]),
        ];
        for dtype in NUMERIC {
            for (name, op) in binary_table() {
                for (sa, sb) in pairs {
                    let a = binary_operand(&mut rng, dtype, sa, name, false);
                    let b = binary_operand(&mut rng, dtype, sb, name, true);
                    let got = op(&upload(&ctx, dtype, &a), &upload(&ctx, dtype, &b));
                    check(
                        &got,
                        dtype,
                        &binary_ref(name, &a, &b),
                        1.0,
                        &format!("{name} of {sa:?} and {sb:?}"),
                    );
                }
            }
        }
    });
}

#[test]
fn binary_ops_on_non_contiguous_operands() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(4);
        for dtype in NUMERIC {
            for (name, op) in binary_table() {
                let a = binary_operand(&mut rng, dtype, &[6, 10], name, false);
                let b = binary_operand(&mut rng, dtype, &[6, 10], name, true);
                let va = views_of(&ctx, dtype, &a);
                let vb = views_of(&ctx, dtype, &b);
                for i in 0..va.len() {
                    let (da, ta, ha) = &va[i];
                    let (db, tb, hb) = &vb[(i + 1) % vb.len()];
                    check(
                        &op(ta, tb),
                        dtype,
                        &binary_ref(name, ha, hb),
                        1.0,
                        &format!("{name} of ({da}) and ({db})"),
                    );
                }
            }
        }
    });
}

#[test]
fn binary_ops_with_rust_scalars_on_either_side() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(5);
        for dtype in NUMERIC {
            let (t, h) = rand_tensor(&ctx, &mut rng, dtype, &[7]);
            match &h {
                Host::F(a) => {
                    let cases: Vec<(&str, Tensor, Nd<f64>)> = vec![
                        ("2.0 - x", 2.0 - &t, a.map(|x| 2.0 - x)),
                        ("x / 3", &t / 3, a.map(|x| x / 3.0)),
                        ("x * 0.5", &t * 0.5, a.map(|x| x * 0.5)),
                        ("x * 0.1 (rounded to the dtype)", &t * 0.1, a.map(|x| x * round(dtype, 0.1))),
                        ("0.3 - x (rounded to the dtype)", 0.3 - &t, a.map(|x| round(dtype, 0.3) - x)),
                        ("1.5 * x", 1.5f32 * &t, a.map(|x| 1.5 * x)),
                        ("x + 4i64", &t + 4i64, a.map(|x| x + 4.0)),
                        ("2 / x", 2i32 / &t, a.map(|x| 2.0 / x)),
                        ("x.pow(2)", t.pow(2), a.map(|x| x * x)),
                        ("x.maximum(0.25)", t.maximum(0.25), a.map(|x| x.max(0.25))),
                        ("x.minimum(-1)", t.minimum(-1), a.map(|x| x.min(-1.0))),
                        ("x - x (same tensor)", &t - &t, a.map(|x| x - x)),
                    ];
                    for (what, got, want) in cases {
                        check_f(&got, dtype, &want, 1.0, what);
                    }
                }
                Host::I(a) => {
                    let d = dtype;
                    let cases: Vec<(&str, Tensor, Nd<i64>)> = vec![
                        ("7 - x", 7i64 - &t, a.map(|x| 7i64.wrapping_sub(x))),
                        ("x / 3", &t / 3, a.map(|x| x / 3)),
                        ("x * 3", &t * 3, a.map(|x| x.wrapping_mul(3))),
                        ("5u8 * x", 5u8 * &t, a.map(|x| x.wrapping_mul(5))),
                        ("x + 200", &t + 200, a.map(|x| x.wrapping_add(200))),
                        (
                            "100 / x",
                            100i32 / &t,
                            a.map(|x| if x == 0 { 0 } else { wrap(d, 100i64.wrapping_div(x)) }),
                        ),
                        ("x.pow(3)", t.pow(3), a.map(|x| x.wrapping_pow(3))),
                        ("x.maximum(9)", t.maximum(9), a.map(|x| x.max(9))),
                        ("x / 0", &t / 0, a.map(|_| 0)),
                    ];
                    for (what, got, want) in cases {
                        check_i(&got, dtype, &want, what);
                    }
                }
            }
        }
    });
}

#[test]
fn maximum_and_minimum_propagate_nan() {
    each_backend(|| {
        let ctx = dev();
        let xs = [f64::NAN, 1.0, f64::NAN, -2.0, f64::INFINITY];
        let ys = [0.0, f64::NAN, f64::NAN, 3.0, f64::NAN];
        for dtype in FLOATS {
            let (a, b) = (Nd::new(xs.to_vec(), &[5]), Nd::new(ys.to_vec(), &[5]));
            let (ta, tb) = (tensor_f(&ctx, dtype, &a), tensor_f(&ctx, dtype, &b));
            check_f(
                &ta.maximum(&tb),
                dtype,
                &a.zip(&b, |x, y| float_binary("maximum", x, y)),
                1.0,
                "maximum",
            );
            check_f(
                &ta.minimum(&tb),
                dtype,
                &a.zip(&b, |x, y| float_binary("minimum", x, y)),
                1.0,
                "minimum",
            );
        }
    });
}

#[test]
fn maximum_and_minimum_on_bool_are_or_and() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(6);
        let a = rand_i(&mut rng, DType::Bool, &[3, 1, 5]);
        let b = rand_i(&mut rng, DType::Bool, &[1, 4, 1]);
        let (ta, tb) = (tensor_i(&ctx, DType::Bool, &a), tensor_i(&ctx, DType::Bool, &b));
        check_i(&ta.maximum(&tb), DType::Bool, &a.zip(&b, |x, y| x | y), "bool maximum");
        check_i(&ta.minimum(&tb), DType::Bool, &a.zip(&b, |x, y| x & y), "bool minimum");
        check_i(&ta.maximum(true), DType::Bool, &a.map(|_| 1), "bool maximum with true");
        check_i(&ta.minimum(false), DType::Bool, &a.map(|_| 0), "bool minimum with false");
    });
}

// ---------------------------------------------------------------------------
// Comparisons, where, cast

/// Values with many ties, so eq/le/ge see equal elements.
fn tie_heavy(rng: &mut Rng, dtype: DType, shape: &[usize]) -> Host {
    match dtype {
        DType::Bool => Host::I(rand_i(rng, dtype, shape)),
        d if d.is_float() => {
            let a = rand_small_i(rng, DType::I64, shape, -4, 5);
            Host::F(a.map(|x| x as f64 * 0.5))
        }
        DType::U8 => Host::I(rand_small_i(rng, dtype, shape, 0, 4)),
        _ => Host::I(rand_small_i(rng, dtype, shape, -2, 3)),
    }
}

#[test]
fn comparisons_on_every_dtype() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(7);
        type CmpFn = fn(&Tensor, &Tensor) -> Tensor;
        let table: [(&str, CmpFn); 6] = [
            ("eq", |a, b| a.eq(b)),
            ("ne", |a, b| a.ne(b)),
            ("lt", |a, b| a.lt(b)),
            ("le", |a, b| a.le(b)),
            ("gt", |a, b| a.gt(b)),
            ("ge", |a, b| a.ge(b)),
        ];
        fn cmp<T: PartialOrd>(name: &str, a: T, b: T) -> i64 {
            (match name {
                "eq" => a == b,
                "ne" => a != b,
                "lt" => a < b,
                "le" => a <= b,
                "gt" => a > b,
                _ => a >= b,
            }) as i64
        }
        for dtype in DType::ALL {
            for (name, op) in table {
                for (sa, sb) in [(&[129][..], &[129][..]), (&[3, 1, 5], &[1, 4, 1]), (&[5], &[])] {
                    let (a, b) = (tie_heavy(&mut rng, dtype, sa), tie_heavy(&mut rng, dtype, sb));
                    let got = op(&upload(&ctx, dtype, &a), &upload(&ctx, dtype, &b));
                    let want = match (&a, &b) {
                        (Host::F(a), Host::F(b)) => a.zip(b, |x, y| cmp(name, x, y)),
                        (Host::I(a), Host::I(b)) => a.zip(b, |x, y| cmp(name, x, y)),
                        _ => unreachable!(),
                    };
                    check_i(&got, DType::Bool, &want, &format!("{name} of {sa:?} and {sb:?}"));
                }
            }
            // Full-range ints and random floats too (no ties, but large values).
            let (ta, a) = rand_tensor(&ctx, &mut rng, dtype, &[64]);
            let (tb, b) = rand_tensor(&ctx, &mut rng, dtype, &[64]);
            let want = match (&a, &b) {
                (Host::F(a), Host::F(b)) => a.zip(b, |x, y| cmp("lt", x, y)),
                (Host::I(a), Host::I(b)) => a.zip(b, |x, y| cmp("lt", x, y)),
                _ => unreachable!(),
            };
            check_i(&ta.lt(&tb), DType::Bool, &want, "lt on full-range values");
        }
    });
}

#[test]
fn comparisons_with_nan_are_false_except_ne() {
    each_backend(|| {
        let ctx = dev();
        for dtype in FLOATS {
            let a = tensor_f(&ctx, dtype, &Nd::new(vec![f64::NAN, 1.0, f64::NAN], &[3]));
            let b = tensor_f(&ctx, dtype, &Nd::new(vec![1.0, f64::NAN, f64::NAN], &[3]));
            let f = Nd::new(vec![0, 0, 0], &[3]);
            let t = Nd::new(vec![1, 1, 1], &[3]);
            check_i(&a.eq(&b), DType::Bool, &f, "eq with NaN");
            check_i(&a.lt(&b), DType::Bool, &f, "lt with NaN");
            check_i(&a.le(&b), DType::Bool, &f, "le with NaN");
            check_i(&a.gt(&b), DType::Bool, &f, "gt with NaN");
            check_i(&a.ge(&b), DType::Bool, &f, "ge with NaN");
            check_i(&a.ne(&b), DType::Bool, &t, "ne with NaN");
        }
    });
}

#[test]
fn where_on_every_dtype_with_broadcasting() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(8);
        for dtype in DType::ALL {
            let c = rand_i(&mut rng, DType::Bool, &[3, 1, 5]);
            let tc = tensor_i(&ctx, DType::Bool, &c);
            let (tt, t) = rand_tensor(&ctx, &mut rng, dtype, &[1, 4, 1]);
            let (tf, f) = rand_tensor(&ctx, &mut rng, dtype, &[5]);
            let sel = |c: &Nd<i64>, t: &Host, f: &Host| -> Host {
                match (t, f) {
                    (Host::F(t), Host::F(f)) => {
                        let s = broadcast_shape(&broadcast_shape(&c.shape, &t.shape), &f.shape);
                        let (c, t, f) = (c.expand(&s), t.expand(&s), f.expand(&s));
                        Host::F(Nd::from_fn(&s, |i| if c.get(i) != 0 { t.get(i) } else { f.get(i) }))
                    }
                    (Host::I(t), Host::I(f)) => {
                        let s = broadcast_shape(&broadcast_shape(&c.shape, &t.shape), &f.shape);
                        let (c, t, f) = (c.expand(&s), t.expand(&s), f.expand(&s));
                        Host::I(Nd::from_fn(&s, |i| if c.get(i) != 0 { t.get(i) } else { f.get(i) }))
                    }
                    _ => unreachable!(),
                }
            };
            check(&tc.where_cond(&tt, &tf), dtype, &sel(&c, &t, &f), 1.0, "where [3,1,5] ? [1,4,1] : [5]");
            // A scalar branch takes the tensor branch's dtype.
            let one = match &t {
                Host::F(_) => Host::F(Nd::new(vec![1.0], &[])),
                Host::I(_) => Host::I(Nd::new(vec![1], &[])),
            };
            check(&tc.where_cond(&tt, 1), dtype, &sel(&c, &t, &one), 1.0, "where with a scalar false branch");
            check(&tc.where_cond(1, &tf), dtype, &sel(&c, &one, &f), 1.0, "where with a scalar true branch");
            // A condition made by a comparison, on a transposed operand.
            let (tx, x) = rand_tensor(&ctx, &mut rng, DType::F32, &[5, 3]);
            let cond = tx.t().gt(0.0);
            let c2 = x.f().transpose(0, 1).map(|v| (v > 0.0) as i64);
            let (ty, y) = rand_tensor(&ctx, &mut rng, dtype, &[3, 5]);
            let (tz, z) = rand_tensor(&ctx, &mut rng, dtype, &[3, 5]);
            check(
                &cond.where_cond(&ty, &tz),
                dtype,
                &sel(&c2, &y, &z),
                1.0,
                "where on a comparison of a view",
            );
        }
    });
}

/// The value `v` of dtype `from` cast to `to`, by `Tensor::cast`'s rules.
fn cast_float_to(to: DType, v: f64) -> Host1 {
    match to {
        d if d.is_float() => Host1::F(round(d, v)),
        DType::Bool => Host1::I((v != 0.0) as i64),
        d => {
            let (lo, hi) = match d {
                DType::U8 => (0.0, 255.0),
                DType::I32 => (i32::MIN as f64, i32::MAX as f64),
                _ => (i64::MIN as f64, i64::MAX as f64),
            };
            Host1::I(if v.is_nan() {
                0
            } else if d == DType::I64 {
                v as i64 // saturating
            } else {
                v.trunc().clamp(lo, hi) as i64
            })
        }
    }
}

enum Host1 {
    F(f64),
    I(i64),
}

#[test]
fn cast_between_every_pair_of_dtypes() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(9);
        let specials = [
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            0.0,
            -0.0,
            0.5,
            -0.5,
            0.999,
            -1.0,
            255.9,
            256.0,
            -300.7,
            1e10,
            -1e10,
            3e38,
            70000.0,
        ];
        for from in DType::ALL {
            // Floats: wide enough to leave u8's range and to saturate i32.
            let src: Host = if from.is_float() {
                let mut v = rand_f(&mut rng, from, &[48], 100.0).to_vec();
                v.extend(specials.iter().map(|&x| round(from, x)));
                Host::F(Nd::new(v, &[64]))
            } else {
                let mut v = rand_i(&mut rng, from, &[60]).to_vec();
                v.extend([0, 1, wrap(from, -1), wrap(from, 256)]);
                Host::I(Nd::new(v.into_iter().map(|x| wrap(from, x)).collect(), &[64]))
            };
            let t = upload(&ctx, from, &src);
            // Casting a non-contiguous view too: the same elements, reversed in pairs.
            let tv = t.reshape([32, 2]).t();
            for to in DType::ALL {
                let conv = |i: usize| -> Host1 {
                    match &src {
                        Host::F(a) => cast_float_to(to, a.to_vec()[i]),
                        Host::I(a) => {
                            let x = a.to_vec()[i];
                            if to.is_float() {
                                Host1::F(round(to, x as f64))
                            } else {
                                Host1::I(wrap(to, x))
                            }
                        }
                    }
                };
                let want: Host = if to.is_float() {
                    Host::F(Nd::new(
                        (0..64)
                            .map(|i| match conv(i) {
                                Host1::F(v) => v,
                                Host1::I(_) => unreachable!(),
                            })
                            .collect(),
                        &[64],
                    ))
                } else {
                    Host::I(Nd::new(
                        (0..64)
                            .map(|i| match conv(i) {
                                Host1::I(v) => v,
                                Host1::F(_) => unreachable!(),
                            })
                            .collect(),
                        &[64],
                    ))
                };
                if from.is_float() && matches!(to, DType::U8 | DType::I32) {
                    // Values out of the target's range are checked (separately,
                    // since kiln gets them wrong) by float_to_narrow_int_cast_saturates.
                    let (lo, hi) =
                        if to == DType::U8 { (0.0, 255.0) } else { (i32::MIN as f64, i32::MAX as f64) };
                    let src = src.f().to_vec();
                    let got = read_i(&t.cast(to)).to_vec();
                    let Host::I(w) = &want else { unreachable!() };
                    let w = w.to_vec();
                    let mut checked = 0;
                    for i in 0..64 {
                        let v = src[i];
                        if v.is_nan() || (lo..=hi).contains(&v.trunc()) {
                            assert_eq!(got[i], w[i], "cast {from} -> {to} of {v}");
                            checked += 1;
                        }
                    }
                    assert!(checked >= 20, "cast {from} -> {to}: only {checked} in-range values");
                    continue;
                }
                check(&t.cast(to), to, &want, 0.0, &format!("cast {from} -> {to}"));
                let want_view = match &want {
                    Host::F(w) => Host::F(w.reshape(&[32, 2]).transpose(0, 1)),
                    Host::I(w) => Host::I(w.reshape(&[32, 2]).transpose(0, 1)),
                };
                check(&tv.cast(to), to, &want_view, 0.0, &format!("cast {from} -> {to} of a view"));
            }
        }
    });
}

#[test]
fn cast_of_constants_matches_cast_of_data() {
    each_backend(|| {
        // `full` nodes may be constant-folded; folding must give what a kernel gives.
        let ctx = dev();
        for (v, to, want) in [
            (-3.5f32, DType::I32, -3i64),
            (-3.5, DType::I64, -3),
            (200.9, DType::U8, 200),
            (3e9, DType::I64, 3_000_000_000),
            (f32::NAN, DType::I64, 0),
            (f32::NAN, DType::U8, 0),
            (f32::INFINITY, DType::I64, i64::MAX),
            (-0.5, DType::Bool, 1),
        ] {
            let folded = ctx.full([2], v).cast(to);
            let data = ctx.tensor(&[v, v], [2]).cast(to);
            let w = Nd::new(vec![want, want], &[2]);
            check_i(&data, to, &w, &format!("cast of data {v} -> {to}"));
            check_i(&folded, to, &w, &format!("cast of a constant {v} -> {to}"));
        }
    });
}

/// `Tensor::cast` and `Op::Cast` document that float to integer "truncates
/// toward zero and saturates"; this checks it for the narrow integer dtypes,
/// where saturating to i64 and then wrapping (what `Scalar::cast` does) differs.
#[test]
fn float_to_narrow_int_cast_saturates() {
    each_backend(|| {
        let ctx = dev();
        let values = [-3.5, -300.7, 256.0, 300.0, 1e10, -1e10, 3e9, f64::INFINITY, f64::NEG_INFINITY];
        let mut failures = Vec::new();
        for from in FLOATS {
            let a = Nd::new(values.iter().map(|&v| round(from, v)).collect(), &[values.len()]);
            let t = tensor_f(&ctx, from, &a);
            for to in [DType::U8, DType::I32] {
                let want: Vec<i64> = a
                    .to_vec()
                    .into_iter()
                    .map(|v| match cast_float_to(to, v) {
                        Host1::I(i) => i,
                        Host1::F(_) => unreachable!(),
                    })
                    .collect();
                let got = read_i(&t.cast(to)).to_vec();
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    if g != w {
                        failures.push(format!("{from} {} -> {to}: got {g}, want {w}", a.to_vec()[i]));
                    }
                }
                // A folded constant too.
                let c = read_i(&ctx.full_dtype([1], -3.5, from).cast(to)).to_vec()[0];
                if c != 0 && to == DType::U8 {
                    failures.push(format!("constant {from} -3.5 -> u8: got {c}, want 0"));
                }
            }
        }
        assert!(
            failures.is_empty(),
            "{} casts do not saturate:\n  {}",
            failures.len(),
            failures.join("\n  ")
        );
    });
}

// ---------------------------------------------------------------------------
// Graphs the passes rewrite (fusion, constant folding, CSE, in-place reuse)
// and sizes that cross the CPU backend's parallel chunks.

#[test]
fn long_fused_chains_with_broadcasts_match_the_reference() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(10);
        for dtype in FLOATS {
            let a = rand_f(&mut rng, dtype, &[3, 1, 5], 1.0);
            let b = rand_f(&mut rng, dtype, &[4, 1], 1.0);
            let (ta, tb) = (tensor_f(&ctx, dtype, &a), tensor_f(&ctx, dtype, &b));
            // Each step rounds to the dtype in kiln; the reference rounds the same way.
            let r = |v: f64| round(dtype, v);
            let got = ((&ta * 2.0 + &tb).tanh() - ta.sigmoid()).abs().maximum(0.1) / (tb.exp() + 1.0);
            let left = a.zip(&b, |x, y| {
                r(r(r(r(x * 2.0) + y).tanh()) - r(1.0 / (1.0 + (-x).exp()))).abs().max(r(0.1))
            });
            let right = b.map(|y| r(r(y.exp()) + 1.0));
            let want = left.zip(&right, |x, y| x / y);
            check_f(&got, dtype, &want, 1.0, "a fused chain of 8 ops with broadcasts");
        }
    });
}

#[test]
fn constant_graphs_fold_to_what_kernels_compute() {
    each_backend(|| {
        let ctx = dev();
        // Integer wrap-around and division by zero inside constants.
        let u = ctx.full_dtype([2], 200, DType::U8) + 100;
        check_i(&u, DType::U8, &Nd::new(vec![44, 44], &[2]), "u8 200 + 100");
        let i = ctx.full_dtype([2], i32::MAX, DType::I32) * 2;
        check_i(&i, DType::I32, &Nd::new(vec![-2, -2], &[2]), "i32 MAX * 2");
        let d = ctx.full_dtype([1], 7, DType::I64) / ctx.zeros_dtype([1], DType::I64);
        check_i(&d, DType::I64, &Nd::new(vec![0], &[1]), "7 / 0");
        let p = ctx.full_dtype([1], 2, DType::I32).pow(ctx.full_dtype([1], -1, DType::I32));
        check_i(&p, DType::I32, &Nd::new(vec![0], &[1]), "2 ^ -1");
        let n = ctx.full_dtype([1], i64::MIN, DType::I64).abs();
        check_i(&n, DType::I64, &Nd::new(vec![i64::MIN], &[1]), "abs(i64::MIN)");
        // The one overflowing integer division, MIN / -1, wraps, in data and constants.
        let m = ctx.tensor(&[i32::MIN, i32::MIN, 7], [3]) / ctx.tensor(&[-1i32, 1, -1], [3]);
        check_i(&m, DType::I32, &Nd::new(vec![i32::MIN as i64, i32::MIN as i64, -7], &[3]), "i32 MIN / -1");
        let m = ctx.tensor(&[i64::MIN, 9], [2]) / -1i64;
        check_i(&m, DType::I64, &Nd::new(vec![i64::MIN, -9], &[2]), "i64 MIN / -1");
        let m = ctx.full_dtype([1], i64::MIN, DType::I64) / -1;
        check_i(&m, DType::I64, &Nd::new(vec![i64::MIN], &[1]), "constant i64 MIN / -1");
        // Floats: a constant chain in f16 rounds at every step, as kernels do.
        for dtype in FLOATS {
            let r = |v: f64| round(dtype, v);
            let got =
                (ctx.full_dtype([3], 0.1, dtype) * 3.0 + ctx.arange(0.0f32, 3.0, 1.0).cast(dtype)).exp();
            let want = Nd::new((0..3).map(|k| r(r(r(0.1) * 3.0) + k as f64).exp()).collect(), &[3]);
            check_f(&got, dtype, &want, 1.0, "a constant chain");
            let nan = ctx.full_dtype([2], f64::NAN, dtype).maximum(1.0);
            check_f(&nan, dtype, &Nd::new(vec![f64::NAN; 2], &[2]), 1.0, "maximum(NaN, 1) folded");
        }
    });
}

#[test]
fn common_subexpressions_and_reads_of_inputs_stay_correct() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(11);
        for dtype in NUMERIC {
            let (t, h) = rand_tensor(&ctx, &mut rng, dtype, &[4, 33]);
            // The same subexpression twice, and an op whose result may reuse its
            // input's memory: the input must still read back unchanged.
            let got = (&t + 1) * (&t + 1);
            let neg = -&t;
            let neg_t = neg.t();
            match &h {
                Host::F(a) => {
                    let r = |v: f64| round(dtype, v);
                    check_f(&got, dtype, &a.map(|x| r(x + 1.0) * r(x + 1.0)), 1.0, "(x + 1) * (x + 1)");
                    check_f(&neg_t, dtype, &a.map(|x| -x).transpose(0, 1), 1.0, "(-x).t()");
                }
                Host::I(a) => {
                    let f = |x: i64| wrap(dtype, x + 1);
                    check_i(&got, dtype, &a.map(|x| f(x).wrapping_mul(f(x))), "(x + 1) * (x + 1)");
                    check_i(&neg_t, dtype, &a.map(i64::wrapping_neg).transpose(0, 1), "(-x).t()");
                }
            }
            check(&t, dtype, &h, 0.0, "the input after ops on it");
            // Two outputs realized together in one plan.
            let (s1, s2) = (t.sum(&[1], false), t.max(&[0], true));
            ctx.realize(&[&s1, &s2]).unwrap();
            match &h {
                Host::F(a) => {
                    let sum = a.reduce(&[1], false, |v| v.iter().sum::<f64>());
                    check_f(&s1, dtype, &sum, 33f64.sqrt() * max_abs(a), "sum realized with max");
                    let max = a.reduce(&[0], true, |v| v.iter().copied().fold(f64::NEG_INFINITY, f64::max));
                    check_f(&s2, dtype, &max, 0.0, "max realized with sum");
                }
                Host::I(a) => {
                    let sum = a.reduce(&[1], false, |v| v.iter().fold(0i64, |s, &x| s.wrapping_add(x)));
                    check_i(&s1, dtype, &sum, "sum realized with max");
                    check_i(
                        &s2,
                        dtype,
                        &a.reduce(&[0], true, |v| *v.iter().max().unwrap()),
                        "max realized with sum",
                    );
                }
            }
        }
    });
}

#[test]
fn large_inputs_cross_parallel_chunks() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(12);
        for dtype in [DType::F32, DType::BF16, DType::I32] {
            let n = 100_003;
            let (t, h) = rand_tensor(&ctx, &mut rng, dtype, &[n]);
            let (tb, hb) = rand_tensor(&ctx, &mut rng, dtype, &[317, 331]);
            let (tr, hr) = rand_tensor(&ctx, &mut rng, dtype, &[331]);
            // elementwise on a transposed view with a broadcast row, then reductions
            let got = tb.t() + tr.unsqueeze(1);
            let total = t.sum_all();
            let am = t.argmax(0, false);
            let col = tb.sum(&[0], false);
            match (&h, &hb, &hr) {
                (Host::F(a), Host::F(b), Host::F(r)) => {
                    let want = b.transpose(0, 1).zip(&r.reshape(&[331, 1]), |x, y| x + y);
                    check_f(&got, dtype, &want, 1.0, "large transposed + broadcast");
                    let s = a.reduce(&[0], false, |v| v.iter().sum::<f64>());
                    check_f(&total, dtype, &s, (n as f64).sqrt() * max_abs(a), "sum of 100003");
                    let mx = a.to_vec().iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let first = a.to_vec().iter().position(|&x| x == mx).unwrap() as i64;
                    check_i(&am, DType::I64, &Nd::new(vec![first], &[]), "argmax of 100003");
                    let cs = b.reduce(&[0], false, |v| v.iter().sum::<f64>());
                    check_f(&col, dtype, &cs, 317f64.sqrt() * max_abs(b), "column sums of [317,331]");
                }
                (Host::I(a), Host::I(b), Host::I(r)) => {
                    let want = b.transpose(0, 1).zip(&r.reshape(&[331, 1]), |x, y| x.wrapping_add(y));
                    check_i(&got, dtype, &want, "large transposed + broadcast");
                    let s = a.reduce(&[0], false, |v| v.iter().fold(0i64, |s, &x| s.wrapping_add(x)));
                    check_i(&total, dtype, &s, "sum of 100003");
                    let v = a.to_vec();
                    let mx = *v.iter().max().unwrap();
                    let first = v.iter().position(|&x| x == mx).unwrap() as i64;
                    check_i(&am, DType::I64, &Nd::new(vec![first], &[]), "argmax of 100003");
                    let cs = b.reduce(&[0], false, |v| v.iter().fold(0i64, |s, &x| s.wrapping_add(x)));
                    check_i(&col, dtype, &cs, "column sums of [317,331]");
                }
                _ => unreachable!(),
            }
        }
        // A larger matmul (GEMM path) and a strided conv.
        let a = rand_f(&mut rng, DType::F32, &[65, 129], 1.0);
        let b = rand_f(&mut rng, DType::F32, &[129, 67], 1.0);
        let got = tensor_f(&ctx, DType::F32, &a).matmul(&tensor_f(&ctx, DType::F32, &b));
        let want = matmul_ref(&a, &b, 0.0, |s, x, y| s + x * y);
        check_f(&got, DType::F32, &want, 129f64.sqrt() * max_abs(&a) * max_abs(&b), "matmul 65x129x67");
    });
}

#[test]
fn half_precision_results_are_rounded_to_nearest() {
    each_backend(|| {
        // f16/bf16 compute in f32 and round once. For add, sub and mul of
        // nearby values the f32 result is exact, so kiln's result must equal the
        // correctly rounded one bit for bit (a truncating rounding would pass
        // the tolerance of the other tests, not this one).
        let ctx = dev();
        let mut rng = Rng::new(13);
        for dtype in [DType::F16, DType::BF16] {
            let a = rand_f(&mut rng, dtype, &[4096], 1.0);
            let b = rand_f(&mut rng, dtype, &[4096], 1.0);
            let (ta, tb) = (tensor_f(&ctx, dtype, &a), tensor_f(&ctx, dtype, &b));
            type Case = (&'static str, Tensor, fn(f64, f64) -> f64);
            let cases: [Case; 3] = [
                ("add", &ta + &tb, |x, y| x + y),
                ("sub", &ta - &tb, |x, y| x - y),
                ("mul", &ta * &tb, |x, y| x * y),
            ];
            for (name, got, f) in cases {
                let got = read_f(&got).to_vec();
                let want = a.zip(&b, f).map(|v| round(dtype, v)).to_vec();
                let bad = got.iter().zip(&want).filter(|(g, w)| g != w).count();
                assert_eq!(bad, 0, "{dtype} {name}: {bad} of 4096 results not correctly rounded");
            }
            // Casts from f32 and f64 round to nearest (even) as well.
            let wide = rand_f(&mut rng, DType::F64, &[4096], 1.0);
            for from in [DType::F32, DType::F64] {
                let src = wide.map(|v| round(from, v));
                let got = read_f(&tensor_f(&ctx, from, &src).cast(dtype)).to_vec();
                let want = src.map(|v| round(dtype, v)).to_vec();
                let bad = got.iter().zip(&want).filter(|(g, w)| g != w).count();
                assert_eq!(bad, 0, "cast {from} -> {dtype}: {bad} of 4096 not correctly rounded");
            }
        }
    });
}

/// 16-bit elementwise kernels take eight elements a thread on CUDA where
/// every dense operand and the output are 16-bit and 8-aligned, four
/// where only 4-aligned, one otherwise (`codegen/elementwise.rs`): sizes
/// and slice offsets that land on each, with a broadcast bias read per
/// element beside them, against f64.
#[test]
fn half_elementwise_in_runs_of_eight_four_and_one() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(88);
        for dtype in [DType::BF16, DType::F16] {
            // [rows, cols] and where the operand starts in its buffer.
            for (rows, cols, start) in [(96, 64, 0), (31, 40, 8), (25, 36, 4), (7, 13, 0), (3, 8, 1)] {
                let numel = rows * cols;
                let buf = rand_f(&mut rng, dtype, &[start + numel], 2.0);
                let a = buf.slice(0, start, 1, numel).reshape(&[rows, cols]);
                let b = rand_f(&mut rng, dtype, &[rows, cols], 2.0);
                let bias = rand_f(&mut rng, dtype, &[cols], 1.0);
                let ta = tensor_f(&ctx, dtype, &buf).narrow(0, start, numel).reshape([rows, cols]);
                let (tb, tbias) = (tensor_f(&ctx, dtype, &b), tensor_f(&ctx, dtype, &bias));
                let got = (&ta * &tb + &tbias).relu();
                // A backend may round `a * b` to the dtype before the add:
                // an ulp of the product, inside the scale's slack.
                let want = a.zip(&b, |x, y| x * y).zip(&bias.expand(&[rows, cols]), |p, q| (p + q).max(0.0));
                check_f(&got, dtype, &want, 8.0, &format!("relu(a*b + bias) [{rows}, {cols}] from {start}"));
            }
        }
    });
}
