//! Sandbox capabilities: what a plugin's manifest asks for and what the operator grants.

use std::path::PathBuf;

use serde::Deserialize;
use wasmtime_wasi::{FsPerms, WasiCtxBuilder};

/// Sandbox capabilities: asked for by a manifest, granted by the operator. A plugin gets
/// what both name.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Capabilities {
    /// Environment variables it may read.
    #[serde(default)]
    pub env: Vec<String>,
    /// Host directories it may read, each preopened read-only at the same path.
    #[serde(default)]
    pub dirs: Vec<PathBuf>,
    /// Outbound network access.
    #[serde(default)]
    pub network: bool,
}

impl Capabilities {
    /// What both `self` (asked) and `granted` name.
    pub fn intersect(&self, granted: &Capabilities) -> Capabilities {
        Capabilities {
            env: self.env.iter().filter(|e| granted.env.contains(e)).cloned().collect(),
            dirs: self.dirs.iter().filter(|d| granted.dirs.contains(d)).cloned().collect(),
            network: self.network && granted.network,
        }
    }

    /// Parses one operator grant: `env:NAME`, `dir:/path` or `network`.
    pub fn add_grant(&mut self, grant: &str) -> Result<(), String> {
        match grant.split_once(':') {
            Some(("env", name)) if !name.is_empty() => self.env.push(name.to_string()),
            Some(("dir", path)) if !path.is_empty() => self.dirs.push(PathBuf::from(path)),
            None if grant == "network" => self.network = true,
            _ => {
                return Err(format!(
                    "unknown grant {grant:?}; expected env:NAME, dir:/path or network"
                ))
            }
        }
        Ok(())
    }

    /// Opens these capabilities in a guest's WASI context. With none, the guest has no
    /// files, no network, no environment and no arguments.
    pub(super) fn apply(&self, wasi: &mut WasiCtxBuilder) {
        for name in &self.env {
            if let Ok(value) = std::env::var(name) {
                wasi.env(name, value);
            }
        }
        for dir in &self.dirs {
            if let Err(e) = wasi.preopened_dir(dir, dir.to_string_lossy(), FsPerms::ReadOnly) {
                tracing::warn!(dir = %dir.display(), error = %e, "granted directory cannot be opened");
            }
        }
        if self.network {
            wasi.inherit_network().allow_ip_name_lookup(true);
        }
    }
}
