//! Loading a checkpoint someone else wrote: a Hugging Face (or any)
//! safetensors file whose tensor names are not kiln's. A mapping says
//! which parameter each checkpoint tensor is (a closure, or a table of
//! pairs); the loader checks the whole correspondence before it assigns
//! anything and reports every problem at once:
//!
//! - *missing*: parameters no checkpoint tensor maps to;
//! - *unexpected*: tensors mapped to a name that is no parameter;
//! - *mis-shaped*: tensors whose shape differs from their parameter's.
//!
//! A mapping may also say that a 2-D tensor is its parameter's transpose
//! ([`Target::transposed`]): Hugging Face's GPT-2 stores its Conv1D
//! weights `[in, out]`, and kiln's GPT-2 holds them `[out, in]` (see
//! `nn::gpt2`), so they are transposed once, on the host, as they load.
//!
//! Tensors the mapping answers `None` for are deliberately skipped (a
//! pooler head an embedding model does not use, old buffers such as
//! `position_ids`). Float tensors convert to the parameter's float dtype
//! on load (an f16 or bf16 checkpoint into f32 parameters, or f32 weights
//! into a bf16 model), rounding once to nearest; other dtypes must match.
//! Several files load as one checkpoint (sharded checkpoints, or halves).

use super::Params;
use crate::context::checkpoint::{from_bytes, kiln_dtype};
use crate::ir::{HostData, Shape};
use crate::{DType, Error, Location, Result, Tensor, Variable};
use safetensors::SafeTensors;
use std::collections::BTreeMap;
use std::path::Path;

/// What a load did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// Parameters set, by kiln name.
    pub loaded: Vec<String>,
    /// Checkpoint tensors the mapping skipped, by checkpoint name.
    pub skipped: Vec<String>,
}

/// Where [`load_mapped`] puts a checkpoint tensor: the kiln variable's
/// name, and whether the tensor is stored transposed. A mapping that
/// returns a plain `String` means "this variable, as stored".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The kiln variable's name.
    pub name: String,
    /// The tensor is 2-D and the variable holds its transpose: a
    /// checkpoint `[a, b]` loads into a `[b, a]` variable.
    pub transposed: bool,
}

impl Target {
    /// The variable `name`, loaded from the transpose of its tensor.
    pub fn transposed(name: impl Into<String>) -> Target {
        Target { name: name.into(), transposed: true }
    }
}

impl From<String> for Target {
    fn from(name: String) -> Target {
        Target { name, transposed: false }
    }
}

/// Sets every parameter of `params` from the safetensors `files`, naming
/// each checkpoint tensor's parameter with `map` (checkpoint name → kiln
/// variable name or [`Target`], `None` to skip the tensor). Nothing is
/// assigned unless every parameter has exactly one tensor of its shape.
///
/// ```
/// use kiln::prelude::*;
/// use kiln::nn::{self, Linear};
/// let dir = std::env::temp_dir().join(format!("kiln-doc-mapped-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// // A "foreign" checkpoint: PyTorch names, f16.
/// let other = Context::cpu();
/// other.scope("fc", |c| {
///     c.variable("weight", c.ones([2, 3]).cast(DType::F16))?;
///     c.variable("bias", c.zeros([2]).cast(DType::F16)).map(|_| ())
/// })?;
/// other.save(dir.join("model.safetensors"))?;
///
/// let ctx = Context::cpu();
/// let layer = ctx.scope("net", |ctx| Linear::new(ctx, "proj", 3, 2))?;
/// let map = |name: &str| Some(name.replace("fc/", "net/proj/"));
/// let report = nn::load_mapped(&layer, &[dir.join("model.safetensors")], map)?;
/// assert_eq!(report.loaded, ["net/proj/weight", "net/proj/bias"]);
/// assert_eq!(layer.weight.to_vec::<f32>()?, vec![1.0; 6]);
/// # std::fs::remove_dir_all(&dir).ok();
/// # Ok::<(), kiln::Error>(())
/// ```
#[track_caller]
pub fn load_mapped<P: AsRef<Path>, T: Into<Target>>(
    params: &impl Params,
    files: &[P],
    mut map: impl FnMut(&str) -> Option<T>,
) -> Result<LoadReport> {
    let location = Location::caller();
    let _span = tracing::info_span!("nn::load_mapped", files = files.len()).entered();
    let fail = |message: String| Error::Workspace { op: "nn::load_mapped", message, location };
    let vars = params.parameters();
    let by_name: BTreeMap<String, &Variable> = vars.iter().map(|v| (v.name(), v)).collect();
    let mut found: BTreeMap<String, (String, Shape, DType, HostData)> = BTreeMap::new();
    let (mut unexpected, mut misshaped, mut twice, mut skipped) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut seen_misshaped = Vec::new();
    for path in files {
        let path = path.as_ref();
        let bytes =
            std::fs::read(path).map_err(|e| Error::Io(format!("cannot read {}: {e}", path.display())))?;
        let file = SafeTensors::deserialize(&bytes)
            .map_err(|e| fail(format!("{} is not a safetensors file: {e}", path.display())))?;
        let mut names: Vec<String> = file.names().into_iter().map(str::to_string).collect();
        names.sort();
        for name in names {
            let Some(Target { name: target, transposed }) = map(&name).map(Into::into) else {
                skipped.push(name);
                continue;
            };
            let view = file.tensor(&name).map_err(|e| fail(format!("tensor \"{name}\": {e}")))?;
            let mut dims = view.shape().to_vec();
            let Some(var) = by_name.get(&target) else {
                unexpected.push(format!("{name} (as {target})"));
                continue;
            };
            if transposed {
                dims.reverse();
            }
            if (transposed && view.shape().len() != 2) || dims != var.shape() {
                seen_misshaped.push(target.clone());
                misshaped.push(format!(
                    "{name} is {}{} in the checkpoint, {target} is {}",
                    Shape::new(view.shape()),
                    if transposed { ", loaded transposed," } else { "" },
                    Shape::new(var.shape())
                ));
                continue;
            }
            let shape = Shape::new(dims);
            let dtype = kiln_dtype(view.dtype()).ok_or_else(|| {
                fail(format!("tensor \"{name}\" has dtype {:?}, which kiln does not read", view.dtype()))
            })?;
            let mut host = from_bytes(dtype, view.data())
                .ok_or_else(|| fail(format!("tensor \"{name}\": its bytes do not fit {dtype}")))?;
            if transposed {
                host = transpose(host, view.shape()[0], view.shape()[1]);
            }
            if let Some((first, ..)) = found.insert(target.clone(), (name.clone(), shape, dtype, host)) {
                twice.push(format!("{target} (from {first} and {name})"));
            }
        }
    }
    let missing: Vec<String> =
        by_name.keys().filter(|n| !found.contains_key(*n) && !seen_misshaped.contains(*n)).cloned().collect();
    if !(missing.is_empty() && unexpected.is_empty() && misshaped.is_empty() && twice.is_empty()) {
        let mut parts = Vec::new();
        for (what, list) in [
            ("missing", &missing),
            ("unexpected", &unexpected),
            ("mis-shaped", &misshaped),
            ("mapped twice", &twice),
        ] {
            if !list.is_empty() {
                parts.push(format!("{what} ({}): {}", list.len(), list.join(", ")));
            }
        }
        return Err(fail(format!(
            "the checkpoint does not fit the model; nothing was loaded.\n  {}",
            parts.join("\n  ")
        )));
    }
    // Convert everything before assigning anything.
    let mut values = Vec::with_capacity(found.len());
    for (target, (name, shape, dtype, host)) in found {
        let var = by_name[&target];
        values.push((var, convert(host, dtype, var.dtype(), &name, &target, &fail)?, shape));
    }
    let mut loaded = Vec::with_capacity(values.len());
    for (var, host, shape) in values {
        let Some(ctx) = var.context() else { continue };
        let t = upload(ctx, host, shape.dims().to_vec());
        var.assign(t)?;
        loaded.push(var.name());
    }
    loaded.sort_by_key(|n| vars.iter().position(|v| v.name() == *n));
    Ok(LoadReport { loaded, skipped })
}

/// The tensor's values in the parameter's dtype.
fn convert(
    host: HostData,
    from: DType,
    to: DType,
    name: &str,
    target: &str,
    fail: &dyn Fn(String) -> Error,
) -> Result<HostData> {
    if from == to {
        return Ok(host);
    }
    if !(from.is_float() && to.is_float()) {
        return Err(fail(format!(
            "tensor \"{name}\" is {from} but {target} is {to}; only float tensors convert on load"
        )));
    }
    let wide = host.to_f64_vec();
    Ok(match to {
        DType::F16 => HostData::F16(wide.iter().map(|&x| half::f16::from_f64(x)).collect()),
        DType::BF16 => HostData::BF16(wide.iter().map(|&x| half::bf16::from_f64(x)).collect()),
        DType::F32 => HostData::F32(wide.iter().map(|&x| x as f32).collect()),
        _ => HostData::F64(wide),
    })
}

/// The `[cols, rows]` transpose of row-major `[rows, cols]` values.
fn transpose(host: HostData, rows: usize, cols: usize) -> HostData {
    fn t<T: Copy>(v: Vec<T>, rows: usize, cols: usize) -> Vec<T> {
        (0..cols * rows).map(|i| v[(i % rows) * cols + i / rows]).collect()
    }
    match host {
        HostData::F16(d) => HostData::F16(t(d, rows, cols)),
        HostData::BF16(d) => HostData::BF16(t(d, rows, cols)),
        HostData::F32(d) => HostData::F32(t(d, rows, cols)),
        HostData::F64(d) => HostData::F64(t(d, rows, cols)),
        HostData::U8(d) => HostData::U8(t(d, rows, cols)),
        HostData::I32(d) => HostData::I32(t(d, rows, cols)),
        HostData::I64(d) => HostData::I64(t(d, rows, cols)),
        HostData::Bool(d) => HostData::Bool(t(d, rows, cols)),
    }
}

fn upload(ctx: &crate::Context, host: HostData, shape: Vec<usize>) -> Tensor {
    match host {
        HostData::F16(d) => ctx.tensor(&d, shape),
        HostData::BF16(d) => ctx.tensor(&d, shape),
        HostData::F32(d) => ctx.tensor(&d, shape),
        HostData::F64(d) => ctx.tensor(&d, shape),
        HostData::U8(d) => ctx.tensor(&d, shape),
        HostData::I32(d) => ctx.tensor(&d, shape),
        HostData::I64(d) => ctx.tensor(&d, shape),
        HostData::Bool(d) => ctx.tensor(&d, shape),
    }
}

/// The safetensors files of the checkpoint in a Hugging Face model folder:
/// `model.safetensors`, or else every `model-*.safetensors` (a sharded
/// checkpoint, or one split into parts to travel), in name order.
pub fn checkpoint_files(dir: &Path) -> Result<Vec<std::path::PathBuf>> {
    let whole = dir.join("model.safetensors");
    if whole.exists() {
        return Ok(vec![whole]);
    }
    let mut parts: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::Io(format!("cannot read {}: {e}", dir.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("model-") && n.ends_with(".safetensors"))
        })
        .collect();
    parts.sort();
    if parts.is_empty() {
        return Err(Error::Io(format!(
            "{} has no model.safetensors (nor model-*.safetensors parts)",
            dir.display()
        )));
    }
    Ok(parts)
}

/// A mapping from a table of `(checkpoint name, kiln name)` pairs, for
/// [`load_mapped`]; names not in the table are skipped.
pub fn table<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl FnMut(&str) -> Option<String> + 'a {
    let map: BTreeMap<&str, &str> = pairs.iter().copied().collect();
    move |name| map.get(name).map(|s| s.to_string())
}
