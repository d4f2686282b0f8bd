//! `weft:node/types`: accessors and destructors of the host-held resources.

mod v0_2_face;

use wasmtime::component::{Linker, Resource};

use super::{own, CallState, Capabilities, Capability, CapabilityCtx, Own};
use crate::runtime::bindings::v0_1::weft::node::types::{
    add_to_linker, Host, HostAudio, HostClip, HostConditioning, HostImage, HostLatent, HostMask, HostModel, HostVae,
};
use crate::runtime::bindings::v0_2;
use crate::runtime::call::CallContext;
use crate::runtime::value::{AudioRes, ClipRes, ConditioningRes, ImageRes, LatentRes, MaskRes, ModelRes, VaeRes};

/// What this capability's host functions see: the core, and no state of its own.
type Ctx<'a> = CapabilityCtx<'a, ()>;

/// The resources capability. The handles live in the call's shared table, so it has no
/// state of its own.
pub struct Resources;

impl Capability for Resources {
    type Config = ();
    type State = ();

    fn link(linker: &mut Linker<CallState>) -> wasmtime::Result<()> {
        add_to_linker::<_, Own<Self>>(linker, own::<Self>)?;
        v0_2::weft::node::types::add_to_linker::<_, Own<Self>>(linker, own::<Self>)
    }

    fn new_state(_: &(), _: &crate::runtime::limits::Limits, _: &CallContext, _: &Capabilities) {}
}

impl Host for Ctx<'_> {}

impl HostImage for Ctx<'_> {
    fn width(&mut self, this: Resource<ImageRes>) -> wasmtime::Result<u32> {
        Ok(self.core.table.get(&this)?.0.width)
    }
    fn height(&mut self, this: Resource<ImageRes>) -> wasmtime::Result<u32> {
        Ok(self.core.table.get(&this)?.0.height)
    }
    fn batch_size(&mut self, this: Resource<ImageRes>) -> wasmtime::Result<u32> {
        Ok(self.core.table.get(&this)?.0.batch)
    }
    fn channels(&mut self, this: Resource<ImageRes>) -> wasmtime::Result<u32> {
        Ok(self.core.table.get(&this)?.0.channels)
    }
    fn drop(&mut self, this: Resource<ImageRes>) -> wasmtime::Result<()> {
        self.core.table.delete(this)?;
        Ok(())
    }
}

impl HostLatent for Ctx<'_> {
    fn width(&mut self, this: Resource<LatentRes>) -> wasmtime::Result<u32> {
        Ok(self.core.table.get(&this)?.0.shape[3] * 8)
    }
    fn height(&mut self, this: Resource<LatentRes>) -> wasmtime::Result<u32> {
        Ok(self.core.table.get(&this)?.0.shape[2] * 8)
    }
    fn batch_size(&mut self, this: Resource<LatentRes>) -> wasmtime::Result<u32> {
        Ok(self.core.table.get(&this)?.0.shape[0])
    }
    fn drop(&mut self, this: Resource<LatentRes>) -> wasmtime::Result<()> {
        self.core.table.delete(this)?;
        Ok(())
    }
}

impl HostMask for Ctx<'_> {
    fn width(&mut self, this: Resource<MaskRes>) -> wasmtime::Result<u32> {
        Ok(self.core.table.get(&this)?.0.width)
    }
    fn height(&mut self, this: Resource<MaskRes>) -> wasmtime::Result<u32> {
        Ok(self.core.table.get(&this)?.0.height)
    }
    fn batch_size(&mut self, this: Resource<MaskRes>) -> wasmtime::Result<u32> {
        Ok(self.core.table.get(&this)?.0.batch)
    }
    fn drop(&mut self, this: Resource<MaskRes>) -> wasmtime::Result<()> {
        self.core.table.delete(this)?;
        Ok(())
    }
}

impl HostAudio for Ctx<'_> {
    fn sample_rate(&mut self, this: Resource<AudioRes>) -> wasmtime::Result<u32> {
        Ok(self.core.table.get(&this)?.0.sample_rate)
    }
    fn channels(&mut self, this: Resource<AudioRes>) -> wasmtime::Result<u32> {
        Ok(self.core.table.get(&this)?.0.channels)
    }
    fn frames(&mut self, this: Resource<AudioRes>) -> wasmtime::Result<u64> {
        Ok(self.core.table.get(&this)?.0.frames())
    }
    fn drop(&mut self, this: Resource<AudioRes>) -> wasmtime::Result<()> {
        self.core.table.delete(this)?;
        Ok(())
    }
}

/// The model-like resources share one shape: a name and a host payload.
macro_rules! named_resource {
    ($trait:ident, $res:ident, $extra:ident, $extra_ty:ty, $get:expr) => {
        impl $trait for Ctx<'_> {
            fn $extra(&mut self, this: Resource<$res>) -> wasmtime::Result<$extra_ty> {
                let get: fn(&$res) -> $extra_ty = $get;
                Ok(get(self.core.table.get(&this)?))
            }
            fn drop(&mut self, this: Resource<$res>) -> wasmtime::Result<()> {
                self.core.table.delete(this)?;
                Ok(())
            }
        }
    };
}

named_resource!(HostModel, ModelRes, name, String, |r| r.0.name.clone());
named_resource!(HostClip, ClipRes, name, String, |r| r.0.name.clone());
named_resource!(HostVae, VaeRes, name, String, |r| r.0.name.clone());
named_resource!(HostConditioning, ConditioningRes, len, u32, |r| r.0.len);
