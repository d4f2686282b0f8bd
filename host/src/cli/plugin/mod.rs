//! `weft plugin`: the node author's loop. `check` loads a component as the server would and
//! reports its classes, capabilities and contract problems; `new` writes a plugin skeleton.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Subcommand, ValueEnum};
use weft::runtime::{Limits, RuntimeConfig};

mod check;
mod new;

/// The `weft plugin` subcommands.
#[derive(Subcommand)]
pub(crate) enum PluginCommand {
    /// Loads a plugin under the server's limits and prints its classes (inputs and outputs),
    /// the capabilities its manifest (`<name>.toml` beside it) asks for, and every contract
    /// problem; exits 1 when there is one.
    Check {
        /// The component (.wasm).
        file: PathBuf,
        /// Plugins it will be installed beside: their classes count for collisions.
        #[arg(long, env = "WEFT_PLUGINS_DIR")]
        plugins_dir: Option<PathBuf>,
        /// Time the plugin may take to describe itself, in milliseconds.
        #[arg(long, env = "WEFT_PLUGIN_LOAD_TIMEOUT_MS", default_value_t = RuntimeConfig::DEFAULT_PLUGIN_LOAD_TIMEOUT_MS)]
        plugin_load_timeout_ms: u64,
        /// Linear memory per instance, in MiB.
        #[arg(long, env = "WEFT_NODE_MEMORY_MIB", default_value_t = Limits::DEFAULT_MEMORY_MIB)]
        node_memory_mib: usize,
    },
    /// Writes a buildable plugin skeleton: one node, its test, and a README with the build
    /// command.
    New {
        /// Plugin name: lower case letters, digits, `-` and `_`, starting with a letter.
        name: String,
        /// The language of the plugin.
        #[arg(long, value_enum)]
        lang: Lang,
        /// Folder to create the plugin's folder in.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
    },
}

/// A language `weft plugin new` writes.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub(crate) enum Lang {
    /// Rust, with weft-sdk.
    Rust,
    /// Python, with componentize-py.
    Python,
    /// JavaScript, with componentize-js and sdk/js/weft.js.
    Js,
}

impl PluginCommand {
    /// Runs the subcommand; `Ok(false)` means it found problems (exit code 1).
    pub(crate) fn run(self) -> anyhow::Result<bool> {
        match self {
            PluginCommand::Check {
                file,
                plugins_dir,
                plugin_load_timeout_ms,
                node_memory_mib,
            } => check::run(
                &file,
                plugins_dir,
                Duration::from_millis(plugin_load_timeout_ms.max(1)),
                node_memory_mib,
            ),
            PluginCommand::New { name, lang, dir } => new::run(&name, lang, &dir).map(|()| true),
        }
    }
}
