//! TEMPORARY (untracked) stand-in until the text branch merges.
/// tmp
pub fn print(g: &super::Graph) -> String {
    format!("{:?}", g.compacted())
}
