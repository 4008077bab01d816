//! The planner on records alone: each shape of run from start to end.

use super::*;
use agent_reach_proto::Priority;

fn workflow(definition: Value) -> Workflow {
    Workflow::from_stored("test.flow", definition).unwrap()
}

fn spec(input: Value) -> RunSpec {
    RunSpec {
        workflow: "test.flow".to_string(),
        version: "1.0.0".to_string(),
        definition: Value::Null,
        input,
        caller: "tester".to_string(),
        request_id: "r-1".to_string(),
        session_id: None,
        context_id: None,
        priority: Priority::Normal,
        trace_id: None,
        created_at_ms: 0,
        has_callback: Some(false),
    }
}

/// The calls of a plan, as (field, attempt, payload).
fn calls(actions: &[Action]) -> Vec<(String, u32, Value)> {
    actions
        .iter()
        .filter_map(|action| match action {
            Action::Call(call) => Some((call.field.clone(), call.attempt, call.payload.clone())),
            _ => None,
        })
        .collect()
}

fn finished(actions: &[Action]) -> Option<&End> {
    actions.iter().find_map(|action| match action {
        Action::Finish(end) => Some(end),
        _ => None,
    })
}

/// The submitted call `field` ended as `status` (its task `t_{field}`).
fn end(records: &mut Records, field: &str, status: ItemStatus, output: Value, at: u64) {
    let call = records
        .entry(field)
        .cloned()
        .unwrap_or_else(|| panic!("no call {field}"));
    let error = (status == ItemStatus::Failed)
        .then(|| json!({"code": "AGENT_ERROR", "message": "no", "details": {"agent_code": "BUSY"}}));
    records.set_entry(
        field,
        ItemRecord {
            status,
            task_id: format!("t_{field}"),
            finished_at_ms: Some(at),
            output: (status == ItemStatus::Succeeded).then_some(output),
            error,
            ..call
        },
    );
}

#[test]
fn a_linear_run_feeds_each_step_the_last_ones_output() {
    let workflow = workflow(json!({
        "version": "1.0.0", "input_schema": {"type": "object"},
        "steps": [
            {"id": "a", "capability": "x.a", "input": {"q": "${input.q}"}},
            {"id": "b", "capability": "x.b", "input": {"n": "${steps.a.output.n}", "text": "n=${steps.a.output.n}"}}
        ],
        "output": {"b": "${steps.b.output}", "a_status": "${steps.a.status}"}
    }));
    let spec = spec(json!({"q": "go"}));
    let mut records = Records::default();
    let first = plan(&workflow, &spec, &mut records, 10);
    assert!(matches!(first[0], Action::Start { step: 0, .. }), "{first:?}");
    assert_eq!(calls(&first), [("i:a:0".to_string(), 1, json!({"q": "go"}))]);
    assert!(
        calls(&plan(&workflow, &spec, &mut records, 11)).is_empty(),
        "a call in flight is not made again"
    );
    end(&mut records, "i:a:0", ItemStatus::Succeeded, json!({"n": 7}), 20);
    let second = plan(&workflow, &spec, &mut records, 21);
    assert_eq!(
        calls(&second),
        [("i:b:0".to_string(), 1, json!({"n": 7, "text": "n=7"}))]
    );
    end(&mut records, "i:b:0", ItemStatus::Succeeded, json!("done"), 30);
    let last = plan(&workflow, &spec, &mut records, 31);
    assert_eq!(
        finished(&last),
        Some(&End::Succeeded(json!({"b": "done", "a_status": "succeeded"})))
    );
}

#[test]
fn a_fan_out_keeps_max_parallel_and_the_fan_in_gets_every_output_in_order() {
    let workflow = workflow(json!({
        "version": "1.0.0", "input_schema": {},
        "steps": [
            {"id": "each", "capability": "x.each", "for_each": "${input.skus}", "max_parallel": 2,
             "input": {"sku": "${item}", "at": "${index}"}},
            {"id": "sum", "capability": "x.sum", "input": {"all": "${steps.each.output}"}}
        ],
        "output": "${steps.sum.output}"
    }));
    let spec = spec(json!({"skus": ["a", "b", "c"]}));
    let mut records = Records::default();
    let first = plan(&workflow, &spec, &mut records, 0);
    assert_eq!(
        calls(&first),
        [
            ("i:each:0".to_string(), 1, json!({"sku": "a", "at": 0})),
            ("i:each:1".to_string(), 1, json!({"sku": "b", "at": 1}))
        ]
    );
    end(&mut records, "i:each:1", ItemStatus::Succeeded, json!("B"), 5);
    let second = plan(&workflow, &spec, &mut records, 6);
    assert_eq!(
        calls(&second),
        [("i:each:2".to_string(), 1, json!({"sku": "c", "at": 2}))]
    );
    end(&mut records, "i:each:0", ItemStatus::Succeeded, json!("A"), 7);
    end(&mut records, "i:each:2", ItemStatus::Succeeded, json!("C"), 8);
    let third = plan(&workflow, &spec, &mut records, 9);
    assert_eq!(
        calls(&third),
        [("i:sum:0".to_string(), 1, json!({"all": ["A", "B", "C"]}))]
    );
    // An empty array: the step succeeds at once with [].
    let mut empty = Records::default();
    let plan_empty = plan(&workflow, &self::spec(json!({"skus": []})), &mut empty, 0);
    assert_eq!(calls(&plan_empty), [("i:sum:0".to_string(), 1, json!({"all": []}))]);
}

#[test]
fn when_skips_a_step_and_its_dependents_still_run() {
    let workflow = workflow(json!({
        "version": "1.0.0", "input_schema": {},
        "steps": [
            {"id": "check", "capability": "x.c", "input": {}},
            {"id": "express", "capability": "x.e", "when": "${steps.check.output.fast == true}", "input": {}},
            {"id": "slow", "capability": "x.s", "when": "${steps.check.output.fast != true}", "input": {}},
            {"id": "reply", "capability": "x.r", "depends_on": ["express", "slow"],
             "input": {"express": "${steps.express.output}", "skipped": "${steps.express.error.code}"}}
        ],
        "output": {"reply": "${steps.reply.output}"}
    }));
    let spec = spec(json!({}));
    let mut records = Records::default();
    plan(&workflow, &spec, &mut records, 0);
    end(
        &mut records,
        "i:check:0",
        ItemStatus::Succeeded,
        json!({"fast": false}),
        1,
    );
    let second = plan(&workflow, &spec, &mut records, 2);
    assert!(second.contains(&Action::Start {
        step: 1,
        record: StepRecord {
            started_at_ms: 2,
            items: None,
            skipped: true,
            error: None
        }
    }));
    assert_eq!(calls(&second), [("i:slow:0".to_string(), 1, json!({}))]);
    end(&mut records, "i:slow:0", ItemStatus::Succeeded, json!("s"), 3);
    let third = plan(&workflow, &spec, &mut records, 4);
    assert_eq!(
        calls(&third),
        [(
            "i:reply:0".to_string(),
            1,
            json!({"express": null, "skipped": "SKIPPED"})
        )]
    );
    assert_eq!(standing(&workflow, &records, 1), Standing::Skipped);
}

#[test]
fn a_failing_step_is_retried_after_its_backoff_then_compensated_then_the_run_fails() {
    let workflow = workflow(json!({
        "version": "1.0.0", "input_schema": {},
        "steps": [
            {"id": "charge", "capability": "x.pay", "input": {"id": "${input.id}"},
             "retry": {"max_attempts": 2, "backoff_ms": 100, "codes": ["BUSY"]},
             "on_failure": {"compensate": {"capability": "x.refund", "input": {"id": "${input.id}", "why": "${steps.charge.error.code}"}}}},
            {"id": "side", "capability": "x.side", "input": {}},
            {"id": "after", "capability": "x.after", "input": {"c": "${steps.charge.output}"}}
        ],
        "output": {}
    }));
    let spec = spec(json!({"id": 9}));
    let mut records = Records::default();
    let first = plan(&workflow, &spec, &mut records, 0);
    assert_eq!(calls(&first).len(), 2, "charge and side start at once");
    // The engine records each call's task once submitted.
    if let Some(side) = records.items.get_mut("i:side:0") {
        side.task_id = "t_side".to_string();
    }
    end(&mut records, "i:charge:0", ItemStatus::Failed, Value::Null, 50);
    let waiting = plan(&workflow, &spec, &mut records, 60);
    assert!(calls(&waiting).is_empty());
    assert!(waiting.contains(&Action::WakeAt(150)), "{waiting:?}");
    let retried = plan(&workflow, &spec, &mut records, 150);
    assert_eq!(calls(&retried), [("i:charge:0".to_string(), 2, json!({"id": 9}))]);
    end(&mut records, "i:charge:0", ItemStatus::Failed, Value::Null, 200);
    // Past its retries: the compensation is called, `side` (in flight) canceled, no end yet.
    let failing = plan(&workflow, &spec, &mut records, 201);
    assert_eq!(
        calls(&failing),
        [("c:charge".to_string(), 1, json!({"id": 9, "why": "AGENT_ERROR"}))]
    );
    assert!(
        failing.contains(&Action::Cancel(vec!["t_side".to_string()])),
        "{failing:?}"
    );
    assert_eq!(finished(&failing), None);
    assert!(
        !records.items.contains_key("i:after:0"),
        "nothing after a failed step starts"
    );
    end(
        &mut records,
        "c:charge",
        ItemStatus::Succeeded,
        json!({"refunded": true}),
        300,
    );
    let last = plan(&workflow, &spec, &mut records, 301);
    let Some(End::Failed(error)) = finished(&last) else {
        panic!("{last:?}");
    };
    assert_eq!(error["code"], "STEP_FAILED");
    assert_eq!(error["details"]["step"], "charge");
    assert_eq!(error["details"]["error"]["code"], "AGENT_ERROR");
    assert_eq!(error["details"]["compensation"]["status"], "succeeded");
    assert_eq!(error["details"]["compensation"]["output"], json!({"refunded": true}));
}

#[test]
fn continue_goes_on_and_codes_not_listed_are_not_retried() {
    let workflow = workflow(json!({
        "version": "1.0.0", "input_schema": {},
        "steps": [
            {"id": "maybe", "capability": "x.m", "input": {}, "on_failure": "continue",
             "retry": {"max_attempts": 3, "codes": ["DEADLINE_EXCEEDED"]}},
            {"id": "next", "capability": "x.n", "input": {"prev": "${steps.maybe.output}", "status": "${steps.maybe.status}"}}
        ],
        "output": "${steps.next.output}"
    }));
    let spec = spec(json!({}));
    let mut records = Records::default();
    plan(&workflow, &spec, &mut records, 0);
    end(&mut records, "i:maybe:0", ItemStatus::Failed, Value::Null, 1);
    let second = plan(&workflow, &spec, &mut records, 2);
    assert_eq!(
        calls(&second),
        [("i:next:0".to_string(), 1, json!({"prev": null, "status": "failed"}))]
    );
}

#[test]
fn a_for_each_that_is_not_an_array_fails_the_step_and_a_bad_output_fails_the_run() {
    let workflow_one = workflow(json!({
        "version": "1.0.0", "input_schema": {},
        "steps": [{"id": "each", "capability": "x.e", "for_each": "${input.list}", "input": {}}],
        "output": {}
    }));
    let mut records = Records::default();
    let actions = plan(&workflow_one, &spec(json!({"list": "abc"})), &mut records, 0);
    let Some(End::Failed(error)) = finished(&actions) else {
        panic!("{actions:?}");
    };
    assert_eq!(error["details"]["error"]["code"], "INVALID_FOR_EACH");

    let workflow_two = workflow(json!({
        "version": "1.0.0", "input_schema": {}, "output_schema": {"type": "object", "required": ["x"]},
        "steps": [{"id": "a", "capability": "x.a", "input": {}}],
        "output": {"y": "${steps.a.output}"}
    }));
    let mut records = Records::default();
    plan(&workflow_two, &spec(json!({})), &mut records, 0);
    end(&mut records, "i:a:0", ItemStatus::Succeeded, json!(1), 1);
    let actions = plan(&workflow_two, &spec(json!({})), &mut records, 2);
    let Some(End::Failed(error)) = finished(&actions) else {
        panic!("{actions:?}");
    };
    assert_eq!(error["code"], "OUTPUT_SCHEMA_MISMATCH");
}

#[test]
fn records_read_back_from_entries() {
    let record = ItemRecord {
        attempt: 1,
        status: ItemStatus::Submitted,
        task_id: "t_1".to_string(),
        submitted_at_ms: 1,
        finished_at_ms: None,
        agent_id: None,
        capability_version: None,
        output: None,
        error: None,
    };
    let entries = [
        ("s:a".to_string(), r#"{"started_at_ms":1,"items":2}"#.to_string()),
        ("i:a:0".to_string(), serde_json::to_string(&record).unwrap()),
        ("c:a".to_string(), serde_json::to_string(&record).unwrap()),
        ("i:a:1".to_string(), "not json".to_string()),
    ];
    let records = Records::from_entries(entries.iter().map(|(field, json)| (field, json)));
    assert_eq!(records.steps["a"].items, Some(2));
    assert_eq!(records.entry("i:a:0"), Some(&record));
    assert_eq!(records.entry("c:a"), Some(&record));
    assert_eq!(records.items.len(), 1, "the unreadable entry is left out");
    assert_eq!(records.in_flight().len(), 2);
}
