//! Incremental rendering of a [`Score`] with `rustysynth` into WAV chunks.
//!
//! Chain: rustysynth (its own reverb/chorus off: they double the per-voice
//! cost) at the output rate or half of it → a small stereo comb/allpass
//! reverb → a gentle stereo-linked compressor and soft limiter → half-band
//! 2× upsampling when rendering at half rate → master fades → 16-bit PCM.

use std::fs::File;
use std::io::BufReader;
use std::path::Path;
use std::sync::Arc;

use rustysynth::{SoundFont, Synthesizer, SynthesizerSettings};

use super::compose::{Score, TrackPlan};
use super::{wav, V2mError, CHANNELS};

/// Checks that `path` can be read and starts as a SoundFont does (a RIFF file of form
/// `sfbk`), without loading it.
pub fn check_soundfont(path: &Path) -> Result<(), V2mError> {
    use std::io::Read;
    let fail = |why: String| V2mError::SoundFont(format!("{}: {why}", path.display()));
    let mut header = [0u8; 12];
    File::open(path)
        .and_then(|mut f| f.read_exact(&mut header))
        .map_err(|e| fail(e.to_string()))?;
    if &header[..4] != b"RIFF" || &header[8..] != b"sfbk" {
        return Err(fail("not a SoundFont (no RIFF sfbk header)".into()));
    }
    Ok(())
}

/// Loads a SoundFont file once, for sharing between renderers.
pub fn load_soundfont(path: &Path) -> Result<Arc<SoundFont>, V2mError> {
    let f = File::open(path).map_err(|e| V2mError::SoundFont(format!("{}: {e}", path.display())))?;
    let sf =
        SoundFont::new(&mut BufReader::new(f)).map_err(|e| V2mError::SoundFont(format!("{}: {e}", path.display())))?;
    Ok(Arc::new(sf))
}

/// Gentle stereo-linked compressor followed by a soft limiter.
#[derive(Debug, Clone)]
struct Dynamics {
    env: f32,
    input_gain: f32,
    attack: f32,
    release: f32,
    threshold: f32,
    ratio: f32,
    makeup: f32,
}

impl Dynamics {
    fn new(sample_rate: f32) -> Self {
        Self {
            env: 0.0,
            input_gain: 3.0,
            attack: 1.0 - (-1.0 / (0.005 * sample_rate)).exp(),
            release: 1.0 - (-1.0 / (0.200 * sample_rate)).exp(),
            threshold: 0.35,
            ratio: 3.0,
            makeup: 1.3,
        }
    }

    fn process(&mut self, l: &mut f32, r: &mut f32) {
        *l *= self.input_gain;
        *r *= self.input_gain;
        let peak = l.abs().max(r.abs());
        let coef = if peak > self.env { self.attack } else { self.release };
        self.env += coef * (peak - self.env);
        let mut gain = self.makeup;
        if self.env > self.threshold {
            // Gain reduction: out = th * (env/th)^(1/ratio).
            gain *= (self.env / self.threshold).powf(1.0 / self.ratio - 1.0);
        }
        *l = soft_limit(*l * gain);
        *r = soft_limit(*r * gain);
    }
}

fn soft_limit(x: f32) -> f32 {
    const KNEE: f32 = 0.85;
    let a = x.abs();
    if a <= KNEE {
        x
    } else {
        let over = (a - KNEE) / (1.0 - KNEE);
        x.signum() * (KNEE + (1.0 - KNEE) * over.tanh())
    }
}

/// Small stereo reverb: four damped feedback combs and two allpasses per
/// channel, fed with the mono sum, mixed back at `wet`.
#[derive(Debug, Clone)]
struct Reverb {
    combs: [[Delay; 4]; 2],
    damp_state: [[f32; 4]; 2],
    allpasses: [[Delay; 2]; 2],
    feedback: f32,
    damp: f32,
    wet: f32,
}

#[derive(Debug, Clone)]
struct Delay {
    buf: Vec<f32>,
    pos: usize,
}

impl Delay {
    fn new(len: usize) -> Self {
        Self {
            buf: vec![0.0; len.max(1)],
            pos: 0,
        }
    }
    #[inline]
    fn read(&self) -> f32 {
        self.buf[self.pos]
    }
    #[inline]
    fn write_advance(&mut self, x: f32) {
        self.buf[self.pos] = x;
        self.pos += 1;
        if self.pos == self.buf.len() {
            self.pos = 0;
        }
    }
}

impl Reverb {
    fn new(rate: f32, wet: f32) -> Self {
        // Delay lengths in milliseconds, mutually prime-ish, right channel
        // slightly longer for width.
        const COMB_MS: [f32; 4] = [24.9, 27.2, 29.5, 31.9];
        const AP_MS: [f32; 2] = [5.1, 12.6];
        let ms = |m: f32, spread: f32| ((m + spread) * rate / 1000.0) as usize;
        let combs = [0.0f32, 0.52].map(|sp| COMB_MS.map(|m| Delay::new(ms(m, sp))));
        let allpasses = [0.0f32, 0.31].map(|sp| AP_MS.map(|m| Delay::new(ms(m, sp))));
        Self {
            combs,
            damp_state: [[0.0; 4]; 2],
            allpasses,
            feedback: 0.83,
            damp: 0.35,
            wet,
        }
    }

    #[inline]
    fn process(&mut self, l: &mut f32, r: &mut f32) {
        if self.wet <= 0.0 {
            return;
        }
        let input = (*l + *r) * 0.25;
        let mut outs = [0.0f32; 2];
        for (ch, out) in outs.iter_mut().enumerate() {
            let mut acc = 0.0;
            for (k, comb) in self.combs[ch].iter_mut().enumerate() {
                let y = comb.read();
                let st = &mut self.damp_state[ch][k];
                *st = y * (1.0 - self.damp) + *st * self.damp;
                comb.write_advance(input + *st * self.feedback);
                acc += y;
            }
            for ap in self.allpasses[ch].iter_mut() {
                let b = ap.read();
                let y = b - 0.5 * acc;
                ap.write_advance(acc + 0.5 * y);
                acc = y;
            }
            *out = acc * 0.25;
        }
        *l += outs[0] * self.wet;
        *r += outs[1] * self.wet;
    }
}

/// Half-band interpolation taps (windowed sinc at odd half-sample offsets).
const UP_TAPS: usize = 8;

fn upsample_taps() -> [f32; 2 * UP_TAPS] {
    let mut c = [0f32; 2 * UP_TAPS];
    let n = c.len() as f64;
    for (k, ck) in c.iter_mut().enumerate() {
        let x = k as f64 - (UP_TAPS as f64 - 0.5); // ±0.5, ±1.5, ...
        let sinc = (std::f64::consts::PI * x).sin() / (std::f64::consts::PI * x);
        // Blackman window over the 2*UP_TAPS span.
        let w = {
            let t = (k as f64 + 0.5) / n;
            0.42 - 0.5 * (2.0 * std::f64::consts::PI * t).cos() + 0.08 * (4.0 * std::f64::consts::PI * t).cos()
        };
        *ck = (sinc * w) as f32;
    }
    let sum: f32 = c.iter().sum();
    for ck in &mut c {
        *ck /= sum;
    }
    c
}

/// Rendering options.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RenderOptions {
    /// Audio per chunk in seconds.
    pub chunk_seconds: f64,
    /// Internal synthesis rate: the output rate (best quality) or half of
    /// it (about twice as fast; content above ~10 kHz is lost), upsampled
    /// to the output rate with a half-band filter.
    pub half_rate: bool,
    /// Maximum simultaneous synth voices.
    pub polyphony: usize,
}

impl Default for RenderOptions {
    fn default() -> Self {
        Self {
            chunk_seconds: 0.5,
            half_rate: true,
            polyphony: 48,
        }
    }
}

/// Renders one plan block by block; each item is the next slice of a single
/// WAV file (the first starts with the header). Cancel by dropping it.
pub struct Renderer {
    synth: Synthesizer,
    score: Arc<Score>,
    next_event: usize,
    /// Output frames emitted so far.
    pos: u64,
    chunk_frames: u64,
    /// The WAV header, until the first chunk takes it.
    header: Option<[u8; wav::HEADER_LEN]>,
    /// Output rate / internal rate (1 or 2).
    ratio: u64,
    /// Internal samples rendered and post-processed, from index `ibase`.
    il: Vec<f32>,
    ir: Vec<f32>,
    ibase: u64,
    scratch_l: Vec<f32>,
    scratch_r: Vec<f32>,
    out_l: Vec<f32>,
    out_r: Vec<f32>,
    taps: [f32; 2 * UP_TAPS],
    dynamics: Dynamics,
    reverb: Reverb,
}

impl std::fmt::Debug for Renderer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Renderer")
            .field("pos", &self.pos)
            .field("total_frames", &self.score.total_frames)
            .finish()
    }
}

impl Renderer {
    /// Prepares a renderer for `plan`; an error when the track is too long for a WAV file.
    pub fn new(soundfont: Arc<SoundFont>, plan: &TrackPlan, opts: &RenderOptions) -> Result<Self, V2mError> {
        let score = plan.score.clone();
        let header = wav::header(score.sample_rate, CHANNELS, wav::data_len(score.total_frames, CHANNELS))
            .map_err(|e| V2mError::GenerationFailed(e.to_string()))?;
        let ratio: u64 = if opts.half_rate { 2 } else { 1 };
        let rate = score.sample_rate as i32 / ratio as i32;
        let mut settings = SynthesizerSettings::new(rate);
        settings.enable_reverb_and_chorus = false;
        settings.maximum_polyphony = opts.polyphony.clamp(8, 256);
        let synth = Synthesizer::new(&soundfont, &settings)
            .map_err(|e| V2mError::GenerationFailed(format!("synthesizer: {e}")))?;
        let chunk_frames = ((opts.chunk_seconds.clamp(0.05, 10.0) * f64::from(score.sample_rate)) as u64).max(64) & !1;
        Ok(Self {
            synth,
            next_event: 0,
            pos: 0,
            chunk_frames,
            header: Some(header),
            ratio,
            il: Vec::new(),
            ir: Vec::new(),
            ibase: 0,
            scratch_l: Vec::new(),
            scratch_r: Vec::new(),
            out_l: Vec::new(),
            out_r: Vec::new(),
            taps: upsample_taps(),
            dynamics: Dynamics::new(rate as f32),
            reverb: Reverb::new(rate as f32, score.reverb_wet),
            score,
        })
    }

    /// Total frames the stream will contain.
    pub fn total_frames(&self) -> u64 {
        self.score.total_frames
    }

    /// Total bytes of the WAV (header included).
    pub fn total_bytes(&self) -> u64 {
        wav::HEADER_LEN as u64 + wav::data_len(self.score.total_frames, CHANNELS)
    }

    /// Renders internal samples until index `upto` (exclusive) is available.
    fn render_internal(&mut self, upto: u64) {
        let have = self.ibase + self.il.len() as u64;
        if upto <= have {
            return;
        }
        let n = (upto - have) as usize;
        self.scratch_l.resize(n, 0.0);
        self.scratch_r.resize(n, 0.0);
        let mut done = 0usize;
        let events = &self.score.events;
        while done < n {
            let now = have + done as u64;
            while self.next_event < events.len() && events[self.next_event].frame / self.ratio <= now {
                let e = events[self.next_event];
                self.synth.process_midi_message(
                    i32::from(e.channel),
                    i32::from(e.command),
                    i32::from(e.data1),
                    i32::from(e.data2),
                );
                self.next_event += 1;
            }
            let until = events
                .get(self.next_event)
                .map(|e| (e.frame / self.ratio).clamp(now + 1, upto))
                .unwrap_or(upto);
            let m = (until - now) as usize;
            self.synth
                .render(&mut self.scratch_l[done..done + m], &mut self.scratch_r[done..done + m]);
            done += m;
        }
        for (l, r) in self.scratch_l.iter_mut().zip(self.scratch_r.iter_mut()) {
            self.reverb.process(l, r);
            self.dynamics.process(l, r);
        }
        self.il.extend_from_slice(&self.scratch_l);
        self.ir.extend_from_slice(&self.scratch_r);
    }

    /// Internal sample `i` (zero before the start).
    #[inline]
    fn at(buf: &[f32], base: u64, i: i64) -> f32 {
        if i < base as i64 {
            0.0
        } else {
            buf[(i - base as i64) as usize]
        }
    }

    /// Renders the next chunk; `None` once the whole file has been emitted.
    pub fn next_chunk(&mut self) -> Option<Vec<u8>> {
        let total = self.score.total_frames;
        if self.pos >= total && self.header.is_none() {
            return None;
        }
        let n = self.chunk_frames.min(total - self.pos) as usize;
        let mut out = Vec::with_capacity(n * 4 + wav::HEADER_LEN);
        if let Some(header) = self.header.take() {
            out.extend_from_slice(&header);
        }
        let start = self.pos;
        self.out_l.clear();
        self.out_r.clear();
        if self.ratio == 1 {
            self.render_internal(start + n as u64);
            let off = (start - self.ibase) as usize;
            self.out_l.extend_from_slice(&self.il[off..off + n]);
            self.out_r.extend_from_slice(&self.ir[off..off + n]);
        } else {
            // Output frame 2m is internal sample m; 2m+1 interpolates
            // between m-UP_TAPS+1 ..= m+UP_TAPS.
            let last_m = (start + n as u64 - 1) / 2;
            self.render_internal(last_m + UP_TAPS as u64 + 1);
            let base = self.ibase;
            for f in start..start + n as u64 {
                let m = (f / 2) as i64;
                if f % 2 == 0 {
                    self.out_l.push(Self::at(&self.il, base, m));
                    self.out_r.push(Self::at(&self.ir, base, m));
                } else {
                    let (mut l, mut r) = (0.0, 0.0);
                    let first = m - UP_TAPS as i64 + 1;
                    for (k, c) in self.taps.iter().enumerate() {
                        let i = first + k as i64;
                        l += c * Self::at(&self.il, base, i);
                        r += c * Self::at(&self.ir, base, i);
                    }
                    self.out_l.push(l);
                    self.out_r.push(r);
                }
            }
        }
        self.apply_fades(start);
        wav::push_pcm16(&mut out, &self.out_l, &self.out_r);
        self.pos = start + n as u64;
        // Drop internal samples no longer needed (keep the filter history).
        let keep_from = (self.pos / self.ratio).saturating_sub(2 * UP_TAPS as u64);
        if keep_from > self.ibase + 4096 {
            let d = (keep_from - self.ibase) as usize;
            self.il.drain(..d);
            self.ir.drain(..d);
            self.ibase = keep_from;
        }
        Some(out)
    }

    fn apply_fades(&mut self, start: u64) {
        let total = self.score.total_frames;
        let fi = self.score.fade_in_frames;
        let fo = self.score.fade_out_frames.min(total);
        let fo_start = total - fo;
        let n = self.out_l.len() as u64;
        if start >= fi && start + n <= fo_start {
            return;
        }
        for (i, (l, r)) in self.out_l.iter_mut().zip(self.out_r.iter_mut()).enumerate() {
            let f = start + i as u64;
            let mut g = 1.0f32;
            if f < fi {
                g *= f as f32 / fi as f32;
            }
            if f >= fo_start && fo > 0 {
                // Cosine fade reaching zero on the last frame.
                let x = (f - fo_start) as f32 / (fo.max(2) - 1) as f32;
                g *= 0.5 * (1.0 + (std::f32::consts::PI * x.min(1.0)).cos());
            }
            *l *= g;
            *r *= g;
        }
    }
}

impl Iterator for Renderer {
    type Item = Vec<u8>;

    fn next(&mut self) -> Option<Vec<u8>> {
        self.next_chunk()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{plan, Analysis, DEFAULT_SOUNDFONT};

    fn sf() -> Arc<SoundFont> {
        load_soundfont(Path::new(DEFAULT_SOUNDFONT)).unwrap()
    }

    #[test]
    fn chunks_form_exact_wav_and_are_deterministic() {
        let sf = sf();
        let a = Analysis::synthetic(3.3, &[], 0.5, 0.5);
        let p = &plan(&a, &["happy piano drums"], 1, 9)[0];
        let opts = RenderOptions::default();
        let r = Renderer::new(sf.clone(), p, &opts).unwrap();
        let total = r.total_bytes();
        let chunks: Vec<Vec<u8>> = r.collect();
        assert_eq!(chunks.len(), 7);
        assert_eq!(&chunks[0][0..4], b"RIFF");
        let all: Vec<u8> = chunks.concat();
        assert_eq!(all.len() as u64, total);
        assert_eq!(all.len(), 44 + 3.3f64.mul_add(44_100.0, 0.0).round() as usize * 4);
        // Not silent, and the final sample is faded to zero.
        let samples: Vec<i16> = all[44..]
            .chunks_exact(2)
            .map(|b| i16::from_le_bytes([b[0], b[1]]))
            .collect();
        assert!(samples.iter().map(|s| s.unsigned_abs()).max().unwrap() > 1000);
        assert_eq!(samples[samples.len() - 1], 0);
        let small = RenderOptions {
            chunk_seconds: 0.25,
            ..opts
        };
        let again: Vec<u8> = Renderer::new(sf.clone(), p, &small).unwrap().flatten().collect();
        assert_eq!(again, all, "chunk size must not change the audio");
        let full_rate = RenderOptions {
            half_rate: false,
            ..opts
        };
        let full: Vec<u8> = Renderer::new(sf, p, &full_rate).unwrap().flatten().collect();
        assert_eq!(full.len(), all.len());
    }

    #[test]
    fn odd_frame_count_half_rate() {
        let a = Analysis::synthetic(22_051.0 / 44_100.0, &[], 0.3, 0.2);
        let p = &plan(&a, &[], 1, 3)[0];
        assert_eq!(p.total_frames, 22_051);
        let all: Vec<u8> = Renderer::new(sf(), p, &RenderOptions::default())
            .unwrap()
            .flatten()
            .collect();
        assert_eq!(all.len(), 44 + 22_051 * 4);
    }

    #[test]
    fn renderer_is_send() {
        fn send<T: Send + 'static>() {}
        send::<Renderer>();
        send::<crate::Engine>();
        fn sync<T: Sync>() {}
        sync::<crate::Engine>();
    }

    #[test]
    fn missing_soundfont_is_typed() {
        let e = load_soundfont(Path::new("/nonexistent.sf2")).unwrap_err();
        assert_eq!(e.code(), "soundfont_error");
    }
}
