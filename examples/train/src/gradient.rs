//! Where a rank computes its gradient: on the host, one sample at a time
//! ([`Mlp::accumulate_gradient`]), or on a Flotilla device, the whole slice of the batch at
//! once as matrix products ([`OnDevice`]).
//!
//! On a device the five products of the forward and backward passes run there (cuBLAS on a
//! GPU, the OpenCL kernels, or the CPU device), and the elementwise steps between them
//! (bias, tanh, softmax, the loss) on the host. The two give the same gradient up to the
//! order of the f32 sums; ranks may mix them.

use std::sync::Arc;

use flotilla_devices::{Device, DeviceBuffer, DevicesError, ElemType, Trans};

use crate::data::{Dataset, CLASSES, FEATURES};
use crate::model::{Mlp, HIDDEN, PARAMS};

/// Computes the gradient of a slice of a batch.
pub trait Gradient {
    /// Adds the gradient of the loss of samples `indices` of `data` under `model` to
    /// `grad` (length [`PARAMS`]) and returns the sum of their losses.
    fn accumulate(
        &mut self,
        model: &Mlp,
        data: &Dataset,
        indices: &[u32],
        grad: &mut [f32],
    ) -> Result<f32, DevicesError>;

    /// Where it runs, for logs: `"host"` or the device's name.
    fn name(&self) -> String;
}

impl<G: Gradient + ?Sized> Gradient for Box<G> {
    fn accumulate(
        &mut self,
        model: &Mlp,
        data: &Dataset,
        indices: &[u32],
        grad: &mut [f32],
    ) -> Result<f32, DevicesError> {
        (**self).accumulate(model, data, indices, grad)
    }

    fn name(&self) -> String {
        (**self).name()
    }
}

/// The host loop of [`Mlp::accumulate_gradient`].
#[derive(Clone, Copy, Debug, Default)]
pub struct OnHost;

impl Gradient for OnHost {
    fn accumulate(
        &mut self,
        model: &Mlp,
        data: &Dataset,
        indices: &[u32],
        grad: &mut [f32],
    ) -> Result<f32, DevicesError> {
        Ok(model.accumulate_gradient(data, indices, grad))
    }

    fn name(&self) -> String {
        "host".into()
    }
}

/// Device buffers for one batch size (reallocated when it changes).
struct Buffers {
    batch: usize,
    x: DeviceBuffer,
    w1: DeviceBuffer,
    w2: DeviceBuffer,
    pre: DeviceBuffer,
    hidden: DeviceBuffer,
    logits: DeviceBuffer,
    dlogits: DeviceBuffer,
    gw2: DeviceBuffer,
    dhidden: DeviceBuffer,
    dpre: DeviceBuffer,
    gw1: DeviceBuffer,
}

impl Buffers {
    fn new(dev: &dyn Device, batch: usize) -> Result<Buffers, DevicesError> {
        let f = |n: usize| dev.alloc(n * 4);
        Ok(Buffers {
            batch,
            x: f(FEATURES * batch)?,
            w1: f(HIDDEN * FEATURES)?,
            w2: f(CLASSES * HIDDEN)?,
            pre: f(HIDDEN * batch)?,
            hidden: f(HIDDEN * batch)?,
            logits: f(CLASSES * batch)?,
            dlogits: f(CLASSES * batch)?,
            gw2: f(CLASSES * HIDDEN)?,
            dhidden: f(HIDDEN * batch)?,
            dpre: f(HIDDEN * batch)?,
            gw1: f(HIDDEN * FEATURES)?,
        })
    }
}

/// The gradient as matrix products on `device` (see the module docs).
pub struct OnDevice {
    device: Arc<dyn Device>,
    buffers: Option<Buffers>,
}

impl OnDevice {
    /// Computes on `device`, which must run f32 kernels.
    pub fn new(device: Arc<dyn Device>) -> Result<OnDevice, DevicesError> {
        if !device.supports(ElemType::F32) {
            return Err(DevicesError::Unsupported {
                device: device.info().name.clone(),
                what: "f32 kernels".into(),
            });
        }
        Ok(OnDevice {
            device,
            buffers: None,
        })
    }
}

fn up(dev: &dyn Device, buf: &DeviceBuffer, v: &[f32]) -> Result<(), DevicesError> {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_ne_bytes()).collect();
    dev.upload(buf, &bytes)
}

fn down(dev: &dyn Device, buf: &DeviceBuffer, n: usize) -> Result<Vec<f32>, DevicesError> {
    let mut bytes = vec![0u8; n * 4];
    dev.download(buf, &mut bytes)?;
    Ok(bytes
        .chunks_exact(4)
        .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// `C := op(A) op(B)` on f32, column-major, nothing accumulated.
#[allow(clippy::too_many_arguments)]
fn product(
    dev: &dyn Device,
    (ta, tb): (Trans, Trans),
    (m, n, k): (usize, usize, usize),
    (a, lda): (&DeviceBuffer, usize),
    (b, ldb): (&DeviceBuffer, usize),
    (c, ldc): (&DeviceBuffer, usize),
) -> Result<(), DevicesError> {
    dev.gemm(
        ElemType::F32,
        ta,
        tb,
        m,
        n,
        k,
        1.0,
        a,
        lda,
        b,
        ldb,
        0.0,
        c,
        ldc,
    )
}

impl Gradient for OnDevice {
    fn accumulate(
        &mut self,
        model: &Mlp,
        data: &Dataset,
        indices: &[u32],
        grad: &mut [f32],
    ) -> Result<f32, DevicesError> {
        assert_eq!(grad.len(), PARAMS, "gradient buffer has the wrong length");
        let nb = indices.len();
        if nb == 0 {
            return Ok(0.0);
        }
        let dev = self.device.as_ref();
        if self.buffers.as_ref().is_none_or(|b| b.batch != nb) {
            self.buffers = Some(Buffers::new(dev, nb)?);
        }
        let Some(b) = &self.buffers else {
            unreachable!("allocated above")
        };
        let (w1, b1, w2, b2) = model.layers();
        // Column-major throughout: the batch X is 64 × nb (one sample per column); W1,
        // row-major 32 × 64, is column-major W1ᵀ (64 × 32); W2 likewise (32 × 10).
        let x: Vec<f32> = indices
            .iter()
            .flat_map(|&i| data.features(i as usize).iter().copied())
            .collect();
        up(dev, &b.x, &x)?;
        up(dev, &b.w1, w1)?;
        up(dev, &b.w2, w2)?;
        let (no, yes) = (Trans::No, Trans::Yes);
        // pre = W1 · X (32 × nb); hidden = tanh(pre + b1).
        product(
            dev,
            (yes, no),
            (HIDDEN, nb, FEATURES),
            (&b.w1, FEATURES),
            (&b.x, FEATURES),
            (&b.pre, HIDDEN),
        )?;
        let mut hidden = down(dev, &b.pre, HIDDEN * nb)?;
        for col in hidden.chunks_exact_mut(HIDDEN) {
            for (h, bias) in col.iter_mut().zip(b1) {
                *h = (*h + bias).tanh();
            }
        }
        up(dev, &b.hidden, &hidden)?;
        // logits = W2 · hidden (10 × nb); softmax, loss, dlogits = softmax − onehot.
        product(
            dev,
            (yes, no),
            (CLASSES, nb, HIDDEN),
            (&b.w2, HIDDEN),
            (&b.hidden, HIDDEN),
            (&b.logits, CLASSES),
        )?;
        let mut z = down(dev, &b.logits, CLASSES * nb)?;
        let mut loss_sum = 0.0f32;
        let gb2 = &mut [0.0f32; CLASSES];
        for (col, &i) in z.chunks_exact_mut(CLASSES).zip(indices) {
            let label = data.label(i as usize);
            for (v, bias) in col.iter_mut().zip(b2) {
                *v += bias;
            }
            let max = col.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v));
            let label_logit = col[label] - max;
            let mut total = 0.0f32;
            for v in col.iter_mut() {
                *v = (*v - max).exp();
                total += *v;
            }
            loss_sum += total.ln() - label_logit;
            for v in col.iter_mut() {
                *v /= total;
            }
            col[label] -= 1.0;
            for (g, v) in gb2.iter_mut().zip(col.iter()) {
                *g += v;
            }
        }
        up(dev, &b.dlogits, &z)?;
        // gW2ᵀ = hidden · dlogitsᵀ (32 × 10, i.e. row-major gW2); dhidden = W2ᵀ · dlogits.
        product(
            dev,
            (no, yes),
            (HIDDEN, CLASSES, nb),
            (&b.hidden, HIDDEN),
            (&b.dlogits, CLASSES),
            (&b.gw2, HIDDEN),
        )?;
        product(
            dev,
            (no, no),
            (HIDDEN, nb, CLASSES),
            (&b.w2, HIDDEN),
            (&b.dlogits, CLASSES),
            (&b.dhidden, HIDDEN),
        )?;
        let mut dpre = down(dev, &b.dhidden, HIDDEN * nb)?;
        let gb1 = &mut [0.0f32; HIDDEN];
        for (dcol, hcol) in dpre
            .chunks_exact_mut(HIDDEN)
            .zip(hidden.chunks_exact(HIDDEN))
        {
            for ((d, h), g) in dcol.iter_mut().zip(hcol).zip(gb1.iter_mut()) {
                *d *= 1.0 - h * h;
                *g += *d;
            }
        }
        up(dev, &b.dpre, &dpre)?;
        // gW1ᵀ = X · dpreᵀ (64 × 32, i.e. row-major gW1).
        product(
            dev,
            (no, yes),
            (FEATURES, HIDDEN, nb),
            (&b.x, FEATURES),
            (&b.dpre, HIDDEN),
            (&b.gw1, FEATURES),
        )?;
        let gw1 = down(dev, &b.gw1, HIDDEN * FEATURES)?;
        let gw2 = down(dev, &b.gw2, CLASSES * HIDDEN)?;
        model.add_to_layers(grad, (&gw1, gb1, &gw2, gb2));
        Ok(loss_sum)
    }

    fn name(&self) -> String {
        format!("{} ({})", self.device.info().name, self.device.info().kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reducer::Local;
    use crate::trainer::{train_with, Event, Outcome, TrainConfig};
    use flotilla_devices::cpu::HostDevice;
    use flotilla_devices::{discover_report, DiscoverOptions};

    fn digits() -> (Dataset, Dataset) {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data/digits.csv");
        Dataset::load(&path)
            .expect("shipped data")
            .split(1500)
            .expect("split")
    }

    /// The host device, and the first OpenCL device where there is one (PoCL in CI).
    fn devices() -> Vec<Arc<dyn Device>> {
        let mut out: Vec<Arc<dyn Device>> = vec![Arc::new(HostDevice::new(1 << 30))];
        let found = discover_report(&DiscoverOptions {
            opencl: true,
            cuda: true,
            mem_limit: None,
        });
        if found.devices.is_empty() {
            eprintln!(
                "no OpenCL or CUDA device ({:?}): host device only",
                found.skipped
            );
        }
        out.extend(found.devices);
        out
    }

    #[test]
    fn device_gradient_equals_the_host_loop() {
        let (train, _) = digits();
        let model = Mlp::init(3);
        let indices: Vec<u32> = (0..48).map(|i| i * 31 % 1500).collect();
        let mut want = vec![0.0f32; PARAMS];
        let want_loss = OnHost
            .accumulate(&model, &train, &indices, &mut want)
            .expect("host");
        let scale = want.iter().fold(0.0f32, |m, g| m.max(g.abs()));
        for dev in devices() {
            let mut on = OnDevice::new(dev).expect("f32 device");
            // Twice: the second call reuses the buffers, and gradients add up.
            let mut got = vec![0.0f32; PARAMS];
            let mut loss = 0.0;
            for _ in 0..2 {
                loss = on
                    .accumulate(&model, &train, &indices, &mut got)
                    .expect("device");
            }
            assert!(
                (loss - want_loss).abs() <= 1e-5 * want_loss,
                "{}: loss {loss} vs {want_loss}",
                on.name()
            );
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - 2.0 * w).abs() <= 1e-4 * scale,
                    "{}: parameter {i}: {g} vs 2 × {w}",
                    on.name()
                );
            }
        }
    }

    #[test]
    fn training_on_a_device_follows_the_host_run() {
        let (train, test) = digits();
        let config = TrainConfig {
            steps: 60,
            ..TrainConfig::default()
        };
        let run = |g: &mut dyn FnMut() -> Box<dyn Gradient>| {
            let mut losses = Vec::new();
            let mut gradient = g();
            let outcome = train_with(&config, &train, &test, &mut Local, &mut gradient, |e| {
                if let Event::Step { loss, .. } = e {
                    losses.push(loss);
                }
            })
            .expect("training");
            let Outcome::Finished(summary) = outcome else {
                panic!("did not finish")
            };
            (losses, summary.test_accuracy)
        };
        let (host, host_acc) = run(&mut || Box::new(OnHost));
        for dev in devices() {
            let name = dev.info().name.clone();
            let (on_dev, acc) = run(&mut || Box::new(OnDevice::new(dev.clone()).expect("device")));
            assert_eq!(on_dev.len(), host.len());
            for (step, (a, b)) in on_dev.iter().zip(&host).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-3 * b.abs().max(1e-3),
                    "{name}: step {}: loss {a} vs host {b}",
                    step + 1
                );
            }
            assert!(
                (acc - host_acc).abs() < 0.02,
                "{name}: accuracy {acc} vs {host_acc}"
            );
        }
    }
}
