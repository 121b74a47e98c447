//! What the soft suite's parts share: an arena of a given budget and a Zipfian request stream.

use anyhow::{Context, Result};
use rand::SeedableRng;
use tidepool_soft::{ArenaConfig, SoftRuntime};

/// An arena of `budget` bytes, able to grow to four times that (at least 1 GiB), with its
/// runtime (which stops its threads when dropped: keep it while the arena is used).
pub(super) fn arena(budget: usize) -> Result<SoftRuntime> {
    SoftRuntime::from_env(
        ArenaConfig::default()
            .budget(budget)
            .max_bytes((4 * budget).max(1 << 30)),
    )
    .context("cannot create a soft-memory arena")
}

/// A Zipf(0.99) sampler over `n` objects, hot ones scattered.
pub(super) struct Requests {
    zipf: rand_distr::Zipf<f64>,
    rng: rand::rngs::SmallRng,
    n: u64,
}

impl Requests {
    pub(super) fn new(n: u64, seed: u64) -> Requests {
        Requests {
            zipf: rand_distr::Zipf::new(n, 0.99).expect("valid Zipf"),
            rng: rand::rngs::SmallRng::seed_from_u64(seed),
            n,
        }
    }

    pub(super) fn next(&mut self) -> u64 {
        use rand_distr::Distribution;
        let rank = self.zipf.sample(&mut self.rng) as u64 - 1;
        crate::data::scatter(rank, self.n)
    }
}
