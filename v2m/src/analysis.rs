//! Video analysis: `ffprobe` for container facts, then a single low-resolution
//! `ffmpeg` decode streamed over a pipe (never written to disk) from which
//! per-slot brightness, saturation, hue, motion and scene cuts are derived.
//!
//! Decoding every frame of a long 1080p H.264 file costs tens of CPU seconds,
//! far more than the latency budget, so [`DecodeMode::Auto`] decodes every
//! frame only for small inputs. For larger ones it decodes key/intra frames
//! only (encoders such as x264 place them at scene cuts) and estimates motion
//! from the compressed size of the inter-frame packets, which `ffprobe` reads
//! without decoding. Both child processes are killed when the future is
//! dropped.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;

use super::V2mError;

/// Width of the decoded analysis frames.
const FW: usize = 64;
/// Height of the decoded analysis frames.
const FH: usize = 36;
const FRAME_BYTES: usize = FW * FH * 3;
const HIST_BINS: usize = 64;

/// How the analysis decode reads the video.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecodeMode {
    /// Full decode for small inputs, key frames otherwise (see module docs).
    Auto,
    /// Decode every frame (accurate motion, slow on long HD input).
    Full,
    /// Decode key frames only; motion comes from packet sizes.
    Keyframes,
}

/// Options for [`probe`] and [`analyze`].
#[derive(Debug, Clone)]
pub struct AnalyzeOptions {
    /// `ffmpeg` binary.
    pub ffmpeg: PathBuf,
    /// `ffprobe` binary.
    pub ffprobe: PathBuf,
    /// Decode strategy.
    pub mode: DecodeMode,
    /// Analysis slots per second.
    pub fps: f64,
    /// Minimum spacing between two detected cuts, in seconds.
    pub min_cut_spacing_s: f64,
    /// `Auto` decodes every frame when width × height × fps × duration is
    /// at most this many megapixels.
    pub full_decode_budget_mpix: f64,
    /// Reject videos longer than this (checked before decoding).
    pub max_duration_s: Option<f64>,
    /// Decoder threads passed to ffmpeg.
    pub threads: u32,
    /// Wall time one analysis may take before it fails, whatever the file.
    pub timeout: std::time::Duration,
}

impl Default for AnalyzeOptions {
    fn default() -> Self {
        Self {
            ffmpeg: PathBuf::from("ffmpeg"),
            ffprobe: PathBuf::from("ffprobe"),
            mode: DecodeMode::Auto,
            fps: 4.0,
            min_cut_spacing_s: 2.0,
            full_decode_budget_mpix: 250.0,
            max_duration_s: None,
            threads: 2,
            timeout: std::time::Duration::from_secs(300),
        }
    }
}

/// Container-level facts about a video.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VideoInfo {
    /// Duration in seconds.
    pub duration_s: f64,
    /// Frame width in pixels.
    pub width: u32,
    /// Frame height in pixels.
    pub height: u32,
    /// Average frame rate (0 when unknown).
    pub fps: f64,
    /// Video codec name as reported by ffprobe.
    pub codec: String,
    /// Whether an audio stream is present.
    pub has_audio: bool,
}

/// Visual features of one analysis slot; all values in `[0, 1]` except hue.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct FrameFeatures {
    /// Slot start time in seconds.
    pub t: f64,
    /// Mean luma.
    pub brightness: f32,
    /// Mean HSV saturation.
    pub saturation: f32,
    /// Circular mean hue in degrees `[0, 360)`, weighted by colourfulness.
    pub hue: f32,
    /// Length of the mean hue vector (0 = grey or hue spread evenly).
    pub hue_strength: f32,
    /// Motion energy (0 = still).
    pub motion: f32,
}

/// Averages of [`FrameFeatures`] over a time span.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Mean brightness.
    pub brightness: f32,
    /// Mean saturation.
    pub saturation: f32,
    /// Circular mean hue in degrees.
    pub hue: f32,
    /// Hue vector length.
    pub hue_strength: f32,
    /// Mean motion energy.
    pub motion: f32,
}

/// Result of [`analyze`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Analysis {
    /// Container facts.
    pub info: VideoInfo,
    /// The decode mode actually used (never `Auto`).
    pub mode: DecodeMode,
    /// Seconds per slot.
    pub step_s: f64,
    /// One entry per slot, covering the whole duration.
    pub frames: Vec<FrameFeatures>,
    /// Scene cut times in seconds, ascending.
    pub cuts: Vec<f64>,
}

impl Analysis {
    /// Video duration in seconds.
    pub fn duration_s(&self) -> f64 {
        self.info.duration_s
    }

    /// Feature averages over `[t0, t1)`; neutral values if no slot falls in it.
    pub fn summary(&self, t0: f64, t1: f64) -> Summary {
        let sel: Vec<&FrameFeatures> = self.frames.iter().filter(|f| f.t >= t0 - 1e-9 && f.t < t1).collect();
        let sel = if sel.is_empty() {
            // Span shorter than a slot: use the slot containing t0.
            let i = ((t0 / self.step_s).floor() as usize).min(self.frames.len().saturating_sub(1));
            self.frames.get(i).into_iter().collect()
        } else {
            sel
        };
        if sel.is_empty() {
            return Summary {
                brightness: 0.5,
                saturation: 0.3,
                hue: 0.0,
                hue_strength: 0.0,
                motion: 0.3,
            };
        }
        let n = sel.len() as f32;
        let (mut b, mut s, mut m, mut hx, mut hy) = (0.0, 0.0, 0.0, 0.0f32, 0.0f32);
        for f in &sel {
            b += f.brightness;
            s += f.saturation;
            m += f.motion;
            let r = f.hue.to_radians();
            hx += r.cos() * f.hue_strength;
            hy += r.sin() * f.hue_strength;
        }
        Summary {
            brightness: b / n,
            saturation: s / n,
            hue: hy.atan2(hx).to_degrees().rem_euclid(360.0),
            hue_strength: (hx.hypot(hy) / n).min(1.0),
            motion: m / n,
        }
    }

    /// A synthetic analysis (for tests and previews without a video).
    pub fn synthetic(duration_s: f64, cuts: &[f64], brightness: f32, motion: f32) -> Self {
        let step_s = 0.25;
        let n = (duration_s / step_s).ceil().max(1.0) as usize;
        let frames = (0..n)
            .map(|i| FrameFeatures {
                t: i as f64 * step_s,
                brightness,
                saturation: 0.4,
                hue: 200.0,
                hue_strength: 0.5,
                motion,
            })
            .collect();
        Self {
            info: VideoInfo {
                duration_s,
                width: 1280,
                height: 720,
                fps: 25.0,
                codec: "synthetic".into(),
                has_audio: false,
            },
            mode: DecodeMode::Full,
            step_s,
            frames,
            cuts: cuts.to_vec(),
        }
    }
}

fn unreadable(msg: impl Into<String>) -> V2mError {
    V2mError::UnreadableVideo(msg.into())
}

fn last_lines(s: &[u8]) -> String {
    let s = String::from_utf8_lossy(s);
    let lines: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
    let start = lines.len().saturating_sub(3);
    lines[start..].join(" | ")
}

fn parse_rate(s: &str) -> f64 {
    match s.split_once('/') {
        Some((a, b)) => {
            let (a, b) = (a.parse::<f64>().unwrap_or(0.0), b.parse::<f64>().unwrap_or(0.0));
            if b > 0.0 {
                a / b
            } else {
                0.0
            }
        }
        None => s.parse().unwrap_or(0.0),
    }
}

fn num(v: &serde_json::Value) -> Option<f64> {
    match v {
        serde_json::Value::String(s) => s.parse().ok(),
        serde_json::Value::Number(n) => n.as_f64(),
        _ => None,
    }
}

/// Reads container facts with `ffprobe`. Fails with `UnreadableVideo` if the
/// file cannot be parsed and `MissingVideo` if it has no video stream
/// (cover-art pictures do not count).
pub async fn probe(path: &Path, opts: &AnalyzeOptions) -> Result<VideoInfo, V2mError> {
    let out = Command::new(&opts.ffprobe)
        .args(["-v", "error", "-print_format", "json", "-show_format", "-show_streams"])
        .arg(path)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| V2mError::GenerationFailed(format!("cannot run ffprobe: {e}")))?;
    if !out.status.success() {
        return Err(unreadable(last_lines(&out.stderr)));
    }
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| unreadable(format!("ffprobe output: {e}")))?;
    let streams = v["streams"].as_array().cloned().unwrap_or_default();
    if streams.is_empty() && v.get("format").is_none() {
        return Err(unreadable("no streams"));
    }
    let video = streams
        .iter()
        .find(|s| s["codec_type"] == "video" && s["disposition"]["attached_pic"].as_i64().unwrap_or(0) == 0);
    let Some(video) = video else {
        return Err(V2mError::MissingVideo);
    };
    let duration_s = num(&v["format"]["duration"])
        .or_else(|| num(&video["duration"]))
        .filter(|d| d.is_finite() && *d > 0.0)
        .ok_or_else(|| unreadable("unknown duration"))?;
    let fps = video["avg_frame_rate"]
        .as_str()
        .map(parse_rate)
        .filter(|f| *f > 0.0)
        .or_else(|| video["r_frame_rate"].as_str().map(parse_rate))
        .unwrap_or(0.0);
    Ok(VideoInfo {
        duration_s,
        width: video["width"].as_u64().unwrap_or(0) as u32,
        height: video["height"].as_u64().unwrap_or(0) as u32,
        fps,
        codec: video["codec_name"].as_str().unwrap_or("unknown").to_string(),
        has_audio: streams.iter().any(|s| s["codec_type"] == "audio"),
    })
}

/// Probes the duration in seconds (fast: container headers only).
pub async fn probe_duration(path: &Path, opts: &AnalyzeOptions) -> Result<f64, V2mError> {
    Ok(probe(path, opts).await?.duration_s)
}

/// Checks `duration_s` against `max_duration_s`.
pub fn check_duration(duration_s: f64, max_duration_s: Option<f64>) -> Result<(), V2mError> {
    match max_duration_s {
        Some(max) if duration_s > max + 1e-6 => Err(V2mError::VideoTooLong {
            duration_s,
            max_duration_s: max,
        }),
        _ => Ok(()),
    }
}

/// Statistics of one decoded 64×36 RGB frame.
struct Raw {
    brightness: f32,
    saturation: f32,
    hue_x: f32,
    hue_y: f32,
    hist: [f32; HIST_BINS],
}

fn frame_stats(px: &[u8]) -> Raw {
    let mut hist = [0f32; HIST_BINS];
    let (mut lum, mut sat, mut hx, mut hy, mut wsum) = (0f32, 0f32, 0f32, 0f32, 0f32);
    for p in px.chunks_exact(3) {
        let (r, g, b) = (p[0] as f32 / 255.0, p[1] as f32 / 255.0, p[2] as f32 / 255.0);
        lum += 0.2126 * r + 0.7152 * g + 0.0722 * b;
        let max = r.max(g).max(b);
        let min = r.min(g).min(b);
        let c = max - min;
        if max > 0.0 {
            sat += c / max;
        }
        if c > 1e-3 {
            let h = if max == r {
                ((g - b) / c).rem_euclid(6.0)
            } else if max == g {
                (b - r) / c + 2.0
            } else {
                (r - g) / c + 4.0
            } * 60.0;
            let w = c;
            let rad = h.to_radians();
            hx += rad.cos() * w;
            hy += rad.sin() * w;
            wsum += w;
        }
        let bin = (p[0] as usize >> 6) * 16 + (p[1] as usize >> 6) * 4 + (p[2] as usize >> 6);
        hist[bin] += 1.0;
    }
    let n = (px.len() / 3) as f32;
    for h in &mut hist {
        *h /= n;
    }
    let _ = wsum;
    Raw {
        brightness: lum / n,
        saturation: sat / n,
        hue_x: hx / n,
        hue_y: hy / n,
        hist,
    }
}

fn hist_distance(a: &[f32; HIST_BINS], b: &[f32; HIST_BINS]) -> f32 {
    0.5 * a.iter().zip(b).map(|(x, y)| (x - y).abs()).sum::<f32>()
}

fn mean_abs_diff(a: &[u8], b: &[u8]) -> f32 {
    let s: u32 = a.iter().zip(b).map(|(x, y)| x.abs_diff(*y) as u32).sum();
    s as f32 / (a.len() as f32 * 255.0)
}

/// Per-slot decode output before normalisation.
struct Decoded {
    raws: Vec<Raw>,
    /// Mean absolute difference to the previous slot's frame.
    diffs: Vec<f32>,
    /// Histogram distance to the previous slot's frame.
    hdists: Vec<f32>,
}

async fn read_frames<R: AsyncRead + Unpin>(mut r: R) -> std::io::Result<Decoded> {
    let mut buf = vec![0u8; FRAME_BYTES];
    let mut prev = vec![0u8; FRAME_BYTES];
    let mut d = Decoded {
        raws: Vec::new(),
        diffs: Vec::new(),
        hdists: Vec::new(),
    };
    loop {
        match r.read_exact(&mut buf).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(e),
        }
        let raw = frame_stats(&buf);
        if let Some(last) = d.raws.last() {
            d.diffs.push(mean_abs_diff(&buf, &prev));
            d.hdists.push(hist_distance(&raw.hist, &last.hist));
        } else {
            d.diffs.push(0.0);
            d.hdists.push(0.0);
        }
        d.raws.push(raw);
        std::mem::swap(&mut buf, &mut prev);
    }
    Ok(d)
}

/// Decodes at most the first `limit_s` seconds of `path`'s first video stream: a file whose
/// container understates its length is read no further than its probed duration.
async fn decode(path: &Path, opts: &AnalyzeOptions, keyframes: bool, limit_s: f64) -> Result<Decoded, V2mError> {
    let mut cmd = Command::new(&opts.ffmpeg);
    cmd.args(["-nostdin", "-hide_banner", "-v", "error"])
        .args(["-threads", &opts.threads.max(1).to_string()]);
    if keyframes {
        // Demuxer-level discard avoids even reading inter-frame packets.
        cmd.args(["-discard", "nokey", "-skip_frame", "nokey"]);
    } else {
        cmd.args(["-skip_loop_filter", "all"]);
    }
    // In key-frame mode the fps filter emits nothing for a lone key frame,
    // so the output's constant-rate sync (`-r`) holds frames instead.
    let scale = format!("scale={FW}:{FH}:flags=fast_bilinear,format=rgb24");
    let vf = if keyframes {
        scale
    } else {
        format!("fps={},{scale}", opts.fps)
    };
    cmd.arg("-i")
        .arg(path)
        .args(["-map", "0:v:0", "-an", "-sn", "-dn", "-vf", &vf]);
    if keyframes {
        cmd.args(["-r", &opts.fps.to_string()]);
    }
    cmd.args(["-t", &format!("{limit_s:.3}")])
        .args(["-f", "rawvideo", "-pix_fmt", "rgb24", "pipe:1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd
        .spawn()
        .map_err(|e| V2mError::GenerationFailed(format!("cannot run ffmpeg: {e}")))?;
    let stdout = child.stdout.take().expect("piped stdout");
    let mut stderr = child.stderr.take().expect("piped stderr");
    let err_task = async move {
        let mut s = Vec::new();
        let _ = (&mut stderr).take(64 * 1024).read_to_end(&mut s).await;
        s
    };
    let (frames, err) = tokio::join!(read_frames(stdout), err_task);
    let status = child
        .wait()
        .await
        .map_err(|e| V2mError::GenerationFailed(format!("ffmpeg: {e}")))?;
    let frames = frames.map_err(|e| unreadable(format!("reading decoder output: {e}")))?;
    if !status.success() || frames.raws.is_empty() {
        let msg = last_lines(&err);
        return Err(unreadable(if msg.is_empty() {
            "no decodable video frames".to_string()
        } else {
            msg
        }));
    }
    Ok(frames)
}

/// Motion per slot from inter-frame packet sizes, plus key-frame times, from
/// `ffprobe -show_entries packet` (demux only, no decode).
async fn packet_motion(
    path: &Path,
    opts: &AnalyzeOptions,
    slots: usize,
    pixels: f64,
    limit_s: f64,
) -> Option<(Vec<f32>, Vec<f64>)> {
    let out = Command::new(&opts.ffprobe)
        .args(["-v", "error", "-select_streams", "v:0"])
        .args(["-read_intervals", &format!("%+{limit_s:.3}")])
        .args(["-show_entries", "packet=pts_time,dts_time,size,flags"])
        .args(["-of", "csv=p=0"])
        .arg(path)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .ok()?;
    if !out.status.success() || pixels <= 0.0 {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut bytes = vec![0f64; slots];
    let mut count = vec![0u32; slots];
    let mut keys = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(',').collect();
        if f.len() < 4 {
            continue;
        }
        let t = f[0].parse::<f64>().or_else(|_| f[1].parse::<f64>());
        let (Ok(t), Ok(size)) = (t, f[2].parse::<f64>()) else {
            continue;
        };
        if f[3].contains('K') {
            keys.push(t);
            continue;
        }
        let i = (t * opts.fps).floor();
        if i < 0.0 || i as usize >= slots {
            continue;
        }
        bytes[i as usize] += size;
        count[i as usize] += 1;
    }
    if count.iter().all(|c| *c == 0) {
        return None;
    }
    // Bits per pixel per inter frame; slots with only key frames borrow
    // from their neighbours below.
    let mut v: Vec<Option<f32>> = bytes
        .iter()
        .zip(&count)
        .map(|(b, c)| (*c > 0).then(|| (b * 8.0 / (*c as f64 * pixels)) as f32))
        .collect();
    fill_gaps(&mut v);
    let motion = v
        .into_iter()
        .map(|x| {
            let bpp = x.unwrap_or(0.0).max(1e-5);
            ((bpp.log10() + 2.6) / 2.0).clamp(0.0, 1.0)
        })
        .collect();
    keys.sort_by(f64::total_cmp);
    Some((motion, keys))
}

/// Marks key frames whose distance from the previous one equals the
/// longest interval (the encoder's maximum GOP length, within a frame).
fn periodic_keys(keys: &[f64], fps: f64) -> Vec<bool> {
    let mut out = vec![false; keys.len()];
    if keys.len() < 3 {
        return out;
    }
    let ivs: Vec<f64> = keys.windows(2).map(|w| w[1] - w[0]).collect();
    let max = ivs.iter().copied().fold(0.0, f64::max);
    let tol = if fps > 0.0 { 1.5 / fps } else { 0.06 };
    for (i, iv) in ivs.iter().enumerate() {
        out[i + 1] = *iv >= max - tol;
    }
    out
}

fn fill_gaps(v: &mut [Option<f32>]) {
    let mut last = None;
    for x in v.iter_mut() {
        match x {
            Some(val) => last = Some(*val),
            None => *x = last,
        }
    }
    let mut next = None;
    for x in v.iter_mut().rev() {
        match x {
            Some(val) => next = Some(*val),
            None => *x = next,
        }
    }
}

fn smooth(v: &[f32], radius: usize) -> Vec<f32> {
    (0..v.len())
        .map(|i| {
            let a = i.saturating_sub(radius);
            let b = (i + radius + 1).min(v.len());
            v[a..b].iter().sum::<f32>() / (b - a) as f32
        })
        .collect()
}

/// Finds cut slots: large histogram jumps that also change many pixels,
/// keeping the strongest within `min_gap` slots.
fn detect_cuts(hdists: &[f32], diffs: &[f32], min_gap: usize) -> Vec<usize> {
    let mut cand: Vec<(usize, f32)> = hdists
        .iter()
        .zip(diffs)
        .enumerate()
        .skip(1)
        .filter(|(_, (h, d))| (**h >= 0.30 && **d >= 0.06) || **h >= 0.55)
        .map(|(i, (h, d))| (i, h + d))
        .collect();
    // Strongest first; accept if far enough from every accepted cut.
    cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut kept: Vec<usize> = Vec::new();
    for (i, _) in cand {
        if kept.iter().all(|k| k.abs_diff(i) >= min_gap) {
            kept.push(i);
        }
    }
    kept.sort_unstable();
    kept
}

/// Analyses a video: probe, duration check, one streamed low-res decode
/// (plus a packet-size scan in key-frame mode), features and cuts.
pub async fn analyze(path: &Path, opts: &AnalyzeOptions) -> Result<Analysis, V2mError> {
    let info = probe(path, opts).await?;
    check_duration(info.duration_s, opts.max_duration_s)?;
    analyze_probed(path, info, opts).await
}

/// Like [`analyze`] for a video already probed with [`probe`]. Reads no further than the
/// probed duration (plus a second), and fails after [`AnalyzeOptions::timeout`].
pub async fn analyze_probed(path: &Path, info: VideoInfo, opts: &AnalyzeOptions) -> Result<Analysis, V2mError> {
    let timeout = opts.timeout;
    tokio::time::timeout(timeout, analyze_within(path, info, opts))
        .await
        .map_err(|_| V2mError::GenerationFailed(format!("the video analysis took longer than {timeout:?}")))?
}

async fn analyze_within(path: &Path, info: VideoInfo, opts: &AnalyzeOptions) -> Result<Analysis, V2mError> {
    let pixels = f64::from(info.width) * f64::from(info.height);
    let mode = match opts.mode {
        DecodeMode::Auto => {
            let fps = if info.fps > 0.0 { info.fps.min(120.0) } else { 30.0 };
            let mpix = pixels * fps * info.duration_s / 1e6;
            if mpix <= opts.full_decode_budget_mpix {
                DecodeMode::Full
            } else {
                DecodeMode::Keyframes
            }
        }
        m => m,
    };
    tracing::debug!(?mode, duration_s = info.duration_s, "v2m: analysing video");
    let step_s = 1.0 / opts.fps;
    let slots = ((info.duration_s * opts.fps).ceil() as usize).max(1);
    let keyframes = mode == DecodeMode::Keyframes;
    // One second past the probed end is enough to fill the last slot.
    let limit_s = info.duration_s + 1.0;
    let (decoded, packets) = if keyframes {
        tokio::join!(
            decode(path, opts, true, limit_s),
            packet_motion(path, opts, slots, pixels, limit_s)
        )
    } else {
        (decode(path, opts, false, limit_s).await, None)
    };
    let mut d = decoded?;

    // Pad (hold last frame) or truncate to exactly `slots`.
    d.raws.truncate(slots);
    d.diffs.truncate(slots);
    d.hdists.truncate(slots);
    while d.raws.len() < slots {
        let last = d.raws.last().expect("non-empty");
        let copy = Raw {
            hist: last.hist,
            ..*last
        };
        d.raws.push(copy);
        d.diffs.push(0.0);
        d.hdists.push(0.0);
    }

    let min_gap = ((opts.min_cut_spacing_s * opts.fps).round() as usize).max(1);
    let cut_slots = detect_cuts(&d.hdists, &d.diffs, min_gap);

    let (packets, keys) = match packets {
        Some((m, k)) => (Some(m), k),
        None => (None, Vec::new()),
    };
    let motion: Vec<f32> = match packets {
        Some(p) => smooth(&p, 2),
        None => {
            // Pixel differences, ignoring the jumps at cuts and, in key-frame
            // mode without packet data, the held (duplicated) frames.
            let mut v: Vec<Option<f32>> = d
                .diffs
                .iter()
                .enumerate()
                .map(|(i, x)| {
                    let is_cut = cut_slots.contains(&i) || i == 0;
                    let held = keyframes && *x == 0.0;
                    (!is_cut && !held).then_some((x * 8.0).min(1.0))
                })
                .collect();
            fill_gaps(&mut v);
            smooth(&v.into_iter().map(|x| x.unwrap_or(0.2)).collect::<Vec<_>>(), 2)
        }
    };

    let frames = d
        .raws
        .iter()
        .enumerate()
        .map(|(i, r)| FrameFeatures {
            t: i as f64 * step_s,
            brightness: r.brightness.clamp(0.0, 1.0),
            saturation: r.saturation.clamp(0.0, 1.0),
            hue: r.hue_y.atan2(r.hue_x).to_degrees().rem_euclid(360.0),
            hue_strength: (r.hue_x.hypot(r.hue_y) * 2.0).clamp(0.0, 1.0),
            motion: motion[i],
        })
        .collect();
    // In key-frame mode a cut shows up at the slot holding the new key
    // frame; snap it to that key frame's exact time. Key frames placed by
    // the encoder's fixed GOP length (not by its scene-cut detector) compare
    // pictures several seconds apart, so they need a much larger jump.
    let periodic = periodic_keys(&keys, info.fps);
    let cuts = cut_slots
        .into_iter()
        .filter_map(|i| {
            let t = i as f64 * step_s;
            let key = keys
                .iter()
                .copied()
                .enumerate()
                .filter(|(_, k)| (k - t).abs() <= step_s * 1.5)
                .min_by(|a, b| (a.1 - t).abs().total_cmp(&(b.1 - t).abs()));
            match key {
                Some((ki, _)) if periodic[ki] && !(d.hdists[i] >= 0.6 && d.diffs[i] >= 0.12) => None,
                Some((_, k)) => Some(k),
                None => Some(t),
            }
        })
        .filter(|t| *t > 0.0 && *t < info.duration_s)
        .collect();
    Ok(Analysis {
        info,
        mode,
        step_s,
        frames,
        cuts,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Writes a `secs`-second 320x180 video: testsrc2 then (from `cut`) a
    /// red/blue smptebars-like scene. Returns its path.
    pub(crate) fn make_video(dir: &Path, secs: f64, cut: f64) -> PathBuf {
        let out = dir.join("clip.mp4");
        let b = secs - cut;
        let status = std::process::Command::new("ffmpeg")
            .args(["-y", "-v", "error", "-f", "lavfi", "-t"])
            .arg(format!("{cut}"))
            .args(["-i", "testsrc2=s=320x180:r=25", "-f", "lavfi", "-t"])
            .arg(format!("{b}"))
            .args(["-i", "smptebars=s=320x180:r=25"])
            .args(["-filter_complex", "[0:v][1:v]concat=n=2:v=1:a=0[v]", "-map", "[v]"])
            .args(["-c:v", "libx264", "-preset", "veryfast", "-pix_fmt", "yuv420p"])
            .arg(&out)
            .status()
            .expect("run ffmpeg");
        assert!(status.success());
        out
    }

    /// Writes a 20-second 64x48 video whose container claims it lasts one second (the
    /// duration fields of `mvhd`, `mdhd` and `tkhd` rewritten). Returns its path.
    fn understated_video(dir: &Path) -> PathBuf {
        let honest = dir.join("honest.mp4");
        let status = std::process::Command::new("ffmpeg")
            .args([
                "-y",
                "-v",
                "error",
                "-f",
                "lavfi",
                "-i",
                "testsrc=size=64x48:rate=10",
                "-t",
                "20",
            ])
            .args([
                "-c:v", "libx264", "-preset", "veryfast", "-pix_fmt", "yuv420p", "-g", "10",
            ])
            .arg(&honest)
            .status()
            .expect("run ffmpeg");
        assert!(status.success());
        let mut bytes = std::fs::read(&honest).unwrap();
        // Version-0 boxes: after the 4-byte tag come version+flags, then 32-bit fields.
        // mvhd/mdhd: creation, modification, timescale, duration; tkhd: creation,
        // modification, track id, reserved, duration.
        for (tag, duration_at, in_timescale_units) in [(b"mvhd", 16, true), (b"mdhd", 16, true), (b"tkhd", 20, false)] {
            let at = bytes.windows(4).position(|w| w == tag).expect("box present") + 4;
            assert_eq!(bytes[at], 0, "version-0 box");
            let timescale = u32::from_be_bytes(bytes[at + 12..at + 16].try_into().unwrap());
            let one_second = if in_timescale_units { timescale } else { 1 };
            bytes[at + duration_at..at + duration_at + 4].copy_from_slice(&one_second.to_be_bytes());
        }
        let crafted = dir.join("understated.mp4");
        std::fs::write(&crafted, bytes).unwrap();
        crafted
    }

    #[tokio::test]
    async fn a_container_that_understates_its_length_is_decoded_no_further_than_its_probed_duration() {
        let dir = temp_dir("understated");
        let video = understated_video(&dir);
        let opts = AnalyzeOptions::default();
        let info = probe(&video, &opts).await.unwrap();
        assert!(info.duration_s <= 1.5, "the container claims {} s", info.duration_s);
        for keyframes in [false, true] {
            let frames = decode(&video, &opts, keyframes, info.duration_s + 1.0).await.unwrap();
            let most = ((info.duration_s + 1.0) * opts.fps).ceil() as usize + 1;
            assert!(
                frames.raws.len() <= most,
                "keyframes={keyframes}: {} frames decoded from a file probed at {} s",
                frames.raws.len(),
                info.duration_s
            );
        }
        let limited = AnalyzeOptions {
            max_duration_s: Some(5.0),
            ..Default::default()
        };
        let analysis = analyze(&video, &limited).await.unwrap();
        assert_eq!(analysis.frames.len(), (info.duration_s * opts.fps).ceil() as usize);
        let hurried = AnalyzeOptions {
            timeout: std::time::Duration::from_nanos(1),
            ..Default::default()
        };
        let e = analyze(&video, &hurried).await.unwrap_err();
        assert!(e.to_string().contains("took longer"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    pub(crate) fn temp_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("v2m-test-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[tokio::test]
    async fn analyses_duration_and_cut() {
        let dir = temp_dir("analysis");
        let video = make_video(&dir, 6.0, 3.0);
        for mode in [DecodeMode::Full, DecodeMode::Keyframes] {
            let opts = AnalyzeOptions {
                mode,
                ..Default::default()
            };
            let a = analyze(&video, &opts).await.unwrap();
            assert!((a.duration_s() - 6.0).abs() < 0.05, "{}", a.duration_s());
            assert_eq!(a.frames.len(), 24);
            assert_eq!(a.mode, mode);
            assert!(
                a.cuts.iter().any(|c| (c - 3.0).abs() <= 0.5),
                "{mode:?}: cuts {:?}",
                a.cuts
            );
            for f in &a.frames {
                assert!((0.0..=1.0).contains(&f.brightness));
                assert!((0.0..=1.0).contains(&f.motion));
            }
        }
        std::fs::remove_dir_all(dir).ok();
    }

    #[tokio::test]
    async fn auto_mode_decodes_small_videos_fully() {
        let dir = temp_dir("auto");
        let video = make_video(&dir, 4.0, 2.0);
        let a = analyze(&video, &AnalyzeOptions::default()).await.unwrap();
        assert_eq!(a.mode, DecodeMode::Full);
        let tiny_budget = AnalyzeOptions {
            full_decode_budget_mpix: 1.0,
            ..Default::default()
        };
        let b = analyze(&video, &tiny_budget).await.unwrap();
        assert_eq!(b.mode, DecodeMode::Keyframes);
        std::fs::remove_dir_all(dir).ok();
    }

    #[tokio::test]
    async fn rejects_non_video() {
        let dir = temp_dir("notvideo");
        let p = dir.join("x.mp4");
        std::fs::write(&p, b"this is not a video at all").unwrap();
        let err = analyze(&p, &AnalyzeOptions::default()).await.unwrap_err();
        assert_eq!(err.code(), "unreadable_video");
        std::fs::remove_dir_all(dir).ok();
    }

    #[tokio::test]
    async fn rejects_audio_only() {
        let dir = temp_dir("audioonly");
        let p = dir.join("a.wav");
        let ok = std::process::Command::new("ffmpeg")
            .args(["-y", "-v", "error", "-f", "lavfi", "-i", "sine=d=1"])
            .arg(&p)
            .status()
            .unwrap();
        assert!(ok.success());
        let err = probe(&p, &AnalyzeOptions::default()).await.unwrap_err();
        assert_eq!(err.code(), "missing_video");
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn duration_limit() {
        assert!(check_duration(360.0, Some(360.0)).is_ok());
        let e = check_duration(361.0, Some(360.0)).unwrap_err();
        assert_eq!(e.code(), "video_too_long");
    }

    #[test]
    fn periodic_key_frames() {
        let keys = [0.0, 10.0, 13.0, 23.0, 26.0, 31.0];
        assert_eq!(periodic_keys(&keys, 25.0), vec![false, true, false, true, false, false]);
        assert_eq!(periodic_keys(&[0.0, 5.0], 25.0), vec![false, false]);
    }

    #[test]
    fn cut_spacing_keeps_strongest() {
        let h = [0.0, 0.0, 0.4, 0.6, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5];
        let d = [0.0, 0.0, 0.1, 0.1, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.1];
        assert_eq!(detect_cuts(&h, &d, 4), vec![3, 10]);
    }
}
