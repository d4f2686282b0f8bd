//! Animated outputs: ComfyUI's `SaveAnimatedPNG`.

use weft_sdk::prelude::*;

/// How long each frame shows at `fps` frames a second, in milliseconds, as ComfyUI computes
/// it (`int(1000.0 / fps)`); zero for a rate faster than 1000 frames a second.
fn frame_ms(fps: f64) -> u32 {
    (1000.0 / fps).clamp(0.0, f64::from(u32::MAX)) as u32
}

weft_sdk::node! {
    /// Saves the batch as one animated PNG (a `video` output), one frame per image.
    pub struct SaveAnimatedPNG {
        category: "image/animation",
        output_node: true,
        inputs {
            images: Image = input::image(),
            filename_prefix: String = input::string().default("ComfyUI"),
            fps: f64 = input::float().default(6.0).min(0.01).max(1000.0).step(0.01),
            compress_level: u32 = input::uint().default(4).min(0).max(9),
        }
        outputs {}
        fn execute(ctx, inp) {
            let level = u8::try_from(inp.compress_level.min(9)).unwrap_or(9);
            ctx.save_animated_png(inp.filename_prefix, inp.images, frame_ms(inp.fps), level);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::frame_ms;

    #[test]
    fn frame_times_truncate_as_comfyui_does() {
        assert_eq!(frame_ms(6.0), 166);
        assert_eq!(frame_ms(0.01), 100_000);
        assert_eq!(frame_ms(1000.0), 1);
        assert_eq!(frame_ms(24.0), 41);
    }
}
