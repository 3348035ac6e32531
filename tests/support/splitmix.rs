//! SplitMix64: the suites' seeded generator, so data and random programs
//! depend on the seed alone, never on the platform or a crate's version.
//! A suite includes this file (`#[path = ".../support/splitmix.rs"] mod
//! splitmix;`) and adds the draws only it needs in an `impl Rng` of its
//! own.

#![allow(dead_code)] // each suite uses some of the draws

pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1), from the top 53 bits.
    pub fn uniform(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box-Muller over two uniforms; the first mapped to
    /// (0, 1] so its logarithm is finite).
    pub fn normal(&mut self) -> f64 {
        let u = 1.0 - self.uniform();
        let v = self.uniform();
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}
