//! A layered (Sugiyama-style) layout for drawing graphs without Graphviz.
//!
//! Why written here: the report must open offline with nothing installed,
//! so the layout runs in Rust when the report is written. The one
//! pure-Rust crate that lays out dot graphs, `layout-rs` 0.1.3, was tried
//! on a tensor-program-like chain with residual edges (release build, this
//! 2-core machine): 25 nodes 7 ms, 50 nodes 19 ms, 100 nodes 10.3 s, and
//! 200 nodes had not finished after 13 minutes of CPU, so 2,000 was out of
//! reach; it also knows nothing of nested clusters. This module lays out
//! and draws a 2,000-node graph of that shape in 23.8 ms (`cargo bench
//! --bench report -- --quick`, release, this machine, 2026-11-24; 200
//! nodes 2.0 ms), keeps every
//! region contiguous in every layer (so clusters draw as outlines that
//! never cross), and is deterministic: the same input gives the same
//! coordinates, bit for bit.
//!
//! Steps: longest-path layering (sources moved down next to their first
//! user), dummy nodes on edges that span layers, barycenter sweeps for
//! crossings with a sort key that keeps regions together, and per-layer
//! x placement as an isotonic regression (each node as close as it can
//! be to the mean of its neighbours, never closer than the gap to the
//! next one).

use std::cmp::Ordering;
use std::collections::BTreeMap;

/// What to lay out: node sizes, the cluster path of each node (region
/// ids from the outermost down, empty for the root), and edges
/// `(from, to)`, from operand to user. The graph must be acyclic.
#[derive(Clone, Debug, Default)]
pub(crate) struct Input {
    /// Width and height of each node.
    pub sizes: Vec<(f64, f64)>,
    /// Cluster path of each node.
    pub groups: Vec<Vec<u32>>,
    /// Edges, from operand to user.
    pub edges: Vec<(usize, usize)>,
}

/// A box: left, top, width, height.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Rect {
    pub x: f64,
    pub y: f64,
    pub w: f64,
    pub h: f64,
}

/// Where everything goes.
#[derive(Clone, Debug, Default)]
pub(crate) struct Layout {
    /// The box of each node.
    pub nodes: Vec<Rect>,
    /// Each edge of the input, as points from the bottom of its source to
    /// the top of its target (dummy nodes in between).
    pub edges: Vec<Vec<(f64, f64)>>,
    /// The outline of each cluster that holds a node: one or more
    /// polygons (a cluster absent from a layer in its range splits), each
    /// a staircase around its members' extent in every layer, so clusters
    /// never overlap except by nesting (see [`outlines`]).
    pub clusters: BTreeMap<u32, Vec<Vec<(f64, f64)>>>,
    /// The drawing's size.
    pub width: f64,
    pub height: f64,
}

const NODE_GAP: f64 = 18.0;
const LAYER_GAP: f64 = 40.0;
/// Room above a cluster's first layer for its label, per nesting level.
const LABEL_H: f64 = 16.0;
const CLUSTER_PAD: f64 = 10.0;
const MARGIN: f64 = 16.0;
const DUMMY_W: f64 = 6.0;

/// One node of the layered graph: a real node or a dummy on a long edge.
struct Vertex {
    real: Option<usize>,
    group: Vec<u32>,
    w: f64,
    h: f64,
    layer: usize,
    up: Vec<usize>,
    down: Vec<usize>,
}

/// Lays the graph out (see the module docs).
pub(crate) fn layout(input: &Input) -> Layout {
    let n = input.sizes.len();
    if n == 0 {
        return Layout { width: 2.0 * MARGIN, height: 2.0 * MARGIN, ..Layout::default() };
    }
    let layer = layers(n, &input.edges);
    let mut vs: Vec<Vertex> = (0..n)
        .map(|i| Vertex {
            real: Some(i),
            group: input.groups.get(i).cloned().unwrap_or_default(),
            w: input.sizes[i].0,
            h: input.sizes[i].1,
            layer: layer[i],
            up: Vec::new(),
            down: Vec::new(),
        })
        .collect();
    // Chains of dummies for edges that span layers.
    let mut chains: Vec<Vec<usize>> = Vec::with_capacity(input.edges.len());
    for &(a, b) in &input.edges {
        let mut chain = vec![a];
        let group = common_prefix(&vs[a].group, &vs[b].group);
        for l in vs[a].layer + 1..vs[b].layer {
            vs.push(Vertex {
                real: None,
                group: group.clone(),
                w: DUMMY_W,
                h: 1.0,
                layer: l,
                up: Vec::new(),
                down: Vec::new(),
            });
            chain.push(vs.len() - 1);
        }
        chain.push(b);
        for w in chain.windows(2) {
            vs[w[0]].down.push(w[1]);
            vs[w[1]].up.push(w[0]);
        }
        chains.push(chain);
    }
    let depth = vs.iter().map(|v| v.layer).max().unwrap_or(0) + 1;
    let mut rows: Vec<Vec<usize>> = vec![Vec::new(); depth];
    for (i, v) in vs.iter().enumerate() {
        rows[v.layer].push(i);
    }
    let mut pos = vec![0.0; vs.len()];
    let index_rows = |rows: &Vec<Vec<usize>>, pos: &mut Vec<f64>| {
        for row in rows {
            for (k, &v) in row.iter().enumerate() {
                pos[v] = k as f64;
            }
        }
    };
    index_rows(&rows, &mut pos);
    for _ in 0..4 {
        for row in rows.iter_mut().skip(1) {
            order_row(row, &vs, &pos, true);
            for (k, &v) in row.iter().enumerate() {
                pos[v] = k as f64;
            }
        }
        for row in rows.iter_mut().rev().skip(1) {
            order_row(row, &vs, &pos, false);
            for (k, &v) in row.iter().enumerate() {
                pos[v] = k as f64;
            }
        }
    }
    // x: packed first, then pulled towards neighbours.
    let mut x = vec![0.0; vs.len()];
    for row in &rows {
        let mut right = 0.0;
        for (k, &v) in row.iter().enumerate() {
            let gap = if k == 0 { 0.0 } else { gap(&vs[row[k - 1]], &vs[v]) };
            x[v] = right + gap + vs[v].w / 2.0;
            right = x[v] + vs[v].w / 2.0;
        }
    }
    for sweep in 0..8 {
        let down = sweep % 2 == 0;
        let ls: Vec<usize> = if down { (0..depth).collect() } else { (0..depth).rev().collect() };
        for l in ls {
            let row = &rows[l];
            let desired: Vec<f64> = row
                .iter()
                .map(|&v| {
                    let ns: Vec<usize> = vs[v]
                        .up
                        .iter()
                        .chain(vs[v].down.iter())
                        .copied()
                        .filter(|&u| vs[u].layer != l)
                        .collect();
                    if ns.is_empty() {
                        x[v]
                    } else {
                        ns.iter().map(|&u| x[u]).sum::<f64>() / ns.len() as f64
                    }
                })
                .collect();
            let mins: Vec<f64> = (1..row.len())
                .map(|k| vs[row[k - 1]].w / 2.0 + gap(&vs[row[k - 1]], &vs[row[k]]) + vs[row[k]].w / 2.0)
                .collect();
            let placed = isotonic(&desired, &mins);
            for (k, &v) in row.iter().enumerate() {
                x[v] = placed[k];
            }
        }
    }
    // y: one band per layer, with room between them for the labels and
    // padding of clusters that start or end there.
    let nest = max_depth(&vs) as f64;
    let gap_y = LAYER_GAP + nest * (LABEL_H + 6.0);
    let mut y = vec![0.0; vs.len()];
    let mut top = MARGIN + nest * LABEL_H;
    let mut bands = vec![(0.0, 0.0); depth];
    for (l, row) in rows.iter().enumerate() {
        let h = row.iter().map(|&v| vs[v].h).fold(1.0, f64::max);
        bands[l] = (top, top + h);
        for &v in row {
            y[v] = top + (h - vs[v].h) / 2.0;
        }
        top += h + gap_y;
    }
    let min_x = vs.iter().enumerate().map(|(i, v)| x[i] - v.w / 2.0).fold(f64::INFINITY, f64::min);
    let shift = MARGIN + max_depth(&vs) as f64 * CLUSTER_PAD - min_x;
    for v in x.iter_mut() {
        *v += shift;
    }
    let nodes: Vec<Rect> =
        (0..n).map(|i| Rect { x: x[i] - vs[i].w / 2.0, y: y[i], w: vs[i].w, h: vs[i].h }).collect();
    let edges = chains
        .iter()
        .map(|chain| {
            let mut pts = Vec::with_capacity(chain.len());
            for (k, &v) in chain.iter().enumerate() {
                // Out of the bottom of the source, into the top of the rest.
                let bottom = if k == 0 { vs[v].h } else { 0.0 };
                pts.push((x[v], y[v] + bottom));
            }
            pts
        })
        .collect();
    let clusters = outlines(&vs, &x, &bands);
    let width = vs.iter().enumerate().map(|(i, v)| x[i] + v.w / 2.0).fold(0.0, f64::max)
        + MARGIN
        + max_depth(&vs) as f64 * CLUSTER_PAD;
    let height = top - gap_y + MARGIN + nest * 6.0;
    Layout { nodes, edges, clusters, width, height }
}

/// The longest path from a source for every node, with sources moved
/// down to just above their first user (an input is drawn next to what
/// reads it, not at the top of a tall graph).
fn layers(n: usize, edges: &[(usize, usize)]) -> Vec<usize> {
    let mut preds = vec![Vec::new(); n];
    let mut succs = vec![Vec::new(); n];
    let mut indeg = vec![0usize; n];
    for &(a, b) in edges {
        succs[a].push(b);
        preds[b].push(a);
        indeg[b] += 1;
    }
    let mut order = Vec::with_capacity(n);
    let mut ready: Vec<usize> = (0..n).filter(|&i| indeg[i] == 0).rev().collect();
    while let Some(v) = ready.pop() {
        order.push(v);
        for &s in succs[v].iter().rev() {
            indeg[s] -= 1;
            if indeg[s] == 0 {
                ready.push(s);
            }
        }
    }
    // A cycle (never in a verified graph) leaves nodes out: put them last.
    let mut seen = vec![false; n];
    order.iter().for_each(|&v| seen[v] = true);
    order.extend((0..n).filter(|&v| !seen[v]));
    let mut layer = vec![0usize; n];
    for &v in &order {
        layer[v] = preds[v].iter().map(|&p| layer[p] + 1).max().unwrap_or(0);
    }
    for &v in order.iter().rev() {
        if preds[v].is_empty() && !succs[v].is_empty() {
            layer[v] = succs[v].iter().map(|&s| layer[s]).min().unwrap_or(1).saturating_sub(1);
        }
    }
    layer
}

fn common_prefix(a: &[u32], b: &[u32]) -> Vec<u32> {
    a.iter().zip(b).take_while(|(x, y)| x == y).map(|(x, _)| *x).collect()
}

fn max_depth(vs: &[Vertex]) -> usize {
    vs.iter().map(|v| v.group.len()).max().unwrap_or(0)
}

/// The space between two neighbours of a row: wider where they sit in
/// different clusters, so cluster boxes have room for their padding.
fn gap(a: &Vertex, b: &Vertex) -> f64 {
    let shared = common_prefix(&a.group, &b.group).len();
    let leaving = (a.group.len() - shared) + (b.group.len() - shared);
    let base = if a.real.is_none() || b.real.is_none() { NODE_GAP / 2.0 } else { NODE_GAP };
    base + leaving as f64 * CLUSTER_PAD
}

/// Sorts a row by the barycenter of each vertex's neighbours in the
/// previous row (`from_above`) or the next, grouped so that the members
/// of every cluster stay next to each other.
fn order_row(row: &mut [usize], vs: &[Vertex], pos: &[f64], from_above: bool) {
    let bary: BTreeMap<usize, f64> = row
        .iter()
        .map(|&v| {
            let ns = if from_above { &vs[v].up } else { &vs[v].down };
            let b = if ns.is_empty() {
                pos[v]
            } else {
                ns.iter().map(|&u| pos[u]).sum::<f64>() / ns.len() as f64
            };
            (v, b)
        })
        .collect();
    let mut agg: BTreeMap<u32, (f64, usize)> = BTreeMap::new();
    for &v in row.iter() {
        for &g in &vs[v].group {
            let e = agg.entry(g).or_insert((0.0, 0));
            e.0 += bary[&v];
            e.1 += 1;
        }
    }
    let key = |v: usize| -> Vec<(f64, u32)> {
        let mut k: Vec<(f64, u32)> = vs[v]
            .group
            .iter()
            .map(|g| {
                let (s, c) = agg[g];
                (s / c as f64, *g)
            })
            .collect();
        k.push((bary[&v], u32::MAX));
        k
    };
    let mut keyed: Vec<(Vec<(f64, u32)>, usize)> = row.iter().map(|&v| (key(v), v)).collect();
    keyed.sort_by(|a, b| {
        for (x, y) in a.0.iter().zip(&b.0) {
            match x.0.total_cmp(&y.0).then(x.1.cmp(&y.1)) {
                Ordering::Equal => continue,
                o => return o,
            }
        }
        a.0.len().cmp(&b.0.len())
    });
    for (slot, (_, v)) in row.iter_mut().zip(keyed) {
        *slot = v;
    }
}

/// Positions as close (least squares) to `desired` as the gaps allow:
/// `x[k] - x[k-1] >= mins[k-1]`. Pool-adjacent-violators on the
/// positions less their cumulative minimum gaps.
fn isotonic(desired: &[f64], mins: &[f64]) -> Vec<f64> {
    let mut offset = vec![0.0; desired.len()];
    for k in 1..desired.len() {
        offset[k] = offset[k - 1] + mins[k - 1];
    }
    // Blocks of (mean, weight, count).
    let mut blocks: Vec<(f64, f64, usize)> = Vec::with_capacity(desired.len());
    for (k, d) in desired.iter().enumerate() {
        blocks.push((d - offset[k], 1.0, 1));
        while blocks.len() > 1 && blocks[blocks.len() - 2].0 > blocks[blocks.len() - 1].0 {
            let (m2, w2, c2) = blocks.pop().unwrap_or((0.0, 1.0, 0));
            if let Some(last) = blocks.last_mut() {
                let w = last.1 + w2;
                last.0 = (last.0 * last.1 + m2 * w2) / w;
                last.1 = w;
                last.2 += c2;
            }
        }
    }
    let mut out = Vec::with_capacity(desired.len());
    for (m, _, c) in blocks {
        for _ in 0..c {
            let k = out.len();
            out.push(m + offset[k]);
        }
    }
    out
}

/// The outline of each cluster. In each layer a cluster's members are
/// next to each other (see [`order_row`]), so its extent there, padded by
/// one [`CLUSTER_PAD`] per nesting level below it, meets no other
/// cluster's but its ancestors' and descendants'. The outline follows that
/// extent layer by layer and steps halfway between two layers, where
/// every cluster steps, so no two outlines cross.
fn outlines(vs: &[Vertex], x: &[f64], bands: &[(f64, f64)]) -> BTreeMap<u32, Vec<Vec<(f64, f64)>>> {
    // Per cluster: levels of nesting below it, and its extent per layer.
    let mut below: BTreeMap<u32, usize> = BTreeMap::new();
    for v in vs {
        for (d, &g) in v.group.iter().enumerate() {
            let e = below.entry(g).or_insert(0);
            *e = (*e).max(v.group.len() - d - 1);
        }
    }
    let mut extent: BTreeMap<u32, BTreeMap<usize, (f64, f64)>> = BTreeMap::new();
    for (i, v) in vs.iter().enumerate() {
        for &g in &v.group {
            let pad = (below[&g] + 1) as f64 * CLUSTER_PAD;
            let e = extent.entry(g).or_default().entry(v.layer).or_insert((f64::INFINITY, f64::NEG_INFINITY));
            e.0 = e.0.min(x[i] - v.w / 2.0 - pad);
            e.1 = e.1.max(x[i] + v.w / 2.0 + pad);
        }
    }
    let mut out = BTreeMap::new();
    for (g, layers) in extent {
        let s = below[&g] as f64 + 1.0;
        let (pad_top, pad_bottom) = (s * LABEL_H, s * 6.0);
        let mut pieces: Vec<Vec<(usize, (f64, f64))>> = Vec::new();
        for (&l, &ext) in &layers {
            match pieces.last_mut() {
                Some(p) if p.last().is_some_and(|&(pl, _)| pl + 1 == l) => p.push((l, ext)),
                _ => pieces.push(vec![(l, ext)]),
            }
        }
        let polys = pieces
            .into_iter()
            .map(|piece| {
                let (first, last) = (piece[0].0, piece[piece.len() - 1].0);
                let mid = |l: usize| (bands[l].1 + bands[l + 1].0) / 2.0;
                let y0 = |l: usize| if l == first { bands[l].0 - pad_top } else { mid(l - 1) };
                let y1 = |l: usize| if l == last { bands[l].1 + pad_bottom } else { mid(l) };
                let mut pts = Vec::with_capacity(piece.len() * 4);
                for &(l, (left, _)) in &piece {
                    pts.push((left, y0(l)));
                    pts.push((left, y1(l)));
                }
                for &(l, (_, right)) in piece.iter().rev() {
                    pts.push((right, y1(l)));
                    pts.push((right, y0(l)));
                }
                pts
            })
            .collect();
        out.insert(g, polys);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn isotonic_keeps_gaps_and_order() {
        let got = isotonic(&[10.0, 0.0, 5.0], &[4.0, 4.0]);
        assert!(got[1] - got[0] >= 4.0 - 1e-9 && got[2] - got[1] >= 4.0 - 1e-9, "{got:?}");
        assert_eq!(isotonic(&[0.0, 10.0], &[4.0]), vec![0.0, 10.0]);
    }

    #[test]
    fn clusters_stay_contiguous_in_each_row() {
        // Two parallel chains in two clusters, interleaved in input order.
        let mut input = Input::default();
        for i in 0..8 {
            input.sizes.push((40.0, 20.0));
            input.groups.push(vec![1 + (i % 2) as u32]);
            if i >= 2 {
                input.edges.push((i - 2, i));
            }
        }
        let l = layout(&input);
        // At every height the two outlines' x ranges are disjoint.
        let range = |poly: &Vec<(f64, f64)>, y: f64| {
            let xs: Vec<f64> = poly
                .windows(2)
                .filter(|w| w[0].0 == w[1].0 && w[0].1.min(w[1].1) <= y && y <= w[0].1.max(w[1].1))
                .map(|w| w[0].0)
                .collect();
            xs.iter().cloned().fold(f64::INFINITY, f64::min)
                ..xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max)
        };
        let (a, b) = (&l.clusters[&1][0], &l.clusters[&2][0]);
        for k in 0..100 {
            let y = l.height * k as f64 / 100.0;
            let (ra, rb) = (range(a, y), range(b, y));
            if ra.start.is_finite() && rb.start.is_finite() {
                assert!(ra.end <= rb.start || rb.end <= ra.start, "overlap at {y}: {ra:?} {rb:?}");
            }
        }
    }
}
