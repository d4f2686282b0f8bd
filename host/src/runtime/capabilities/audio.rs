//! `weft:node/music`: video-to-music for the `VideoToMusic` node, rendered by the server's
//! [`weft_v2m::Engine`]. The guest only ever holds the resulting `audio` handle.

use std::sync::Arc;

use wasmtime::component::Resource;
use weft_compute::values::AudioClip;
use weft_v2m::{self as v2m, V2mError};

use super::CallState;
use crate::runtime::bindings::weft::node::music::Host;
use crate::runtime::bindings::wit::{AssetRef, NodeError};
use crate::runtime::value::AudioRes;

fn node_error(e: V2mError) -> NodeError {
    NodeError {
        code: e.code().to_string(),
        message: e.to_string(),
    }
}

impl Host for CallState {
    fn video_to_music(
        &mut self,
        video: AssetRef,
        prompt: String,
        seed: u64,
    ) -> wasmtime::Result<Result<Resource<AudioRes>, NodeError>> {
        let bytes = match self.read_asset(video) {
            Ok(bytes) => bytes,
            Err(e) => return Ok(Err(e)),
        };
        let Some(engine) = self.music.clone() else {
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
        let cancel = self.call.cancel.clone();
        let samples = match engine.generate_blocking(temp.path(), Some(&prompt), seed, &|| cancel.is_canceled()) {
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
