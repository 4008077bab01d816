//! `agent-reach trail show|verify|replay` (DESIGN §9, issue 37), against a
//! running router with the trail on; the token must name an `operators:` or
//! `auditors:` caller of `acl.yaml`.
//!
//! - `show` draws one collaboration (a session, a run or a request) as a tree of hops.
//! - `verify` reads every chain (or one) as stored and checks it here, against the
//!   router's published keys: a record edited or removed is named.
//! - `replay` sends a session's recorded inputs again, in their recorded order,
//!   pinned to the recorded versions (or one capability to another version),
//!   marked as replays (`replay_of`, derived request and session ids, scratch
//!   contexts), and prints what changed in each output; `--sample N` replays the
//!   N newest recorded calls of one capability against another version: a canary
//!   before any live traffic.
//!
//! Failures are `error[CODE]: message` with a stable code and exit status 2:
//! `TRAIL_NOT_FOUND`, `NOTHING_TO_REPLAY`, `VERSION_NOT_FOUND`, `TRAIL_BROKEN`
//! (exit 1, from `verify`), or the router's own code.

use std::collections::BTreeMap;

use agent_reach_trail::{HeadClaims, HeadKeys, Record, Stored, StoredHead, Verifier};
use anyhow::Context;
use serde_json::{json, Value};

use crate::connection::{print_json, text, Connection};

#[derive(Debug, clap::Subcommand)]
pub enum TrailCommand {
    /// One collaboration as a tree of hops: who called whom, which version, how long, what failed.
    Show {
        #[command(flatten)]
        which: Which,
    },
    /// Check the chains as stored: every record's hash and link, every signed segment head.
    Verify {
        /// Only this chain (a router replica's id, as `GET /v1/trail/chains` lists them).
        #[arg(long)]
        chain: Option<String>,
    },
    /// Send recorded inputs again and show what changed.
    Replay {
        /// The session (or, failing that, the run) to replay.
        #[arg(required_unless_present = "sample")]
        id: Option<String>,
        /// Replay this capability's calls at `--version` (the others at their recorded versions).
        #[arg(long, requires = "version")]
        capability: Option<String>,
        /// The version `--capability` is replayed at.
        #[arg(long, requires = "capability")]
        version: Option<String>,
        /// Print what would be sent; send nothing.
        #[arg(long)]
        dry_run: bool,
        /// Instead of one session: the N newest recorded calls of `--capability`, at `--version`.
        #[arg(long, requires = "capability", conflicts_with = "id", value_parser = clap::value_parser!(u16).range(1..=1000))]
        sample: Option<u16>,
        /// The context service, where replays get scratch copies of the contexts they use.
        #[arg(long, env = "AGENT_REACH_CONTEXT", default_value = "http://127.0.0.1:7600")]
        context: String,
    },
}

/// Which collaboration: exactly one of the three.
#[derive(Debug, clap::Args)]
#[group(required = true, multiple = false)]
pub struct Which {
    #[arg(long)]
    session: Option<String>,
    #[arg(long)]
    run: Option<String>,
    #[arg(long)]
    request: Option<String>,
}

/// A failure with a stable code, printed as `error[CODE]: message`.
#[derive(Debug)]
pub struct Coded {
    pub code: &'static str,
    pub message: String,
}

impl std::fmt::Display for Coded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "error[{}]: {}", self.code, self.message)
    }
}

impl std::error::Error for Coded {}

fn coded(code: &'static str, message: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(Coded {
        code,
        message: message.into(),
    })
}

pub async fn trail(connection: &Connection, command: TrailCommand) -> anyhow::Result<()> {
    match command {
        TrailCommand::Show { which } => show(connection, &which).await,
        TrailCommand::Verify { chain } => verify(connection, chain).await,
        TrailCommand::Replay {
            id,
            capability,
            version,
            dry_run,
            sample,
            context,
        } => {
            let pin = capability.zip(version);
            let plan = Plan {
                pin: pin.as_ref(),
                dry_run,
                context: &context,
            };
            match (id, sample) {
                (_, Some(sample)) => canary(connection, &plan, usize::from(sample)).await,
                (Some(id), None) => replay(connection, &plan, &id).await,
                (None, None) => Err(coded("INVALID_ARGUMENT", "give a session or run id, or --sample N")),
            }
        }
    }
}

// === Show ===

/// The records of one collaboration (every page), with the tree of hops.
async fn collaboration(connection: &Connection, query: &str) -> anyhow::Result<(Vec<Record>, Value)> {
    let mut records = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut url = format!("{}/v1/trail?{query}&limit=1000&view=tree", connection.router);
        if let Some(cursor) = &cursor {
            url.push_str(&format!("&cursor={cursor}"));
        }
        let page = connection.get(url).await?;
        for record in page["records"].as_array().into_iter().flatten() {
            records.push(serde_json::from_value::<Record>(record.clone()).context("a trail record")?);
        }
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            // The last page carries the tree of every record.
            None => return Ok((records, page["tree"].clone())),
        }
    }
}

fn query_of(which: &Which) -> String {
    let (name, id) = match (&which.session, &which.run, &which.request) {
        (Some(id), _, _) => ("session_id", id),
        (_, Some(id), _) => ("run_id", id),
        (_, _, Some(id)) => ("request_id", id),
        _ => ("session_id", &String::new()),
    };
    format!("{name}={}", encode(id))
}

fn encode(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, percent_encoding::NON_ALPHANUMERIC).to_string()
}

async fn show(connection: &Connection, which: &Which) -> anyhow::Result<()> {
    let query = query_of(which);
    let (records, tree) = collaboration(connection, &query).await?;
    if records.is_empty() {
        return Err(coded(
            "TRAIL_NOT_FOUND",
            format!("the trail holds no record for {query} (wrong id, another tenant's, or older than the retention)"),
        ));
    }
    if connection.json {
        return print_json(&json!({ "records": records, "tree": tree }));
    }
    let hops = agent_reach_trail::tree::build(records);
    for line in agent_reach_trail::tree::render(&hops).lines() {
        outln!("{line}");
    }
    Ok(())
}

// === Verify ===

/// The router's published keys, as the heads are checked against.
struct RouterKeys(agent_reach_access::AssertionVerifier);

impl HeadKeys for RouterKeys {
    fn verify(&self, jws: &str) -> Result<HeadClaims, String> {
        self.0.verify_document(jws).map_err(|error| error.to_string())
    }
}

async fn verify(connection: &Connection, only: Option<String>) -> anyhow::Result<()> {
    let jwks_url = format!("{}/.well-known/jwks.json", connection.router);
    let jwks = reqwest::get(&jwks_url)
        .await
        .with_context(|| format!("cannot reach {jwks_url}"))?
        .bytes()
        .await?;
    let keys = RouterKeys(
        agent_reach_access::AssertionVerifier::from_jwks(&jwks, agent_reach_access::assertion::DEFAULT_ISSUER)
            .map_err(|error| anyhow::anyhow!("{jwks_url}: {error}"))?,
    );
    let chains = connection.get(format!("{}/v1/trail/chains", connection.router)).await?;
    let mut names: Vec<String> = chains["chains"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|chain| chain["router"].as_str().map(str::to_string))
        .collect();
    if let Some(only) = only {
        if !names.contains(&only) {
            return Err(coded(
                "TRAIL_NOT_FOUND",
                format!("no chain `{only}` (chains: {})", names.join(", ")),
            ));
        }
        names = vec![only];
    }
    let mut reports = Vec::new();
    for name in &names {
        reports.push((name.clone(), verify_chain(connection, name, &keys).await?));
    }
    let broken = reports.iter().filter(|(_, report)| report.broken.is_some()).count();
    if connection.json {
        let out: Vec<Value> = reports
            .iter()
            .map(|(name, report)| {
                json!({
                    "chain": name, "records": report.records, "heads": report.heads,
                    "first_seq": report.first_seq, "last_seq": report.last_seq,
                    "starts_mid_chain": report.starts_mid_chain,
                    "broken": report.broken.as_ref().map(|broken| json!({"at": broken.at, "seq": broken.seq, "why": broken.why})),
                })
            })
            .collect();
        print_json(&json!({ "chains": out }))?;
    } else {
        for (name, report) in &reports {
            let range = match (report.first_seq, report.last_seq) {
                (Some(first), Some(last)) => format!("records {first}..={last}"),
                _ => "no records".to_string(),
            };
            match &report.broken {
                None => outln!(
                    "chain {name}: {range}, {} segment head(s): intact{}",
                    report.heads,
                    if report.starts_mid_chain {
                        " (starts mid-chain: earlier records past the retention)"
                    } else {
                        ""
                    }
                ),
                Some(broken) => outln!("chain {name}: BROKEN at {} ({range} read): {}", broken.at, broken.why),
            }
        }
    }
    if broken > 0 {
        eprintln!(
            "error[TRAIL_BROKEN]: {broken} of {} chain(s) fail verification",
            reports.len()
        );
        std::process::exit(1);
    }
    Ok(())
}

/// Pages of a chain's records and heads, fed in stream order.
async fn verify_chain(
    connection: &Connection,
    chain: &str,
    keys: &RouterKeys,
) -> anyhow::Result<agent_reach_trail::Report> {
    let base = format!("{}/v1/trail/chains/{chain}", connection.router);
    let mut verifier = Verifier::new(keys);
    let mut heads: std::collections::VecDeque<StoredHead> = std::collections::VecDeque::new();
    let mut heads_after: Option<String> = None;
    let mut heads_done = false;
    let mut records_after: Option<String> = None;
    loop {
        let url = page_url(&format!("{base}/records"), records_after.as_deref());
        let page = connection.get(url).await?;
        let records: Vec<Stored> = serde_json::from_value(page["records"].clone()).context("trail records")?;
        if records.is_empty() {
            break;
        }
        for record in &records {
            // Every head of an earlier millisecond goes before this record.
            loop {
                if heads.is_empty() && !heads_done {
                    let page = connection
                        .get(page_url(&format!("{base}/heads"), heads_after.as_deref()))
                        .await?;
                    let more: Vec<StoredHead> = serde_json::from_value(page["heads"].clone()).context("trail heads")?;
                    heads_done = more.is_empty();
                    heads_after = more.last().map(|head| head.id.clone()).or(heads_after);
                    heads.extend(more);
                }
                match heads.front() {
                    Some(head) if millis(&head.id) < millis(&record.id) => {
                        if let Some(head) = heads.pop_front() {
                            verifier.head(&head);
                        }
                    }
                    _ => break,
                }
            }
            verifier.record(record);
        }
        records_after = records.last().map(|record| record.id.clone());
    }
    // The heads after the last record.
    loop {
        while let Some(head) = heads.pop_front() {
            verifier.head(&head);
        }
        if heads_done {
            break;
        }
        let page = connection
            .get(page_url(&format!("{base}/heads"), heads_after.as_deref()))
            .await?;
        let more: Vec<StoredHead> = serde_json::from_value(page["heads"].clone()).context("trail heads")?;
        heads_done = more.is_empty();
        heads_after = more.last().map(|head| head.id.clone()).or(heads_after);
        heads.extend(more);
    }
    Ok(verifier.finish(true))
}

fn page_url(base: &str, after: Option<&str>) -> String {
    match after {
        Some(after) => format!("{base}?limit=1000&after={after}"),
        None => format!("{base}?limit=1000"),
    }
}

/// The milliseconds of a stream id (`{ms}-{n}`).
fn millis(id: &str) -> u64 {
    id.split('-').next().and_then(|ms| ms.parse().ok()).unwrap_or(0)
}

// === Replay ===

struct Plan<'a> {
    /// `(capability, version)`: that capability replayed at that version.
    pin: Option<&'a (String, String)>,
    dry_run: bool,
    context: &'a str,
}

impl Plan<'_> {
    /// The version `record`'s call is replayed at.
    fn version_for<'r>(&'r self, record: &'r Record) -> Option<&'r str> {
        match self.pin {
            Some((capability, version)) if *capability == record.capability => Some(version),
            _ => record.capability_version.as_deref(),
        }
    }
}

/// What one replayed call gave, against its record.
struct Replayed {
    record: Record,
    version: Option<String>,
    outcome: Result<Value, String>,
}

async fn replay(connection: &Connection, plan: &Plan<'_>, id: &str) -> anyhow::Result<()> {
    let (mut records, _) = collaboration(connection, &format!("session_id={}", encode(id))).await?;
    if records.is_empty() {
        records = collaboration(connection, &format!("run_id={}", encode(id))).await?.0;
    }
    if records.is_empty() {
        return Err(coded(
            "TRAIL_NOT_FOUND",
            format!(
                "the trail holds no session or run `{id}` (wrong id, another tenant's, or older than the retention)"
            ),
        ));
    }
    records.sort_by(|a, b| (a.at_ms, &a.router, a.seq).cmp(&(b.at_ms, &b.router, b.seq)));
    let total = records.len();
    // Replays of replays are not replayed again.
    let inputs: Vec<Record> = records
        .into_iter()
        .filter(|record| record.input.is_some() && record.replay_of.is_none())
        .collect();
    if inputs.is_empty() {
        return Err(coded(
            "NOTHING_TO_REPLAY",
            format!(
                "none of the {total} recorded call(s) of `{id}` holds its input: name the capabilities under `trail: {{payloads: [...]}}` in acl.yaml to record payloads"
            ),
        ));
    }
    check_pinned_version(connection, plan).await?;
    let nonce = format!("{:08x}", rand::random::<u32>());
    let scratch = scratch_contexts(connection, plan, &inputs, &nonce).await?;
    let mut replayed = Vec::new();
    for record in inputs {
        replayed.push(replay_one(connection, plan, record, &nonce, &scratch).await?);
    }
    report(connection, plan, &replayed)
}

/// Refuses a `--version` no instance offers (`VERSION_NOT_FOUND`), before anything is sent.
async fn check_pinned_version(connection: &Connection, plan: &Plan<'_>) -> anyhow::Result<()> {
    let Some((capability, version)) = plan.pin else {
        return Ok(());
    };
    let url = format!("{}/v1/capabilities/{}", connection.registry, encode(capability));
    let resolved = connection.get(url).await?;
    let available: Vec<&str> = resolved["available_versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if !available.contains(&version.as_str()) {
        return Err(coded(
            "VERSION_NOT_FOUND",
            format!(
                "no instance offers `{capability}` at {version} (offered: {})",
                if available.is_empty() {
                    "none".to_string()
                } else {
                    available.join(", ")
                }
            ),
        ));
    }
    Ok(())
}

/// A scratch copy of every context the replayed calls used (`replay-{nonce}-{id}`),
/// so their writes never touch the real one.
async fn scratch_contexts(
    connection: &Connection,
    plan: &Plan<'_>,
    records: &[Record],
    nonce: &str,
) -> anyhow::Result<BTreeMap<String, String>> {
    let mut scratch = BTreeMap::new();
    for context_id in records.iter().filter_map(|record| record.context_id.as_ref()) {
        if scratch.contains_key(context_id) {
            continue;
        }
        let copy = format!("replay-{nonce}-{context_id}");
        scratch.insert(context_id.clone(), copy.clone());
        if plan.dry_run {
            continue;
        }
        let client = reqwest::Client::new();
        // What the replayer may read of the real context seeds the copy.
        let fields = match client
            .get(format!("{}/v1/contexts/{}", plan.context, encode(context_id)))
            .bearer_auth(connection.token()?)
            .send()
            .await
        {
            Ok(response) if response.status().is_success() => response
                .json::<Value>()
                .await
                .map(|body| body["fields"].clone())
                .unwrap_or_default(),
            _ => Value::Null,
        };
        let mut body = json!({ "context_id": copy });
        if fields.is_object() {
            body["fields"] = fields;
        }
        let created = client
            .post(format!("{}/v1/contexts", plan.context))
            .bearer_auth(connection.token()?)
            .json(&body)
            .send()
            .await
            .with_context(|| format!("cannot reach the context service at {}", plan.context))?;
        if !created.status().is_success() {
            let status = created.status();
            let answer: Value = created.json().await.unwrap_or_default();
            anyhow::bail!(
                "the scratch context for `{context_id}` was refused ({status}): {}",
                answer["error"]
            );
        }
    }
    Ok(scratch)
}

async fn replay_one(
    connection: &Connection,
    plan: &Plan<'_>,
    record: Record,
    nonce: &str,
    scratch: &BTreeMap<String, String>,
) -> anyhow::Result<Replayed> {
    let version = plan.version_for(&record).map(str::to_string);
    let mut envelope = json!({
        "capability": record.capability,
        "request_id": format!("replay-{nonce}-{}", record.request_id),
        "replay_of": record.request_id,
        "payload": record.input,
    });
    if let Some(version) = &version {
        envelope["capability_version"] = json!(format!("={version}"));
    }
    if let Some(session) = &record.session_id {
        envelope["session_id"] = json!(format!("replay-{nonce}-{session}"));
    }
    if let Some(context) = record.context_id.as_ref().and_then(|context| scratch.get(context)) {
        envelope["context_id"] = json!(context);
    }
    if plan.dry_run {
        outln!("would send: {envelope}");
        return Ok(Replayed {
            record,
            version,
            outcome: Err("not sent (--dry-run)".to_string()),
        });
    }
    let url = format!("{}/v1/invoke", connection.router);
    let response = reqwest::Client::new()
        .post(&url)
        .bearer_auth(connection.token()?)
        .json(&envelope)
        .send()
        .await
        .with_context(|| format!("cannot reach {url}"))?;
    let body: Value = response
        .json()
        .await
        .with_context(|| format!("{url} answered without JSON"))?;
    let outcome = match body["error"].as_object() {
        Some(error) => {
            let code = error.get("code").map(text).unwrap_or_default();
            if code == "VERSION_NOT_FOUND" {
                return Err(coded("VERSION_NOT_FOUND", text(&body["error"]["message"])));
            }
            Err(format!(
                "{code}: {}",
                error.get("message").map(text).unwrap_or_default()
            ))
        }
        None => Ok(body["output"].clone()),
    };
    Ok(Replayed {
        record,
        version,
        outcome,
    })
}

fn report(connection: &Connection, plan: &Plan<'_>, replayed: &[Replayed]) -> anyhow::Result<()> {
    let mut changed = 0;
    let mut out = Vec::new();
    for (index, step) in replayed.iter().enumerate() {
        let record = &step.record;
        let (status, changes) = match (&step.outcome, &record.output) {
            (Ok(now), Some(then)) => {
                let changes = agent_reach_trail::diff::diff(then, now);
                (if changes.is_empty() { "same" } else { "changed" }, changes)
            }
            (Ok(_), None) => ("answered (no recorded output to compare)", Vec::new()),
            (Err(_), _) if plan.dry_run => ("planned", Vec::new()),
            (Err(_), _) => ("failed", Vec::new()),
        };
        if status == "changed" || status == "failed" {
            changed += 1;
        }
        out.push(json!({
            "step": index + 1,
            "request_id": record.request_id,
            "capability": record.capability,
            "recorded_version": record.capability_version,
            "replayed_version": step.version,
            "status": status,
            "error": step.outcome.as_ref().err(),
            "changes": changes,
        }));
        if !connection.json {
            outln!(
                "step {} {}@{} → @{}: {status}{}",
                index + 1,
                record.capability,
                record.capability_version.as_deref().unwrap_or("?"),
                step.version.as_deref().unwrap_or("?"),
                step.outcome
                    .as_ref()
                    .err()
                    .map(|error| format!(" ({error})"))
                    .unwrap_or_default()
            );
            for change in &changes {
                outln!(
                    "    {}: {} → {}",
                    if change.pointer.is_empty() {
                        "(whole output)"
                    } else {
                        &change.pointer
                    },
                    change
                        .recorded
                        .as_ref()
                        .map_or("(absent)".to_string(), Value::to_string),
                    change
                        .replayed
                        .as_ref()
                        .map_or("(absent)".to_string(), Value::to_string)
                );
            }
        }
    }
    if connection.json {
        return print_json(&json!({ "steps": out, "changed": changed, "replayed": replayed.len() }));
    }
    outln!("{} replayed, {changed} changed or failed", replayed.len());
    Ok(())
}

/// `--sample N`: the N newest recorded calls of one capability, replayed at another version.
async fn canary(connection: &Connection, plan: &Plan<'_>, sample: usize) -> anyhow::Result<()> {
    let Some((capability, version)) = plan.pin else {
        return Err(coded("INVALID_ARGUMENT", "--sample needs --capability and --version"));
    };
    let url = format!(
        "{}/v1/trail/inputs?capability={}&limit={sample}",
        connection.router,
        encode(capability)
    );
    let page = connection.get(url).await?;
    let records: Vec<Record> = serde_json::from_value(page["records"].clone()).context("trail records")?;
    let records: Vec<Record> = records
        .into_iter()
        .filter(|record| record.replay_of.is_none())
        .collect();
    if records.is_empty() {
        return Err(coded(
            "NOTHING_TO_REPLAY",
            format!("the trail holds no recorded input of `{capability}`: name it under `trail: {{payloads: [...]}}` in acl.yaml"),
        ));
    }
    check_pinned_version(connection, plan).await?;
    let nonce = format!("{:08x}", rand::random::<u32>());
    let scratch = scratch_contexts(connection, plan, &records, &nonce).await?;
    let mut replayed = Vec::new();
    for record in records {
        replayed.push(replay_one(connection, plan, record, &nonce, &scratch).await?);
    }
    // How the outputs changed, by pointer, across the sample.
    let mut by_pointer: BTreeMap<String, usize> = BTreeMap::new();
    let mut changed = 0;
    let mut failed = 0;
    for step in &replayed {
        match (&step.outcome, &step.record.output) {
            (Ok(now), Some(then)) => {
                let changes = agent_reach_trail::diff::diff(then, now);
                if !changes.is_empty() {
                    changed += 1;
                }
                for change in changes {
                    *by_pointer.entry(change.pointer).or_default() += 1;
                }
            }
            (Err(_), _) if !plan.dry_run => failed += 1,
            _ => {}
        }
    }
    if connection.json {
        return print_json(&json!({
            "capability": capability, "version": version, "replayed": replayed.len(),
            "changed": changed, "failed": failed, "changed_by_pointer": by_pointer,
        }));
    }
    outln!(
        "{capability} at {version}: {} recorded call(s) replayed, {changed} output(s) changed, {failed} failed",
        replayed.len()
    );
    for (pointer, count) in &by_pointer {
        outln!(
            "    {}: changed in {count}",
            if pointer.is_empty() { "(whole output)" } else { pointer }
        );
    }
    Ok(())
}
