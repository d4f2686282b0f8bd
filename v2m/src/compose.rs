//! Procedural composition: turns an [`Analysis`], a prompt, a seed and a copy
//! index into a General MIDI [`Score`] whose length equals the video's.
//!
//! Sections start at (merged) scene cuts; each section gets a whole number of
//! bars, so its tempo bends slightly to land exactly on the cut. Motion sets
//! tempo and note density, brightness/colour and mood words set key and mode,
//! instrument words choose GM programs. The first bar is a sparse intro and
//! the last section slows down (ritardando) into a held, fading tonic chord.

use std::sync::Arc;

use serde::Serialize;

use super::analysis::{Analysis, Summary};
use super::{CHANNELS, SAMPLE_RATE};

// ---------------------------------------------------------------- PRNG ----

/// Small deterministic PRNG (SplitMix64).
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed)
    }
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
    fn chance(&mut self, p: f32) -> bool {
        self.f32() < p
    }
    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }
    fn range_i(&mut self, lo: i32, hi: i32) -> i32 {
        lo + self.below((hi - lo + 1) as usize) as i32
    }
}

fn mix(a: u64, b: u64) -> u64 {
    Rng::new(a ^ b.wrapping_mul(0xD6E8_FEB8_6659_FD93)).next_u64()
}

// --------------------------------------------------------------- score ----

/// One MIDI message at an absolute sample frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Event {
    /// Sample frame at which the message takes effect.
    pub frame: u64,
    /// MIDI channel 0..15 (9 = drums).
    pub channel: u8,
    /// Status nibble: 0x80 off, 0x90 on, 0xB0 control, 0xC0 program.
    pub command: u8,
    /// First data byte.
    pub data1: u8,
    /// Second data byte.
    pub data2: u8,
}

/// A renderable score: sorted events plus master fades.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Score {
    /// Output sample rate.
    pub sample_rate: u32,
    /// Exact output length in frames.
    pub total_frames: u64,
    /// Events sorted by frame (controls, then note-offs, then note-ons).
    pub events: Vec<Event>,
    /// Master fade-in length in frames.
    pub fade_in_frames: u64,
    /// Master fade-out length in frames (ends at `total_frames`).
    pub fade_out_frames: u64,
    /// Reverb wet level (0..1).
    pub reverb_wet: f32,
}

/// One section of the piece.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SectionInfo {
    /// Start in seconds.
    pub start_s: f64,
    /// End in seconds.
    pub end_s: f64,
    /// Effective tempo.
    pub tempo_bpm: f64,
    /// Note density level 0..=3.
    pub density: u8,
    /// Number of bars.
    pub bars: u32,
}

/// A planned stream: metadata for the client plus the score to render.
#[derive(Debug, Clone, Serialize)]
pub struct TrackPlan {
    /// Position in the response (prompt_index × copies + copy_index).
    pub stream_index: u32,
    /// Which prompt this stream answers.
    pub prompt_index: u32,
    /// Which copy (variant) of that prompt.
    pub copy_index: u32,
    /// The prompt, if any.
    pub prompt: Option<String>,
    /// Short descriptive title.
    pub title: String,
    /// One-sentence description of the result.
    pub summary: String,
    /// Tags describing the result (mood, key, tempo, instruments).
    pub display_tags: Vec<String>,
    /// Exact duration in seconds (`total_frames / sample_rate`).
    pub duration_s: f64,
    /// Sample rate of the WAV.
    pub sample_rate: u32,
    /// Channel count of the WAV.
    pub channels: u16,
    /// Frames in the WAV.
    pub total_frames: u64,
    /// Main tempo in BPM.
    pub tempo_bpm: u32,
    /// Key, e.g. "A minor".
    pub key: String,
    /// Mood word.
    pub mood: String,
    /// Style word.
    pub style: String,
    /// Instruments used (GM names).
    pub instruments: Vec<String>,
    /// Section layout.
    pub sections: Vec<SectionInfo>,
    /// The score (not serialised).
    #[serde(skip)]
    pub score: Arc<Score>,
}

// ----------------------------------------------------------- vocabulary ----

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mood {
    Calm,
    Happy,
    Sad,
    Dark,
    Epic,
    Tense,
    Dreamy,
    Energetic,
    Romantic,
    Mysterious,
}

impl Mood {
    fn name(self) -> &'static str {
        match self {
            Mood::Calm => "calm",
            Mood::Happy => "happy",
            Mood::Sad => "melancholic",
            Mood::Dark => "dark",
            Mood::Epic => "epic",
            Mood::Tense => "tense",
            Mood::Dreamy => "dreamy",
            Mood::Energetic => "energetic",
            Mood::Romantic => "romantic",
            Mood::Mysterious => "mysterious",
        }
    }
    fn from_word(w: &str) -> Option<Mood> {
        Some(match w {
            "calm" | "peaceful" | "relaxing" | "relaxed" | "gentle" | "soft" | "serene" | "quiet" => Mood::Calm,
            "happy" | "joyful" | "cheerful" | "upbeat" | "fun" | "playful" | "bright" | "sunny" => Mood::Happy,
            "sad" | "melancholic" | "melancholy" | "sorrowful" | "nostalgic" | "lonely" | "emotional" => Mood::Sad,
            "dark" | "gloomy" | "ominous" | "scary" | "horror" | "sinister" => Mood::Dark,
            "epic" | "heroic" | "triumphant" | "cinematic" | "powerful" | "grand" => Mood::Epic,
            "tense" | "suspense" | "suspenseful" | "thriller" | "anxious" | "action" => Mood::Tense,
            "dreamy" | "ethereal" | "floating" | "space" => Mood::Dreamy,
            "energetic" | "fast" | "exciting" | "dance" | "party" | "driving" => Mood::Energetic,
            "romantic" | "love" | "tender" | "warm" => Mood::Romantic,
            "mysterious" | "mystery" | "strange" | "eerie" => Mood::Mysterious,
            _ => return None,
        })
    }
    fn minor(self) -> bool {
        matches!(
            self,
            Mood::Sad | Mood::Dark | Mood::Epic | Mood::Tense | Mood::Mysterious
        )
    }
    fn base_bpm(self) -> f64 {
        match self {
            Mood::Calm => 76.0,
            Mood::Happy => 112.0,
            Mood::Sad => 68.0,
            Mood::Dark => 78.0,
            Mood::Epic => 96.0,
            Mood::Tense => 116.0,
            Mood::Dreamy => 70.0,
            Mood::Energetic => 126.0,
            Mood::Romantic => 82.0,
            Mood::Mysterious => 84.0,
        }
    }
    fn density_bias(self) -> i32 {
        match self {
            Mood::Calm | Mood::Sad | Mood::Dreamy | Mood::Romantic => -1,
            Mood::Energetic | Mood::Epic | Mood::Tense => 1,
            _ => 0,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Style {
    Piano,
    Orchestral,
    Synth,
    LoFi,
    Guitar,
    Ambient,
    Jazz,
    Rock,
}

impl Style {
    fn name(self) -> &'static str {
        match self {
            Style::Piano => "piano",
            Style::Orchestral => "orchestral",
            Style::Synth => "electronic",
            Style::LoFi => "lo-fi",
            Style::Guitar => "acoustic",
            Style::Ambient => "ambient",
            Style::Jazz => "jazz",
            Style::Rock => "rock",
        }
    }
    fn from_word(w: &str) -> Option<Style> {
        Some(match w {
            "piano" | "keys" | "classical" => Style::Piano,
            "orchestral" | "orchestra" | "strings" | "symphonic" | "epic" | "cinematic" => Style::Orchestral,
            "synth" | "synths" | "electronic" | "edm" | "synthwave" | "techno" | "retro" | "cyberpunk" | "8bit" => {
                Style::Synth
            }
            "lofi" | "lo-fi" | "chill" | "chillhop" | "hiphop" | "hip-hop" => Style::LoFi,
            "guitar" | "acoustic" | "folk" | "country" => Style::Guitar,
            "ambient" | "drone" | "atmospheric" | "meditation" => Style::Ambient,
            "jazz" | "jazzy" | "swing" | "lounge" => Style::Jazz,
            "rock" | "metal" | "punk" | "grunge" => Style::Rock,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Comp {
    Sustain,
    Block,
    Arpeggio,
}

/// A GM instrument on a role.
#[derive(Debug, Clone, Copy)]
struct Voice {
    program: u8,
    name: &'static str,
}

const fn v(program: u8, name: &'static str) -> Voice {
    Voice { program, name }
}

const PIANO: Voice = v(0, "piano");
const EPIANO: Voice = v(4, "electric piano");
const CELESTA: Voice = v(8, "celesta");
const MUSIC_BOX: Voice = v(10, "music box");
const VIBES: Voice = v(11, "vibraphone");
const MARIMBA: Voice = v(12, "marimba");
const ORGAN: Voice = v(19, "organ");
const NYLON: Voice = v(24, "nylon guitar");
const STEEL: Voice = v(25, "acoustic guitar");
const CLEAN_GTR: Voice = v(27, "clean electric guitar");
const OVERDRIVE: Voice = v(29, "overdriven guitar");
const DIST_GTR: Voice = v(30, "distortion guitar");
const AC_BASS: Voice = v(32, "upright bass");
const FINGER_BASS: Voice = v(33, "electric bass");
const SYNTH_BASS: Voice = v(38, "synth bass");
const VIOLIN: Voice = v(40, "violin");
const CELLO: Voice = v(42, "cello");
const CONTRABASS: Voice = v(43, "contrabass");
const HARP: Voice = v(46, "harp");
const STRINGS: Voice = v(48, "strings");
const SLOW_STRINGS: Voice = v(49, "slow strings");
const CHOIR: Voice = v(52, "choir");
const TRUMPET: Voice = v(56, "trumpet");
const HORN: Voice = v(60, "french horn");
const BRASS: Voice = v(61, "brass section");
const SAX: Voice = v(65, "saxophone");
const OBOE: Voice = v(68, "oboe");
const CLARINET: Voice = v(71, "clarinet");
const FLUTE: Voice = v(73, "flute");
const SQUARE_LEAD: Voice = v(80, "square lead");
const SAW_LEAD: Voice = v(81, "saw lead");
const NEW_AGE_PAD: Voice = v(88, "new age pad");
const WARM_PAD: Voice = v(89, "warm pad");
const HALO_PAD: Voice = v(94, "halo pad");
const SWEEP_PAD: Voice = v(95, "sweep pad");

/// Roles and their instruments for one track.
#[derive(Debug, Clone)]
struct Band {
    chords: Voice,
    comp: Comp,
    melody: Voice,
    bass: Option<Voice>,
    pad: Option<Voice>,
    counter: Option<Voice>,
    drums: bool,
    sevenths: bool,
    swing: bool,
    melody_octave: i32,
}

fn default_band(style: Style, rng: &mut Rng) -> Band {
    match style {
        Style::Piano => Band {
            chords: PIANO,
            comp: *rng.pick(&[Comp::Arpeggio, Comp::Block]),
            melody: PIANO,
            bass: Some(*rng.pick(&[AC_BASS, CELLO])),
            pad: Some(*rng.pick(&[STRINGS, SLOW_STRINGS])),
            counter: None,
            drums: false,
            sevenths: rng.chance(0.3),
            swing: false,
            melody_octave: 5,
        },
        Style::Orchestral => Band {
            chords: *rng.pick(&[STRINGS, SLOW_STRINGS]),
            comp: Comp::Sustain,
            melody: *rng.pick(&[HORN, VIOLIN, BRASS, FLUTE]),
            bass: Some(CONTRABASS),
            pad: Some(*rng.pick(&[CHOIR, BRASS])),
            counter: Some(*rng.pick(&[HARP, CELESTA])),
            drums: true,
            sevenths: false,
            swing: false,
            melody_octave: 5,
        },
        Style::Synth => Band {
            chords: *rng.pick(&[WARM_PAD, SWEEP_PAD]),
            comp: Comp::Sustain,
            melody: *rng.pick(&[SAW_LEAD, SQUARE_LEAD]),
            bass: Some(SYNTH_BASS),
            pad: None,
            counter: Some(*rng.pick(&[SQUARE_LEAD, CELESTA])),
            drums: true,
            sevenths: rng.chance(0.3),
            swing: false,
            melody_octave: 5,
        },
        Style::LoFi => Band {
            chords: EPIANO,
            comp: Comp::Block,
            melody: *rng.pick(&[VIBES, EPIANO, FLUTE]),
            bass: Some(FINGER_BASS),
            pad: Some(WARM_PAD),
            counter: None,
            drums: true,
            sevenths: true,
            swing: true,
            melody_octave: 5,
        },
        Style::Guitar => Band {
            chords: *rng.pick(&[STEEL, NYLON]),
            comp: Comp::Arpeggio,
            melody: *rng.pick(&[FLUTE, CLARINET, VIOLIN, NYLON]),
            bass: Some(AC_BASS),
            pad: None,
            counter: None,
            drums: true,
            sevenths: false,
            swing: false,
            melody_octave: 5,
        },
        Style::Ambient => Band {
            chords: *rng.pick(&[NEW_AGE_PAD, HALO_PAD, WARM_PAD]),
            comp: Comp::Sustain,
            melody: *rng.pick(&[CELESTA, MUSIC_BOX, FLUTE, VIBES]),
            bass: Some(SLOW_STRINGS),
            pad: Some(CHOIR),
            counter: None,
            drums: false,
            sevenths: rng.chance(0.5),
            swing: false,
            melody_octave: 5,
        },
        Style::Jazz => Band {
            chords: *rng.pick(&[PIANO, EPIANO]),
            comp: Comp::Block,
            melody: *rng.pick(&[SAX, VIBES, TRUMPET]),
            bass: Some(AC_BASS),
            pad: None,
            counter: None,
            drums: true,
            sevenths: true,
            swing: true,
            melody_octave: 5,
        },
        Style::Rock => Band {
            chords: *rng.pick(&[OVERDRIVE, DIST_GTR]),
            comp: Comp::Block,
            melody: *rng.pick(&[CLEAN_GTR, OVERDRIVE, ORGAN]),
            bass: Some(FINGER_BASS),
            pad: None,
            counter: None,
            drums: true,
            sevenths: false,
            swing: false,
            melody_octave: 5,
        },
    }
}

/// Explicit instrument words override roles of the style's band.
fn apply_instrument_words(band: &mut Band, words: &[String]) {
    let has = |w: &str| words.iter().any(|x| x == w);
    let lead = |b: &mut Band, voice: Voice| b.melody = voice;
    if has("piano") {
        band.chords = PIANO;
        if band.comp == Comp::Sustain {
            band.comp = Comp::Arpeggio;
        }
    }
    if has("strings") {
        band.pad = Some(STRINGS);
    }
    if has("guitar") && band.chords.program != STEEL.program {
        band.chords = if has("electric") { CLEAN_GTR } else { STEEL };
        band.comp = Comp::Arpeggio;
    }
    if has("organ") {
        band.chords = ORGAN;
        band.comp = Comp::Sustain;
    }
    if has("choir") || has("voices") {
        band.pad = Some(CHOIR);
    }
    if has("pad") || has("pads") {
        band.pad = Some(WARM_PAD);
    }
    if has("harp") {
        band.counter = Some(HARP);
    }
    if has("bells") || has("music") && has("box") {
        band.counter = Some(MUSIC_BOX);
    }
    for (w, voice) in [
        ("violin", VIOLIN),
        ("cello", CELLO),
        ("flute", FLUTE),
        ("sax", SAX),
        ("saxophone", SAX),
        ("trumpet", TRUMPET),
        ("horn", HORN),
        ("brass", BRASS),
        ("oboe", OBOE),
        ("clarinet", CLARINET),
        ("marimba", MARIMBA),
        ("vibraphone", VIBES),
        ("celesta", CELESTA),
    ] {
        if has(w) {
            lead(band, voice);
        }
    }
    if has("cello") {
        band.melody_octave = 4;
    }
    if has("drums") || has("beat") || has("beats") || has("percussion") {
        band.drums = true;
    }
    let negated = words
        .windows(2)
        .any(|p| matches!(p[0].as_str(), "no" | "without") && p[1].starts_with("drum"));
    if negated {
        band.drums = false;
    }
}

const MAJOR: [i32; 7] = [0, 2, 4, 5, 7, 9, 11];
const MINOR: [i32; 7] = [0, 2, 3, 5, 7, 8, 10];
const NOTE_NAMES: [&str; 12] = ["C", "Db", "D", "Eb", "E", "F", "F#", "G", "Ab", "A", "Bb", "B"];

const MAJOR_PROGS: [[i32; 4]; 6] = [
    [0, 4, 5, 3],
    [0, 5, 3, 4],
    [0, 3, 4, 3],
    [5, 3, 0, 4],
    [0, 3, 5, 4],
    [3, 4, 2, 5],
];
const MINOR_PROGS: [[i32; 4]; 6] = [
    [0, 5, 2, 6],
    [0, 3, 4, 0],
    [0, 6, 5, 6],
    [0, 5, 3, 4],
    [0, 3, 6, 2],
    [5, 6, 0, 0],
];

// ------------------------------------------------------------ builder ----

struct Builder {
    sr: f64,
    total: u64,
    events: Vec<(Event, u8)>,
    /// (channel, key, velocity, on frame, off frame).
    notes: Vec<(u8, u8, u8, u64, u64)>,
}

impl Builder {
    fn new(sr: f64, total: u64) -> Self {
        Self {
            sr,
            total,
            events: Vec::new(),
            notes: Vec::new(),
        }
    }
    fn frame(&self, t: f64) -> u64 {
        ((t.max(0.0) * self.sr).round() as u64).min(self.total.saturating_sub(1))
    }
    fn push(&mut self, t: f64, channel: u8, command: u8, d1: u8, d2: u8, rank: u8) {
        let frame = self.frame(t);
        self.events.push((
            Event {
                frame,
                channel,
                command,
                data1: d1,
                data2: d2,
            },
            rank,
        ));
    }
    fn cc(&mut self, t: f64, ch: u8, cc: u8, val: u8) {
        self.push(t, ch, 0xB0, cc, val.min(127), 0);
    }
    fn note(&mut self, ch: u8, key: i32, vel: f32, on: f64, off: f64) {
        if !(0..=127).contains(&key) || off <= on {
            return;
        }
        let vel = vel.round().clamp(1.0, 127.0) as u8;
        let (on, off) = (self.frame(on), self.frame(off));
        if off <= on {
            return;
        }
        self.notes.push((ch, key as u8, vel, on, off));
    }
    /// Sorts everything into playable order. A note-off releases every voice
    /// of that key on the channel, so a note overlapping the next note of the
    /// same key is cut where the next one starts (a re-strike), instead of
    /// silencing it.
    fn finish(mut self) -> Vec<Event> {
        self.notes.sort_by_key(|n| (n.0, n.1, n.3, n.4));
        let mut kept: Vec<(u8, u8, u8, u64, u64)> = Vec::with_capacity(self.notes.len());
        for n in self.notes {
            if let Some(prev) = kept.last_mut() {
                if prev.0 == n.0 && prev.1 == n.1 && prev.4 > n.3 {
                    if prev.3 == n.3 {
                        // Same key struck twice at once: keep the louder/longer.
                        prev.2 = prev.2.max(n.2);
                        prev.4 = prev.4.max(n.4);
                        continue;
                    }
                    prev.4 = n.3;
                }
            }
            kept.push(n);
        }
        for (ch, key, vel, on, off) in kept {
            let mk = |frame, command, d2| Event {
                frame,
                channel: ch,
                command,
                data1: key,
                data2: d2,
            };
            self.events.push((mk(on, 0x90, vel), 2));
            self.events.push((mk(off, 0x80, 0), 1));
        }
        self.events.sort_by_key(|(e, rank)| (e.frame, *rank));
        self.events.into_iter().map(|(e, _)| e).collect()
    }
}

const CH_CHORDS: u8 = 0;
const CH_MELODY: u8 = 1;
const CH_BASS: u8 = 2;
const CH_PAD: u8 = 3;
const CH_COUNTER: u8 = 4;
const CH_DRUMS: u8 = 9;

/// Key and scale helpers.
#[derive(Debug, Clone, Copy)]
struct Key {
    tonic: i32, // pitch class
    minor: bool,
}

impl Key {
    fn scale(&self) -> &'static [i32; 7] {
        if self.minor {
            &MINOR
        } else {
            &MAJOR
        }
    }
    /// MIDI pitch of scale index `s` (0 = tonic in octave 4 → C4 = 60).
    fn pitch(&self, s: i32) -> i32 {
        let o = s.div_euclid(7);
        let d = s.rem_euclid(7) as usize;
        60 + self.tonic + self.scale()[d] + 12 * o
    }
    fn name(&self) -> String {
        format!(
            "{} {}",
            NOTE_NAMES[self.tonic as usize],
            if self.minor { "minor" } else { "major" }
        )
    }
}

/// Chord on scale degree `deg`: scale indices of its tones.
fn chord_tones(deg: i32, sevenths: bool) -> Vec<i32> {
    let mut v = vec![deg, deg + 2, deg + 4];
    if sevenths {
        v.push(deg + 6);
    }
    v
}

/// Pitches of a chord voiced in close position around `center`.
fn voice_chord(key: &Key, deg: i32, sevenths: bool, center: i32) -> Vec<i32> {
    let mut out: Vec<i32> = chord_tones(deg, sevenths)
        .into_iter()
        .map(|s| {
            let p = key.pitch(s);
            let pc = p.rem_euclid(12);
            // Place the pitch class within [center-6, center+6).
            let base = center - 6;
            base + (pc - base).rem_euclid(12)
        })
        .collect();
    out.sort_unstable();
    out
}

/// Maps beat positions within a section to seconds, with an optional
/// ritardando (the section's final bars slow down).
#[derive(Debug, Clone, Copy)]
struct TimeMap {
    start: f64,
    len: f64,
    beats: f64,
    ritard: bool,
}

impl TimeMap {
    fn t(&self, beat: f64) -> f64 {
        let x = (beat / self.beats).clamp(0.0, 1.0);
        let f = if self.ritard {
            const A: f64 = 0.07;
            (1.0 - A) * x + A * x.powi(8)
        } else {
            x
        };
        self.start + f * self.len
    }
}

/// A stretch of the track between two kept cuts.
struct Section {
    start: f64,
    end: f64,
    /// Whole bars, at a tempo bent to fill the section (the last one's final hold aside).
    bars: u32,
    /// Note density, 0 (sparse) to 3 (busy).
    density: u8,
    /// Loudness, 0.35 to 1.
    intensity: f32,
    /// Seconds the final chord is held at the end of the last section; 0 elsewhere.
    final_hold: f64,
}

struct Motif {
    rhythm: Vec<(f64, f64)>,
    steps: Vec<i32>,
}

fn make_motif(rng: &mut Rng, density: u8) -> Motif {
    let pool: &[&[(f64, f64)]] = match density {
        0 => &[&[(0.0, 2.0), (2.0, 2.0)], &[(0.0, 3.0), (3.0, 1.0)], &[(0.0, 4.0)]],
        1 => &[
            &[(0.0, 1.0), (1.0, 1.0), (2.0, 2.0)],
            &[(0.0, 1.5), (1.5, 0.5), (2.0, 2.0)],
            &[(0.0, 2.0), (2.0, 1.0), (3.0, 1.0)],
        ],
        2 => &[
            &[(0.0, 1.0), (1.0, 0.5), (1.5, 0.5), (2.0, 1.0), (3.0, 1.0)],
            &[(0.0, 0.5), (0.5, 0.5), (1.0, 1.0), (2.0, 1.5), (3.5, 0.5)],
            &[(0.0, 1.5), (1.5, 0.5), (2.0, 0.5), (2.5, 0.5), (3.0, 1.0)],
        ],
        _ => &[
            &[
                (0.0, 0.5),
                (0.5, 0.5),
                (1.0, 0.5),
                (1.5, 0.5),
                (2.0, 0.5),
                (2.5, 0.5),
                (3.0, 1.0),
            ],
            &[
                (0.0, 0.75),
                (0.75, 0.25),
                (1.0, 0.5),
                (1.5, 0.5),
                (2.0, 1.0),
                (3.0, 0.5),
                (3.5, 0.5),
            ],
        ],
    };
    let rhythm = rng.pick(pool).to_vec();
    let steps = rhythm
        .iter()
        .map(|_| *rng.pick(&[-2, -1, -1, 0, 1, 1, 2, 3, -3]))
        .collect();
    Motif { rhythm, steps }
}

fn words_of(prompt: Option<&str>) -> Vec<String> {
    prompt
        .unwrap_or("")
        .to_lowercase()
        .split(|c: char| !(c.is_alphanumeric() || c == '-'))
        .filter(|w| !w.is_empty())
        .map(|w| w.to_string())
        .collect()
}

fn explicit_bpm(words: &[String]) -> Option<f64> {
    for (i, w) in words.iter().enumerate() {
        let num = if let Some(n) = w.strip_suffix("bpm") {
            n.parse::<f64>().ok()
        } else if words.get(i + 1).map(|x| x == "bpm").unwrap_or(false) {
            w.parse::<f64>().ok()
        } else {
            None
        };
        if let Some(n) = num.filter(|n| (40.0..=220.0).contains(n)) {
            return Some(n);
        }
    }
    None
}

fn mood_from_video(g: &Summary) -> Mood {
    if g.motion > 0.62 {
        if g.brightness > 0.4 {
            Mood::Energetic
        } else {
            Mood::Tense
        }
    } else if g.brightness < 0.22 {
        if g.motion < 0.3 {
            Mood::Mysterious
        } else {
            Mood::Dark
        }
    } else if g.brightness < 0.35 && g.saturation < 0.25 {
        Mood::Sad
    } else if g.motion < 0.25 {
        if g.saturation < 0.25 {
            Mood::Dreamy
        } else {
            Mood::Calm
        }
    } else if g.saturation > 0.35 && g.brightness > 0.45 {
        Mood::Happy
    } else if g.motion > 0.45 {
        Mood::Epic
    } else {
        Mood::Calm
    }
}

fn style_for_mood(m: Mood, copy: u32) -> Style {
    let opts: &[Style] = match m {
        Mood::Calm => &[Style::Piano, Style::Guitar, Style::Ambient],
        Mood::Happy => &[Style::Guitar, Style::Piano, Style::Synth],
        Mood::Sad => &[Style::Piano, Style::Orchestral, Style::Ambient],
        Mood::Dark => &[Style::Ambient, Style::Orchestral, Style::Synth],
        Mood::Epic => &[Style::Orchestral, Style::Rock, Style::Synth],
        Mood::Tense => &[Style::Synth, Style::Orchestral, Style::Rock],
        Mood::Dreamy => &[Style::Ambient, Style::LoFi, Style::Piano],
        Mood::Energetic => &[Style::Synth, Style::Rock, Style::Guitar],
        Mood::Romantic => &[Style::Piano, Style::Jazz, Style::Orchestral],
        Mood::Mysterious => &[Style::Ambient, Style::Synth, Style::Jazz],
    };
    opts[copy as usize % opts.len()]
}

fn title_words(mood: Mood, style: Style) -> (&'static [&'static str], &'static [&'static str]) {
    let adj: &[&str] = match mood {
        Mood::Calm => &["Still", "Quiet", "Gentle", "Slow"],
        Mood::Happy => &["Bright", "Sunlit", "Golden", "Carefree"],
        Mood::Sad => &["Fading", "Grey", "Wistful", "Distant"],
        Mood::Dark => &["Shadowed", "Midnight", "Deep", "Hollow"],
        Mood::Epic => &["Rising", "Vast", "Heroic", "Thundering"],
        Mood::Tense => &["Restless", "Taut", "Racing", "Fractured"],
        Mood::Dreamy => &["Drifting", "Hazy", "Weightless", "Velvet"],
        Mood::Energetic => &["Electric", "Rushing", "Bold", "Kinetic"],
        Mood::Romantic => &["Tender", "Warm", "Candlelit", "Close"],
        Mood::Mysterious => &["Hidden", "Veiled", "Unseen", "Secret"],
    };
    let noun: &[&str] = match style {
        Style::Piano => &["Reverie", "Nocturne", "Prelude", "Etude"],
        Style::Orchestral => &["Overture", "Horizon", "Procession", "Anthem"],
        Style::Synth => &["Circuit", "Signal", "Neon", "Grid"],
        Style::LoFi => &["Afternoon", "Tape Loop", "Window Seat", "Daydream"],
        Style::Guitar => &["Road", "Porch Song", "Wanderer", "Meadow"],
        Style::Ambient => &["Drift", "Tides", "Expanse", "Haze"],
        Style::Jazz => &["Blue Hour", "Late Set", "Smoke", "Alley"],
        Style::Rock => &["Overdrive", "Highway", "Riot", "Engine"],
    };
    (adj, noun)
}

// ------------------------------------------------------------ compose ----

/// Plans one stream per prompt × copy. An empty `prompts` slice means a
/// single prompt-less set. Deterministic in all inputs.
pub fn plan(analysis: &Analysis, prompts: &[&str], copies: u32, seed: u64) -> Vec<TrackPlan> {
    let list: Vec<Option<&str>> = if prompts.is_empty() {
        vec![None]
    } else {
        prompts.iter().map(|p| Some(*p)).collect()
    };
    let copies = copies.max(1);
    let mut out: Vec<TrackPlan> = Vec::new();
    for (pi, p) in list.into_iter().enumerate() {
        for ci in 0..copies {
            let mut t = compose_track(analysis, p, seed, pi as u32, ci);
            t.stream_index = pi as u32 * copies + ci;
            if out.iter().any(|o| o.title == t.title) {
                t.title = format!("{} (take {})", t.title, ci + 1);
            }
            out.push(t);
        }
    }
    out
}

/// Composes a single track (see module docs): its character and tempo from the prompt and
/// the video, its sections at the video's cuts, the notes bar by bar, and the plan that
/// describes it.
pub fn compose_track(
    analysis: &Analysis,
    prompt: Option<&str>,
    seed: u64,
    prompt_index: u32,
    copy_index: u32,
) -> TrackPlan {
    let sr = SAMPLE_RATE;
    let dur = analysis.duration_s().max(0.05);
    let total = ((dur * f64::from(sr)).round() as u64).max(1);
    let mut rng = Rng::new(mix(mix(seed, u64::from(prompt_index) + 1), u64::from(copy_index) + 101));
    let words = words_of(prompt);
    let global = analysis.summary(0.0, dur);

    let character = choose_character(&words, &global, copy_index, &mut rng);
    let bpm = choose_tempo(character.mood, &words, &global, copy_index);
    let sections = split_at_cuts(analysis, &global, dur, bpm, character.mood);

    let mut bld = Builder::new(f64::from(sr), total);
    let reverb = reverb_send(character.style);
    set_up_channels(&mut bld, &character, reverb, copy_index);
    let harmony = choose_harmony(&character, copy_index, &mut rng);
    write_sections(&mut bld, &sections, &character, &harmony);

    let (fade_in_s, fade_out_s) = fades(dur, &sections);
    let score = Score {
        sample_rate: sr,
        total_frames: total,
        events: bld.finish(),
        fade_in_frames: (fade_in_s * f64::from(sr)) as u64,
        fade_out_frames: (fade_out_s * f64::from(sr)) as u64,
        reverb_wet: f32::from(reverb) / 127.0 * 0.6,
    };
    let description = describe_track(&character, &sections, bpm, dur, &mut rng);
    TrackPlan {
        stream_index: 0,
        prompt_index,
        copy_index,
        prompt: prompt.map(str::to_string),
        title: description.title,
        summary: description.summary,
        display_tags: description.display_tags,
        duration_s: total as f64 / f64::from(sr),
        sample_rate: sr,
        channels: CHANNELS,
        total_frames: total,
        tempo_bpm: description.tempo_bpm,
        key: character.key.name(),
        mood: character.mood.name().to_string(),
        style: character.style.name().to_string(),
        instruments: description.instruments,
        sections: description.sections,
        score: Arc::new(score),
    }
}

/// What a track sounds like: mood, key, style and the band that plays it.
struct Character {
    mood: Mood,
    key: Key,
    style: Style,
    band: Band,
}

/// Mood and mode from the prompt's words or the video, the key from the video's colour (or
/// brightness) turned per copy, the style from the words or the mood, and the band for it.
fn choose_character(words: &[String], global: &Summary, copy_index: u32, rng: &mut Rng) -> Character {
    let mood = words
        .iter()
        .find_map(|w| Mood::from_word(w))
        .unwrap_or_else(|| mood_from_video(global));
    let mut minor = mood.minor();
    if words.iter().any(|w| w == "major") {
        minor = false;
    }
    if words.iter().any(|w| w == "minor") {
        minor = true;
    }
    // Colour wheel → circle of fifths; greyish video → brightness picks.
    let base_pc = if global.hue_strength > 0.08 {
        ((global.hue / 30.0).round() as i32 * 7).rem_euclid(12)
    } else {
        [9, 2, 7, 0, 5][((global.brightness * 4.99) as usize).min(4)]
    };
    let shift = [0, 7, 5, 3, 10, 2][copy_index as usize % 6];
    let key = Key {
        tonic: (base_pc + shift).rem_euclid(12),
        minor,
    };

    let style = words
        .iter()
        .find_map(|w| Style::from_word(w))
        .unwrap_or_else(|| style_for_mood(mood, copy_index));
    let mut band = default_band(style, rng);
    if mood == Mood::Epic && style == Style::Orchestral {
        band.drums = true;
    }
    apply_instrument_words(&mut band, words);
    Character { mood, key, style, band }
}

/// The main tempo in BPM: the mood's, moved by the video's motion, the words `slow`/`fast`,
/// the copy, or set outright by a `120bpm` word.
fn choose_tempo(mood: Mood, words: &[String], global: &Summary, copy_index: u32) -> f64 {
    let mut bpm = mood.base_bpm() + (f64::from(global.motion) - 0.4) * 40.0;
    if words.iter().any(|w| w == "slow") {
        bpm -= 15.0;
    }
    if words.iter().any(|w| w == "fast") {
        bpm += 15.0;
    }
    bpm *= [1.0, 1.07, 0.94, 1.12, 0.9][copy_index as usize % 5];
    if let Some(b) = explicit_bpm(words) {
        bpm = b;
    }
    bpm.clamp(54.0, 168.0)
}

/// Sections between the video's cuts (cuts closer than two bars or four seconds to the last
/// kept one, or to the end, are merged), each with a whole number of bars at its own tempo,
/// its density and intensity from its motion and brightness; the last one keeps time for
/// the final held chord.
fn split_at_cuts(analysis: &Analysis, global: &Summary, dur: f64, bpm: f64, mood: Mood) -> Vec<Section> {
    let bar_s = 240.0 / bpm;
    let min_len = (2.0 * bar_s).max(4.0);
    let mut bounds = vec![0.0];
    for &c in &analysis.cuts {
        if c - bounds.last().unwrap() >= min_len && dur - c >= min_len {
            bounds.push(c);
        }
    }
    bounds.push(dur);
    let nsec = bounds.len() - 1;
    let mut sections: Vec<Section> = Vec::with_capacity(nsec);
    for i in 0..nsec {
        let (a, b) = (bounds[i], bounds[i + 1]);
        let s = analysis.summary(a, b);
        let local_bpm = (bpm * (1.0 + 0.2 * f64::from(s.motion - global.motion))).clamp(50.0, 176.0);
        let last = i + 1 == nsec;
        let len = b - a;
        let final_hold = if last {
            (240.0 / local_bpm).clamp(1.5, 4.0).min(len * 0.5)
        } else {
            0.0
        };
        let body = len - final_hold;
        let bars = (body / (240.0 / local_bpm)).round().max(if last { 0.0 } else { 1.0 }) as u32;
        let base_level = if s.motion < 0.2 {
            0
        } else if s.motion < 0.42 {
            1
        } else if s.motion < 0.65 {
            2
        } else {
            3
        };
        let density = (base_level + mood.density_bias()).clamp(0, 3) as u8;
        let intensity = (0.55 + 0.35 * s.motion + 0.15 * (s.brightness - global.brightness)).clamp(0.35, 1.0);
        sections.push(Section {
            start: a,
            end: b,
            bars,
            density,
            intensity,
            final_hold,
        });
    }
    sections
}

/// The reverb send (MIDI controller 91) for `style`.
fn reverb_send(style: Style) -> u8 {
    match style {
        Style::Ambient => 110,
        Style::Orchestral | Style::Piano => 80,
        Style::Rock => 40,
        _ => 60,
    }
}

/// Programs, volumes, pans and effect sends of the band's channels, at time 0.
fn set_up_channels(bld: &mut Builder, character: &Character, reverb: u8, copy_index: u32) {
    let (band, style) = (&character.band, character.style);
    let mut setup = |ch: u8, voice: Option<Voice>, vol: u8, pan: u8| {
        if let Some(vc) = voice {
            bld.cc(0.0, ch, 0, 0);
            bld.push(0.0, ch, 0xC0, vc.program, 0, 0);
            bld.cc(0.0, ch, 7, vol);
            bld.cc(0.0, ch, 10, pan);
            bld.cc(0.0, ch, 91, reverb);
            bld.cc(0.0, ch, 93, if style == Style::Synth { 50 } else { 20 });
        }
    };
    let pan_spread = [(44u8, 84u8), (84, 44), (54, 74)][copy_index as usize % 3];
    setup(CH_CHORDS, Some(band.chords), 96, pan_spread.0);
    setup(CH_MELODY, Some(band.melody), 104, pan_spread.1);
    setup(CH_BASS, band.bass, 100, 64);
    setup(CH_PAD, band.pad, 72, 64);
    setup(CH_COUNTER, band.counter, 70, pan_spread.0.saturating_sub(14));
    if band.drums {
        bld.cc(0.0, CH_DRUMS, 7, 92);
        bld.cc(0.0, CH_DRUMS, 91, reverb / 2);
    }
}

/// The track's harmony: two progressions that alternate between sections, where chords
/// are voiced, and the seed of the melody's motifs.
struct Harmony {
    prog_a: [i32; 4],
    prog_b: [i32; 4],
    chord_center: i32,
    motif_seed: u64,
}

/// Picks two different progressions for the key's mode and the motif seed.
fn choose_harmony(character: &Character, copy_index: u32, rng: &mut Rng) -> Harmony {
    let progs: &[[i32; 4]] = if character.key.minor {
        &MINOR_PROGS
    } else {
        &MAJOR_PROGS
    };
    let prog_a = *rng.pick(progs);
    let mut prog_b = *rng.pick(progs);
    if prog_b == prog_a {
        prog_b = progs[(progs.iter().position(|p| *p == prog_a).unwrap() + 1) % progs.len()];
    }
    Harmony {
        prog_a,
        prog_b,
        chord_center: [60, 57, 64, 55][copy_index as usize % 4],
        motif_seed: rng.next_u64(),
    }
}

/// Where the melody is, as a scale index, and the range it moves in.
struct MelodyLine {
    pos: i32,
    lo: i32,
    hi: i32,
}

/// One bar being written: its chord and timing, and what it is part of.
struct Bar<'a> {
    key: &'a Key,
    band: &'a Band,
    tm: &'a TimeMap,
    /// The bar's first beat within its section.
    b0: f64,
    /// Scale degree of its chord.
    deg: i32,
    /// Its chord, voiced.
    chord: Vec<i32>,
    chord_center: i32,
    density: u8,
    intensity: f32,
    in_intro: bool,
    swing: f64,
}

impl Bar<'_> {
    /// Seconds at beat `b` of the bar.
    fn t(&self, b: f64) -> f64 {
        self.tm.t(self.b0 + b)
    }

    /// Beat `b`, moved later when it is an off-beat eighth and the band swings.
    fn sw(&self, b: f64) -> f64 {
        if self.swing > 0.0 && (b.fract() - 0.5).abs() < 1e-6 {
            b + self.swing
        } else {
            b
        }
    }

    /// Velocity `base` scaled by the section's intensity.
    fn vel(&self, base: f32) -> f32 {
        base * (0.7 + 0.4 * self.intensity)
    }
}

/// Writes every section bar by bar (pad, chords, bass, melody, counter-melody, drums), and
/// the final held chord after the last.
fn write_sections(bld: &mut Builder, sections: &[Section], character: &Character, harmony: &Harmony) {
    let (key, band, style) = (&character.key, &character.band, character.style);
    let mel_lo = 7 * (band.melody_octave - 4) - 3;
    let mut melody = MelodyLine {
        pos: 7 * (band.melody_octave - 4) + 2,
        lo: mel_lo,
        hi: mel_lo + 12,
    };
    let swing = if band.swing { 0.16 } else { 0.0 };

    for (si, sec) in sections.iter().enumerate() {
        let last_sec = si + 1 == sections.len();
        let prog = if si % 2 == 0 { harmony.prog_a } else { harmony.prog_b };
        let mut mrng = Rng::new(mix(harmony.motif_seed, (si % 2) as u64 * 7 + u64::from(sec.density)));
        let motif = make_motif(&mut mrng, sec.density);
        let tm = TimeMap {
            start: sec.start,
            len: sec.end - sec.start - sec.final_hold,
            beats: f64::from(sec.bars) * 4.0,
            ritard: last_sec && sec.bars > 0,
        };
        let expr = (sec.intensity * 127.0) as u8;
        for ch in [CH_CHORDS, CH_PAD, CH_COUNTER] {
            bld.cc(sec.start, ch, 11, expr);
        }
        let intro_bars = if si == 0 && sec.bars >= 3 {
            1 + u32::from(sec.bars >= 12 && sec.density <= 1)
        } else {
            0
        };

        for index in 0..sec.bars {
            let deg = prog[(index % 4) as usize];
            let bar = Bar {
                key,
                band,
                tm: &tm,
                b0: f64::from(index) * 4.0,
                deg,
                chord: voice_chord(key, deg, band.sevenths, harmony.chord_center),
                chord_center: harmony.chord_center,
                density: sec.density,
                intensity: sec.intensity,
                in_intro: index < intro_bars,
                swing,
            };
            let last_bar_of_sec = index + 1 == sec.bars;
            play_pad(bld, &bar);
            play_chords(bld, &bar);
            play_bass(bld, &bar);
            // The melody rests in the intro and, at density 0, on alternate bars.
            if !(bar.in_intro || (sec.density == 0 && index % 2 == 1)) {
                let phrase_end = index % 4 == 3 || last_bar_of_sec;
                play_melody(bld, &bar, &motif, &mut melody, phrase_end, &mut mrng);
            }
            if band.counter.is_some() && !bar.in_intro && sec.density >= 1 && index % 2 == 1 {
                play_counter(bld, &bar, &mut mrng);
            }
            if band.drums && !bar.in_intro {
                drum_bar(
                    bld,
                    &tm,
                    bar.b0,
                    sec.density,
                    style,
                    bar.vel(1.0),
                    index == 0 && si > 0,
                    last_bar_of_sec && !last_sec,
                    &mut mrng,
                    swing,
                );
            }
        }

        if last_sec {
            play_final_chord(bld, key, band, harmony.chord_center, sec);
        }
    }
}

/// The pad holds the chord (without sevenths) for the whole bar, a fourth below the chords.
fn play_pad(bld: &mut Builder, bar: &Bar<'_>) {
    if bar.band.pad.is_some() {
        for &p in &voice_chord(bar.key, bar.deg, false, bar.chord_center - 5) {
            bld.note(CH_PAD, p, bar.vel(62.0), bar.t(0.0), bar.t(4.0) + 0.02);
        }
    }
}

/// The chords in the band's comping pattern (held in the intro), busier at higher density.
fn play_chords(bld: &mut Builder, bar: &Bar<'_>) {
    let comp = if bar.in_intro { Comp::Sustain } else { bar.band.comp };
    let chord = &bar.chord;
    match comp {
        Comp::Sustain => {
            for &p in chord {
                bld.note(
                    CH_CHORDS,
                    p,
                    bar.vel(if bar.in_intro { 58.0 } else { 70.0 }),
                    bar.t(0.0),
                    bar.t(4.0) + 0.02,
                );
            }
        }
        Comp::Block => {
            let hits: &[(f64, f64)] = match bar.density {
                0 => &[(0.0, 4.0)],
                1 => &[(0.0, 2.0), (2.0, 2.0)],
                2 => &[(0.0, 1.5), (1.5, 1.0), (2.5, 1.5)],
                _ => &[(0.0, 1.0), (1.0, 0.5), (1.5, 1.0), (2.5, 0.5), (3.0, 1.0)],
            };
            for &(on, len) in hits {
                let accent = if on == 0.0 { 1.0 } else { 0.85 };
                for &p in chord {
                    bld.note(
                        CH_CHORDS,
                        p,
                        bar.vel(74.0 * accent),
                        bar.t(bar.sw(on)),
                        bar.t(bar.sw(on) + len * 0.95),
                    );
                }
            }
        }
        Comp::Arpeggio => {
            let step = match bar.density {
                0 => 1.0,
                1 | 2 => 0.5,
                _ => 0.25,
            };
            let mut tones = chord.clone();
            tones.insert(0, chord[0] - 12);
            let up_down: Vec<i32> = {
                let mut v = tones.clone();
                v.extend(tones.iter().rev().skip(1).take(tones.len() - 2));
                v
            };
            let n = (4.0 / step) as usize;
            for k in 0..n {
                let on = k as f64 * step;
                let p = up_down[k % up_down.len()];
                bld.note(
                    CH_CHORDS,
                    p,
                    bar.vel(if k == 0 { 72.0 } else { 60.0 }),
                    bar.t(bar.sw(on)),
                    bar.t(bar.sw(on) + step * 1.8),
                );
            }
        }
    }
}

/// The bass: the chord's root (and fifth, and octave) two octaves down, in a pattern that
/// gets busier with density; one held root in the intro.
fn play_bass(bld: &mut Builder, bar: &Bar<'_>) {
    if bar.band.bass.is_none() {
        return;
    }
    let (key, deg) = (bar.key, bar.deg);
    let root = key.pitch(deg - 14);
    let root = if root > 50 { root - 12 } else { root };
    let fifth = key.pitch(deg + 4 - 14);
    let fifth = if fifth - root > 12 { fifth - 12 } else { fifth };
    let pat: Vec<(f64, f64, i32)> = if bar.in_intro {
        vec![(0.0, 4.0, root)]
    } else {
        match bar.density {
            0 => vec![(0.0, 4.0, root)],
            1 => vec![(0.0, 2.0, root), (2.0, 2.0, fifth)],
            2 => vec![
                (0.0, 1.0, root),
                (1.0, 1.0, root),
                (2.0, 1.0, fifth),
                (3.0, 1.0, root + 12),
            ],
            _ => (0..8)
                .map(|k| {
                    let p = if k % 4 == 3 {
                        fifth
                    } else if k == 6 {
                        root + 12
                    } else {
                        root
                    };
                    (k as f64 * 0.5, 0.5, p)
                })
                .collect(),
        }
    };
    for (on, len, p) in pat {
        bld.note(
            CH_BASS,
            p,
            bar.vel(84.0),
            bar.t(bar.sw(on)),
            bar.t(bar.sw(on) + len * 0.92),
        );
    }
}

/// The melody: the section's motif walked from where the line is, reflected at the edges
/// of its range, snapped to chord tones on strong beats; a phrase's last bar ends on beat 3
/// with a held note.
fn play_melody(
    bld: &mut Builder,
    bar: &Bar<'_>,
    motif: &Motif,
    line: &mut MelodyLine,
    phrase_end: bool,
    mrng: &mut Rng,
) {
    let tones = chord_tones(bar.deg, bar.band.sevenths);
    let vary = mrng.chance(0.3);
    for (j, &(on, len)) in motif.rhythm.iter().enumerate() {
        if phrase_end && on >= 2.0 {
            break;
        }
        let mut step = motif.steps[j];
        if vary && j % 2 == 1 {
            step = -step;
        }
        let mut target = line.pos + step;
        if target > line.hi {
            target = line.hi - (target - line.hi);
        }
        if target < line.lo {
            target = line.lo + (line.lo - target);
        }
        let strong = on.fract() == 0.0 && (on as i32) % 2 == 0;
        if strong || phrase_end {
            // Snap to the nearest chord tone.
            target = (target - 3..=target + 3)
                .filter(|s| tones.iter().any(|c| (s - c).rem_euclid(7) == 0))
                .min_by_key(|s| ((s - target).abs(), *s))
                .unwrap_or(target);
        }
        line.pos = target;
        let len = if phrase_end && j + 1 < motif.rhythm.len() && motif.rhythm[j + 1].0 >= 2.0 {
            4.0 - on
        } else {
            len
        };
        let accent = if on == 0.0 { 1.0 } else { 0.88 };
        bld.note(
            CH_MELODY,
            bar.key.pitch(line.pos),
            bar.vel(88.0 * accent) + mrng.range_i(-6, 6) as f32,
            bar.t(bar.sw(on)),
            bar.t(bar.sw(on) + len * 0.9),
        );
    }
}

/// The counter-melody: a sparse bell or harp answer on beat 3.
fn play_counter(bld: &mut Builder, bar: &Bar<'_>, mrng: &mut Rng) {
    let key = bar.key;
    let p = key.pitch(chord_tones(bar.deg, false)[mrng.below(3)] + 14);
    bld.note(CH_COUNTER, p, bar.vel(64.0), bar.t(2.0), bar.t(3.5));
    bld.note(
        CH_COUNTER,
        p - 12 + key.scale()[2],
        bar.vel(56.0),
        bar.t(3.0),
        bar.t(4.0),
    );
}

/// The tonic chord held through the last section's final hold, by every role.
fn play_final_chord(bld: &mut Builder, key: &Key, band: &Band, chord_center: i32, sec: &Section) {
    let tf = sec.end - sec.final_hold;
    let end = sec.end + 0.5;
    for &p in &voice_chord(key, 0, band.sevenths && !key.minor, chord_center) {
        bld.note(CH_CHORDS, p, 76.0, tf, end);
    }
    if band.pad.is_some() {
        for &p in &voice_chord(key, 0, false, chord_center - 5) {
            bld.note(CH_PAD, p, 66.0, tf, end);
        }
    }
    if band.bass.is_some() {
        let r = key.pitch(-14);
        bld.note(CH_BASS, if r > 50 { r - 12 } else { r }, 86.0, tf, end);
    }
    bld.note(CH_MELODY, key.pitch(7 * (band.melody_octave - 4)), 80.0, tf, end);
    if band.drums {
        bld.note(CH_DRUMS, 49, 84.0, tf, end);
        bld.note(CH_DRUMS, 36, 90.0, tf, tf + 0.3);
    }
}

/// Fade-in and fade-out lengths in seconds: the fade-out covers the final hold.
fn fades(dur: f64, sections: &[Section]) -> (f64, f64) {
    let fade_in_s = 0.03f64.min(dur * 0.1);
    let fade_out_s = match sections.last() {
        Some(s) if s.final_hold > 0.0 => (s.final_hold + 0.5).min(dur * 0.5),
        _ => 1.0f64.min(dur * 0.3),
    };
    (fade_in_s, fade_out_s)
}

/// What a [`TrackPlan`] tells the client about the music.
struct Description {
    title: String,
    summary: String,
    display_tags: Vec<String>,
    tempo_bpm: u32,
    instruments: Vec<String>,
    sections: Vec<SectionInfo>,
}

/// The track's instruments, title, section layout, average tempo, summary sentence and tags.
fn describe_track(character: &Character, sections: &[Section], bpm: f64, dur: f64, rng: &mut Rng) -> Description {
    let (mood, key, style, band) = (character.mood, &character.key, character.style, &character.band);
    let mut instruments: Vec<String> = Vec::new();
    let mut add = |n: &str| {
        if !instruments.iter().any(|x| x == n) {
            instruments.push(n.to_string());
        }
    };
    add(band.melody.name);
    add(band.chords.name);
    if let Some(p) = band.pad {
        add(p.name);
    }
    if let Some(c) = band.counter {
        add(c.name);
    }
    if let Some(b) = band.bass {
        add(b.name);
    }
    if band.drums {
        add("drums");
    }
    let (adjs, nouns) = title_words(mood, style);
    let title = format!("{} {}", rng.pick(adjs), rng.pick(nouns));
    let section_infos: Vec<SectionInfo> = sections
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let body = s.end - s.start - s.final_hold;
            SectionInfo {
                start_s: s.start,
                end_s: s.end,
                tempo_bpm: if s.bars > 0 {
                    f64::from(s.bars) * 240.0 / body
                } else {
                    bpm
                },
                density: s.density,
                bars: s.bars + u32::from(i + 1 == sections.len()),
            }
        })
        .collect();
    let tempo = (section_infos
        .iter()
        .map(|s| s.tempo_bpm * (s.end_s - s.start_s))
        .sum::<f64>()
        / dur)
        .round() as u32;
    let list = match instruments.len() {
        0 => String::new(),
        1 => instruments[0].clone(),
        n => format!("{} and {}", instruments[..n - 1].join(", "), instruments[n - 1]),
    };
    let summary = format!(
        "A {} {} piece in {} at about {} BPM for {}; {} section{} follow{} the video's scene changes, \
         busier where the picture moves more, opening with a soft intro and ending with a ritardando \
         into a fading {} chord.",
        mood.name(),
        style.name(),
        key.name(),
        tempo,
        list,
        sections.len(),
        if sections.len() == 1 { "" } else { "s" },
        if sections.len() == 1 { "s" } else { "" },
        NOTE_NAMES[key.tonic as usize],
    );
    let mut display_tags = vec![
        mood.name().to_string(),
        style.name().to_string(),
        key.name(),
        format!("{tempo} BPM"),
    ];
    display_tags.extend(instruments.iter().cloned());

    Description {
        title,
        summary,
        display_tags,
        tempo_bpm: tempo,
        instruments,
        sections: section_infos,
    }
}

#[allow(clippy::too_many_arguments)]
fn drum_bar(
    bld: &mut Builder,
    tm: &TimeMap,
    b0: f64,
    density: u8,
    style: Style,
    vscale: f32,
    crash: bool,
    fill: bool,
    rng: &mut Rng,
    swing: f64,
) {
    const KICK: i32 = 36;
    const SNARE: i32 = 38;
    const RIM: i32 = 37;
    const HH: i32 = 42;
    const OPEN_HH: i32 = 46;
    const RIDE: i32 = 51;
    const CRASH: i32 = 49;
    const SHAKER: i32 = 70;
    const TOMS: [i32; 3] = [50, 47, 45];
    let soft = matches!(style, Style::LoFi | Style::Jazz | Style::Ambient | Style::Piano);
    let mut hit = |b: f64, key: i32, vel: f32, rng: &mut Rng| {
        let b = if swing > 0.0 && (b.fract() - 0.5).abs() < 1e-6 {
            b + swing
        } else {
            b
        };
        let on = tm.t(b0 + b);
        let v = vel * vscale * if soft { 0.8 } else { 1.0 } + rng.range_i(-5, 5) as f32;
        bld.note(CH_DRUMS, key, v, on, on + 0.1);
    };
    if crash && density >= 1 {
        hit(0.0, CRASH, 90.0, rng);
    }
    let fill_from = if fill && density >= 1 { 3.0 } else { 4.0 };
    match density {
        0 => {
            hit(0.0, KICK, 70.0, rng);
            for k in 0..4 {
                hit(k as f64, if style == Style::Jazz { RIDE } else { SHAKER }, 50.0, rng);
            }
        }
        1 => {
            hit(0.0, KICK, 92.0, rng);
            hit(2.5, KICK, 70.0, rng);
            if fill_from > 2.0 {
                hit(2.0, if soft { RIM } else { SNARE }, 82.0, rng);
            }
            for k in 0..(fill_from as i32) {
                hit(k as f64, HH, 62.0, rng);
            }
        }
        2 => {
            for &b in &[0.0, 1.5, 2.0] {
                hit(b, KICK, 96.0, rng);
            }
            hit(1.0, SNARE, 92.0, rng);
            if fill_from > 3.0 {
                hit(3.0, SNARE, 92.0, rng);
            }
            let mut b = 0.0;
            while b < fill_from {
                hit(
                    b,
                    if style == Style::Jazz { RIDE } else { HH },
                    if b.fract() == 0.0 { 70.0 } else { 54.0 },
                    rng,
                );
                b += 0.5;
            }
        }
        _ => {
            for &b in &[0.0, 0.75, 1.5, 2.0, 2.5] {
                hit(b, KICK, 100.0, rng);
            }
            hit(1.0, SNARE, 100.0, rng);
            if fill_from > 3.0 {
                hit(3.0, SNARE, 100.0, rng);
                hit(3.75, SNARE, 48.0, rng);
            }
            let mut b = 0.0;
            while b < fill_from {
                let open = (b - 3.5).abs() < 1e-6 && style != Style::Synth;
                hit(
                    b,
                    if open { OPEN_HH } else { HH },
                    if b.fract() == 0.0 { 74.0 } else { 56.0 },
                    rng,
                );
                b += if style == Style::Synth { 0.25 } else { 0.5 };
            }
        }
    }
    if fill_from < 4.0 {
        for k in 0..4 {
            let b = 3.0 + k as f64 * 0.25;
            let key = if style == Style::Orchestral || style == Style::Rock {
                TOMS[k.min(2)]
            } else {
                SNARE
            };
            hit(b, key, 70.0 + 8.0 * k as f32, rng);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notes_on(s: &Score) -> usize {
        s.events.iter().filter(|e| e.command == 0x90).count()
    }

    #[test]
    fn length_and_sections_follow_cuts() {
        let a = Analysis::synthetic(60.0, &[20.0, 21.0, 40.0], 0.5, 0.5);
        let t = &plan(&a, &[], 1, 7)[0];
        assert_eq!(t.total_frames, 60 * 44_100);
        assert_eq!(t.sections.len(), 3, "21.0 merges into 20.0");
        assert_eq!(t.sections[1].start_s, 20.0);
        assert_eq!(t.sections[2].start_s, 40.0);
        assert!(t.score.events.iter().all(|e| e.frame < t.total_frames));
        assert!(t.score.events.windows(2).all(|w| w[0].frame <= w[1].frame));
        assert!(notes_on(&t.score) > 100);
    }

    #[test]
    fn deterministic_and_copies_differ() {
        let a = Analysis::synthetic(30.0, &[12.0], 0.6, 0.4);
        let p1 = plan(&a, &["happy piano"], 3, 42);
        let p2 = plan(&a, &["happy piano"], 3, 42);
        assert_eq!(p1.len(), 3);
        for (x, y) in p1.iter().zip(&p2) {
            assert_eq!(x.score, y.score);
            assert_eq!(x.title, y.title);
        }
        assert_ne!(p1[0].score.events, p1[1].score.events);
        assert_ne!(p1[0].key, p1[1].key);
        let idx: Vec<u32> = p1.iter().map(|t| t.stream_index).collect();
        assert_eq!(idx, vec![0, 1, 2]);
        let other_seed = plan(&a, &["happy piano"], 1, 43);
        assert_ne!(other_seed[0].score.events, p1[0].score.events);
    }

    #[test]
    fn prompt_words_drive_mood_and_instruments() {
        let a = Analysis::synthetic(20.0, &[], 0.8, 0.5);
        let sad = &plan(&a, &["sad strings, no drums"], 1, 1)[0];
        assert!(sad.key.ends_with("minor"));
        assert_eq!(sad.mood, "melancholic");
        assert!(sad.instruments.iter().any(|i| i.contains("strings")));
        assert!(!sad.instruments.iter().any(|i| i == "drums"));
        assert!(!sad
            .score
            .events
            .iter()
            .any(|e| e.channel == CH_DRUMS && e.command == 0x90));
        let happy = &plan(&a, &["happy synth with drums 128 bpm"], 1, 1)[0];
        assert!(happy.key.ends_with("major"));
        assert_eq!(happy.style, "electronic");
        assert!(happy
            .score
            .events
            .iter()
            .any(|e| e.channel == CH_DRUMS && e.command == 0x90));
        assert!(happy.display_tags.iter().any(|t| t.ends_with("BPM")));
        assert!((happy.tempo_bpm as i32 - 128).abs() <= 8, "{}", happy.tempo_bpm);
        assert!(happy.summary.contains(&happy.key));
    }

    #[test]
    fn multiple_prompts_index_streams() {
        let a = Analysis::synthetic(10.0, &[], 0.5, 0.3);
        let p = plan(&a, &["calm", "epic"], 2, 5);
        let ids: Vec<(u32, u32, u32)> = p
            .iter()
            .map(|t| (t.stream_index, t.prompt_index, t.copy_index))
            .collect();
        assert_eq!(ids, vec![(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]);
        assert_eq!(p[2].mood, "epic");
    }

    #[test]
    fn same_key_overlaps_become_restrikes() {
        let mut b = Builder::new(100.0, 1000);
        b.note(0, 60, 80.0, 0.0, 2.0);
        b.note(0, 60, 90.0, 1.0, 3.0);
        b.note(0, 64, 70.0, 0.5, 0.6);
        b.note(1, 60, 70.0, 0.5, 4.0);
        let ev = b.finish();
        let ch0_60: Vec<(u64, u8)> = ev
            .iter()
            .filter(|e| e.channel == 0 && e.data1 == 60)
            .map(|e| (e.frame, e.command))
            .collect();
        assert_eq!(ch0_60, vec![(0, 0x90), (100, 0x80), (100, 0x90), (300, 0x80)]);
        assert_eq!(ev.len(), 8);
    }

    #[test]
    fn every_note_on_has_a_later_off() {
        let a = Analysis::synthetic(45.0, &[15.0, 30.0], 0.4, 0.8);
        for prompt in ["epic orchestral", "lofi", "energetic synth drums", "sad piano"] {
            let t = &plan(&a, &[prompt], 1, 11)[0];
            let mut open = std::collections::HashMap::new();
            for e in &t.score.events {
                let k = (e.channel, e.data1);
                match e.command {
                    0x90 => assert!(open.insert(k, e.frame).is_none(), "{prompt}: overlapping {k:?}"),
                    0x80 => assert!(open.remove(&k).is_some(), "{prompt}: stray off {k:?}"),
                    _ => {}
                }
            }
        }
    }

    #[test]
    fn tiny_video_still_works() {
        let a = Analysis::synthetic(0.4, &[], 0.5, 0.3);
        let t = &plan(&a, &[], 1, 0)[0];
        assert_eq!(t.total_frames, 17_640);
        assert!(notes_on(&t.score) > 0);
    }

    #[test]
    fn ritardando_map_is_monotone_and_exact() {
        let tm = TimeMap {
            start: 10.0,
            len: 8.0,
            beats: 16.0,
            ritard: true,
        };
        assert_eq!(tm.t(0.0), 10.0);
        assert_eq!(tm.t(16.0), 18.0);
        let d_first = tm.t(1.0) - tm.t(0.0);
        let d_last = tm.t(16.0) - tm.t(15.0);
        assert!(d_last > d_first * 1.2);
    }
}
