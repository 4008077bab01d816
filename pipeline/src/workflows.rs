//! The workflows this router knows (DESIGN §9), as the registry's `Watch`
//! brings them: each definition checked and its schemas compiled once,
//! when it arrives or changes (never on a call), and kept in the snapshot
//! beside the capabilities, so a call to a workflow's name is found with
//! the same lookup. How a run executes is not the pipeline's: the router
//! hands a workflow's calls to the [`Runner`] its slow path installs
//! (`RouterService::serve_workflows`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use agent_reach_proto::registry as pb;
use agent_reach_workflows::Workflow;

use crate::call::Call;
use crate::outcome::{Failure, Success};
use crate::snapshot::Described;

/// A workflow as routing sees it: checked, and described as the protocol
/// doors describe a capability (its input and output schemas).
pub struct RoutedWorkflow {
    pub workflow: Arc<Workflow>,
    pub described: Arc<Described>,
    /// The definition's text as the registry sent it (what changes rebuild).
    text: String,
}

/// What runs a workflow's call: a run started for `call`'s caller and input
/// (admitted already: ACL, limits, input schema, deadline, `deadline_ms`),
/// answered whole when it ends by the deadline; otherwise a [`Success`]
/// whose `run` says which run goes on (`/v1/invoke` answers it `202`).
pub trait Runner: Send + Sync {
    fn run<'a>(
        &'a self,
        call: &'a Call,
        workflow: Arc<Workflow>,
        deadline_ms: u64,
    ) -> futures::future::BoxFuture<'a, Result<Success, Failure>>;
}

/// The raw workflows of the Watch, and their checked forms (kept across
/// rebuilds while their text is unchanged).
#[derive(Default)]
pub(crate) struct WorkflowBook {
    raw: BTreeMap<String, pb::Workflow>,
    built: HashMap<String, Arc<RoutedWorkflow>>,
}

impl WorkflowBook {
    /// A snapshot's workflows replace every one held.
    pub(crate) fn replace(&mut self, workflows: Vec<pb::Workflow>) {
        self.raw = workflows
            .into_iter()
            .map(|workflow| (workflow.name.clone(), workflow))
            .collect();
    }

    pub(crate) fn set(&mut self, workflow: pb::Workflow) -> bool {
        self.raw.insert(workflow.name.clone(), workflow);
        true
    }

    pub(crate) fn remove(&mut self, name: &str) -> bool {
        self.raw.remove(name).is_some()
    }

    /// Every workflow, checked (reused when its text is unchanged); one that
    /// no longer checks (a newer registry's form) is left out and logged.
    pub(crate) fn build(&mut self) -> ahash::AHashMap<String, Arc<RoutedWorkflow>> {
        let mut built = HashMap::with_capacity(self.raw.len());
        for (name, raw) in &self.raw {
            if let Some(known) = self.built.get(name).filter(|known| known.text == raw.definition_json) {
                built.insert(name.clone(), known.clone());
                continue;
            }
            let checked = serde_json::from_str(&raw.definition_json)
                .map_err(|error| error.to_string())
                .and_then(|definition| Workflow::from_stored(name, definition).map_err(|problem| problem.to_string()));
            match checked {
                Ok(workflow) => {
                    let output_schema = workflow
                        .definition
                        .output_schema
                        .as_ref()
                        .map(ToString::to_string)
                        .unwrap_or_default();
                    let described = Arc::new(Described {
                        description: workflow.description.clone(),
                        input_schema: workflow.definition.input_schema.to_string(),
                        output_schema,
                        preemptible: false,
                    });
                    built.insert(
                        name.clone(),
                        Arc::new(RoutedWorkflow {
                            workflow: Arc::new(workflow),
                            described,
                            text: raw.definition_json.clone(),
                        }),
                    );
                }
                Err(error) => tracing::warn!(
                    message = "Workflow does not check on this router; it is not callable here.",
                    workflow = %name, %error
                ),
            }
        }
        self.built = built;
        self.built
            .iter()
            .map(|(name, routed)| (name.clone(), routed.clone()))
            .collect()
    }
}
