//! Stopping a long computation from outside: the caller's cancel or deadline, asked between
//! the blocks of a forward pass (UNet levels, VAE blocks, CLIP layers) and between query
//! blocks of attention, whose cost grows with the square of the tokens.
//!
//! A model's forward pass is one call into the engine; on a large latent it can run for
//! minutes, and it cannot be stopped by dropping anything. [`Interrupt`] carries the
//! caller's question ("should I stop?") down into it; a pass that stops returns an error
//! made by [`Interrupt::check`], which the public entry points turn into
//! [`ComputeError::Interrupted`](crate::ComputeError::Interrupted).

/// Asked between pieces of long work whether to stop. It is copied down the forward pass
/// and may be asked from any of rayon's worker threads, so the question must be `Sync` and
/// cheap (an atomic load and a clock read).
#[derive(Clone, Copy, Default)]
pub struct Interrupt<'a> {
    stop: Option<&'a (dyn Fn() -> bool + Sync)>,
}

impl std::fmt::Debug for Interrupt<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interrupt")
            .field("armed", &self.stop.is_some())
            .finish()
    }
}

/// The message of the error a stopped forward pass returns.
const STOPPED: &str = "the computation was interrupted";

impl<'a> Interrupt<'a> {
    /// An interrupt that never fires.
    pub const NEVER: Interrupt<'static> = Interrupt { stop: None };

    /// An interrupt that fires once `stop` returns true. `stop` must keep returning true
    /// once it has (a cancel stays canceled, a deadline stays passed).
    pub fn new(stop: &'a (dyn Fn() -> bool + Sync)) -> Self {
        Interrupt { stop: Some(stop) }
    }

    /// Whether the work must stop now.
    pub fn requested(&self) -> bool {
        self.stop.is_some_and(|stop| stop())
    }

    /// An error when the work must stop now; forward passes return it with `?`.
    pub(crate) fn check(&self) -> candle_core::Result<()> {
        if self.requested() {
            Err(candle_core::Error::Msg(STOPPED.into()))
        } else {
            Ok(())
        }
    }

    /// `error` as a [`ComputeError`](crate::ComputeError): `Interrupted` when this interrupt
    /// has fired (whatever the error says: a pass cut short may fail in other ways on its
    /// way out), else `Failed` with `context` before the error's message.
    pub(crate) fn explain(&self, context: &str, error: impl std::fmt::Display) -> crate::ComputeError {
        if self.requested() {
            crate::ComputeError::Interrupted
        } else {
            crate::ComputeError::Failed(format!("{context}: {error:#}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[test]
    fn an_interrupt_fires_once_its_question_says_so() {
        let flag = AtomicBool::new(false);
        let stop = || flag.load(Ordering::SeqCst);
        let interrupt = Interrupt::new(&stop);
        assert!(interrupt.check().is_ok());
        assert!(!Interrupt::NEVER.requested());
        flag.store(true, Ordering::SeqCst);
        assert!(interrupt.check().is_err());
        assert!(matches!(
            interrupt.explain("x", "boom"),
            crate::ComputeError::Interrupted
        ));
        assert!(matches!(
            Interrupt::NEVER.explain("x", "boom"),
            crate::ComputeError::Failed(m) if m == "x: boom"
        ));
    }

    /// An interrupt that fires after `checks` questions, to stop a pass part way.
    fn after(checks: usize) -> impl Fn() -> bool + Sync {
        let asked = std::sync::atomic::AtomicUsize::new(0);
        move || asked.fetch_add(1, Ordering::SeqCst) >= checks
    }

    #[test]
    fn forward_passes_stop_part_way_when_their_interrupt_fires() {
        use crate::diffusion::{vae, Autoencoder, Conditioning, DiffusionModel, SampleFailure, TextEncoder};
        use candle_core::{Device, Tensor};
        let (dir, m) = crate::models::loader::tiny_test_models(6).unwrap();
        let x = Tensor::randn(0f32, 1.0, (2, 4, 16, 16), &Device::Cpu).unwrap();
        let ctx = Tensor::randn(0f32, 1.0, (2, 77, 32), &Device::Cpu).unwrap();
        for checks in [0, 3, 8] {
            let stop = after(checks);
            let unet = m
                .unet
                .forward_interruptible(&x, 500.0, (&ctx, None), Interrupt::new(&stop));
            assert!(unet.is_err(), "the UNet ran on after {checks} checks");
            let stop = after(checks);
            let decoded = m.vae.decode_interruptible(&x, Interrupt::new(&stop));
            assert!(decoded.is_err(), "the VAE decoder ran on after {checks} checks");
        }
        assert!(m
            .unet
            .forward_interruptible(&x, 500.0, (&ctx, None), Interrupt::NEVER)
            .is_ok());
        let m = std::sync::Arc::new(m);
        let fired = || true;
        let fired = Interrupt::new(&fired);
        let path = dir.path().join("tiny.safetensors");
        let text = TextEncoder::new(m.clone(), path.clone());
        assert!(matches!(
            text.encode("a cat", None, fired),
            Err(crate::ComputeError::Interrupted)
        ));
        let vae_model = Autoencoder::Checkpoint(m.clone());
        let latent = crate::diffusion::latent::empty(64, 64, 1).unwrap();
        assert!(matches!(
            vae::decode(&vae_model, &latent, fired),
            Err(crate::ComputeError::Interrupted)
        ));
        let image = crate::image::empty(64, 64, 1, 0).unwrap();
        assert!(matches!(
            vae::encode(&vae_model, &image, fired),
            Err(crate::ComputeError::Interrupted)
        ));
        let context = text.encode("a cat", None, Interrupt::NEVER).unwrap().context;
        let cond = Conditioning::from_context(context);
        let model = DiffusionModel::new(m, path);
        let settings = crate::diffusion::SampleSettings {
            seed: 1,
            steps: 2,
            cfg: 7.0,
            sampler: crate::sampling::SamplerKind::Euler,
            scheduler: crate::sampling::Scheduler::Normal,
            denoise: 1.0,
            add_noise: true,
            start_step: 0,
            last_step: 10_000,
            force_full_denoise: true,
        };
        let mut steps = 0;
        let stop = after(5);
        let sampled = crate::diffusion::ksample(
            &model,
            &cond,
            &cond,
            &latent,
            &settings,
            &mut |_| {
                steps += 1;
                crate::sampling::StepControl::Continue
            },
            Interrupt::new(&stop),
        );
        assert!(matches!(sampled, Err(SampleFailure::Interrupted)), "{sampled:?}");
        assert_eq!(steps, 0, "stopped inside the first step");
    }
}
