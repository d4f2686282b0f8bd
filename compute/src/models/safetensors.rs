//! A validating reader for single-file `.safetensors` checkpoints.
//!
//! Format: an 8-byte little-endian header length `N`, `N` bytes of JSON mapping tensor names to
//! `{dtype, shape, data_offsets: [begin, end]}` (offsets relative to the data section after the
//! header) plus an optional `__metadata__` string map, then the tensor bytes.
//!
//! Everything is checked before any tensor is touched: the header size is capped, offsets must
//! lie inside the file, byte lengths must match dtype x shape, and tensors must not overlap.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use half::{bf16, f16};
use rayon::prelude::*;

/// Default cap on the JSON header size (100 MiB, as the reference implementation uses).
pub const DEFAULT_MAX_HEADER: u64 = 100 * 1024 * 1024;

/// Why a checkpoint could not be used.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// I/O failure.
    #[error("{path}: {source}")]
    Io {
        /// File.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The file ends before the header or a tensor's data.
    #[error("{path}: truncated: {detail}")]
    Truncated {
        /// File.
        path: PathBuf,
        /// What was missing.
        detail: String,
    },
    /// Header too large, not JSON, or inconsistent tensor entries.
    #[error("{path}: malformed safetensors header: {detail}")]
    Malformed {
        /// File.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// The checkpoint is a different model family.
    #[error("{path}: unsupported model family: {detail}")]
    WrongArch {
        /// File.
        path: PathBuf,
        /// What was detected.
        detail: String,
    },
    /// Required tensors are absent, have the wrong shape, or are not stored as floats.
    #[error("{path}: {count} required tensors missing, mis-shaped or not float, e.g. {examples}")]
    MissingKeys {
        /// File.
        path: PathBuf,
        /// How many.
        count: usize,
        /// A few of them, with the expected shapes.
        examples: String,
    },
}

/// Element type of a stored tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    /// float32
    F32,
    /// float16
    F16,
    /// bfloat16
    BF16,
    /// float64
    F64,
    /// int64
    I64,
    /// int32
    I32,
    /// uint8
    U8,
    /// bool
    Bool,
    /// float8 e4m3
    F8E4M3,
    /// float8 e5m2
    F8E5M2,
}

impl Dtype {
    fn parse(s: &str) -> Option<Dtype> {
        Some(match s {
            "F32" => Dtype::F32,
            "F16" => Dtype::F16,
            "BF16" => Dtype::BF16,
            "F64" => Dtype::F64,
            "I64" => Dtype::I64,
            "I32" => Dtype::I32,
            "U8" => Dtype::U8,
            "BOOL" => Dtype::Bool,
            "F8_E4M3" => Dtype::F8E4M3,
            "F8_E5M2" => Dtype::F8E5M2,
            _ => return None,
        })
    }

    /// The safetensors name.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "F32",
            Dtype::F16 => "F16",
            Dtype::BF16 => "BF16",
            Dtype::F64 => "F64",
            Dtype::I64 => "I64",
            Dtype::I32 => "I32",
            Dtype::U8 => "U8",
            Dtype::Bool => "BOOL",
            Dtype::F8E4M3 => "F8_E4M3",
            Dtype::F8E5M2 => "F8_E5M2",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> u64 {
        match self {
            Dtype::F64 | Dtype::I64 => 8,
            Dtype::F32 | Dtype::I32 => 4,
            Dtype::F16 | Dtype::BF16 => 2,
            Dtype::U8 | Dtype::Bool | Dtype::F8E4M3 | Dtype::F8E5M2 => 1,
        }
    }
}

/// One tensor's entry in the header.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// Element type.
    pub dtype: Dtype,
    /// Dimensions.
    pub shape: Vec<usize>,
    /// Absolute byte range in the file.
    pub range: (u64, u64),
}

/// A validated safetensors header.
#[derive(Debug, Clone)]
pub struct SafetensorsIndex {
    /// The file.
    pub path: PathBuf,
    /// Tensors by name.
    pub tensors: BTreeMap<String, TensorInfo>,
    /// `__metadata__` entries.
    pub metadata: BTreeMap<String, String>,
    /// Total file size.
    pub file_len: u64,
}

impl SafetensorsIndex {
    /// Reads and validates the header of `path` (header at most `max_header` bytes).
    pub fn open(path: &Path, max_header: u64) -> Result<Self, CheckpointError> {
        let io = |source| CheckpointError::Io {
            path: path.to_path_buf(),
            source,
        };
        let malformed = |detail: String| CheckpointError::Malformed {
            path: path.to_path_buf(),
            detail,
        };
        let mut f = File::open(path).map_err(io)?;
        let file_len = f.metadata().map_err(io)?.len();
        if file_len < 8 {
            return Err(CheckpointError::Truncated {
                path: path.to_path_buf(),
                detail: format!("{file_len} bytes, need at least 8 for the header length"),
            });
        }
        let mut len_bytes = [0u8; 8];
        f.read_exact(&mut len_bytes).map_err(io)?;
        let header_len = u64::from_le_bytes(len_bytes);
        if header_len > max_header {
            return Err(malformed(format!(
                "header length {header_len} exceeds the {max_header}-byte cap"
            )));
        }
        if 8 + header_len > file_len {
            return Err(CheckpointError::Truncated {
                path: path.to_path_buf(),
                detail: format!(
                    "header claims {header_len} bytes but the file has {} after the length",
                    file_len - 8
                ),
            });
        }
        let mut header = vec![0u8; header_len as usize];
        f.read_exact(&mut header).map_err(io)?;
        let json: serde_json::Value =
            serde_json::from_slice(&header).map_err(|e| malformed(format!("header is not valid JSON: {e}")))?;
        let obj = json
            .as_object()
            .ok_or_else(|| malformed("header is not a JSON object".into()))?;
        let data_start = 8 + header_len;
        let data_len = file_len - data_start;
        let mut tensors = BTreeMap::new();
        let mut metadata = BTreeMap::new();
        for (name, entry) in obj {
            if name == "__metadata__" {
                let m = entry
                    .as_object()
                    .ok_or_else(|| malformed("__metadata__ is not an object".into()))?;
                for (k, v) in m {
                    let v = v
                        .as_str()
                        .ok_or_else(|| malformed(format!("__metadata__.{k} is not a string")))?;
                    metadata.insert(k.clone(), v.to_string());
                }
                continue;
            }
            let bad = |what: &str| malformed(format!("tensor '{name}': {what}"));
            let dtype_s = entry
                .get("dtype")
                .and_then(|d| d.as_str())
                .ok_or_else(|| bad("missing dtype"))?;
            let dtype = Dtype::parse(dtype_s).ok_or_else(|| bad(&format!("unknown dtype {dtype_s}")))?;
            let shape: Vec<usize> = entry
                .get("shape")
                .and_then(|s| s.as_array())
                .ok_or_else(|| bad("missing shape"))?
                .iter()
                .map(|d| d.as_u64().map(|v| v as usize))
                .collect::<Option<_>>()
                .ok_or_else(|| bad("shape is not a list of non-negative integers"))?;
            let offs: Vec<u64> = entry
                .get("data_offsets")
                .and_then(|s| s.as_array())
                .ok_or_else(|| bad("missing data_offsets"))?
                .iter()
                .map(|d| d.as_u64())
                .collect::<Option<_>>()
                .ok_or_else(|| bad("data_offsets are not integers"))?;
            if offs.len() != 2 || offs[0] > offs[1] {
                return Err(bad("data_offsets must be [begin, end] with begin <= end"));
            }
            let numel = shape
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
                .ok_or_else(|| bad("shape overflows"))?;
            let want = numel
                .checked_mul(dtype.size())
                .ok_or_else(|| bad("byte size overflows"))?;
            if offs[1] - offs[0] != want {
                return Err(bad(&format!(
                    "{} bytes stored but dtype {} x shape {:?} needs {want}",
                    offs[1] - offs[0],
                    dtype.name(),
                    shape
                )));
            }
            if offs[1] > data_len {
                return Err(CheckpointError::Truncated {
                    path: path.to_path_buf(),
                    detail: format!(
                        "tensor '{name}' ends at data byte {} but the data section has {data_len}",
                        offs[1]
                    ),
                });
            }
            tensors.insert(
                name.clone(),
                TensorInfo {
                    dtype,
                    shape,
                    range: (data_start + offs[0], data_start + offs[1]),
                },
            );
        }
        let mut ranges: Vec<(u64, u64, &str)> = tensors
            .iter()
            .map(|(n, t)| (t.range.0, t.range.1, n.as_str()))
            .collect();
        ranges.sort();
        for w in ranges.windows(2) {
            if w[1].0 < w[0].1 {
                return Err(malformed(format!("tensors '{}' and '{}' overlap", w[0].2, w[1].2)));
            }
        }
        Ok(SafetensorsIndex {
            path: path.to_path_buf(),
            tensors,
            metadata,
            file_len,
        })
    }

    /// Reads a tensor as float32 (F32, F16 and BF16 are converted). Runs of values are read
    /// and converted in parallel, each straight into its place in the result: no copy of
    /// the whole tensor's bytes is made first.
    pub fn read_f32(&self, name: &str) -> Result<Vec<f32>, CheckpointError> {
        /// Values per parallel task.
        const RUN: usize = 1 << 14;
        let (info, file) = self.open_float(name)?;
        let convert: fn(&[u8], &mut [f32]) = match info.dtype {
            Dtype::F32 => from_le_f32,
            Dtype::F16 => from_le_f16,
            _ => from_le_bf16,
        };
        let width = info.dtype.size();
        let mut out = vec![0f32; ((info.range.1 - info.range.0) / width) as usize];
        out.par_chunks_mut(RUN)
            .enumerate()
            .try_for_each_init(Vec::new, |bytes, (run, out)| {
                bytes.resize(out.len() * width as usize, 0);
                file.read_exact_at(bytes, info.range.0 + (run * RUN) as u64 * width)?;
                convert(bytes, out);
                Ok(())
            })
            .map_err(|e| self.io_error(e))?;
        Ok(out)
    }

    /// Reads a float tensor as stored (F32, F16 or BF16, no conversion) onto `device`: on a
    /// GPU the weights travel in their stored precision and are converted there.
    pub fn read_stored(
        &self,
        name: &str,
        device: &candle_core::Device,
    ) -> Result<candle_core::Tensor, CheckpointError> {
        let (info, file) = self.open_float(name)?;
        let dtype = match info.dtype {
            Dtype::F32 => candle_core::DType::F32,
            Dtype::F16 => candle_core::DType::F16,
            _ => candle_core::DType::BF16,
        };
        let mut bytes = vec![0u8; (info.range.1 - info.range.0) as usize];
        file.read_exact_at(&mut bytes, info.range.0)
            .map_err(|e| self.io_error(e))?;
        candle_core::Tensor::from_raw_buffer(&bytes, dtype, &info.shape, device).map_err(|e| {
            CheckpointError::Malformed {
                path: self.path.clone(),
                detail: format!("tensor '{name}': {e}"),
            }
        })
    }

    /// The entry of tensor `name`, refused unless it is F32, F16 or BF16, and the file opened
    /// to read it.
    fn open_float(&self, name: &str) -> Result<(&TensorInfo, File), CheckpointError> {
        let info = &self.tensors[name];
        if !matches!(info.dtype, Dtype::F32 | Dtype::F16 | Dtype::BF16) {
            return Err(CheckpointError::Malformed {
                path: self.path.clone(),
                detail: format!(
                    "tensor '{name}' has dtype {} where a float was expected",
                    info.dtype.name()
                ),
            });
        }
        let file = File::open(&self.path).map_err(|e| self.io_error(e))?;
        Ok((info, file))
    }

    /// An I/O error reading this file.
    fn io_error(&self, source: std::io::Error) -> CheckpointError {
        CheckpointError::Io {
            path: self.path.clone(),
            source,
        }
    }
}

/// Little-endian float32 `bytes` into `out`.
fn from_le_f32(bytes: &[u8], out: &mut [f32]) {
    for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
        *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
}

/// Little-endian float16 `bytes` into `out`, through the `half` crate's slice conversion
/// (the CPU's F16C instructions where it has them: a checkpoint holds a billion values).
fn from_le_f16(bytes: &[u8], out: &mut [f32]) {
    widen(bytes, out, f16_bits);
}

/// Little-endian bfloat16 `bytes` into `out`.
fn from_le_bf16(bytes: &[u8], out: &mut [f32]) {
    widen(bytes, out, bf16_bits);
}

/// Little-endian 16-bit floats into `out`, a stack buffer's worth of bits at a time, each
/// widened by `convert`.
fn widen(bytes: &[u8], out: &mut [f32], convert: fn(&[u16], &mut [f32])) {
    const STEP: usize = 1 << 12;
    let mut bits = [0u16; STEP];
    for (out, bytes) in out.chunks_mut(STEP).zip(bytes.chunks(STEP * 2)) {
        for (b, c) in bits.iter_mut().zip(bytes.chunks_exact(2)) {
            *b = u16::from_le_bytes([c[0], c[1]]);
        }
        convert(&bits[..out.len()], out);
    }
}

/// [`widen`]'s conversion for float16.
fn f16_bits(bits: &[u16], out: &mut [f32]) {
    bits.reinterpret_cast::<f16>().convert_to_f32_slice(out);
}

/// [`widen`]'s conversion for bfloat16.
fn bf16_bits(bits: &[u16], out: &mut [f32]) {
    bits.reinterpret_cast::<bf16>().convert_to_f32_slice(out);
}

/// Writes float32 tensors (in the given order) as a safetensors file.
pub fn write_f32_safetensors(
    path: &Path,
    tensors: &[(String, Vec<usize>, Vec<f32>)],
    metadata: &BTreeMap<String, String>,
) -> std::io::Result<()> {
    let mut header = serde_json::Map::new();
    if !metadata.is_empty() {
        header.insert(
            "__metadata__".into(),
            serde_json::to_value(metadata).map_err(std::io::Error::other)?,
        );
    }
    let mut offset = 0u64;
    for (name, shape, data) in tensors {
        let n = data.len() as u64 * 4;
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + n]}),
        );
        offset += n;
    }
    let mut json = serde_json::to_vec(&serde_json::Value::Object(header)).map_err(std::io::Error::other)?;
    while json.len() % 8 != 0 {
        json.push(b' ');
    }
    let mut f = std::io::BufWriter::new(File::create(path)?);
    f.write_all(&(json.len() as u64).to_le_bytes())?;
    f.write_all(&json)?;
    for (_, _, data) in tensors {
        for v in data {
            f.write_all(&v.to_le_bytes())?;
        }
    }
    f.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("weft-st-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir.join(name)
    }

    #[test]
    fn round_trip_and_errors() {
        let p = tmp("ok.safetensors");
        write_f32_safetensors(
            &p,
            &[("a".into(), vec![2, 2], vec![1.0, 2.0, 3.0, 4.0])],
            &BTreeMap::new(),
        )
        .unwrap();
        let idx = SafetensorsIndex::open(&p, DEFAULT_MAX_HEADER).unwrap();
        assert_eq!(idx.read_f32("a").unwrap(), vec![1.0, 2.0, 3.0, 4.0]);

        // Truncated data section.
        let bytes = std::fs::read(&p).unwrap();
        let t = tmp("trunc.safetensors");
        std::fs::write(&t, &bytes[..bytes.len() - 3]).unwrap();
        assert!(matches!(
            SafetensorsIndex::open(&t, DEFAULT_MAX_HEADER),
            Err(CheckpointError::Truncated { .. })
        ));
        // Header cap.
        assert!(matches!(
            SafetensorsIndex::open(&p, 4),
            Err(CheckpointError::Malformed { .. })
        ));
        // Garbage.
        let g = tmp("garbage.safetensors");
        let mut junk = 16u64.to_le_bytes().to_vec();
        junk.extend_from_slice(b"{not json at all");
        std::fs::write(&g, &junk).unwrap();
        assert!(matches!(
            SafetensorsIndex::open(&g, DEFAULT_MAX_HEADER),
            Err(CheckpointError::Malformed { .. })
        ));
        // Too short.
        std::fs::write(&g, b"abc").unwrap();
        assert!(matches!(
            SafetensorsIndex::open(&g, DEFAULT_MAX_HEADER),
            Err(CheckpointError::Truncated { .. })
        ));
    }

    #[test]
    fn half_precision_tensors_widen_to_float32() {
        // 1, -2, the smallest subnormal, infinity and a NaN, then a run longer than one task.
        let halves: Vec<u16> = [0x3c00, 0xc000, 0x0001, 0x7c00, 0x7e00]
            .into_iter()
            .chain((0..9000u16).map(|i| i.wrapping_mul(7)))
            .collect();
        let bytes: Vec<u8> = halves.iter().flat_map(|h| h.to_le_bytes()).collect();
        let mut got = vec![0f32; halves.len()];
        from_le_f16(&bytes, &mut got);
        assert_eq!(&got[..3], &[1.0, -2.0, 2f32.powi(-24)]);
        assert_eq!(got[3], f32::INFINITY);
        assert!(got[4].is_nan());
        for (value, bits) in got.iter().zip(&halves).skip(5) {
            let want = f16::from_bits(*bits).to_f32();
            assert!(value.to_bits() == want.to_bits() || (value.is_nan() && want.is_nan()));
        }
        let mut brain = [0f32; 2];
        from_le_bf16(&[0x80, 0x3f, 0x00, 0xc0], &mut brain);
        assert_eq!(brain, [1.0, -2.0]);
    }
}
