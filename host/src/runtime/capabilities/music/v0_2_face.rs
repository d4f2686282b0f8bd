//! The `weft:node@0.2.0` face of `music`: the same call as 0.1.0.

use wasmtime::component::Resource;

use crate::runtime::bindings::weft::node as v1;
use crate::runtime::capabilities::CallState;
use crate::runtime::value::AudioRes;
use crate::runtime::worlds::v0_2::weft::node as v2;
use crate::runtime::worlds::v0_2::wit::{AssetRef, NodeError};
use crate::runtime::worlds::v0_2::{asset_to_v0_1 as asset, error_from_v0_1 as error};

impl v2::music::Host for CallState {
    fn video_to_music(
        &mut self,
        video: AssetRef,
        prompt: String,
        seed: u64,
    ) -> wasmtime::Result<Result<Resource<AudioRes>, NodeError>> {
        Ok(v1::music::Host::video_to_music(self, asset(video), prompt, seed)?.map_err(error))
    }
}
