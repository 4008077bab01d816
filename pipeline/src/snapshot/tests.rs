//! The snapshot builder's tests.

use super::*;

fn instance(id: &str, version: &str, schema: &str) -> pb::AgentInstance {
    pb::AgentInstance {
        agent_id: id.to_string(),
        name: "a".to_string(),
        endpoint: format!("http://127.0.0.1:1/{id}"),
        protocol: "http".to_string(),
        weight: 1,
        status: "ready".to_string(),
        capabilities: vec![pb::CapabilityDescriptor {
            name: "order.query".to_string(),
            version: version.to_string(),
            input_schema_json: schema.to_string(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn event(revision: i64, kind: pb::watch_event::Kind) -> pb::WatchEvent {
    pb::WatchEvent {
        revision,
        kind: Some(kind),
    }
}

#[test]
fn smooth_wrr_continues_across_rebuilds() {
    use pb::watch_event::Kind;
    let mut builder = SnapshotBuilder::new(Metrics::new().unwrap());
    let mut heavy = instance("h1", "1.0.0", "");
    heavy.weight = 3;
    builder.apply(event(
        1,
        Kind::Snapshot(pb::Snapshot {
            instances: vec![heavy, instance("l1", "1.0.0", "")],
            reset: false,
            splits: Vec::new(),
            more: false,
            ..Default::default()
        }),
    ));
    let first = builder.build();
    let group = first.capabilities["order.query"].versions[0].clone();
    let candidates: Vec<crate::select::Candidate> = group
        .instances
        .iter()
        .enumerate()
        .map(|(index, instance)| crate::select::Candidate {
            index,
            weight: i64::from(instance.weight),
        })
        .collect();
    crate::select::wrr::pick(&group, &candidates);
    let before: HashMap<String, i64> = group
        .instances
        .iter()
        .zip(group.wrr_current.lock().unwrap().iter())
        .map(|(instance, current)| (instance.agent_id.clone(), *current))
        .collect();
    assert!(before.values().any(|current| *current != 0));
    // An unrelated change rebuilds the snapshot; the cycle goes on where it was.
    builder.apply(event(2, Kind::Updated(instance("l1", "1.0.0", ""))));
    let second = builder.build();
    let rebuilt = &second.capabilities["order.query"].versions[0];
    let after: HashMap<String, i64> = rebuilt
        .instances
        .iter()
        .zip(rebuilt.wrr_current.lock().unwrap().iter())
        .map(|(instance, current)| (instance.agent_id.clone(), *current))
        .collect();
    assert_eq!(before, after);
}

#[test]
fn a_reported_inflight_change_alone_updates_in_place() {
    use pb::watch_event::Kind;
    let mut builder = SnapshotBuilder::new(Metrics::new().unwrap());
    let mut loaded = instance("a1", "1.0.0", "");
    loaded.inflight = 3;
    builder.apply(event(
        1,
        Kind::Snapshot(pb::Snapshot {
            instances: vec![loaded.clone(), instance("a2", "1.0.0", "")],
            reset: false,
            splits: Vec::new(),
            more: false,
            ..Default::default()
        }),
    ));
    let snapshot = builder.build();
    let group = &snapshot.capabilities["order.query"].versions[0];
    let state = |id: &str| {
        group
            .instances
            .iter()
            .find(|instance| instance.agent_id == id)
            .unwrap()
            .state
            .clone()
    };
    assert_eq!(state("a1").reported_inflight(), 3, "a snapshot carries the reports");
    assert_eq!(state("a2").reported_inflight(), 0);
    loaded.inflight = 9;
    assert!(
        !builder.apply(event(2, Kind::Updated(loaded.clone()))),
        "only the load moved: no rebuild"
    );
    assert_eq!(state("a1").reported_inflight(), 9, "seen by the live snapshot at once");
    assert_eq!(builder.revision(), 2);
    loaded.status = "busy".to_string();
    loaded.inflight = 10;
    assert!(
        builder.apply(event(3, Kind::Updated(loaded))),
        "a status change rebuilds"
    );
    let rebuilt = builder.build();
    let a1 = rebuilt.capabilities["order.query"].versions[0]
        .instances
        .iter()
        .find(|instance| instance.agent_id == "a1")
        .unwrap()
        .clone();
    assert_eq!((a1.status, a1.state.reported_inflight()), (Status::Busy, 10));
}

#[test]
fn deltas_build_versions_highest_first_and_reuse_state_and_validators() {
    use pb::watch_event::Kind;
    let mut builder = SnapshotBuilder::new(Metrics::new().unwrap());
    let schema = r#"{"type":"object","required":["order_id"]}"#;
    builder.apply(event(
        5,
        Kind::Snapshot(pb::Snapshot {
            instances: vec![instance("a1", "1.0.0", schema), instance("a2", "1.2.0", schema)],
            reset: false,
            splits: Vec::new(),
            more: false,
            ..Default::default()
        }),
    ));
    let first = builder.build();
    assert_eq!(first.revision, 5);
    let capability = &first.capabilities["order.query"];
    assert_eq!(capability.versions[0].version_text, "1.2.0");
    assert_eq!(builder.compiled_schemas(), 1, "one schema text, compiled once");
    let validator = capability.versions[0].validator.clone().unwrap();
    let state = capability.versions[0].instances[0].state.clone();

    builder.apply(event(6, Kind::Added(instance("a3", "1.2.0", schema))));
    let second = builder.build();
    let group = &second.capabilities["order.query"].versions[0];
    assert_eq!(group.instances.len(), 2);
    assert!(Arc::ptr_eq(group.validator.as_ref().unwrap(), &validator));
    assert!(Arc::ptr_eq(&group.instances[0].state, &state));

    builder.apply(event(7, Kind::Removed(pb::InstanceRemoved { agent_id: "a1".into() })));
    let third = builder.build();
    assert_eq!(third.capabilities["order.query"].versions.len(), 1);
    assert_eq!(builder.revision(), 7);
}

#[test]
fn policies_follow_the_watch_and_histories_are_carried_per_version() {
    use pb::watch_event::Kind;
    let mut builder = SnapshotBuilder::new(Metrics::new().unwrap());
    let mut pinned = instance("a1", "1.0.0", "");
    pinned.operator_weight = true;
    builder.apply(event(
        1,
        Kind::Snapshot(pb::Snapshot {
            instances: vec![pinned, instance("a2", "2.0.0", "")],
            policies: vec![pb::CapabilityPolicy {
                capability: "order.query".to_string(),
                policy: "adaptive".to_string(),
                ..Default::default()
            }],
            ..Default::default()
        }),
    ));
    let first = builder.build();
    let capability = &first.capabilities["order.query"];
    assert_eq!(capability.policy, Some(TargetPolicy::Adaptive));
    assert!(capability.versions[1].instances[0].operator_weight);
    let history = capability.versions[1].histories[0].clone();
    history.set_learned(300);

    builder.apply(event(
        2,
        Kind::PolicySet(pb::CapabilityPolicy {
            capability: "order.query".to_string(),
            policy: "plugin:cheapest".to_string(),
            ..Default::default()
        }),
    ));
    builder.apply(event(3, Kind::Added(instance("a3", "1.0.0", ""))));
    let second = builder.build();
    let capability = &second.capabilities["order.query"];
    assert_eq!(capability.policy, Some(TargetPolicy::Plugin("cheapest".to_string())));
    let group = &capability.versions[1];
    assert_eq!(group.histories.len(), group.instances.len());
    let carried = group
        .instances
        .iter()
        .position(|instance| instance.agent_id == "a1")
        .unwrap();
    assert!(
        Arc::ptr_eq(&group.histories[carried], &history),
        "a1's 1.0.0 history is carried"
    );
    assert_eq!(group.histories[carried].learned_permille(), 300);

    assert!(builder.apply(event(
        4,
        Kind::PolicyCleared(pb::PolicyCleared {
            capability: "order.query".to_string()
        })
    )));
    assert_eq!(builder.build().capabilities["order.query"].policy, None);
    // A policy this router cannot read is no policy (and a warning).
    builder.apply(event(
        5,
        Kind::PolicySet(pb::CapabilityPolicy {
            capability: "order.query".to_string(),
            policy: "random".to_string(),
            ..Default::default()
        }),
    ));
    assert_eq!(builder.build().capabilities["order.query"].policy, None);
}
