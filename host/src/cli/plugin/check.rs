//! `weft plugin check FILE.wasm`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use weft::runtime::{read_source, Capabilities, Limits, NodeDef, Runtime, RuntimeConfig};

/// Checks the plugin at `file` next to the built-ins (and the plugins of `plugins_dir`)
/// and prints the report; `Ok(false)` when it found problems.
pub(super) fn run(
    file: &Path,
    plugins_dir: Option<PathBuf>,
    plugin_load_timeout: Duration,
    node_memory_mib: usize,
) -> anyhow::Result<bool> {
    let source = read_source(file).map_err(anyhow::Error::msg)?;
    // The plugin itself, if it is in that folder already, is not its own neighbour.
    let runtime = Runtime::load(RuntimeConfig {
        limits: Limits {
            memory_bytes: node_memory_mib << 20,
            ..Limits::default()
        },
        plugins_dir,
        plugin_load_timeout,
        ..RuntimeConfig::default()
    })?;
    let runtime = runtime.without_plugin(&source.name).unwrap_or(runtime);
    let report = runtime.inspect(&source);
    println!("plugin {} ({})", report.name, report.origin);
    match &report.contract {
        Some(version) => println!("contract: weft:node@{version}"),
        None => println!("contract: unknown"),
    }
    println!("capabilities asked for: {}", capabilities(&report.capabilities));
    println!("classes: {}", report.classes.len());
    for def in &report.classes {
        print_class(def);
    }
    if report.is_ok() {
        println!("no problems found");
    } else {
        println!("problems: {}", report.problems.len());
        for problem in &report.problems {
            println!("  - {problem}");
        }
    }
    Ok(report.is_ok())
}

/// The manifest's asks, in the `--grant` syntax an operator would answer them with.
fn capabilities(asked: &Capabilities) -> String {
    let mut items: Vec<String> = asked.env.iter().map(|name| format!("env:{name}")).collect();
    items.extend(asked.dirs.iter().map(|dir| format!("dir:{}", dir.display())));
    if asked.network {
        items.push("network".into());
    }
    if items.is_empty() {
        "none".into()
    } else {
        items.join(", ")
    }
}

fn print_class(def: &NodeDef) {
    let mut flags = vec![if def.deterministic {
        "deterministic"
    } else {
        "not cached"
    }];
    if def.output_node {
        flags.push("output node");
    }
    println!(
        "  {} \"{}\" [{}] ({})",
        def.class_type,
        def.display_name,
        def.category,
        flags.join(", ")
    );
    for input in &def.inputs {
        let mut details = Vec::new();
        details.push(if input.required { "required" } else { "optional" }.to_string());
        if let Some(default) = &input.default {
            details.push(format!("default {default}"));
        }
        if let Some(min) = input.min {
            details.push(format!("min {min}"));
        }
        if let Some(max) = input.max {
            details.push(format!("max {max}"));
        }
        if input.is_combo() && !input.options.is_empty() {
            details.push(format!("choices {:?}", input.options));
        }
        if let Some(folder) = &input.model_folder {
            details.push(format!("files of models/{folder}"));
        }
        println!("    in  {}: {} ({})", input.name, input.type_name, details.join(", "));
    }
    for output in &def.outputs {
        let list = if output.is_list { " (list)" } else { "" };
        println!("    out {}: {}{list}", output.name, output.type_name);
    }
}
