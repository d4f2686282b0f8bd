//! weft's own CUDA kernels (`kernels.cu`, compiled to PTX by `build.rs` with the `cuda`
//! feature): group norm with an optional SiLU, and GEGLU, each one launch where candle's ops
//! take a dozen (group norm) or three (GEGLU), and attention that keeps its scores in shared
//! memory ([`FlashAttention`]). The networks' group norm, GEGLU and attention call these for
//! tensors on a GPU.

use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg, ValidAsZeroBits};
use candle_core::cuda_backend::{kernel_name, CudaDevice, Map1, Map3, WrapErr};
use candle_core::{CudaStorage, Layout, Result, Shape, WithDType};

/// The PTX of `kernels.cu`.
const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/weft_kernels.ptx"));
/// The name the module is cached under on each device.
const MODULE: &str = "weft_kernels";
/// Threads per block of the group-norm kernel (one block per image and group).
const NORM_THREADS: u32 = 512;
/// Threads per block of the element-wise kernels.
const ELEMENTWISE_THREADS: u32 = 256;

/// The contiguous elements of `slice` under `layout`, or an error naming `what`.
fn contiguous<'a, T>(
    slice: &'a CudaSlice<T>,
    layout: &Layout,
    what: &str,
) -> Result<candle_core::cuda_backend::cudarc::driver::CudaView<'a, T>> {
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(slice.slice(start..end)),
        None => candle_core::bail!("{what}: the input must be contiguous"),
    }
}

/// Group norm of an NCHW(...) tensor on a GPU: `(x - mean) / sqrt(var + eps) · weight +
/// bias` per group of channels, then SiLU when `silu`.
pub(crate) struct GroupNormKernel {
    /// Groups the channels are split into.
    pub groups: usize,
    /// Added to the variance.
    pub eps: f32,
    /// Whether SiLU follows.
    pub silu: bool,
}

impl Map3 for GroupNormKernel {
    fn f<T: DeviceRepr + WithDType + ValidAsZeroBits>(
        &self,
        x: &CudaSlice<T>,
        xl: &Layout,
        weight: &CudaSlice<T>,
        wl: &Layout,
        bias: &CudaSlice<T>,
        bl: &Layout,
        dev: &CudaDevice,
    ) -> Result<CudaSlice<T>> {
        let dims = xl.shape().dims();
        let (batch, channels) = (dims[0], dims[1]);
        if self.groups == 0
            || channels % self.groups != 0
            || wl.shape().dims() != [channels]
            || bl.shape().dims() != [channels]
        {
            candle_core::bail!(
                "group norm: {channels} channels in {} groups, weight {:?}",
                self.groups,
                wl.shape()
            );
        }
        let spatial: usize = dims[2..].iter().product();
        let (x, weight, bias) = (
            contiguous(x, xl, "group norm")?,
            contiguous(weight, wl, "group norm")?,
            contiguous(bias, bl, "group norm")?,
        );
        let func = dev.get_or_load_custom_func(&kernel_name::<T>("group_norm"), MODULE, PTX)?;
        // SAFETY: every element is written by the kernel.
        let out = unsafe { dev.alloc::<T>(xl.shape().elem_count())? };
        let config = LaunchConfig {
            grid_dim: ((batch * self.groups) as u32, 1, 1),
            block_dim: (NORM_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let (channels, groups, spatial, silu) = (channels as i32, self.groups as i32, spatial as i32, self.silu as i32);
        let mut launch = func.builder();
        launch.arg(&x).arg(&out).arg(&weight).arg(&bias);
        launch
            .arg(&channels)
            .arg(&groups)
            .arg(&spatial)
            .arg(&self.eps)
            .arg(&silu);
        // SAFETY: the arguments match the kernel's signature and the buffers' sizes.
        unsafe { launch.launch(config) }.w()?;
        Ok(out)
    }
}

/// GEGLU on a GPU: `a · gelu(g)` for rows `[a | g]` along the last dimension.
pub(crate) struct GegluKernel;

impl Map1 for GegluKernel {
    fn f<T: DeviceRepr + WithDType + ValidAsZeroBits>(
        &self,
        x: &CudaSlice<T>,
        dev: &CudaDevice,
        layout: &Layout,
    ) -> Result<CudaSlice<T>> {
        let width = layout.shape().dims().last().copied().unwrap_or(0);
        if width % 2 != 0 {
            candle_core::bail!("geglu: the last dimension ({width}) must be even");
        }
        let x = contiguous(x, layout, "geglu")?;
        let half = width / 2;
        let elements = layout.shape().elem_count() / 2;
        let rows = elements.checked_div(half).unwrap_or(0) as i64;
        let func = dev.get_or_load_custom_func(&kernel_name::<T>("geglu"), MODULE, PTX)?;
        // SAFETY: every element is written by the kernel.
        let out = unsafe { dev.alloc::<T>(elements)? };
        let blocks = elements.div_ceil(ELEMENTWISE_THREADS as usize).clamp(1, 65_535) as u32;
        let config = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (ELEMENTWISE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let half = half as i32;
        let mut launch = func.builder();
        launch.arg(&x).arg(&out).arg(&rows).arg(&half);
        // SAFETY: the arguments match the kernel's signature and the buffers' sizes.
        unsafe { launch.launch(config) }.w()?;
        Ok(out)
    }
}

/// Head widths the attention kernel is built for (each a multiple of 16; a head is padded
/// with zeros to the next).
const ATTENTION_WIDTHS: [usize; 6] = [48, 64, 80, 96, 128, 160];
/// Threads per block of the attention kernel (4 warps of 16 query rows).
const ATTENTION_THREADS: u32 = 128;
/// Query rows per block of the attention kernel.
const ATTENTION_ROWS: usize = 64;
/// Key rows per tile of the attention kernel.
const ATTENTION_KEYS: usize = 64;

/// Attention on a GPU without the score matrix in device memory: `softmax(q kᵀ · scale) v`
/// per head, for `q: [b, n, heads · d]` and `k, v: [b, m, heads · d]` in float16 or bfloat16,
/// heads of at most 160 columns, rows of each input strided but their columns adjacent.
/// The output is `[b, n, heads · d]`.
pub(crate) struct FlashAttention {
    /// Heads side by side in the last dimension.
    pub heads: usize,
    /// Multiplies the scores before the softmax.
    pub scale: f32,
}

impl FlashAttention {
    /// Whether the kernel takes heads of `width` columns in `dtype`.
    pub(crate) fn supports(dtype: candle_core::DType, width: usize) -> bool {
        matches!(dtype, candle_core::DType::F16 | candle_core::DType::BF16)
            && width > 0
            && width <= ATTENTION_WIDTHS[ATTENTION_WIDTHS.len() - 1]
    }
}

/// `(image stride, row stride)` of a `[b, rows, columns]` layout whose columns are adjacent.
fn rows_of(layout: &Layout) -> Result<(i64, i32)> {
    match layout.stride() {
        [image, row, 1] => Ok((*image as i64, *row as i32)),
        other => candle_core::bail!("attention: strides {other:?} (a row's columns must be adjacent)"),
    }
}

impl Map3 for FlashAttention {
    fn f<T: DeviceRepr + WithDType + ValidAsZeroBits>(
        &self,
        q: &CudaSlice<T>,
        ql: &Layout,
        k: &CudaSlice<T>,
        kl: &Layout,
        v: &CudaSlice<T>,
        vl: &Layout,
        dev: &CudaDevice,
    ) -> Result<CudaSlice<T>> {
        let (b, n, width) = ql.shape().dims3()?;
        let (_, m, _) = kl.shape().dims3()?;
        let d = width / self.heads.max(1);
        let Some(&padded) = ATTENTION_WIDTHS.iter().find(|&&w| w >= d) else {
            candle_core::bail!("attention: heads of {d} columns are wider than the kernel's");
        };
        let (q_image, q_row) = rows_of(ql)?;
        let (k_image, k_row) = rows_of(kl)?;
        let (v_image, v_row) = rows_of(vl)?;
        let (q, k, v) = (
            q.slice(ql.start_offset()..),
            k.slice(kl.start_offset()..),
            v.slice(vl.start_offset()..),
        );
        let element = std::mem::size_of::<T>();
        let shared = 3 * ATTENTION_ROWS * padded * element
            + 4 * 16 * ATTENTION_KEYS * (4 + element)
            + 4 * 16 * padded * 4
            + 4 * 16 * 4;
        let name = format!("{}_{padded}", kernel_name::<T>("flash_attention"));
        let func = dev.get_or_load_custom_func(&name, MODULE, PTX)?;
        func.set_attribute(
            candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            shared as i32,
        )
        .w()?;
        // SAFETY: every element is written by the kernel.
        let out = unsafe { dev.alloc::<T>(b * n * width)? };
        let config = LaunchConfig {
            grid_dim: (n.div_ceil(ATTENTION_ROWS) as u32, self.heads as u32, b as u32),
            block_dim: (ATTENTION_THREADS, 1, 1),
            shared_mem_bytes: shared as u32,
        };
        let (n, m, heads, d) = (n as i32, m as i32, self.heads as i32, d as i32);
        let mut launch = func.builder();
        launch.arg(&q).arg(&k).arg(&v).arg(&out);
        launch.arg(&n).arg(&m).arg(&heads).arg(&d);
        launch
            .arg(&q_image)
            .arg(&q_row)
            .arg(&k_image)
            .arg(&k_row)
            .arg(&v_image)
            .arg(&v_row);
        launch.arg(&self.scale);
        // SAFETY: the arguments match the kernel's signature; the strides and shapes were
        // taken from the inputs' layouts.
        unsafe { launch.launch(config) }.w()?;
        Ok(out)
    }
}

impl candle_core::CustomOp3 for FlashAttention {
    fn name(&self) -> &'static str {
        "flash-attention"
    }

    fn cpu_fwd(
        &self,
        _: &candle_core::CpuStorage,
        _: &Layout,
        _: &candle_core::CpuStorage,
        _: &Layout,
        _: &candle_core::CpuStorage,
        _: &Layout,
    ) -> Result<(candle_core::CpuStorage, Shape)> {
        candle_core::bail!("flash attention runs on CUDA GPUs only")
    }

    fn cuda_fwd(
        &self,
        q: &CudaStorage,
        ql: &Layout,
        k: &CudaStorage,
        kl: &Layout,
        v: &CudaStorage,
        vl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        map3(self, (q, ql), (k, kl), (v, vl))
    }
}

/// Set to `flash`, attention on a GPU uses [`FlashAttention`] where it supports the inputs;
/// otherwise it materialises its scores through cuBLAS products and candle's softmax, which
/// measured faster on an H200 (the kernel's tiles go through shared memory; see
/// docs/benchmarks.md).
const ATTENTION_VARIABLE: &str = "WEFT_CUDA_ATTENTION";

/// Whether attention on a GPU uses [`FlashAttention`] (see [`ATTENTION_VARIABLE`]).
pub(crate) fn flash_attention_enabled() -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var(ATTENTION_VARIABLE).is_ok_and(|v| v == "flash"))
}

/// Runs `kernel` on the storage of a GPU tensor.
pub(crate) fn map3(
    kernel: &impl Map3,
    (s1, l1): (&CudaStorage, &Layout),
    (s2, l2): (&CudaStorage, &Layout),
    (s3, l3): (&CudaStorage, &Layout),
) -> Result<(CudaStorage, Shape)> {
    let device = s1.device.clone();
    let slice = kernel.map(&s1.slice, l1, &s2.slice, l2, &s3.slice, l3, &device)?;
    Ok((CudaStorage { slice, device }, l1.shape().clone()))
}

/// Runs `kernel` on the storage of a GPU tensor; the output has shape `shape`.
pub(crate) fn map1(kernel: &impl Map1, (s, l): (&CudaStorage, &Layout), shape: Shape) -> Result<(CudaStorage, Shape)> {
    let device = s.device.clone();
    let slice = kernel.map(&s.slice, &device, l)?;
    Ok((CudaStorage { slice, device }, shape))
}
