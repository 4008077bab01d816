//! Workflows in the registry (DESIGN §9, docs/design.md §3.14.1): a
//! definition is checked here, once, against the capabilities registered
//! now (every expression parses, every referenced step exists, the steps
//! are a DAG, every input mapping can satisfy its capability's input
//! schema), then stored under `/agent-reach/v1/{tenant}/workflows/{name}`
//! without a lease and published to routers on the `Watch`, as splits are.
//! A refused definition writes nothing.
//!
//! Workflows share the capabilities' name space: a workflow named like a
//! registered capability is refused (409 `NAME_TAKEN`), and so is an agent
//! registering a capability named like a workflow (`service.rs`).
//!
//! Who may register, replace or remove one: callers listed under
//! `operators`, or a caller a `providers` entry allows the workflow's name.

use std::sync::Arc;

use agent_reach_access::Caller;
use agent_reach_workflows::{definition, Format, Problem};

use crate::catalog::Catalog;
use crate::error::{Code, RegistryError};
use crate::model::StoredWorkflow;
use crate::service::{now_ms, RegistryService, CATALOG_WAIT};

/// A workflow after its write: what the store holds and the write's revision.
pub struct WorkflowWritten {
    pub workflow: StoredWorkflow,
    pub revision: i64,
}

/// `INVALID_WORKFLOW` with `details: {reason, step, pointer}`.
fn invalid(problem: Problem) -> RegistryError {
    RegistryError::new(Code::InvalidWorkflow, problem.to_string()).with_details(problem.details())
}

/// The catalog as the workflow check asks it.
struct Offers<'a>(&'a Catalog);

impl agent_reach_workflows::Catalog for Offers<'_> {
    fn offer(&self, name: &str, requirement: Option<&semver::VersionReq>) -> agent_reach_workflows::Offer {
        self.0.offer(name, requirement)
    }
}

impl RegistryService {
    /// May `caller` register (or remove) workflow `name`? `Some(name)` to record who did.
    fn may_register_workflow(&self, caller: &Caller, name: &str) -> Result<Option<String>, RegistryError> {
        match caller {
            Caller::Unauthenticated => Ok(None),
            Caller::Agent { name: who, .. } => {
                let acl = self.acl().current();
                if acl.is_operator(who) || acl.may_provide(who, name) {
                    return Ok(Some(who.to_string()));
                }
                Err(RegistryError::new(
                    Code::Forbidden,
                    format!(
                        "`{who}` may not register workflow `{name}`: only callers under `operators`, or one a \
                         `providers` rule in acl.yaml allows `{name}`, may"
                    ),
                ))
            }
        }
    }

    /// Checks `body` (JSON or YAML, by `content_type` or its first
    /// character) as workflow `name` and stores it, replacing any earlier
    /// definition of that name (the last write wins; runs already started
    /// keep the definition they started with).
    #[tracing::instrument(skip_all, fields(workflow = %name))]
    pub async fn put_workflow(
        &self,
        caller: &Caller,
        name: &str,
        body: &[u8],
        content_type: Option<&str>,
    ) -> Result<WorkflowWritten, RegistryError> {
        let updated_by = self.may_register_workflow(caller, name)?;
        let written = definition::parse(body, Format::of(content_type, body)).map_err(invalid)?;
        let workflow = agent_reach_workflows::check(name, written, Some(&Offers(self.catalog()))).map_err(invalid)?;
        if self.catalog().has_capability(name) {
            return Err(RegistryError::new(
                Code::NameTaken,
                format!("`{name}` is a registered capability; workflows and capabilities share one name space"),
            )
            .with_details(serde_json::json!({ "name": name, "taken_by": "capability" })));
        }
        let definition = serde_json::to_value(&workflow.definition)
            .map_err(|error| RegistryError::new(Code::Internal, format!("cannot encode the workflow: {error}")))?;
        let stored = StoredWorkflow {
            name: name.to_string(),
            version: workflow.version.to_string(),
            description: workflow.description.clone(),
            definition,
            updated_at_ms: now_ms(),
            updated_by,
        };
        let value = serde_json::to_vec(&stored)
            .map_err(|error| RegistryError::new(Code::Internal, format!("cannot encode the workflow: {error}")))?;
        let put = crate::store::Put {
            key: self.keys().workflow(name),
            value,
            lease: 0,
        };
        let revision = self.store().txn(Vec::new(), vec![put], Vec::new()).await?;
        self.catalog().wait_for(revision, CATALOG_WAIT).await;
        tracing::info!(
            message = "Workflow registered.",
            version = %stored.version,
            steps = workflow.steps.len(),
            by = stored.updated_by.as_deref().unwrap_or(""),
            revision
        );
        Ok(WorkflowWritten {
            workflow: stored,
            revision,
        })
    }

    /// Removes workflow `name`; removing one that is not there succeeds.
    /// Runs already started finish with the definition they started with.
    #[tracing::instrument(skip_all, fields(workflow = %name))]
    pub async fn delete_workflow(&self, caller: &Caller, name: &str) -> Result<(), RegistryError> {
        self.may_register_workflow(caller, name)?;
        let revision = self
            .store()
            .txn(Vec::new(), Vec::new(), vec![self.keys().workflow(name)])
            .await?;
        self.catalog().wait_for(revision, CATALOG_WAIT).await;
        tracing::info!(message = "Workflow removed.", revision);
        Ok(())
    }

    /// Workflow `name` (any valid token may read it).
    pub fn workflow(&self, name: &str) -> Result<Arc<StoredWorkflow>, RegistryError> {
        self.catalog().workflow(name).ok_or_else(|| {
            RegistryError::field(
                Code::WorkflowNotFound,
                "name",
                format!("no workflow `{name}` is registered (agent-reach workflows ls)"),
            )
        })
    }

    /// Every workflow, by name.
    pub fn workflows(&self) -> Vec<Arc<StoredWorkflow>> {
        self.catalog().workflows().0
    }
}

/// The workflow's HTTP form.
pub fn workflow_to_wire(workflow: &StoredWorkflow, revision: Option<i64>) -> agent_reach_proto::http::WorkflowView {
    agent_reach_proto::http::WorkflowView {
        name: workflow.name.clone(),
        version: workflow.version.clone(),
        description: workflow.description.clone(),
        definition: workflow.definition.clone(),
        updated_at_ms: workflow.updated_at_ms,
        updated_by: workflow.updated_by.clone(),
        revision,
    }
}
