//! The rules of [`super::rules::RULES`] as egg rewrites: each [`Rule`] is
//! both the searcher and the applier of its own `egg::Rewrite`, since a
//! rule is a function of one e-node rather than a pattern.

use super::lang::{ENode, SGraph, Term, Types};
use super::rules::{Env, Rule};
use egg::{Applier, Id, PatternAst, SearchMatches, Searcher, Subst, Symbol, Var};

/// One [`Rule`] as an egg searcher and applier. The searcher finds the
/// e-classes where the rule applies (so the runner counts matches); the
/// applier recomputes the terms on the current e-graph and unions them in,
/// reporting only unions that changed something (so saturation is seen).
#[derive(Clone, Copy)]
pub struct Apply {
    /// The rule.
    pub rule: &'static Rule,
    /// The options it runs under.
    pub env: Env,
}

impl Apply {
    fn terms(&self, g: &SGraph, class: Id) -> Vec<Term> {
        g[class]
            .nodes
            .iter()
            .filter(|n| n.op.kind() == self.rule.root)
            .filter_map(|n| (self.rule.rewrite)(self.env, g, n))
            .collect()
    }
}

impl Searcher<ENode, Types> for Apply {
    fn search_eclass_with_limit(
        &self,
        g: &SGraph,
        eclass: Id,
        limit: usize,
    ) -> Option<SearchMatches<'_, ENode>> {
        let n = self.terms(g, eclass).len().min(limit);
        (n > 0).then(|| SearchMatches { eclass, substs: vec![Subst::default(); n], ast: None })
    }

    fn search_with_limit(&self, g: &SGraph, mut limit: usize) -> Vec<SearchMatches<'_, ENode>> {
        let mut out = Vec::new();
        let Some(classes) = g.classes_for_op(&self.rule.root) else { return out };
        for class in classes {
            if limit == 0 {
                break;
            }
            if let Some(m) = self.search_eclass_with_limit(g, class, limit) {
                limit -= m.substs.len();
                out.push(m);
            }
        }
        out
    }

    fn vars(&self) -> Vec<Var> {
        Vec::new()
    }
}

impl Applier<ENode, Types> for Apply {
    fn apply_matches(&self, g: &mut SGraph, matches: &[SearchMatches<ENode>], _: Symbol) -> Vec<Id> {
        let mut changed = Vec::new();
        for m in matches {
            for term in self.terms(g, m.eclass) {
                let id = term.add(g);
                if g.union(m.eclass, id) {
                    changed.push(id);
                }
            }
        }
        changed
    }

    fn apply_one(
        &self,
        _: &mut SGraph,
        _: Id,
        _: &Subst,
        _: Option<&PatternAst<ENode>>,
        _: Symbol,
    ) -> Vec<Id> {
        // Never called: apply_matches handles whole matches.
        Vec::new()
    }
}
