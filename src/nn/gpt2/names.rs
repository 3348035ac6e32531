//! The one place Hugging Face's GPT-2 tensor names appear: their mapping
//! onto the scoped names [`super::Gpt2`] gives its parameters.

use crate::nn::Target;

/// The kiln variable (under a model built in scope `scope`) of a Hugging
/// Face GPT-2 checkpoint tensor, for [`crate::nn::load_mapped`]: its name,
/// and whether it loads transposed (the Conv1D weights, stored `[in,
/// out]` by Hugging Face and `[out, in]` by kiln). `None` for tensors the model
/// does not hold: `lm_head.weight` (the head is tied to the token
/// embedding, which is loaded from `wte`), and the `attn.bias` /
/// `attn.masked_bias` causal-mask buffers of old checkpoints. Names with
/// and without the `transformer.` prefix (`GPT2LMHeadModel` and
/// `GPT2Model` checkpoints) are accepted.
///
/// ```
/// use kiln::nn::{gpt2::hf_name, Target};
/// assert_eq!(
///     hf_name("gpt2", "transformer.h.3.attn.c_attn.weight"),
///     Some(Target::transposed("gpt2/layer3/attention/qkv/weight"))
/// );
/// assert_eq!(
///     hf_name("gpt2", "transformer.h.3.attn.c_attn.bias"),
///     Some(Target::from("gpt2/layer3/attention/qkv/bias".to_string()))
/// );
/// assert_eq!(hf_name("gpt2", "wte.weight").unwrap().name, "gpt2/embeddings/token/weight");
/// assert_eq!(hf_name("gpt2", "lm_head.weight"), None);
/// assert_eq!(hf_name("gpt2", "transformer.h.0.attn.bias"), None);
/// ```
pub fn hf_name(scope: &str, name: &str) -> Option<Target> {
    let name = name.strip_prefix("transformer.").unwrap_or(name);
    let (path, leaf) = name.rsplit_once('.')?;
    if leaf != "weight" && leaf != "bias" {
        return None;
    }
    let mut conv1d = false;
    let module = match (path, leaf) {
        ("wte", "weight") => "embeddings/token".to_string(),
        ("wpe", "weight") => "embeddings/position".to_string(),
        ("ln_f", _) => "norm".to_string(),
        _ => {
            let rest = path.strip_prefix("h.")?;
            let (layer, sub) = rest.split_once('.')?;
            let layer: usize = layer.parse().ok()?;
            let part = match sub {
                "ln_1" => "attention/norm",
                "attn.c_attn" => "attention/qkv",
                "attn.c_proj" => "attention/output",
                "ln_2" => "ffn/norm",
                "mlp.c_fc" => "ffn/up",
                "mlp.c_proj" => "ffn/down",
                _ => return None,
            };
            conv1d = !part.ends_with("norm");
            format!("layer{layer}/{part}")
        }
    };
    let name = format!("{scope}/{module}/{leaf}");
    Some(if conv1d && leaf == "weight" { Target::transposed(name) } else { Target::from(name) })
}
