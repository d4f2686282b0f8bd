//! What a running node can do besides computing its outputs.

use crate::{host, Audio, FileData, Image, Latent, NodeError, OutputFile, OutputKind};

/// Passed to every node's `execute`: progress, cancellation, and the files an output
/// node commits.
#[derive(Default)]
pub struct Context {
    files: Vec<OutputFile>,
}

impl Context {
    /// A context with no files yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reports progress: `step` of `steps`, with an optional message (`"text"` or `None`).
    pub fn progress<'a>(&self, step: u32, steps: u32, message: impl Into<Option<&'a str>>) {
        host::progress(step, steps, message.into());
    }

    /// True once the job has been canceled. Long loops should check it and return
    /// early (see [`Context::check_canceled`]); the host interrupts a node that does not.
    pub fn is_canceled(&self) -> bool {
        host::is_canceled()
    }

    /// `Err` with code `canceled` once the job has been canceled, for use with `?`.
    pub fn check_canceled(&self) -> Result<(), NodeError> {
        if self.is_canceled() {
            Err(NodeError::canceled())
        } else {
            Ok(())
        }
    }

    /// Commits a file as a job output (output nodes only).
    pub fn commit(&mut self, file: OutputFile) {
        self.files.push(file);
    }

    /// Commits every image of `images` as a PNG, encoded by the host.
    pub fn save_png(&mut self, filename_prefix: impl Into<String>, images: Image) {
        self.commit(host_encoded(OutputKind::Image, filename_prefix, FileData::Png(images)));
    }

    /// Shows every image of `images` to the caller as a temporary PNG (ComfyUI's `temp`
    /// folder, as `PreviewImage` does): listed with the job's outputs, then dropped after the
    /// server's preview retention.
    pub fn preview_png(&mut self, filename_prefix: impl Into<String>, images: Image) {
        let mut file = host_encoded(OutputKind::Image, filename_prefix, FileData::Png(images));
        file.temporary = true;
        self.commit(file);
    }

    /// Commits every image of `images` as one frame of an animated PNG (a `video` output),
    /// each shown `frame_ms` milliseconds, compressed at zlib level `compress_level` (0-9).
    pub fn save_animated_png(
        &mut self,
        filename_prefix: impl Into<String>,
        images: Image,
        frame_ms: u32,
        compress_level: u8,
    ) {
        let frames = crate::ApngFrames {
            frames: images,
            frame_ms,
            compress_level,
        };
        self.commit(host_encoded(
            OutputKind::Video,
            filename_prefix,
            FileData::AnimatedPng(frames),
        ));
    }

    /// Commits `audio` as a WAV file, encoded by the host.
    pub fn save_wav(&mut self, filename_prefix: impl Into<String>, audio: Audio) {
        self.commit(host_encoded(OutputKind::Audio, filename_prefix, FileData::Wav(audio)));
    }

    /// Commits `latent` as a safetensors file, written by the host.
    pub fn save_latent(&mut self, filename_prefix: impl Into<String>, latent: Latent) {
        self.commit(host_encoded(
            OutputKind::Latent,
            filename_prefix,
            FileData::Latent(latent),
        ));
    }

    /// Commits `text` as a UTF-8 `.txt` file (`text/plain`).
    pub fn save_text(&mut self, filename_prefix: impl Into<String>, text: impl Into<String>) {
        self.save_bytes(
            OutputKind::Text,
            filename_prefix,
            "txt",
            "text/plain",
            text.into().into_bytes(),
        );
    }

    /// Commits bytes the node produced itself, with their extension (no dot) and media type.
    pub fn save_bytes(
        &mut self,
        kind: OutputKind,
        filename_prefix: impl Into<String>,
        extension: impl Into<String>,
        content_type: impl Into<String>,
        bytes: Vec<u8>,
    ) {
        self.commit(OutputFile {
            kind,
            filename_prefix: filename_prefix.into(),
            extension: extension.into(),
            content_type: content_type.into(),
            data: FileData::Bytes(bytes),
            temporary: false,
        });
    }

    /// The files committed so far.
    pub fn files(&self) -> &[OutputFile] {
        &self.files
    }

    /// Takes the committed files.
    pub fn into_files(self) -> Vec<OutputFile> {
        self.files
    }
}

fn host_encoded(kind: OutputKind, prefix: impl Into<String>, data: FileData) -> OutputFile {
    OutputFile {
        kind,
        filename_prefix: prefix.into(),
        extension: String::new(),
        content_type: String::new(),
        data,
        temporary: false,
    }
}
