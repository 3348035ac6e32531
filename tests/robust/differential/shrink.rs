//! Shrinks a failing program to a small one that fails the same way:
//! greedy delta debugging over the program's own structure.
//!
//! Each step tries, in order, and keeps the first candidate that still
//! fails: reading one output alone; reading in turn instead of together;
//! bypassing an instruction (its users read one of its operands of the
//! same type instead, e.g. `exp(x) -> x`, `realize(x) -> x`); cutting a
//! source tensor's data to its first values where the shape allows it.
//! Dead code is dropped after every step. It stops when no candidate
//! fails.

use super::eval::{eval, Model};
use super::program::{Instr, Program, ReadMode, Source};

fn candidates(p: &Program, model: Model) -> Vec<Program> {
    let mut out = Vec::new();
    if p.outputs.len() > 1 {
        out.extend(p.outputs.iter().map(|&o| p.sliced(&[o])));
    }
    if p.read == ReadMode::Together {
        out.push(Program { read: ReadMode::EachInTurn, ..p.clone() });
    }
    let vals = eval(model, p);
    for (i, instr) in p.instrs.iter().enumerate().rev() {
        for a in instr.operands() {
            if vals[a].dt != vals[i].dt || vals[a].arr.shape != vals[i].arr.shape {
                continue;
            }
            let map: Vec<usize> = (0..p.instrs.len()).map(|v| if v == i { a } else { v }).collect();
            let instrs: Vec<Instr> = p
                .instrs
                .iter()
                .enumerate()
                .map(|(j, x)| if j > i { x.renumbered(&map) } else { x.clone() })
                .collect();
            let outputs: Vec<usize> = p.outputs.iter().map(|&o| map[o]).collect();
            let mut dedup = outputs.clone();
            dedup.dedup();
            let bypassed = Program { instrs, outputs: dedup, ..p.clone() };
            out.push(bypassed.sliced(&bypassed.outputs.clone()));
        }
    }
    // Simpler data: every value of a data source set to its first one.
    for (i, instr) in p.instrs.iter().enumerate() {
        if let Instr::Source { shape, dt, src: Source::Data(d) } = instr {
            if d.iter().any(|&x| x != d[0]) {
                let mut q = p.clone();
                q.instrs[i] =
                    Instr::Source { shape: shape.clone(), dt: *dt, src: Source::Data(vec![d[0]; d.len()]) };
                out.push(q);
            }
        }
    }
    out
}

/// The smallest program found that `fails`; `p` must fail.
pub fn shrink(p: &Program, model: Model, fails: impl Fn(&Program) -> bool) -> Program {
    let mut best = p.sliced(&p.outputs);
    'search: loop {
        for cand in candidates(&best, model) {
            if fails(&cand) {
                best = cand;
                continue 'search;
            }
        }
        return best;
    }
}
