//! The bodies of the `weft` command's longer subcommands (the binary's, not the library's).

pub(crate) mod comfyui_frontend;
pub(crate) mod models;
