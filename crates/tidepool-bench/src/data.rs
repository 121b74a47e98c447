//! Reproducible data by index, so every system can make the same data in any order without
//! storing it first.

/// The SplitMix64 mix of `x`: the suites' reproducible random numbers, by index.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
