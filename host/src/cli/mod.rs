//! The bodies of the `weft` command's longer subcommands (the binary's, not the library's).
//! The client commands (`run`, `jobs`, `assets`) talk to a server over the v2 job API; see
//! [`client::exit`] for their exit codes.

pub(crate) mod assets;
pub(crate) mod client;
pub(crate) mod comfyui_frontend;
pub(crate) mod follow;
pub(crate) mod jobs;
pub(crate) mod models;
pub(crate) mod plugin;
pub(crate) mod run;

use clap::{Args, Subcommand};

use client::{Connection, Failure};

/// Where a client command finds its server, and how it prints.
#[derive(Args, Clone)]
pub(crate) struct ServerArgs {
    /// The server: http(s)://host[:port], with its mount prefix if it has one.
    #[arg(long, env = "WEFT_SERVER")]
    server: Option<String>,
    /// API key or token (sent as a bearer token).
    #[arg(long, env = "WEFT_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Print JSON for scripts instead of text.
    #[arg(long)]
    json: bool,
}

impl ServerArgs {
    /// The connection to `--server`, which these commands need.
    fn connect(&self) -> Result<Connection, Failure> {
        let server = self
            .server
            .as_deref()
            .ok_or_else(|| Failure::validation("no server: pass --server URL or set WEFT_SERVER"))?;
        Connection::new(server, self.api_key.clone())
    }
}

/// The client commands, flattened into `weft`'s own.
#[derive(Subcommand)]
pub(crate) enum ClientCommand {
    /// Runs a workflow: on --server, or in this process when none is given, with progress
    /// bars; writes the outputs to --out. Exit codes: 0 succeeded, 3 failed, 4 canceled,
    /// 5 invalid request, 6 connection error, 7 not authorized, 1 other.
    Run(Box<run::RunArgs>),
    /// Jobs on a server: list, get, cancel, logs, watch.
    Jobs {
        #[command(subcommand)]
        command: jobs::JobsCommand,
    },
    /// Assets on a server: upload, get.
    Assets {
        #[command(subcommand)]
        command: assets::AssetsCommand,
    },
}

impl ClientCommand {
    /// Runs the command; returns the exit code.
    pub(crate) fn run(self, runtime: &tokio::runtime::Runtime) -> i32 {
        match self {
            ClientCommand::Run(args) => run::main(*args, runtime),
            ClientCommand::Jobs { command } => command.run(runtime),
            ClientCommand::Assets { command } => command.run(runtime),
        }
    }
}
