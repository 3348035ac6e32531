//! `Display` for a tensor, as PyTorch prints one: `tensor([[1.0000, 2.5000],
//! [3.0000, 4.0000]])`, one format for every element (fixed with 4
//! decimals, integers as `1.`, or scientific when magnitudes are far
//! apart), columns aligned, and tensors over 1000 elements summarized with
//! the first and last 3 entries of each dim around `...`. A dtype other
//! than f32 and i64 (and bool) is named: `tensor([1., 2.], dtype=f16)`.
//!
//! Printing reads the tensor, so it runs the graph; an error is printed
//! in place of the values (`Display` cannot return it).

use super::Tensor;
use crate::ir::{DType, HostData};
use std::fmt;

/// Elements above which a tensor is summarized (PyTorch's threshold).
const THRESHOLD: usize = 1000;
/// Entries kept at each end of a summarized dim.
const EDGE: usize = 3;

impl Tensor {
    /// The realized value on the host.
    fn host_data(&self) -> crate::Result<HostData> {
        let (ctx, _) = self.live()?;
        let buffer = ctx.realize_nodes(&[self.current_node()?])?.remove(0);
        ctx.inner.backend.download(&buffer)
    }
}

impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let data = match self.host_data() {
            Ok(d) => d,
            Err(e) => return write!(f, "tensor(<error: {e}>)"),
        };
        let shape = self.shape().to_vec();
        let summarize = data.len() > THRESHOLD;
        let cells = Cells::new(&data, &shape, summarize);
        let mut out = String::from("tensor(");
        cells.write(&mut out, &shape, 0, 0, "tensor(".len());
        match self.dtype() {
            DType::F32 | DType::I64 | DType::Bool => {}
            d => out.push_str(&format!(", dtype={d}")),
        }
        out.push(')');
        f.write_str(&out)
    }
}

/// Every shown element formatted to one width.
struct Cells {
    text: Vec<Option<String>>,
    width: usize,
    summarize: bool,
}

impl Cells {
    fn new(data: &HostData, shape: &[usize], summarize: bool) -> Cells {
        let shown: Vec<bool> = (0..data.len()).map(|i| !summarize || is_shown(i, shape)).collect();
        let style = FloatStyle::of(data, &shown);
        let text: Vec<Option<String>> =
            (0..data.len()).map(|i| shown[i].then(|| format_one(data, i, style))).collect();
        let width = text.iter().flatten().map(|s| s.len()).max().unwrap_or(0);
        Cells { text, width, summarize }
    }

    /// Writes the block of `shape[dim..]` starting at element `base`;
    /// `indent` is the column the block's `[` sits at.
    fn write(&self, out: &mut String, shape: &[usize], dim: usize, base: usize, indent: usize) {
        if dim == shape.len() {
            if let Some(Some(s)) = self.text.get(base) {
                out.push_str(&format!("{s:>w$}", w = self.width));
            }
            return;
        }
        let n = shape[dim];
        let stride: usize = shape[dim + 1..].iter().product();
        let last = dim + 1 == shape.len();
        out.push('[');
        let cut = self.summarize && n > 2 * EDGE;
        let idx: Vec<Option<usize>> = if cut {
            (0..EDGE).map(Some).chain([None]).chain((n - EDGE..n).map(Some)).collect()
        } else {
            (0..n).map(Some).collect()
        };
        for (k, i) in idx.iter().enumerate() {
            if k > 0 {
                out.push(',');
                if last {
                    out.push(' ');
                } else {
                    out.push_str(&"\n".repeat(shape.len() - dim - 1));
                    out.push_str(&" ".repeat(indent + 1));
                }
            }
            match i {
                Some(i) => self.write(out, shape, dim + 1, base + i * stride, indent + 1),
                None => out.push_str("..."),
            }
        }
        out.push(']');
    }
}

/// Whether flat element `i` lies in the shown corners of a summary.
fn is_shown(mut i: usize, shape: &[usize]) -> bool {
    for d in (0..shape.len()).rev() {
        let n = shape[d];
        let c = i % n.max(1);
        i /= n.max(1);
        if n > 2 * EDGE && c >= EDGE && c < n - EDGE {
            return false;
        }
    }
    true
}

#[derive(Clone, Copy)]
enum FloatStyle {
    /// Every value is an integer: `1.`.
    Integer,
    /// Four decimals.
    Fixed,
    /// `1.2346e+05`.
    Scientific,
}

impl FloatStyle {
    fn of(data: &HostData, shown: &[bool]) -> FloatStyle {
        if !data.dtype().is_float() {
            return FloatStyle::Fixed;
        }
        let vals: Vec<f64> = data
            .to_f64_vec()
            .into_iter()
            .zip(shown)
            .filter(|(v, &s)| s && v.is_finite())
            .map(|(v, _)| v)
            .collect();
        let nonzero: Vec<f64> = vals.iter().map(|v| v.abs()).filter(|&v| v > 0.0).collect();
        if vals.iter().all(|v| v.fract() == 0.0) && nonzero.iter().all(|&v| v < 1e8) {
            return FloatStyle::Integer;
        }
        let (lo, hi) = nonzero.iter().fold((f64::INFINITY, 0.0f64), |(l, h), &v| (l.min(v), h.max(v)));
        if hi > 1e8 || (lo < 1e-4) || hi / lo > 1e3 {
            FloatStyle::Scientific
        } else {
            FloatStyle::Fixed
        }
    }
}

fn format_one(data: &HostData, i: usize, style: FloatStyle) -> String {
    let Some(v) = data.get(i) else { return String::new() };
    match data.dtype() {
        DType::Bool => if v.as_f64() != 0.0 { "True" } else { "False" }.to_string(),
        d if !d.is_float() => v.as_i64().to_string(),
        _ => {
            let x = v.as_f64();
            if x.is_nan() {
                "nan".into()
            } else if x.is_infinite() {
                if x > 0.0 { "inf" } else { "-inf" }.into()
            } else {
                match style {
                    FloatStyle::Integer => format!("{x:.0}."),
                    FloatStyle::Fixed => format!("{x:.4}"),
                    FloatStyle::Scientific => {
                        let s = format!("{x:.4e}");
                        // Rust writes `1.2346e5`; PyTorch `1.2346e+05`.
                        match s.split_once('e') {
                            Some((m, e)) => {
                                let (sign, digits) = e.strip_prefix('-').map_or(("+", e), |d| ("-", d));
                                format!("{m}e{sign}{digits:0>2}")
                            }
                            None => s,
                        }
                    }
                }
            }
        }
    }
}
