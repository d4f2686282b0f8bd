//! `PorterDuffImageComposite` (ComfyUI's `nodes_compositing`): the Porter-Duff operators
//! on images whose alpha comes as masks (1 where transparent), in float32 as torch
//! computes them.

use super::resample::{upscale_center, Mode, Planes};
use super::{check_size, ImageBatch, MaskBatch};
use crate::ComputeError;

/// The operators, by ComfyUI's names (`ADD`, `CLEAR`, ... `XOR`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PorterDuff {
    /// Sum, clamped.
    Add,
    /// Nothing.
    Clear,
    /// The darker of the two.
    Darken,
    /// The destination.
    Dst,
    /// The destination where the source is.
    DstAtop,
    /// The destination inside the source.
    DstIn,
    /// The destination outside the source.
    DstOut,
    /// The destination over the source.
    DstOver,
    /// The lighter of the two.
    Lighten,
    /// The product.
    Multiply,
    /// Overlay.
    Overlay,
    /// Screen.
    Screen,
    /// The source.
    Src,
    /// The source where the destination is.
    SrcAtop,
    /// The source inside the destination.
    SrcIn,
    /// The source outside the destination.
    SrcOut,
    /// The source over the destination.
    SrcOver,
    /// Either, where the other is not.
    Xor,
}

/// One premultiplied colour value `(s, d)` and alphas `(sa, da)` combined by `mode`:
/// the output `(colour, alpha)`, premultiplied, in ComfyUI's order of operations.
fn combine(mode: PorterDuff, (s, sa): (f32, f32), (d, da): (f32, f32)) -> (f32, f32) {
    use PorterDuff::*;
    let union = || sa + da - sa * da;
    match mode {
        Add => ((s + d).clamp(0.0, 1.0), (sa + da).clamp(0.0, 1.0)),
        Clear => (0.0, 0.0),
        Darken => ((1.0 - da) * s + (1.0 - sa) * d + s.min(d), union()),
        Dst => (d, da),
        DstAtop => (sa * d + (1.0 - da) * s, sa),
        DstIn => (d * sa, sa * da),
        DstOut => ((1.0 - sa) * d, (1.0 - sa) * da),
        DstOver => (d + (1.0 - da) * s, da + (1.0 - da) * sa),
        Lighten => ((1.0 - da) * s + (1.0 - sa) * d + s.max(d), union()),
        Multiply => (s * d, sa * da),
        Overlay if 2.0 * d < da => (2.0 * s * d, union()),
        Overlay => (sa * da - 2.0 * (da - s) * (sa - d), union()),
        Screen => (s + d - s * d, union()),
        Src => (s, sa),
        SrcAtop => (da * s + (1.0 - sa) * d, da),
        SrcIn => (s * da, sa * da),
        SrcOut => ((1.0 - da) * s, (1.0 - da) * sa),
        SrcOver => (s + (1.0 - sa) * d, sa + (1.0 - sa) * da),
        Xor => ((1.0 - da) * s + (1.0 - sa) * d, (1.0 - da) * sa + (1.0 - sa) * da),
    }
}

/// Plane `index` of a mask batch, resized (bicubic, centre crop) to `width` x `height`
/// when its size differs.
fn alpha_plane(
    mask: &MaskBatch,
    index: usize,
    (width, height): (usize, usize),
    keep_going: &dyn Fn() -> bool,
) -> Result<Vec<f32>, ComputeError> {
    let (w, h) = (mask.width as usize, mask.height as usize);
    let data = mask.data[index * w * h..][..w * h].to_vec();
    if (w, h) == (width, height) {
        return Ok(data);
    }
    let planes = Planes {
        batch: 1,
        height: h,
        width: w,
        channels: 1,
        data,
    };
    Ok(upscale_center(&planes, Mode::Bicubic, width, height, keep_going)?.data)
}

/// `PorterDuffImageComposite`: for each of the shortest batch's images, the source (its
/// image and alpha resized, bicubic with centre crop, to the destination's) composited
/// with the destination by `mode`; the image un-premultiplied and clamped, the alpha
/// returned as a mask (1 where transparent).
pub fn porter_duff(
    (source, source_alpha): (&ImageBatch, &MaskBatch),
    (destination, destination_alpha): (&ImageBatch, &MaskBatch),
    mode: PorterDuff,
    keep_going: &dyn Fn() -> bool,
) -> Result<(ImageBatch, MaskBatch), ComputeError> {
    if source.channels != destination.channels {
        return Err(ComputeError::invalid(
            "the source and destination have different channel counts",
        ));
    }
    let batch = source
        .batch
        .min(source_alpha.batch)
        .min(destination.batch)
        .min(destination_alpha.batch);
    check_size(destination.width, destination.height, batch, destination.channels)?;
    let (w, h, c) = (
        destination.width as usize,
        destination.height as usize,
        destination.channels as usize,
    );
    let (mut image, mut alpha) = (Vec::with_capacity(w * h * c * batch as usize), Vec::new());
    for i in 0..batch as usize {
        let da = alpha_plane(destination_alpha, i, (w, h), keep_going)?;
        let src = Planes {
            batch: 1,
            height: source.height as usize,
            width: source.width as usize,
            channels: c,
            data: source.data[i * source.frame_len()..][..source.frame_len()].to_vec(),
        };
        let src = if (source.width, source.height) == (destination.width, destination.height) {
            src
        } else {
            upscale_center(&src, Mode::Bicubic, w, h, keep_going)?
        };
        let sa = alpha_plane(source_alpha, i, (w, h), keep_going)?;
        let dst = &destination.data[i * w * h * c..][..w * h * c];
        for p in 0..w * h {
            let (sa, da) = (1.0 - sa[p], 1.0 - da[p]);
            let mut out_alpha = 0.0;
            for ch in 0..c {
                let s = src.data[p * c + ch] * sa;
                let d = dst[p * c + ch] * da;
                let (colour, a) = combine(mode, (s, sa), (d, da));
                let colour = if a > 1e-5 { colour / a } else { 0.0 };
                image.push(colour.clamp(0.0, 1.0));
                out_alpha = a;
            }
            alpha.push(1.0 - out_alpha);
        }
    }
    let image = ImageBatch {
        width: destination.width,
        height: destination.height,
        batch,
        channels: destination.channels,
        data: image,
    };
    let mask = MaskBatch {
        width: destination.width,
        height: destination.height,
        batch,
        data: alpha,
    };
    Ok((image, mask))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::fixture::{always, text, Fixture};

    /// ComfyUI's mode names, in its enum's order.
    const MODES: [(&str, PorterDuff); 18] = [
        ("ADD", PorterDuff::Add),
        ("CLEAR", PorterDuff::Clear),
        ("DARKEN", PorterDuff::Darken),
        ("DST", PorterDuff::Dst),
        ("DST_ATOP", PorterDuff::DstAtop),
        ("DST_IN", PorterDuff::DstIn),
        ("DST_OUT", PorterDuff::DstOut),
        ("DST_OVER", PorterDuff::DstOver),
        ("LIGHTEN", PorterDuff::Lighten),
        ("MULTIPLY", PorterDuff::Multiply),
        ("OVERLAY", PorterDuff::Overlay),
        ("SCREEN", PorterDuff::Screen),
        ("SRC", PorterDuff::Src),
        ("SRC_ATOP", PorterDuff::SrcAtop),
        ("SRC_IN", PorterDuff::SrcIn),
        ("SRC_OUT", PorterDuff::SrcOut),
        ("SRC_OVER", PorterDuff::SrcOver),
        ("XOR", PorterDuff::Xor),
    ];

    #[test]
    fn every_operator_resizes_and_unpremultiplies_as_comfyui() {
        let f = Fixture::load();
        for case in f.cases("PorterDuffImageComposite") {
            let mode = MODES.iter().find(|(n, _)| *n == text(case, "mode")).unwrap().1;
            let (src, sa) = (f.image(case, "source"), f.mask(case, "source_alpha"));
            let (dst, da) = (f.image(case, "destination"), f.mask(case, "destination_alpha"));
            let (image, mask) = porter_duff((&src, &sa), (&dst, &da), mode, &always).unwrap();
            f.check_image(case, 0, &image, 1e-5);
            f.check_mask(case, 1, &mask, 1e-5);
        }
    }
}
