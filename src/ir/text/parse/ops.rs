//! Op lines: the mnemonic table ([`Kind`]), the `key=value` attributes
//! after the operands ([`Attrs`]), and building the [`Op`] they describe,
//! with messages that show a valid example.

use super::clip;
use crate::ir::{
    AttnLayout, AttnMask, AttnWrt, BinaryOp, BufferId, Collective, CompareOp, DType, Distribution, FusedBody,
    Graph, Op, PoolKind, ReduceOp, Scalar, Shape, UnaryOp,
};
use std::sync::Arc;

pub(super) enum Attr<'a> {
    /// A bare word: a positional value (`input 0`) or a flag (`keepdim`).
    Bare,
    Word(&'a str),
    List(Vec<&'a str>),
}

/// The attributes of one line, consumed by the op builder; whatever is left
/// is an error.
pub(super) struct Attrs<'a> {
    pub(super) items: Vec<(&'a str, Attr<'a>)>,
}

impl<'a> Attrs<'a> {
    fn take(&mut self, key: &str, op: &str, example: &str) -> Result<Attr<'a>, String> {
        let i = self
            .items
            .iter()
            .position(|(k, v)| *k == key && !matches!(v, Attr::Bare))
            .ok_or_else(|| format!("{op} needs attribute {key}= (e.g. `{example}`)"))?;
        Ok(self.items.remove(i).1)
    }

    fn word(&mut self, key: &str, op: &str, example: &str) -> Result<&'a str, String> {
        match self.take(key, op, example)? {
            Attr::Word(w) => Ok(w),
            _ => Err(format!("attribute {key} of {op} takes one value, not a list (e.g. `{example}`)")),
        }
    }

    fn usize(&mut self, key: &str, op: &str, example: &str) -> Result<usize, String> {
        let w = self.word(key, op, example)?;
        w.parse().map_err(|_| format!("{key} must be a non-negative integer, found '{}'", clip(w)))
    }

    fn list(&mut self, key: &str, op: &str, example: &str) -> Result<Vec<usize>, String> {
        match self.take(key, op, example)? {
            Attr::List(ws) => ws
                .iter()
                .map(|w| {
                    w.parse()
                        .map_err(|_| format!("{key} must list non-negative integers, found '{}'", clip(w)))
                })
                .collect(),
            _ => Err(format!("attribute {key} of {op} takes a list (e.g. `{example}`)")),
        }
    }

    fn pair(&mut self, key: &str, op: &str, example: &str) -> Result<[usize; 2], String> {
        match self.list(key, op, example)?[..] {
            [a, b] => Ok([a, b]),
            _ => Err(format!("{key} of {op} takes two values (height, width), e.g. `{example}`")),
        }
    }

    /// Whether a `key=value` attribute is there (for optional ones).
    fn has(&self, key: &str) -> bool {
        self.items.iter().any(|(k, v)| *k == key && !matches!(v, Attr::Bare))
    }

    fn flag(&mut self, key: &str) -> bool {
        match self.items.iter().position(|(k, v)| *k == key && matches!(v, Attr::Bare)) {
            Some(i) => {
                self.items.remove(i);
                true
            }
            None => false,
        }
    }

    /// The one positional word (`input 0`, `full 0.5`).
    fn positional(&mut self, op: &str, what: &str, example: &str) -> Result<&'a str, String> {
        let i = self
            .items
            .iter()
            .position(|(_, v)| matches!(v, Attr::Bare))
            .ok_or_else(|| format!("{op} needs {what} (e.g. `{example}`)"))?;
        Ok(self.items.remove(i).0)
    }

    pub(super) fn finish(&self, op: &str) -> Result<(), String> {
        match self.items.first() {
            None => Ok(()),
            Some((k, Attr::Bare)) => Err(format!("unexpected '{}' after {op}", clip(k))),
            Some((k, _)) => Err(format!("{op} has no attribute '{}'", clip(k))),
        }
    }
}

#[derive(Clone, Copy)]
pub(super) enum Kind {
    Input,
    Buffer,
    Full,
    Arange,
    Random(Distribution),
    Reshape,
    Permute,
    Expand,
    Slice,
    Unary(UnaryOp),
    Binary(BinaryOp),
    Compare(CompareOp),
    Where,
    Cast,
    Reduce(ReduceOp),
    MatMul,
    Conv2d,
    Pool(PoolKind),
    MaxPoolGrad,
    Gather,
    IndexSelect,
    IndexAdd,
    WriteAt,
    Assign,
    Attention,
    AttentionStats,
    AttentionDelta,
    AttentionGrad,
    Cat,
    Fused,
    Extra,
    Collective(Collective),
}

const FIXED: &[(&str, Kind)] = &[
    ("input", Kind::Input),
    ("buffer", Kind::Buffer),
    ("full", Kind::Full),
    ("arange", Kind::Arange),
    ("rand", Kind::Random(Distribution::Uniform)),
    ("randn", Kind::Random(Distribution::Normal)),
    ("reshape", Kind::Reshape),
    ("permute", Kind::Permute),
    ("expand", Kind::Expand),
    ("slice", Kind::Slice),
    ("where", Kind::Where),
    ("cast", Kind::Cast),
    ("matmul", Kind::MatMul),
    ("conv2d", Kind::Conv2d),
    ("max_pool2d", Kind::Pool(PoolKind::Max)),
    ("avg_pool2d", Kind::Pool(PoolKind::Avg)),
    ("max_pool2d_grad", Kind::MaxPoolGrad),
    ("gather", Kind::Gather),
    ("index_select", Kind::IndexSelect),
    ("index_add", Kind::IndexAdd),
    ("write_at", Kind::WriteAt),
    ("assign", Kind::Assign),
    ("attention", Kind::Attention),
    ("attention_stats", Kind::AttentionStats),
    ("attention_delta", Kind::AttentionDelta),
    ("attention_grad", Kind::AttentionGrad),
    ("cat", Kind::Cat),
    ("fused", Kind::Fused),
    ("extra", Kind::Extra),
    ("all_reduce_sum", Kind::Collective(Collective::AllReduce(ReduceOp::Sum))),
    ("all_reduce_mean", Kind::Collective(Collective::AllReduce(ReduceOp::Mean))),
    ("all_reduce_max", Kind::Collective(Collective::AllReduce(ReduceOp::Max))),
    ("all_reduce_min", Kind::Collective(Collective::AllReduce(ReduceOp::Min))),
    ("broadcast", Kind::Collective(Collective::Broadcast(0))),
    ("reduce_scatter_sum", Kind::Collective(Collective::ReduceScatter { op: ReduceOp::Sum, ranks: 0 })),
    ("reduce_scatter_mean", Kind::Collective(Collective::ReduceScatter { op: ReduceOp::Mean, ranks: 0 })),
    ("all_gather", Kind::Collective(Collective::AllGather { ranks: 0 })),
];

/// Every mnemonic with its kind, in a fixed order.
pub(super) fn all_kinds() -> impl Iterator<Item = (&'static str, Kind)> {
    FIXED
        .iter()
        .copied()
        .chain(UnaryOp::ALL.iter().map(|&u| (u.mnemonic(), Kind::Unary(u))))
        .chain(BinaryOp::ALL.iter().map(|&b| (b.mnemonic(), Kind::Binary(b))))
        .chain(CompareOp::ALL.iter().map(|&c| (c.mnemonic(), Kind::Compare(c))))
        .chain(ReduceOp::ALL.iter().map(|&r| (r.mnemonic(), Kind::Reduce(r))))
}

pub(super) fn kind_of(mnemonic: &str) -> Option<Kind> {
    all_kinds().find(|(m, _)| *m == mnemonic).map(|(_, k)| k)
}

/// The known mnemonic closest to a misspelt one (edit distance <= 2).
pub(super) fn suggest(word: &str) -> Option<&'static str> {
    if word.len() > 40 {
        return None;
    }
    // Ties go to a name with the same first letter (`mull` -> `mul`, not `full`).
    let first = word.chars().next();
    let (best, d, _) = all_kinds()
        .map(|(m, _)| (m, edit_distance(word, m), m.chars().next() != first))
        .min_by_key(|&(_, d, other_start)| (d, other_start))?;
    (d <= 2 && d < word.chars().count()).then_some(best)
}

pub(super) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, &cb) in b.iter().enumerate() {
            cur.push((prev[j] + usize::from(ca != cb)).min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

pub(super) fn scalar(text: &str, dtype: DType, what: &str) -> Result<Scalar, String> {
    Scalar::parse(text, dtype).ok_or_else(|| {
        let hint = match dtype {
            DType::Bool => " (expected true or false)".to_string(),
            d if d.is_float() => " (expected a number, inf, -inf or nan)".to_string(),
            d => format!(" (expected an integer that fits {d})"),
        };
        format!("{what} '{}' is not a valid {dtype} value{hint}", clip(text))
    })
}

/// A fused op from its parsed body; `kind=` must name the body's kind.
pub(super) fn fused_op(body: Graph, a: &mut Attrs) -> Result<Op, String> {
    let body = FusedBody::new(body).map_err(|m| format!("fused body: {m}"))?;
    let kind = a.word("kind", "fused", "fused %a, %b kind=elementwise {")?;
    if kind != body.kind().name() {
        return Err(format!(
            "the body is a {} kernel, but the line says kind={}",
            body.kind().name(),
            clip(kind)
        ));
    }
    let example = "fused %a, %b kind=elementwise over=0 {` or `over=[0,_,2]";
    let body = match a.has("over") {
        true => match a.take("over", "fused", example)? {
            Attr::Word(w) => {
                let k = w
                    .parse()
                    .map_err(|_| format!("over must be a non-negative integer, found '{}'", clip(w)))?;
                body.with_over(k).map_err(|m| format!("fused over={k}: {m}"))?
            }
            Attr::List(each) => {
                if each.len() != body.outputs().len() {
                    return Err(format!(
                        "over lists {} entries but the body has {} outputs (`_` for one written anywhere)",
                        each.len(),
                        body.outputs().len()
                    ));
                }
                let mut body = body;
                for (j, w) in each.iter().enumerate() {
                    if *w == "_" {
                        continue;
                    }
                    let k = w
                        .parse()
                        .map_err(|_| format!("over lists operand numbers or `_`, found '{}'", clip(w)))?;
                    body = body.with_output_over(j, k).map_err(|m| format!("fused over output {j}: {m}"))?;
                }
                body
            }
            Attr::Bare => return Err(format!("over needs a value (e.g. `{example}`)")),
        },
        false => body,
    };
    Ok(Op::Fused(Arc::new(body)))
}

/// A reduce-scatter's or all-gather's `ranks=` (the group's size, at least 1).
fn ranks(a: &mut Attrs, m: &str) -> Result<u32, String> {
    let n = a.usize("ranks", m, &format!("{m} %x ranks=2 seq=0"))?;
    match u32::try_from(n) {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("ranks must be from 1 to {}, found {n}", u32::MAX)),
    }
}

/// The op a line describes. `next_seq` is the sequence number a
/// collective without `seq=` takes (collectives count in file order).
pub(super) fn build_op(
    kind: Kind,
    m: &str,
    a: &mut Attrs,
    shape: &Shape,
    dtype: DType,
    next_seq: u64,
) -> Result<Op, String> {
    Ok(match kind {
        Kind::Input => {
            let w = a.positional(m, "a slot number", "input 0")?;
            Op::Input(w.parse().map_err(|_| {
                format!("input slot must be an integer from 0 to {}, found '{}'", u32::MAX, clip(w))
            })?)
        }
        Kind::Buffer => {
            let w = a.positional(m, "a buffer id", "buffer 3")?;
            Op::Buffer(BufferId(
                w.parse()
                    .map_err(|_| format!("buffer id must be a non-negative integer, found '{}'", clip(w)))?,
            ))
        }
        Kind::Full => Op::Full(scalar(a.positional(m, "a value", "full 0.5")?, dtype, "full value")?),
        Kind::Arange => {
            let start = scalar(a.word("start", m, "arange start=0 step=1")?, dtype, "arange start")?;
            let step = scalar(a.word("step", m, "arange start=0 step=1")?, dtype, "arange step")?;
            Op::Arange { start, step }
        }
        Kind::Random(dist) => {
            let w = a.word("stream", m, "randn stream=0")?;
            let stream = w
                .parse()
                .map_err(|_| format!("stream must be a non-negative integer, found '{}'", clip(w)))?;
            Op::Random { dist, stream }
        }
        Kind::Reshape => Op::Reshape(shape.clone()),
        Kind::Expand => Op::Expand(shape.clone()),
        Kind::Cast => Op::Cast(dtype),
        Kind::Permute => Op::Permute(a.list("perm", m, "permute %x perm=[1,0]")?),
        Kind::Slice => {
            let ex = "slice %x dim=0 start=0 step=1 len=2";
            Op::Slice {
                dim: a.usize("dim", m, ex)?,
                start: a.usize("start", m, ex)?,
                step: a.usize("step", m, ex)?,
                len: a.usize("len", m, ex)?,
            }
        }
        Kind::Unary(u) => Op::Unary(u),
        Kind::Binary(b) => Op::Binary(b),
        Kind::Compare(c) => Op::Compare(c),
        Kind::Where => Op::Where,
        Kind::MatMul => Op::MatMul,
        Kind::Reduce(op) => {
            let dims = a.list("dims", m, &format!("{m} %x dims=[1] keepdim"))?;
            let into = if a.has("into") {
                let w = a.word("into", m, &format!("{m} %x dims=[0] into=f32"))?;
                Some(
                    DType::from_name(w)
                        .ok_or_else(|| format!("into= takes a dtype (f32), found '{}'", clip(w)))?,
                )
            } else {
                None
            };
            Op::Reduce { op, dims, keepdim: a.flag("keepdim"), into }
        }
        Kind::Conv2d => {
            let ex = "conv2d %x, %w stride=[1,1] padding=[0,0] dilation=[1,1] groups=1";
            Op::Conv2d {
                stride: a.pair("stride", m, ex)?,
                padding: a.pair("padding", m, ex)?,
                dilation: a.pair("dilation", m, ex)?,
                groups: a.usize("groups", m, ex)?,
            }
        }
        Kind::Pool(kind) => {
            let ex = format!("{m} %x kernel=[2,2] stride=[2,2] padding=[0,0]");
            Op::Pool2d {
                kind,
                kernel: a.pair("kernel", m, &ex)?,
                stride: a.pair("stride", m, &ex)?,
                padding: a.pair("padding", m, &ex)?,
            }
        }
        Kind::MaxPoolGrad => {
            let ex = "max_pool2d_grad %x, %g kernel=[2,2] stride=[2,2] padding=[0,0]";
            Op::MaxPool2dGrad {
                kernel: a.pair("kernel", m, ex)?,
                stride: a.pair("stride", m, ex)?,
                padding: a.pair("padding", m, ex)?,
            }
        }
        Kind::Gather => Op::Gather { dim: a.usize("dim", m, "gather %x, %i dim=1")? },
        Kind::IndexSelect => Op::IndexSelect { dim: a.usize("dim", m, "index_select %x, %i dim=0")? },
        Kind::IndexAdd => Op::IndexAdd { dim: a.usize("dim", m, "index_add %x, %i, %s dim=0")? },
        Kind::WriteAt => Op::WriteAt { dim: a.usize("dim", m, "write_at %x, %v, %offset dim=2")? },
        Kind::Attention | Kind::AttentionStats | Kind::AttentionGrad => {
            let ex = match kind {
                Kind::AttentionStats => "attention_stats %q, %k, %o, %g scale=0.125 mask=none causal",
                Kind::AttentionGrad => {
                    "attention_grad %q, %k, %v, %g, %stats wrt=q scale=0.125 mask=none causal"
                }
                _ => "attention %q, %k, %v scale=0.125 mask=none causal",
            };
            let wrt = match kind {
                Kind::AttentionGrad => Some(match a.word("wrt", m, ex)? {
                    "q" => AttnWrt::Query,
                    "kv" => AttnWrt::KeyValue,
                    "qkv" => AttnWrt::QueryKeyValue,
                    "kv+q" => AttnWrt::KeyValueAndQuery,
                    other => return Err(format!("wrt must be q, kv, qkv or kv+q, found '{}'", clip(other))),
                }),
                _ => None,
            };
            let w = a.word("scale", m, ex)?;
            let scale: f64 = w.parse().map_err(|_| format!("scale must be a number, found '{}'", clip(w)))?;
            let mask = match a.word("mask", m, ex)? {
                "none" => AttnMask::None,
                "additive" => AttnMask::Additive,
                "bool" => AttnMask::Keep,
                other => return Err(format!("mask must be none, additive or bool, found '{}'", clip(other))),
            };
            let causal = a.flag("causal");
            match (kind, wrt) {
                (Kind::AttentionStats, _) => Op::AttentionStats { scale, causal, mask },
                (_, Some(wrt)) => Op::AttentionGrad { scale, causal, mask, wrt },
                _ => {
                    let layout = match a.has("layout") {
                        false => AttnLayout::Bhsd,
                        true => match a.word(
                            "layout",
                            m,
                            "attention %q, %k, %v scale=0.125 mask=none layout=bshd",
                        )? {
                            "bhsd" => AttnLayout::Bhsd,
                            "bshd" => AttnLayout::Bshd,
                            other => {
                                return Err(format!("layout must be bhsd or bshd, found '{}'", clip(other)))
                            }
                        },
                    };
                    Op::Attention { scale, causal, mask, layout }
                }
            }
        }
        Kind::Assign => Op::Assign,
        Kind::AttentionDelta => Op::AttentionDelta,
        Kind::Extra => {
            let output = a.usize("output", m, "extra %f output=1")?;
            if output == 0 {
                return Err("extra output=0 is the node itself; extras are outputs 1 and up".into());
            }
            Op::Extra { output }
        }
        Kind::Cat => Op::Cat { dim: a.usize("dim", m, "cat %a, %b dim=0")? },
        Kind::Collective(what) => {
            let what = match what {
                Collective::Broadcast(_) => {
                    let root = a.usize("root", m, "broadcast %x root=0")?;
                    Collective::Broadcast(
                        u32::try_from(root).map_err(|_| format!("broadcast root {root} is too large"))?,
                    )
                }
                Collective::ReduceScatter { op, .. } => Collective::ReduceScatter { op, ranks: ranks(a, m)? },
                Collective::AllGather { .. } => Collective::AllGather { ranks: ranks(a, m)? },
                other => other,
            };
            let seq = match a.has("seq") {
                true => a.usize("seq", m, &format!("{m} %x seq=0"))? as u64,
                false => next_seq,
            };
            Op::Collective { what, seq }
        }
        Kind::Fused => {
            return Err("a fused node ends its line with `{`, then its body, then a `}` line".into())
        }
    })
}
