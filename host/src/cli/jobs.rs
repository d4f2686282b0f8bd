//! `weft jobs list|get|cancel|logs|watch`.

use std::path::PathBuf;

use clap::Subcommand;
use serde_json::Value as Json;

use super::client::{exit, status_exit_code, Failure};
use super::follow::{follow_or_cancel, Display};
use super::ServerArgs;

/// The `weft jobs` subcommands.
#[derive(Subcommand)]
pub(crate) enum JobsCommand {
    /// Lists your jobs, newest first.
    List {
        #[command(flatten)]
        server: ServerArgs,
        /// Jobs per page (1 to 100).
        #[arg(long, default_value_t = 20)]
        limit: u32,
        /// The `next_cursor` of the page before.
        #[arg(long)]
        cursor: Option<String>,
        /// Only jobs with this label: KEY=VALUE. Repeatable.
        #[arg(long = "label", value_name = "KEY=VALUE")]
        labels: Vec<String>,
    },
    /// Shows a job.
    Get {
        /// The job id.
        id: String,
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Cancels a job.
    Cancel {
        /// The job id.
        id: String,
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Prints a job's log (kept on the serverless surface).
    Logs {
        /// The job id.
        id: String,
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Follows a job to its end with progress bars; the exit code tells how it ended.
    Watch {
        /// The job id.
        id: String,
        #[command(flatten)]
        server: ServerArgs,
        /// Also download the outputs into this directory.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

impl JobsCommand {
    /// Runs the command; returns the exit code.
    pub(crate) fn run(self, runtime: &tokio::runtime::Runtime) -> i32 {
        let json_output = match &self {
            JobsCommand::List { server, .. }
            | JobsCommand::Get { server, .. }
            | JobsCommand::Cancel { server, .. }
            | JobsCommand::Logs { server, .. }
            | JobsCommand::Watch { server, .. } => server.json,
        };
        match runtime.block_on(self.execute()) {
            Ok(code) => code,
            Err(failure) => failure.report(json_output),
        }
    }

    async fn execute(self) -> Result<i32, Failure> {
        match self {
            JobsCommand::List {
                server,
                limit,
                cursor,
                labels,
            } => {
                let conn = server.connect()?;
                let mut query = url::form_urlencoded::Serializer::new(String::new());
                query.append_pair("limit", &limit.to_string());
                if let Some(cursor) = &cursor {
                    query.append_pair("cursor", cursor);
                }
                for label in &labels {
                    let (k, v) = label
                        .split_once('=')
                        .ok_or_else(|| Failure::validation(format!("--label {label:?}: expected KEY=VALUE")))?;
                    query.append_pair(&format!("metadata[{k}]"), v);
                }
                let page = conn.get(&format!("/jobs?{}", query.finish())).await?;
                if server.json {
                    println!("{page}");
                    return Ok(exit::OK);
                }
                println!("{:<38} {:<10} {:<26} NODE", "JOB", "STATUS", "CREATED");
                for job in page["jobs"].as_array().into_iter().flatten() {
                    println!(
                        "{:<38} {:<10} {:<26} {}",
                        job["id"].as_str().unwrap_or(""),
                        job["status"].as_str().unwrap_or(""),
                        job["created_at"].as_str().unwrap_or(""),
                        job["progress"]["current_node_class"].as_str().unwrap_or("")
                    );
                }
                if let Some(next) = page["next_cursor"].as_str() {
                    println!("more: weft jobs list --cursor {next}");
                }
                Ok(exit::OK)
            }
            JobsCommand::Get { id, server } => {
                let job = server.connect()?.get(&format!("/jobs/{id}")).await?;
                if server.json {
                    println!("{job}");
                } else {
                    super::run::print_result(&job, &[], false);
                    for output in job["outputs"].as_array().into_iter().flatten() {
                        println!(
                            "  output {} ({}): {}",
                            output["name"].as_str().unwrap_or(""),
                            output["content_type"].as_str().unwrap_or(""),
                            output["url"].as_str().unwrap_or("")
                        );
                    }
                }
                Ok(exit::OK)
            }
            JobsCommand::Cancel { id, server } => {
                let job = server
                    .connect()?
                    .post(&format!("/jobs/{id}/cancel"), &Json::Null, None)
                    .await?;
                if server.json {
                    println!("{job}");
                } else {
                    println!("job {id} {}", job["status"].as_str().unwrap_or(""));
                }
                Ok(exit::OK)
            }
            JobsCommand::Logs { id, server } => {
                let job = server.connect()?.get(&format!("/jobs/{id}")).await?;
                if server.json {
                    println!("{}", job.get("logs").cloned().unwrap_or(Json::Null));
                } else if let Some(text) = job["logs"]["text"].as_str() {
                    print!("{text}");
                    if job["logs"]["truncated"] == true {
                        eprintln!("(the log was truncated: only its tail is kept)");
                    }
                } else {
                    eprintln!("job {id} has no log (logs are kept on the serverless surface)");
                }
                Ok(exit::OK)
            }
            JobsCommand::Watch { id, server, out } => {
                let conn = server.connect()?;
                let display = Display::new(server.json);
                let job = follow_or_cancel(&conn, &id, &display).await;
                display.finish();
                let job = job?;
                let files = match &out {
                    Some(dir) => super::run::download_outputs(&conn, &job, dir).await?,
                    None => Vec::new(),
                };
                super::run::print_result(&job, &files, server.json);
                Ok(status_exit_code(job["status"].as_str().unwrap_or("")))
            }
        }
    }
}
