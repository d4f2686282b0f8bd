//! What a node call returns: its values and the files it asks the host to commit.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use weft_compute::image::ImageBatch;
use weft_compute::values::{AudioClip, LatentBatch};

use super::Value;
use crate::runtime::memory::Held;

/// What a node returned.
#[derive(Debug, Clone)]
pub struct NodeOutput {
    /// One value per declared output.
    pub values: Vec<Value>,
    /// Files to commit as job outputs.
    pub files: Vec<OutputFile>,
}

/// The kind of a committed output file: the interface's `OutputType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputKind {
    /// `image`.
    Image,
    /// `video`.
    Video,
    /// `audio`.
    Audio,
    /// `text`.
    Text,
    /// `file`.
    File,
    /// `latent`.
    Latent,
}

/// Content of an output file, before the host encodes it.
#[derive(Debug, Clone)]
pub enum FileData {
    /// Bytes the guest made.
    Bytes(Vec<u8>),
    /// Each image of the batch as a PNG.
    Png(Arc<Held<ImageBatch>>),
    /// The clip as a 16-bit WAV.
    Wav(Arc<Held<AudioClip>>),
    /// The latents as safetensors.
    Latent(Arc<Held<LatentBatch>>),
    /// The whole batch as one animated PNG.
    AnimatedPng {
        /// The frames, in order.
        frames: Arc<Held<ImageBatch>>,
        /// How long each frame shows, in milliseconds.
        frame_ms: u32,
        /// zlib level, 0 to 9.
        compress_level: u8,
    },
}

impl FileData {
    /// How many files it commits as: one per image of a PNG batch, else one.
    pub fn files(&self) -> usize {
        match self {
            FileData::Png(images) => images.batch as usize,
            _ => 1,
        }
    }

    /// How many bytes encoding one of its files reads (an image's pixels, the samples, the
    /// bytes): what decides whether encoding is quick enough for an async thread.
    pub fn source_len(&self) -> usize {
        match self {
            FileData::Bytes(bytes) => bytes.len(),
            FileData::Png(images) => images.width as usize * images.height as usize * images.channels as usize,
            FileData::Wav(audio) => audio.samples.len() * 4,
            FileData::Latent(latent) => latent.data.len() * 4,
            FileData::AnimatedPng { frames, .. } => frames.data.len(),
        }
    }
}

/// A file an output node asked the host to commit.
#[derive(Debug, Clone)]
pub struct OutputFile {
    /// Output type.
    pub kind: OutputKind,
    /// `filename_prefix`, before numbering.
    pub filename_prefix: String,
    /// Extension for `Bytes`.
    pub extension: String,
    /// Media type for `Bytes`.
    pub content_type: String,
    /// The content.
    pub data: FileData,
    /// A preview (ComfyUI's `temp` folder): dropped after the server's preview retention
    /// rather than kept as long as the job.
    pub temporary: bool,
}
