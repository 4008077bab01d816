//! The benches' smoke runs stay wired: every bench of the README's table
//! takes `--smoke`, and `scripts/test.sh` runs each row's command with it.
//! (The smoke runs themselves are `scripts/test.sh`'s bench section, tens of
//! seconds with real etcd, Redis, HAProxy, nginx and wrk; this test also makes
//! `cargo test` build the bench binaries that section runs.)

use std::path::Path;
use std::process::Command;

/// Every bench binary of the README's table, and where cargo built it.
const BENCHES: &[(&str, &str)] = &[
    ("registry-bench", env!("CARGO_BIN_EXE_registry-bench")),
    ("router-bench", env!("CARGO_BIN_EXE_router-bench")),
    ("routing-bench", env!("CARGO_BIN_EXE_routing-bench")),
    ("context-bench", env!("CARGO_BIN_EXE_context-bench")),
    ("protocols-bench", env!("CARGO_BIN_EXE_protocols-bench")),
    ("tasks-bench", env!("CARGO_BIN_EXE_tasks-bench")),
    ("tenants-bench", env!("CARGO_BIN_EXE_tenants-bench")),
    ("workflows-bench", env!("CARGO_BIN_EXE_workflows-bench")),
];

fn repository_file(path: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    std::fs::read_to_string(root.join(path)).unwrap_or_else(|error| panic!("reading {path}: {error}"))
}

/// The README's bench table: each row's bench and the flags of its command
/// (`| router-bench --tls | ... | `router-bench -- --tls` |` gives
/// `("router-bench", "--tls")`; sizes such as `--agents 10000` are left out:
/// a smoke run sets its own).
fn readme_rows() -> Vec<(String, String)> {
    let readme = repository_file("README.md");
    let table = readme
        .split("| bench | compares (target) | NAME -- ARGS |")
        .nth(1)
        .expect("the README's bench table");
    table
        .lines()
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        // The TypeScript SDK's bench is npm's (its smoke: `npm run bench -- --smoke`, below).
        .filter(|row| !row.contains("`cd sdk/typescript && npm run bench`"))
        .map(|row| {
            let command = row.rsplit('`').nth(1).expect("a command in backticks");
            let mut words = command.split_whitespace();
            let bench = words.next().expect("a bench name").to_string();
            let modes: Vec<&str> = words
                .filter(|word| {
                    matches!(*word, "--tls" | "--tracing" | "--trail" | "--chains") || word.starts_with("--policy=")
                })
                .collect();
            (bench, modes.join(" "))
        })
        .collect()
}

#[test]
fn every_bench_of_the_readme_takes_smoke_and_ci_runs_each_row() {
    let rows = readme_rows();
    let mut named: Vec<&str> = rows.iter().map(|(bench, _)| bench.as_str()).collect();
    named.dedup();
    let built: Vec<&str> = BENCHES.iter().map(|(name, _)| *name).collect();
    assert_eq!(
        named, built,
        "the README's table and this test name the same benches, in order"
    );

    for (name, binary) in BENCHES {
        let help = Command::new(binary).arg("--help").output().expect("running --help");
        let text = String::from_utf8_lossy(&help.stdout);
        assert!(help.status.success(), "{name} --help failed: {help:?}");
        assert!(text.contains("--smoke"), "{name} has no --smoke:\n{text}");
    }

    let test_sh = repository_file("scripts/test.sh");
    let section = test_sh
        .split("# === Bench smoke")
        .nth(1)
        .and_then(|rest| rest.split("# === end of bench smoke ===").next())
        .expect("scripts/test.sh's bench smoke section");
    for (bench, modes) in &rows {
        let smoke = format!("\"{bench}{}{modes}\"", if modes.is_empty() { "" } else { " " });
        assert!(section.contains(&smoke), "scripts/test.sh does not smoke {smoke}");
    }
    // The README's TypeScript row, and its smoke in the same section.
    assert!(repository_file("README.md").contains("`cd sdk/typescript && npm run bench`"));
    assert!(
        section.contains("npm run --silent bench -- --smoke"),
        "scripts/test.sh does not smoke the TypeScript SDK's bench"
    );
    assert!(repository_file("sdk/typescript/bench/bench.ts").contains("smoke: { type: \"boolean\""));
}
