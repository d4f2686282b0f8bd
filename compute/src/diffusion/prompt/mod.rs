//! `CLIPTextEncode` as ComfyUI does it for SD1: the prompt's weights parsed
//! (`(word:1.2)`, `((word))`, `\(`), its tokens laid into chunks of 77, `embedding:NAME`
//! words replaced by textual-inversion vectors, every chunk encoded, weighted tokens
//! interpolated against the empty prompt's encoding (`(z - z_empty) * w + z_empty`), and
//! the chunks joined along the token axis: `[1, 77 * chunks, width]`.

mod chunks;
mod embedding;
mod weights;

use candle_core::Tensor;

pub use chunks::{tokenize, tokenize_for, Token, Weighted};
pub use embedding::{write_random_embedding, Embedding, EmbeddingLookup, CLIP_L_KEY};

use crate::interrupt::Interrupt;
use crate::models::ClipText;
use crate::tokenizer::{BOS, CONTEXT_LENGTH, EOS};
use crate::ComputeError;

/// Encodes `text` with the first `layers` layers of `clip` (final layer norm applied):
/// `[1, 77 * chunks, width]` float32. `lookup` resolves `embedding:NAME` words (without one
/// they are plain text).
pub fn encode_prompt(
    clip: &ClipText,
    layers: usize,
    text: &str,
    lookup: Option<&dyn EmbeddingLookup>,
) -> Result<Tensor, ComputeError> {
    encode_prompt_interruptible(clip, layers, text, lookup, Interrupt::NEVER)
}

/// [`encode_prompt`], asking `stop` before every CLIP layer (then
/// [`ComputeError::Interrupted`]).
pub fn encode_prompt_interruptible(
    clip: &ClipText,
    layers: usize,
    text: &str,
    lookup: Option<&dyn EmbeddingLookup>,
    stop: Interrupt<'_>,
) -> Result<Tensor, ComputeError> {
    let chunks = tokenize(text, lookup)?;
    encode_chunks_interruptible(clip, layers, &chunks, stop)
}

/// ComfyUI's `encode_token_weights` on tokenized chunks.
pub fn encode_chunks(clip: &ClipText, layers: usize, chunks: &[Vec<Weighted>]) -> Result<Tensor, ComputeError> {
    encode_chunks_interruptible(clip, layers, chunks, Interrupt::NEVER)
}

/// [`encode_chunks`], asking `stop` before every CLIP layer.
pub fn encode_chunks_interruptible(
    clip: &ClipText,
    layers: usize,
    chunks: &[Vec<Weighted>],
    stop: Interrupt<'_>,
) -> Result<Tensor, ComputeError> {
    let spec = EncodeSpec {
        layers,
        norm_hidden: true,
        pad_token: EOS,
        pooled: false,
    };
    Ok(encode_with(clip, &spec, chunks, stop)?.0)
}

/// How one text encoder encodes a prompt.
#[derive(Debug, Clone, Copy)]
pub struct EncodeSpec {
    /// Encoder layers whose output is the encoding.
    pub layers: usize,
    /// Whether the final layer norm is applied to it.
    pub norm_hidden: bool,
    /// The token after a chunk's end token (the end token itself, or bigG's 0).
    pub pad_token: u32,
    /// Whether to give the pooled output too.
    pub pooled: bool,
}

/// ComfyUI's `encode_token_weights` on tokenized chunks (padded with the end token, as
/// [`tokenize`] gives them) for an encoder of `spec`: `[1, 77 * chunks, width]`, and the
/// first chunk's pooled output `[1, width]` when asked.
pub fn encode_with(
    clip: &ClipText,
    spec: &EncodeSpec,
    chunks: &[Vec<Weighted>],
    stop: Interrupt<'_>,
) -> Result<(Tensor, Option<Tensor>), ComputeError> {
    let failed = |e: candle_core::Error| stop.explain("text encoding", e);
    let width = clip.width();
    for (token, _) in chunks.iter().flatten() {
        if let Token::Vector(embedding, _) = token {
            if embedding.width != width {
                return Err(ComputeError::invalid(format!(
                    "embedding {:?} has vectors of {} values; this CLIP takes {width}",
                    embedding.name, embedding.width
                )));
            }
        }
    }
    let weighted = chunks.iter().flatten().any(|(_, w)| *w != 1.0);
    let mut inputs: Vec<Vec<Token>> = chunks.iter().map(|c| padded(c, spec.pad_token)).collect();
    if weighted {
        // ComfyUI's empty prompt: start, end, padding.
        let mut empty = vec![Token::Id(BOS), Token::Id(EOS)];
        empty.resize(CONTEXT_LENGTH, Token::Id(spec.pad_token));
        inputs.push(empty);
    }
    let tokens = inputs.first().map_or(0, Vec::len);
    let embeds = input_embeddings(clip, &inputs).map_err(failed)?;
    let device = embeds.device().clone();
    let pooled_at: Option<Vec<usize>> = spec
        .pooled
        .then(|| inputs.iter().map(|c| pooling_position(c)).collect());
    let encoded = crate::on_workers(|| clip.encode(&embeds, spec.layers, spec.norm_hidden, pooled_at.as_deref(), stop))
        .map_err(failed)?;
    let pooled = match encoded.pooled {
        Some(p) => Some(p.narrow(0, 0, 1).map_err(failed)?),
        None => None,
    };
    let mut values: Vec<f32> = encoded.hidden.flatten_all().and_then(|t| t.to_vec1()).map_err(failed)?;
    if weighted {
        interpolate_weights(&mut values, chunks, tokens * width, width);
        values.truncate(chunks.len() * tokens * width);
    }
    let hidden = Tensor::from_vec(values, (1, chunks.len() * tokens, width), &device).map_err(failed)?;
    Ok((hidden, pooled))
}

/// `chunk`'s tokens with those after its end token replaced by `pad`.
fn padded(chunk: &[Weighted], pad: u32) -> Vec<Token> {
    let end = chunk.iter().position(|(t, _)| matches!(t, Token::Id(EOS)));
    chunk
        .iter()
        .enumerate()
        .map(|(i, (t, _))| match (t, end) {
            (Token::Id(EOS), Some(e)) if i > e => Token::Id(pad),
            _ => t.clone(),
        })
        .collect()
}

/// Where ComfyUI takes the pooled output: the first position of the largest token id (the
/// end token; an embedding vector counts as 0).
fn pooling_position(chunk: &[Token]) -> usize {
    let id = |t: &Token| match t {
        Token::Id(id) => *id,
        Token::Vector(..) => 0,
    };
    let max = chunk.iter().map(id).max().unwrap_or(0);
    chunk.iter().position(|t| id(t) == max).unwrap_or(0)
}

/// Each weighted token's row moved from the empty prompt's (the last `per_chunk` values
/// after the chunks): `(z - z_empty) * w + z_empty`.
fn interpolate_weights(values: &mut [f32], chunks: &[Vec<Weighted>], per_chunk: usize, width: usize) {
    let (chunk_values, empty) = values.split_at_mut(chunks.len() * per_chunk);
    for (chunk, z) in chunks.iter().zip(chunk_values.chunks_exact_mut(per_chunk)) {
        for (((_, weight), row), base) in chunk
            .iter()
            .zip(z.chunks_exact_mut(width))
            .zip(empty.chunks_exact(width))
        {
            if *weight != 1.0 {
                let w = *weight as f32;
                row.iter_mut().zip(base).for_each(|(v, &e)| *v = (*v - e) * w + e);
            }
        }
    }
}

/// `[chunks, tokens, width]`: each token's vocabulary embedding, or its embedding vector.
fn input_embeddings(clip: &ClipText, inputs: &[Vec<Token>]) -> candle_core::Result<Tensor> {
    let width = clip.width();
    let ids: Vec<u32> = inputs
        .iter()
        .flatten()
        .map(|t| match t {
            Token::Id(id) => *id,
            Token::Vector(..) => 0,
        })
        .collect();
    let looked_up = clip.token_embeddings(&ids)?;
    let tokens = inputs.first().map_or(0, Vec::len);
    if !inputs.iter().flatten().any(|t| matches!(t, Token::Vector(..))) {
        return looked_up.reshape((inputs.len(), tokens, width));
    }
    let device = looked_up.device().clone();
    let mut values: Vec<f32> = looked_up.flatten_all()?.to_vec1()?;
    for (token, row) in inputs.iter().flatten().zip(values.chunks_exact_mut(width)) {
        if let Token::Vector(embedding, index) = token {
            row.copy_from_slice(embedding.row(*index));
        }
    }
    Tensor::from_vec(values, (inputs.len(), tokens, width), &device)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::loader::tiny_test_models;
    use std::sync::Arc;

    #[test]
    fn weights_interpolate_against_the_empty_prompt() {
        let (_dir, models) = tiny_test_models(11).unwrap();
        let clip = &models.text[0];
        let layers = clip.layer_count();
        let plain = encode_prompt(clip, layers, "a red apple", None).unwrap();
        assert_eq!(plain.dims(), &[1, 77, 32]);
        // A weight of 1 changes nothing.
        let one = encode_prompt(clip, layers, "a (red:1.0) apple", None).unwrap();
        assert_eq!(crate::max_abs_diff(&plain, &one), 0.0);
        let empty = encode_prompt(clip, layers, "", None).unwrap();
        let heavy = encode_prompt(clip, layers, "a (red:1.5) apple", None).unwrap();
        let row = |t: &Tensor, i: usize| -> Vec<f32> { t.get(0).unwrap().get(i).unwrap().to_vec1().unwrap() };
        // Token 2 ("red") moved away from the empty prompt's encoding, others untouched.
        let (p, h, e) = (row(&plain, 2), row(&heavy, 2), row(&empty, 2));
        for ((p, h), e) in p.iter().zip(&h).zip(&e) {
            assert!((h - ((p - e) * 1.5 + e)).abs() < 1e-5);
        }
        assert_eq!(row(&plain, 1), row(&heavy, 1));
        assert_eq!(row(&plain, 3), row(&heavy, 3));
        // A long prompt: three chunks, each encoded on its own.
        let long = "a red apple on a table ".repeat(30);
        let out = encode_prompt(clip, layers, &long, None).unwrap();
        assert_eq!(out.dims(), &[1, 3 * 77, 32]);
        let chunks = tokenize(&long, None).unwrap();
        let second = encode_chunks(clip, layers, &chunks[1..2]).unwrap();
        assert!(crate::max_abs_diff(&out.narrow(1, 77, 77).unwrap(), &second) < 1e-5);
    }

    #[test]
    fn embedding_vectors_replace_token_embeddings() {
        let (_dir, models) = tiny_test_models(12).unwrap();
        let clip = &models.text[0];
        // An embedding equal to the token "apple"'s own embedding encodes as "apple".
        let apple = crate::tokenizer::ClipTokenizer::shared().encode("apple");
        let vectors: Vec<f32> = clip
            .token_embeddings(&apple)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        struct One(Embedding);
        impl EmbeddingLookup for One {
            fn find_for(&self, name: &str, _key: &str) -> Result<Option<Embedding>, ComputeError> {
                Ok((name == self.0.name).then(|| self.0.clone()))
            }
        }
        let lookup = One(Embedding {
            name: "fruit".into(),
            vectors,
            width: 32,
        });
        let layers = clip.layer_count();
        let words = encode_prompt(clip, layers, "a red apple", Some(&lookup)).unwrap();
        let embedded = encode_prompt(clip, layers, "a red embedding:fruit", Some(&lookup)).unwrap();
        assert!(crate::max_abs_diff(&words, &embedded) < 1e-6);
        // Vectors of another width are refused.
        let wide = Embedding {
            name: "wide".into(),
            vectors: vec![0.0; 64],
            width: 64,
        };
        let chunks = vec![vec![(Token::Vector(Arc::new(wide), 0), 1.0)]];
        assert!(encode_chunks(clip, layers, &chunks).is_err());
    }
}
