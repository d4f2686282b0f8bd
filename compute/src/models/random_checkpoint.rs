//! Deterministic random-weight checkpoints with the exact single-file layouts of real models,
//! where no real weights can be downloaded: recipe `sd15-random-v1` ([`SD15`], the checkpoint of
//! the ComfyUI parity vectors and the SD1.5-sized model of the benchmarks) and `sdxl-random-v1`
//! ([`SDXL`], the SDXL base layout).
//!
//! A [`Recipe`] is data: a layout table compiled in from `compute/assets/*/layout.tsv` (names,
//! shapes, kinds; the format is in the tables' headers), a metadata key and the seed-0 file's
//! hash. Values, for seed `S` and tensor name `K`, the same for both recipes:
//! * a splitmix64 stream keyed by the first 8 bytes (little-endian) of `sha256("{S}:{K}")`:
//!   element `i` (row-major) is `mix(key + (i + 1) * 0x9E3779B97F4A7C15)`;
//! * its top 53 bits `m` give `(2m + 1 - 2^53) * a * 2^-53`, uniform on `(-a, a)` with
//!   `a = std * sqrt(3)`, rounded once from float64 to float16 or float32 (nearest, ties to
//!   even);
//! * `std` is `1 / sqrt(fan_in)` for linear and convolution weights (halved for the VAE
//!   decoder's `conv_out`), `1 / sqrt(width)` for the text encoders' embeddings; biases are 0,
//!   norm weights 1, CLIP's `position_ids` int64 `0, 1, ..` and OpenCLIP's `logit_scale`
//!   ComfyUI's initial 4.6055.
//!
//! The file is safetensors: the int64 tensor first, then the others in name order (the order of
//! the safetensors library), with one metadata entry; its bytes depend on the recipe, seed and
//! precision alone. It is written a piece at a time, the next piece made on rayon's pool while
//! the last one is hashed and written, so memory stays at a few megabytes whatever its size.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use anyhow::{anyhow, ensure, Context, Result};
use rayon::prelude::*;
use sha2::{Digest, Sha256};

/// One recipe of random-weight checkpoint: what [`Recipe::write`] needs besides the seed.
#[derive(Debug, Clone, Copy)]
pub struct Recipe {
    /// The recipe's name, recorded in the file's metadata.
    pub name: &'static str,
    /// The file's one metadata key; its value is `{"dtype", "recipe", "seed"}` as sorted JSON.
    pub metadata_key: &'static str,
    /// The layout table: one tensor, or one run of tensors, a line (format in its header).
    pub layout: &'static str,
    /// SHA-256 of the float16 seed-0 checkpoint, lower-case hex.
    pub seed0_sha256: &'static str,
    /// The file name under which [`Recipe::cached_seed0`] keeps the seed-0 checkpoint: it names
    /// the content's hash, so a generator that writes other bytes gets a cache entry of its own
    /// rather than a stale one.
    pub seed0_file: &'static str,
}

/// Recipe `sd15-random-v1`: the SD1.5 single-file layout (1,130 tensors, 2.1 GB in float16).
pub const SD15: Recipe = Recipe {
    name: "sd15-random-v1",
    metadata_key: "weft.sd15_random",
    layout: include_str!("../../assets/sd15-random/layout.tsv"),
    seed0_sha256: "aa64b29d75cc3581c40496e21560f885b40078d8af1910f2f2282424b1636fe9",
    seed0_file: "sd15-random-s0-aa64b29d75cc.safetensors",
};

/// Recipe `sd15-inpaint-random-v1`: [`SD15`]'s layout with the UNet's input convolution
/// taking 9 channels (the latent, the mask, the masked image), as SD1.5 inpainting
/// checkpoints have it; values as [`SD15`]'s, so every other tensor equals its.
pub const SD15_INPAINT: Recipe = Recipe {
    name: "sd15-inpaint-random-v1",
    metadata_key: "weft.sd15_inpaint_random",
    layout: include_str!("../../assets/sd15-inpaint-random/layout.tsv"),
    seed0_sha256: "f9b22da57f5d2c479ff55b783c0555883f58b37bf2eb258170a757738980cdc5",
    seed0_file: "sd15-inpaint-random-s0-f9b22da57f5d.safetensors",
};

/// Recipe `sdxl-random-v1`: the SDXL base single-file layout (2,515 tensors, 6.9 GB in
/// float16), values as [`SD15`]'s.
pub const SDXL: Recipe = Recipe {
    name: "sdxl-random-v1",
    metadata_key: "weft.sdxl_random",
    layout: include_str!("../../assets/sdxl-random/layout.tsv"),
    seed0_sha256: "937a6c69eb0d36f381b7b3c4ea9240014ffa8d2173f23ea7054488c8b8c968c8",
    seed0_file: "sdxl-random-s0-937a6c69eb0d.safetensors",
};

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
/// The one tensor whose standard deviation is scaled (by 0.5), so that few decoded pixels clip.
const HALVED: &str = "first_stage_model.decoder.conv_out.weight";
/// ComfyUI's initial `logit_scale` of its CLIP text models.
const LOGIT_SCALE: f64 = 4.6055;
/// Elements made and written at a time: bounds the memory of [`Recipe::write`].
const PIECE_ELEMENTS: usize = 1 << 22;
/// Elements of one rayon task while making a piece.
const TASK_ELEMENTS: usize = 1 << 15;

/// The element type of the floating-point tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    /// IEEE half precision, the recipes' default.
    #[default]
    Fp16,
    /// IEEE single precision: twice the file size.
    Fp32,
}

impl Precision {
    /// The name in the file's metadata and on the command line: `fp16` or `fp32`.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp16 => "fp16",
            Precision::Fp32 => "fp32",
        }
    }

    fn safetensors_dtype(self) -> &'static str {
        match self {
            Precision::Fp16 => "F16",
            Precision::Fp32 => "F32",
        }
    }

    fn size(self) -> usize {
        match self {
            Precision::Fp16 => 2,
            Precision::Fp32 => 4,
        }
    }

    /// `v` rounded once to this precision, little-endian, into `out` (exactly [`Self::size`]).
    fn encode(self, v: f64, out: &mut [u8]) {
        match self {
            Precision::Fp16 => out.copy_from_slice(&f16_bits(v).to_le_bytes()),
            // `as` rounds to nearest, ties to even.
            Precision::Fp32 => out.copy_from_slice(&(v as f32).to_le_bytes()),
        }
    }
}

impl FromStr for Precision {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fp16" => Ok(Precision::Fp16),
            "fp32" => Ok(Precision::Fp32),
            other => Err(format!("unknown precision '{other}' (fp16 or fp32)")),
        }
    }
}

/// How a tensor's values are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Weight,
    Embedding,
    Zeros,
    Ones,
    ArangeI64,
    LogitScale,
}

impl Kind {
    fn parse(name: &str) -> Option<Kind> {
        Some(match name {
            "weight" => Kind::Weight,
            "embedding" => Kind::Embedding,
            "zeros" => Kind::Zeros,
            "ones" => Kind::Ones,
            "arange_i64" => Kind::ArangeI64,
            "logit_scale" => Kind::LogitScale,
            _ => return None,
        })
    }
}

/// One tensor of a layout.
#[derive(Debug)]
struct Entry {
    key: String,
    shape: Vec<usize>,
    kind: Kind,
}

impl Entry {
    fn elements(&self) -> usize {
        self.shape.iter().product()
    }

    fn element_size(&self, precision: Precision) -> usize {
        match self.kind {
            Kind::ArangeI64 => 8,
            _ => precision.size(),
        }
    }

    fn safetensors_dtype(&self, precision: Precision) -> &'static str {
        match self.kind {
            Kind::ArangeI64 => "I64",
            _ => precision.safetensors_dtype(),
        }
    }

    /// Half-width of the uniform distribution, for the random kinds: `std * sqrt(3)`, with the
    /// fan-in (or the embedding's width) the product of the dimensions after the first.
    fn amplitude(&self) -> f64 {
        let fan_in: usize = self.shape.iter().skip(1).product();
        let factor = if self.key == HALVED { 0.5 } else { 1.0 };
        factor / (fan_in as f64).sqrt() * 3f64.sqrt()
    }
}

/// The tensors of a layout table, in the file's order: int64 first, then by name.
fn parse_layout(table: &str) -> Result<Vec<Entry>> {
    let mut entries = Vec::new();
    for (number, line) in table.lines().enumerate() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = || anyhow!("layout line {}: '{line}'", number + 1);
        let mut cols = line.split('\t');
        let (Some(keys), Some(shape), Some(kind), None) = (cols.next(), cols.next(), cols.next(), cols.next()) else {
            return Err(bad());
        };
        let shape: Vec<usize> = match shape {
            "scalar" => Vec::new(),
            dims => dims
                .split('x')
                .map(str::parse)
                .collect::<Result<_, _>>()
                .map_err(|_| bad())?,
        };
        let kind = Kind::parse(kind).ok_or_else(bad)?;
        for key in expand_ranges(keys).ok_or_else(bad)? {
            entries.push(Entry {
                key,
                shape: shape.clone(),
                kind,
            });
        }
    }
    entries.sort_by(|a, b| (a.kind != Kind::ArangeI64, &a.key).cmp(&(b.kind != Kind::ArangeI64, &b.key)));
    if let Some(w) = entries.windows(2).find(|w| w[0].key == w[1].key) {
        return Err(anyhow!("layout: '{}' twice", w[0].key));
    }
    Ok(entries)
}

/// The keys a layout key stands for: each `{a..b}` in it is each of `a..=b`, in order.
fn expand_ranges(key: &str) -> Option<Vec<String>> {
    let Some(open) = key.find('{') else {
        return Some(vec![key.to_owned()]);
    };
    let close = open + key[open..].find('}')?;
    let (first, last) = key[open + 1..close].split_once("..")?;
    let (first, last): (usize, usize) = (first.parse().ok()?, last.parse().ok()?);
    if first > last {
        return None;
    }
    let (head, tails) = (&key[..open], expand_ranges(&key[close + 1..])?);
    Some(
        (first..=last)
            .flat_map(|v| tails.iter().map(move |tail| format!("{head}{v}{tail}")))
            .collect(),
    )
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

/// The key of a tensor's splitmix64 stream: the first 8 bytes of `sha256("{seed}:{key}")`.
fn stream_key(seed: u64, key: &str) -> u64 {
    let digest = Sha256::digest(format!("{seed}:{key}").as_bytes());
    u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"))
}

/// Elements `first..` of `entry`'s values for `seed`, little-endian, filling `out` (a whole
/// number of elements).
fn fill(entry: &Entry, seed: u64, precision: Precision, first: usize, out: &mut [u8]) {
    let constant = |v: f64, out: &mut [u8]| {
        let mut one = [0u8; 4];
        precision.encode(v, &mut one[..precision.size()]);
        for element in out.chunks_exact_mut(precision.size()) {
            element.copy_from_slice(&one[..precision.size()]);
        }
    };
    match entry.kind {
        Kind::Zeros => out.fill(0),
        Kind::Ones => constant(1.0, out),
        Kind::LogitScale => constant(LOGIT_SCALE, out),
        Kind::ArangeI64 => {
            for (element, i) in out.chunks_exact_mut(8).zip(first as i64..) {
                element.copy_from_slice(&i.to_le_bytes());
            }
        }
        Kind::Weight | Kind::Embedding => {
            let (key, size) = (stream_key(seed, &entry.key), precision.size());
            let scale = entry.amplitude() * pow2(-53);
            out.par_chunks_mut(TASK_ELEMENTS * size)
                .enumerate()
                .for_each(|(task, chunk)| {
                    let start = (first + task * TASK_ELEMENTS) as u64;
                    for (element, i) in chunk.chunks_exact_mut(size).zip(start..) {
                        let m = (splitmix(key.wrapping_add((i + 1).wrapping_mul(GOLDEN))) >> 11) as i64;
                        precision.encode((2 * m + 1 - (1i64 << 53)) as f64 * scale, element);
                    }
                });
        }
    }
}

/// The safetensors header: tensors back to back in `entries`' order, padded with spaces to a
/// multiple of 8 bytes (without the 8-byte length before it).
fn header(recipe: &Recipe, seed: u64, precision: Precision, entries: &[Entry]) -> Vec<u8> {
    let settings = format!(
        r#"{{"dtype": "{}", "recipe": "{}", "seed": {seed}}}"#,
        precision.name(),
        recipe.name
    );
    // serde_json's `preserve_order`: entries stay in insertion order.
    let mut json = serde_json::Map::new();
    let mut meta = serde_json::Map::new();
    meta.insert(recipe.metadata_key.into(), settings.into());
    json.insert("__metadata__".into(), meta.into());
    let mut offset = 0;
    for e in entries {
        let end = offset + e.elements() * e.element_size(precision);
        json.insert(
            e.key.clone(),
            serde_json::json!({"dtype": e.safetensors_dtype(precision), "shape": e.shape, "data_offsets": [offset, end]}),
        );
        offset = end;
    }
    let mut bytes = serde_json::to_vec(&json).expect("a JSON map serialises");
    bytes.resize(bytes.len().next_multiple_of(8), b' ');
    bytes
}

/// What [`Recipe::write`] wrote.
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

impl Recipe {
    /// Writes the checkpoint of `seed` to `out` (in place: see [`Recipe::cached_seed0`] for an
    /// atomic write).
    pub fn write(&self, out: &Path, seed: u64, precision: Precision) -> Result<Written> {
        let file = File::create(out).with_context(|| format!("creating {}", out.display()))?;
        let mut file = BufWriter::with_capacity(1 << 20, file);
        let written = self
            .write_to(&mut file, seed, precision)
            .with_context(|| format!("writing {}", out.display()))?;
        file.into_inner()
            .map_err(|e| e.into_error())
            .and_then(|f| f.sync_all())
            .with_context(|| format!("writing {}", out.display()))?;
        Ok(written)
    }

    /// Writes the checkpoint's bytes to `sink`, a piece at a time: the next piece is made while
    /// the last one is hashed and written.
    fn write_to(&self, sink: &mut (impl Write + Send), seed: u64, precision: Precision) -> Result<Written> {
        let entries = parse_layout(self.layout)?;
        let header = header(self, seed, precision, &entries);
        let mut hash = Sha256::new();
        let mut put = |bytes: &[u8]| {
            hash.update(bytes);
            sink.write_all(bytes)
        };
        put(&(header.len() as u64).to_le_bytes())?;
        put(&header)?;
        let (mut ready, mut next) = (Vec::new(), Vec::new());
        let mut bytes = 8 + header.len() as u64;
        for e in &entries {
            let size = e.element_size(precision);
            for first in (0..e.elements()).step_by(PIECE_ELEMENTS) {
                next.resize(size * PIECE_ELEMENTS.min(e.elements() - first), 0);
                let (sunk, ()) = rayon::join(|| put(&ready), || fill(e, seed, precision, first, &mut next));
                sunk?;
                bytes += next.len() as u64;
                std::mem::swap(&mut ready, &mut next);
            }
        }
        put(&ready)?;
        Ok(Written {
            tensors: entries.len(),
            parameters: entries.iter().map(|e| e.elements() as u64).sum(),
            bytes,
            sha256: hash.finalize().iter().map(|b| format!("{b:02x}")).collect(),
        })
    }

    /// The float16 seed-0 checkpoint in `dir` ([`Recipe::seed0_file`]), written there first if
    /// absent: into a temporary file, checked against [`Recipe::seed0_sha256`], then renamed, so
    /// that a file found under that name is complete. Concurrent callers may each write one;
    /// the last rename wins.
    pub fn cached_seed0(&self, dir: &Path) -> Result<PathBuf> {
        let path = dir.join(self.seed0_file);
        if path.is_file() {
            return Ok(path);
        }
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let tmp = dir.join(format!(".{}.{}.tmp", self.seed0_file, std::process::id()));
        let written = self.write(&tmp, 0, Precision::Fp16);
        let checked = written.and_then(|w| {
            ensure!(
                w.sha256 == self.seed0_sha256,
                "the seed-0 {} checkpoint has sha256 {}, expected {}",
                self.name,
                w.sha256,
                self.seed0_sha256
            );
            Ok(())
        });
        if let Err(e) = checked.and_then(|()| Ok(std::fs::rename(&tmp, &path)?)) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        Ok(path)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn hex_sha256(bytes: &[u8]) -> String {
        Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
    }

    fn entry<'a>(entries: &'a [Entry], key: &str) -> &'a Entry {
        entries
            .iter()
            .find(|e| e.key == key)
            .unwrap_or_else(|| panic!("{key} missing"))
    }

    /// A whole tensor's bytes.
    fn tensor_bytes(e: &Entry, seed: u64, precision: Precision) -> Vec<u8> {
        let mut out = vec![0u8; e.elements() * e.element_size(precision)];
        fill(e, seed, precision, 0, &mut out);
        out
    }

    /// The whole file of `recipe`, in memory.
    fn file_bytes(recipe: &Recipe, seed: u64, precision: Precision) -> (Vec<u8>, Written) {
        let mut out = Vec::new();
        let written = recipe.write_to(&mut out, seed, precision).expect("written");
        (out, written)
    }

    #[test]
    fn the_cached_files_are_named_by_their_content_hash() {
        for recipe in [SD15, SD15_INPAINT, SDXL] {
            assert!(
                recipe.seed0_file.contains(&recipe.seed0_sha256[..12]),
                "{}",
                recipe.name
            );
        }
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
    fn ranges_expand_in_order() {
        assert_eq!(expand_ranges("a.b").expect("plain"), ["a.b"]);
        assert_eq!(
            expand_ranges("x.{1..2}.y.{9..10}.z").expect("two ranges"),
            ["x.1.y.9.z", "x.1.y.10.z", "x.2.y.9.z", "x.2.y.10.z"]
        );
        assert_eq!(expand_ranges("x.{2..1}"), None);
        assert_eq!(expand_ranges("x.{1..2"), None);
        assert!(parse_layout("a\t1x2\tweight\nb\t3\tnoise\n").is_err());
        assert!(
            parse_layout("a.{0..1}\t2\tzeros\na.1\t2\tzeros\n").is_err(),
            "a key twice"
        );
    }

    #[test]
    fn layout_is_sd15() {
        let entries = parse_layout(SD15.layout).expect("parses");
        assert_eq!(entries.len(), 1130);
        let parameters: usize = entries.iter().map(Entry::elements).sum();
        assert_eq!(parameters, 1_066_235_307);
        assert!(entries.windows(2).all(|w| w[0].key < w[1].key), "sorted by name");
        let sd15 = super::super::checkpoint_layout(&super::super::ModelConfig::sd1());
        for (key, shape) in sd15 {
            assert_eq!(entry(&entries, &key).shape, shape, "{key}");
        }
    }

    #[test]
    fn inpainting_layout_is_sd15_with_a_nine_channel_input() {
        let entries = parse_layout(SD15_INPAINT.layout).expect("parses");
        assert_eq!(entries.len(), 1130);
        let parameters: usize = entries.iter().map(Entry::elements).sum();
        assert_eq!(parameters, 1_066_235_307 + 320 * 5 * 9);
        let cfg = super::super::ModelConfig {
            inpainting: true,
            ..super::super::ModelConfig::sd1()
        };
        for (key, shape) in super::super::checkpoint_layout(&cfg) {
            assert_eq!(entry(&entries, &key).shape, shape, "{key}");
        }
    }

    #[test]
    fn layout_is_sdxl() {
        let entries = parse_layout(SDXL.layout).expect("parses");
        assert_eq!(entries.len(), 2515);
        let parameters: usize = entries.iter().map(Entry::elements).sum();
        assert_eq!(parameters, 3_468_837_945);
        assert_eq!(
            entries[0].key,
            "conditioner.embedders.0.transformer.text_model.embeddings.position_ids"
        );
        assert!(
            entries[1..].windows(2).all(|w| w[0].key < w[1].key),
            "then sorted by name"
        );
        let count = |prefix: &str| entries.iter().filter(|e| e.key.starts_with(prefix)).count();
        assert_eq!(count("model.diffusion_model."), 1680);
        assert_eq!(count("conditioner.embedders.0.transformer.text_model."), 197);
        assert_eq!(count("conditioner.embedders.1.model."), 390);
        assert_eq!(count("first_stage_model."), 248);
        let logit_scale = entry(&entries, "conditioner.embedders.1.model.logit_scale");
        assert!(logit_scale.shape.is_empty() && logit_scale.elements() == 1);
        // The header, length included, and the file size, against the Python reference.
        let header = header(&SDXL, 0, Precision::Fp16, &entries);
        let mut prefixed = (header.len() as u64).to_le_bytes().to_vec();
        prefixed.extend_from_slice(&header);
        assert_eq!(prefixed.len(), 364_896);
        assert_eq!(
            hex_sha256(&prefixed),
            "25f055119c1bd09048ac2f3fa0fbfcbbb513ea2dc0062e354bb45be71d429c3c"
        );
        let data: usize = entries
            .iter()
            .map(|e| e.elements() * e.element_size(Precision::Fp16))
            .sum();
        assert_eq!(prefixed.len() + data, 6_938_041_248);
    }

    /// The first values of an SD1.5 tensor, against the recipe's Python reference.
    #[test]
    fn values_follow_the_recipe() {
        let entries = parse_layout(SD15.layout).expect("parses");
        let bytes = tensor_bytes(
            entry(&entries, "model.diffusion_model.out.2.weight"),
            0,
            Precision::Fp16,
        );
        assert_eq!(bytes.len(), 2 * 4 * 320 * 9);
        let first: Vec<u16> = bytes[..8]
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect();
        // numpy's output for this tensor with seed 0.
        assert_eq!(first, [0x2213, 0x2424, 0x1b92, 0x24ee]);
    }

    /// Whole seed-0 SDXL tensors of every new kind, against `make_sdxl_random.py`'s.
    #[test]
    fn sdxl_tensors_follow_the_recipe() {
        let entries = parse_layout(SDXL.layout).expect("parses");
        let cases = [
            (
                "conditioner.embedders.1.model.text_projection",
                "05bbdc182f7abb24e10ebcb74fce430bdf58d40ffc29025643fc27bfe1a0fee9",
            ),
            (
                "conditioner.embedders.1.model.positional_embedding",
                "273372aeccb8b59aebde50d518fb8e2f5fee91dbdbac6614c09aad52d4dde4d2",
            ),
            (
                "conditioner.embedders.1.model.logit_scale",
                "d7ed4b7099d1162111cc99bc871391bab6e36385c7c084fd8f60e57c567d9ca8",
            ),
            (
                "conditioner.embedders.0.transformer.text_model.embeddings.position_ids",
                "0c360bd8b8049d9e1e239e19ab46457f58685af5c4c2068a32b5c794a9e87d18",
            ),
            (
                "model.diffusion_model.label_emb.0.0.weight",
                "6769d4bbe3afec0c92e414efb47cb74ebcbe6099e2f88de6babdf2cf30e790d0",
            ),
        ];
        for (key, sha256) in cases {
            assert_eq!(
                hex_sha256(&tensor_bytes(entry(&entries, key), 0, Precision::Fp16)),
                sha256,
                "{key}"
            );
        }
    }

    /// A tensor made in pieces is the tensor made at once.
    #[test]
    fn pieces_join_up() {
        let e = Entry {
            key: "k".into(),
            shape: vec![3, 40_001],
            kind: Kind::Weight,
        };
        let i = Entry {
            key: "i".into(),
            shape: vec![1, 77],
            kind: Kind::ArangeI64,
        };
        for (e, precision) in [(&e, Precision::Fp16), (&e, Precision::Fp32), (&i, Precision::Fp16)] {
            let whole = tensor_bytes(e, 5, precision);
            let size = e.element_size(precision);
            let cut = 37 * size;
            let (mut head, mut tail) = (vec![0u8; cut], vec![0u8; whole.len() - cut]);
            fill(e, 5, precision, 0, &mut head);
            fill(e, 5, precision, 37, &mut tail);
            assert_eq!([head, tail].concat(), whole);
        }
    }

    /// Tiny layouts with every kind, written whole, against the files `make_sdxl_random.py` and
    /// `make_sd15_random.py` write for them (`--layout`, seeds 7 and 3).
    #[test]
    fn tiny_files_match_the_python_scripts() {
        let sdxl = Recipe {
            layout: "conditioner.embedders.0.transformer.text_model.embeddings.position_ids\t1x77\tarange_i64\n\
                conditioner.embedders.1.model.logit_scale\tscalar\tlogit_scale\n\
                conditioner.embedders.1.model.positional_embedding\t3x1280\tembedding\n\
                conditioner.embedders.0.transformer.text_model.embeddings.token_embedding.weight\t2x768\tembedding\n\
                conditioner.embedders.1.model.transformer.resblocks.0.attn.in_proj_weight\t6x1280\tweight\n\
                conditioner.embedders.1.model.transformer.resblocks.0.attn.in_proj_bias\t6\tzeros\n\
                first_stage_model.decoder.conv_out.weight\t3x8x3x3\tweight\n\
                model.diffusion_model.out.0.weight\t5\tones\n\
                model.diffusion_model.input_blocks.0.0.weight\t4x4x3x3\tweight\n",
            ..SDXL
        };
        let sd15 = Recipe {
            layout: "# a comment\n\
                cond_stage_model.transformer.text_model.embeddings.position_embedding.weight\t3x768\tembedding\n\
                first_stage_model.decoder.conv_out.weight\t3x8x3x3\tweight\n\
                first_stage_model.decoder.conv_out.bias\t3\tzeros\n\
                model.diffusion_model.out.0.weight\t5\tones\n\
                model.diffusion_model.input_blocks.0.0.weight\t4x4x3x3\tweight\n",
            ..SD15
        };
        let cases = [
            (
                sdxl,
                7,
                Precision::Fp16,
                28648,
                "121d48716101a4b9f542b8d735b3e0527c18aeebfcfbaafdf131733f278a6c71",
            ),
            (
                sdxl,
                7,
                Precision::Fp32,
                55504,
                "ceda671caab543ad55be4c872eba9783b4e566598116981fed1998db1be8d18f",
            ),
            (
                sd15,
                3,
                Precision::Fp16,
                6000,
                "91d708b6cfab59db492f30118e913d2cc8a71306165578be4900b70690186101",
            ),
            (
                sd15,
                3,
                Precision::Fp32,
                11352,
                "b9565c3c4974ff259506eebc5f9ef312130e8e09045d119b8a22443f0e25394b",
            ),
        ];
        for (recipe, seed, precision, size, sha256) in cases {
            let (bytes, written) = file_bytes(&recipe, seed, precision);
            let what = format!("{} {}", recipe.name, precision.name());
            assert_eq!((bytes.len(), written.bytes), (size, size as u64), "{what}");
            assert_eq!(hex_sha256(&bytes), sha256, "{what}");
            assert_eq!(written.sha256, sha256, "{what}");
        }
    }
}
