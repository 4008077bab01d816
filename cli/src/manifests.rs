//! Every `agent-reach` command line in `deploy/` (the Compose file, the
//! Kubernetes manifests) parses with this binary's flags, and every
//! `AGENT_REACH_*` variable they set is one the subcommand reads: a renamed or
//! invented flag fails here, not at `docker compose up` or in a rollout.

use std::path::{Path, PathBuf};

use clap::{CommandFactory, Parser};
use serde::Deserialize;
use serde_yaml::Value;

use crate::Cli;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_sequence()
        .into_iter()
        .flatten()
        .map(|item| item.as_str().expect("command lines are lists of strings").to_string())
        .collect()
}

/// `--flag=value` for each `AGENT_REACH_*` variable, through the flag that
/// reads it; panics on a variable the subcommand does not know.
fn env_as_flags(subcommand: &str, env: &[(String, String)], origin: &str) -> Vec<String> {
    let command = Cli::command();
    let sub = command
        .find_subcommand(subcommand)
        .unwrap_or_else(|| panic!("{origin}: no subcommand `{subcommand}`"));
    env.iter()
        .map(|(name, value)| {
            let arg = sub
                .get_arguments()
                .chain(command.get_arguments())
                .find(|arg| arg.get_env().is_some_and(|known| known == name.as_str()))
                .unwrap_or_else(|| panic!("{origin}: `agent-reach {subcommand}` reads no variable {name}"));
            let long = arg.get_long().expect("every flag with a variable has a long name");
            format!("--{long}={value}")
        })
        .collect()
}

fn assert_parses(args: &[String], env: &[(String, String)], origin: &str) {
    let subcommand = args.first().unwrap_or_else(|| panic!("{origin}: empty command line"));
    let mut line = vec!["agent-reach".to_string()];
    line.extend(args.iter().cloned());
    line.extend(env_as_flags(subcommand, env, origin));
    if let Err(error) = Cli::try_parse_from(&line) {
        panic!("{origin}: `{}` does not parse:\n{error}", line.join(" "));
    }
}

fn no_agent_reach_environment() {
    // The variables would take part in the parse and hide a missing flag.
    let set: Vec<String> = std::env::vars()
        .map(|(name, _)| name)
        .filter(|name| name.starts_with("AGENT_REACH_"))
        .collect();
    assert!(set.is_empty(), "unset {set:?} to run this test");
}

#[test]
fn compose_commands_parse() {
    no_agent_reach_environment();
    let path = deploy_dir().join("compose/docker-compose.yml");
    let mut file: Value = serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    file.apply_merge().unwrap();
    let mut checked = 0;
    for (name, service) in file["services"].as_mapping().unwrap() {
        let name = name.as_str().unwrap();
        if service["build"]["target"].as_str() != Some("agent-reach") {
            continue;
        }
        let env: Vec<(String, String)> = service["environment"]
            .as_mapping()
            .into_iter()
            .flatten()
            .map(|(key, value)| (key.as_str().unwrap().to_string(), value.as_str().unwrap().to_string()))
            .collect();
        // The image's health check reads AGENT_REACH_HEALTHCHECK_URL, not the service.
        let (health, service_env): (Vec<_>, Vec<_>) = env
            .into_iter()
            .partition(|(key, _)| key == "AGENT_REACH_HEALTHCHECK_URL");
        let origin = format!("{} service {name}", path.display());
        assert_parses(&strings(&service["command"]), &service_env, &origin);
        for (_, url) in health {
            assert_parses(&["healthcheck".to_string(), url], &[], &origin);
        }
        checked += 1;
    }
    assert_eq!(checked, 3, "registry, router and context");
}

/// The Redis Cluster override (`docker-compose.redis-cluster.yml`) replaces
/// the router's and the context service's commands; each parses with the
/// environment the base file gives that service.
#[test]
fn compose_redis_cluster_override_commands_parse() {
    no_agent_reach_environment();
    let read = |name: &str| {
        let path = deploy_dir().join("compose").join(name);
        let mut file: Value = serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        file.apply_merge().unwrap();
        (path, file)
    };
    let (_, base) = read("docker-compose.yml");
    let (path, overlay) = read("docker-compose.redis-cluster.yml");
    let mut checked = 0;
    for name in ["router", "context"] {
        let command = strings(&overlay["services"][name]["command"]);
        assert!(
            command.iter().any(|arg| arg.starts_with("--redis=redis+cluster://")),
            "{} service {name}: {command:?}",
            path.display()
        );
        let env: Vec<(String, String)> = base["services"][name]["environment"]
            .as_mapping()
            .into_iter()
            .flatten()
            .map(|(key, value)| (key.as_str().unwrap().to_string(), value.as_str().unwrap().to_string()))
            .filter(|(key, _)| key != "AGENT_REACH_HEALTHCHECK_URL")
            .collect();
        assert_parses(&command, &env, &format!("{} service {name}", path.display()));
        checked += 1;
    }
    assert_eq!(checked, 2);
}

/// The `agent-reach` containers of one YAML document (a Deployment or a patch of one).
fn agent_reach_containers(doc: &Value) -> Vec<&Value> {
    let deployment = doc["metadata"]["name"].as_str().unwrap_or_default();
    doc["spec"]["template"]["spec"]["containers"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter(|container| {
            container["image"].as_str() == Some("agent-reach")
                || deployment == format!("agent-reach-{}", container["name"].as_str().unwrap_or_default())
        })
        .collect()
}

fn yaml_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            yaml_files(&path, found);
        } else if path.extension().is_some_and(|extension| extension == "yaml") {
            found.push(path);
        }
    }
}

#[test]
fn kubernetes_commands_and_variables_parse() {
    no_agent_reach_environment();
    let mut files = Vec::new();
    yaml_files(&deploy_dir().join("k8s"), &mut files);
    let mut checked = 0;
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        for document in serde_yaml::Deserializer::from_str(&text) {
            let doc = Value::deserialize(document).unwrap();
            for container in agent_reach_containers(&doc) {
                let subcommand = container["name"].as_str().unwrap().to_string();
                let origin = format!("{} container {subcommand}", path.display());
                let env: Vec<(String, String)> = container["env"]
                    .as_sequence()
                    .into_iter()
                    .flatten()
                    .filter(|entry| entry["$patch"].as_str() != Some("delete"))
                    .map(|entry| {
                        let name = entry["name"].as_str().unwrap().to_string();
                        let value = entry["value"]
                            .as_str()
                            .unwrap_or_else(|| panic!("{origin}: {name} has no value"));
                        (name, value.to_string())
                    })
                    .collect();
                match container["args"].as_sequence() {
                    Some(_) => assert_parses(&strings(&container["args"]), &env, &origin),
                    // A patch: only its variables, checked against the subcommand it patches.
                    None => drop(env_as_flags(&subcommand, &env, &origin)),
                }
                checked += 1;
            }
        }
    }
    assert!(
        checked >= 6,
        "the base's three services and the production patches; found {checked}"
    );
}

#[test]
fn a_wrong_flag_or_variable_is_caught() {
    let caught = |args: Vec<String>, env: Vec<(String, String)>| {
        std::panic::catch_unwind(|| assert_parses(&args, &env, "test")).is_err()
    };
    let ok = vec!["router".to_string(), "--listen=0.0.0.0:7500".to_string()];
    assert!(!caught(ok.clone(), Vec::new()));
    assert!(caught(
        vec!["router".to_string(), "--listen-on=0.0.0.0:7500".to_string()],
        Vec::new()
    ));
    assert!(caught(
        vec!["router".to_string(), "--listen=nowhere".to_string()],
        Vec::new()
    ));
    assert!(caught(
        ok,
        vec![("AGENT_REACH_ETCD".to_string(), "http://etcd:2379".to_string())]
    ));
}

#[test]
fn every_deployed_policy_is_valid() {
    for path in ["compose/acl/acl.yaml", "k8s/base/acl.yaml"] {
        let path = deploy_dir().join(path);
        if let Err(error) = agent_reach_access::Acl::load(&path) {
            panic!("{error}");
        }
    }
}
