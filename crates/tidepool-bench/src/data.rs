//! Reproducible data by index, so every system can make the same data in any order without
//! storing it first.

/// Where rank `rank` (0 is the hottest) of a skewed draw lands among `n` keys: a bijection on
/// `0..n` for every `n`, so hot keys are spread over the whole set and every key is someone's
/// rank. (`rank * odd % n` in wrapping 64-bit arithmetic, used before, is a bijection only
/// when `n` is a power of two: for 49,152 keys it reached 20,683 of them, so a "192 MiB"
/// working set was 81 MiB.) The multiplier is the prime 2^61 - 1, coprime with any smaller n.
pub fn scatter(rank: u64, n: u64) -> u64 {
    const P: u128 = (1 << 61) - 1;
    (rank as u128 * P % n.max(1) as u128) as u64
}

/// The SplitMix64 mix of `x`: the suites' reproducible random numbers, by index.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::scatter;

    #[test]
    fn scatter_reaches_every_key() {
        for n in [1u64, 7, 4096, 49_152, 147_456] {
            let mut seen = vec![false; n as usize];
            for r in 0..n {
                let k = scatter(r, n);
                assert!(k < n);
                assert!(!seen[k as usize], "n {n}: rank {r} lands on a key taken");
                seen[k as usize] = true;
            }
        }
    }
}
