//! Workspaces: the variables of a context, in a tree of scopes (Caffe2's
//! `Workspace` and `WorkspaceStack`), the stack of open scopes, the
//! gradient workspaces, and the side tables autodiff reads (which
//! recording-graph nodes are variable values, which are detached).
//!
//! A variable is a name, a type, a home region and its *current value*: a
//! node of the recording graph. Creating or assigning a variable records a
//! fresh identity node in the variable's region and makes it the value
//! (so a value the user also holds elsewhere never becomes a gradient
//! leaf by accident). Until a read realizes it, the value is pending: the
//! next read computes it in the same plan as whatever it reads and it
//! becomes a buffer node (an input of later plans, in the variable's
//! region, so every later step extracts the same graph). Nothing here
//! holds a `Tensor`: tensors keep their context alive, and the context
//! owns this, so the values are plain node ids that [`Workspaces::roots`]
//! hands to the garbage collector.

use crate::ir::{DType, Graph, NodeId, Op, RegionId, Shape};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

/// Identifies a variable of one context; never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct VarId(pub(crate) u32);

/// Identifies a scope (a node of the workspace tree); 0 is the root.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct ScopeId(pub(crate) u32);

impl ScopeId {
    pub(crate) const ROOT: ScopeId = ScopeId(0);
}

/// One variable.
#[derive(Clone, Debug)]
pub(crate) struct VarEntry {
    /// The full scoped name (`encoder/layer1/w`).
    pub(crate) name: String,
    pub(crate) scope: ScopeId,
    pub(crate) shape: Shape,
    pub(crate) dtype: DType,
    /// The region of the scope that created it; its values live there.
    pub(crate) region: RegionId,
    /// The current value (a buffer node once realized).
    pub(crate) value: NodeId,
}

/// One scope: a workspace of variables, child scopes, and the bindings it
/// was first entered with.
#[derive(Clone, Debug)]
pub(crate) struct ScopeEntry {
    /// The full path (`encoder/layer1`; empty for the root).
    pub(crate) path: String,
    pub(crate) region: RegionId,
    pub(crate) vars: BTreeMap<String, VarId>,
    pub(crate) children: BTreeMap<String, ScopeId>,
    /// Inner name -> bound variable, as the scope was first entered
    /// (`None` before that; the root is never entered).
    pub(crate) bindings: Option<BTreeMap<String, VarId>>,
}

/// An open scope.
#[derive(Clone, Debug)]
pub(crate) struct Frame {
    pub(crate) scope: ScopeId,
    pub(crate) bindings: BTreeMap<String, VarId>,
    /// The region new nodes went to before the scope opened.
    pub(crate) outer_region: RegionId,
}

/// The gradients of one scope's variables (Caffe2's gradient workspace).
#[derive(Clone, Debug)]
pub(crate) struct GradWorkspace {
    pub(crate) scope: ScopeId,
    /// Each variable's accumulated gradient.
    pub(crate) grads: BTreeMap<VarId, NodeId>,
}

/// Every scope, variable and gradient workspace of a context.
#[derive(Clone, Debug)]
pub(crate) struct Workspaces {
    pub(crate) scopes: Vec<ScopeEntry>,
    pub(crate) vars: Vec<VarEntry>,
    /// Open scopes, innermost last.
    pub(crate) stack: Vec<Frame>,
    /// Gradient workspaces in the order they were made; released from the
    /// end (LIFO).
    pub(crate) grads: Vec<GradWorkspace>,
    /// Nodes that are (or were) a variable's value: where gradients stop.
    pub(crate) leaves: HashMap<NodeId, VarId>,
    /// Nodes made by `detach`: no gradient flows through them.
    pub(crate) stops: HashSet<NodeId>,
}

impl Default for Workspaces {
    fn default() -> Workspaces {
        Workspaces {
            scopes: vec![ScopeEntry {
                path: String::new(),
                region: RegionId::ROOT,
                vars: BTreeMap::new(),
                children: BTreeMap::new(),
                bindings: None,
            }],
            vars: Vec::new(),
            stack: Vec::new(),
            grads: Vec::new(),
            leaves: HashMap::new(),
            stops: HashSet::new(),
        }
    }
}

impl Workspaces {
    /// The innermost open scope (the root when none is open).
    pub(crate) fn current(&self) -> ScopeId {
        self.stack.last().map_or(ScopeId::ROOT, |f| f.scope)
    }

    pub(crate) fn scope(&self, id: ScopeId) -> &ScopeEntry {
        &self.scopes[id.0 as usize]
    }

    pub(crate) fn scope_mut(&mut self, id: ScopeId) -> &mut ScopeEntry {
        &mut self.scopes[id.0 as usize]
    }

    pub(crate) fn var(&self, id: VarId) -> &VarEntry {
        &self.vars[id.0 as usize]
    }

    /// The current value node of a variable.
    pub(crate) fn value(&self, id: VarId) -> NodeId {
        self.var(id).value
    }

    /// Makes `node` the value of `var` (and a gradient leaf of it).
    pub(crate) fn set_value(&mut self, var: VarId, node: NodeId) {
        self.vars[var.0 as usize].value = node;
        self.leaves.insert(node, var);
    }

    /// `name` as the current scope sees it: its own variables, then what
    /// is bound into it. Never the parents' names.
    pub(crate) fn lookup(&self, name: &str) -> Option<VarId> {
        let scope = self.current();
        if let Some(&v) = self.scope(scope).vars.get(name) {
            return Some(v);
        }
        self.stack.last().and_then(|f| f.bindings.get(name).copied())
    }

    /// A `/`-separated path relative to the current scope: a name it sees
    /// ([`Workspaces::lookup`]), or `child/.../name` through its child scopes.
    pub(crate) fn lookup_path(&self, path: &str) -> Option<VarId> {
        let mut parts: Vec<&str> = path.split('/').collect();
        let last = parts.pop()?;
        if parts.is_empty() {
            return self.lookup(last);
        }
        let mut scope = self.current();
        for part in parts {
            scope = *self.scope(scope).children.get(part)?;
        }
        self.scope(scope).vars.get(last).copied()
    }

    /// Every node the context must keep: variable values and gradients.
    pub(crate) fn roots(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.vars.iter().map(|v| v.value).chain(self.grads.iter().flat_map(|w| w.grads.values().copied()))
    }

    /// Forgets side-table entries of nodes the collector removed.
    pub(crate) fn retain_nodes(&mut self, keep: impl Fn(NodeId) -> bool) {
        self.leaves.retain(|&id, _| keep(id));
        self.stops.retain(|&id| keep(id));
    }

    /// Values and gradients not yet realized, in a fixed order (variables
    /// by creation, then gradients by workspace and variable): what the
    /// next read computes along with what it reads.
    pub(crate) fn pending(&self, graph: &Graph) -> Vec<NodeId> {
        let unrealized = |id: &NodeId| !matches!(graph.node(*id).op, Op::Buffer(_));
        let mut out: Vec<NodeId> = self.vars.iter().map(|v| v.value).filter(unrealized).collect();
        for w in &self.grads {
            out.extend(w.grads.values().copied().filter(unrealized));
        }
        let mut seen = HashSet::new();
        out.retain(|id| seen.insert(*id));
        out
    }

    /// The gradient workspace of `scope`, made (as the newest) if missing.
    pub(crate) fn grad_workspace(&mut self, scope: ScopeId) -> &mut GradWorkspace {
        let i = match self.grads.iter().position(|w| w.scope == scope) {
            Some(i) => i,
            None => {
                self.grads.push(GradWorkspace { scope, grads: BTreeMap::new() });
                self.grads.len() - 1
            }
        };
        &mut self.grads[i]
    }

    /// The accumulated gradient of a variable, if any.
    pub(crate) fn grad_of(&self, var: VarId) -> Option<NodeId> {
        let scope = self.var(var).scope;
        self.grads.iter().find(|w| w.scope == scope).and_then(|w| w.grads.get(&var).copied())
    }

    /// The variables of `scope` and every scope below it, by name.
    pub(crate) fn subtree_vars(&self, scope: ScopeId) -> Vec<VarId> {
        let prefix = &self.scope(scope).path;
        let mut out: Vec<VarId> = self
            .vars
            .iter()
            .enumerate()
            .filter(|(_, v)| prefix.is_empty() || v.name.starts_with(&format!("{prefix}/")))
            .map(|(i, _)| VarId(i as u32))
            .collect();
        out.sort_by(|a, b| self.var(*a).name.cmp(&self.var(*b).name));
        out
    }

    /// The scope with this full path, if it exists.
    pub(crate) fn scope_by_path(&self, path: &str) -> Option<ScopeId> {
        self.scopes.iter().position(|s| s.path == path).map(|i| ScopeId(i as u32))
    }

    /// `grad/<path>` (or `grad` for the root): how gradient workspaces are named.
    pub(crate) fn grad_name(&self, scope: ScopeId) -> String {
        let path = &self.scope(scope).path;
        if path.is_empty() {
            "grad".into()
        } else {
            format!("grad/{path}")
        }
    }
}

/// Checks a scope or variable name: one path component of letters,
/// digits, `_`, `-` and `.`. Returns what is wrong.
pub(crate) fn check_name(kind: &str, name: &str) -> Result<(), String> {
    let ok = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{kind} name {name:?} is not valid: use letters, digits, '_', '-' and '.' ('/' separates scopes, so open a scope instead)"
        ))
    }
}

/// One variable, as [`Workspace`] lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VariableInfo {
    /// The full scoped name (`encoder/layer1/w`): its safetensors name too.
    pub name: String,
    /// The shape.
    pub shape: Vec<usize>,
    /// The element type.
    pub dtype: DType,
    /// Bytes of its value.
    pub bytes: usize,
    /// The region its values are recorded in (its scope's path).
    pub region: String,
    /// True while its latest value is recorded but not yet computed (the
    /// next read computes it).
    pub pending: bool,
    /// True if a gradient workspace holds a gradient for it.
    pub has_grad: bool,
}

/// What a scope's workspace holds: its variables and those of the scopes
/// below it, what is bound into it, and the gradient workspaces.
/// [`crate::Context::workspace`] makes one; it is a snapshot (later
/// changes do not show).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workspace {
    /// The scope's path (empty for the root).
    pub scope: String,
    /// Its variables and those of its sub-scopes, by name.
    pub variables: Vec<VariableInfo>,
    /// `(inner name, bound variable)` for each binding of the open scope.
    pub bindings: Vec<(String, String)>,
    /// The gradient workspaces (`grad/<scope>`), oldest first: they are
    /// released from the end.
    pub grad_workspaces: Vec<String>,
}

impl Workspace {
    /// The variable's entry, by full scoped name.
    pub fn get(&self, name: &str) -> Option<&VariableInfo> {
        self.variables.iter().find(|v| v.name == name)
    }

    /// The full names of the variables.
    pub fn names(&self) -> Vec<&str> {
        self.variables.iter().map(|v| v.name.as_str()).collect()
    }

    /// Bytes of all variables together.
    pub fn bytes(&self) -> usize {
        self.variables.iter().map(|v| v.bytes).sum()
    }
}

impl fmt::Display for Workspace {
    /// A table: one line per variable (`name dtype[shape] bytes @region`,
    /// with `pending` and `grad` flags), then bindings and gradient
    /// workspaces.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scope = if self.scope.is_empty() { "(root)" } else { &self.scope };
        writeln!(f, "workspace {scope}: {} variable(s), {} bytes", self.variables.len(), self.bytes())?;
        let width = self.variables.iter().map(|v| v.name.len()).max().unwrap_or(0);
        for v in &self.variables {
            let ty = format!("{}{}", v.dtype, Shape::new(v.shape.clone()));
            write!(f, "  {:width$}  {ty:14} {:>10} B", v.name, v.bytes)?;
            if !v.region.is_empty() {
                write!(f, "  @{}", v.region)?;
            }
            if v.pending {
                write!(f, "  pending")?;
            }
            if v.has_grad {
                write!(f, "  grad")?;
            }
            writeln!(f)?;
        }
        for (inner, outer) in &self.bindings {
            writeln!(f, "  binding {inner} -> {outer}")?;
        }
        if !self.grad_workspaces.is_empty() {
            writeln!(f, "  gradient workspaces (oldest first): {}", self.grad_workspaces.join(", "))?;
        }
        Ok(())
    }
}

/// One region's share of the recording graph and the workspaces, as
/// [`crate::Stats::regions`] lists it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegionStats {
    /// The region's path (`encoder`, `grad/encoder`; empty for the root).
    pub path: String,
    /// Nodes of the recording graph in this region now.
    pub nodes: usize,
    /// Variables whose home is this region.
    pub variables: usize,
    /// Bytes of those variables.
    pub variable_bytes: usize,
}

impl super::State {
    /// Per-region counts for [`crate::Stats`], sorted by path; regions with
    /// no node and no variable are left out.
    pub(crate) fn region_stats(&self) -> Vec<RegionStats> {
        let mut by_region: BTreeMap<RegionId, RegionStats> = BTreeMap::new();
        for id in self.graph.node_ids() {
            by_region.entry(self.graph.node(id).region).or_default().nodes += 1;
        }
        for v in &self.ws.vars {
            let entry = by_region.entry(v.region).or_default();
            entry.variables += 1;
            entry.variable_bytes += v.shape.numel() * v.dtype.size();
        }
        let mut out: Vec<RegionStats> = by_region
            .into_iter()
            .map(|(r, mut s)| {
                s.path = self.graph.region_name(r);
                s
            })
            .collect();
        out.sort_by(|a, b| a.path.cmp(&b.path));
        out
    }

    /// A snapshot of the current scope's workspace.
    pub(crate) fn workspace_info(&self) -> Workspace {
        let ws = &self.ws;
        let scope = ws.current();
        let variables = ws
            .subtree_vars(scope)
            .into_iter()
            .map(|id| {
                let v = ws.var(id);
                VariableInfo {
                    name: v.name.clone(),
                    shape: v.shape.dims().to_vec(),
                    dtype: v.dtype,
                    bytes: v.shape.numel() * v.dtype.size(),
                    region: self.graph.region_name(v.region),
                    pending: !matches!(self.graph.node(v.value).op, Op::Buffer(_)),
                    has_grad: ws.grad_of(id).is_some(),
                }
            })
            .collect();
        let bindings = ws
            .stack
            .last()
            .map(|f| f.bindings.iter().map(|(k, v)| (k.clone(), ws.var(*v).name.clone())).collect())
            .unwrap_or_default();
        Workspace {
            scope: ws.scope(scope).path.clone(),
            variables,
            bindings,
            grad_workspaces: ws.grads.iter().map(|w| ws.grad_name(w.scope)).collect(),
        }
    }
}

impl super::Context {
    /// What the current scope's workspace holds (its variables and those
    /// of the scopes below it, by full name), its bindings, and the
    /// gradient workspaces. Printing it gives a table.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let ctx = Context::cpu();
    /// ctx.scope("encoder", |ctx| ctx.variable("w", ctx.zeros([4, 3])).map(|_| ()))?;
    /// let ws = ctx.workspace();
    /// assert_eq!(ws.names(), ["encoder/w"]);
    /// assert_eq!(ws.get("encoder/w").unwrap().bytes, 48);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn workspace(&self) -> Workspace {
        self.state().workspace_info()
    }
}
