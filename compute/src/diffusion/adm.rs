//! The vector SDXL adds to its time embedding (ComfyUI's `encode_adm`): the pooled text
//! output followed by sinusoidal embeddings of the image's size numbers.

use candle_core::Tensor;

use super::conditioning::{CondEntry, SizeConditioning};
use super::latent::PIXELS_PER_CELL;
use crate::models::layout::{Family, ADM_SIZE_WIDTH};
use crate::ComputeError;

/// Whether the entry belongs to the positive or the negative prompt (the refiner's default
/// aesthetic score differs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptKind {
    /// The positive prompt.
    Positive,
    /// The negative prompt.
    Negative,
}

/// The `[1, adm_in_channels]` vector of `entry` for a model of `family` sampling a latent of
/// `(height, width)` cells, or `None` for families without one (SD1, SD2).
pub fn adm_vector(
    family: Family,
    entry: &CondEntry,
    (height, width): (usize, usize),
    kind: PromptKind,
) -> Result<Option<Tensor>, ComputeError> {
    let numbers = match family {
        Family::Sd1 | Family::Sd2 => return Ok(None),
        Family::Sdxl => sdxl_numbers(&entry.size, (height, width)).to_vec(),
        Family::SdxlRefiner => refiner_numbers(&entry.size, (height, width), kind),
    };
    let pooled = entry.pooled.as_ref().ok_or_else(|| {
        ComputeError::invalid("this SDXL model needs a pooled text output: encode the prompt with this model's CLIP")
    })?;
    let mut values: Vec<f32> = pooled
        .flatten_all()
        .and_then(|t| t.to_vec1())
        .map_err(|e| ComputeError::Failed(format!("size conditioning: {e}")))?;
    for n in numbers {
        values.extend(sinusoid(n, ADM_SIZE_WIDTH));
    }
    let len = values.len();
    Tensor::from_vec(values, (1, len), pooled.device())
        .map(Some)
        .map_err(|e| ComputeError::Failed(format!("size conditioning: {e}")))
}

/// SDXL base: height, width, crop top, crop left, target height, target width.
fn sdxl_numbers(size: &SizeConditioning, (height, width): (usize, usize)) -> [f64; 6] {
    let w = size.width.unwrap_or((width as u32 * PIXELS_PER_CELL) as f64);
    let h = size.height.unwrap_or((height as u32 * PIXELS_PER_CELL) as f64);
    [
        h,
        w,
        size.crop_h.unwrap_or(0.0),
        size.crop_w.unwrap_or(0.0),
        size.target_height.unwrap_or(h),
        size.target_width.unwrap_or(w),
    ]
}

/// The refiner: height, width, crop top, crop left, aesthetic score.
fn refiner_numbers(size: &SizeConditioning, (height, width): (usize, usize), kind: PromptKind) -> Vec<f64> {
    let w = size.width.unwrap_or((width as u32 * PIXELS_PER_CELL) as f64);
    let h = size.height.unwrap_or((height as u32 * PIXELS_PER_CELL) as f64);
    let score = size.aesthetic_score.unwrap_or(match kind {
        PromptKind::Positive => 6.0,
        PromptKind::Negative => 2.5,
    });
    vec![h, w, size.crop_h.unwrap_or(0.0), size.crop_w.unwrap_or(0.0), score]
}

/// ComfyUI's `timestep_embedding(t, dim)` computed as PyTorch does it in float32:
/// `[cos | sin]` of `t · exp(-ln(10000) · i / half)`.
pub fn sinusoid(t: f64, dim: usize) -> Vec<f32> {
    let half = dim / 2;
    let t = t as f32;
    let log_period = -(10000f64.ln()) as f32;
    let args: Vec<f32> = (0..half)
        .map(|i| t * ((log_period * i as f32) / half as f32).exp())
        .collect();
    args.iter()
        .map(|a| a.cos())
        .chain(args.iter().map(|a| a.sin()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn entry(size: SizeConditioning) -> CondEntry {
        let pooled = Tensor::from_vec(vec![0.5f32; 4], (1, 4), &Device::Cpu).unwrap();
        CondEntry {
            context: Tensor::zeros((1, 77, 8), candle_core::DType::F32, &Device::Cpu).unwrap(),
            pooled: Some(pooled),
            size,
            area: None,
            area_fraction: None,
            mask: None,
            strength: 1.0,
            timestep_range: None,
            concat_latent_image: None,
            concat_mask: None,
            control: None,
        }
    }

    fn values(t: Option<Tensor>) -> Vec<f32> {
        t.unwrap().flatten_all().unwrap().to_vec1().unwrap()
    }

    #[test]
    fn sdxl_sizes_default_to_the_latent_in_comfyuis_order() {
        let v = values(
            adm_vector(
                Family::Sdxl,
                &entry(SizeConditioning::default()),
                (16, 24),
                PromptKind::Positive,
            )
            .unwrap(),
        );
        assert_eq!(v.len(), 4 + 6 * ADM_SIZE_WIDTH);
        assert_eq!(&v[..4], &[0.5; 4]);
        // Height first (128 pixels), then width (192), crops 0, targets as the size.
        let block = |k: usize| &v[4 + k * ADM_SIZE_WIDTH..4 + (k + 1) * ADM_SIZE_WIDTH];
        assert_eq!(block(0), sinusoid(128.0, ADM_SIZE_WIDTH).as_slice());
        assert_eq!(block(1), sinusoid(192.0, ADM_SIZE_WIDTH).as_slice());
        assert_eq!(block(2), sinusoid(0.0, ADM_SIZE_WIDTH).as_slice());
        assert_eq!(block(4), block(0));
        assert_eq!(block(5), block(1));
        // The sinusoid of 0 is cos 0 = 1 then sin 0 = 0.
        assert!(block(3)[..128].iter().all(|&x| x == 1.0) && block(3)[128..].iter().all(|&x| x == 0.0));
    }

    #[test]
    fn the_refiner_scores_the_negative_prompt_lower() {
        let e = entry(SizeConditioning::default());
        let pos = values(adm_vector(Family::SdxlRefiner, &e, (8, 8), PromptKind::Positive).unwrap());
        let neg = values(adm_vector(Family::SdxlRefiner, &e, (8, 8), PromptKind::Negative).unwrap());
        assert_eq!(pos.len(), 4 + 5 * ADM_SIZE_WIDTH);
        assert_eq!(&pos[4 + 4 * ADM_SIZE_WIDTH..], sinusoid(6.0, ADM_SIZE_WIDTH).as_slice());
        assert_eq!(&neg[4 + 4 * ADM_SIZE_WIDTH..], sinusoid(2.5, ADM_SIZE_WIDTH).as_slice());
        assert!(adm_vector(Family::Sd1, &e, (8, 8), PromptKind::Positive)
            .unwrap()
            .is_none());
        let mut bare = e.clone();
        bare.pooled = None;
        assert!(adm_vector(Family::Sdxl, &bare, (8, 8), PromptKind::Positive).is_err());
    }
}
