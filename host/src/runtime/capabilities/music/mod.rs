//! `weft:node/music`: video-to-music for the `VideoToMusic` node, rendered by the host's
//! [`crate::v2m`] engine. The guest only ever holds the resulting `audio` handle.

use std::path::PathBuf;
use std::sync::Arc;

use wasmtime::component::{HasSelf, Linker, Resource};

use super::{CallState, Capabilities, Capability};
use crate::compute::values::AudioClip;
use crate::runtime::bindings::weft::node::music::{add_to_linker, Host};
use crate::runtime::bindings::wit::{AssetRef, NodeError};
use crate::runtime::call::{read_asset, AssetReader, CallContext, CancelToken};
use crate::runtime::value::AudioRes;
use crate::v2m::{self, V2mError};

/// The music capability.
pub struct Music;

/// Where a call's videos are read from, and how a render learns the job was canceled.
pub struct MusicState {
    assets: Arc<dyn AssetReader>,
    cancel: CancelToken,
}

impl Capability for Music {
    type Config = ();
    type State = MusicState;

    fn link(linker: &mut Linker<CallState>) -> wasmtime::Result<()> {
        add_to_linker::<_, HasSelf<CallState>>(linker, |s| s)
    }

    fn new_state(_: &(), call: &CallContext, _: &Capabilities) -> MusicState {
        MusicState {
            assets: call.assets.clone(),
            cancel: call.cancel.clone(),
        }
    }
}

fn node_error(e: V2mError) -> NodeError {
    NodeError {
        code: e.code().to_string(),
        message: e.to_string(),
    }
}

/// The video's bytes on disk for ffmpeg, removed when dropped.
struct TempVideo(PathBuf);

impl Drop for TempVideo {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

impl Host for CallState {
    fn video_to_music(
        &mut self,
        video: AssetRef,
        prompt: String,
        seed: u64,
    ) -> wasmtime::Result<Result<Resource<AudioRes>, NodeError>> {
        let bytes = match read_asset(&*self.music.assets, video) {
            Ok(bytes) => bytes,
            Err(e) => return Ok(Err(e)),
        };
        let (engine, tmp_dir) = match v2m::shared() {
            Ok(shared) => shared,
            Err(e) => return Ok(Err(node_error(e))),
        };
        let temp = TempVideo(tmp_dir.join(format!("{}.node-video", uuid::Uuid::new_v4().simple())));
        if let Err(e) = std::fs::write(&temp.0, &bytes) {
            return Ok(Err(node_error(V2mError::GenerationFailed(format!(
                "writing the video for analysis: {e}"
            )))));
        }
        drop(bytes);
        let cancel = self.music.cancel.clone();
        let samples = match engine.generate_blocking(&temp.0, Some(&prompt), seed, &|| cancel.is_canceled()) {
            Ok(Some(samples)) => samples,
            Ok(None) => {
                return Ok(Err(NodeError {
                    code: "canceled".into(),
                    message: "the job was canceled".into(),
                }))
            }
            Err(e) => return Ok(Err(node_error(e))),
        };
        let clip = AudioClip {
            sample_rate: v2m::SAMPLE_RATE,
            channels: u32::from(v2m::CHANNELS),
            samples,
        };
        Ok(Ok(self.table.push(AudioRes(Arc::new(clip)))?))
    }
}
