//! The SDK contract (`sdk/contract/driver.py`, the same for every SDK) with
//! the Rust SDK's conformance agent (`contract-agent`): the driver starts the
//! real stack and two agents and checks every behaviour. It runs with the
//! Python of the repository's `.venv` (`scripts/setup.sh` makes it), or
//! `$AGENT_REACH_PYTHON`, and the `agent-reach` binary of the target
//! directory (`cargo test --workspace` builds it).

use std::path::PathBuf;
use std::process::Command;

#[test]
fn the_rust_sdk_keeps_the_sdk_contract() {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let python = std::env::var_os("AGENT_REACH_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo.join(".venv/bin/python"));
    assert!(
        python.is_file(),
        "{} is missing: run scripts/setup.sh (or set AGENT_REACH_PYTHON)",
        python.display()
    );
    let output = Command::new(&python)
        .arg(repo.join("sdk/contract/driver.py"))
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_contract-agent"))
        .output()
        .expect("the contract driver runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the contract driver failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("contract: every behaviour held"), "{stdout}");
}
