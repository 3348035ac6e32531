//! Convolution and pooling over NCHW tensors: `Conv2d`, `MaxPool2d`,
//! `AvgPool2d`.

use super::{check_arg, uniform, Module, Params};
use crate::{Context, Error, Location, Result, Tensor, Variable};

/// `Conv2d`'s settings besides its channels and kernel size, PyTorch's
/// defaults: stride 1, no padding, no dilation, one group, a bias.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dOptions {
    /// The step between windows, in both spatial dims.
    pub stride: usize,
    /// Zeros added on every side.
    pub padding: usize,
    /// The spacing of kernel taps.
    pub dilation: usize,
    /// Channel groups (`in` and `out` must both divide by it).
    pub groups: usize,
    /// Whether the layer adds a bias per output channel.
    pub bias: bool,
}

impl Default for Conv2dOptions {
    fn default() -> Conv2dOptions {
        Conv2dOptions { stride: 1, padding: 0, dilation: 1, groups: 1, bias: true }
    }
}

/// A 2-D convolution (PyTorch's `nn.Conv2d`): `weight` is
/// `[out, in / groups, k, k]`, `bias` `[out]`, both from
/// `U(-1/√fan_in, 1/√fan_in)` with `fan_in = in / groups · k · k`.
pub struct Conv2d {
    ctx: Context,
    name: String,
    /// `[out, in / groups, kernel, kernel]`.
    pub weight: Variable,
    /// `[out]`, if the layer has one.
    pub bias: Option<Variable>,
    /// Stride, padding, dilation, groups.
    pub options: Conv2dOptions,
}

impl Conv2d {
    /// A `kernel x kernel` convolution from `in_channels` to
    /// `out_channels` with the default options.
    #[track_caller]
    pub fn new(
        ctx: &Context,
        name: &str,
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
    ) -> Result<Conv2d> {
        Conv2d::build(
            ctx,
            name,
            [in_channels, out_channels, kernel],
            Conv2dOptions::default(),
            Location::caller(),
        )
    }

    /// A convolution with the given options.
    #[track_caller]
    pub fn with_options(
        ctx: &Context,
        name: &str,
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        options: Conv2dOptions,
    ) -> Result<Conv2d> {
        Conv2d::build(ctx, name, [in_channels, out_channels, kernel], options, Location::caller())
    }

    fn build(
        ctx: &Context,
        name: &str,
        sizes: [usize; 3],
        o: Conv2dOptions,
        location: Location,
    ) -> Result<Conv2d> {
        let [c_in, c_out, k] = sizes;
        check_arg(c_in > 0 && c_out > 0 && k > 0, "Conv2d::new", location, || {
            format!(
                "Conv2d \"{name}\" needs channels and a kernel size > 0, got {c_in} -> {c_out}, kernel {k}"
            )
        })?;
        check_arg(o.stride > 0 && o.dilation > 0, "Conv2d::new", location, || {
            format!("Conv2d \"{name}\" needs stride and dilation > 0, got {} and {}", o.stride, o.dilation)
        })?;
        check_arg(
            o.groups > 0 && c_in % o.groups == 0 && c_out % o.groups == 0,
            "Conv2d::new",
            location,
            || {
                format!("Conv2d \"{name}\": {} group(s) must divide both {c_in} input and {c_out} output channels", o.groups)
            },
        )?;
        let fan_in = c_in / o.groups * k * k;
        let bound = 1.0 / (fan_in as f64).sqrt();
        let (weight, bias) = ctx.scope(name, |ctx| {
            let weight = ctx.variable("weight", uniform(ctx, &[c_out, c_in / o.groups, k, k], bound))?;
            let bias = if o.bias { Some(ctx.variable("bias", uniform(ctx, &[c_out], bound))?) } else { None };
            Ok((weight, bias))
        })?;
        Ok(Conv2d { ctx: ctx.clone(), name: name.to_string(), weight, bias, options: o })
    }
}

impl Params for Conv2d {
    fn visit(&self, f: &mut dyn FnMut(&Variable)) {
        f(&self.weight);
        if let Some(b) = &self.bias {
            f(b);
        }
    }
}

impl Module for Conv2d {
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let location = Location::caller();
        let c_in = self.weight.shape()[1] * self.options.groups;
        if x.error().is_none() && (x.rank() != 4 || x.shape()[1] != c_in) {
            return Err(Error::Shape {
                op: "Conv2d",
                message: format!(
                    "Conv2d \"{}\" takes NCHW inputs with {c_in} channels, [n, {c_in}, h, w], but was given {:?}",
                    self.weight.name().trim_end_matches("/weight"),
                    x.shape()
                ),
                location,
            });
        }
        let o = self.options;
        self.ctx.scope(&self.name, |_| {
            let y = x.conv2d(&self.weight, o.stride, o.padding, o.dilation, o.groups);
            Ok(match &self.bias {
                Some(b) => y + b.reshape([1, b.numel(), 1, 1]),
                None => y,
            })
        })
    }
}

/// Max pooling over `kernel x kernel` windows (PyTorch's `nn.MaxPool2d`;
/// the stride defaults to the kernel size).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaxPool2d {
    /// Window size.
    pub kernel: usize,
    /// Step between windows.
    pub stride: usize,
    /// Padding on every side (never the maximum).
    pub padding: usize,
}

impl MaxPool2d {
    /// Windows of `kernel x kernel`, stride `kernel`, no padding.
    pub fn new(kernel: usize) -> MaxPool2d {
        MaxPool2d { kernel, stride: kernel, padding: 0 }
    }
}

/// Average pooling over `kernel x kernel` windows (PyTorch's
/// `nn.AvgPool2d`; padding counts as zeros; the stride defaults to the
/// kernel size).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AvgPool2d {
    /// Window size.
    pub kernel: usize,
    /// Step between windows.
    pub stride: usize,
    /// Zero padding on every side.
    pub padding: usize,
}

impl AvgPool2d {
    /// Windows of `kernel x kernel`, stride `kernel`, no padding.
    pub fn new(kernel: usize) -> AvgPool2d {
        AvgPool2d { kernel, stride: kernel, padding: 0 }
    }
}

impl Params for MaxPool2d {
    fn visit(&self, _: &mut dyn FnMut(&Variable)) {}
}

impl Module for MaxPool2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.max_pool2d(self.kernel, self.stride, self.padding))
    }
}

impl Params for AvgPool2d {
    fn visit(&self, _: &mut dyn FnMut(&Variable)) {}
}

impl Module for AvgPool2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.avg_pool2d(self.kernel, self.stride, self.padding))
    }
}
