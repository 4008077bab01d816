//! Workflow commands (DESIGN §9): `workflows apply FILE | ls | show NAME`
//! against a running registry, and `runs show ID` against a running router.

use std::path::PathBuf;

use anyhow::Context;
use serde_json::Value;

use crate::connection::{print_json, text, Connection};

#[derive(Debug, clap::Subcommand)]
pub enum WorkflowsCommand {
    /// Register (or replace) the workflow a JSON or YAML file defines (its `name`, or --name).
    /// The file is checked here first (expressions, references, the DAG), then by the
    /// registry against the registered capabilities.
    Apply {
        file: PathBuf,
        /// The workflow's name, when the file does not say it.
        #[arg(long)]
        name: Option<String>,
    },
    /// Every registered workflow.
    Ls,
    /// One workflow's definition (YAML; JSON with --json).
    Show { name: String },
}

#[derive(Debug, clap::Subcommand)]
pub enum RunsCommand {
    /// A run of a workflow: its status and every step's (against a running router).
    Show { run_id: String },
}

/// The answer's JSON on success; otherwise the status, code and message as an error.
async fn answer(response: reqwest::Response, url: &str) -> anyhow::Result<Value> {
    let status = response.status();
    let body: Value = response
        .json()
        .await
        .with_context(|| format!("{url} answered {status} without JSON"))?;
    if !status.is_success() {
        let details = &body["error"]["details"];
        let at = match (details["step"].as_str(), details["pointer"].as_str()) {
            (Some(step), Some(pointer)) => format!(" (step `{step}`, at {pointer})"),
            (None, Some(pointer)) if !pointer.is_empty() => format!(" (at {pointer})"),
            _ => String::new(),
        };
        anyhow::bail!(
            "{status}: {} {}{at}",
            text(&body["error"]["code"]),
            text(&body["error"]["message"])
        );
    }
    Ok(body)
}

pub async fn workflows(connection: &Connection, command: WorkflowsCommand) -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    match command {
        WorkflowsCommand::Apply { file, name } => {
            let bytes = std::fs::read(&file).with_context(|| format!("cannot read {}", file.display()))?;
            let yaml = file
                .extension()
                .and_then(|extension| extension.to_str())
                .is_some_and(|extension| matches!(extension, "yaml" | "yml"));
            let format = if yaml {
                agent_reach_workflows::Format::Yaml
            } else {
                agent_reach_workflows::Format::of(None, &bytes)
            };
            let definition = agent_reach_workflows::definition::parse(&bytes, format)
                .map_err(|problem| anyhow::anyhow!("{}: {problem}", file.display()))?;
            let name = name
                .or_else(|| definition.name.clone())
                .with_context(|| format!("{} names no workflow: add `name:` or pass --name", file.display()))?;
            // What can be checked without the registry, before anything is sent.
            let workflow = agent_reach_workflows::check(&name, definition, None)
                .map_err(|problem| anyhow::anyhow!("{}: {problem}", file.display()))?;
            let url = format!("{}/v1/workflows/{name}", connection.registry);
            let content_type = if yaml { "application/yaml" } else { "application/json" };
            let response = client
                .put(&url)
                .bearer_auth(connection.token()?)
                .header("content-type", content_type)
                .body(bytes)
                .send()
                .await
                .with_context(|| format!("cannot reach {url}"))?;
            let stored = answer(response, &url).await?;
            if connection.json {
                return print_json(&stored);
            }
            outln!(
                "{name} {} registered: {} step(s) (by {})",
                text(&stored["version"]),
                workflow.steps.len(),
                text(&stored["updated_by"])
            );
            Ok(())
        }
        WorkflowsCommand::Ls => {
            let listed = connection.get(format!("{}/v1/workflows", connection.registry)).await?;
            if connection.json {
                return print_json(&listed);
            }
            outln!(
                "{:<28} {:<10} {:>5}  {:<14} DESCRIPTION",
                "NAME",
                "VERSION",
                "STEPS",
                "BY"
            );
            for workflow in listed["workflows"].as_array().into_iter().flatten() {
                outln!(
                    "{:<28} {:<10} {:>5}  {:<14} {}",
                    text(&workflow["name"]),
                    text(&workflow["version"]),
                    workflow["definition"]["steps"].as_array().map_or(0, Vec::len),
                    text(&workflow["updated_by"]),
                    text(&workflow["description"])
                );
            }
            Ok(())
        }
        WorkflowsCommand::Show { name } => {
            let workflow = connection
                .get(format!("{}/v1/workflows/{name}", connection.registry))
                .await?;
            if connection.json {
                return print_json(&workflow);
            }
            let yaml = serde_yaml::to_string(&workflow["definition"]).context("cannot write the definition as YAML")?;
            outln!(
                "# {name} {} (by {})",
                text(&workflow["version"]),
                text(&workflow["updated_by"])
            );
            outln!("{}", yaml.trim_end());
            Ok(())
        }
    }
}

pub async fn runs(connection: &Connection, command: RunsCommand) -> anyhow::Result<()> {
    match command {
        RunsCommand::Show { run_id } => {
            let run = connection
                .get(format!("{}/v1/runs/{run_id}", connection.router))
                .await?;
            if connection.json {
                return print_json(&run);
            }
            print_run(&run);
            Ok(())
        }
    }
}

/// A run as a table of its steps, then its output or error.
pub fn print_run(run: &Value) {
    outln!(
        "run {}: {} {} {}",
        text(&run["run_id"]),
        text(&run["workflow"]),
        text(&run["version"]),
        text(&run["status"])
    );
    outln!(
        "  {:<14} {:<10} {:>8}  {:<20} {:>9}",
        "STEP",
        "STATUS",
        "ATTEMPTS",
        "AGENT",
        "DURATION"
    );
    for step in run["steps"].as_array().into_iter().flatten() {
        let duration = match (step["started_at_ms"].as_u64(), step["finished_at_ms"].as_u64()) {
            (Some(started), Some(finished)) => format!("{} ms", finished.saturating_sub(started)),
            _ => "-".to_string(),
        };
        let agent = match step["items"].as_array() {
            Some(items) => format!("({} calls)", items.len()),
            None => text(&step["agent_id"]),
        };
        let status = match step["skipped"].as_bool() {
            Some(true) => "skipped".to_string(),
            _ => text(&step["status"]),
        };
        outln!(
            "  {:<14} {:<10} {:>8}  {:<20} {:>9}",
            text(&step["id"]),
            status,
            step["attempts"].as_u64().unwrap_or(0),
            agent,
            duration
        );
    }
    if !run["output"].is_null() {
        outln!("output: {}", run["output"]);
    }
    if !run["error"].is_null() {
        outln!(
            "error: {} {}",
            text(&run["error"]["code"]),
            text(&run["error"]["message"])
        );
    }
}
