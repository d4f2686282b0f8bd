//! How a network's tensors are held in memory. On the CPU every network computes in float32,
//! but the matrices of its linear layers and convolutions (nearly all of its weights) stay in
//! the file's float16 or bfloat16 and are widened per call ([`crate::weights`]): an SDXL
//! checkpoint holds about 7 GB instead of 14. Everything else (biases, norms, embeddings,
//! CLIP's projection) is widened once, at load. On a GPU a tensor is uploaded as stored and
//! converted there to its network's precision.

use std::collections::HashMap;

use anyhow::{Context, Result};
use candle_core::{DType, Device, Shape, Tensor};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::VarBuilder;

use super::layout::fit_to_network;
use super::safetensors::{Dtype, SafetensorsIndex};

/// Whether the network tensor `target` is the matrix of a linear layer or a convolution
/// (which the CPU kernels widen per call), rather than a bias, norm, embedding or CLIP's
/// text projection.
fn is_layer_matrix(target: &str, rank: usize) -> bool {
    rank >= 2
        && target.ends_with(".weight")
        && !["token_embedding", "position_embedding", "text_projection"]
            .iter()
            .any(|other| target.contains(other))
}

/// Tensor `name` of `index` in the shape the network tensor `target` reads it, for a network
/// computing in `compute` on `device`: on the CPU, a layer matrix stored in float16 or
/// bfloat16 stays so and anything else is read as float32; on a GPU, uploaded as stored and
/// converted to `compute`.
pub(crate) fn read_tensor(
    index: &SafetensorsIndex,
    name: &str,
    target: &str,
    device: &Device,
    compute: DType,
) -> Result<Tensor> {
    let info = index
        .tensors
        .get(name)
        .with_context(|| format!("tensor {name} missing"))?;
    let half = matches!(info.dtype, Dtype::F16 | Dtype::BF16);
    let tensor = if !device.is_cpu() {
        index.read_stored(name, device)?.to_dtype(compute)
    } else if half && compute == DType::F32 && is_layer_matrix(target, info.shape.len()) {
        Ok(index.read_stored(name, device)?)
    } else {
        Tensor::from_vec(index.read_f32(name)?, info.shape.as_slice(), device)?.to_dtype(compute)
    };
    tensor
        .and_then(|t| fit_to_network(target, t))
        .with_context(|| format!("loading tensor {name}"))
}

/// A network's tensors for its constructor: each converted to the network's dtype, except
/// half-precision layer matrices on the CPU, which [`read_tensor`] kept as stored.
struct AsRead(HashMap<String, Tensor>);

impl AsRead {
    fn tensor(&self, name: &str, dtype: DType, device: &Device) -> candle_core::Result<Tensor> {
        let tensor = self
            .0
            .get(name)
            .ok_or_else(|| candle_core::Error::CannotFindTensor { path: name.to_string() }.bt())?;
        let kept_half = device.is_cpu() && dtype == DType::F32 && matches!(tensor.dtype(), DType::F16 | DType::BF16);
        if kept_half {
            tensor.to_device(device)
        } else {
            tensor.to_device(device)?.to_dtype(dtype)
        }
    }
}

impl SimpleBackend for AsRead {
    fn get(
        &self,
        shape: Shape,
        name: &str,
        _: candle_nn::Init,
        dtype: DType,
        device: &Device,
    ) -> candle_core::Result<Tensor> {
        let tensor = self.tensor(name, dtype, device)?;
        if tensor.shape() != &shape {
            return Err(candle_core::Error::UnexpectedShape {
                msg: format!("shape mismatch for {name}"),
                expected: shape,
                got: tensor.shape().clone(),
            }
            .bt());
        }
        Ok(tensor)
    }

    fn get_unchecked(&self, name: &str, dtype: DType, device: &Device) -> candle_core::Result<Tensor> {
        self.tensor(name, dtype, device)
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }
}

/// A `VarBuilder` over `tensors` (read by [`read_tensor`]) for a network computing in `dtype`.
pub(crate) fn var_builder(tensors: HashMap<String, Tensor>, dtype: DType, device: &Device) -> VarBuilder<'static> {
    VarBuilder::from_backend(Box::new(AsRead(tensors)), dtype, device.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_layer_matrices_stay_half() {
        assert!(is_layer_matrix("down_blocks.0.resnets.0.conv1.weight", 4));
        assert!(is_layer_matrix("text_model.encoder.layers.0.mlp.fc1.weight", 2));
        assert!(is_layer_matrix("time_embedding.linear_1.weight", 2));
        assert!(!is_layer_matrix("down_blocks.0.resnets.0.norm1.weight", 1));
        assert!(!is_layer_matrix("down_blocks.0.resnets.0.conv1.bias", 1));
        assert!(!is_layer_matrix("text_model.embeddings.token_embedding.weight", 2));
        assert!(!is_layer_matrix("text_model.embeddings.position_embedding.weight", 2));
        assert!(!is_layer_matrix("text_projection.weight", 2));
    }

    #[test]
    fn the_builder_keeps_half_matrices_and_converts_the_rest() {
        let dev = Device::Cpu;
        let half = Tensor::ones((2, 3), DType::F16, &dev).unwrap();
        let bias = Tensor::ones(2, DType::F32, &dev).unwrap();
        let tensors = HashMap::from([("l.weight".to_string(), half), ("l.bias".to_string(), bias)]);
        let vb = var_builder(tensors, DType::F32, &dev);
        assert_eq!(vb.get((2, 3), "l.weight").unwrap().dtype(), DType::F16);
        assert_eq!(vb.get(2, "l.bias").unwrap().dtype(), DType::F32);
        assert!(vb.get((3, 2), "l.weight").is_err());
        assert!(vb.get(2, "missing").is_err());
        // A network computing in float16 (a GPU's) gets everything converted.
        let tensors = HashMap::from([("l.bias".to_string(), Tensor::ones(2, DType::F32, &dev).unwrap())]);
        let vb = var_builder(tensors, DType::F16, &dev);
        assert_eq!(vb.get(2, "l.bias").unwrap().dtype(), DType::F16);
    }
}
