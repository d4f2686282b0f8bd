//! The node contracts the host serves, side by side: `weft:node@0.1.0` (frozen) and
//! `weft:node@0.2.0`. A component's world is read from its imports; calls then go through
//! that version's bindings, which lower host [`Value`]s into the version's WIT values and
//! lift its results back. Everything above this module sees one kind of plugin.
//!
//! Adding a version: its `bindgen!` in `bindings`, a module here implementing
//! [`Contract`](lowering::Contract) (its own handle types and calls; the rest is generic), a
//! [`World`] variant, its host imports linked beside the others (see `capabilities`), and
//! its WIT folder recorded in `wit/RELEASED` once it ships.

use wasmtime::component::{Component, Linker};
use wasmtime::{Engine, Store};

use super::bindings;
use super::capabilities::CallState;
use super::catalog::NodeDef;
use super::value::{NodeFailure, NodeOutput, Value};

mod lowering;
pub(crate) mod v0_1;
pub(crate) mod v0_2;

/// For the fuzz targets, which lower and lift values as a call does.
#[cfg(feature = "fuzzing")]
pub(crate) use lowering::{lift_result, lower};

/// A version of the `weft:node` contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum World {
    /// `weft:node@0.1.0`, the first released contract.
    V0_1,
    /// `weft:node@0.2.0`: generic handles, model-folder combos, the diffusion interface.
    V0_2,
}

impl World {
    /// Every version the host serves, oldest first.
    pub(crate) const ALL: [World; 2] = [World::V0_1, World::V0_2];

    /// The package version, for example `0.2.0`.
    pub(crate) fn version(self) -> &'static str {
        match self {
            World::V0_1 => "0.1.0",
            World::V0_2 => "0.2.0",
        }
    }

    /// The world `component` targets, from the version of the `weft:node/types` interface
    /// it imports (every plugin does: its exports use those types).
    pub(crate) fn of(engine: &Engine, component: &Component) -> anyhow::Result<World> {
        let ty = component.component_type();
        let versions: Vec<&str> = ty
            .imports(engine)
            .filter_map(|(name, _)| name.strip_prefix("weft:node/types@"))
            .collect();
        match versions.as_slice() {
            [version] => World::ALL.into_iter().find(|w| w.version() == *version).ok_or_else(|| {
                anyhow::anyhow!(
                    "it targets weft:node@{version}; this host serves {}",
                    World::ALL.map(|w| format!("weft:node@{}", w.version())).join(" and ")
                )
            }),
            [] => anyhow::bail!("it does not import weft:node/types, so it is not a weft node plugin"),
            _ => anyhow::bail!("it imports more than one version of weft:node/types: {versions:?}"),
        }
    }
}

/// A plugin pre-linked against its own world.
pub(crate) enum PluginPre {
    /// Built against `weft:node@0.1.0`.
    V0_1(bindings::v0_1::PluginPre<CallState>),
    /// Built against `weft:node@0.2.0`.
    V0_2(bindings::v0_2::PluginPre<CallState>),
}

impl PluginPre {
    /// Pre-links `component`, whose world is read from its imports.
    pub(crate) fn new(engine: &Engine, linker: &Linker<CallState>, component: &Component) -> anyhow::Result<Self> {
        let world = World::of(engine, component)?;
        let pre = linker.instantiate_pre(component)?;
        Ok(match world {
            World::V0_1 => PluginPre::V0_1(bindings::v0_1::PluginPre::new(pre)?),
            World::V0_2 => PluginPre::V0_2(bindings::v0_2::PluginPre::new(pre)?),
        })
    }

    /// The world the plugin was built against.
    pub(crate) fn world(&self) -> World {
        match self {
            PluginPre::V0_1(_) => World::V0_1,
            PluginPre::V0_2(_) => World::V0_2,
        }
    }

    /// Instantiates the plugin in `store` and calls its `describe()`.
    pub(crate) fn describe(&self, store: &mut Store<CallState>, plugin: &str) -> wasmtime::Result<Vec<NodeDef>> {
        match self {
            PluginPre::V0_1(pre) => lowering::describe::<v0_1::V0_1>(pre, store, plugin),
            PluginPre::V0_2(pre) => lowering::describe::<v0_2::V0_2>(pre, store, plugin),
        }
    }

    /// Instantiates the plugin in `store` and runs node `class` on `inputs`. `Err` is a
    /// trap or host error (the caller classifies it); `Ok(Err)` a failure already named.
    pub(crate) fn execute(
        &self,
        store: &mut Store<CallState>,
        class: &str,
        inputs: Vec<(String, Value)>,
        returned_limit: usize,
    ) -> wasmtime::Result<Result<NodeOutput, NodeFailure>> {
        match self {
            PluginPre::V0_1(pre) => lowering::execute::<v0_1::V0_1>(pre, store, class, inputs, returned_limit),
            PluginPre::V0_2(pre) => lowering::execute::<v0_2::V0_2>(pre, store, class, inputs, returned_limit),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// The recorded hash of a WIT folder: blake3 over its files in name order, each as its
    /// name, a zero byte, its length (u64 little-endian) and its bytes.
    fn folder_hash(dir: &Path) -> String {
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.expect("directory entry").path())
            .filter(|p| p.is_file())
            .collect();
        files.sort();
        let mut hasher = blake3::Hasher::new();
        for file in files {
            let bytes = std::fs::read(&file).expect("readable WIT file");
            let name = file.file_name().expect("file name").to_string_lossy().into_owned();
            hasher.update(name.as_bytes());
            hasher.update(&[0]);
            hasher.update(&(bytes.len() as u64).to_le_bytes());
            hasher.update(&bytes);
        }
        format!("blake3:{}", hasher.finalize().to_hex())
    }

    /// A released contract is frozen: every folder listed in `wit/RELEASED` still hashes to
    /// what was recorded when it shipped. A change means a new version folder instead.
    #[test]
    fn released_wit_folders_never_change() {
        let wit = Path::new(env!("CARGO_MANIFEST_DIR")).join("../wit");
        let recorded = std::fs::read_to_string(wit.join("RELEASED")).expect("wit/RELEASED");
        let mut checked = 0;
        for line in recorded.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (folder, hash) = line.split_once(char::is_whitespace).expect("`<folder> <hash>` lines");
            let actual = folder_hash(&wit.join(folder));
            assert_eq!(
                actual,
                hash.trim(),
                "wit/{folder} changed after its release; released contracts are frozen: \
                 add a new version folder beside it instead"
            );
            checked += 1;
        }
        assert!(checked >= 1, "wit/RELEASED lists no folder");
    }

    #[test]
    fn the_first_contract_is_recorded() {
        let wit = Path::new(env!("CARGO_MANIFEST_DIR")).join("../wit");
        let recorded = std::fs::read_to_string(wit.join("RELEASED")).expect("wit/RELEASED");
        assert!(recorded.lines().any(|l| l.starts_with("weft-node-0.1.0 ")));
    }
}
