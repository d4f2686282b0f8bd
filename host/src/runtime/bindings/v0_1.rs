//! Host bindings for the frozen `weft:node@0.1.0` world, generated from
//! `wit/weft-node-0.1.0`. Its resources map onto host-held payloads, so a guest only ever
//! sees handles.

wasmtime::component::bindgen!({
    path: "../wit/weft-node-0.1.0",
    world: "plugin",
    with: {
        "weft:node/types.image": crate::runtime::value::ImageRes,
        "weft:node/types.latent": crate::runtime::value::LatentRes,
        "weft:node/types.mask": crate::runtime::value::MaskRes,
        "weft:node/types.audio": crate::runtime::value::AudioRes,
        "weft:node/types.model": crate::runtime::value::ModelRes,
        "weft:node/types.clip": crate::runtime::value::ClipRes,
        "weft:node/types.vae": crate::runtime::value::VaeRes,
        "weft:node/types.conditioning": crate::runtime::value::ConditioningRes,
    },
    imports: { default: trappable },
});

pub(crate) use self::weft::node::types as wit;
