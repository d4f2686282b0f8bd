//! ComfyUI's `SDTokenizer.tokenize_with_weights`: weighted segments tokenized (each segment
//! whole, split only where ` embedding:` starts a textual-inversion name), then laid into
//! chunks of 77 positions: the start token, up to 75 tokens, the end token, padding. A run
//! of fewer than 8 tokens that does not fit moves whole to the next chunk; a longer one is
//! broken where the chunk ends.

use std::sync::Arc;

use super::embedding::{Embedding, EmbeddingLookup, CLIP_L_KEY};
use super::weights::weighted_segments;
use crate::tokenizer::{ClipTokenizer, BOS, CONTEXT_LENGTH, EOS};
use crate::ComputeError;

/// What a prompt names a textual-inversion embedding with.
const EMBEDDING_PREFIX: &str = "embedding:";

/// Runs of at least this many tokens may be broken across chunks.
const MAX_WORD_LENGTH: usize = 8;

/// One position of the text encoder's input.
#[derive(Debug, Clone, PartialEq)]
pub enum Token {
    /// A vocabulary token.
    Id(u32),
    /// Row `.1` of an embedding.
    Vector(Arc<Embedding>, usize),
}

/// A token and its weight.
pub type Weighted = (Token, f64);

/// The chunks of [`CONTEXT_LENGTH`] weighted tokens that `text` becomes. With `lookup`,
/// `embedding:NAME` words are embeddings (an unknown name is an error, where ComfyUI warns
/// and drops it); without, they are plain text, as in ComfyUI without an embeddings folder.
pub fn tokenize(text: &str, lookup: Option<&dyn EmbeddingLookup>) -> Result<Vec<Vec<Weighted>>, ComputeError> {
    tokenize_for(text, lookup, CLIP_L_KEY)
}

/// [`tokenize`] for the text encoder ComfyUI calls `key` (`clip_l`, `clip_g`), whose
/// embeddings are read from that key of a file that holds several.
pub fn tokenize_for(
    text: &str,
    lookup: Option<&dyn EmbeddingLookup>,
    key: &str,
) -> Result<Vec<Vec<Weighted>>, ComputeError> {
    let tokenizer = ClipTokenizer::shared();
    let mut groups: Vec<Vec<Weighted>> = Vec::new();
    for (segment, weight) in weighted_segments(text).map_err(ComputeError::invalid)? {
        for word in split_embeddings(&segment) {
            let mut rest = word.as_str();
            let leftover;
            if let (Some(name), Some(lookup)) = (rest.strip_prefix(EMBEDDING_PREFIX), lookup) {
                let (embedding, after) = find_embedding(name.trim_matches('\n'), lookup, key)?;
                let embedding = Arc::new(embedding);
                groups.push(
                    (0..embedding.rows())
                        .map(|row| (Token::Vector(embedding.clone(), row), weight))
                        .collect(),
                );
                if after.is_empty() {
                    continue;
                }
                leftover = after;
                rest = &leftover;
            }
            groups.push(
                tokenizer
                    .encode(rest)
                    .into_iter()
                    .map(|id| (Token::Id(id), weight))
                    .collect(),
            );
        }
    }
    Ok(into_chunks(groups))
}

/// `segment` cut before every ` embedding:` / `\nembedding:` (the separator's first
/// character dropped), empty pieces left out (ComfyUI's `re.split`).
fn split_embeddings(segment: &str) -> Vec<String> {
    let mut pieces = Vec::new();
    let mut start = 0;
    let mut from = 0;
    while let Some(found) = segment[from..].find(EMBEDDING_PREFIX).map(|i| from + i) {
        let before = segment[..found].chars().next_back();
        if matches!(before, Some(' ') | Some('\n')) {
            pieces.push(segment[start..found - 1].to_string());
            start = found;
        }
        from = found + EMBEDDING_PREFIX.len();
    }
    pieces.push(segment[start..].to_string());
    pieces.retain(|p| !p.is_empty());
    pieces
}

/// The embedding at the start of `name` (up to the first whitespace) and the text after it
/// (`_try_get_embedding`): a name not found is tried again without surrounding commas.
fn find_embedding(name: &str, lookup: &dyn EmbeddingLookup, key: &str) -> Result<(Embedding, String), ComputeError> {
    let mut words = name.split_whitespace();
    let first = words.next().unwrap_or("");
    let after = words.collect::<Vec<_>>().join(" ");
    let missing = || ComputeError::invalid(format!("embedding:{first} is not in the embeddings folder"));
    if first.is_empty() {
        return Err(ComputeError::invalid("`embedding:` names no embedding"));
    }
    if let Some(found) = lookup.find_for(first, key)? {
        return Ok((found, after));
    }
    let stripped = first.trim_matches(',');
    if stripped.len() < first.len() && !stripped.is_empty() {
        if let Some(found) = lookup.find_for(stripped, key)? {
            // ComfyUI keeps the text past the stripped name's length.
            let tail = first.get(stripped.len()..).unwrap_or("");
            return Ok((found, format!("{tail} {after}")));
        }
    }
    Err(missing())
}

/// Lays token runs into chunks of [`CONTEXT_LENGTH`] the way ComfyUI does.
fn into_chunks(groups: Vec<Vec<Weighted>>) -> Vec<Vec<Weighted>> {
    let start = || (Token::Id(BOS), 1.0);
    let end = || (Token::Id(EOS), 1.0);
    let mut chunks = Vec::new();
    let mut chunk = vec![start()];
    for mut group in groups {
        let large = group.len() >= MAX_WORD_LENGTH;
        while !group.is_empty() {
            if group.len() + chunk.len() > CONTEXT_LENGTH - 1 {
                let room = CONTEXT_LENGTH - chunk.len() - 1;
                if large {
                    let rest = group.split_off(room.min(group.len()));
                    chunk.append(&mut group);
                    group = rest;
                    chunk.push(end());
                } else {
                    chunk.push(end());
                    chunk.extend(std::iter::repeat_with(end).take(room));
                }
                chunks.push(std::mem::replace(&mut chunk, vec![start()]));
            } else {
                chunk.append(&mut group);
            }
        }
    }
    chunk.push(end());
    let room = CONTEXT_LENGTH - chunk.len();
    chunk.extend(std::iter::repeat_with(end).take(room));
    chunks.push(chunk);
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Finds `name`, `name.safetensors`-free, in a fixed list.
    struct Fixed(Vec<Embedding>);

    impl EmbeddingLookup for Fixed {
        fn find_for(&self, name: &str, _key: &str) -> Result<Option<Embedding>, ComputeError> {
            if name.contains("..") {
                return Err(ComputeError::invalid("outside"));
            }
            Ok(self.0.iter().find(|e| e.name == name).cloned())
        }
    }

    fn emb(name: &str, rows: usize) -> Embedding {
        Embedding {
            name: name.into(),
            vectors: (0..rows * 4).map(|i| i as f32).collect(),
            width: 4,
        }
    }

    /// The ids and weights of the chunks, embedding rows as `name#row`.
    fn flat(chunks: &[Vec<Weighted>]) -> Vec<Vec<(String, f64)>> {
        chunks
            .iter()
            .map(|c| {
                c.iter()
                    .map(|(t, w)| match t {
                        Token::Id(id) => (id.to_string(), *w),
                        Token::Vector(e, row) => (format!("{}#{row}", e.name), *w),
                    })
                    .collect()
            })
            .collect()
    }

    fn ids(text: &str) -> Vec<(String, f64)> {
        let chunks = tokenize(text, None).unwrap();
        assert_eq!(chunks.len(), 1);
        let mut v = flat(&chunks).remove(0);
        let end = v.iter().position(|(t, _)| t == "49407").unwrap();
        v.truncate(end + 1);
        v
    }

    fn pair(id: u32, w: f64) -> (String, f64) {
        (id.to_string(), w)
    }

    /// Expected values from ComfyUI's tokenizer on the same vocabulary.
    #[test]
    fn weighted_tokens() {
        assert_eq!(
            ids("a photo of a (cat:1.2)"),
            vec![
                pair(49406, 1.0),
                pair(320, 1.0),
                pair(1125, 1.0),
                pair(539, 1.0),
                pair(320, 1.0),
                pair(2368, 1.2),
                pair(49407, 1.0)
            ]
        );
        assert_eq!(
            ids("((a)) [photo]"),
            vec![
                pair(49406, 1.0),
                pair(320, 1.2100000000000002),
                pair(314, 1.0),
                pair(1125, 1.0),
                pair(316, 1.0),
                pair(49407, 1.0)
            ]
        );
        let empty = tokenize("", None).unwrap();
        assert_eq!(empty.len(), 1);
        assert_eq!(empty[0].len(), CONTEXT_LENGTH);
        assert_eq!(flat(&empty)[0][..2], [pair(49406, 1.0), pair(49407, 1.0)]);
    }

    #[test]
    fn long_prompts_make_chunks() {
        // One segment of 200 tokens: broken at 75 tokens per chunk.
        let text = "word ".repeat(200);
        let chunks = tokenize(&text, None).unwrap();
        assert_eq!(chunks.len(), 3);
        assert!(chunks.iter().all(|c| c.len() == CONTEXT_LENGTH));
        let f = flat(&chunks);
        let count = |c: &Vec<(String, f64)>| c.iter().filter(|(t, _)| t != "49406" && t != "49407").count();
        assert_eq!([count(&f[0]), count(&f[1]), count(&f[2])], [75, 75, 50]);
        // Short weighted runs that do not fit move whole to the next chunk.
        let text = format!("{}(a b c:1.5)", "word ".repeat(74));
        let f = flat(&tokenize(&text, None).unwrap());
        assert_eq!(f.len(), 2);
        assert_eq!(count(&f[0]), 74);
        assert_eq!(f[0][75], pair(49407, 1.0));
        assert_eq!(
            f[1][1..5],
            [pair(320, 1.5), pair(321, 1.5), pair(322, 1.5), pair(49407, 1.0)]
        );
    }

    #[test]
    fn embeddings_replace_words() {
        let lookup = Fixed(vec![emb("style", 2), emb("x", 1)]);
        let f = flat(&tokenize("a embedding:style, (embedding:x:1.3) cat", Some(&lookup)).unwrap());
        assert_eq!(
            f[0][..8],
            [
                pair(49406, 1.0),
                pair(320, 1.0),
                ("style#0".into(), 1.0),
                ("style#1".into(), 1.0),
                pair(267, 1.0),
                ("x#0".into(), 1.3),
                pair(2368, 1.0),
                pair(49407, 1.0)
            ]
        );
        // Without an embeddings folder the words are text.
        assert!(ids("embedding:style").len() > 3);
        // Unknown, empty or refused names are errors.
        for text in ["embedding:nothing", "a embedding:", "embedding:../x", "embedding:,,"] {
            assert!(tokenize(text, Some(&lookup)).is_err(), "{text}");
        }
        // "embedding:" inside a word is text.
        assert!(tokenize("myembedding:nothing", Some(&lookup)).is_ok());
    }
}
