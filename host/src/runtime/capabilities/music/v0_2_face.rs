//! The `weft:node@0.2.0` face of `music`: the same call as 0.1.0.

use wasmtime::component::Resource;

use super::MusicState;
use crate::runtime::bindings::v0_1::weft::node as v1;
use crate::runtime::bindings::v0_2::weft::node as v2;
use crate::runtime::bindings::v0_2::wit::{AssetRef, NodeError};
use crate::runtime::capabilities::CapabilityCtx;
use crate::runtime::value::AudioRes;

impl v2::music::Host for CapabilityCtx<'_, MusicState> {
    fn video_to_music(
        &mut self,
        video: AssetRef,
        prompt: String,
        seed: u64,
    ) -> wasmtime::Result<Result<Resource<AudioRes>, NodeError>> {
        Ok(v1::music::Host::video_to_music(self, video.into(), prompt, seed)?.map_err(NodeError::from))
    }
}
