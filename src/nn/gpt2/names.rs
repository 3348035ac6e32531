//! The one place Hugging Face's GPT-2 tensor names appear: their mapping
//! onto the scoped names [`super::Gpt2`] gives its parameters.

/// The kiln variable name (under a model built in scope `scope`) of a
/// Hugging Face GPT-2 checkpoint tensor, or `None` for tensors the model
/// does not hold: `lm_head.weight` (the head is tied to the token
/// embedding, which is loaded from `wte`), and the `attn.bias` /
/// `attn.masked_bias` causal-mask buffers of old checkpoints. Names with
/// and without the `transformer.` prefix (`GPT2LMHeadModel` and
/// `GPT2Model` checkpoints) are accepted.
///
/// ```
/// use kiln::nn::gpt2::hf_name;
/// assert_eq!(
///     hf_name("gpt2", "transformer.h.3.attn.c_attn.weight").as_deref(),
///     Some("gpt2/layer3/attention/qkv/weight")
/// );
/// assert_eq!(hf_name("gpt2", "wte.weight").as_deref(), Some("gpt2/embeddings/token/weight"));
/// assert_eq!(hf_name("gpt2", "lm_head.weight"), None);
/// assert_eq!(hf_name("gpt2", "transformer.h.0.attn.bias"), None);
/// ```
pub fn hf_name(scope: &str, name: &str) -> Option<String> {
    let name = name.strip_prefix("transformer.").unwrap_or(name);
    let (path, leaf) = name.rsplit_once('.')?;
    if leaf != "weight" && leaf != "bias" {
        return None;
    }
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
            format!("layer{layer}/{part}")
        }
    };
    Some(format!("{scope}/{module}/{leaf}"))
}
