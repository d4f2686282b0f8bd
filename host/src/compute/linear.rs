//! A linear layer with bias whose matrix product starts from the bias.
//!
//! On the CPU, `y = x · wᵀ + b` is one parallel matrix product over all rows of `x`, written
//! into rows already holding `b`; candle's `Linear` multiplies per batch item and then adds
//! the bias in a separate single-threaded pass (a 21-million-element one for SD1's widest
//! feed-forward). Other devices use candle's `Linear`.

use candle_core::{CpuStorage, CustomOp3, DType, Layout, Module, Result, Shape, Tensor};
use candle_nn::VarBuilder;

use super::contiguous_f32;
use super::matmul::{matmul, View};

/// `y = x · weightᵀ + bias` over the last dimension: `[.., inputs] → [.., outputs]`.
#[derive(Debug, Clone)]
pub struct Linear {
    weight: Tensor,
    bias: Tensor,
}

impl Linear {
    /// Reads `weight` (`[outputs, inputs]`) and `bias` (`[outputs]`) from `vb`.
    pub fn new(vb: VarBuilder, inputs: usize, outputs: usize) -> Result<Self> {
        Ok(Linear {
            weight: vb.get((outputs, inputs), "weight")?,
            bias: vb.get(outputs, "bias")?,
        })
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.device().is_cpu() && x.dtype() == DType::F32 && x.rank() >= 1 {
            return x
                .contiguous()?
                .apply_op3_no_bwd(&self.weight, &self.bias, &BiasedMatmul);
        }
        candle_nn::Linear::new(self.weight.clone(), Some(self.bias.clone())).forward(x)
    }
}

/// The CPU kernel behind [`Linear`].
struct BiasedMatmul;

impl CustomOp3 for BiasedMatmul {
    fn name(&self) -> &'static str {
        "biased-matmul"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        ws: &CpuStorage,
        wl: &Layout,
        bs: &CpuStorage,
        bl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let mut dims = xl.shape().dims().to_vec();
        let inputs = dims.last().copied().unwrap_or(0);
        let (outputs, w_inputs) = wl.shape().dims2()?;
        if w_inputs != inputs || bl.shape().dims() != [outputs] {
            candle_core::bail!(
                "linear: input {:?}, weight {:?}, bias {:?}",
                xl.shape(),
                wl.shape(),
                bl.shape()
            );
        }
        let (x, weight, bias) = (
            contiguous_f32(xs, xl, "linear")?,
            contiguous_f32(ws, wl, "linear")?,
            contiguous_f32(bs, bl, "linear")?,
        );
        let rows: usize = dims[..dims.len().saturating_sub(1)].iter().product();
        if let Some(last) = dims.last_mut() {
            *last = outputs;
        }
        let mut y = Vec::with_capacity(rows * outputs);
        for _ in 0..rows {
            y.extend_from_slice(bias);
        }
        matmul(
            &mut y,
            View::rows(x, rows, inputs),
            View::rows(weight, outputs, inputs).t(),
            1.0,
            true,
            true,
        );
        Ok((CpuStorage::F32(y), Shape::from(dims)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn equals_candle_linear() {
        let dev = Device::Cpu;
        for (shape, outputs) in [(vec![2, 7, 10], 6), (vec![3, 5], 1), (vec![1, 1, 1, 4], 9)] {
            let inputs = *shape.last().unwrap();
            let ours = Linear {
                weight: Tensor::randn(0f32, 1.0, (outputs, inputs), &dev).unwrap(),
                bias: Tensor::randn(0f32, 1.0, outputs, &dev).unwrap(),
            };
            let x = Tensor::randn(0f32, 1.0, shape.as_slice(), &dev).unwrap();
            let got = ours.forward(&x).unwrap();
            let want = candle_nn::Linear::new(ours.weight.clone(), Some(ours.bias.clone()))
                .forward(&x)
                .unwrap();
            assert_eq!(got.dims(), want.dims());
            let diff = crate::compute::max_abs_diff(&got, &want);
            assert!(diff < 1e-5, "{shape:?} -> {outputs}: {diff}");
        }
    }

    #[test]
    fn a_wrong_input_width_is_an_error() {
        let dev = Device::Cpu;
        let layer = Linear {
            weight: Tensor::zeros((3, 4), DType::F32, &dev).unwrap(),
            bias: Tensor::zeros(3, DType::F32, &dev).unwrap(),
        };
        assert!(layer
            .forward(&Tensor::zeros((2, 5), DType::F32, &dev).unwrap())
            .is_err());
    }
}
