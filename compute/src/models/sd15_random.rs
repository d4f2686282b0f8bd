//! A deterministic random-weight checkpoint with the exact SD1.5 single-file layout (recipe
//! `sd15-random-v1`): the checkpoint of the ComfyUI parity vectors and the SD1.5-sized model of
//! the benchmarks, where no real weights can be downloaded.
//!
//! The layout (1,130 tensors: names, shapes, kinds) is `compute/assets/sd15-random/layout.tsv`,
//! compiled in. Values, for seed `S` and tensor name `K`:
//! * a splitmix64 stream keyed by the first 8 bytes (little-endian) of `sha256("{S}:{K}")`:
//!   element `i` (row-major) is `mix(key + (i + 1) * 0x9E3779B97F4A7C15)`;
//! * its top 53 bits `m` give `(2m + 1 - 2^53) * a * 2^-53`, uniform on `(-a, a)` with
//!   `a = std * sqrt(3)`, rounded once from float64 to float16 (nearest, ties to even);
//! * `std` is `1 / sqrt(fan_in)` for linear and convolution weights (halved for the VAE
//!   decoder's `conv_out`), `1 / sqrt(768)` for CLIP's embeddings; biases are 0 and norm
//!   weights 1.
//!
//! The file is safetensors, tensors in name order, with one metadata entry; its bytes depend
//! on the seed alone (seed 0: [`SEED0_SHA256`]).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};
use rayon::prelude::*;
use sha2::{Digest, Sha256};

/// The recipe's name, recorded in the file's metadata.
pub const RECIPE: &str = "sd15-random-v1";
/// SHA-256 of the seed-0 checkpoint.
pub const SEED0_SHA256: &str = "aa64b29d75cc3581c40496e21560f885b40078d8af1910f2f2282424b1636fe9";
/// The file name under which [`cached_seed0`] keeps the seed-0 checkpoint: it names the
/// content's hash, so a generator that writes other bytes gets a cache entry of its own
/// rather than a stale one.
pub const SEED0_FILE: &str = "sd15-random-s0-aa64b29d75cc.safetensors";

const LAYOUT: &str = include_str!("../../assets/sd15-random/layout.tsv");
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
/// Width of CLIP ViT-L's embeddings, whose inverse square root is their standard deviation.
const EMBED_WIDTH: f64 = 768.0;
/// The one tensor whose standard deviation is scaled, so that few decoded pixels clip.
const HALVED: &str = "first_stage_model.decoder.conv_out.weight";

/// How a tensor's values are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Weight,
    Zeros,
    Ones,
    Embedding,
}

/// One tensor of the layout.
struct Entry {
    key: &'static str,
    shape: Vec<usize>,
    kind: Kind,
}

impl Entry {
    fn elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// Half-width of the uniform distribution, for the random kinds.
    fn amplitude(&self) -> f64 {
        let std = match self.kind {
            Kind::Embedding => 1.0 / EMBED_WIDTH.sqrt(),
            _ => {
                let fan_in: usize = self.shape[1..].iter().product();
                let factor = if self.key == HALVED { 0.5 } else { 1.0 };
                factor / (fan_in as f64).sqrt()
            }
        };
        std * 3f64.sqrt()
    }
}

fn layout() -> Vec<Entry> {
    LAYOUT
        .lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .map(|line| {
            let mut cols = line.split('\t');
            let (Some(key), Some(shape), Some(kind), None) = (cols.next(), cols.next(), cols.next(), cols.next())
            else {
                panic!("layout.tsv: bad line '{line}'");
            };
            let shape = shape
                .split('x')
                .map(|d| d.parse().expect("layout.tsv: numeric dimension"))
                .collect();
            let kind = match kind {
                "weight" => Kind::Weight,
                "zeros" => Kind::Zeros,
                "ones" => Kind::Ones,
                "embedding" => Kind::Embedding,
                other => panic!("layout.tsv: unknown kind '{other}'"),
            };
            Entry { key, shape, kind }
        })
        .collect()
}

fn splitmix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// `2^exp` exactly (for exponents of normal float64 numbers).
fn pow2(exp: i32) -> f64 {
    f64::from_bits(((1023 + exp) as u64) << 52)
}

/// The float16 bits nearest to `v` (ties to even), rounded once from float64.
fn f16_bits(v: f64) -> u16 {
    let sign = if v.is_sign_negative() { 0x8000 } else { 0 };
    let a = v.abs();
    if a.is_nan() {
        return 0x7e00;
    }
    // At or above 65520 rounds to infinity (65504 is the largest finite float16).
    if a >= 65520.0 {
        return sign | 0x7c00;
    }
    let exp = ((a.to_bits() >> 52) & 0x7ff) as i32 - 1023;
    if exp < -14 {
        // Subnormal float16: multiples of 2^-24 (1024 of them is the smallest normal).
        return sign | (a * pow2(24)).round_ties_even() as u16;
    }
    // 1024..=2048 steps of 2^(exp - 10); 2048 carries into the exponent.
    let steps = (a * pow2(10 - exp)).round_ties_even() as u32;
    sign | ((((exp + 15) as u32) << 10) + steps - 1024) as u16
}

/// The values of one tensor as little-endian float16 bytes.
fn tensor_bytes(seed: u64, entry: &Entry) -> Vec<u8> {
    let n = entry.elements();
    let constant = |bits: u16| bits.to_le_bytes().repeat(n);
    match entry.kind {
        Kind::Zeros => constant(0),
        Kind::Ones => constant(0x3c00),
        Kind::Weight | Kind::Embedding => {
            let digest = Sha256::digest(format!("{seed}:{}", entry.key).as_bytes());
            let key = u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"));
            let scale = entry.amplitude() * pow2(-53);
            let mut out = vec![0u8; 2 * n];
            out.par_chunks_mut(1 << 16).enumerate().for_each(|(c, chunk)| {
                let first = c * (1 << 15);
                for (j, pair) in chunk.chunks_exact_mut(2).enumerate() {
                    let i = (first + j) as u64;
                    let m = (splitmix(key.wrapping_add((i + 1).wrapping_mul(GOLDEN))) >> 11) as i64;
                    let v = (2 * m + 1 - (1i64 << 53)) as f64 * scale;
                    pair.copy_from_slice(&f16_bits(v).to_le_bytes());
                }
            });
            out
        }
    }
}

/// The safetensors header: tensors in name order, back to back, padded with spaces to a
/// multiple of 8 bytes.
fn header(seed: u64, entries: &[Entry]) -> Vec<u8> {
    let settings = format!(r#"{{"dtype": "fp16", "recipe": "{RECIPE}", "seed": {seed}}}"#);
    let mut json = serde_json::Map::new();
    let mut meta = serde_json::Map::new();
    meta.insert("weft.sd15_random".into(), settings.into());
    json.insert("__metadata__".into(), meta.into());
    let mut offset = 0;
    for e in entries {
        let end = offset + 2 * e.elements();
        json.insert(
            e.key.into(),
            serde_json::json!({"dtype": "F16", "shape": e.shape, "data_offsets": [offset, end]}),
        );
        offset = end;
    }
    let mut bytes = serde_json::to_vec(&json).expect("a JSON map serialises");
    bytes.resize(bytes.len().next_multiple_of(8), b' ');
    bytes
}

/// What [`write`] wrote.
#[derive(Debug, Clone)]
pub struct Written {
    /// Tensors.
    pub tensors: usize,
    /// Parameters (elements of all tensors).
    pub parameters: u64,
    /// File size.
    pub bytes: u64,
    /// SHA-256 of the file, lower-case hex.
    pub sha256: String,
}

/// Writes the checkpoint of `seed` to `out` (in place: see [`cached_seed0`] for an atomic
/// write).
pub fn write(out: &Path, seed: u64) -> Result<Written> {
    let entries = layout();
    let file = File::create(out).with_context(|| format!("creating {}", out.display()))?;
    let mut file = BufWriter::with_capacity(1 << 20, file);
    let mut hash = Sha256::new();
    let mut put = |bytes: &[u8]| -> Result<()> {
        hash.update(bytes);
        file.write_all(bytes)
            .with_context(|| format!("writing {}", out.display()))
    };
    let header = header(seed, &entries);
    put(&(header.len() as u64).to_le_bytes())?;
    put(&header)?;
    let mut parameters = 0u64;
    for e in &entries {
        put(&tensor_bytes(seed, e))?;
        parameters += e.elements() as u64;
    }
    file.into_inner()
        .map_err(|e| e.into_error())
        .and_then(|f| f.sync_all())
        .with_context(|| format!("writing {}", out.display()))?;
    Ok(Written {
        tensors: entries.len(),
        parameters,
        bytes: 8 + header.len() as u64 + 2 * parameters,
        sha256: hash.finalize().iter().map(|b| format!("{b:02x}")).collect(),
    })
}

/// The per-machine directory for generated model files: `$WEFT_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/weft`, else `$HOME/.cache/weft`, else `weft` in the temporary directory.
pub fn cache_dir() -> PathBuf {
    let var = |name| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    var("WEFT_CACHE_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("weft")))
        .or_else(|| var("HOME").map(|d| d.join(".cache").join("weft")))
        .unwrap_or_else(|| std::env::temp_dir().join("weft"))
}

/// The seed-0 checkpoint in `dir` ([`SEED0_FILE`]), written there first if absent: into a
/// temporary file, checked against [`SEED0_SHA256`], then renamed, so that a file found
/// under that name is complete. Concurrent callers may each write one; the last rename wins.
pub fn cached_seed0(dir: &Path) -> Result<PathBuf> {
    let path = dir.join(SEED0_FILE);
    if path.is_file() {
        return Ok(path);
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let tmp = dir.join(format!(".{SEED0_FILE}.{}.tmp", std::process::id()));
    let written = write(&tmp, 0);
    let checked = written.and_then(|w| {
        ensure!(
            w.sha256 == SEED0_SHA256,
            "the seed-0 checkpoint has sha256 {}, expected {SEED0_SHA256}",
            w.sha256
        );
        Ok(())
    });
    if let Err(e) = checked.and_then(|()| Ok(std::fs::rename(&tmp, &path)?)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cached_file_is_named_by_its_content_hash() {
        assert!(SEED0_FILE.contains(&SEED0_SHA256[..12]));
    }

    #[test]
    fn float16_rounding_is_single_and_to_even() {
        assert_eq!(f16_bits(1.0), 0x3c00);
        assert_eq!(f16_bits(-2.0), 0xc000);
        assert_eq!(f16_bits(0.0), 0);
        assert_eq!(f16_bits(65504.0), 0x7bff);
        assert_eq!(f16_bits(65520.0), 0x7c00);
        // Halfway between 1 and the next float16 (1 + 2^-10): ties to the even 1.0; a hair
        // above rounds up, although float32 would first round that hair away.
        assert_eq!(f16_bits(1.0 + pow2(-11)), 0x3c00);
        assert_eq!(f16_bits(1.0 + pow2(-11) + pow2(-40)), 0x3c01);
        assert_eq!(f16_bits(1.0 + 3.0 * pow2(-11)), 0x3c02);
        // Subnormals and the carry into the smallest normal.
        assert_eq!(f16_bits(pow2(-24)), 1);
        assert_eq!(f16_bits(pow2(-25)), 0);
        assert_eq!(f16_bits(pow2(-14) - pow2(-26)), 0x0400);
        assert_eq!(f16_bits(-3.0 * pow2(-25)), 0x8002);
    }

    #[test]
    fn layout_is_sd15() {
        let entries = layout();
        assert_eq!(entries.len(), 1130);
        let parameters: usize = entries.iter().map(Entry::elements).sum();
        assert_eq!(parameters, 1_066_235_307);
        assert!(entries.windows(2).all(|w| w[0].key < w[1].key), "sorted by name");
        let sd15 = super::super::checkpoint_layout(&super::super::Sd1Config::sd1());
        for (key, shape) in sd15 {
            let e = entries
                .iter()
                .find(|e| e.key == key)
                .unwrap_or_else(|| panic!("{key} missing"));
            assert_eq!(e.shape, shape, "{key}");
        }
    }

    /// The first values of a tensor, against the recipe's Python reference.
    #[test]
    fn values_follow_the_recipe() {
        let entries = layout();
        let e = entries
            .iter()
            .find(|e| e.key == "model.diffusion_model.out.2.weight")
            .expect("present");
        let bytes = tensor_bytes(0, e);
        assert_eq!(bytes.len(), 2 * 4 * 320 * 9);
        let first: Vec<u16> = bytes[..8]
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect();
        // numpy's output for this tensor with seed 0.
        assert_eq!(first, [0x2213, 0x2424, 0x1b92, 0x24ee]);
    }
}
