//! What the models' forward passes allocate, estimated from their shapes before they run:
//! the host charges it to the job, so that a latent too large for the budget fails at once
//! instead of growing the server past it.
//!
//! Each estimate walks the network as its `forward` does and keeps a running account of
//! the float32 tensors alive at each point ([`Peak`]): the tensors held across blocks (the
//! UNet's skip connections, the block's input), each block's temporaries (norm outputs,
//! convolution outputs, the transformer's projections, its 8x-wide feed-forward), and the
//! kernels' scratch buffers ([`conv_scratch`], [`attention_scratch`]). The largest total is
//! the estimate; a test compares it with allocations measured on small models.

/// Bytes of one float32 value.
const FLOAT: u64 = 4;

/// Floats of transformed inputs (or products) per pass of a Winograd convolution
/// (`conv::winograd`'s `MAX_BUFFERED`).
const WINOGRAD_BUFFERED: u64 = 16 << 20;

/// A running account of live bytes and their peak.
#[derive(Debug, Default)]
pub(crate) struct Peak {
    held: u64,
    peak: u64,
}

impl Peak {
    /// `bytes` more stay alive from here on.
    pub(crate) fn hold(&mut self, bytes: u64) {
        self.held += bytes;
        self.peak = self.peak.max(self.held);
    }

    /// `bytes` held are freed.
    pub(crate) fn release(&mut self, bytes: u64) {
        self.held = self.held.saturating_sub(bytes);
    }

    /// A step that needs `bytes` more while it runs, freed after it.
    pub(crate) fn during(&mut self, bytes: u64) {
        self.peak = self.peak.max(self.held + bytes);
    }

    /// The largest number of bytes alive at once.
    pub(crate) fn peak(&self) -> u64 {
        self.peak
    }
}

/// Bytes of `batch` activations of `channels` channels over `(h, w)` pixels.
pub(crate) fn act(batch: usize, channels: usize, (h, w): (usize, usize)) -> u64 {
    batch as u64 * channels as u64 * h as u64 * w as u64 * FLOAT
}

/// The size of `(h, w)` after a stride-2 3x3 convolution (padded on both sides, or as the
/// VAE's, on one): each side rounded up when halved.
pub(crate) fn halved((h, w): (usize, usize)) -> (usize, usize) {
    (h.div_ceil(2), w.div_ceil(2))
}

/// Scratch bytes of one convolution of `batch` images of `cin` channels over `input` pixels
/// to `cout` channels (`kernel` x `kernel`, `stride`), as `conv::Conv2d::forward_fused`
/// chooses its path: Winograd's transformed filters, inputs and products (the last two
/// capped per pass); the pixel-major path's channels-last image, column matrix and
/// products; or the column matrix of the channel-major path.
pub(crate) fn conv_scratch(
    batch: usize,
    (cin, cout): (usize, usize),
    input: (usize, usize),
    kernel: usize,
    stride: usize,
) -> u64 {
    let (cin64, cout64) = (cin as u64, cout as u64);
    let positions_in = input.0 as u64 * input.1 as u64;
    let output = if stride == 2 { halved(input) } else { input };
    let p = output.0 as u64 * output.1 as u64;
    if kernel == 1 {
        return 0;
    }
    if kernel == 3 && stride == 1 && p >= 256 {
        let tiles = batch as u64 * (input.0.div_ceil(2) as u64) * (input.1.div_ceil(2) as u64);
        let buffered = (16 * cin64.max(cout64) * tiles).min(WINOGRAD_BUFFERED.max(16 * cin64.max(cout64)));
        return (16 * cout64 * cin64 + 2 * buffered) * FLOAT;
    }
    let columns = p * cin64 * (kernel * kernel) as u64;
    if p >= 2048 && cout >= 16 {
        let products = batch as u64 * p * cout64;
        return (positions_in * cin64 + columns + products) * FLOAT;
    }
    columns * FLOAT
}

/// Scratch bytes of attention over `keys` keys with heads of `d` columns: every worker
/// thread keeps one head's keys and values (padded to whole vectors), however many heads it
/// runs; the heads' outputs before they are laid side by side are part of the caller's
/// account.
pub(crate) fn attention_scratch(keys: usize, d: usize) -> u64 {
    let threads = rayon::current_num_threads() as u64;
    let padded_keys = (keys as u64).div_ceil(64) * 64;
    let width = (d as u64).div_ceil(16) * 16;
    threads * 2 * padded_keys * width * FLOAT
}

/// Bytes of a residual block from `cin` to `cout` channels over `batch` x `size` pixels
/// while it runs, besides its input: the first norm's output and the first convolution's,
/// or later the shortcut, the second norm's output and the block's output; with the larger
/// convolution's scratch.
pub(crate) fn resnet_bytes(batch: usize, (cin, cout): (usize, usize), size: (usize, usize)) -> u64 {
    let a = |c| act(batch, c, size);
    let shortcut = if cin == cout { 0 } else { a(cout) };
    let first = a(cin) + a(cout) + conv_scratch(batch, (cin, cout), size, 3, 1);
    let second = 3 * a(cout) + shortcut + conv_scratch(batch, (cout, cout), size, 3, 1);
    first.max(second)
}

#[cfg(test)]
mod tests {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::sync::atomic::{AtomicUsize, Ordering};

    use candle_core::{Device, Tensor};

    use crate::models::loader::tiny_test_models;
    use crate::models::{ModelConfig, Sd1Vae, Unet};

    /// The system allocator, counting the bytes allocated now and at most since the last
    /// [`reset_peak`]: the test binary's global allocator.
    struct Counting;

    static CURRENT: AtomicUsize = AtomicUsize::new(0);
    static PEAK: AtomicUsize = AtomicUsize::new(0);

    // SAFETY: every call is passed to `System` unchanged; the counters are only statistics.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            let now = CURRENT.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
            // SAFETY: the caller's contract is `System`'s.
            unsafe { System.alloc(layout) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
            // SAFETY: as above.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    #[global_allocator]
    static COUNTING: Counting = Counting;

    /// Bytes allocated at most while `work` ran, above what was allocated before it: the
    /// least of three runs (other tests of the process only add to a run's count).
    fn measured_peak(work: impl Fn()) -> u64 {
        work(); // the kernels' per-thread buffers reach their size
        (0..3)
            .map(|_| {
                let before = CURRENT.load(Ordering::Relaxed);
                PEAK.store(before, Ordering::Relaxed);
                work();
                (PEAK.load(Ordering::Relaxed) - before) as u64
            })
            .min()
            .unwrap_or(0)
    }

    #[test]
    fn the_estimates_bound_what_the_forward_passes_allocate() {
        let (_dir, m) = tiny_test_models(2).unwrap();
        let cfg = &m.config;
        let (batch, h, w) = (2, 96, 80);
        let x = Tensor::randn(0f32, 1.0, (batch, 4, h, w), &Device::Cpu).unwrap();
        let ctx = Tensor::randn(0f32, 1.0, (batch, 77, cfg.context_dim), &Device::Cpu).unwrap();
        let unet = measured_peak(|| drop(m.unet.forward(&x, 500.0, &ctx, None).unwrap()));
        let estimate = Unet::working_bytes(cfg, batch, (h, w), 77);
        assert!(estimate >= unet, "UNet: estimated {estimate} bytes, allocated {unet}");
        assert!(
            estimate <= 4 * unet,
            "UNet: estimated {estimate} bytes for {unet} allocated"
        );
        let decoded =
            measured_peak(|| drop(crate::vae::decode(&m, &crate::sampling::Tensor::zeros(vec![1, 4, h, w])).unwrap()));
        let estimate = Sd1Vae::decode_working_bytes(cfg, 1, (h, w));
        assert!(
            estimate >= decoded,
            "decode: estimated {estimate} bytes, allocated {decoded}"
        );
        assert!(
            estimate <= 4 * decoded,
            "decode: estimated {estimate} bytes for {decoded} allocated"
        );
        let image = crate::image::empty(2 * w as u32, 2 * h as u32, 1, 0x336699).unwrap();
        let encoded = measured_peak(|| drop(crate::vae::encode(&m, &image).unwrap()));
        let estimate = Sd1Vae::encode_working_bytes(cfg, 1, (2 * h, 2 * w));
        assert!(
            estimate >= encoded,
            "encode: estimated {estimate} bytes, allocated {encoded}"
        );
        assert!(
            estimate <= 4 * encoded,
            "encode: estimated {estimate} bytes for {encoded} allocated"
        );
    }

    #[test]
    fn the_estimates_grow_with_the_pixels_and_the_batch() {
        for cfg in [ModelConfig::tiny(), ModelConfig::sd1()] {
            let unet = |b, side| Unet::working_bytes(&cfg, b, (side, side), 77);
            let ratio = unet(2, 512) as f64 / unet(2, 256) as f64;
            assert!((3.5..4.5).contains(&ratio), "UNet: 4x the cells, {ratio}x the bytes");
            assert!(unet(4, 256) > unet(2, 256) * 3 / 2);
            let decode = |side| Sd1Vae::decode_working_bytes(&cfg, 1, (side, side));
            let ratio = decode(512) as f64 / decode(256) as f64;
            // Less than 4x at small sizes: the convolutions' scratch is capped per pass.
            assert!((2.5..4.5).contains(&ratio), "decode: 4x the cells, {ratio}x the bytes");
        }
        // SD1 at 512x512 (a 64x64 latent, the CFG batch of 2): hundreds of MiB, not GiB;
        // at 16384x16384 far past any job's budget.
        let sd1 = ModelConfig::sd1();
        let normal = Unet::working_bytes(&sd1, 2, (64, 64), 77);
        assert!((200 << 20..2 << 30).contains(&normal), "{normal}");
        assert!(Unet::working_bytes(&sd1, 2, (2048, 2048), 77) > 64 << 30);
    }
}
