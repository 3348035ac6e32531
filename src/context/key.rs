//! The plan cache's key, and the walk that finds what a read needs.
//!
//! A read walks the recording graph once from its targets (depth first,
//! operands in slot order, each node after its operands: the order of
//! [`Graph::topo_order_from`]) and, as each node is reached, appends an
//! exact encoding of it to the key: op and attributes (constants by their
//! bits), dtype, shape, region, and the positions of its operands in the
//! walk. Realized buffers are encoded as the input slot extraction gives
//! them (their first appearance), random streams likewise, so the same
//! computation on new data or fresh random numbers has the same key. The
//! walk also hashes the words as it goes; the cache's map uses that hash,
//! and compares the whole encoding on a hit, so two graphs with different
//! encodings never share a plan, whatever their hashes. The encoding is
//! injective: every node starts with a word holding its op tag, dtype,
//! rank and operand count, followed by exactly the words those imply.
//!
//! Nothing here prints or allocates per node: the walk's marks, stack and
//! words live in a [`Walker`] reused by every read, and a cache hit builds
//! no graph at all. Only a miss copies the subgraph out ([`Walk::extract`]).

use crate::backends::CompileOptions;
use crate::ir::{BufferId, DType, Graph, NodeId, Op, Scalar};
use crate::passes::PassOptions;
use std::hash::{BuildHasherDefault, Hash, Hasher};

/// One cache key: the pass settings and the encoded graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PlanKey {
    /// Which passes are off (`PipelineConfig::enabled_text`).
    pub passes: String,
    /// Fast math and streams.
    pub options: PassOptions,
    /// How the backend compiles (TF32, CUDA graphs, GEMM tuning).
    pub compile: CompileOptions,
    /// The hash of `words`, computed while they were written.
    pub hash: u64,
    /// The exact encoding (see the module docs).
    pub words: Vec<u64>,
}

impl Hash for PlanKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
        self.options.hash(state);
        self.compile.hash(state);
        self.passes.hash(state);
    }
}

/// A hasher for keys that carry their own hash: it mixes the few words it
/// is given, no more (SipHash's strength buys nothing for a value that is
/// already a good 64-bit hash).
#[derive(Default)]
pub(crate) struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = mix(self.0, b as u64);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = mix(self.0, v);
    }
}

/// The map hasher for [`PlanKey`]s.
pub(crate) type KeyHash = BuildHasherDefault<PassThrough>;

/// One step of the running hash (a multiply-rotate, as FxHash).
#[inline(always)]
fn mix(h: u64, v: u64) -> u64 {
    (h.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95)
}

/// What one walk found: the nodes in order, the key words, the realized
/// buffers and random streams it reads.
pub(crate) struct Walk {
    /// The nodes the targets need, operands first.
    pub order: Vec<NodeId>,
    /// Buffer of input slot `k`.
    pub inputs: Vec<BufferId>,
    /// Context stream of plan stream `k`.
    pub streams: Vec<u64>,
    /// The sequence numbers of the collectives met, in walk order.
    pub collectives: Vec<u64>,
    /// The key words and their hash.
    pub words: Vec<u64>,
    pub hash: u64,
}

/// The reusable scratch of [`Walker::walk`].
#[derive(Default)]
pub(crate) struct Walker {
    /// Per node index: (walk generation when last seen, position in that walk).
    marks: Vec<(u32, u32)>,
    generation: u32,
    /// DFS stack: node, start of its operands in `operands`, next slot.
    stack: Vec<(NodeId, usize, usize)>,
    operands: Vec<NodeId>,
    /// Recycled vectors for the next walk's `order` and `words`.
    spare_order: Vec<NodeId>,
    spare_words: Vec<u64>,
}

impl Walker {
    /// Walks `graph` from `targets` (see the module docs).
    pub(crate) fn walk(&mut self, graph: &Graph, targets: &[NodeId]) -> Walk {
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            // Wrapped: old marks could alias the new generation.
            self.marks.iter_mut().for_each(|m| *m = (0, 0));
            self.generation = 1;
        }
        let bound = graph.node_bound();
        if self.marks.len() < bound {
            self.marks.resize(bound, (0, 0));
        }
        let gen = self.generation;
        let mut w = Walk {
            order: std::mem::take(&mut self.spare_order),
            inputs: Vec::new(),
            streams: Vec::new(),
            collectives: Vec::new(),
            words: std::mem::take(&mut self.spare_words),
            hash: 0,
        };
        w.order.clear();
        w.words.clear();
        for &root in targets {
            if self.marks[root.index()].0 == gen {
                continue;
            }
            self.marks[root.index()].0 = gen;
            self.push(graph, root);
            while let Some(top) = self.stack.last_mut() {
                let (node, start, next) = *top;
                if start + next < self.operands.len() {
                    top.2 += 1;
                    let child = self.operands[start + next];
                    if self.marks[child.index()].0 != gen {
                        self.marks[child.index()].0 = gen;
                        self.push(graph, child);
                    }
                } else {
                    self.stack.pop();
                    let ops = &self.operands[start..];
                    self.marks[node.index()].1 = w.order.len() as u32;
                    encode(graph, node, ops, &self.marks, &mut w);
                    self.operands.truncate(start);
                    w.order.push(node);
                }
            }
        }
        for t in targets {
            put(&mut w, self.marks[t.index()].1 as u64);
        }
        // The collectives' recorded order, as ranks among themselves (the
        // plan runs them in that order, and the numbers themselves grow
        // with every step, so only the order may be part of the key).
        for rank in seq_ranks(&w.collectives) {
            put(&mut w, rank);
        }
        w
    }

    fn push(&mut self, graph: &Graph, id: NodeId) {
        let start = self.operands.len();
        graph.operands_into(id, &mut self.operands);
        self.stack.push((id, start, 0));
    }

    /// Takes back a walk's vectors for the next one.
    pub(crate) fn recycle(&mut self, order: Vec<NodeId>, words: Vec<u64>) {
        self.spare_order = order;
        self.spare_words = words;
    }
}

/// Appends a word and folds it into the hash.
#[inline(always)]
fn put(w: &mut Walk, v: u64) {
    w.words.push(v);
    w.hash = mix(w.hash, v);
}

/// The slot of `x` in `list`, added at the end the first time.
fn slot<T: PartialEq + Copy>(list: &mut Vec<T>, x: T) -> u64 {
    match list.iter().position(|&y| y == x) {
        Some(i) => i as u64,
        None => {
            list.push(x);
            (list.len() - 1) as u64
        }
    }
}

fn scalar_words(w: &mut Walk, s: Scalar) {
    match s {
        Scalar::Float(v) => {
            put(w, 0);
            put(w, v.to_bits());
        }
        Scalar::Int(v) => {
            put(w, 1);
            put(w, v as u64);
        }
        Scalar::Bool(v) => {
            put(w, 2);
            put(w, v as u64);
        }
    }
}

fn dims_words(w: &mut Walk, dims: &[usize]) {
    put(w, dims.len() as u64);
    for &d in dims {
        put(w, d as u64);
    }
}

fn dtype_code(d: DType) -> u64 {
    DType::ALL.iter().position(|&x| x == d).map_or(u64::MAX, |i| i as u64)
}

/// The words of one node: a head word (op tag, dtype, rank, operand
/// count, region), the shape, the op's attributes, the operands' positions.
fn encode(graph: &Graph, id: NodeId, operands: &[NodeId], marks: &[(u32, u32)], w: &mut Walk) {
    let node = graph.node(id);
    let tag = op_tag(&node.op);
    let head = tag
        | dtype_code(node.dtype) << 8
        | (node.shape.rank() as u64) << 16
        | (operands.len() as u64) << 24
        | (node.region.0 as u64) << 32;
    put(w, head);
    for &d in node.shape.dims() {
        put(w, d as u64);
    }
    for o in operands {
        put(w, marks[o.index()].1 as u64);
    }
    match &node.op {
        Op::Buffer(b) => {
            let s = slot(&mut w.inputs, *b);
            put(w, s);
        }
        // Extraction never sees these in a recording graph; encoded all the same.
        Op::Input(k) => put(w, *k as u64 | 1 << 32),
        Op::Random { dist, stream } => {
            let s = slot(&mut w.streams, *stream);
            put(w, s);
            put(w, *dist as u64);
        }
        Op::Full(v) => scalar_words(w, *v),
        Op::Extra { output } => put(w, *output as u64),
        Op::Arange { start, step } => {
            scalar_words(w, *start);
            scalar_words(w, *step);
        }
        Op::Reshape(s) | Op::Expand(s) => dims_words(w, s.dims()),
        Op::Permute(p) => dims_words(w, p),
        Op::Slice { dim, start, step, len } => {
            for v in [dim, start, step, len] {
                put(w, *v as u64);
            }
        }
        Op::Unary(u) => put(w, *u as u64),
        Op::Binary(b) => put(w, *b as u64),
        Op::Compare(c) => put(w, *c as u64),
        Op::Cast(d) => put(w, dtype_code(*d)),
        Op::Reduce { op, dims, keepdim, into } => {
            put(
                w,
                *op as u64 | (*keepdim as u64) << 8 | into.map_or(0, |d| dtype_code(d).wrapping_add(1)) << 16,
            );
            dims_words(w, dims);
        }
        Op::Where | Op::MatMul | Op::Assign | Op::AttentionDelta => {}
        Op::Conv2d { stride, padding, dilation, groups } => {
            for v in stride.iter().chain(padding).chain(dilation).chain([groups]) {
                put(w, *v as u64);
            }
        }
        Op::Pool2d { kind, kernel, stride, padding } => {
            put(w, *kind as u64);
            for v in kernel.iter().chain(stride).chain(padding) {
                put(w, *v as u64);
            }
        }
        Op::MaxPool2dGrad { kernel, stride, padding } => {
            for v in kernel.iter().chain(stride).chain(padding) {
                put(w, *v as u64);
            }
        }
        Op::Gather { dim }
        | Op::IndexSelect { dim }
        | Op::IndexAdd { dim }
        | Op::WriteAt { dim }
        | Op::Cat { dim } => put(w, *dim as u64),
        Op::Attention { scale, causal, mask, layout } => {
            put(w, scale.to_bits());
            put(w, *causal as u64);
            put(w, *mask as u64);
            put(w, *layout as u64);
        }
        Op::AttentionStats { scale, causal, mask } => {
            put(w, scale.to_bits());
            put(w, *causal as u64);
            put(w, *mask as u64);
        }
        Op::AttentionGrad { scale, causal, mask, wrt } => {
            put(w, scale.to_bits());
            put(w, *causal as u64);
            put(w, *mask as u64);
            put(w, *wrt as u64);
        }
        Op::Collective { what, seq } => {
            match what {
                crate::ir::Collective::AllReduce(op) => put(w, *op as u64),
                crate::ir::Collective::Broadcast(root) => put(w, 1000 + *root as u64),
                crate::ir::Collective::ReduceScatter { op, ranks } => {
                    put(w, 2000 + *op as u64);
                    put(w, *ranks as u64);
                }
                crate::ir::Collective::AllGather { ranks } => {
                    put(w, 3000);
                    put(w, *ranks as u64);
                }
            }
            // The order among the walk's collectives goes in after the
            // walk (`Walker::walk`): the seq itself differs every step.
            w.collectives.push(*seq);
        }
        Op::Fused(body) => {
            // Not recorded by the API; its printed body is exact.
            let text = crate::ir::text::print(body.graph());
            put(w, text.len() as u64);
            for chunk in text.as_bytes().chunks(8) {
                let mut b = [0u8; 8];
                b[..chunk.len()].copy_from_slice(chunk);
                put(w, u64::from_le_bytes(b));
            }
        }
    }
}

/// A distinct number per op variant.
fn op_tag(op: &Op) -> u64 {
    match op {
        Op::Input(_) => 1,
        Op::Buffer(_) => 2,
        Op::Full(_) => 3,
        Op::Arange { .. } => 4,
        Op::Random { .. } => 5,
        Op::Reshape(_) => 6,
        Op::Permute(_) => 7,
        Op::Expand(_) => 8,
        Op::Slice { .. } => 9,
        Op::Unary(_) => 10,
        Op::Binary(_) => 11,
        Op::Compare(_) => 12,
        Op::Where => 13,
        Op::Cast(_) => 14,
        Op::Reduce { .. } => 15,
        Op::MatMul => 16,
        Op::Conv2d { .. } => 17,
        Op::Pool2d { .. } => 18,
        Op::Gather { .. } => 19,
        Op::IndexSelect { .. } => 20,
        Op::Cat { .. } => 21,
        Op::Fused(_) => 22,
        Op::IndexAdd { .. } => 23,
        Op::Attention { .. } => 24,
        Op::Collective { .. } => 25,
        Op::WriteAt { .. } => 26,
        Op::Assign => 27,
        Op::AttentionStats { .. } => 28,
        Op::AttentionGrad { .. } => 29,
        Op::Extra { .. } => 30,
        Op::AttentionDelta => 31,
        Op::MaxPool2dGrad { .. } => 32,
    }
}

/// For each of `seqs`, its rank among them (0 for the smallest).
fn seq_ranks(seqs: &[u64]) -> Vec<u64> {
    let mut sorted = seqs.to_vec();
    sorted.sort_unstable();
    seqs.iter().map(|&s| seq_rank(&sorted, s)).collect()
}

/// The rank of `seq` among `sorted` (the plan's collectives, sorted): a
/// collective's number in the key and in the compiled graph.
fn seq_rank(sorted: &[u64], seq: u64) -> u64 {
    sorted.partition_point(|&s| s < seq) as u64
}

/// Copies the walked nodes (`order`, with the walk's `inputs` and
/// `streams`) into a graph of their own: buffers become `input k`, random
/// streams are renumbered from 0, collectives are renumbered `0..k` in
/// their recorded order, the targets are the outputs (what a cache miss
/// compiles).
pub(crate) fn extract_walked(
    graph: &Graph,
    targets: &[NodeId],
    order: &[NodeId],
    inputs: &[BufferId],
    streams: &[u64],
) -> Graph {
    let mut out = graph.empty_like();
    let mut map: std::collections::HashMap<NodeId, NodeId> = Default::default();
    let slot_of = |list: &[u64], x: u64| list.iter().position(|&y| y == x).unwrap_or(usize::MAX);
    let mut seqs: Vec<u64> = order.iter().filter_map(|&id| graph.node(id).op.effect_seq()).collect();
    seqs.sort_unstable();
    for &id in order {
        let mut node = graph.node(id).clone();
        node.op = match node.op {
            Op::Buffer(b) => Op::Input(inputs.iter().position(|&x| x == b).unwrap_or(usize::MAX) as u32),
            Op::Random { dist, stream } => Op::Random { dist, stream: slot_of(streams, stream) as u64 },
            Op::Collective { what, seq } => Op::Collective { what, seq: seq_rank(&seqs, seq) },
            op => op,
        };
        let operands: Vec<NodeId> = graph.operands(id).iter().map(|o| map[o]).collect();
        map.insert(id, out.add_unchecked(node, &operands));
    }
    out.set_outputs(targets.iter().map(|t| map[t]).collect());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Context, Tensor};
    use std::collections::HashMap;

    /// The key words of reading `t`.
    fn words(ctx: &Context, t: &Tensor) -> Vec<u64> {
        let id = t.node_in(ctx, crate::Location::caller()).expect("live tensor");
        Walker::default().walk(&ctx.state().graph, &[id]).words
    }

    fn key(ctx: &Context, t: &Tensor) -> PlanKey {
        let id = t.node_in(ctx, crate::Location::caller()).expect("live tensor");
        let w = Walker::default().walk(&ctx.state().graph, &[id]);
        PlanKey {
            passes: String::new(),
            options: PassOptions::default(),
            compile: CompileOptions::default(),
            hash: w.hash,
            words: w.words,
        }
    }

    #[test]
    fn the_same_computation_on_other_buffers_and_streams_has_one_key() {
        let ctx = Context::cpu();
        let (a, b) = (ctx.tensor(&[1.0f32, 2.0], [2]), ctx.tensor(&[5.0f32, 6.0], [2]));
        assert_eq!(key(&ctx, &(a.exp() * 2.0)), key(&ctx, &(b.exp() * 2.0)));
        let (r, s) = (ctx.randn([2]) + 1.0, ctx.randn([2]) + 1.0);
        assert_eq!(key(&ctx, &r), key(&ctx, &s));
        // One walker reused for many walks gives the same words as a fresh one.
        let mut walker = Walker::default();
        for t in [&r, &s, &r] {
            let id = t.node_in(&ctx, crate::Location::caller()).unwrap();
            let w = walker.walk(&ctx.state().graph, &[id]);
            assert_eq!(w.words, words(&ctx, t));
            walker.recycle(w.order, w.words);
        }
    }

    #[test]
    fn graphs_that_differ_in_one_constant_shape_or_attribute_never_share_a_key() {
        let ctx = Context::cpu();
        let x = ctx.tensor(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3]);
        let y = ctx.tensor(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [3, 2]);
        let z = ctx.tensor(&[1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3]);
        let cases: Vec<(&str, Tensor)> = vec![
            ("base", (&x * 2.0).sum(&[1], false)),
            ("one constant", (&x * 3.0).sum(&[1], false)),
            ("the sign of zero", (&x * -0.0).sum(&[1], false)),
            ("zero", (&x * 0.0).sum(&[1], false)),
            ("one shape", (&y * 2.0).sum(&[1], false)),
            ("one dtype", (&z * 2.0).sum(&[1], false)),
            ("one attribute (dims)", (&x * 2.0).sum(&[0], false)),
            ("one attribute (keepdim)", (&x * 2.0).sum(&[1], true)),
            ("one op", (&x + 2.0).sum(&[1], false)),
            ("one reduction", (&x * 2.0).mean(&[1], false)),
            ("operand order", (2.0f64 * &x).sum(&[1], false)),
            ("a slice start", (&x * 2.0).narrow(1, 1, 2).sum(&[1], false)),
            ("a slice length", (&x * 2.0).narrow(1, 0, 2).sum(&[1], false)),
        ];
        for (i, (what, a)) in cases.iter().enumerate() {
            for (other, b) in &cases[i + 1..] {
                assert_ne!(key(&ctx, a), key(&ctx, b), "{what} vs {other}");
            }
        }
    }

    #[test]
    fn sharing_is_part_of_the_key() {
        let ctx = Context::cpu();
        let (x, y) = (ctx.tensor(&[1.0f32, 2.0], [2]), ctx.tensor(&[3.0f32, 4.0], [2]));
        // One buffer read twice, or two buffers.
        assert_ne!(key(&ctx, &(&x + &x)), key(&ctx, &(&x + &y)));
        // One random node read twice, or two random nodes.
        let r = ctx.randn([2]);
        assert_ne!(key(&ctx, &(&r + &r)), key(&ctx, &(ctx.randn([2]) + ctx.randn([2]))));
        // One exp used twice, or the same exp recorded twice.
        let e = x.exp();
        assert_ne!(key(&ctx, &(&e * &e)), key(&ctx, &(x.exp() * x.exp())));
    }

    #[test]
    fn equal_hashes_with_different_words_are_different_keys() {
        let ctx = Context::cpu();
        let x = ctx.tensor(&[1.0f32, 2.0], [2]);
        let (mut a, b) = (key(&ctx, &(&x * 2.0)), key(&ctx, &(&x * 3.0)));
        a.hash = b.hash;
        assert_ne!(a, b);
        let mut map: HashMap<PlanKey, &str, KeyHash> = HashMap::default();
        map.insert(a.clone(), "times two");
        map.insert(b.clone(), "times three");
        assert_eq!((map[&a], map[&b], map.len()), ("times two", "times three", 2));
    }

    #[test]
    fn several_targets_and_their_order_are_part_of_the_key() {
        let ctx = Context::cpu();
        let x = ctx.tensor(&[1.0f32, 2.0], [2]);
        let (a, b) = (x.exp(), x.tanh());
        let ids = |ts: &[&Tensor]| -> Vec<NodeId> {
            ts.iter().map(|t| t.node_in(&ctx, crate::Location::caller()).unwrap()).collect()
        };
        // The ids first: `node_in` takes the context's lock too.
        let walk = |ts: &[&Tensor]| {
            let ids = ids(ts);
            Walker::default().walk(&ctx.state().graph, &ids).words
        };
        assert_ne!(walk(&[&a, &b]), walk(&[&b, &a]));
        assert_ne!(walk(&[&a, &b]), walk(&[&a]));
        assert_ne!(walk(&[&a, &a]), walk(&[&a]));
    }
}
