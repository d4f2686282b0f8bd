//! `weft:node/music`: video-to-music for the `VideoToMusic` node, rendered by the server's
//! [`weft_v2m::Engine`]. The guest only ever holds the resulting `audio` handle.

mod v0_2_face;

use std::sync::Arc;

use wasmtime::component::{Linker, Resource};
use weft_compute::values::AudioClip;
use weft_v2m::{self as v2m, V2mError};

use super::{own, CallState, Capabilities, Capability, CapabilityCtx, Own};
use crate::runtime::bindings::v0_1::weft::node::music::{add_to_linker, Host};
use crate::runtime::bindings::v0_1::wit::{AssetRef, NodeError};
use crate::runtime::bindings::v0_2;
use crate::runtime::call::{read_asset, AssetReader, CallContext, Interrupt};
use crate::runtime::limits::Limits;
use crate::runtime::memory::Held;
use crate::runtime::value::AudioRes;

/// The music capability.
pub struct Music;

/// The server's video-to-music engine; without one (its SoundFont did not load), calls fail.
#[derive(Clone, Default)]
pub struct MusicConfig(pub Option<Arc<v2m::Engine>>);

impl std::fmt::Debug for MusicConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "MusicConfig(engine)"
        } else {
            "MusicConfig(none)"
        })
    }
}

/// The engine, and where a call's videos are read from.
pub struct MusicState {
    engine: Option<Arc<v2m::Engine>>,
    assets: Arc<dyn AssetReader>,
}

impl Capability for Music {
    type Config = MusicConfig;
    type State = MusicState;

    fn link(linker: &mut Linker<CallState>) -> wasmtime::Result<()> {
        add_to_linker::<_, Own<Self>>(linker, own::<Self>)?;
        v0_2::weft::node::music::add_to_linker::<_, Own<Self>>(linker, own::<Self>)
    }

    fn new_state(config: &MusicConfig, _: &Limits, call: &CallContext, _: &Capabilities) -> MusicState {
        MusicState {
            engine: config.0.clone(),
            assets: call.assets.clone(),
        }
    }
}

fn node_error(e: V2mError) -> NodeError {
    NodeError {
        code: e.code().to_string(),
        message: e.to_string(),
    }
}

impl Host for CapabilityCtx<'_, MusicState> {
    fn video_to_music(
        &mut self,
        video: AssetRef,
        prompt: String,
        seed: u64,
    ) -> wasmtime::Result<Result<Resource<AudioRes>, NodeError>> {
        let bytes = match read_asset(&*self.state.assets, video) {
            Ok(bytes) => bytes,
            Err(e) => return Ok(Err(e)),
        };
        let Some(engine) = self.state.engine.clone() else {
            return Ok(Err(node_error(V2mError::GenerationFailed(
                "video-to-music is not available on this server (see its start-up log)".into(),
            ))));
        };
        let temp = engine.temp_video();
        if let Err(e) = std::fs::write(temp.path(), &bytes) {
            return Ok(Err(node_error(V2mError::GenerationFailed(format!(
                "writing the video for analysis: {e}"
            )))));
        }
        drop(bytes);
        // The longest clip the engine renders, charged before it renders; trimmed after.
        let frames = engine.config().max_duration.as_secs_f64().ceil() as u64 * u64::from(v2m::SAMPLE_RATE);
        let mut charge = self.core.charge(frames * u64::from(v2m::CHANNELS) * 4, || {
            format!("{} s of rendered music", engine.config().max_duration.as_secs())
        })?;
        let deadline = self.core.deadline.clone();
        let stop = || deadline.check().is_err();
        let samples = match engine.generate_blocking(temp.path(), Some(&prompt), seed, &stop) {
            Ok(Some(samples)) => samples,
            Ok(None) => return Err(self.core.deadline.check().err().unwrap_or(Interrupt::Canceled).into()),
            Err(e) => return Ok(Err(node_error(e))),
        };
        charge.shrink_to(samples.len() as u64 * 4);
        let clip = AudioClip {
            sample_rate: v2m::SAMPLE_RATE,
            channels: u32::from(v2m::CHANNELS),
            samples,
        };
        Ok(Ok(self.core.table.push(AudioRes(Arc::new(Held::new(clip, charge))))?))
    }
}
