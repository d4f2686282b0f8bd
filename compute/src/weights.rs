//! Weights kept in their file's half precision on the CPU and widened per call: a float16
//! or bfloat16 matrix is turned into float32 in the calling thread's reusable buffer just
//! before its product, so a half-precision checkpoint holds half the memory while every
//! product still computes on exactly the float32 values ComfyUI computes on (a half value
//! widens exactly). Widening reads 2 and writes 4 bytes per weight, a few per cent of a
//! product's time at the UNet's sizes.

use std::cell::RefCell;

use candle_core::{CpuStorage, DType, Result, Storage, Tensor};
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

use super::{with_buffer, CpuF32};

/// Values widened per parallel task.
const CHUNK: usize = 1 << 16;

thread_local! {
    /// The calling thread's widened weights, kept between calls.
    static WIDENED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `work` on `weight`'s elements as contiguous float32: the tensor's own when it is
/// float32, widened when it is float16 or bfloat16. An error for a weight that is not on
/// the CPU, not contiguous or of another dtype (`op` names the operation).
pub(crate) fn with_f32<R>(weight: &Tensor, op: &str, work: impl FnOnce(&[f32]) -> Result<R>) -> Result<R> {
    if weight.dtype() == DType::F32 {
        let values = CpuF32::new(weight, op)?;
        return work(values.contiguous(op)?);
    }
    let (storage, layout) = weight.storage_and_layout();
    if !layout.is_contiguous() {
        candle_core::bail!("{op}: weights must be contiguous");
    }
    let (start, len) = (layout.start_offset(), layout.shape().elem_count());
    with_buffer(&WIDENED, |buffer| {
        if buffer.len() < len {
            buffer.resize(len, 0.0);
        }
        let out = &mut buffer[..len];
        match &*storage {
            Storage::Cpu(CpuStorage::F16(v)) => widen(&v[start..start + len], out, |s, o| s.convert_to_f32_slice(o)),
            Storage::Cpu(CpuStorage::BF16(v)) => widen(&v[start..start + len], out, |s, o| s.convert_to_f32_slice(o)),
            _ => candle_core::bail!("{op}: expected f32, f16 or bf16 weights on the CPU"),
        }
        work(out)
    })
}

/// `source` widened into `out` in parallel, `convert` doing one chunk.
fn widen<T: Sync>(source: &[T], out: &mut [f32], convert: fn(&[T], &mut [f32])) {
    out.par_chunks_mut(CHUNK)
        .zip(source.par_chunks(CHUNK))
        .for_each(|(o, s)| convert(s, o));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_weights_widen_to_the_exact_float32_values() {
        let values: Vec<f32> = (0..200_000).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let full = Tensor::from_vec(values, (400, 500), &candle_core::Device::Cpu).unwrap();
        for dtype in [DType::F16, DType::BF16] {
            let half = full.to_dtype(dtype).unwrap();
            let want: Vec<f32> = half
                .to_dtype(DType::F32)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let got = with_f32(&half, "test", |w| Ok(w.to_vec())).unwrap();
            assert_eq!(got, want, "{dtype:?}");
        }
        let f32s = with_f32(&full, "test", |w| Ok(w.len())).unwrap();
        assert_eq!(f32s, 200_000);
        let ints = full.to_dtype(DType::U32).unwrap();
        assert!(with_f32(&ints, "test", |w| Ok(w.len())).is_err());
    }
}
