//! The model: a multilayer perceptron 64 -> 32 (tanh) -> 10 (softmax), cross-entropy loss.
//!
//! All parameters live in one flat `f32` vector, laid out as `W1` (32x64, row-major), `b1`
//! (32), `W2` (10x32, row-major), `b2` (10), so that a gradient is one flat buffer that a
//! single allreduce can sum.

use crate::data::{Dataset, CLASSES, FEATURES};
use crate::rng::{derive, SplitMix64};

/// Hidden units.
pub const HIDDEN: usize = 32;

const W1: usize = 0;
const B1: usize = W1 + HIDDEN * FEATURES;
const W2: usize = B1 + HIDDEN;
const B2: usize = W2 + CLASSES * HIDDEN;
/// Number of parameters (and length of a gradient).
pub const PARAMS: usize = B2 + CLASSES;

/// The network's parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct Mlp {
    params: Vec<f32>,
}

impl Mlp {
    /// Glorot-uniform weights and zero biases, fixed by `seed`.
    pub fn init(seed: u64) -> Mlp {
        let mut rng = SplitMix64::new(derive(seed, 1));
        let mut params = vec![0.0f32; PARAMS];
        let a1 = (6.0 / (FEATURES + HIDDEN) as f32).sqrt();
        for w in &mut params[W1..B1] {
            *w = (2.0 * rng.next_f32() - 1.0) * a1;
        }
        let a2 = (6.0 / (HIDDEN + CLASSES) as f32).sqrt();
        for w in &mut params[W2..B2] {
            *w = (2.0 * rng.next_f32() - 1.0) * a2;
        }
        Mlp { params }
    }

    /// A network with the given flat parameters (`None` if the length is not [`PARAMS`]).
    pub fn from_params(params: Vec<f32>) -> Option<Mlp> {
        (params.len() == PARAMS).then_some(Mlp { params })
    }

    /// The flat parameters.
    pub fn params(&self) -> &[f32] {
        &self.params
    }

    /// The parameters as layers: `(W1 (32×64 row-major), b1, W2 (10×32 row-major), b2)`.
    pub fn layers(&self) -> (&[f32], &[f32], &[f32], &[f32]) {
        let p = &self.params;
        (&p[W1..B1], &p[B1..W2], &p[W2..B2], &p[B2..PARAMS])
    }

    /// Adds per-layer gradients, laid out as [`Mlp::layers`], to the flat `grad`.
    pub fn add_to_layers(
        &self,
        grad: &mut [f32],
        (gw1, gb1, gw2, gb2): (&[f32], &[f32], &[f32], &[f32]),
    ) {
        let ranges = [(W1, gw1), (B1, gb1), (W2, gw2), (B2, gb2)];
        for (start, g) in ranges {
            for (dst, v) in grad[start..start + g.len()].iter_mut().zip(g) {
                *dst += v;
            }
        }
    }

    /// Forward pass of one sample: fills `hidden` (tanh activations) and `probs` (softmax),
    /// returns the cross-entropy loss for `label`.
    fn forward(
        &self,
        x: &[f32],
        label: usize,
        hidden: &mut [f32; HIDDEN],
        probs: &mut [f32; CLASSES],
    ) -> f32 {
        let p = &self.params;
        for (j, h) in hidden.iter_mut().enumerate() {
            let row = &p[W1 + j * FEATURES..W1 + (j + 1) * FEATURES];
            let pre = row
                .iter()
                .zip(x)
                .fold(p[B1 + j], |acc, (w, xi)| acc + w * xi);
            *h = pre.tanh();
        }
        for (k, z) in probs.iter_mut().enumerate() {
            let row = &p[W2 + k * HIDDEN..W2 + (k + 1) * HIDDEN];
            *z = row
                .iter()
                .zip(hidden.iter())
                .fold(p[B2 + k], |acc, (w, h)| acc + w * h);
        }
        // Cross-entropy as logsumexp(z) - z[label], shifted by max(z) so nothing overflows.
        let max = probs.iter().fold(f32::NEG_INFINITY, |m, z| m.max(*z));
        let label_logit = probs[label] - max;
        let mut total = 0.0f32;
        for z in probs.iter_mut() {
            *z = (*z - max).exp();
            total += *z;
        }
        let loss = total.ln() - label_logit;
        for z in probs.iter_mut() {
            *z /= total;
        }
        loss
    }

    /// Adds the gradient of the loss of samples `indices` of `data` to `grad` (length
    /// [`PARAMS`]), samples in the given order, and returns the sum of their losses.
    ///
    /// Sums, not means: ranks add their partial sums with one allreduce, and the trainer
    /// divides by the global batch size once.
    pub fn accumulate_gradient(&self, data: &Dataset, indices: &[u32], grad: &mut [f32]) -> f32 {
        assert_eq!(grad.len(), PARAMS, "gradient buffer has the wrong length");
        let p = &self.params;
        let mut hidden = [0.0f32; HIDDEN];
        let mut probs = [0.0f32; CLASSES];
        let mut dhidden = [0.0f32; HIDDEN];
        let mut loss_sum = 0.0f32;
        for &i in indices {
            let (x, label) = (data.features(i as usize), data.label(i as usize));
            loss_sum += self.forward(x, label, &mut hidden, &mut probs);
            // dL/dz = softmax - onehot.
            probs[label] -= 1.0;
            dhidden.fill(0.0);
            for (k, dz) in probs.iter().enumerate() {
                grad[B2 + k] += dz;
                let row = W2 + k * HIDDEN;
                for j in 0..HIDDEN {
                    grad[row + j] += dz * hidden[j];
                    dhidden[j] += dz * p[row + j];
                }
            }
            for j in 0..HIDDEN {
                let dpre = dhidden[j] * (1.0 - hidden[j] * hidden[j]);
                grad[B1 + j] += dpre;
                let row = &mut grad[W1 + j * FEATURES..W1 + (j + 1) * FEATURES];
                for (g, xi) in row.iter_mut().zip(x) {
                    *g += dpre * xi;
                }
            }
        }
        loss_sum
    }

    /// One SGD step: `params -= lr * grad_sum / batch`.
    pub fn apply(&mut self, grad_sum: &[f32], batch: usize, lr: f32) {
        let scale = lr / batch as f32;
        for (w, g) in self.params.iter_mut().zip(grad_sum) {
            *w -= scale * g;
        }
    }

    /// Mean cross-entropy over all of `data`.
    pub fn mean_loss(&self, data: &Dataset) -> f32 {
        let (mut hidden, mut probs) = ([0.0f32; HIDDEN], [0.0f32; CLASSES]);
        let total: f64 = (0..data.len())
            .map(|i| {
                let loss = self.forward(data.features(i), data.label(i), &mut hidden, &mut probs);
                f64::from(loss)
            })
            .sum();
        (total / data.len().max(1) as f64) as f32
    }

    /// The predicted class of one sample.
    pub fn predict(&self, x: &[f32]) -> usize {
        let (mut hidden, mut probs) = ([0.0f32; HIDDEN], [0.0f32; CLASSES]);
        self.forward(x, 0, &mut hidden, &mut probs);
        let mut best = 0;
        for (k, p) in probs.iter().enumerate() {
            if *p > probs[best] {
                best = k;
            }
        }
        best
    }

    /// The fraction of `data` classified correctly.
    pub fn accuracy(&self, data: &Dataset) -> f64 {
        let correct = (0..data.len())
            .filter(|&i| self.predict(data.features(i)) == data.label(i))
            .count();
        correct as f64 / data.len().max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    fn random_data(seed: u64, n: usize) -> Dataset {
        let mut rng = SplitMix64::new(seed);
        let features = (0..n * FEATURES).map(|_| rng.next_f32()).collect();
        let labels = (0..n).map(|_| rng.below(CLASSES as u64) as u8).collect();
        Dataset::from_parts(features, labels).unwrap()
    }

    fn loss_of(model: &Mlp, data: &Dataset, indices: &[u32]) -> f64 {
        let mut grad = vec![0.0; PARAMS];
        f64::from(model.accumulate_gradient(data, indices, &mut grad))
    }

    #[test]
    fn gradient_matches_finite_differences() {
        let data = random_data(11, 6);
        let indices: Vec<u32> = (0..6).collect();
        let model = Mlp::init(5);
        let mut grad = vec![0.0; PARAMS];
        model.accumulate_gradient(&data, &indices, &mut grad);
        // Every bias plus a spread of weights from both layers.
        let mut probe: Vec<usize> = (B1..W2).chain(B2..PARAMS).collect();
        probe.extend((W1..B1).step_by(37));
        probe.extend((W2..B2).step_by(7));
        let h = 1e-2f32;
        let mut worst = 0.0f64;
        for &i in &probe {
            let mut plus = model.clone();
            plus.params[i] += h;
            let mut minus = model.clone();
            minus.params[i] -= h;
            let numeric = (loss_of(&plus, &data, &indices) - loss_of(&minus, &data, &indices))
                / (2.0 * f64::from(h));
            let err = (numeric - f64::from(grad[i])).abs() / (1.0 + numeric.abs());
            worst = worst.max(err);
        }
        // Central differences in f32 with h = 1e-2: truncation O(h^2) and rounding
        // O(eps * loss / h) are both around 1e-4 here.
        assert!(worst < 2e-3, "worst relative gradient error {worst}");
    }

    #[test]
    fn sharded_gradient_sums_equal_the_full_batch_gradient() {
        let data = random_data(3, 64);
        let model = Mlp::init(9);
        let batch: Vec<u32> = (0..64).rev().collect();
        let mut full = vec![0.0; PARAMS];
        let full_loss = model.accumulate_gradient(&data, &batch, &mut full);
        for shards in [2usize, 4, 8] {
            let mut summed = vec![0.0; PARAMS];
            let mut loss = 0.0;
            for slice in batch.chunks(64 / shards) {
                let mut part = vec![0.0; PARAMS];
                loss += model.accumulate_gradient(&data, slice, &mut part);
                for (s, p) in summed.iter_mut().zip(&part) {
                    *s += p;
                }
            }
            assert!((loss - full_loss).abs() <= 1e-5 * full_loss.abs());
            for (i, (a, b)) in summed.iter().zip(&full).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                    "{shards} shards, param {i}: {a} vs {b}"
                );
            }
        }
    }

    #[test]
    fn init_is_a_function_of_the_seed() {
        assert_eq!(Mlp::init(1), Mlp::init(1));
        assert_ne!(Mlp::init(1), Mlp::init(2));
        assert!(Mlp::init(1).params[..B1].iter().any(|w| *w != 0.0));
        assert!(Mlp::init(1).params[B2..].iter().all(|b| *b == 0.0));
    }

    #[test]
    fn sgd_steps_fit_a_small_batch() {
        let data = random_data(4, 16);
        let indices: Vec<u32> = (0..16).collect();
        let mut model = Mlp::init(4);
        let before = model.mean_loss(&data);
        for _ in 0..300 {
            let mut grad = vec![0.0; PARAMS];
            model.accumulate_gradient(&data, &indices, &mut grad);
            model.apply(&grad, 16, 0.5);
        }
        assert!(model.mean_loss(&data) < 0.2 * before);
        assert_eq!(model.accuracy(&data), 1.0);
    }
}
