//! Data-parallel training with one process per rank: start it with
//!
//! ```text
//! cargo build --release --example ddp_procs --bin kiln-run
//! target/release/kiln-run -n 2 target/release/examples/ddp_procs          # CPU ranks
//! target/release/kiln-run -n 2 target/release/examples/ddp_procs --cuda   # a GPU per rank
//! ```
//!
//! or with `torchrun --nproc-per-node 2 --no-python target/release/examples/ddp_procs`,
//! or by hand (`RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500
//! target/release/examples/ddp_procs`, and `RANK=1 ...` in another shell or
//! on another host with rank 0's address). Every process builds the same
//! model and reads the same batches; each trains on its rank's half and
//! the gradients are averaged across the processes.

use kiln::dist::{DataParallel, Group, ProcessEnv};
use kiln::nn::{self, Linear, Module, ReLU, Sequential};
use kiln::optim::{AdamConfig, AdamW};
use kiln::prelude::*;

fn main() {
    if let Err(e) = run() {
        eprintln!("ddp_procs: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let env = ProcessEnv::from_env()?;
    let cuda = std::env::args().any(|a| a == "--cuda");
    // Seeded apart on purpose: the first broadcast makes the replicas equal.
    let ctx = if cuda { Context::cuda(env.local_rank)? } else { Context::cpu() }.with_seed(env.rank as u64);
    let group = Group::join(&ctx, &env)?;
    let mut dp = DataParallel::with_group(
        &group,
        |ctx| {
            let model = Sequential::new(ctx, "mlp", |ctx| {
                Ok(vec![
                    Linear::new(ctx, "0", 16, 64)?.boxed(),
                    ReLU.boxed(),
                    Linear::new(ctx, "2", 64, 4)?.boxed(),
                ])
            })?;
            let opt = AdamW::new(&model, AdamConfig { lr: 1e-2, ..AdamConfig::adamw() })?;
            Ok((model, opt))
        },
        |model, batch| nn::cross_entropy(&model.forward(&batch[0])?, &batch[1]),
    )?;
    // The same batches in every process (seeded alike): a class is the
    // sign pattern of two features.
    let data = Context::cpu().with_seed(7);
    let x = data.randn([256, 16]);
    let bits = x.narrow(1, 0, 2).gt(0.0f32).cast(DType::I64);
    let y = bits.narrow(1, 0, 1).reshape([256]) * 2i64 + bits.narrow(1, 1, 1).reshape([256]);
    for step in 0..=100 {
        let losses = dp.step(&[&x, &y])?;
        if env.rank == 0 && step % 20 == 0 {
            println!("step {step:3}: rank 0's loss {:.4} ({} ranks)", losses[0].item::<f32>()?, group.size());
        }
    }
    Ok(())
}
