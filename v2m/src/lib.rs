//! weft-v2m: the video-to-music engine. It knows nothing of HTTP, jobs or wasm: the server
//! builds one [`Engine`] at start-up and passes it to its endpoint and to the `VideoToMusic`
//! node's capability.
//!
//! This is a **procedural, deterministic** composer, not a neural model: it
//! measures simple visual features of the video (brightness, colour, motion,
//! scene cuts), maps them plus mood/instrument words from the prompt onto
//! musical choices (tempo, key, mode, progression, instrumentation, density)
//! with a seeded PRNG, and renders the resulting score with a General MIDI
//! SoundFont through `rustysynth`. Same inputs and seed give the same bytes.
//!
//! Flow: [`Engine::probe`] (container headers only: duration limit check,
//! missing/unreadable video) → [`Engine::analyze_probed`] → [`plan`] (one
//! [`TrackPlan`] per prompt × copy, instant) → [`Engine::render`] (a blocking
//! iterator of WAV byte chunks; pull it inside `spawn_blocking` and stop
//! pulling to cancel). The chunks of one stream concatenated are one valid
//! WAV file of exactly `TrackPlan::total_frames` frames.
//!
//! Callers map [`V2mError`] onto their own errors (the server's HTTP endpoint onto
//! `{detail: {code, message}}`); the `VideoToMusic` node calls [`Engine::generate_blocking`].
//! Videos are written for ffmpeg as [`TempVideo`]s under [`V2mConfig::temp_dir`].
//!
//! ```ignore
//! let engine = Engine::new(V2mConfig::default())?;          // once, at startup
//! let info = engine.probe(&path).await?;                    // -> `duration` event
//! let analysis = engine.analyze_probed(&path, info).await?;
//! let plans = v2m::plan(&analysis, &[prompt], copies, seed); // -> `titles` event
//! for p in plans {
//!     let mut r = engine.render(&p)?;                        // -> `title` event
//!     tokio::task::spawn_blocking(move || {
//!         for chunk in &mut r { if tx.blocking_send(chunk).is_err() { break } }
//!     });                                                    // -> `audio_chunk` events
//! }
//! ```

pub mod analysis;
pub mod compose;
pub mod synth;
mod temp;
pub mod wav;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub use analysis::{Analysis, AnalyzeOptions, DecodeMode, VideoInfo};
pub use compose::{plan, Score, TrackPlan};
pub use synth::{RenderOptions, Renderer};
pub use temp::{prepare_temp_dir, TempVideo};

/// Output sample rate in Hz.
pub const SAMPLE_RATE: u32 = 44_100;
/// Output channel count.
pub const CHANNELS: u16 = 2;
/// SoundFont used when none is configured.
pub const DEFAULT_SOUNDFONT: &str = "/usr/share/sounds/sf2/TimGM6mb.sf2";
/// Largest video accepted when no limit is configured, in bytes.
pub const DEFAULT_MAX_UPLOAD_BYTES: u64 = 300_000_000;

/// Longest accepted video by default, in seconds: six minutes.
pub const DEFAULT_MAX_DURATION_SECS: u64 = 360;

/// Most copies per prompt by default.
pub const DEFAULT_MAX_COPIES: u32 = 4;

/// Errors of the engine; [`V2mError::code`] gives a stable snake_case code.
#[derive(Debug, thiserror::Error)]
pub enum V2mError {
    /// The request carried no video (or the file has no video stream).
    #[error("no video stream found")]
    MissingVideo,
    /// ffprobe/ffmpeg could not read the file.
    #[error("unreadable video: {0}")]
    UnreadableVideo(String),
    /// The video exceeds the configured maximum duration.
    #[error("video is {duration_s:.1} s long; the limit is {max_duration_s:.0} s")]
    VideoTooLong {
        /// Probed duration.
        duration_s: f64,
        /// Configured limit.
        max_duration_s: f64,
    },
    /// More copies were requested than allowed.
    #[error("{requested} copies requested; the limit is {max}")]
    TooManyCopies {
        /// Requested copies.
        requested: u32,
        /// Configured limit.
        max: u32,
    },
    /// The SoundFont could not be loaded.
    #[error("soundfont: {0}")]
    SoundFont(String),
    /// Any other failure while generating.
    #[error("generation failed: {0}")]
    GenerationFailed(String),
}

impl V2mError {
    /// Stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            V2mError::MissingVideo => "missing_video",
            V2mError::UnreadableVideo(_) => "unreadable_video",
            V2mError::VideoTooLong { .. } => "video_too_long",
            V2mError::TooManyCopies { .. } => "too_many_copies",
            V2mError::SoundFont(_) => "soundfont_error",
            V2mError::GenerationFailed(_) => "generation_failed",
        }
    }
}

/// Engine configuration.
#[derive(Debug, Clone)]
pub struct V2mConfig {
    /// General MIDI SoundFont (`.sf2`).
    pub soundfont: PathBuf,
    /// Longest accepted video.
    pub max_duration: Duration,
    /// Most copies per prompt.
    pub max_copies: u32,
    /// Largest accepted upload in bytes.
    pub max_upload_bytes: u64,
    /// Rendering options (chunk length, half-rate synthesis, polyphony).
    pub render: RenderOptions,
    /// Analysis options (ffmpeg/ffprobe paths, decode mode...);
    /// `max_duration_s` is overridden by `max_duration`.
    pub analysis: AnalyzeOptions,
    /// Where videos are written for ffmpeg to read (see [`TempVideo`]).
    pub temp_dir: PathBuf,
    /// Analyses (ffmpeg decodes) that run at once; more wait their turn. One per core by
    /// default: each keeps a core busy.
    pub max_concurrent_analyses: usize,
}

impl Default for V2mConfig {
    fn default() -> Self {
        Self {
            soundfont: PathBuf::from(DEFAULT_SOUNDFONT),
            max_duration: Duration::from_secs(DEFAULT_MAX_DURATION_SECS),
            max_copies: DEFAULT_MAX_COPIES,
            max_upload_bytes: DEFAULT_MAX_UPLOAD_BYTES,
            render: RenderOptions::default(),
            analysis: AnalyzeOptions::default(),
            temp_dir: std::env::temp_dir(),
            max_concurrent_analyses: std::thread::available_parallelism().map_or(2, |n| n.get()),
        }
    }
}

/// The engine: configuration plus the SoundFont, loaded at the first render and shared.
#[derive(Clone)]
pub struct Engine {
    cfg: V2mConfig,
    /// The SoundFont once a render has needed it. Its samples are several MB, which a server
    /// that never renders music should not hold.
    soundfont: Arc<std::sync::Mutex<Option<Arc<rustysynth::SoundFont>>>>,
    /// One permit per analysis (ffmpeg decode) allowed at once, shared by every caller.
    analyses: Arc<tokio::sync::Semaphore>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("cfg", &self.cfg).finish()
    }
}

impl Engine {
    /// An engine for `cfg`. The SoundFont it names must be readable and look like one (a
    /// header check); it is loaded by the first render (a blocking read of several MB).
    pub fn new(cfg: V2mConfig) -> Result<Self, V2mError> {
        synth::check_soundfont(&cfg.soundfont)?;
        let analyses = Arc::new(tokio::sync::Semaphore::new(cfg.max_concurrent_analyses.max(1)));
        Ok(Self {
            cfg,
            soundfont: Arc::default(),
            analyses,
        })
    }

    /// The SoundFont, loaded on first use (blocking). A load that fails is tried again by
    /// the next call.
    pub fn soundfont(&self) -> Result<Arc<rustysynth::SoundFont>, V2mError> {
        let mut loaded = self.soundfont.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(font) = loaded.as_ref() {
            return Ok(font.clone());
        }
        let font = synth::load_soundfont(&self.cfg.soundfont)?;
        *loaded = Some(font.clone());
        Ok(font)
    }

    /// The configuration.
    pub fn config(&self) -> &V2mConfig {
        &self.cfg
    }

    /// A fresh video file name under the configured temporary directory.
    pub fn temp_video(&self) -> TempVideo {
        TempVideo::new(&self.cfg.temp_dir)
    }

    fn analyze_options(&self) -> AnalyzeOptions {
        AnalyzeOptions {
            max_duration_s: Some(self.cfg.max_duration.as_secs_f64()),
            ..self.cfg.analysis.clone()
        }
    }

    /// Rejects copy counts of 0 or over the limit.
    pub fn check_copies(&self, copies: u32) -> Result<(), V2mError> {
        if copies == 0 || copies > self.cfg.max_copies {
            return Err(V2mError::TooManyCopies {
                requested: copies,
                max: self.cfg.max_copies,
            });
        }
        Ok(())
    }

    /// Probes the duration and enforces `max_duration` (no decode).
    pub async fn probe_duration(&self, path: &Path) -> Result<f64, V2mError> {
        let opts = self.analyze_options();
        let d = analysis::probe_duration(path, &opts).await?;
        analysis::check_duration(d, opts.max_duration_s)?;
        Ok(d)
    }

    /// Probes container facts and enforces `max_duration` (no decode).
    pub async fn probe(&self, path: &Path) -> Result<VideoInfo, V2mError> {
        let opts = self.analyze_options();
        let info = analysis::probe(path, &opts).await?;
        analysis::check_duration(info.duration_s, opts.max_duration_s)?;
        Ok(info)
    }

    /// Analysis of a video already checked with [`Engine::probe`] (saves
    /// the second ffprobe run). Waits for one of the engine's analysis permits.
    pub async fn analyze_probed(&self, path: &Path, info: VideoInfo) -> Result<Analysis, V2mError> {
        let _permit = self.analysis_permit().await?;
        analysis::analyze_probed(path, info, &self.analyze_options()).await
    }

    /// Full analysis (includes the duration check). Waits for one of the engine's analysis
    /// permits.
    pub async fn analyze(&self, path: &Path) -> Result<Analysis, V2mError> {
        let _permit = self.analysis_permit().await?;
        analysis::analyze(path, &self.analyze_options()).await
    }

    async fn analysis_permit(&self) -> Result<tokio::sync::SemaphorePermit<'_>, V2mError> {
        self.analyses
            .acquire()
            .await
            .map_err(|_| V2mError::GenerationFailed("the engine is shutting down".into()))
    }

    /// Starts rendering `plan`; the returned iterator yields WAV chunks. Blocks while the
    /// first render loads the SoundFont ([`soundfont`](Self::soundfont)); CPU-bound: pull
    /// it from `spawn_blocking`.
    pub fn render(&self, plan: &TrackPlan) -> Result<Renderer, V2mError> {
        Renderer::new(self.soundfont()?, plan, &self.cfg.render)
    }
}

impl Engine {
    /// The whole pipeline for one stream, without an async runtime: probe (with the
    /// duration limit), analyse, compose and render `path` into interleaved stereo `f32`
    /// samples at [`SAMPLE_RATE`]. Blocks; `canceled` is polled every [`CANCEL_POLL`]
    /// while the video is probed and analysed (a cancel kills ffprobe and ffmpeg) and
    /// between chunks of the render (half a second of audio each), and stops the work with
    /// `Ok(None)`.
    pub fn generate_blocking(
        &self,
        path: &Path,
        prompt: Option<&str>,
        seed: u64,
        canceled: &dyn Fn() -> bool,
    ) -> Result<Option<Vec<f32>>, V2mError> {
        let Some(analysis) = self.analyze_blocking(path, canceled)? else {
            return Ok(None);
        };
        let prompts: Vec<&str> = prompt.into_iter().filter(|p| !p.trim().is_empty()).collect();
        let track = plan(&analysis, &prompts, 1, seed).remove(0);
        let mut samples = Vec::with_capacity(track.total_frames as usize * usize::from(CHANNELS));
        let mut first = true;
        for chunk in self.render(&track)? {
            if canceled() {
                return Ok(None);
            }
            let pcm = if first { &chunk[wav::HEADER_LEN..] } else { &chunk[..] };
            first = false;
            samples.extend(
                pcm.chunks_exact(2)
                    .map(|b| f32::from(i16::from_le_bytes([b[0], b[1]])) / 32767.0),
            );
        }
        Ok(Some(samples))
    }

    /// Probes and analyses `path` on a thread of its own, with a runtime of its own
    /// (ffmpeg runs under tokio's process support, and the caller may or may not be inside
    /// a runtime), asking `canceled` every [`CANCEL_POLL`] meanwhile. Once it says so, the
    /// analysis is dropped (which kills its ffprobe and ffmpeg) and this returns `Ok(None)`.
    fn analyze_blocking(&self, path: &Path, canceled: &dyn Fn() -> bool) -> Result<Option<Analysis>, V2mError> {
        let (engine, owned) = (self.clone(), path.to_path_buf());
        let stop = Arc::new(tokio::sync::Notify::new());
        let (done, finished) = std::sync::mpsc::channel();
        let stopped = stop.clone();
        let analysis = std::thread::spawn(move || {
            let result = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| V2mError::GenerationFailed(format!("runtime: {e}")))
                .and_then(|runtime| {
                    runtime.block_on(async {
                        let work = async {
                            let info = engine.probe(&owned).await?;
                            engine.analyze_probed(&owned, info).await
                        };
                        tokio::select! {
                            result = work => result.map(Some),
                            () = stopped.notified() => Ok(None),
                        }
                    })
                });
            let _ = done.send(result);
        });
        let result = loop {
            if canceled() {
                // A permit stored for the `notified` to come, if it is not waiting yet.
                stop.notify_one();
                let _ = analysis.join();
                return Ok(None);
            }
            match finished.recv_timeout(CANCEL_POLL) {
                Ok(result) => break result,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    break Err(V2mError::GenerationFailed("the analysis panicked".into()))
                }
            }
        };
        let _ = analysis.join();
        result
    }
}

/// How often [`Engine::generate_blocking`] asks its caller whether to stop while the video
/// is analysed.
pub const CANCEL_POLL: Duration = Duration::from_millis(20);

/// Probes a video's duration with `ffprobe` from `PATH`.
pub async fn probe_duration(path: &Path) -> Result<f64, V2mError> {
    analysis::probe_duration(path, &AnalyzeOptions::default()).await
}

/// Analyses a video with default options and the given duration limit.
pub async fn analyze(path: &Path, max_duration: Option<Duration>) -> Result<Analysis, V2mError> {
    let opts = AnalyzeOptions {
        max_duration_s: max_duration.map(|d| d.as_secs_f64()),
        ..Default::default()
    };
    analysis::analyze(path, &opts).await
}

#[cfg(test)]
mod tests {
    use super::analysis::tests::{make_video, temp_dir};
    use super::*;

    fn ffprobe_duration(path: &Path) -> (String, f64, String) {
        let out = std::process::Command::new("ffprobe")
            .args(["-v", "error", "-show_entries"])
            .args(["format=format_name,duration:stream=codec_name,sample_rate,channels"])
            .args(["-of", "default=nw=1"])
            .arg(path)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let get = |k: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{k}=")))
                .unwrap_or("")
                .to_string()
        };
        (get("format_name"), get("duration").parse().unwrap(), text)
    }

    /// A cancel during the analysis ends `generate_blocking` promptly, with `Ok(None)`, and
    /// kills the decoder: here an "ffmpeg" that never answers.
    #[test]
    fn a_cancel_stops_the_analysis_and_kills_its_decoder() {
        use std::os::unix::fs::PermissionsExt;
        let dir = temp_dir("cancel-analysis");
        let video = make_video(&dir, 1.0, 0.5);
        let stalled = dir.join("stalled-ffmpeg");
        let pid_file = dir.join("ffmpeg.pid");
        std::fs::write(
            &stalled,
            format!("#!/bin/sh\necho $$ > {}\nexec sleep 60\n", pid_file.display()),
        )
        .unwrap();
        std::fs::set_permissions(&stalled, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut cfg = V2mConfig::default();
        cfg.analysis.ffmpeg = stalled;
        let engine = Engine::new(cfg).unwrap();
        let asked = std::time::Instant::now();
        let cancel_at = asked + Duration::from_millis(500);
        let canceled = || std::time::Instant::now() >= cancel_at;
        let result = engine.generate_blocking(&video, Some("piano"), 1, &canceled).unwrap();
        assert!(result.is_none(), "canceled");
        assert!(asked.elapsed() < Duration::from_secs(5), "took {:?}", asked.elapsed());
        let pid = std::fs::read_to_string(&pid_file).unwrap();
        let pid = pid.trim();
        // Killed (gone, or a zombie at worst) within moments, not sleeping on.
        let stat = format!("/proc/{pid}/stat");
        let running = || {
            let state = std::fs::read_to_string(&stat).unwrap_or_default();
            state.split_whitespace().nth(2).is_some_and(|s| s != "Z" && s != "X")
        };
        let killed = std::time::Instant::now();
        while running() {
            assert!(killed.elapsed() < Duration::from_secs(2), "the decoder still runs");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[tokio::test]
    async fn end_to_end_video_to_wav() {
        let dir = temp_dir("e2e");
        let video = make_video(&dir, 5.0, 2.5);
        let engine = Engine::new(V2mConfig::default()).unwrap();
        let d = engine.probe_duration(&video).await.unwrap();
        assert!((d - 5.0).abs() < 0.05);
        let a = engine.analyze(&video).await.unwrap();
        assert!(a.cuts.iter().any(|c| (c - 2.5).abs() <= 0.5), "{:?}", a.cuts);
        let plans = plan(&a, &["calm piano"], 2, 1234);
        assert_eq!(plans.len(), 2);
        let mut bytes = Vec::new();
        for p in &plans {
            let r = engine.render(p).unwrap();
            let chunks: Vec<Vec<u8>> = tokio::task::spawn_blocking(move || r.collect()).await.unwrap();
            assert!(chunks.len() > 5);
            bytes.push(chunks.concat());
        }
        assert_ne!(bytes[0], bytes[1], "copies differ");
        let wav_path = dir.join("out.wav");
        std::fs::write(&wav_path, &bytes[0]).unwrap();
        let (fmt, dur, text) = ffprobe_duration(&wav_path);
        assert_eq!(fmt, "wav");
        assert!(text.contains("codec_name=pcm_s16le"), "{text}");
        assert!(text.contains("sample_rate=44100") && text.contains("channels=2"));
        let frames = (bytes[0].len() - wav::HEADER_LEN) / 4;
        assert_eq!(frames as u64, (a.duration_s() * 44_100.0).round() as u64);
        assert!((dur - a.duration_s()).abs() < 1e-3, "{dur} vs {}", a.duration_s());

        // Determinism: same inputs and seed give identical bytes.
        let again = &plan(&a, &["calm piano"], 1, 1234)[0];
        let b2: Vec<u8> = engine.render(again).unwrap().flatten().collect();
        assert_eq!(b2, bytes[0]);
        std::fs::remove_dir_all(dir).ok();
    }

    #[tokio::test]
    async fn limits_are_enforced() {
        let dir = temp_dir("limits");
        let video = make_video(&dir, 3.0, 1.5);
        let engine = Engine::new(V2mConfig {
            max_duration: Duration::from_secs(2),
            max_upload_bytes: 10,
            ..Default::default()
        })
        .unwrap();
        let e = engine.probe_duration(&video).await.unwrap_err();
        assert_eq!(e.code(), "video_too_long");
        let e = engine.analyze(&video).await.unwrap_err();
        assert_eq!(e.code(), "video_too_long");
        assert!(engine.check_copies(4).is_ok());
        assert_eq!(engine.check_copies(5).unwrap_err().code(), "too_many_copies");
        assert!(engine.check_copies(0).is_err());
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn the_soundfont_is_checked_at_start_and_loaded_by_the_first_render() {
        let dir = temp_dir("soundfont");
        let not_a_font = dir.join("notes.sf2");
        std::fs::write(&not_a_font, "hello, not a SoundFont").unwrap();
        let config = |soundfont: PathBuf| V2mConfig {
            soundfont,
            ..Default::default()
        };
        let e = Engine::new(config(not_a_font)).unwrap_err();
        assert_eq!(e.code(), "soundfont_error");
        let e = Engine::new(config(dir.join("missing.sf2"))).unwrap_err();
        assert_eq!(e.code(), "soundfont_error");
        // A file with a SoundFont's header but no body passes the start's check; the first
        // render, which loads it, is where it fails, with the same error.
        let truncated = dir.join("truncated.sf2");
        std::fs::write(&truncated, b"RIFF\x04\x00\x00\x00sfbk").unwrap();
        let engine = Engine::new(config(truncated)).unwrap();
        assert_eq!(engine.soundfont().unwrap_err().code(), "soundfont_error");
        // The real one loads once and is shared.
        let engine = Engine::new(V2mConfig::default()).unwrap();
        let font = engine.soundfont().unwrap();
        assert!(Arc::ptr_eq(&font, &engine.clone().soundfont().unwrap()));
        std::fs::remove_dir_all(dir).ok();
    }

    #[tokio::test]
    async fn non_video_is_unreadable() {
        let dir = temp_dir("garbage");
        let p = dir.join("notes.txt");
        std::fs::write(&p, "hello").unwrap();
        assert_eq!(probe_duration(&p).await.unwrap_err().code(), "unreadable_video");
        std::fs::remove_dir_all(dir).ok();
    }
}
