//! A linear layer whose matrix product starts from the bias (and a residual).
//!
//! On the CPU, `y = x · wᵀ + b (+ r)` is one parallel matrix product over all rows of `x`,
//! written into rows already holding `b` (plus the residual `r` when given); candle's
//! `Linear` multiplies per batch item and then adds the bias in a separate single-threaded
//! pass (a 21-million-element one for SD1's widest feed-forward), and a residual would be a
//! third. Layers that share an input can be stacked into one (the attention projections).
//! A float16 or bfloat16 weight is widened per call ([`super::weights`]). Other devices use
//! candle's `Linear`.

use candle_core::{DType, Module, Result, Tensor};
use candle_nn::VarBuilder;

use super::matmul::{matmul, View};
use super::weights::with_f32;
use super::{filled, par_init, repeated, CpuF32};

/// Rows per parallel task where the output is started.
const ROWS_PER_TASK: usize = 64;

/// `y = x · weightᵀ + bias` over the last dimension: `[.., inputs] → [.., outputs]`.
#[derive(Debug, Clone)]
pub(crate) struct Linear {
    weight: Tensor,
    bias: Option<Tensor>,
}

impl Linear {
    /// Reads `weight` (`[outputs, inputs]`) and `bias` (`[outputs]`) from `vb`.
    pub(crate) fn new(vb: VarBuilder, inputs: usize, outputs: usize) -> Result<Self> {
        Ok(Linear {
            weight: vb.get((outputs, inputs), "weight")?,
            bias: Some(vb.get(outputs, "bias")?),
        })
    }

    /// Bias-free layers of one input width, stacked into one: the output is their outputs
    /// side by side, in order (`parts` gives each one's weights and output width).
    pub(crate) fn stacked_without_bias(parts: &[(VarBuilder, usize)], inputs: usize) -> Result<Self> {
        let weights = parts
            .iter()
            .map(|(vb, outputs)| vb.get((*outputs, inputs), "weight"))
            .collect::<Result<Vec<_>>>()?;
        Ok(Linear {
            weight: Tensor::cat(&weights, 0)?,
            bias: None,
        })
    }

    /// Layers of one input width, each with a bias, stacked into one: the output is their
    /// outputs side by side, in order (`parts` gives each one's weights and output width).
    pub(crate) fn stacked(parts: &[(VarBuilder, usize)], inputs: usize) -> Result<Self> {
        let mut weights = Vec::with_capacity(parts.len());
        let mut biases = Vec::with_capacity(parts.len());
        for (vb, outputs) in parts {
            weights.push(vb.get((*outputs, inputs), "weight")?);
            biases.push(vb.get(*outputs, "bias")?);
        }
        Ok(Linear {
            weight: Tensor::cat(&weights, 0)?,
            bias: Some(Tensor::cat(&biases, 0)?),
        })
    }

    /// `x · weightᵀ + bias + residual`, `residual` of the output's shape.
    pub(crate) fn forward_add(&self, x: &Tensor, residual: &Tensor) -> Result<Tensor> {
        self.forward_with(x, Some(residual))
    }

    fn forward_with(&self, x: &Tensor, residual: Option<&Tensor>) -> Result<Tensor> {
        if !(x.device().is_cpu() && x.dtype() == DType::F32 && x.rank() >= 1) {
            let y = candle_nn::Linear::new(self.weight.clone(), self.bias.clone()).forward(x)?;
            return match residual {
                Some(r) => y + r,
                None => Ok(y),
            };
        }
        let mut dims = x.dims().to_vec();
        let inputs = dims.last().copied().unwrap_or(0);
        let (outputs, w_inputs) = self.weight.dims2()?;
        if w_inputs != inputs {
            candle_core::bail!("linear: input {:?} for weight {:?}", x.shape(), self.weight.shape());
        }
        let rows: usize = dims[..dims.len() - 1].iter().product();
        if let Some(last) = dims.last_mut() {
            *last = outputs;
        }
        if let Some(r) = residual {
            if r.dims() != dims.as_slice() {
                candle_core::bail!("linear: residual {:?} for an output of {dims:?}", r.shape());
            }
        }
        let x = x.contiguous()?;
        let residual = residual.map(|r| r.contiguous()).transpose()?;
        let input = CpuF32::new(&x, "linear")?;
        let bias = self.bias.as_ref().map(|b| CpuF32::new(b, "linear")).transpose()?;
        let residual = residual.as_ref().map(|r| CpuF32::new(r, "linear")).transpose()?;
        let x = input.contiguous("linear")?;
        let bias = bias.as_ref().map(|b| b.contiguous("linear")).transpose()?;
        let residual = residual.as_ref().map(|r| r.contiguous("linear")).transpose()?;
        if bias.is_some_and(|b| b.len() != outputs) {
            candle_core::bail!(
                "linear: bias {:?} for {outputs} outputs",
                self.bias.as_ref().map(|b| b.shape())
            );
        }
        // Rows start from the residual plus the bias, the bias alone, or nothing (then the
        // product overwrites them).
        let chunk = outputs * ROWS_PER_TASK;
        let mut y = par_init(rows * outputs, chunk, |i, y| {
            let y = match (residual, bias) {
                (Some(r), _) => y.write_copy_of_slice(&r[i * chunk..][..y.len()]),
                (None, Some(bias)) => return repeated(y, bias),
                (None, None) => return filled(y, 0.0),
            };
            if let Some(bias) = bias {
                for row in y.chunks_exact_mut(outputs) {
                    row.iter_mut().zip(bias).for_each(|(y, b)| *y += b);
                }
            }
            y
        });
        let accumulate = residual.is_some() || bias.is_some();
        with_f32(&self.weight, "linear", |weight| {
            let weight = View::rows(weight, outputs, inputs).t();
            matmul(
                &mut y,
                outputs,
                View::rows(x, rows, inputs),
                weight,
                1.0,
                accumulate,
                true,
            );
            Ok(())
        })?;
        Tensor::from_vec(y, dims, self.weight.device())
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_with(x, None)
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
                bias: Some(Tensor::randn(0f32, 1.0, outputs, &dev).unwrap()),
            };
            let x = Tensor::randn(0f32, 1.0, shape.as_slice(), &dev).unwrap();
            let got = ours.forward(&x).unwrap();
            let want = candle_nn::Linear::new(ours.weight.clone(), ours.bias.clone())
                .forward(&x)
                .unwrap();
            assert_eq!(got.dims(), want.dims());
            let diff = crate::max_abs_diff(&got, &want);
            assert!(diff < 1e-5, "{shape:?} -> {outputs}: {diff}");

            let residual = Tensor::randn(0f32, 1.0, want.dims(), &dev).unwrap();
            let got = ours.forward_add(&x, &residual).unwrap();
            let diff = crate::max_abs_diff(&got, &(want + residual).unwrap());
            assert!(diff < 1e-5, "{shape:?} -> {outputs} with a residual: {diff}");
        }
    }

    #[test]
    fn half_weights_compute_on_their_exact_float32_values() {
        let dev = Device::Cpu;
        let x = Tensor::randn(0f32, 1.0, (2, 7, 48), &dev).unwrap();
        let residual = Tensor::randn(0f32, 1.0, (2, 7, 24), &dev).unwrap();
        for dtype in [DType::F16, DType::BF16] {
            let half = Linear {
                weight: Tensor::randn(0f32, 1.0, (24, 48), &dev)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap(),
                bias: Some(Tensor::randn(0f32, 1.0, 24, &dev).unwrap()),
            };
            let widened = Linear {
                weight: half.weight.to_dtype(DType::F32).unwrap(),
                bias: half.bias.clone(),
            };
            let diff = crate::max_abs_diff(&half.forward(&x).unwrap(), &widened.forward(&x).unwrap());
            assert_eq!(diff, 0.0, "{dtype:?}");
            let with_residual = half.forward_add(&x, &residual).unwrap();
            let want = widened.forward_add(&x, &residual).unwrap();
            assert_eq!(crate::max_abs_diff(&with_residual, &want), 0.0, "{dtype:?}");
        }
    }

    #[test]
    fn stacked_layers_give_their_outputs_side_by_side() {
        let dev = Device::Cpu;
        let varmap = candle_nn::VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
        let init = candle_nn::Init::Randn { mean: 0.0, stdev: 1.0 };
        let a = vb.pp("a").get_with_hints((3, 4), "weight", init).unwrap();
        let b = vb.pp("b").get_with_hints((2, 4), "weight", init).unwrap();
        let stacked = Linear::stacked_without_bias(&[(vb.pp("a"), 3), (vb.pp("b"), 2)], 4).unwrap();
        let x = Tensor::randn(0f32, 1.0, (5, 4), &dev).unwrap();
        let got = stacked.forward(&x).unwrap();
        let want = Tensor::cat(
            &[x.matmul(&a.t().unwrap()).unwrap(), x.matmul(&b.t().unwrap()).unwrap()],
            1,
        )
        .unwrap();
        assert!(crate::max_abs_diff(&got, &want) < 1e-5);
    }

    #[test]
    fn a_wrong_input_width_is_an_error() {
        let dev = Device::Cpu;
        let layer = Linear {
            weight: Tensor::zeros((3, 4), DType::F32, &dev).unwrap(),
            bias: Some(Tensor::zeros(3, DType::F32, &dev).unwrap()),
        };
        assert!(layer
            .forward(&Tensor::zeros((2, 5), DType::F32, &dev).unwrap())
            .is_err());
    }
}
