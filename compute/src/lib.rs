//! weft-compute: the host-side numeric engine that nodes call instead of doing the work in
//! wasm. It knows nothing of wasm, jobs or HTTP, and chooses no global allocator (that is
//! the binary's choice).
//!
//! Public face:
//! - [`image`] and [`values`]: the values nodes pass by handle (image and mask batches,
//!   latents, audio clips, opaque model objects) and the pixel work on images; [`codecs`]
//!   writes them as files (PNG, safetensors);
//! - [`sampling`]: ComfyUI's schedulers, k-diffusion samplers and torch-identical seeded
//!   noise, checked against ComfyUI's own numbers;
//! - [`models`]: SD1.x checkpoints (validation, loading, weft's UNet, a model cache),
//!   [`vae`] encode and decode, latent [`preview`]s and [`text_to_image`], the whole
//!   pipeline; [`device`] picks the CPU or a CUDA GPU;
//! - [`ComputeError`], how a compute operation fails, and [`interrupt`], how a caller
//!   stops a long one (a forward pass, a scale) part way.
//!
//! The CPU kernels behind the models (attention, convolution, norms, linear layers, SIMD
//! helpers) and the tokenizer are internal.

mod attention;
pub mod codecs;
#[cfg(test)]
mod comfyui_components;
#[cfg(test)]
mod comfyui_parity;
#[cfg(test)]
mod comfyui_sd2_components;
mod conv;
#[cfg(feature = "cuda")]
mod cuda;
pub mod device;
pub mod diffusion;
mod geglu;
pub mod image;
pub mod interrupt;
mod linear;
pub mod mask;
mod matmul;
pub mod models;
mod norm;
pub mod preview;
pub mod resize;
pub mod sampling;
mod simd;
pub mod text_to_image;
mod tokenizer;
pub mod upscale;
pub mod vae;
pub mod values;
mod weights;

/// Runs `work` on one of rayon's worker threads (inline when already on one) and waits for
/// it. A model's forward pass alternates parallel kernels with short serial steps; run from
/// the caller's own thread, those serial steps compete for the cores with the workers, which
/// spin for a while after each parallel kernel before they sleep (on two cores, three busy
/// threads: SD1 steps took 5-10% longer and varied from run to run). On a worker, the
/// serial steps take that worker's place.
pub fn on_workers<T: Send>(work: impl FnOnce() -> T + Send) -> T {
    rayon::scope(|_| work())
}

/// Runs `work` on the calling thread's buffer in `slot`, taken out for the call and put
/// back after it. While a thread waits inside a parallel kernel, rayon may have it run other
/// tasks, another model's forward pass among them; taken out rather than borrowed, the
/// buffer cannot be asked for twice (a nested call starts from an empty one).
pub(crate) fn with_buffer<T: Default, R>(
    slot: &'static std::thread::LocalKey<std::cell::RefCell<T>>,
    work: impl FnOnce(&mut T) -> R,
) -> R {
    let mut buffer = slot.take();
    let result = work(&mut buffer);
    slot.set(buffer);
    result
}

/// Why a compute operation failed. Each becomes a node error for the calling node.
#[derive(Debug, thiserror::Error)]
pub enum ComputeError {
    /// The arguments were out of range or malformed.
    #[error("{0}")]
    Invalid(String),
    /// The result would exceed a host limit.
    #[error("{0}")]
    TooLarge(String),
    /// The operation failed for another reason.
    #[error("{0}")]
    Failed(String),
    /// The caller's [`interrupt::Interrupt`] fired (a cancel or a deadline) and the
    /// operation stopped part way.
    #[error("the computation was interrupted")]
    Interrupted,
}

impl ComputeError {
    /// An `Invalid` error with `message`.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::Invalid(message.into())
    }

    /// The node-error code for this failure.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Invalid(_) => "invalid_input",
            Self::TooLarge(_) => "value_too_large",
            Self::Failed(_) => "compute_failed",
            Self::Interrupted => "interrupted",
        }
    }
}

/// The contiguous `f32` data of a CPU storage with layout `layout`, for the custom operations
/// of weft's CPU kernels (`op` names the operation in the error).
pub(crate) fn contiguous_f32<'a>(
    storage: &'a candle_core::CpuStorage,
    layout: &candle_core::Layout,
    op: &str,
) -> candle_core::Result<&'a [f32]> {
    let data = storage.as_slice::<f32>()?;
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&data[start..end]),
        None => candle_core::bail!("{op}: inputs must be contiguous"),
    }
}

/// A CPU `f32` tensor's storage, read-locked for a kernel that works on slices: weft's fused
/// kernels read their inputs through it and return `Tensor::from_vec` of their output, which
/// lets them take more inputs (a residual, a per-image shift) than candle's custom
/// operations and strided views (one head of a fused projection) without copies.
pub(crate) struct CpuF32<'a> {
    storage: std::sync::RwLockReadGuard<'a, candle_core::Storage>,
    layout: &'a candle_core::Layout,
}

impl<'a> CpuF32<'a> {
    /// Locks `tensor`'s storage; an error unless it is `f32` on the CPU (`op` names the
    /// operation in the error).
    pub(crate) fn new(tensor: &'a candle_core::Tensor, op: &str) -> candle_core::Result<Self> {
        let (storage, layout) = tensor.storage_and_layout();
        if !matches!(&*storage, candle_core::Storage::Cpu(candle_core::CpuStorage::F32(_))) {
            candle_core::bail!("{op}: expected an f32 tensor on the CPU");
        }
        Ok(CpuF32 { storage, layout })
    }

    /// The storage from the tensor's first element on; step through it with [`Self::strides`].
    pub(crate) fn data(&self) -> &[f32] {
        match &*self.storage {
            candle_core::Storage::Cpu(candle_core::CpuStorage::F32(v)) => &v[self.layout.start_offset()..],
            // `new` admits only CPU f32 storage.
            _ => &[],
        }
    }

    /// The tensor's dimensions.
    pub(crate) fn dims(&self) -> &[usize] {
        self.layout.dims()
    }

    /// The tensor's strides, in elements.
    pub(crate) fn strides(&self) -> &[usize] {
        self.layout.stride()
    }

    /// Exactly the tensor's elements, in order; an error unless it is contiguous.
    pub(crate) fn contiguous(&self, op: &str) -> candle_core::Result<&[f32]> {
        if !self.layout.is_contiguous() {
            candle_core::bail!("{op}: inputs must be contiguous");
        }
        Ok(&self.data()[..self.layout.shape().elem_count()])
    }
}

/// A vector of `len` floats built in parallel, `chunk` elements at a time (the last chunk
/// may be shorter): `init(index, chunk)` returns its chunk initialised, through
/// `write_copy_of_slice`, [`filled`] or [`repeated`]. Nothing is zeroed first: for outputs
/// of tens of megabytes, `vec![0.0; len]` zeroes reused memory on one thread, which took as
/// long as the parallel work after it.
///
/// # Panics
/// If `init` returns anything but its whole chunk.
pub(crate) fn par_init<F>(len: usize, chunk: usize, init: F) -> Vec<f32>
where
    F: for<'a> Fn(usize, &'a mut [std::mem::MaybeUninit<f32>]) -> &'a mut [f32] + Sync + Send,
{
    use rayon::prelude::*;
    let mut out = Vec::with_capacity(len);
    out.spare_capacity_mut()[..len]
        .par_chunks_mut(chunk.max(1))
        .enumerate()
        .for_each(|(i, c)| {
            let (start, n) = (c.as_ptr() as usize, c.len());
            let done = init(i, c);
            assert!(
                done.as_ptr() as usize == start && done.len() == n,
                "par_init: a chunk came back only in part"
            );
        });
    // SAFETY: each chunk of the first `len` elements came back from `init` as a `&mut [f32]`
    // over all of it, which only initialised memory can be.
    unsafe { out.set_len(len) };
    out
}

/// `chunk` with every element set to `value`.
pub(crate) fn filled(chunk: &mut [std::mem::MaybeUninit<f32>], value: f32) -> &mut [f32] {
    chunk.fill(std::mem::MaybeUninit::new(value));
    // SAFETY: every element was just written; `MaybeUninit<f32>` has `f32`'s layout.
    unsafe { &mut *(chunk as *mut [std::mem::MaybeUninit<f32>] as *mut [f32]) }
}

/// `chunk` filled with copies of `row`, one after the other (`row` must divide it).
///
/// # Panics
/// If `row` is empty or its length does not divide the chunk's.
pub(crate) fn repeated<'a>(chunk: &'a mut [std::mem::MaybeUninit<f32>], row: &[f32]) -> &'a mut [f32] {
    assert!(
        !row.is_empty() && chunk.len().is_multiple_of(row.len()),
        "repeated: a row of {} does not divide {}",
        row.len(),
        chunk.len()
    );
    for part in chunk.chunks_exact_mut(row.len()) {
        part.write_copy_of_slice(row);
    }
    // SAFETY: the rows written above cover the whole chunk.
    unsafe { &mut *(chunk as *mut [std::mem::MaybeUninit<f32>] as *mut [f32]) }
}

/// The largest absolute difference between two tensors of one shape, for tests.
#[cfg(test)]
pub(crate) fn max_abs_diff(a: &candle_core::Tensor, b: &candle_core::Tensor) -> f32 {
    (a - b)
        .and_then(|d| d.abs())
        .and_then(|d| d.max_all())
        .and_then(|d| d.to_scalar::<f32>())
        .expect("tensors of one shape")
}
