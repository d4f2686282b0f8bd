//! `weft assets upload|get`.

use std::path::PathBuf;

use clap::Subcommand;
use serde_json::json;

use super::client::{exit, Failure};
use super::ServerArgs;

/// The `weft assets` subcommands.
#[derive(Subcommand)]
pub(crate) enum AssetsCommand {
    /// Uploads a file and prints its asset id and the reference to put in a workflow.
    Upload {
        /// The file.
        file: PathBuf,
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Shows an asset, and downloads its content with --out.
    Get {
        /// The asset id.
        id: String,
        #[command(flatten)]
        server: ServerArgs,
        /// Write the content to this file.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

impl AssetsCommand {
    /// Runs the command; returns the exit code.
    pub(crate) fn run(self, runtime: &tokio::runtime::Runtime) -> i32 {
        let json_output = match &self {
            AssetsCommand::Upload { server, .. } | AssetsCommand::Get { server, .. } => server.json,
        };
        match runtime.block_on(self.execute()) {
            Ok(code) => code,
            Err(failure) => failure.report(json_output),
        }
    }

    async fn execute(self) -> Result<i32, Failure> {
        match self {
            AssetsCommand::Upload { file, server } => {
                let asset = server.connect()?.upload(&file).await?;
                if server.json {
                    println!("{asset}");
                } else {
                    let id = asset["id"].as_str().unwrap_or("");
                    println!("asset {id} ({} bytes)", asset["size_bytes"]);
                    println!("reference: {}", json!({"__type": "core/ASSET", "info": {"id": id}}));
                }
                Ok(exit::OK)
            }
            AssetsCommand::Get { id, server, out } => {
                let conn = server.connect()?;
                let asset = conn.get(&format!("/assets/{id}")).await?;
                if let Some(out) = &out {
                    let url = asset["url"]
                        .as_str()
                        .ok_or_else(|| Failure::new(exit::OTHER, "the asset has no url"))?;
                    conn.download(url, out).await?;
                }
                if server.json {
                    println!("{asset}");
                } else {
                    println!(
                        "asset {id}: {} ({} bytes, {})",
                        asset["file_path"].as_str().unwrap_or(""),
                        asset["size_bytes"],
                        asset["content_type"].as_str().unwrap_or("")
                    );
                    if let Some(out) = &out {
                        println!("wrote {}", out.display());
                    }
                }
                Ok(exit::OK)
            }
        }
    }
}
