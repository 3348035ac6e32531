//! GPT-2 generation with the KV cache (`Gpt2::generator`) against the
//! path without one (`Gpt2::generate_uncached`) and against the greedy
//! tokens `transformers` computed (`gpt2_reference.rs`): a batch of
//! prompts of different lengths, prompts of random lengths through one
//! generator (few compiles: one prefill plan per bucket and one decode
//! step), seeded sampling, and the errors that name the lengths.

use crate::gpt2::{devices, fixture, reference};
use kiln::nn::gpt2::{GenerateOptions, Gpt2};
use kiln::nn::sampling::Sampling;
use kiln::prelude::*;

fn model(ctx: &Context) -> Gpt2 {
    Gpt2::from_pretrained(ctx, fixture(), DType::F32).unwrap_or_else(|e| panic!("loading the fixture: {e}"))
}

/// The reference batch without its padding.
fn batch() -> Vec<Vec<u32>> {
    reference::BATCH_IDS
        .iter()
        .zip(&reference::BATCH_MASK)
        .map(|(ids, mask)| ids.iter().zip(mask).filter(|(_, &m)| m == 1).map(|(&t, _)| t).collect())
        .collect()
}

/// One generator, reused: the left-padded batch of three (and a batch of
/// two in a generator of four rows) continues as transformers' greedy
/// tokens, and as the uncached path, call after call.
#[test]
fn the_cached_generator_matches_transformers_and_the_uncached_path() -> Result<()> {
    for (device, make) in devices() {
        let ctx = make();
        let m = model(&ctx);
        // The emulator runs each CUDA thread as a host thread (seconds a
        // step): the CUDA side of the cache is checked there by
        // tests/nn/kv_cache.rs and the op suite; here on a GPU.
        if device == "cuda-emulated" {
            continue;
        }
        let (n, rounds) = (24, 2);
        let mut generator = m.generator(4, 64)?;
        let rows = batch();
        for round in 0..rounds {
            let got = generator.generate(&rows, &GenerateOptions::greedy(n))?;
            for (r, row) in got.iter().enumerate() {
                assert_eq!(row, &reference::BATCH_GREEDY[r][..n], "{device}: round {round}, batch row {r}");
            }
            let two =
                generator.generate(&[reference::IDS[0], reference::IDS[1]], &GenerateOptions::greedy(n))?;
            assert_eq!(two[0], reference::GREEDY[0][..n], "{device}: round {round}, prompt 0");
            assert_eq!(two[1], reference::GREEDY[1][..n], "{device}: round {round}, prompt 1");
        }
        let uncached = m.generate_uncached(&rows, &GenerateOptions::greedy(n))?;
        assert_eq!(uncached, generator.generate(&rows, &GenerateOptions::greedy(n))?, "{device}");
    }
    Ok(())
}

/// Prompts of random lengths through one generator compile one prefill
/// plan per bucket (8, 16, 32, 64 and the rest of the cache) and one
/// decode step, whatever the lengths.
#[test]
fn random_lengths_compile_one_plan_per_bucket() -> Result<()> {
    let ctx = Context::cpu();
    let m = model(&ctx);
    let mut generator = m.generator(2, 128)?;
    let mut s = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let before = ctx.stats().compiles;
    for _ in 0..40 {
        let len = 1 + next() as usize % 100;
        let prompt: Vec<u32> = (0..len).map(|_| (next() % reference::VOCAB as u64) as u32).collect();
        let got = generator.generate(&[&prompt], &GenerateOptions::greedy(3))?;
        assert_eq!(got[0].len(), 3);
    }
    let compiles = ctx.stats().compiles - before;
    // Buckets 8, 16, 32, 64 and 125 (128 less the 3 new tokens), and the decode step.
    assert!(compiles <= 6, "{compiles} plans compiled for 40 prompts");
    Ok(())
}

/// Sampling through the cache: the same seed draws the same tokens, and
/// top-k 1 is greedy whatever the temperature.
#[test]
fn cached_sampling_is_reproducible_and_top_k_one_is_greedy() -> Result<()> {
    let options = GenerateOptions::sampled(12, Sampling::temperature(1.0).with_top_k(40).with_top_p(0.9));
    let draw = |seed: u64| -> Result<Vec<u32>> {
        let ctx = Context::cpu().with_seed(seed);
        let m = model(&ctx);
        let mut generator = m.generator(1, 32)?;
        Ok(generator.generate(&[reference::IDS[0]], &options)?.remove(0))
    };
    let (a, b, c) = (draw(3)?, draw(3)?, draw(4)?);
    assert_eq!(a, b, "seed 3 twice");
    assert_ne!(a, c, "seeds 3 and 4");
    let ctx = Context::cpu().with_seed(3);
    let m = model(&ctx);
    let mut generator = m.generator(1, 32)?;
    let one = GenerateOptions::sampled(12, Sampling::temperature(4.0).with_top_k(1));
    assert_eq!(generator.generate(&[reference::IDS[0]], &one)?[0], reference::GREEDY[0][..12]);
    // The greedy step of the same generator is a step of its own.
    assert_eq!(
        generator.generate(&[reference::IDS[0]], &GenerateOptions::greedy(12))?[0],
        reference::GREEDY[0][..12]
    );
    Ok(())
}

#[test]
fn generator_errors_name_the_lengths() -> Result<()> {
    let ctx = Context::cpu();
    let m = model(&ctx);
    let mut generator = m.generator(2, 16)?;
    let long: Vec<u32> = vec![5; 14];
    let e = generator.generate(&[&long], &GenerateOptions::greedy(4)).unwrap_err().to_string();
    assert!(
        e.contains("14 tokens") && e.contains("4 new") && e.contains("18 positions") && e.contains("16"),
        "{e}"
    );
    let e = generator
        .generate(&[&long[..3], &long[..3], &long[..3]], &GenerateOptions::greedy(1))
        .unwrap_err()
        .to_string();
    assert!(e.contains("3 prompts") && e.contains("2 rows"), "{e}");
    let empty: &[u32] = &[];
    let e = generator.generate(&[empty], &GenerateOptions::greedy(1)).unwrap_err().to_string();
    assert!(e.contains("empty") && e.contains("0 tokens"), "{e}");
    let e = m.generator(1, 129).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("129") && e.contains("128"), "{e}");
    let e = m.generator(0, 16).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("batch"), "{e}");
    Ok(())
}
