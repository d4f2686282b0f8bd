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
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

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
    #[error("{path}: not an SD1.x checkpoint: {detail}")]
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

    /// Reads one tensor's raw little-endian bytes.
    pub fn read_bytes(&self, name: &str) -> Result<Vec<u8>, CheckpointError> {
        let info = self.tensors.get(name).ok_or_else(|| CheckpointError::MissingKeys {
            path: self.path.clone(),
            count: 1,
            examples: name.to_string(),
        })?;
        let io = |source| CheckpointError::Io {
            path: self.path.clone(),
            source,
        };
        let mut f = File::open(&self.path).map_err(io)?;
        f.seek(SeekFrom::Start(info.range.0)).map_err(io)?;
        let mut buf = vec![0u8; (info.range.1 - info.range.0) as usize];
        f.read_exact(&mut buf).map_err(io)?;
        Ok(buf)
    }

    /// Reads a tensor as float32 (F32, F16 and BF16 are converted, in parallel).
    pub fn read_f32(&self, name: &str) -> Result<Vec<f32>, CheckpointError> {
        let info = &self.tensors[name];
        let bytes = self.read_bytes(name)?;
        let out = match info.dtype {
            Dtype::F32 => convert::<4>(&bytes, |c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            Dtype::F16 => convert::<2>(&bytes, |c| f16_to_f32(u16::from_le_bytes([c[0], c[1]]))),
            Dtype::BF16 => convert::<2>(&bytes, |c| {
                f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16)
            }),
            other => {
                return Err(CheckpointError::Malformed {
                    path: self.path.clone(),
                    detail: format!("tensor '{name}' has dtype {} where a float was expected", other.name()),
                })
            }
        };
        Ok(out)
    }
}

/// `bytes` as float32 values, each from `N` bytes by `value`, in parallel runs.
fn convert<const N: usize>(bytes: &[u8], value: impl Fn(&[u8]) -> f32 + Sync) -> Vec<f32> {
    /// Values per parallel task.
    const RUN: usize = 1 << 16;
    let mut out = vec![0f32; bytes.len() / N];
    out.par_chunks_mut(RUN)
        .zip(bytes.par_chunks(RUN * N))
        .for_each(|(out, bytes)| {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(N)) {
                *o = value(c);
            }
        });
    out
}

pub(crate) fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h >> 15) as u32) << 31;
    let exp = ((h >> 10) & 0x1f) as u32;
    let mant = (h & 0x3ff) as u32;
    let bits = match (exp, mant) {
        (0, 0) => sign,
        (0, m) => {
            // Subnormal: normalise.
            let mut e = 127 - 15 + 1;
            let mut m = m;
            while m & 0x400 == 0 {
                m <<= 1;
                e -= 1;
            }
            sign | ((e as u32) << 23) | ((m & 0x3ff) << 13)
        }
        (0x1f, m) => sign | 0x7f80_0000 | (m << 13),
        (e, m) => sign | ((e + 127 - 15) << 23) | (m << 13),
    };
    f32::from_bits(bits)
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
    fn f16_conversion() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
    }
}
