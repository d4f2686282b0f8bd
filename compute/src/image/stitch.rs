//! `ImageStitch` (ComfyUI's `nodes_images`): a second image set beside the first, with
//! ComfyUI's rules. The shorter batch repeats its last image. With `match_size` the second
//! image is resized (Pillow Lanczos, [`super::pillow`]) to the first's height (left, right)
//! or width (up, down), keeping its aspect ratio (the other side truncated); without it the
//! smaller is centred on the larger's height or width, padded with 1 for white and 0 for
//! any other colour, in every channel it has. An RGB image beside an RGBA one gets an
//! alpha of 1. A spacing strip (its width rounded up to even) of the chosen colour, opaque,
//! goes between them.

use super::{check_size, pillow, ImageBatch, Work, MAX_SIDE};
use crate::ComputeError;

/// Where the second image goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Right of the first.
    Right,
    /// Below the first.
    Down,
    /// Left of the first.
    Left,
    /// Above the first.
    Up,
}

impl Direction {
    /// Whether the images are joined side by side (their heights aligned).
    fn horizontal(self) -> bool {
        matches!(self, Direction::Right | Direction::Left)
    }
}

/// The spacing strip's colour, by ComfyUI's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpacingColor {
    /// 1 in red, green and blue.
    White,
    /// 0 in red, green and blue.
    Black,
    /// Pure red.
    Red,
    /// Pure green.
    Green,
    /// Pure blue.
    Blue,
}

impl SpacingColor {
    /// The strip's first three channel values.
    fn rgb(self) -> [f32; 3] {
        match self {
            SpacingColor::White => [1.0; 3],
            SpacingColor::Black => [0.0; 3],
            SpacingColor::Red => [1.0, 0.0, 0.0],
            SpacingColor::Green => [0.0, 1.0, 0.0],
            SpacingColor::Blue => [0.0, 0.0, 1.0],
        }
    }

    /// The value padding takes in every channel: 1 for white, 0 for the others.
    fn padding(self) -> f32 {
        if self == SpacingColor::White {
            1.0
        } else {
            0.0
        }
    }
}

/// How to stitch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stitch {
    /// Where the second image goes.
    pub direction: Direction,
    /// Resize the second image to the first's height or width.
    pub match_size: bool,
    /// Width of the strip between them (rounded up to even).
    pub spacing: u32,
    /// The strip's colour, and the padding's.
    pub color: SpacingColor,
}

/// The sizes a stitch works with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// The size the second image is resized to, with `match_size`.
    pub resized: Option<(u32, u32)>,
    /// The result's width and height.
    pub size: (u32, u32),
    /// The result's batch and channels.
    pub batch: u32,
    /// Channels of the result: the larger of the two.
    pub channels: u32,
    /// The strip's width.
    pub spacing: u32,
}

/// The sizes stitching `second` to `first` with `options` makes, or why it cannot.
pub fn layout(first: &ImageBatch, second: &ImageBatch, options: &Stitch) -> Result<Layout, ComputeError> {
    let horizontal = options.direction.horizontal();
    let resized = options.match_size.then(|| {
        let aspect = f64::from(second.width) / f64::from(second.height);
        if horizontal {
            ((f64::from(first.height) * aspect) as u64, u64::from(first.height))
        } else {
            (u64::from(first.width), (f64::from(first.width) / aspect) as u64)
        }
    });
    if let Some((w, h)) = resized {
        if w == 0 || h == 0 || w > u64::from(MAX_SIDE) || h > u64::from(MAX_SIDE) {
            return Err(ComputeError::invalid(format!(
                "matching sizes would resize image2 to {w}x{h}; each side must be 1 to {MAX_SIDE}"
            )));
        }
    }
    let (w2, h2) = resized.unwrap_or((u64::from(second.width), u64::from(second.height)));
    let (w1, h1) = (u64::from(first.width), u64::from(first.height));
    let spacing = u64::from(options.spacing) + u64::from(options.spacing % 2);
    let (width, height) = if horizontal {
        (w1 + spacing + w2, h1.max(h2))
    } else {
        (w1.max(w2), h1 + spacing + h2)
    };
    if width > u64::from(MAX_SIDE) || height > u64::from(MAX_SIDE) {
        return Err(ComputeError::invalid(format!(
            "the stitched image would be {width}x{height}; each side must be at most {MAX_SIDE}"
        )));
    }
    let batch = first.batch.max(second.batch);
    let channels = first.channels.max(second.channels);
    check_size(width as u32, height as u32, batch, channels)?;
    Ok(Layout {
        resized: resized.map(|(w, h)| (w as u32, h as u32)),
        size: (width as u32, height as u32),
        batch,
        channels,
        spacing: spacing as u32,
    })
}

/// Bytes [`stitch`] holds at its peak besides its sources: the result, and with
/// `match_size` the resized second batch and its resize's working bytes.
pub fn stitch_peak_bytes(second: &ImageBatch, layout: &Layout) -> u64 {
    let (w, h) = layout.size;
    let result = u64::from(w) * u64::from(h) * u64::from(layout.batch) * u64::from(layout.channels) * 4;
    let resized = layout
        .resized
        .map_or(0, |(rw, rh)| pillow::resize_peak_bytes(second, rw, rh));
    result + resized
}

/// A piece of the result: an image, and where its slot starts along the joining axis.
struct Piece<'a> {
    image: &'a ImageBatch,
    start: u32,
}

/// `ImageStitch` with a second image: `second` set by `first` as `options` says.
/// `keep_going` is asked between images and inside the resize; when it says no the
/// result is [`ComputeError::Interrupted`].
pub fn stitch(
    first: &ImageBatch,
    second: &ImageBatch,
    options: &Stitch,
    keep_going: &dyn Fn() -> bool,
) -> Result<ImageBatch, ComputeError> {
    let layout = layout(first, second, options)?;
    let resized = match layout.resized {
        Some((w, h)) => Some(pillow::resize(second, w, h, keep_going)?),
        None => None,
    };
    let second = resized.as_ref().unwrap_or(second);
    let horizontal = options.direction.horizontal();
    let along = |image: &ImageBatch| if horizontal { image.width } else { image.height };
    let (lead, trail) = match options.direction {
        Direction::Right | Direction::Down => (first, second),
        Direction::Left | Direction::Up => (second, first),
    };
    let pieces = [
        Piece { image: lead, start: 0 },
        Piece {
            image: trail,
            start: along(lead) + layout.spacing,
        },
    ];
    let (width, height) = layout.size;
    let row_len = width as usize * layout.channels as usize;
    let frame_len = row_len * height as usize;
    let mut data = vec![0f32; frame_len * layout.batch as usize];
    let mut work = Work::new(keep_going);
    for (index, frame) in data.chunks_exact_mut(frame_len).enumerate() {
        if !keep_going() {
            return Err(ComputeError::Interrupted);
        }
        for (y, row) in frame.chunks_exact_mut(row_len).enumerate() {
            let y = y as u32;
            paint_spacing(row, y, &layout, along(lead), horizontal, options.color);
            for piece in &pieces {
                paint_piece(
                    row,
                    y,
                    &layout,
                    piece,
                    index as u32,
                    horizontal,
                    options.color.padding(),
                );
            }
            work.step(u64::from(width))?;
        }
    }
    Ok(ImageBatch {
        width,
        height,
        batch: layout.batch,
        channels: layout.channels,
        data,
    })
}

/// Fills row `y`'s part of the spacing strip (after `lead` pixels along the joining
/// axis) with `color`, opaque when the result has alpha.
fn paint_spacing(row: &mut [f32], y: u32, layout: &Layout, lead: u32, horizontal: bool, color: SpacingColor) {
    let c = layout.channels as usize;
    let mut pixel = color.rgb().to_vec();
    pixel.resize(c, 1.0);
    let strip = lead..lead + layout.spacing;
    let columns = if horizontal {
        strip
    } else if strip.contains(&y) {
        0..layout.size.0
    } else {
        return;
    };
    for x in columns {
        let i = x as usize * c;
        row[i..i + c].copy_from_slice(&pixel);
    }
}

/// Paints row `y` of image `index` of `piece` (its last image past its batch) into its
/// slot: the image centred across the joining axis, the rest of the slot `padding` in the
/// image's own channels; channels the image lacks are 1.
fn paint_piece(
    row: &mut [f32],
    y: u32,
    layout: &Layout,
    piece: &Piece<'_>,
    index: u32,
    horizontal: bool,
    padding: f32,
) {
    let image = piece.image;
    let (width, height) = layout.size;
    let (c, ic) = (layout.channels as usize, image.channels as usize);
    // The slot's columns, the image's offset in it, and the slot's row `y` falls on.
    let (x0, slot_w, dx, dy, sy) = if horizontal {
        (piece.start, image.width, 0, (height - image.height) / 2, y)
    } else if (piece.start..piece.start + image.height).contains(&y) {
        (0, width, (width - image.width) / 2, 0, y - piece.start)
    } else {
        return;
    };
    let frame = &image.data[image.frame_len() * index.min(image.batch - 1) as usize..][..image.frame_len()];
    let line = (sy >= dy && sy - dy < image.height).then(|| {
        let start = (sy - dy) as usize * image.width as usize * ic;
        &frame[start..start + image.width as usize * ic]
    });
    for sx in 0..slot_w {
        let out = (x0 + sx) as usize * c;
        let pixel = &mut row[out..out + c];
        pixel[ic..].fill(1.0);
        match line {
            Some(line) if sx >= dx && sx - dx < image.width => {
                let at = (sx - dx) as usize * ic;
                pixel[..ic].copy_from_slice(&line[at..at + ic]);
            }
            _ => pixel[..ic].fill(padding),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::fixture::{always, text, uint, Fixture};

    fn options(case: &crate::image::fixture::Case) -> Stitch {
        let direction = match text(case, "direction") {
            "right" => Direction::Right,
            "down" => Direction::Down,
            "left" => Direction::Left,
            _ => Direction::Up,
        };
        let color = match text(case, "spacing_color") {
            "white" => SpacingColor::White,
            "black" => SpacingColor::Black,
            "red" => SpacingColor::Red,
            "green" => SpacingColor::Green,
            _ => SpacingColor::Blue,
        };
        Stitch {
            direction,
            match_size: case.inputs["match_image_size"].as_bool().unwrap(),
            spacing: uint(case, "spacing_width"),
            color,
        }
    }

    #[test]
    fn stitch_matches_comfyuis_layout_padding_and_lanczos() {
        let f = Fixture::load();
        for case in f.cases("ImageStitch") {
            let first = f.image(case, "image1");
            if case.inputs.get("image2").is_none() {
                f.check_image(case, 0, &first, 0.0);
                continue;
            }
            let got = stitch(&first, &f.image(case, "image2"), &options(case), &always).unwrap();
            f.check_image(case, 0, &got, 0.0);
        }
    }

    #[test]
    fn a_stop_ends_a_stitch_as_interrupted() {
        let image = crate::image::empty(64, 64, 2, 0x808080).unwrap();
        let down = Stitch {
            direction: Direction::Down,
            match_size: true,
            spacing: 2,
            color: SpacingColor::Red,
        };
        assert!(matches!(
            stitch(&image, &image, &down, &|| false),
            Err(ComputeError::Interrupted)
        ));
    }

    #[test]
    fn a_stitch_too_wide_or_resized_to_nothing_is_refused() {
        let wide = crate::image::empty(MAX_SIDE, 2, 1, 0).unwrap();
        let right = Stitch {
            direction: Direction::Right,
            match_size: false,
            spacing: 0,
            color: SpacingColor::White,
        };
        assert!(matches!(
            stitch(&wide, &wide, &right, &always),
            Err(ComputeError::Invalid(_))
        ));
        let flat = crate::image::empty(1, 64, 1, 0).unwrap();
        let matched = Stitch {
            match_size: true,
            ..right
        };
        // Beside a 1-high image a 1x64 one would be resized to zero width.
        let short = crate::image::empty(4, 1, 1, 0).unwrap();
        assert!(stitch(&short, &flat, &matched, &always).is_err());
        assert!(stitch(&flat, &flat, &matched, &always).is_ok());
    }
}
