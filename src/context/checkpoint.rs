//! Checkpoints: a workspace's variables as a safetensors file, each
//! tensor named by its variable's full scoped name (`encoder/layer1/w`),
//! so a checkpoint *is* a workspace and other tools read it as it is.
//!
//! Loading sets the variables the file names, making the scopes and
//! variables that do not exist yet (a model built after the load then
//! finds its variables already there, as `Context::variable` returns an
//! existing variable). A tensor whose variable exists with another shape
//! or dtype is an error, and nothing is changed then: the whole file is
//! checked before any variable is set.

use super::workspace::{check_name, ScopeEntry, ScopeId, VarEntry, VarId};
use super::{Context, State};
use crate::ir::{DType, HostData, Op, Shape};
use crate::{Error, Location, Result};
use half::{bf16, f16};
use safetensors::{Dtype, SafeTensors};
use std::collections::BTreeMap;
use std::path::Path;

impl Context {
    /// Writes every variable of the current scope and the scopes below it
    /// to `path` as safetensors, named by full scoped name. Pending
    /// assignments run first (this is a read).
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let path = std::env::temp_dir().join(format!("kiln-doc-{}.safetensors", std::process::id()));
    /// let ctx = Context::cpu();
    /// ctx.scope("enc", |ctx| ctx.variable("w", ctx.tensor(&[1.0f32, 2.0], [2])).map(|_| ()))?;
    /// ctx.save(&path)?;
    /// let fresh = Context::cpu();
    /// fresh.load(&path)?;
    /// assert_eq!(fresh.get_variable("enc/w")?.to_vec::<f32>()?, vec![1.0, 2.0]);
    /// # std::fs::remove_file(&path).ok();
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let location = Location::caller();
        let path = path.as_ref();
        self.sync()?;
        let tensors: Vec<NamedBytes> = {
            let state = self.state();
            let ids = state.ws.subtree_vars(state.ws.current());
            let mut out = Vec::with_capacity(ids.len());
            for id in ids {
                let v = state.ws.var(id);
                let buffer = match state.graph.node(v.value).op {
                    Op::Buffer(b) => state.buffers.get(&b).cloned(),
                    _ => None,
                }
                .ok_or_else(|| {
                    Error::Backend(format!("variable \"{}\" has no value after a sync", v.name))
                })?;
                let host = self.inner.backend.download(&buffer)?;
                out.push((v.name.clone(), v.dtype, v.shape.dims().to_vec(), to_bytes(&host)));
            }
            out
        };
        let mut info = std::collections::HashMap::new();
        info.insert("format".to_string(), "kiln workspace".to_string());
        write_safetensors(&tensors, Some(info), path, location)
    }

    /// Reads a safetensors file and sets the variable each tensor names
    /// (by full scoped name, from the root), making missing scopes and
    /// variables. Every tensor is checked first (names, dtypes, shapes of
    /// existing variables): on an error nothing changes.
    #[track_caller]
    pub fn load(&self, path: impl AsRef<Path>) -> Result<()> {
        let location = Location::caller();
        let path = path.as_ref();
        let fail = |message: String| Error::Workspace { op: "load", message, location };
        let bytes =
            std::fs::read(path).map_err(|e| Error::Io(format!("cannot read {}: {e}", path.display())))?;
        let file = SafeTensors::deserialize(&bytes)
            .map_err(|e| fail(format!("{} is not a safetensors file: {e}", path.display())))?;
        let mut tensors: Vec<(String, DType, Shape, HostData)> = Vec::new();
        for (name, view) in file.tensors() {
            let dtype = kiln_dtype(view.dtype()).ok_or_else(|| {
                fail(format!("tensor \"{name}\" has dtype {}, which kiln does not have", view.dtype()))
            })?;
            for part in name.split('/') {
                check_name("variable", part).map_err(|m| fail(format!("tensor \"{name}\": {m}")))?;
            }
            let shape = Shape::new(view.shape());
            let host = from_bytes(dtype, view.data())
                .ok_or_else(|| fail(format!("tensor \"{name}\": its data does not fit {dtype}{shape}")))?;
            tensors.push((name, dtype, shape, host));
        }
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        let mut state = self.state();
        for (name, dtype, shape, _) in &tensors {
            check_fits(&state, name, *dtype, shape).map_err(fail)?;
        }
        for (name, dtype, shape, host) in tensors {
            let buffer = self.inner.backend.upload(host, &shape)?;
            set_loaded(&mut state, &name, dtype, shape, buffer)?;
        }
        Ok(())
    }
}

/// Whether the tensor `name` can be loaded: an existing variable must have
/// its type, and no part of its path may be a variable.
fn check_fits(state: &State, name: &str, dtype: DType, shape: &Shape) -> std::result::Result<(), String> {
    let ws = &state.ws;
    let mut parts: Vec<&str> = name.split('/').collect();
    let last = parts.pop().unwrap_or_default();
    let mut scope = ScopeId::ROOT;
    for (i, part) in parts.iter().enumerate() {
        if ws.scope(scope).vars.contains_key(*part) {
            return Err(format!(
                "tensor \"{name}\" needs a scope \"{}\", but that is a variable",
                parts[..=i].join("/")
            ));
        }
        match ws.scope(scope).children.get(*part) {
            Some(&child) => scope = child,
            None => return Ok(()),
        }
    }
    if ws.scope(scope).children.contains_key(last) {
        return Err(format!("tensor \"{name}\" names a scope, not a variable"));
    }
    if let Some(&id) = ws.scope(scope).vars.get(last) {
        let v = ws.var(id);
        if v.dtype != dtype || v.shape != *shape {
            return Err(format!(
                "tensor \"{name}\" is {dtype}{shape} but the variable is {}{}; nothing was loaded",
                v.dtype, v.shape
            ));
        }
    }
    Ok(())
}

/// The scope holding the variable `name` (full path), made with the scopes
/// above it if missing, and the variable's own name in it.
fn scope_of<'n>(state: &mut State, name: &'n str) -> (ScopeId, &'n str) {
    let mut parts: Vec<&str> = name.split('/').collect();
    let last = parts.pop().unwrap_or_default();
    let mut scope = ScopeId::ROOT;
    for part in parts {
        scope = match state.ws.scope(scope).children.get(part) {
            Some(&child) => child,
            None => {
                let parent_region = state.ws.scope(scope).region;
                let region = state.graph.region(parent_region, part);
                let parent_path = state.ws.scope(scope).path.clone();
                let path =
                    if parent_path.is_empty() { part.to_string() } else { format!("{parent_path}/{part}") };
                let id = ScopeId(state.ws.scopes.len() as u32);
                state.ws.scopes.push(ScopeEntry {
                    path,
                    region,
                    vars: BTreeMap::new(),
                    children: BTreeMap::new(),
                    bindings: None,
                });
                state.ws.scope_mut(scope).children.insert(part.to_string(), id);
                id
            }
        };
    }
    (scope, last)
}

/// Makes `buffer` the value of the variable `name`, making the variable
/// (and its scopes) if missing.
fn set_loaded(
    state: &mut State,
    name: &str,
    dtype: DType,
    shape: Shape,
    buffer: crate::backends::Buffer,
) -> Result<()> {
    let (scope, last) = scope_of(state, name);
    let region = state.ws.scope(scope).region;
    let id = state.add_buffer(buffer);
    let node = state
        .graph
        .add(Op::Buffer(id), &[], Some((shape.clone(), dtype)), region)
        .map_err(|m| Error::Backend(format!("loading \"{name}\": {m}")))?;
    match state.ws.scope(scope).vars.get(last).copied() {
        Some(var) => state.ws.set_value(var, node),
        None => {
            let var = VarId(state.ws.vars.len() as u32);
            state.ws.vars.push(VarEntry { name: name.to_string(), scope, shape, dtype, region, value: node });
            state.ws.leaves.insert(node, var);
            state.ws.scope_mut(scope).vars.insert(last.to_string(), var);
        }
    }
    Ok(())
}

/// One named tensor as safetensors stores it: name, dtype, shape and
/// little-endian bytes.
pub(crate) type NamedBytes = (String, DType, Vec<usize>, Vec<u8>);

/// Writes `tensors` to `path` as a safetensors file; `location` is the
/// user's `save` call, named in the error.
pub(crate) fn write_safetensors(
    tensors: &[NamedBytes],
    metadata: Option<std::collections::HashMap<String, String>>,
    path: &Path,
    location: Location,
) -> Result<()> {
    let fail = |e: safetensors::SafeTensorError| {
        Error::Io(format!("cannot write {} (save at {location}): {e}", path.display()))
    };
    let views = tensors
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            safetensors::tensor::TensorView::new(st_dtype(*dtype), shape.clone(), bytes)
                .map(|view| (name.clone(), view))
        })
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(fail)?;
    safetensors::serialize_to_file(views, metadata, path).map_err(fail)
}

pub(crate) fn st_dtype(d: DType) -> Dtype {
    match d {
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::U8 => Dtype::U8,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
        DType::Bool => Dtype::BOOL,
    }
}

pub(crate) fn kiln_dtype(d: Dtype) -> Option<DType> {
    Some(match d {
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::F32 => DType::F32,
        Dtype::F64 => DType::F64,
        Dtype::U8 => DType::U8,
        Dtype::I32 => DType::I32,
        Dtype::I64 => DType::I64,
        Dtype::BOOL => DType::Bool,
        _ => return None,
    })
}

/// Little-endian bytes, as safetensors stores them.
fn to_bytes(h: &HostData) -> Vec<u8> {
    fn flat<T, const N: usize>(v: &[T], f: impl Fn(&T) -> [u8; N]) -> Vec<u8> {
        v.iter().flat_map(f).collect()
    }
    match h {
        HostData::F16(v) => flat(v, |x| x.to_le_bytes()),
        HostData::BF16(v) => flat(v, |x| x.to_le_bytes()),
        HostData::F32(v) => flat(v, |x| x.to_le_bytes()),
        HostData::F64(v) => flat(v, |x| x.to_le_bytes()),
        HostData::U8(v) => v.clone(),
        HostData::I32(v) => flat(v, |x| x.to_le_bytes()),
        HostData::I64(v) => flat(v, |x| x.to_le_bytes()),
        HostData::Bool(v) => v.iter().map(|&b| b as u8).collect(),
    }
}

/// The host data of little-endian bytes, `None` if the length does not fit
/// the dtype or a bool byte is not 0 or 1.
pub(crate) fn from_bytes(dtype: DType, bytes: &[u8]) -> Option<HostData> {
    fn words<const N: usize, T>(bytes: &[u8], f: impl Fn([u8; N]) -> T) -> Option<Vec<T>> {
        if bytes.len() % N != 0 {
            return None;
        }
        Some(bytes.chunks_exact(N).map(|c| f(c.try_into().unwrap_or([0; N]))).collect())
    }
    Some(match dtype {
        DType::F16 => HostData::F16(words(bytes, f16::from_le_bytes)?),
        DType::BF16 => HostData::BF16(words(bytes, bf16::from_le_bytes)?),
        DType::F32 => HostData::F32(words(bytes, f32::from_le_bytes)?),
        DType::F64 => HostData::F64(words(bytes, f64::from_le_bytes)?),
        DType::U8 => HostData::U8(bytes.to_vec()),
        DType::I32 => HostData::I32(words(bytes, i32::from_le_bytes)?),
        DType::I64 => HostData::I64(words(bytes, i64::from_le_bytes)?),
        DType::Bool => HostData::Bool(
            bytes
                .iter()
                .map(|&b| match b {
                    0 => Some(false),
                    1 => Some(true),
                    _ => None,
                })
                .collect::<Option<_>>()?,
        ),
    })
}
