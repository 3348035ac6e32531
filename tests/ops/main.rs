//! Numerical tests of every op on every dtype it accepts, against f64 (or
//! exact i64) references computed here from the same inputs. One binary, so
//! CI links once.

mod reference;

mod attention_grad;
mod attention_nonfinite;
mod attention_scratch;
mod attention_tf32;
mod attention_wgmma;
mod cache;
mod column_groups;
mod column_tiles;
mod creation;
mod decode;
mod elementwise;
mod errors;
mod every_half;
mod gemm_wgmma;
mod in_place;
mod index;
mod linalg;
mod long_rows;
mod many_rows;
mod merged_heads;
mod merged_products;
mod nonfinite;
mod padded_rows;
mod pool_grad;
mod reduce;
mod slots;
mod transformer;
mod views;
mod weight_prologue;
mod write;
