//! Turning what an output node returned into files, named after `filename_prefix` with
//! ComfyUI's `_%05d_` numbering: PNGs with the workflow in a `prompt` text chunk (as ComfyUI
//! writes them, within a size bound), WAVs, safetensors latents and guest bytes. The byte encodings are the
//! codecs' ([`weft_compute::codecs`], [`weft_v2m::wav`]).

use std::collections::HashMap;

use weft_compute::codecs;
use weft_compute::interrupt::Interrupt;
use weft_compute::values::AudioClip;
use weft_compute::ComputeError;

use crate::runtime::{FileData, OutputFile, OutputKind};

/// One encoded file, ready to store.
#[derive(Debug)]
pub(crate) struct EncodedFile {
    /// File name.
    pub name: String,
    /// Output type.
    pub kind: OutputKind,
    /// Media type.
    pub content_type: String,
    /// Content.
    pub bytes: Vec<u8>,
}

/// Largest workflow embedded in a PNG (ComfyUI's `prompt` text chunk). A larger one is left
/// out of the job's PNGs, so that a batch cannot multiply a big request.
pub(crate) const MAX_EMBEDDED_WORKFLOW: usize = 128 * 1024;

/// Most workflow bytes embedded across one job's PNGs; the PNGs after that go without.
pub(crate) const MAX_EMBEDDED_PER_JOB: usize = 8 * 1024 * 1024;

/// What one job's files share: ComfyUI's numbering (each prefix counts from 1), and the
/// workflow bytes embedded in its PNGs so far.
#[derive(Default)]
pub(crate) struct JobFiles {
    next: HashMap<String, u32>,
    embedded: usize,
}

impl JobFiles {
    fn name(&mut self, prefix: &str, extension: &str) -> String {
        let prefix = clean_prefix(prefix);
        let n = self.next.entry(prefix.clone()).or_insert(1);
        let name = format!("{prefix}_{:05}_.{extension}", *n);
        *n += 1;
        name
    }

    /// The text chunks of the job's next PNG: the workflow, while it and the job's total
    /// stay within [`MAX_EMBEDDED_WORKFLOW`] and [`MAX_EMBEDDED_PER_JOB`]; none after.
    fn png_text(&mut self, workflow: &str) -> Vec<(String, String)> {
        if workflow.len() > MAX_EMBEDDED_WORKFLOW || self.embedded + workflow.len() > MAX_EMBEDDED_PER_JOB {
            return Vec::new();
        }
        self.embedded += workflow.len();
        vec![("prompt".to_string(), workflow.to_string())]
    }
}

/// Keeps a prefix a relative path of plain segments ("a/b" stays, "../x" and "/x" do not).
fn clean_prefix(prefix: &str) -> String {
    // Controls go first, so that removing them cannot make an empty, "." or ".." segment.
    let visible: String = prefix.chars().filter(|c| !c.is_control()).collect();
    let parts: Vec<&str> = visible
        .split(['/', '\\'])
        .filter(|p| !p.is_empty() && *p != "." && *p != "..")
        .collect();
    let cleaned: String = parts.join("/").chars().take(200).collect();
    if cleaned.is_empty() {
        "weft".to_string()
    } else {
        cleaned
    }
}

/// Why an output was not encoded.
#[derive(Debug)]
pub(crate) enum EncodeError {
    /// Its `stop` fired: the job was canceled or the node's time ran out.
    Interrupted,
    /// It cannot be encoded, for this reason.
    Failed(String),
}

/// Encodes file `index` of `file` (the images of a PNG batch are its files, one each; see
/// [`FileData::files`](crate::runtime::FileData::files)), so that a batch is encoded, checked
/// against the job's bounds and stored one file at a time. `workflow` goes into PNG text
/// chunks within the job's embedding bounds. A large image's encode asks `stop` as it goes.
pub(crate) fn encode(
    file: &OutputFile,
    index: usize,
    job: &mut JobFiles,
    workflow: &str,
    stop: Interrupt<'_>,
) -> Result<EncodedFile, EncodeError> {
    Ok(match &file.data {
        FileData::Bytes(bytes) => {
            let extension = if is_plain_extension(&file.extension) {
                &file.extension
            } else {
                default_extension(file.kind)
            };
            let content_type = if file.content_type.is_empty() {
                default_content_type(file.kind).to_string()
            } else {
                file.content_type.clone()
            };
            EncodedFile {
                name: job.name(&file.filename_prefix, extension),
                kind: file.kind,
                content_type,
                bytes: bytes.clone(),
            }
        }
        FileData::Png(image) => {
            let index = u32::try_from(index)
                .ok()
                .filter(|&i| i < image.batch)
                .ok_or_else(|| EncodeError::Failed(format!("image {index} of a batch of {}", image.batch)))?;
            let text = job.png_text(workflow);
            EncodedFile {
                name: job.name(&file.filename_prefix, "png"),
                kind: OutputKind::Image,
                content_type: "image/png".into(),
                bytes: codecs::encode_png_interruptible(image, index, &text, stop).map_err(|e| match e {
                    ComputeError::Interrupted => EncodeError::Interrupted,
                    e => EncodeError::Failed(e.to_string()),
                })?,
            }
        }
        FileData::Wav(audio) => EncodedFile {
            name: job.name(&file.filename_prefix, "wav"),
            kind: OutputKind::Audio,
            content_type: "audio/wav".into(),
            bytes: wav(audio).map_err(EncodeError::Failed)?,
        },
        FileData::AnimatedPng {
            frames,
            frame_ms,
            compress_level,
        } => {
            let text = job.png_text(workflow);
            EncodedFile {
                name: job.name(&file.filename_prefix, "png"),
                kind: OutputKind::Video,
                content_type: "image/png".into(),
                bytes: codecs::encode_apng(frames, u64::from(*frame_ms), *compress_level, &text, stop).map_err(
                    |e| match e {
                        ComputeError::Interrupted => EncodeError::Interrupted,
                        e => EncodeError::Failed(e.to_string()),
                    },
                )?,
            }
        }
        FileData::Latent(latent) => EncodedFile {
            name: job.name(&file.filename_prefix, "latent"),
            kind: OutputKind::Latent,
            content_type: "application/octet-stream".into(),
            bytes: codecs::encode_latent(latent),
        },
    })
}

/// Whether a plugin's `extension` may end a file name: 1 to 10 ASCII letters and digits, so
/// no separator, dot or control character reaches a name clients save files by. Any other
/// extension is replaced by the output kind's default.
fn is_plain_extension(extension: &str) -> bool {
    (1..=10).contains(&extension.len()) && extension.bytes().all(|b| b.is_ascii_alphanumeric())
}

fn default_extension(kind: OutputKind) -> &'static str {
    match kind {
        OutputKind::Image => "png",
        OutputKind::Video => "mp4",
        OutputKind::Audio => "wav",
        OutputKind::Text => "txt",
        OutputKind::File => "bin",
        OutputKind::Latent => "latent",
    }
}

fn default_content_type(kind: OutputKind) -> &'static str {
    match kind {
        OutputKind::Image => "image/png",
        OutputKind::Video => "video/mp4",
        OutputKind::Audio => "audio/wav",
        OutputKind::Text => "text/plain; charset=utf-8",
        OutputKind::File | OutputKind::Latent => "application/octet-stream",
    }
}

/// 16-bit PCM WAV.
fn wav(audio: &AudioClip) -> Result<Vec<u8>, String> {
    let channels = u16::try_from(audio.channels.max(1))
        .map_err(|_| format!("{} audio channels do not fit a WAV file", audio.channels))?;
    weft_v2m::wav::encode_pcm16(audio.sample_rate, channels, &audio.samples).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbering_follows_comfyui_and_prefixes_are_contained() {
        let mut n = JobFiles::default();
        assert_eq!(n.name("ComfyUI", "png"), "ComfyUI_00001_.png");
        assert_eq!(n.name("ComfyUI", "png"), "ComfyUI_00002_.png");
        assert_eq!(n.name("../../etc/x", "txt"), "etc/x_00001_.txt");
        assert_eq!(n.name("", "txt"), "weft_00001_.txt");
        assert_eq!(n.name("\r/x", "txt"), "x_00001_.txt", "a control-only segment");
        assert_eq!(n.name(".\u{1}./y", "txt"), "y_00001_.txt", "a '..' hidden by a control");
    }

    #[test]
    fn the_workflow_is_embedded_within_its_bounds() {
        let mut job = JobFiles::default();
        assert_eq!(job.png_text("{}").len(), 1, "a small workflow goes into every PNG");
        assert!(job.png_text(&"x".repeat(MAX_EMBEDDED_WORKFLOW + 1)).is_empty());
        let big = "x".repeat(MAX_EMBEDDED_WORKFLOW);
        let fits = (MAX_EMBEDDED_PER_JOB - 2) / MAX_EMBEDDED_WORKFLOW;
        for _ in 0..fits {
            assert_eq!(job.png_text(&big).len(), 1);
        }
        assert!(job.png_text(&big).is_empty(), "the job's embedding budget is spent");
    }

    #[test]
    fn only_plain_extensions_are_kept() {
        assert!(is_plain_extension("png"));
        assert!(is_plain_extension("safetensor"));
        for bad in ["", "png/../../../etc/x", "a.b", "exe ", "abcdefghijk", "p\u{0}g", "é"] {
            assert!(!is_plain_extension(bad), "{bad:?}");
        }
    }
}
