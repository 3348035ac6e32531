//! f32 attention on the CUDA backend's tensor cores at f32 accuracy
//! (`codegen/attention_tf32.rs`: each operand split into a tf32 part and
//! the tf32 of its rest, three products a product, "3xTF32"). One tf32
//! product alone is off by up to 2^-10 of its size, which these bounds
//! (f32's, `rtol` 1e-5) would not pass: the test fails if the split is
//! dropped. The CPU runs the same cases through its own kernel.

use crate::reference::*;
use crate::transformer::{attention_ref, mask_cases};
use kiln::prelude::*;

/// Head dims 16 (one chunk of the head, tiles of 64 keys), 48 over values
/// of 32 (queries and values of different widths), 64 (BERT's and
/// GPT-2's) and 128 (tiles of 32 keys, the largest); more than one block
/// of 64 query rows with a short last one, key tiles cut short, and, on
/// the second shape, more keys than queries in a causal attention.
/// Plain, causal with a key-padding mask (a query keeping no key gives
/// zeros), and an additive mask; then heads permuted out of a
/// `[b, s, h, d]` projection (strided, still 16 bytes a load).
#[test]
fn tf32_attention_matches_f64() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(2013);
        let shapes = [
            // (b, h, sq, sk, d, dv)
            (1, 2, 70, 75, 16, 16),
            (2, 1, 65, 140, 48, 32),
            (1, 2, 130, 100, 64, 64),
            (1, 2, 70, 75, 128, 128),
        ];
        for (b, h, sq, sk, d, dv) in shapes {
            let dtype = DType::F32;
            let q = rand_f(&mut rng, dtype, &[b, h, sq, d], 1.0);
            let k = rand_f(&mut rng, dtype, &[b, h, sk, d], 1.0);
            let v = rand_f(&mut rng, dtype, &[b, h, sk, dv], 1.0);
            let (tq, tk, tv) =
                (tensor_f(&ctx, dtype, &q), tensor_f(&ctx, dtype, &k), tensor_f(&ctx, dtype, &v));
            let scale = 1.0 / (d as f64).sqrt();
            let keep = Nd::from_fn(&[b, 1, 1, sk], |i| (i[3] % 5 != 2) as i64);
            let add = rand_f(&mut rng, dtype, &[b, h, sq, sk], 2.0);
            let cases = mask_cases(&ctx, dtype, [&q, &k, &v], &keep, &add, scale);
            for (name, mask, causal, want) in cases {
                let got = tq.scaled_dot_product_attention(&tk, &tv, mask.as_ref(), causal, None);
                check_f(&got, dtype, &want, 4.0, &format!("f32 attention {name}, heads of {d} and {dv}"));
            }
            // Heads of one [b, s, h, d] projection, permuted.
            let x = rand_f(&mut rng, dtype, &[b, sq, h, d], 1.0);
            let t = tensor_f(&ctx, dtype, &x).permute(&[0, 2, 1, 3]);
            let xp = x.permute(&[0, 2, 1, 3]);
            let got = t.scaled_dot_product_attention(&t, &t, None, true, Some(0.3));
            let want = attention_ref(&xp, &xp, &xp, None, None, true, 0.3);
            check_f(&got, dtype, &want, 4.0, &format!("f32 attention over permuted heads of {d}"));
        }
    });
}
