//! weft's built-in audio nodes. Samples never enter the plugin: `VideoToMusic` asks the
//! host's `music` interface for the clip, and `SaveAudio` has the host encode it.

use weft_sdk::bindings::weft::node::music;
use weft_sdk::prelude::*;

weft_sdk::node! {
    /// Composes music for a video: sections follow its scene cuts, tempo and density its
    /// motion, key and mode its brightness and colour and the prompt's mood words, and the
    /// instruments the prompt names. Procedural (not a neural model) and deterministic.
    pub struct VideoToMusic {
        display_name: "Video to Music",
        category: "audio",
        inputs {
            video: AssetRef = input::asset().tooltip("The video to score: an uploaded asset."),
            prompt: String = input::string().multiline().default("").tooltip(
                "Mood, style and instruments, for example \"calm piano\" or \"epic strings and drums\".",
            ),
            seed: i64 = input::int().default(0).min(0).max(i64::MAX).tooltip(
                "Same video, prompt and seed give the same music.",
            ),
        }
        outputs { AUDIO: Audio }
        fn execute(ctx, inp) {
            ctx.progress(0, 1, "composing music for the video");
            let seed = u64::try_from(inp.seed)?;
            let audio = music::video_to_music(&inp.video, &inp.prompt, seed)?;
            ctx.progress(1, 1, None);
            Ok((audio,))
        }
    }
}

weft_sdk::node! {
    /// Saves audio as a 16-bit PCM WAV job output.
    pub struct SaveAudio {
        display_name: "Save Audio",
        category: "audio",
        output_node: true,
        inputs {
            audio: Audio = input::audio().tooltip("The audio to save."),
            filename_prefix: String = input::string().default("audio/weft").tooltip(
                "The prefix of the file name; a number and the extension are appended.",
            ),
        }
        outputs {}
        fn execute(ctx, inp) {
            ctx.save_wav(inp.filename_prefix, inp.audio);
            Ok(())
        }
    }
}

weft_sdk::export_plugin!(VideoToMusic, SaveAudio);
