//! The `weft:node@0.2.0` faces of the capabilities that `weft:node@0.1.0` already had:
//! `types` (plus the generic `handle`), `host`, `images` (plus `load-mask`) and `music`.
//! Each call goes to the 0.1.0 implementation; only the record types differ between the
//! two bindings, and resources map onto the same host types.

use std::sync::Arc;

use wasmtime::component::Resource;

use super::CallState;
use crate::runtime::bindings::weft::node as v1;
use crate::runtime::bindings::wit as v1_types;
use crate::runtime::memory::Held;
use crate::runtime::value::{AudioRes, HandleRes, ImageRes, LatentRes, MaskRes};
use crate::runtime::worlds::v0_2::weft::node as v2;
use crate::runtime::worlds::v0_2::wit::{AssetRef, NodeError};
use weft_compute::image::MaskBatch;

fn asset(a: AssetRef) -> v1_types::AssetRef {
    v1_types::AssetRef {
        id: a.id,
        hash: a.hash,
        file_path: a.file_path,
    }
}

fn error(e: v1_types::NodeError) -> NodeError {
    NodeError {
        code: e.code,
        message: e.message,
    }
}

impl v2::types::Host for CallState {}

impl v2::types::HostImage for CallState {
    fn width(&mut self, this: Resource<ImageRes>) -> wasmtime::Result<u32> {
        v1::types::HostImage::width(self, this)
    }
    fn height(&mut self, this: Resource<ImageRes>) -> wasmtime::Result<u32> {
        v1::types::HostImage::height(self, this)
    }
    fn batch_size(&mut self, this: Resource<ImageRes>) -> wasmtime::Result<u32> {
        v1::types::HostImage::batch_size(self, this)
    }
    fn channels(&mut self, this: Resource<ImageRes>) -> wasmtime::Result<u32> {
        v1::types::HostImage::channels(self, this)
    }
    fn drop(&mut self, this: Resource<ImageRes>) -> wasmtime::Result<()> {
        v1::types::HostImage::drop(self, this)
    }
}

impl v2::types::HostLatent for CallState {
    fn width(&mut self, this: Resource<LatentRes>) -> wasmtime::Result<u32> {
        v1::types::HostLatent::width(self, this)
    }
    fn height(&mut self, this: Resource<LatentRes>) -> wasmtime::Result<u32> {
        v1::types::HostLatent::height(self, this)
    }
    fn batch_size(&mut self, this: Resource<LatentRes>) -> wasmtime::Result<u32> {
        v1::types::HostLatent::batch_size(self, this)
    }
    fn drop(&mut self, this: Resource<LatentRes>) -> wasmtime::Result<()> {
        v1::types::HostLatent::drop(self, this)
    }
}

impl v2::types::HostMask for CallState {
    fn width(&mut self, this: Resource<MaskRes>) -> wasmtime::Result<u32> {
        v1::types::HostMask::width(self, this)
    }
    fn height(&mut self, this: Resource<MaskRes>) -> wasmtime::Result<u32> {
        v1::types::HostMask::height(self, this)
    }
    fn batch_size(&mut self, this: Resource<MaskRes>) -> wasmtime::Result<u32> {
        v1::types::HostMask::batch_size(self, this)
    }
    fn drop(&mut self, this: Resource<MaskRes>) -> wasmtime::Result<()> {
        v1::types::HostMask::drop(self, this)
    }
}

impl v2::types::HostAudio for CallState {
    fn sample_rate(&mut self, this: Resource<AudioRes>) -> wasmtime::Result<u32> {
        v1::types::HostAudio::sample_rate(self, this)
    }
    fn channels(&mut self, this: Resource<AudioRes>) -> wasmtime::Result<u32> {
        v1::types::HostAudio::channels(self, this)
    }
    fn frames(&mut self, this: Resource<AudioRes>) -> wasmtime::Result<u64> {
        v1::types::HostAudio::frames(self, this)
    }
    fn drop(&mut self, this: Resource<AudioRes>) -> wasmtime::Result<()> {
        v1::types::HostAudio::drop(self, this)
    }
}

impl v2::types::HostHandle for CallState {
    fn type_name(&mut self, this: Resource<HandleRes>) -> wasmtime::Result<String> {
        Ok(self.table.get(&this)?.0.type_name.to_string())
    }
    fn describe(&mut self, this: Resource<HandleRes>) -> wasmtime::Result<String> {
        Ok(self.table.get(&this)?.0.object.name.clone())
    }
    fn drop(&mut self, this: Resource<HandleRes>) -> wasmtime::Result<()> {
        self.table.delete(this)?;
        Ok(())
    }
}

impl v2::host::Host for CallState {
    fn progress(&mut self, step: u32, steps: u32, message: Option<String>) -> wasmtime::Result<()> {
        v1::host::Host::progress(self, step, steps, message)
    }
    fn is_canceled(&mut self) -> wasmtime::Result<bool> {
        v1::host::Host::is_canceled(self)
    }
}

impl v2::images::Host for CallState {
    fn empty(
        &mut self,
        width: u32,
        height: u32,
        batch_size: u32,
        color: u32,
    ) -> wasmtime::Result<Result<Resource<ImageRes>, NodeError>> {
        Ok(v1::images::Host::empty(self, width, height, batch_size, color)?.map_err(error))
    }

    fn invert(&mut self, image: Resource<ImageRes>) -> wasmtime::Result<Resource<ImageRes>> {
        v1::images::Host::invert(self, image)
    }

    fn scale(
        &mut self,
        image: Resource<ImageRes>,
        method: String,
        width: u32,
        height: u32,
        crop: String,
    ) -> wasmtime::Result<Result<Resource<ImageRes>, NodeError>> {
        Ok(v1::images::Host::scale(self, image, method, width, height, crop)?.map_err(error))
    }

    fn load(
        &mut self,
        asset_ref: AssetRef,
    ) -> wasmtime::Result<Result<(Resource<ImageRes>, Resource<MaskRes>), NodeError>> {
        Ok(v1::images::Host::load(self, asset(asset_ref))?.map_err(error))
    }

    fn load_mask(
        &mut self,
        asset_ref: AssetRef,
        channel: String,
    ) -> wasmtime::Result<Result<Resource<MaskRes>, NodeError>> {
        let index = match channel.as_str() {
            "red" => Some(0),
            "green" => Some(1),
            "blue" => Some(2),
            "alpha" => None,
            other => {
                return Ok(Err(NodeError {
                    code: "invalid_input".into(),
                    message: format!("unknown channel {other:?}; expected alpha, red, green or blue"),
                }))
            }
        };
        let (image, mask) = match v1::images::Host::load(self, asset(asset_ref))? {
            Ok(loaded) => loaded,
            Err(e) => return Ok(Err(error(e))),
        };
        let image = self.table.delete(image)?.0;
        let alpha = self.table.delete(mask)?.0;
        let mask = match index {
            None => alpha,
            Some(c) => {
                // The channel mask takes the place, and the charge, of the alpha mask.
                let charge = match Arc::try_unwrap(alpha) {
                    Ok(alpha) => alpha.into_charge(),
                    Err(_) => self.charge(image.data.len() as u64 / 3 * 4, || "a channel mask".into())?,
                };
                let data = image
                    .data
                    .chunks_exact(image.channels as usize)
                    .map(|pixel| pixel[c])
                    .collect();
                let mask = MaskBatch {
                    width: image.width,
                    height: image.height,
                    batch: image.batch,
                    data,
                };
                Arc::new(Held::new(mask, charge))
            }
        };
        Ok(Ok(self.table.push(MaskRes(mask))?))
    }
}

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
