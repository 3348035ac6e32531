//! Scopes: `ctx.scope("encoder", |ctx| ...)`. A scope is three things at
//! once: a name prefix for the variables made in it (`encoder/w`), a
//! region of the recording graph (its nodes print `@encoder`, cluster in
//! DOT, count in [`crate::Stats::regions`]), and a child workspace that
//! outlives the call, so entering the same scope again (the next training
//! step) finds the same variables: Caffe2's reused forward workspace.
//!
//! Names resolve in the scope itself and in what is bound into it
//! explicitly ([`Context::scope_with`]), never in its parents: a layer
//! sees only its own parameters and what it was handed. A scope keeps the
//! bindings it was first entered with; entering it with others is an
//! error, as are a binding whose inner name the scope already uses, a
//! binding whose source does not exist, and a name listed twice.

use super::workspace::{check_name, Frame, ScopeEntry, ScopeId};
use super::Context;
use crate::ir::{DType, RegionAutocast};
use crate::{Error, Location, Result};
use std::collections::BTreeMap;

impl Context {
    /// Runs `f` inside the scope `name` (a child of the current scope,
    /// created the first time): variables it makes are named `name/...`,
    /// nodes it records go into region `name`, and a later call with the
    /// same name finds the same variables. The scope is left when `f`
    /// returns, whatever it returns.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let ctx = Context::cpu();
    /// for _step in 0..3 {
    ///     ctx.scope("encoder", |ctx| {
    ///         let w = ctx.variable("w", ctx.ones([2, 2]))?; // made once, found twice
    ///         assert_eq!(w.name(), "encoder/w");
    ///         Ok(())
    ///     })?;
    /// }
    /// assert_eq!(ctx.workspace().names(), ["encoder/w"]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn scope<R>(&self, name: &str, f: impl FnOnce(&Context) -> Result<R>) -> Result<R> {
        self.scope_at(name, &[], f, Location::caller())
    }

    /// [`Context::scope`] with variables of the current scope bound into
    /// the new one: each `(inner, source)` makes the variable `source`
    /// (a name the current scope sees, or a path into its child scopes
    /// such as `"embed/table"`) visible inside as `inner`. A scope keeps
    /// the bindings it was first entered with.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let ctx = Context::cpu();
    /// let table = ctx.variable("table", ctx.ones([4, 2]))?;
    /// ctx.scope_with("decoder", &[("embed", "table")], |ctx| {
    ///     let e = ctx.get_variable("embed")?;        // the same variable
    ///     assert_eq!(e.name(), "table");
    ///     assert!(ctx.get_variable("table").is_err()); // parents are not searched
    ///     Ok(())
    /// })?;
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn scope_with<R>(
        &self,
        name: &str,
        bindings: &[(&str, &str)],
        f: impl FnOnce(&Context) -> Result<R>,
    ) -> Result<R> {
        self.scope_at(name, bindings, f, Location::caller())
    }

    fn scope_at<R>(
        &self,
        name: &str,
        bindings: &[(&str, &str)],
        f: impl FnOnce(&Context) -> Result<R>,
        location: Location,
    ) -> Result<R> {
        self.push_at(name, bindings, location)?;
        // Leave the scope even if `f` panics, so the context stays usable.
        struct Leave<'a> {
            ctx: &'a Context,
            name: &'a str,
            location: Location,
            done: bool,
        }
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                if !self.done {
                    let _ = self.ctx.pop_at(self.name, self.location);
                }
            }
        }
        let mut guard = Leave { ctx: self, name, location, done: false };
        let result = f(self);
        guard.done = true;
        self.pop_at(name, location)?;
        result
    }

    /// [`Context::scope`] with mixed precision of its own: the products
    /// (matmul, conv2d, attention) recorded in the scope, in its children
    /// that do not say otherwise, and in its gradients (`grad/<scope>`)
    /// run in `low` (`Some(DType::BF16)` or `Some(DType::F16)`), and with
    /// `None` autocast is off there even under [`Context::with_autocast`].
    /// This is PyTorch's `torch.autocast(...)` block (and its
    /// `enabled=False`) as a property of a region: the autocast pass reads
    /// each product's region. The setting is fixed when the scope is
    /// first entered; a plain [`Context::scope`] re-enters it with its
    /// setting, and entering it with another setting is an error.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let ctx = Context::cpu();
    /// let x = ctx.rand([4, 8]);
    /// let w = ctx.rand([8, 8]);
    /// let y = ctx.scope_with_autocast("encoder", Some(DType::BF16), |_| Ok(x.matmul(&w)))?;
    /// let z = y.matmul(&w); // outside: f32
    /// let text = kiln::ir::text::print(&ctx.optimized_graph(&[&z])?);
    /// assert!(text.contains("region encoder autocast=bf16"));
    /// assert!(text.contains("bf16[4,8] = matmul"));
    /// assert!(text.contains("f32[4,8] = matmul"));
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn scope_with_autocast<R>(
        &self,
        name: &str,
        low: Option<DType>,
        f: impl FnOnce(&Context) -> Result<R>,
    ) -> Result<R> {
        let location = Location::caller();
        let setting = match low {
            None => RegionAutocast::Off,
            Some(d @ (DType::BF16 | DType::F16)) => RegionAutocast::Low(d),
            Some(other) => {
                return Err(Error::Argument {
                    op: "scope_with_autocast",
                    message: format!(
                        "autocast runs products in bf16 or f16, not {other}; pass None to turn it off in scope \"{name}\""
                    ),
                    location,
                })
            }
        };
        {
            let state = self.state();
            let parent = state.ws.current();
            if let Some(&child) = state.ws.scope(parent).children.get(name) {
                let entry = state.ws.scope(child);
                let before = state.graph.regions()[entry.region.0 as usize].autocast;
                if before != setting {
                    return Err(Error::Workspace {
                        op: "scope",
                        message: format!(
                            "scope \"{}\" was entered with autocast {before} before, now with {setting}; a scope keeps its autocast (use another scope name)",
                            entry.path
                        ),
                        location,
                    });
                }
            }
        }
        let set = |ctx: &Context| {
            let mut state = ctx.state();
            let region = state.region;
            state.graph.set_region_autocast(region, setting);
        };
        self.scope_at(
            name,
            &[],
            |ctx| {
                set(ctx);
                f(ctx)
            },
            location,
        )
    }

    /// Enters the scope `name` without a closure (Caffe2's push); leave it
    /// with [`Context::pop_scope`].
    #[track_caller]
    pub fn push_scope(&self, name: &str) -> Result<()> {
        self.push_at(name, &[], Location::caller())
    }

    /// Enters the scope `name` with bindings (see [`Context::scope_with`]).
    #[track_caller]
    pub fn push_scope_with(&self, name: &str, bindings: &[(&str, &str)]) -> Result<()> {
        self.push_at(name, bindings, Location::caller())
    }

    /// Leaves the innermost open scope, which must be `name`.
    #[track_caller]
    pub fn pop_scope(&self, name: &str) -> Result<()> {
        self.pop_at(name, Location::caller())
    }

    /// The path of the innermost open scope (empty at the root).
    pub fn current_scope(&self) -> String {
        let state = self.state();
        state.ws.scope(state.ws.current()).path.clone()
    }

    fn push_at(&self, name: &str, bindings: &[(&str, &str)], location: Location) -> Result<()> {
        let fail = |message: String| Error::Workspace { op: "scope", message, location };
        check_name("scope", name).map_err(fail)?;
        let mut state = self.state();
        let parent = state.ws.current();
        let parent_path = state.ws.scope(parent).path.clone();
        let path = if parent_path.is_empty() { name.to_string() } else { format!("{parent_path}/{name}") };
        if parent_path.is_empty() && name == "grad" {
            return Err(fail(
                "the scope name \"grad\" is reserved: gradients are recorded in grad/<scope> regions".into(),
            ));
        }
        if state.ws.scope(parent).vars.contains_key(name) || state.ws.lookup(name).is_some() {
            return Err(fail(format!(
                "\"{name}\" is already a variable in {}, so it cannot also name a scope there",
                where_(&parent_path)
            )));
        }
        // Resolve the bindings in the scope being left.
        let mut bound: BTreeMap<String, crate::context::VarId> = BTreeMap::new();
        for &(inner, source) in bindings {
            check_name("binding", inner).map_err(fail)?;
            if bound.contains_key(inner) {
                return Err(fail(format!(
                    "the binding name \"{inner}\" is used twice in the bindings of \"{path}\""
                )));
            }
            let var = state.ws.lookup_path(source).ok_or_else(|| {
                fail(format!(
                    "cannot bind \"{inner}\" in \"{path}\" to \"{source}\": {} has no variable \"{source}\"",
                    where_(&parent_path)
                ))
            })?;
            bound.insert(inner.to_string(), var);
        }
        let existing = state.ws.scope(parent).children.get(name).copied();
        if let Some(child) = existing {
            let entry = state.ws.scope(child);
            for inner in bound.keys() {
                if entry.vars.contains_key(inner) || entry.children.contains_key(inner) {
                    return Err(fail(format!(
                        "cannot bind \"{inner}\" in \"{path}\": the scope already has its own \"{inner}\""
                    )));
                }
            }
            if let Some(before) = &entry.bindings {
                if *before != bound {
                    let text = |b: &BTreeMap<String, crate::context::VarId>| {
                        let items: Vec<String> =
                            b.iter().map(|(k, v)| format!("{k} -> {}", state.ws.var(*v).name)).collect();
                        format!("[{}]", items.join(", "))
                    };
                    return Err(fail(format!(
                        "scope \"{path}\" was entered with bindings {} before, now with {}; a scope keeps its bindings (use another scope name for other ones)",
                        text(before),
                        text(&bound)
                    )));
                }
            }
        }
        let child = match existing {
            Some(child) => child,
            None => {
                let parent_region = state.ws.scope(parent).region;
                let region = state.graph.region(parent_region, name);
                let id = ScopeId(state.ws.scopes.len() as u32);
                state.ws.scopes.push(ScopeEntry {
                    path: path.clone(),
                    region,
                    vars: BTreeMap::new(),
                    children: BTreeMap::new(),
                    bindings: None,
                });
                state.ws.scope_mut(parent).children.insert(name.to_string(), id);
                id
            }
        };
        if state.ws.scope(child).bindings.is_none() {
            state.ws.scope_mut(child).bindings = Some(bound.clone());
        }
        let outer_region = state.region;
        state.region = state.ws.scope(child).region;
        state.ws.stack.push(Frame { scope: child, bindings: bound, outer_region });
        Ok(())
    }

    fn pop_at(&self, name: &str, location: Location) -> Result<()> {
        let mut state = self.state();
        let Some(top) = state.ws.stack.last() else {
            return Err(Error::Workspace {
                op: "pop_scope",
                message: format!("cannot leave scope \"{name}\": no scope is open"),
                location,
            });
        };
        let open = state.ws.scope(top.scope).path.clone();
        let last = open.rsplit('/').next().unwrap_or_default();
        if last != name {
            return Err(Error::Workspace {
                op: "pop_scope",
                message: format!(
                    "cannot leave scope \"{name}\": the innermost open scope is \"{open}\" (scopes are left innermost first)"
                ),
                location,
            });
        }
        let frame = state.ws.stack.pop();
        if let Some(frame) = frame {
            state.region = frame.outer_region;
        }
        Ok(())
    }
}

/// `the root scope` or `scope "a/b"`, for messages.
pub(crate) fn where_(path: &str) -> String {
    if path.is_empty() {
        "the root scope".into()
    } else {
        format!("scope \"{path}\"")
    }
}
