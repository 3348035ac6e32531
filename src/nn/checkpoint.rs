//! A model's parameters as a safetensors file, each tensor under its
//! variable's full scoped name (`mlp/0/weight`). Unlike
//! [`Context::save`](crate::Context::save), which writes every variable of
//! a scope (optimizer moments and averages included), these write and
//! read exactly the parameters a [`Params`] visits: a model to ship.

use super::Params;
use crate::context::checkpoint::{from_bytes, st_dtype, write_safetensors};
use crate::ir::HostData;
use crate::ir::Shape;
use crate::{DType, Error, Location, Result, Tensor, Variable};
use half::{bf16, f16};
use safetensors::SafeTensors;
use std::path::Path;

/// Writes `params` to `path` (pending assignments run first: this reads
/// them, in one plan).
#[track_caller]
pub fn save(params: &impl Params, path: impl AsRef<Path>) -> Result<()> {
    let location = Location::caller();
    let path = path.as_ref();
    let vars = params.parameters();
    if let Some(ctx) = vars.first().and_then(|v| v.context()) {
        let tensors: Vec<&Tensor> = vars.iter().map(|v| &**v).collect();
        ctx.realize(&tensors)?;
    }
    let mut data = Vec::with_capacity(vars.len());
    for v in &vars {
        data.push((v.name(), v.dtype(), v.shape().to_vec(), bytes_of(v)?));
    }
    write_safetensors(&data, None, path, location)
}

/// Sets every parameter of `params` from the tensor of its name in
/// `path`. Every parameter is checked first (present, same dtype and
/// shape): on an error nothing is assigned. Tensors the file has beyond
/// the parameters are ignored.
#[track_caller]
pub fn load(params: &impl Params, path: impl AsRef<Path>) -> Result<()> {
    let location = Location::caller();
    let path = path.as_ref();
    let fail = |message: String| Error::Workspace { op: "nn::load", message, location };
    let bytes = std::fs::read(path).map_err(|e| Error::Io(format!("cannot read {}: {e}", path.display())))?;
    let file = SafeTensors::deserialize(&bytes)
        .map_err(|e| fail(format!("{} is not a safetensors file: {e}", path.display())))?;
    let vars = params.parameters();
    let mut values: Vec<(&Variable, HostData)> = Vec::with_capacity(vars.len());
    for v in &vars {
        let name = v.name();
        let view =
            file.tensor(&name).map_err(|_| fail(format!("{} has no tensor \"{name}\"", path.display())))?;
        if view.dtype() != st_dtype(v.dtype()) || view.shape() != v.shape() {
            return Err(fail(format!(
                "tensor \"{name}\" is {}{} in {} but the parameter is {}{}; nothing was loaded",
                format!("{:?}", view.dtype()).to_lowercase(),
                Shape::new(view.shape()),
                path.display(),
                v.dtype(),
                Shape::new(v.shape())
            )));
        }
        let host = from_bytes(v.dtype(), view.data())
            .ok_or_else(|| fail(format!("tensor \"{name}\": its bytes do not fit {}", v.dtype())))?;
        values.push((v, host));
    }
    for (v, host) in values {
        let Some(ctx) = v.context() else { continue };
        let shape = v.shape().to_vec();
        let t = match host {
            HostData::F16(d) => ctx.tensor(&d, shape),
            HostData::BF16(d) => ctx.tensor(&d, shape),
            HostData::F32(d) => ctx.tensor(&d, shape),
            HostData::F64(d) => ctx.tensor(&d, shape),
            HostData::U8(d) => ctx.tensor(&d, shape),
            HostData::I32(d) => ctx.tensor(&d, shape),
            HostData::I64(d) => ctx.tensor(&d, shape),
            HostData::Bool(d) => ctx.tensor(&d, shape),
        };
        v.assign(t)?;
    }
    Ok(())
}

/// The variable's value as little-endian bytes (already realized).
fn bytes_of(v: &Variable) -> Result<Vec<u8>> {
    fn le<T, const N: usize>(v: Vec<T>, f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
        v.into_iter().flat_map(f).collect()
    }
    Ok(match v.dtype() {
        DType::F16 => le(v.to_vec::<f16>()?, f16::to_le_bytes),
        DType::BF16 => le(v.to_vec::<bf16>()?, bf16::to_le_bytes),
        DType::F32 => le(v.to_vec::<f32>()?, f32::to_le_bytes),
        DType::F64 => le(v.to_vec::<f64>()?, f64::to_le_bytes),
        DType::U8 => v.to_vec::<u8>()?,
        DType::I32 => le(v.to_vec::<i32>()?, i32::to_le_bytes),
        DType::I64 => le(v.to_vec::<i64>()?, i64::to_le_bytes),
        DType::Bool => v.to_vec::<bool>()?.into_iter().map(u8::from).collect(),
    })
}
