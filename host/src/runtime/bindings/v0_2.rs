//! Host bindings for the `weft:node@0.2.0` world, generated from `wit/weft-node-0.2.0`.
//! Host-held types without a resource of their own travel as `handle`s named by their
//! ComfyUI type, so new types need no new contract.

wasmtime::component::bindgen!({
    path: "../wit/weft-node-0.2.0",
    world: "plugin",
    with: {
        "weft:node/types.image": crate::runtime::value::ImageRes,
        "weft:node/types.latent": crate::runtime::value::LatentRes,
        "weft:node/types.mask": crate::runtime::value::MaskRes,
        "weft:node/types.audio": crate::runtime::value::AudioRes,
        "weft:node/types.handle": crate::runtime::value::HandleRes,
    },
    imports: { default: trappable },
});

pub(crate) use self::weft::node::types as wit;
