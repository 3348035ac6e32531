//! GPT-2 and text generation (issue 34) against `transformers` itself: a
//! random-weight `GPT2LMHeadModel` and its byte-level BPE tokenizer that
//! `tests/nn/gpt2_fixture.py` wrote into `tests/fixtures/gpt2-tiny`, and
//! the logits, ids and greedy continuations it computed
//! (`gpt2_reference.rs`). On the CPU, the CUDA emulator (feature
//! `cuda-emulator`) and a GPU when there is one (required under
//! `KILN_REQUIRE_CUDA=1`). Sampling is checked on its own terms: seeded,
//! top-k and top-p filters on hand-made logits, frequencies.

#[path = "gpt2_reference.rs"]
#[rustfmt::skip]
#[allow(clippy::excessive_precision, clippy::unreadable_literal)]
// The texts are read only by the tokenizer test.
#[cfg_attr(not(feature = "tokenizers"), allow(dead_code))]
pub mod reference;

use crate::{scratch_dir, snapshots};
use kiln::nn::gpt2::{hf_name, Activation, GenerateOptions, Gpt2, Gpt2Config};
use kiln::nn::sampling::{sample, top_k_filter, top_p_filter, Sampling};
use kiln::nn::{load_mapped, Params};
use kiln::prelude::*;
use std::path::{Path, PathBuf};

/// The fixture folder: in the checkout the binary was built in, or else
/// under the current folder (a binary carried to the GPU machine runs
/// from the project root there).
pub fn fixture() -> PathBuf {
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpt2-tiny");
    if built.is_dir() {
        built
    } else {
        PathBuf::from("tests/fixtures/gpt2-tiny")
    }
}

/// A device to check: its name and how to make a context on it.
pub type Device = (&'static str, fn() -> Context);

/// The devices to check.
pub fn devices() -> Vec<Device> {
    let mut out: Vec<Device> = vec![("cpu", Context::cpu)];
    #[cfg(feature = "cuda-emulator")]
    out.push(("cuda-emulated", Context::cuda_emulated));
    match Context::cuda(0) {
        Ok(_) => out.push(("cuda", || Context::cuda(0).unwrap_or_else(|e| panic!("CUDA went away: {e}")))),
        Err(e) if std::env::var("KILN_REQUIRE_CUDA").is_ok_and(|v| v == "1") => {
            panic!("KILN_REQUIRE_CUDA=1 but CUDA is not usable: {e}")
        }
        Err(_) => {}
    }
    out
}

fn model(ctx: &Context) -> Gpt2 {
    Gpt2::from_pretrained(ctx, fixture(), DType::F32).unwrap_or_else(|e| panic!("loading the fixture: {e}"))
}

fn ids(tokens: &[u32]) -> Vec<i64> {
    tokens.iter().map(|&t| t as i64).collect()
}

/// The largest absolute difference and where.
fn worst(got: &[f32], want: &[f32]) -> (f32, usize) {
    assert_eq!(got.len(), want.len(), "lengths differ");
    got.iter().zip(want).map(|(g, w)| (g - w).abs()).enumerate().fold((0.0, 0), |a, (i, d)| {
        // NaN is worse than anything.
        if d > a.0 || d.is_nan() {
            (d, i)
        } else {
            a
        }
    })
}

#[track_caller]
fn snap<T: std::fmt::Debug>(name: &str, r: Result<T>) {
    let msg = match r {
        Err(e) => e.to_string(),
        Ok(v) => panic!("{name}: expected an error, got {v:?}"),
    };
    snapshots().bind(|| insta::assert_snapshot!(format!("nn__gpt2_{name}"), msg));
}

#[test]
fn gpt2_config_reads_the_fixture_and_refuses_what_it_does_not_implement() -> Result<()> {
    let c = Gpt2Config::from_file(fixture().join("config.json"))?;
    assert_eq!(
        (c.vocab_size, c.n_positions, c.n_embd, c.n_layer, c.n_head, c.n_inner),
        (reference::VOCAB, 128, 64, 2, 4, 256)
    );
    assert_eq!((c.activation, c.layer_norm_epsilon, c.head_dim()), (Activation::GeluTanh, 1e-5, 16));
    let text = std::fs::read_to_string(fixture().join("config.json"))?;
    let untied = text.replace("\"tie_word_embeddings\": true", "\"tie_word_embeddings\": false");
    let err = Gpt2Config::from_json(&untied).unwrap_err().to_string();
    assert!(err.contains("tie_word_embeddings: false) is not supported"), "{err}");
    let act = text.replace("\"gelu_new\"", "\"mish\"");
    let err = Gpt2Config::from_json(&act).unwrap_err().to_string();
    assert!(err.contains("activation_function \"mish\" is not supported"), "{err}");
    Ok(())
}

#[test]
fn gpt2_hugging_face_names_map_onto_kiln_names() {
    let cases = [
        ("transformer.wte.weight", Some("m/embeddings/token/weight")),
        ("wpe.weight", Some("m/embeddings/position/weight")),
        ("transformer.h.1.ln_1.bias", Some("m/layer1/attention/norm/bias")),
        ("transformer.h.0.attn.c_attn.weight", Some("m/layer0/attention/qkv/weight")),
        ("h.11.attn.c_proj.bias", Some("m/layer11/attention/output/bias")),
        ("transformer.h.0.ln_2.weight", Some("m/layer0/ffn/norm/weight")),
        ("transformer.h.3.mlp.c_fc.weight", Some("m/layer3/ffn/up/weight")),
        ("transformer.h.3.mlp.c_proj.bias", Some("m/layer3/ffn/down/bias")),
        ("transformer.ln_f.weight", Some("m/norm/weight")),
        ("lm_head.weight", None),
        ("transformer.h.0.attn.bias", None),
        ("transformer.h.0.attn.masked_bias", None),
        ("transformer.wte.bias", None),
    ];
    for (hf, want) in cases {
        let got = hf_name("m", hf);
        assert_eq!(got.as_ref().map(|t| t.name.as_str()), want, "{hf}");
        // Conv1D weights ([in, out] in the checkpoint) load transposed.
        let conv1d = hf.contains(".attn.c_") || hf.contains(".mlp.c_");
        assert_eq!(got.is_some_and(|t| t.transposed), conv1d && hf.ends_with(".weight"), "{hf}");
    }
}

/// A mapping that says "transposed" loads a 2-D tensor's transpose, and a
/// tensor that does not fit once transposed is reported as mis-shaped.
#[test]
fn a_transposed_mapping_loads_the_transpose() -> Result<()> {
    let dir = scratch_dir().join(format!("kiln-transposed-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let other = Context::cpu();
    let stored: Vec<f32> = (0..6).map(|i| i as f32 + 0.5).collect();
    other.scope("fc", |c| {
        c.variable("weight", c.tensor(&stored, [3, 2]))?; // [in, out]
        c.variable("bias", c.tensor(&[1.0f32, -1.0], [2])).map(|_| ())
    })?;
    let path = dir.join("m.safetensors");
    other.save(&path)?;
    let ctx = Context::cpu();
    let layer = ctx.scope("net", |ctx| kiln::nn::Linear::new(ctx, "proj", 3, 2))?; // [out, in]
    let map = |n: &str| match n {
        "fc/weight" => Some(kiln::nn::Target::transposed("net/proj/weight")),
        _ => Some(n.replace("fc/", "net/proj/").into()),
    };
    load_mapped(&layer, &[&path], map)?;
    assert_eq!(layer.weight.to_vec::<f32>()?, vec![0.5, 2.5, 4.5, 1.5, 3.5, 5.5]);
    // [3, 2] transposed is [2, 3]: it does not fit a [3, 2] parameter.
    let wide = ctx.scope("wide", |ctx| kiln::nn::Linear::new(ctx, "proj", 2, 3))?;
    let map = |n: &str| match n {
        "fc/weight" => Some(kiln::nn::Target::transposed("wide/proj/weight")),
        _ => Some(n.replace("fc/", "wide/proj/").into()),
    };
    let e = load_mapped(&wide, &[&path], map).expect_err("a misfit");
    let msg = e.to_string();
    assert!(
        msg.contains("fc/weight is [3,2], loaded transposed, in the checkpoint, wide/proj/weight is [3,2]"),
        "{msg}"
    );
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}

/// Every logit of two prompts within 1e-4 of transformers', and the last
/// logits of a left-padded batch with an attention mask.
#[test]
fn gpt2_logits_match_transformers_in_f32() -> Result<()> {
    for (device, make) in devices() {
        let ctx = make();
        let m = model(&ctx);
        let want: [&[f32]; 2] = [&reference::LOGITS_0, &reference::LOGITS_1];
        for (n, &k) in reference::FORWARD.iter().enumerate() {
            let prompt = reference::IDS[k];
            let x = ctx.tensor(&ids(prompt), [1, prompt.len()]);
            let logits = m.forward(&x, None)?;
            assert_eq!(logits.shape(), &[1, prompt.len(), reference::VOCAB]);
            let (err, at) = worst(&logits.to_vec::<f32>()?, want[n]);
            assert!(err <= 1e-4, "{device}: prompt {k}, logit {at} is off by {err:e}");
        }
        let (b, s) = (reference::BATCH_IDS.len(), reference::BATCH_IDS[0].len());
        let flat: Vec<i64> = reference::BATCH_IDS.iter().flatten().map(|&t| t as i64).collect();
        let mask: Vec<i64> = reference::BATCH_MASK.iter().flatten().map(|&t| t as i64).collect();
        let logits = m.forward(&ctx.tensor(&flat, [b, s]), Some(&ctx.tensor(&mask, [b, s])))?;
        let last = logits.narrow(1, s - 1, 1).to_vec::<f32>()?;
        let (err, at) = worst(&last, &reference::BATCH_LAST_LOGITS);
        assert!(err <= 1e-4, "{device}: padded batch, last logit {at} is off by {err:e}");
    }
    Ok(())
}

/// A prefill reads the logits of its last position only: the `narrow`
/// pass runs the last layer's attention on that one query row (its
/// other layers, whose keys and values the later rows need, stay whole),
/// and the row's logits are the full forward pass's last row. Linear
/// layers fold the batch into the GEMM's rows (`matmul` of a stack by a
/// matrix), which the narrowing reads through.
#[test]
fn a_prefill_runs_its_last_layer_on_the_last_row() -> Result<()> {
    let ctx = Context::cpu();
    let m = model(&ctx);
    let prompt = reference::IDS[reference::FORWARD[0]];
    let s = prompt.len();
    let x = ctx.tensor(&ids(prompt), [1, s]);
    let logits = m.forward(&x, None)?;
    let last = logits.narrow(1, s - 1, 1);
    let plan = ctx.explain(&[&last])?;
    // Query rows of each attention node's output: `[batch, heads, rows,
    // dim]`, or `[batch, rows, heads, dim]` where it writes its heads
    // merged (`layout=bshd`, the attention-layout pass).
    let rows: Vec<usize> = plan
        .lines()
        .filter(|l| l.contains("= attention"))
        .filter_map(|l| {
            let dim = if l.contains("layout=bshd") { 1 } else { 2 };
            l.split('[').nth(1)?.split(']').next()?.split(',').nth(dim)?.parse().ok()
        })
        .collect();
    assert_eq!(rows.iter().filter(|&&r| r == 1).count(), 1, "one attention on one row:\n{plan}");
    assert!(rows.len() > 1 && rows.iter().filter(|&&r| r == s).count() == rows.len() - 1, "{rows:?}\n{plan}");
    // The same sums, maybe in another order (a GEMV for one row).
    let whole = logits.to_vec::<f32>()?;
    let (err, at) = worst(&last.to_vec::<f32>()?, &whole[(s - 1) * reference::VOCAB..]);
    assert!(err <= 1e-5, "logit {at} of the narrowed row is off by {err:e}");
    Ok(())
}

/// Greedy tokens identical to transformers' `generate` (64 steps, with
/// the KV cache) for two prompts alone and for a left-padded batch of
/// three; and, in one forward pass over each prompt and its 64-token
/// greedy continuation, every position's argmax is the next greedy token
/// (what 64 greedy steps compute, since the model is causal). On the
/// emulator, where every CUDA thread of every launch runs as a host
/// thread (seconds a step), only the teacher-forced pass.
#[test]
fn gpt2_greedy_generation_matches_transformers() -> Result<()> {
    for (device, make) in devices() {
        let ctx = make();
        let m = model(&ctx);
        let n = reference::NEW_TOKENS;
        let options = GenerateOptions::greedy(n);
        let emulated = device == "cuda-emulated";
        for (i, &k) in reference::FORWARD.iter().enumerate() {
            let (prompt, want) = (reference::IDS[k], &reference::GREEDY[i]);
            // On the emulator (seconds a step) the teacher-forced pass
            // below is the check; tests/nn/generate.rs covers the cache.
            if !emulated {
                let got = m.generate(&[prompt], &options)?;
                assert_eq!(got[0], want[..n], "{device}: prompt {k}");
            }
            let full: Vec<u32> = prompt.iter().chain(&want[..want.len() - 1]).copied().collect();
            let logits = m.forward(&ctx.tensor(&ids(&full), [1, full.len()]), None)?;
            let next = logits.narrow(1, prompt.len() - 1, want.len()).argmax(2, false).to_vec::<i64>()?;
            assert_eq!(next, ids(want), "{device}: prompt {k}, teacher-forced");
        }
        let batch: Vec<Vec<u32>> = reference::BATCH_IDS
            .iter()
            .zip(&reference::BATCH_MASK)
            .map(|(ids, mask)| ids.iter().zip(mask).filter(|(_, &m)| m == 1).map(|(&t, _)| t).collect())
            .collect();
        if emulated {
            // The padded batch's logits are checked on the emulator by
            // `gpt2_logits_match_transformers_in_f32`.
            continue;
        }
        let got = m.generate(&batch, &options)?;
        for (r, row) in got.iter().enumerate() {
            assert_eq!(row, &reference::BATCH_GREEDY[r][..n], "{device}: batch row {r}");
        }
    }
    Ok(())
}

/// The steps of a call share one compiled plan: a second call of another
/// length in the same window width compiles nothing.
#[test]
fn gpt2_generation_compiles_one_plan_per_window() -> Result<()> {
    let ctx = Context::cpu();
    let m = model(&ctx);
    m.generate(&[reference::IDS[0]], &GenerateOptions::greedy(10))?;
    let after_first = ctx.stats().compiles;
    // 5 + 10 and 5 + 11 both round up to a window of 16.
    m.generate(&[reference::IDS[0]], &GenerateOptions::greedy(11))?;
    assert_eq!(ctx.stats().compiles, after_first, "the second call compiled");
    Ok(())
}

#[cfg(feature = "tokenizers")]
#[test]
fn gpt2_tokenizer_gives_the_python_ids_and_round_trips() -> Result<()> {
    let t = kiln::nn::Tokenizer::untruncated(fixture().join("tokenizer.json"))?;
    assert_eq!(t.vocab_size(), reference::VOCAB);
    assert_eq!(t.token_id("<|endoftext|>"), Some(reference::END_OF_TEXT));
    for (text, want) in reference::PROMPTS.iter().zip(reference::IDS) {
        assert_eq!(t.ids(text)?, want, "{text:?}");
        assert_eq!(&t.decode(want)?, text);
    }
    assert_eq!(t.decode(&reference::GREEDY[0])?, reference::GREEDY_0_TEXT);
    for (text, (row, mask)) in
        reference::BATCH.iter().zip(reference::BATCH_IDS.iter().zip(&reference::BATCH_MASK))
    {
        let want: Vec<u32> = row.iter().zip(mask).filter(|(_, &m)| m == 1).map(|(&t, _)| t).collect();
        assert_eq!(t.ids(text)?, want, "{text:?}");
    }
    // Never cut: a text of more than 128 tokens keeps them all.
    let long = reference::PROMPTS[1].repeat(10);
    assert_eq!(t.ids(&long)?.len(), 10 * reference::IDS[1].len());
    Ok(())
}

/// The same seed draws the same tokens; another seed draws others: the
/// model's continuations on the CPU and the GPU, and `sample` alone on
/// every device (on the emulator, where a continuation costs seconds a
/// step, that is the check).
#[test]
fn gpt2_sampling_is_reproducible_from_the_seed() -> Result<()> {
    let prompt = reference::IDS[0];
    let filtered = Sampling::temperature(1.0).with_top_k(50).with_top_p(0.9);
    for (device, make) in devices() {
        let draw = |seed: u64| -> Result<Vec<i64>> {
            let ctx = make().with_seed(seed);
            let logits = ctx.randn([4, reference::VOCAB]) * 3.0;
            sample(&logits, &Sampling::temperature(1.0))?.to_vec::<i64>()
        };
        let (a, b, c) = (draw(5)?, draw(5)?, draw(6)?);
        assert_eq!(a, b, "{device}: sample, seed 5 twice");
        assert_ne!(a, c, "{device}: sample, seeds 5 and 6");
        if device == "cuda-emulated" {
            continue;
        }
        let options = GenerateOptions::sampled(16, filtered.clone());
        let draw = |seed: u64| -> Result<Vec<u32>> {
            let ctx = make().with_seed(seed);
            Ok(model(&ctx).generate(&[prompt], &options)?.remove(0))
        };
        let (a, b, c) = (draw(5)?, draw(5)?, draw(6)?);
        assert_eq!(a, b, "{device}: seed 5 twice");
        assert_ne!(a, c, "{device}: seeds 5 and 6");
        assert_ne!(a, reference::GREEDY[0][..16], "{device}: sampling is not greedy");
    }
    Ok(())
}

/// Top-k 1 keeps only the most likely token: the greedy continuation,
/// whatever the temperature.
#[test]
fn gpt2_top_k_one_is_greedy() -> Result<()> {
    let ctx = Context::cpu().with_seed(9);
    let m = model(&ctx);
    let options = GenerateOptions::sampled(24, Sampling::temperature(3.0).with_top_k(1));
    assert_eq!(m.generate(&[reference::IDS[0]], &options)?[0], reference::GREEDY[0][..24]);
    Ok(())
}

/// Stop tokens end a row's continuation (the stop token included) while
/// the other rows go on.
#[test]
fn gpt2_stop_tokens_end_a_row() -> Result<()> {
    let ctx = Context::cpu();
    let m = model(&ctx);
    let full = &reference::GREEDY[0];
    // The first token of the greedy continuation that is not its first.
    let stop = full[3];
    let first = full.iter().position(|&t| t == stop).unwrap_or(3);
    let options = GenerateOptions::greedy(20).with_stop_tokens(&[stop]);
    let got = m.generate(&[reference::IDS[0], reference::IDS[1]], &options)?;
    assert_eq!(got[0], full[..=first]);
    let other = &reference::GREEDY[1][..20];
    let cut = other.iter().position(|&t| t == stop).map_or(20, |i| i + 1);
    assert_eq!(got[1], other[..cut]);
    Ok(())
}

/// Logits with ties at the boundary: the kept set is exact.
#[test]
fn gpt2_top_k_keeps_the_k_most_likely() -> Result<()> {
    const NEG: f32 = f32::NEG_INFINITY;
    for (device, make) in devices() {
        let ctx = make();
        let row = [0.5f32, 3.0, -1.0, 2.0, 3.0, 2.0, 1.0, -7.0];
        let logits = ctx.tensor(&[row, row.map(|x| -x)].concat(), [2, 8]);
        let keep = |k: usize| top_k_filter(&logits, k)?.to_vec::<f32>();
        let kept = |row: [f32; 8], mask: [bool; 8]| -> Vec<f32> {
            row.iter().zip(mask).map(|(&x, m)| if m { x } else { NEG }).collect()
        };
        let neg = row.map(|x| -x);
        // k = 1: both tied maxima of row 0 stay; 7 alone in row 1.
        let mut want = kept(row, [false, true, false, false, true, false, false, false]);
        want.extend(kept(neg, [false, false, false, false, false, false, false, true]));
        assert_eq!(keep(1)?, want, "{device}: k = 1");
        // k = 3: the 3rd largest of row 0 is 2.0, tied: four stay.
        let mut want = kept(row, [false, true, false, true, true, true, false, false]);
        want.extend(kept(neg, [true, false, true, false, false, false, false, true]));
        assert_eq!(keep(3)?, want, "{device}: k = 3");
        assert_eq!(keep(8)?, logits.to_vec::<f32>()?, "{device}: k = vocab");
        assert_eq!(keep(100)?, logits.to_vec::<f32>()?, "{device}: k > vocab");
        // Close values far from the others still separate.
        let close = ctx.tensor(&[1000.0f32, 0.0, 1e-6, 2e-6, 3e-6, -1000.0], [1, 6]);
        let got = top_k_filter(&close, 3)?.to_vec::<f32>()?;
        assert_eq!(got, [1000.0, NEG, NEG, 2e-6, 3e-6, NEG], "{device}: close values");
    }
    // Sampled tokens come from the kept set only.
    let ctx = Context::cpu().with_seed(1);
    let row: Vec<f32> = (0..50).map(|i| ((i * 37) % 50) as f32 * 0.1).collect();
    let rows = 400;
    let logits = ctx.tensor(&row.repeat(rows), [rows, 50]);
    let got = sample(&logits, &Sampling::temperature(5.0).with_top_k(5))?.to_vec::<i64>()?;
    let mut order: Vec<usize> = (0..50).collect();
    order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
    let top: Vec<i64> = order[..5].iter().map(|&i| i as i64).collect();
    assert!(got.iter().all(|t| top.contains(t)), "a token outside the top 5: {got:?}");
    for t in &top {
        assert!(got.contains(t), "top-5 token {t} never drawn in {rows} draws at temperature 5");
    }
    Ok(())
}

/// The smallest most-likely-first set whose mass reaches p, ties kept
/// (every case on the CPU and the GPU; one call of two rows on the
/// emulator, where each filter costs seconds).
#[test]
fn gpt2_top_p_keeps_the_smallest_prefix_reaching_p() -> Result<()> {
    const NEG: f32 = f32::NEG_INFINITY;
    // Sorted: 0.4, 0.25, 0.2, 0.1, 0.05 (cumulative 0.4, 0.65, 0.85, 0.95, 1);
    // and 0.4 with two tied 0.3 (two impossible tokens).
    let probs = [0.05f32, 0.4, 0.1, 0.25, 0.2, 0.4, 0.3, 0.3, 0.0, 0.0];
    let rows: Vec<f32> = probs.iter().map(|p| p.ln()).collect();
    let cases: [(f64, [bool; 10]); 5] = [
        (0.5, [false, true, false, true, false, true, true, true, false, false]),
        (0.3, [false, true, false, false, false, true, false, false, false, false]),
        (0.7, [false, true, false, true, true, true, true, true, false, false]),
        (0.9, [false, true, true, true, true, true, true, true, false, false]),
        (0.99, [true, true, true, true, true, true, true, true, false, false]),
    ];
    for (device, make) in devices() {
        let ctx = make();
        let logits = ctx.tensor(&rows, [2, 5]);
        let some = if device == "cuda-emulated" { 1 } else { cases.len() };
        for (p, want) in &cases[..some] {
            let got: Vec<bool> =
                top_p_filter(&logits, *p)?.to_vec::<f32>()?.iter().map(|&x| x > NEG).collect();
            assert_eq!(got, want, "{device}: p = {p}");
        }
        assert_eq!(top_p_filter(&logits, 1.0)?.to_vec::<f32>()?, rows, "{device}: p = 1");
    }
    Ok(())
}

/// Draws follow softmax(logits / T): frequencies of 4000 draws within
/// 0.035 of the probabilities (over 4 standard deviations), after top-p.
#[test]
fn gpt2_sampled_frequencies_follow_the_probabilities() -> Result<()> {
    let ctx = Context::cpu().with_seed(11);
    let probs = [0.5f64, 0.3, 0.15, 0.05];
    let rows = 4000;
    // Temperature 2 over logits 2 ln p: softmax(ln p) = p.
    let row: Vec<f32> = probs.iter().map(|p| 2.0 * p.ln() as f32).collect();
    let logits = ctx.tensor(&row.repeat(rows), [rows, 4]);
    for (sampling, want) in [
        (Sampling::temperature(2.0), probs.to_vec()),
        // Top-p 0.7 keeps 0.5 and 0.3, renormalized.
        (Sampling::temperature(2.0).with_top_p(0.7), vec![0.625, 0.375, 0.0, 0.0]),
    ] {
        let got = sample(&logits, &sampling)?.to_vec::<i64>()?;
        for (i, w) in want.iter().enumerate() {
            let f = got.iter().filter(|&&t| t == i as i64).count() as f64 / rows as f64;
            assert!((f - w).abs() <= 0.035, "{sampling:?}: token {i} drawn {f}, want {w}");
        }
    }
    // Temperature 0 is argmax, the first of tied maxima; the filters do not matter.
    let tied = ctx.tensor(&[1.0f32, 3.0, 3.0, 0.0], [1, 4]);
    let greedy = Sampling::greedy().with_top_k(2).with_top_p(0.5);
    assert_eq!(sample(&tied, &greedy)?.to_vec::<i64>()?, [1]);
    Ok(())
}

#[test]
fn gpt2_bad_prompts_and_options_are_errors_naming_the_lengths() {
    let ctx = Context::cpu();
    let m = model(&ctx);
    let greedy = GenerateOptions::greedy(4);
    snap("empty_prompt", m.generate(&[reference::IDS[0], &[]], &greedy));
    let long = vec![1u32; 129];
    snap("prompt_too_long", m.generate(&[&long], &greedy));
    let fits = vec![1u32; 100];
    snap("prompt_plus_new_too_long", m.generate(&[&fits], &GenerateOptions::greedy(29)));
    snap("no_prompts", m.generate::<&[u32]>(&[], &greedy));
    snap("token_outside_vocab", m.generate(&[&[1u32, 500, 2]], &greedy));
    let hot = GenerateOptions::sampled(4, Sampling::temperature(-1.0));
    snap("negative_temperature", m.generate(&[reference::IDS[0]], &hot));
    let p = GenerateOptions::sampled(4, Sampling::temperature(1.0).with_top_p(0.0));
    snap("top_p_zero", m.generate(&[reference::IDS[0]], &p));
    let k = GenerateOptions::sampled(4, Sampling::temperature(1.0).with_top_k(0));
    snap("top_k_zero", m.generate(&[reference::IDS[0]], &k));
    let x = ctx.tensor(&vec![1i64; 129], [1, 129]);
    snap("forward_too_long", m.forward(&x, None));
    // 128 tokens plus nothing new fits, and generates nothing.
    let full = vec![1u32; 128];
    assert_eq!(m.generate(&[&full], &GenerateOptions::greedy(0)).unwrap(), [Vec::<u32>::new()]);
}

/// Writes the fixture's tensors (all but `drop`, plus `extra`) into a
/// model folder of its own.
fn rewritten_fixture(name: &str, drop: &str, extra: &[(&str, Vec<usize>)]) -> PathBuf {
    let dir = scratch_dir().join(format!("kiln-gpt2-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(fixture().join("config.json"), dir.join("config.json")).unwrap();
    let bytes = std::fs::read(fixture().join("model.safetensors")).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = file
        .tensors()
        .into_iter()
        .filter(|(n, _)| n != drop)
        .map(|(n, v)| (n, v.dtype(), v.shape().to_vec(), v.data().to_vec()))
        .collect();
    for (n, shape) in extra {
        let len = shape.iter().product::<usize>() * 4;
        tensors.push((n.to_string(), safetensors::Dtype::F32, shape.clone(), vec![0u8; len]));
    }
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.clone(), safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    dir
}

#[test]
fn gpt2_a_checkpoint_missing_a_tensor_names_it() {
    let dir = rewritten_fixture("missing", "transformer.h.1.mlp.c_proj.bias", &[]);
    let err = Gpt2::from_pretrained(&Context::cpu(), &dir, DType::F32).err().expect("a missing tensor");
    let msg = err.to_string();
    assert!(msg.contains("missing (1): gpt2/layer1/ffn/down/bias"), "{msg}");
    assert!(msg.contains("nothing was loaded"), "{msg}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `lm_head.weight` (the tied head, when a checkpoint stores it) and the
/// causal-mask buffers of old checkpoints are skipped.
#[test]
fn gpt2_a_checkpoint_with_a_head_and_mask_buffers_loads() -> Result<()> {
    let v = reference::VOCAB;
    let extra = [
        ("lm_head.weight", vec![v, 64]),
        ("transformer.h.0.attn.bias", vec![1, 1, 128, 128]),
        ("transformer.h.0.attn.masked_bias", vec![]),
    ];
    let dir = rewritten_fixture("extra", "", &extra);
    let ctx = Context::cpu();
    let m = Gpt2::new(&ctx, "gpt2", &Gpt2Config::from_file(dir.join("config.json"))?, DType::F32)?;
    let report = load_mapped(&m, &kiln::nn::checkpoint_files(&dir)?, |n| hf_name("gpt2", n))?;
    assert_eq!(report.loaded.len(), m.parameters().len());
    assert_eq!(
        report.skipped,
        ["lm_head.weight", "transformer.h.0.attn.bias", "transformer.h.0.attn.masked_bias"]
    );
    // Loaded, it computes the reference logits.
    let prompt = reference::IDS[0];
    let logits = m.forward(&ctx.tensor(&ids(prompt), [1, prompt.len()]), None)?.to_vec::<f32>()?;
    assert!(worst(&logits, &reference::LOGITS_0).0 <= 1e-4);
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}

/// A bf16 model from the f32 checkpoint stays close to the f32 logits
/// (logits span about ±5; measured on the CPU: 7.5e-2 at most).
#[test]
fn gpt2_in_bf16_stays_near_f32() -> Result<()> {
    let ctx = Context::cpu();
    let m = Gpt2::from_pretrained(&ctx, fixture(), DType::BF16)?;
    let prompt = reference::IDS[0];
    let logits = m.forward(&ctx.tensor(&ids(prompt), [1, prompt.len()]), None)?;
    assert_eq!(logits.dtype(), DType::BF16);
    let (err, at) = worst(&logits.cast(DType::F32).to_vec::<f32>()?, &reference::LOGITS_0);
    eprintln!("bf16: largest difference {err:e} (logit {at})");
    assert!(err <= 0.25, "bf16 logit {at} is off by {err}");
    Ok(())
}
