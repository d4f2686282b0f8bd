//! `weft plugin new NAME --lang rust|python|js`: a plugin skeleton that builds as it is.

use std::path::{Path, PathBuf};

use super::Lang;

/// The WIT of the contract new plugins target (Python and JS build from a copy of it).
const WIT: &[(&str, &str)] = &[
    ("types.wit", include_str!("../../../../wit/weft-node-0.2.0/types.wit")),
    (
        "diffusion.wit",
        include_str!("../../../../wit/weft-node-0.2.0/diffusion.wit"),
    ),
    ("audio.wit", include_str!("../../../../wit/weft-node-0.2.0/audio.wit")),
    ("masks.wit", include_str!("../../../../wit/weft-node-0.2.0/masks.wit")),
];

/// The files of each language's skeleton: (path in the plugin, template).
const RUST: &[(&str, &str)] = &[
    ("Cargo.toml", include_str!("templates/rust/Cargo.toml")),
    ("src/lib.rs", include_str!("templates/rust/lib.rs")),
    ("README.md", include_str!("templates/rust/README.md")),
];
const PYTHON: &[(&str, &str)] = &[
    ("app.py", include_str!("templates/python/app.py")),
    ("nodes.py", include_str!("templates/python/nodes.py")),
    ("test_nodes.py", include_str!("templates/python/test_nodes.py")),
    ("README.md", include_str!("templates/python/README.md")),
];
const JS: &[(&str, &str)] = &[
    ("plugin.js", include_str!("templates/js/plugin.js")),
    ("nodes.js", include_str!("templates/js/nodes.js")),
    ("test.js", include_str!("templates/js/test.js")),
    ("package.json", include_str!("templates/js/package.json")),
    ("README.md", include_str!("templates/js/README.md")),
    ("weft.js", include_str!("../../../../sdk/js/weft.js")),
    ("weft.d.ts", include_str!("../../../../sdk/js/weft.d.ts")),
];

/// Writes plugin `name` in `lang` into `<dir>/<name>` (which must not exist yet) and says
/// how to build it.
pub(super) fn run(name: &str, lang: Lang, dir: &Path) -> anyhow::Result<()> {
    check_name(name)?;
    let root = dir.join(name);
    if root.exists() {
        anyhow::bail!("{} already exists; choose another name or folder", root.display());
    }
    let file = name.replace('-', "_");
    let sdk_path = sdk_path();
    let vars = [
        ("{{name}}", name.to_string()),
        ("{{class}}", class_name(name)),
        ("{{file}}", file),
        ("{{sdk_path}}", sdk_path.display().to_string()),
    ];
    let (files, wit): (&[(&str, &str)], bool) = match lang {
        Lang::Rust => (RUST, false),
        Lang::Python => (PYTHON, true),
        Lang::Js => (JS, true),
    };
    for (path, template) in files {
        let text = vars
            .iter()
            .fold(template.to_string(), |t, (key, value)| t.replace(key, value));
        write(&root.join(path), &text)?;
    }
    if wit {
        for (path, text) in WIT {
            write(&root.join("wit").join(path), text)?;
        }
    }
    println!(
        "wrote {} ({lang:?}): see {} for the build command",
        root.display(),
        root.join("README.md").display()
    );
    Ok(())
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, text).map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))
}

/// A name that is a Cargo package, a Python-importable file stem and a plugin name at once.
fn check_name(name: &str) -> anyhow::Result<()> {
    let valid = name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if !valid {
        anyhow::bail!(
            "plugin name {name:?}: use up to 64 lower case letters, digits, `-` and `_`, starting with a letter"
        );
    }
    Ok(())
}

/// The class of the skeleton's node: the name in CamelCase, then `Greet`.
fn class_name(name: &str) -> String {
    let camel: String = name
        .split(['-', '_'])
        .map(|part| {
            let mut chars = part.chars();
            chars
                .next()
                .map(|first| first.to_ascii_uppercase().to_string() + chars.as_str())
                .unwrap_or_default()
        })
        .collect();
    format!("{camel}Greet")
}

/// The weft-sdk a Rust skeleton depends on: this build's source tree, where the binary was
/// built (a plugin outside it edits the path, or uses a git dependency).
fn sdk_path() -> PathBuf {
    let sdk = Path::new(env!("CARGO_MANIFEST_DIR")).join("../sdk");
    sdk.canonicalize().unwrap_or(sdk)
}

#[cfg(test)]
mod tests {
    #[test]
    fn new_plugins_get_every_file_of_the_contract() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../wit/weft-node-0.2.0");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        files.sort();
        let mut listed: Vec<&str> = super::WIT.iter().map(|(name, _)| *name).collect();
        listed.sort();
        assert_eq!(files, listed, "WIT must list every file of wit/weft-node-0.2.0");
    }
}
