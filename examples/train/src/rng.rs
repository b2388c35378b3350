//! Deterministic random numbers: SplitMix64 and the per-epoch sample order.
//!
//! The trainer does not use `rand`: its generators may change between versions, and a
//! training run here must be a pure function of `(seed, step)` forever, on every platform.
//! SplitMix64 (Steele, Lea, Flood 2014) is tiny, fully specified and good enough for
//! initialisation and shuffling.

/// The SplitMix64 generator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator whose whole future is fixed by `seed`.
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.state)
    }

    /// A uniform `f32` in `[0, 1)` (24 random bits).
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
    }

    /// A uniform integer in `0..n` (Lemire's multiply-shift; `n` must be positive).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

/// SplitMix64's output function: a bijective 64-bit mixer.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Derives an independent stream key from a seed and a purpose tag.
pub fn derive(seed: u64, tag: u64) -> u64 {
    mix(seed ^ mix(tag.wrapping_add(0x632B_E59B_D9B4_E019)))
}

/// A seeded Fisher-Yates permutation of `0..n`.
pub fn permutation(key: u64, n: usize) -> Vec<u32> {
    let mut order: Vec<u32> = (0..n as u32).collect();
    let mut rng = SplitMix64::new(key);
    for i in (1..n).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        order.swap(i, j);
    }
    order
}

/// Where the sample order stands: the order of epoch `e` is `permutation(derive(key, e), n)`,
/// and `position` counts the batches already taken from it.
///
/// This is the whole random state of a training run after initialisation, so it is what a
/// checkpoint stores.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SamplerState {
    /// The stream key (derived from the run's seed).
    pub key: u64,
    /// The current epoch.
    pub epoch: u64,
    /// Batches already taken in this epoch.
    pub position: u64,
}

/// Draws global batches: every epoch is a fresh seeded permutation of the training set, cut
/// into `n / batch` whole batches (the remainder of each epoch is dropped).
#[derive(Clone, Debug)]
pub struct Sampler {
    state: SamplerState,
    n: usize,
    batch: usize,
    order: Vec<u32>,
}

impl Sampler {
    /// The sampler at step 0 for `seed`, over `n` samples in batches of `batch`
    /// (`0 < batch <= n`).
    pub fn new(seed: u64, n: usize, batch: usize) -> Sampler {
        let state = SamplerState {
            key: derive(seed, 2),
            epoch: 0,
            position: 0,
        };
        Sampler::restore(state, n, batch)
    }

    /// A sampler continuing from `state` (as saved by [`Sampler::state`]).
    pub fn restore(state: SamplerState, n: usize, batch: usize) -> Sampler {
        let order = permutation(derive(state.key, state.epoch), n);
        Sampler {
            state,
            n,
            batch,
            order,
        }
    }

    /// The state after `step` batches from `seed`, computed directly (no replay).
    pub fn state_at(seed: u64, n: usize, batch: usize, step: u64) -> SamplerState {
        let per_epoch = (n / batch.max(1)).max(1) as u64;
        SamplerState {
            key: derive(seed, 2),
            epoch: step / per_epoch,
            position: step % per_epoch,
        }
    }

    /// The current state.
    pub fn state(&self) -> &SamplerState {
        &self.state
    }

    /// The next global batch: `batch` indices into the training set.
    pub fn next_batch(&mut self) -> Vec<u32> {
        let per_epoch = (self.n / self.batch.max(1)).max(1) as u64;
        let start = self.state.position as usize * self.batch;
        let batch = self.order[start..start + self.batch].to_vec();
        self.state.position += 1;
        // Move to the next epoch at once, so a state has one form: `state_at`'s.
        if self.state.position >= per_epoch {
            self.state.epoch += 1;
            self.state.position = 0;
            self.order = permutation(derive(self.state.key, self.state.epoch), self.n);
        }
        batch
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_matches_reference_values() {
        // First outputs of SplitMix64 seeded with 1234567 (from the reference C code).
        let mut rng = SplitMix64::new(1_234_567);
        assert_eq!(rng.next_u64(), 6_457_827_717_110_365_317);
        assert_eq!(rng.next_u64(), 3_203_168_211_198_807_973);
    }

    #[test]
    fn permutation_is_a_permutation_and_depends_on_the_key() {
        let a = permutation(7, 100);
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..100).collect::<Vec<u32>>());
        assert_ne!(a, permutation(8, 100));
        assert_eq!(a, permutation(7, 100));
    }

    #[test]
    fn sampler_state_at_matches_replay_and_restore_continues_identically() {
        let (seed, n, batch) = (42, 103, 10);
        let mut replay = Sampler::new(seed, n, batch);
        for step in 0..57u64 {
            assert_eq!(replay.state(), &Sampler::state_at(seed, n, batch, step));
            let mut restored = Sampler::restore(Sampler::state_at(seed, n, batch, step), n, batch);
            assert_eq!(restored.next_batch(), replay.next_batch(), "step {step}");
        }
    }

    #[test]
    fn every_epoch_uses_each_sample_at_most_once() {
        let (n, batch) = (50, 8);
        let mut sampler = Sampler::new(3, n, batch);
        for _epoch in 0..3 {
            let mut seen = vec![false; n];
            for _ in 0..n / batch {
                for i in sampler.next_batch() {
                    assert!(!seen[i as usize]);
                    seen[i as usize] = true;
                }
            }
        }
    }
}
