//! Real-ESRGAN's compact network (SRVGGNetCompact) as spandrel builds it
//! (`architectures/Compact`): 3×3 convolutions each followed by a per-channel PReLU, a last
//! convolution to `3·scale²` channels, a pixel shuffle, plus the image enlarged by repeating
//! pixels. The keys are `body.{2i}.weight/bias` (convolutions) and `body.{2i+1}.weight`
//! (PReLU slopes).

use std::collections::HashMap;

use candle_core::{Result, Tensor};

use super::ops;
use crate::conv::Conv2d;
use crate::interrupt::Interrupt;

/// A compact network with its weights.
#[derive(Debug)]
pub(super) struct Compact {
    /// Each body convolution with its PReLU slopes.
    layers: Vec<(Conv2d, Vec<f32>)>,
    last: Conv2d,
    /// The upscale.
    pub(super) scale: usize,
}

/// Whether `state` holds a compact network: spandrel's `body.0.weight` and `body.1.weight`,
/// the first a convolution's and the second a PReLU's, and nothing but `body.*` keys.
pub(super) fn detect(state: &HashMap<String, Tensor>) -> bool {
    let rank = |k: &str| state.get(k).map(|t| t.rank());
    rank("body.0.weight") == Some(4) && rank("body.1.weight") == Some(1) && state.keys().all(|k| k.starts_with("body."))
}

impl Compact {
    /// The network of `state` (float32 tensors on the CPU); an error naming what is missing
    /// or unsupported.
    pub(super) fn new(state: &HashMap<String, Tensor>) -> std::result::Result<Self, String> {
        let highest = state
            .keys()
            .filter_map(|k| k.strip_prefix("body.")?.split('.').next()?.parse::<usize>().ok())
            .max()
            .unwrap_or(0);
        let get = |name: String| {
            state
                .get(&name)
                .cloned()
                .ok_or_else(|| format!("tensor {name} is missing"))
        };
        let conv = |i: usize| {
            Conv2d::same(get(format!("body.{i}.weight"))?, get(format!("body.{i}.bias"))?)
                .map_err(|e| format!("body.{i}: {e}"))
        };
        if highest < 2 || highest % 2 != 0 {
            return Err(format!(
                "a compact network whose last layer is body.{highest} is not one weft knows"
            ));
        }
        let mut layers = Vec::with_capacity(highest / 2);
        for i in (0..highest).step_by(2) {
            let slopes = get(format!("body.{}.weight", i + 1))?;
            let slopes = slopes
                .flatten_all()
                .and_then(|t| t.to_vec1::<f32>())
                .map_err(|e| e.to_string())?;
            layers.push((conv(i)?, slopes));
        }
        let last = conv(highest)?;
        let features = layers[0].0.out_channels();
        let chained = layers.iter().enumerate().all(|(i, (c, s))| {
            c.out_channels() == features && s.len() == features && (i == 0 || c.in_channels() == features)
        });
        let (inputs, outputs) = (layers[0].0.in_channels(), last.out_channels());
        let scale = (1..=16).find(|s| s * s * 3 == outputs);
        match scale {
            Some(scale) if chained && inputs == 3 && last.in_channels() == features => {
                Ok(Compact { layers, last, scale })
            }
            _ => Err(format!(
                "a compact network of {inputs} input and {outputs} shuffled output channels (weft upscales RGB images)"
            )),
        }
    }

    /// Feature channels.
    pub(super) fn features(&self) -> usize {
        self.layers[0].0.out_channels()
    }

    /// The network's output for one image `x` (`3 × h × w`): `3 × h·scale × w·scale`.
    pub(super) fn forward(&self, x: &[f32], (h, w): (usize, usize), stop: Interrupt<'_>) -> Result<Vec<f32>> {
        let mut out: Option<Vec<f32>> = None;
        let mut channels = 3;
        for (conv, slopes) in &self.layers {
            let input = out.as_deref().unwrap_or(x);
            let mut y = conv.forward_slice(input, (1, channels, h, w), stop)?;
            ops::prelu(&mut y, slopes);
            channels = conv.out_channels();
            out = Some(y);
        }
        let input = out.as_deref().unwrap_or(x);
        let shuffled = self.last.forward_slice(input, (1, channels, h, w), stop)?;
        let mut out = ops::pixel_shuffle(&shuffled, 3, (h, w), self.scale);
        let base = ops::upsample_nearest(x, 3, (h, w), self.scale);
        ops::add(&mut out, &base);
        Ok(out)
    }
}
