//! CLIP's byte-pair-encoding tokenizer, as SD1 text encoders expect it.
//!
//! The vocabulary is OpenAI's `bpe_simple_vocab_16e6.txt.gz`, shipped in `compute/assets/clip/`
//! under its MIT licence (see the `LICENSE` there) and compiled into the binary, so nothing
//! is fetched at run time. The algorithm follows CLIP's `SimpleTokenizer`: whitespace is
//! collapsed, text lower-cased, split by CLIP's pattern, each piece mapped through the
//! byte-to-unicode table and merged by rank.
//!
//! Not done: `ftfy` mojibake repair and HTML unescaping (both no-ops on ordinary prompts).
//! ComfyUI's prompt weighting, embeddings and chunks of 77 are `diffusion::prompt`'s.

use std::collections::HashMap;
use std::io::Read;
use std::sync::OnceLock;

use regex::Regex;

/// `<|startoftext|>`.
pub(crate) const BOS: u32 = 49406;
/// `<|endoftext|>`; SD1 also pads with it.
pub(crate) const EOS: u32 = 49407;
/// Token positions of CLIP's text encoder.
pub(crate) const CONTEXT_LENGTH: usize = 77;

const VOCAB_GZ: &[u8] = include_bytes!("../assets/clip/bpe_simple_vocab_16e6.txt.gz");
/// CLIP uses the first 49152 - 256 - 2 merges of the file.
const MERGES: usize = 49152 - 256 - 2;

/// A CLIP BPE tokenizer.
pub(crate) struct ClipTokenizer {
    encoder: HashMap<String, u32>,
    ranks: HashMap<(String, String), usize>,
    byte_chars: [char; 256],
    pattern: Regex,
    cache: std::sync::Mutex<HashMap<String, Vec<u32>>>,
}

/// GPT-2 / CLIP's reversible byte -> printable character table.
fn bytes_to_unicode() -> Vec<(u8, char)> {
    let mut bs: Vec<u32> = (u32::from('!')..=u32::from('~'))
        .chain(u32::from('¡')..=u32::from('¬'))
        .chain(u32::from('®')..=u32::from('ÿ'))
        .collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    bs.into_iter()
        .zip(cs)
        .map(|(b, c)| (b as u8, char::from_u32(c).expect("valid char")))
        .collect()
}

impl ClipTokenizer {
    /// The tokenizer with CLIP's shipped vocabulary (parsed once per process).
    pub(crate) fn shared() -> &'static ClipTokenizer {
        static T: OnceLock<ClipTokenizer> = OnceLock::new();
        T.get_or_init(|| ClipTokenizer::from_gz(VOCAB_GZ).expect("the shipped CLIP vocabulary is valid"))
    }

    /// Builds a tokenizer from a gzipped `bpe_simple_vocab_16e6.txt`.
    pub(crate) fn from_gz(gz: &[u8]) -> anyhow::Result<ClipTokenizer> {
        let mut text = String::new();
        flate2::read::GzDecoder::new(gz).read_to_string(&mut text)?;
        ClipTokenizer::from_merges(&text)
    }

    /// Builds a tokenizer from the text of `bpe_simple_vocab_16e6.txt`.
    pub(crate) fn from_merges(text: &str) -> anyhow::Result<ClipTokenizer> {
        let merges: Vec<(String, String)> = text
            .split('\n')
            .skip(1)
            .take(MERGES)
            .map(|line| {
                let mut it = line.split_whitespace();
                match (it.next(), it.next(), it.next()) {
                    (Some(a), Some(b), None) => Ok((a.to_string(), b.to_string())),
                    _ => anyhow::bail!("bad merge line '{line}'"),
                }
            })
            .collect::<anyhow::Result<_>>()?;
        anyhow::ensure!(merges.len() == MERGES, "{} merges, expected {MERGES}", merges.len());
        let table = bytes_to_unicode();
        let mut byte_chars = ['\0'; 256];
        for &(b, c) in &table {
            byte_chars[b as usize] = c;
        }
        let mut vocab: Vec<String> = table.iter().map(|&(_, c)| c.to_string()).collect();
        let words: Vec<String> = vocab.iter().map(|v| format!("{v}</w>")).collect();
        vocab.extend(words);
        for (a, b) in &merges {
            vocab.push(format!("{a}{b}"));
        }
        vocab.push("<|startoftext|>".into());
        vocab.push("<|endoftext|>".into());
        let encoder: HashMap<String, u32> = vocab.into_iter().enumerate().map(|(i, v)| (v, i as u32)).collect();
        anyhow::ensure!(
            encoder.len() == EOS as usize + 1,
            "vocabulary has {} entries",
            encoder.len()
        );
        let ranks = merges.into_iter().enumerate().map(|(i, m)| (m, i)).collect();
        let pattern =
            Regex::new(r"<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+")?;
        Ok(ClipTokenizer {
            encoder,
            ranks,
            byte_chars,
            pattern,
            cache: std::sync::Mutex::new(HashMap::new()),
        })
    }

    /// Token ids of `text` without start/end tokens.
    pub(crate) fn encode(&self, text: &str) -> Vec<u32> {
        let clean = text.split_whitespace().collect::<Vec<_>>().join(" ").to_lowercase();
        let mut out = Vec::new();
        for m in self.pattern.find_iter(&clean) {
            let piece: String = m.as_str().bytes().map(|b| self.byte_chars[b as usize]).collect();
            out.extend(self.bpe(&piece));
        }
        out
    }

    fn bpe(&self, piece: &str) -> Vec<u32> {
        if let Some(ids) = self.cache.lock().expect("tokenizer cache").get(piece) {
            return ids.clone();
        }
        let chars: Vec<char> = piece.chars().collect();
        let Some((last, init)) = chars.split_last() else {
            return Vec::new();
        };
        let mut word: Vec<String> = init.iter().map(|c| c.to_string()).collect();
        word.push(format!("{last}</w>"));
        while word.len() > 1 {
            let best = word
                .windows(2)
                .filter_map(|w| self.ranks.get(&(w[0].clone(), w[1].clone())).map(|&r| (r, w)))
                .min_by_key(|(r, _)| *r);
            let Some((_, pair)) = best else { break };
            let (a, b) = (pair[0].clone(), pair[1].clone());
            let mut merged = Vec::with_capacity(word.len());
            let mut i = 0;
            while i < word.len() {
                if i + 1 < word.len() && word[i] == a && word[i + 1] == b {
                    merged.push(format!("{a}{b}"));
                    i += 2;
                } else {
                    merged.push(word[i].clone());
                    i += 1;
                }
            }
            word = merged;
        }
        // Every merge result and every byte symbol is in the vocabulary.
        let ids: Vec<u32> = word.iter().filter_map(|w| self.encoder.get(w).copied()).collect();
        let mut cache = self.cache.lock().expect("tokenizer cache");
        if cache.len() < 10_000 {
            cache.insert(piece.to_string(), ids.clone());
        }
        ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(text: &str) -> Vec<u32> {
        let mut v = vec![BOS];
        v.extend(ClipTokenizer::shared().encode(text));
        v.push(EOS);
        v
    }

    #[test]
    fn known_ids() {
        // Values published with the reference tokenizers (OpenAI CLIP / Hugging Face).
        assert_eq!(ids("a photo of a cat"), [49406, 320, 1125, 539, 320, 2368, 49407]);
        assert_eq!(ids("a photo of a dog"), [49406, 320, 1125, 539, 320, 1929, 49407]);
        assert_eq!(ids("Hello, world!"), [49406, 3306, 267, 1002, 256, 49407]);
        assert_eq!(ids("  HELLO   World  "), [49406, 3306, 1002, 49407]);
        assert_eq!(ids("a spooky scene"), [49406, 320, 15369, 3562, 49407]);
        assert_eq!(ids(""), [49406, 49407]);
    }

    /// The ids of the first chunk of 77 that ComfyUI's tokenizer makes of `text`.
    fn first_chunk(text: &str) -> Vec<u32> {
        use crate::diffusion::prompt::{tokenize, Token};
        tokenize(text, None).unwrap()[0]
            .iter()
            .map(|(t, _)| match t {
                Token::Id(id) => *id,
                Token::Vector(..) => u32::MAX,
            })
            .collect()
    }

    #[test]
    fn padding_and_chunks() {
        let t = ClipTokenizer::shared();
        let p = first_chunk("a photo of a cat");
        assert_eq!(p.len(), CONTEXT_LENGTH);
        assert_eq!(&p[..7], &[49406, 320, 1125, 539, 320, 2368, 49407]);
        assert!(p[7..].iter().all(|&i| i == EOS));
        let long = first_chunk(&"word ".repeat(200));
        assert_eq!(long.len(), CONTEXT_LENGTH);
        assert_eq!(long[0], BOS);
        assert_eq!(long[76], EOS);
        assert!(long[1..76].iter().all(|&i| i != EOS));
        // Any input tokenizes without panicking and stays in the vocabulary.
        for s in ["\u{0}\u{ffff}日本語 🎨 é", "<|endoftext|> x", "''''"] {
            assert!(t.encode(s).iter().all(|&i| i <= EOS), "{s}");
        }
    }
}
