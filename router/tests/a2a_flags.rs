//! The A2A flags are checked at start: `--a2a-tasks always` makes every A2A
//! message a durable task, so a router without the task store refuses it
//! rather than starting and answering Messages (sdk/python/tests/test_a2a_tasks.py
//! drives the mode itself).

use clap::Parser;

#[derive(clap::Parser)]
struct Flags {
    #[command(flatten)]
    router: agent_reach_router::RouterArgs,
}

fn problems(extra: &[&str]) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("assertion.pem");
    std::fs::write(&key, "unused: the flags are only validated").unwrap();
    let mut argv = vec!["router", "--insecure-no-auth", "--assertion-key", key.to_str().unwrap()];
    argv.extend_from_slice(extra);
    match Flags::parse_from(argv).router.validate() {
        Ok(_) => Vec::new(),
        Err(problems) => problems,
    }
}

#[test]
fn every_message_a_task_needs_the_task_store() {
    let refused = problems(&["--a2a-tasks", "always"]);
    assert!(
        refused
            .iter()
            .any(|problem| problem.contains("--a2a-tasks always") && problem.contains("--redis")),
        "{refused:?}"
    );
    assert!(
        problems(&["--a2a-tasks", "when-asked"])
            .iter()
            .all(|problem| !problem.contains("--a2a-tasks")),
        "the default needs nothing"
    );
    let unknown = Flags::try_parse_from(["router", "--a2a-tasks", "sometimes"]);
    assert!(unknown.is_err(), "an unknown value is refused by the parser");
}
