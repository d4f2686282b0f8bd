//! Turning what an output node returned into files: PNGs (with the workflow in text chunks,
//! as ComfyUI writes them), WAVs, safetensors latents and guest bytes, named after
//! `filename_prefix` with ComfyUI's `_%05d_` numbering.

use std::collections::HashMap;

use crate::compute::values::{AudioClip, LatentBatch};
use crate::runtime::{FileData, OutputFile, OutputKind};

/// One encoded file, ready to store.
#[derive(Debug)]
pub struct EncodedFile {
    /// File name.
    pub name: String,
    /// Output type.
    pub kind: OutputKind,
    /// Media type.
    pub content_type: String,
    /// Content.
    pub bytes: Vec<u8>,
}

/// Per-job file numbering: each prefix counts from 1.
#[derive(Default)]
pub struct Numbering {
    next: HashMap<String, u32>,
}

impl Numbering {
    fn name(&mut self, prefix: &str, extension: &str) -> String {
        let prefix = clean_prefix(prefix);
        let n = self.next.entry(prefix.clone()).or_insert(1);
        let name = format!("{prefix}_{:05}_.{extension}", *n);
        *n += 1;
        name
    }
}

/// Keeps a prefix a relative path of plain segments ("a/b" stays, "../x" and "/x" do not).
fn clean_prefix(prefix: &str) -> String {
    let parts: Vec<&str> = prefix
        .split(['/', '\\'])
        .filter(|p| !p.is_empty() && *p != "." && *p != "..")
        .collect();
    let joined = parts.join("/");
    let cleaned: String = joined.chars().filter(|c| !c.is_control()).take(200).collect();
    if cleaned.is_empty() {
        "weft".to_string()
    } else {
        cleaned
    }
}

/// Encodes `file`; `workflow` goes into PNG text chunks.
pub fn encode(file: &OutputFile, numbering: &mut Numbering, workflow: &str) -> Result<Vec<EncodedFile>, String> {
    let mut out = Vec::new();
    match &file.data {
        FileData::Bytes(bytes) => {
            let extension = if file.extension.is_empty() {
                default_extension(file.kind)
            } else {
                &file.extension
            };
            let content_type = if file.content_type.is_empty() {
                default_content_type(file.kind).to_string()
            } else {
                file.content_type.clone()
            };
            out.push(EncodedFile {
                name: numbering.name(&file.filename_prefix, extension),
                kind: file.kind,
                content_type,
                bytes: bytes.clone(),
            });
        }
        FileData::Png(image) => {
            let text = [("prompt".to_string(), workflow.to_string())];
            for index in 0..image.batch {
                out.push(EncodedFile {
                    name: numbering.name(&file.filename_prefix, "png"),
                    kind: OutputKind::Image,
                    content_type: "image/png".into(),
                    bytes: image.encode_png(index, &text).map_err(|e| e.to_string())?,
                });
            }
        }
        FileData::Wav(audio) => out.push(EncodedFile {
            name: numbering.name(&file.filename_prefix, "wav"),
            kind: OutputKind::Audio,
            content_type: "audio/wav".into(),
            bytes: wav(audio),
        }),
        FileData::Latent(latent) => out.push(EncodedFile {
            name: numbering.name(&file.filename_prefix, "latent"),
            kind: OutputKind::Latent,
            content_type: "application/octet-stream".into(),
            bytes: safetensors(latent),
        }),
    }
    Ok(out)
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
fn wav(audio: &AudioClip) -> Vec<u8> {
    let data_len = (audio.samples.len() * 2) as u32;
    let channels = audio.channels.max(1) as u16;
    let mut out = Vec::with_capacity(44 + data_len as usize);
    out.extend_from_slice(b"RIFF");
    out.extend_from_slice(&(36 + data_len).to_le_bytes());
    out.extend_from_slice(b"WAVEfmt ");
    out.extend_from_slice(&16u32.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&channels.to_le_bytes());
    out.extend_from_slice(&audio.sample_rate.to_le_bytes());
    out.extend_from_slice(&(audio.sample_rate * channels as u32 * 2).to_le_bytes());
    out.extend_from_slice(&(channels * 2).to_le_bytes());
    out.extend_from_slice(&16u16.to_le_bytes());
    out.extend_from_slice(b"data");
    out.extend_from_slice(&data_len.to_le_bytes());
    for s in &audio.samples {
        out.extend_from_slice(&((s.clamp(-1.0, 1.0) * 32767.0).round() as i16).to_le_bytes());
    }
    out
}

/// A safetensors file as ComfyUI's SaveLatent writes it: the `latent_tensor`, and the empty
/// `latent_format_version_0` marker that tells `LoadLatent` the values are not scaled.
fn safetensors(latent: &LatentBatch) -> Vec<u8> {
    let bytes = latent.data.len() * 4;
    let header = serde_json::json!({
        "latent_tensor": {"dtype": "F32", "shape": latent.shape, "data_offsets": [0, bytes]},
        "latent_format_version_0": {"dtype": "F32", "shape": [0], "data_offsets": [bytes, bytes]}
    })
    .to_string();
    let mut header = header.into_bytes();
    while !header.len().is_multiple_of(8) {
        header.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + header.len() + bytes);
    out.extend_from_slice(&(header.len() as u64).to_le_bytes());
    out.extend_from_slice(&header);
    for v in &latent.data {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbering_follows_comfyui_and_prefixes_are_contained() {
        let mut n = Numbering::default();
        assert_eq!(n.name("ComfyUI", "png"), "ComfyUI_00001_.png");
        assert_eq!(n.name("ComfyUI", "png"), "ComfyUI_00002_.png");
        assert_eq!(n.name("../../etc/x", "txt"), "etc/x_00001_.txt");
        assert_eq!(n.name("", "txt"), "weft_00001_.txt");
    }
}
