//! The one place Hugging Face's BERT tensor names appear: their mapping
//! onto the scoped names [`super::Bert`] gives its parameters.

/// The kiln variable name (under a model built in scope `scope`) of a
/// Hugging Face BERT checkpoint tensor, or `None` for tensors an encoder
/// does not use (the pooler head, the `position_ids` buffer, MLM heads).
/// A leading `bert.` (checkpoints of task models) is accepted, and so are
/// the old `gamma`/`beta` layer norm names.
///
/// ```
/// use kiln::nn::bert::hf_name;
/// assert_eq!(
///     hf_name("bert", "encoder.layer.3.attention.self.query.weight").as_deref(),
///     Some("bert/layer3/attention/query/weight")
/// );
/// assert_eq!(hf_name("bert", "pooler.dense.weight"), None);
/// ```
pub fn hf_name(scope: &str, name: &str) -> Option<String> {
    let name = name.strip_prefix("bert.").unwrap_or(name);
    let (path, leaf) = name.rsplit_once('.')?;
    let leaf = match leaf {
        "gamma" => "weight",
        "beta" => "bias",
        l @ ("weight" | "bias") => l,
        _ => return None,
    };
    let module = match path {
        "embeddings.word_embeddings" => "embeddings/word".to_string(),
        "embeddings.position_embeddings" => "embeddings/position".to_string(),
        "embeddings.token_type_embeddings" => "embeddings/token_type".to_string(),
        "embeddings.LayerNorm" => "embeddings/norm".to_string(),
        _ => {
            let rest = path.strip_prefix("encoder.layer.")?;
            let (layer, sub) = rest.split_once('.')?;
            let layer: usize = layer.parse().ok()?;
            let part = match sub {
                "attention.self.query" => "attention/query",
                "attention.self.key" => "attention/key",
                "attention.self.value" => "attention/value",
                "attention.output.dense" => "attention/output",
                "attention.output.LayerNorm" => "attention/norm",
                "intermediate.dense" => "ffn/up",
                "output.dense" => "ffn/down",
                "output.LayerNorm" => "ffn/norm",
                _ => return None,
            };
            format!("layer{layer}/{part}")
        }
    };
    Some(format!("{scope}/{module}/{leaf}"))
}
