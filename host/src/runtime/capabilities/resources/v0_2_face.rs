//! The `weft:node@0.2.0` face of `types`: the 0.1.0 resources, each call going to the 0.1.0
//! implementation, plus the generic `handle`.

use wasmtime::component::Resource;

use super::Ctx;
use crate::runtime::bindings::v0_1::weft::node as v1;
use crate::runtime::bindings::v0_2::weft::node as v2;
use crate::runtime::value::{AudioRes, HandleRes, ImageRes, LatentRes, MaskRes};

impl v2::types::Host for Ctx<'_> {}

impl v2::types::HostImage for Ctx<'_> {
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

impl v2::types::HostLatent for Ctx<'_> {
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

impl v2::types::HostMask for Ctx<'_> {
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

impl v2::types::HostAudio for Ctx<'_> {
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

impl v2::types::HostHandle for Ctx<'_> {
    fn type_name(&mut self, this: Resource<HandleRes>) -> wasmtime::Result<String> {
        Ok(self.core.table.get(&this)?.0.type_name.to_string())
    }
    fn describe(&mut self, this: Resource<HandleRes>) -> wasmtime::Result<String> {
        Ok(self.core.table.get(&this)?.0.object.name.clone())
    }
    fn drop(&mut self, this: Resource<HandleRes>) -> wasmtime::Result<()> {
        self.core.table.delete(this)?;
        Ok(())
    }
}
