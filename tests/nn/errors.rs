//! Every misuse of a module, loss, optimizer, average or data utility is a
//! `kiln::Error` (never a panic) whose whole message, location included,
//! is a golden snapshot in `snapshots/nn__*.snap`.

use crate::snapshots;
use kiln::data::{read_csv, stack, Dataset, IteratorExt, Rng};
use kiln::nn::{self, Conv2d, Conv2dOptions, Dropout, Ema, Embedding, Flatten, LayerNorm, Linear, Module};
use kiln::optim::{Accumulate, Adam, AdamConfig, AdamW, Optimizer, Sgd, SgdConfig};
use kiln::prelude::*;

#[track_caller]
fn snap<T: std::fmt::Debug>(name: &str, r: Result<T>) {
    let msg = match r {
        Err(e) => e.to_string(),
        Ok(v) => panic!("{name}: expected an error, got {v:?}"),
    };
    snapshots().bind(|| insta::assert_snapshot!(format!("nn__{name}"), msg));
}

#[test]
fn module_arguments() {
    let ctx = Context::cpu();
    snap("linear_zero_features", Linear::new(&ctx, "fc", 0, 3).map(|_| ()));
    snap("conv2d_zero_kernel", Conv2d::new(&ctx, "c", 3, 4, 0).map(|_| ()));
    let bad_stride = Conv2dOptions { stride: 0, ..Default::default() };
    snap("conv2d_zero_stride", Conv2d::with_options(&ctx, "c", 3, 4, 3, bad_stride).map(|_| ()));
    let groups = Conv2dOptions { groups: 2, ..Default::default() };
    snap("conv2d_groups", Conv2d::with_options(&ctx, "c", 3, 4, 3, groups).map(|_| ()));
    snap("layer_norm_zero_dim", LayerNorm::new(&ctx, "ln", 0).map(|_| ()));
    snap("embedding_zero_rows", Embedding::new(&ctx, "emb", 0, 4).map(|_| ()));
    snap("dropout_probability", Dropout::new(1.5).map(|_| ()));
    assert!(ctx.variables().is_empty(), "a refused module makes no variables");
}

#[test]
fn module_inputs() {
    let ctx = Context::cpu();
    let fc = Linear::new(&ctx, "fc", 4, 2).unwrap();
    snap("linear_input_width", fc.forward(&ctx.zeros([3, 5])));
    let conv = Conv2d::new(&ctx, "conv", 3, 4, 3).unwrap();
    snap("conv2d_input_channels", conv.forward(&ctx.zeros([1, 2, 8, 8])));
    snap("conv2d_input_rank", conv.forward(&ctx.zeros([3, 8, 8])));
    let emb = Embedding::new(&ctx, "emb", 5, 2).unwrap();
    snap("embedding_float_ids", emb.forward(&ctx.zeros([3])));
    snap("flatten_scalar", Flatten.forward(&ctx.scalar(1.0f32)));
    snap("dropout_integers", Dropout::new(0.5).unwrap().forward(&ctx.tensor(&[1i64, 2], [2])));
}

#[test]
fn loss_arguments() {
    let ctx = Context::cpu();
    let logits = ctx.zeros([2, 3]);
    snap("mse_shapes", nn::mse(&ctx.zeros([2, 3]), &ctx.zeros([3, 2])));
    snap("cross_entropy_shapes", nn::cross_entropy(&logits, &ctx.tensor(&[0i64, 1, 2], [3])));
    snap("cross_entropy_float_targets", nn::cross_entropy(&logits, &ctx.zeros([2])));
    snap("cross_entropy_smoothing", nn::cross_entropy_smoothed(&logits, &ctx.tensor(&[0i64, 1], [2]), -0.1));
    snap("bce_shapes", nn::binary_cross_entropy_with_logits(&logits, &ctx.zeros([3])));
    // A class index past the end is found when the loss runs.
    let loss = nn::cross_entropy(&logits, &ctx.tensor(&[0i64, 3], [2])).unwrap();
    snap("cross_entropy_target_out_of_range", loss.item::<f32>());
}

#[test]
fn optimizer_arguments() {
    let ctx = Context::cpu();
    let w = ctx.variable("w", ctx.zeros([2])).unwrap();
    let ids = ctx.variable("ids", ctx.tensor(&[1i64, 2], [2])).unwrap();
    snap("sgd_negative_lr", Sgd::new(&w, SgdConfig { lr: -1.0, ..Default::default() }).map(|_| ()));
    snap(
        "sgd_nesterov_without_momentum",
        Sgd::new(&w, SgdConfig { nesterov: true, ..Default::default() }).map(|_| ()),
    );
    snap("sgd_momentum", Sgd::new(&w, SgdConfig { momentum: f64::NAN, ..Default::default() }).map(|_| ()));
    snap(
        "sgd_weight_decay",
        Sgd::new(&w, SgdConfig { weight_decay: -0.1, ..Default::default() }).map(|_| ()),
    );
    snap("adam_betas", Adam::new(&w, AdamConfig { betas: (0.9, 1.0), ..AdamConfig::adam() }).map(|_| ()));
    snap("adam_eps", Adam::new(&w, AdamConfig { eps: -1e-8, ..AdamConfig::adam() }).map(|_| ()));
    snap(
        "adamw_weight_decay",
        AdamW::new(&w, AdamConfig { weight_decay: f64::INFINITY, ..AdamConfig::adamw() }).map(|_| ()),
    );
    snap("optimizer_no_parameters", AdamW::new(&Vec::<Variable>::new(), AdamConfig::adamw()).map(|_| ()));
    snap("optimizer_integer_parameter", Sgd::new(&vec![w.clone(), ids], SgdConfig::default()).map(|_| ()));
    let mut opt = Sgd::new(&w, SgdConfig::default()).unwrap();
    snap("set_lr_nan", opt.set_lr(f64::NAN));
    assert_eq!(opt.lr(), SgdConfig::default().lr, "a refused rate changes nothing");
    snap("accumulate_zero", Accumulate::new(0).map(|_| ()));
}

#[test]
fn averages_and_gradients() {
    let ctx = Context::cpu();
    let a = ctx.variable("a", ctx.zeros([2])).unwrap();
    let b = ctx.variable("b", ctx.zeros([2])).unwrap();
    let ema = Ema::new(&a).unwrap();
    snap("ema_decay", ema.update(&a, 1.5));
    snap("ema_other_model", ema.update(&b, 0.9));
    snap("ema_copy_to_other_model", ema.copy_to(&vec![a.clone(), b.clone()]));
    // Gradients of `enc/w` then of `dec/w`: enc's workspace is older, so
    // releasing it alone would break the newest-first order.
    let enc = ctx.scope("enc", |ctx| ctx.variable("w", ctx.ones([2]))).unwrap();
    let dec = ctx.scope("dec", |ctx| ctx.variable("w", ctx.ones([2]))).unwrap();
    (&*enc * 2.0).sum_all().backward().unwrap();
    (&*dec * 3.0).sum_all().backward().unwrap();
    snap("zero_grad_not_newest", nn::zero_grad(&enc));
    assert_eq!(ctx.grad_workspaces(), ["grad/enc", "grad/dec"], "nothing was released");
    nn::zero_grad(&dec).unwrap();
    nn::zero_grad(&enc).unwrap();
    assert!(ctx.grad_workspaces().is_empty());
}

fn tmp(name: &str, contents: &str) -> (std::path::PathBuf, String) {
    let p = crate::scratch_dir().join(format!("errors-{name}-{}.csv", std::process::id()));
    std::fs::write(&p, contents).unwrap();
    let shown = p.display().to_string();
    (p, shown)
}

#[test]
fn data_arguments() {
    let ctx = Context::cpu();
    snap("dataset_sizes", Dataset::new(vec![0.0; 7], &[2, 2], vec![0, 1]).map(|_| ()));
    let d = Dataset::new(vec![0.0; 8], &[2, 2], vec![0, 1]).unwrap();
    snap("split_fraction", d.split(1.2, &mut Rng::new(0)).map(|_| ()));
    snap("stack_ragged_rows", stack(&ctx, vec![vec![1.0f32, 2.0], vec![3.0]]).map(|_| ()));
    let mut batches = vec![vec![1.0f32], vec![2.0, 3.0]].into_iter().batch(2).stack(&ctx);
    snap("stack_iter_ragged_rows", batches.next().unwrap().map(|_| ()));
    for (name, text) in [("csv_not_a_number", "1,2\n3,x\n"), ("csv_ragged", "1,2,3\n4,5\n")] {
        let (p, shown) = tmp(name, text);
        let msg = read_csv(&p).unwrap_err().to_string().replace(&shown, "[file]");
        snapshots().bind(|| insta::assert_snapshot!(format!("nn__{name}"), msg));
        let _ = std::fs::remove_file(p);
    }
    let (p, shown) = tmp("columns", "1,2,3\n4,5,6\n");
    let msg = Dataset::from_csv(&p, &[4]).unwrap_err().to_string().replace(&shown, "[file]");
    snapshots().bind(|| insta::assert_snapshot!("nn__dataset_csv_columns", msg));
    let _ = std::fs::remove_file(p);
    snap("csv_missing_file", read_csv("no/such/file.csv"));
}

/// Issue 33, defect 10: `Bert::forward` skipped its shape check for a
/// failed `ids` tensor, then indexed the failed tensor's empty shape and
/// panicked. A failed input (ids or mask) returns its own error.
#[test]
fn bert_forward_returns_the_error_of_a_failed_input() {
    use kiln::nn::bert::{Bert, BertConfig};
    let ctx = Context::cpu();
    let config = BertConfig {
        vocab_size: 12,
        hidden_size: 8,
        num_hidden_layers: 1,
        num_attention_heads: 2,
        intermediate_size: 16,
        max_position_embeddings: 6,
        type_vocab_size: 2,
        layer_norm_eps: 1e-12,
    };
    let model = Bert::new(&ctx, "bert", &config, DType::F32).unwrap();
    let ids = ctx.tensor(&[1i64, 2, 3], [2, 2]);
    let mask = ctx.ones_dtype([2, 2], DType::I64);
    snap("bert_failed_ids", model.forward(&ids, &mask));
    let good = ctx.tensor(&[1i64, 2, 3, 4], [2, 2]);
    let bad_mask = ctx.ones([2, 2]).matmul(&ctx.ones([3, 2]));
    snap("bert_failed_mask", model.forward(&good, &bad_mask));
}
