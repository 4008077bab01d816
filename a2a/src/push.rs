//! Push notification configs (spec §3.1.7–3.1.10, §4.3): several per task,
//! each with the client's id, kept with the durable task and notified (the
//! task as a `StreamResponse`, signed, retried and dead-lettered as any
//! callback) when the task ends or asks for input.

use super::*;
use agent_reach_task_store::{Callback, PushAuthentication, PushConfig, Task};

/// Whether `text` may travel as an HTTP header value (visible ASCII and spaces, not at the ends).
fn header_safe(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 4096
        && text.trim() == text
        && text.bytes().all(|byte| byte == b' ' || byte.is_ascii_graphic())
}

/// The longest push config id taken.
const MOST_ID_BYTES: usize = 128;

/// A push config (spec §4.3.1): its `url`, its `id` (the client's, or one
/// the router makes), and the `token` and `authentication` the receiver
/// asked to be sent back (`X-A2A-Notification-Token`, `Authorization:
/// <scheme> <credentials>`). Every notification is also signed with
/// `X-Agent-Reach-Signature` (design §3.10.6). ProtoJSON's snake_case names
/// are read too, and v0.3's config nested in `pushNotificationConfig`.
pub(crate) fn push_config_of(config: &Value) -> Result<Callback, Refusal> {
    let config = field(config, "pushNotificationConfig")
        .filter(|inner| inner.is_object())
        .unwrap_or(config);
    let Some(url) = config.get("url").and_then(Value::as_str).filter(|url| !url.is_empty()) else {
        return Err(invalid(
            "a push notification config needs a `url` (where the task's updates are POSTed)",
        ));
    };
    let text = |name: &str| -> Result<Option<String>, Refusal> {
        match field(config, name).filter(|value| !value.is_null()) {
            None => Ok(None),
            Some(Value::String(text)) if text.is_empty() => Ok(None),
            Some(Value::String(text)) if header_safe(text) => Ok(Some(text.clone())),
            Some(other) => Err(invalid(format!(
                "the push config's `{name}` must be printable ASCII without surrounding spaces (it travels as a header), not {other}"
            ))),
        }
    };
    // The server assigns an id the client did not give (spec §3.1.7).
    let id = text("id")?.unwrap_or_else(|| format!("push-{}", trace::new_request_id()));
    if id.len() > MOST_ID_BYTES {
        return Err(invalid(format!(
            "a push config's `id` holds at most {MOST_ID_BYTES} characters"
        )));
    }
    let token = text("token")?;
    let authentication = match field(config, "authentication").filter(|value| !value.is_null() && *value != &json!({}))
    {
        None => None,
        Some(authentication) => {
            // v1.0 names one `scheme`; v0.3 a list, `schemes`, of which the first is used.
            let scheme = authentication
                .get("scheme")
                .or_else(|| authentication.pointer("/schemes/0"))
                .and_then(Value::as_str)
                .filter(|scheme| {
                    !scheme.is_empty()
                        && scheme
                            .bytes()
                            .all(|byte| byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&byte))
                });
            let Some(scheme) = scheme else {
                return Err(invalid(
                    "the push config's `authentication` needs a `scheme`: an HTTP authentication scheme such as `Bearer`",
                ));
            };
            let credentials = match authentication.get("credentials").filter(|value| !value.is_null()) {
                None => None,
                Some(Value::String(credentials)) if credentials.is_empty() => None,
                Some(Value::String(credentials)) if header_safe(credentials) => Some(credentials.clone()),
                Some(_) => {
                    return Err(invalid(
                        "the push config's `authentication.credentials` must be printable ASCII (they travel in the Authorization header)",
                    ))
                }
            };
            Some(PushAuthentication {
                scheme: scheme.to_string(),
                credentials,
            })
        }
    };
    Ok(Callback {
        url: url.to_string(),
        secret_ref: None,
        a2a: Some(PushConfig {
            id,
            token,
            authentication,
        }),
    })
}

/// A push config's id.
pub(crate) fn config_id_of(config: &Callback) -> &str {
    config.a2a.as_ref().map_or("", |push| push.id.as_str())
}

/// A push config of `task_id` as A2A shows it. The token is the client's own
/// and shown; the credentials are write-only.
pub(crate) fn config_value(task_id: &str, config: &Callback, wire: Wire) -> Value {
    let mut value = json!({ "id": config_id_of(config), "url": config.url });
    if let Some(push) = &config.a2a {
        if let Some(token) = &push.token {
            value["token"] = json!(token);
        }
        if let Some(authentication) = &push.authentication {
            value["authentication"] = match wire {
                Wire::V1 => json!({ "scheme": authentication.scheme }),
                Wire::V03 => json!({ "schemes": [authentication.scheme] }),
            };
        }
    }
    match wire {
        Wire::V1 => {
            value["taskId"] = json!(task_id);
            value
        }
        Wire::V03 => json!({ "taskId": task_id, "pushNotificationConfig": value }),
    }
}

impl Rpc<'_> {
    /// Push configs need the slow path: without it, A2A's PushNotificationNotSupported (§3.3.4).
    fn push_supported(&self) -> Result<(), Refusal> {
        if self.api.tasks_enabled() {
            return Ok(());
        }
        Err(Refusal {
            code: PUSH_NOT_SUPPORTED,
            message: "push notifications need durable tasks, which this router runs without (start it with --redis)"
                .to_string(),
            error: None,
        })
    }

    /// `CreateTaskPushNotificationConfig`: creates the config, or replaces
    /// the task's config of the same id. A task that ended takes one too
    /// (it is listed, and is notified of nothing more).
    pub(crate) async fn push_set(&self) -> Result<Response, Refusal> {
        self.push_supported()?;
        let task_id = self.string("taskId", "taskId")?;
        let config = push_config_of(self.params)?;
        let task = self.stored(&task_id, Operation::PushSet).await?;
        self.api
            .put_push_config(&task, &config)
            .await
            .map_err(|error| task_refusal(error, Operation::PushSet))?;
        Ok(self.answer(config_value(&task.task_id, &config, self.wire)))
    }

    /// The config id a get or delete names (v1.0 `id`, v0.3 `pushNotificationConfigId`).
    fn config_named(&self) -> Option<&str> {
        let name = match self.wire {
            Wire::V1 => "id",
            Wire::V03 => "pushNotificationConfigId",
        };
        field(self.params, name)
            .and_then(Value::as_str)
            .filter(|id| !id.is_empty())
    }

    /// The config `named` of `task`: else `-32001` (spec §3.1.8: a config
    /// that does not exist is TaskNotFound).
    fn config_of<'t>(&self, task: &'t Task, named: &str) -> Result<&'t Callback, Refusal> {
        task.push_config(named).ok_or_else(|| Refusal {
            code: TASK_NOT_FOUND,
            message: format!(
                "task `{}` has no push notification config `{named}` (ListTaskPushNotificationConfigs names its configs)",
                task.task_id
            ),
            error: None,
        })
    }

    /// `GetTaskPushNotificationConfig`. v0.3 may name no config: its first.
    pub(crate) async fn push_get(&self) -> Result<Response, Refusal> {
        self.push_supported()?;
        let task_id = self.string("taskId", "id")?;
        let named = match (self.config_named(), self.wire) {
            (Some(named), _) => Some(named.to_string()),
            (None, Wire::V03) => None,
            (None, Wire::V1) => return Err(invalid("`params.id` (the push config's id) is required")),
        };
        let task = self.stored(&task_id, Operation::PushGet).await?;
        let config = match &named {
            Some(named) => self.config_of(&task, named)?,
            None => task.push_configs.first().ok_or_else(|| Refusal {
                code: TASK_NOT_FOUND,
                message: format!("task `{task_id}` has no push notification config"),
                error: None,
            })?,
        };
        Ok(self.answer(config_value(&task.task_id, config, self.wire)))
    }

    /// `ListTaskPushNotificationConfigs`: every config of the task, by id,
    /// in one page (a task holds at most
    /// [`agent_reach_task_store::MOST_PUSH_CONFIGS`]).
    pub(crate) async fn push_list(&self) -> Result<Response, Refusal> {
        self.push_supported()?;
        let task_id = self.string("taskId", "id")?;
        if let Some(size) = field(self.params, "pageSize").filter(|size| !size.is_null()) {
            if size.as_u64().is_none() {
                return Err(invalid(format!(
                    "`pageSize` must be an integer of at least 0, not {size}"
                )));
            }
        }
        match field(self.params, "pageToken") {
            None | Some(Value::Null) => {}
            Some(Value::String(token)) if token.is_empty() => {}
            Some(token) => {
                return Err(invalid(format!(
                    "`pageToken` {token} is not one this agent handed out (every config comes in the first page)"
                )))
            }
        }
        let task = self.stored(&task_id, Operation::PushList).await?;
        let configs: Vec<Value> = task
            .push_configs
            .iter()
            .map(|config| config_value(&task.task_id, config, self.wire))
            .collect();
        Ok(self.answer(match self.wire {
            Wire::V1 => json!({ "configs": configs, "nextPageToken": "" }),
            Wire::V03 => json!(configs),
        }))
    }

    /// `DeleteTaskPushNotificationConfig`; a config the task does not have is `-32001`.
    pub(crate) async fn push_delete(&self) -> Result<Response, Refusal> {
        self.push_supported()?;
        let task_id = self.string("taskId", "id")?;
        let Some(named) = self.config_named().map(str::to_string) else {
            let name = match self.wire {
                Wire::V1 => "id",
                Wire::V03 => "pushNotificationConfigId",
            };
            return Err(invalid(format!("`params.{name}` (the push config's id) is required")));
        };
        let task = self.stored(&task_id, Operation::PushDelete).await?;
        self.config_of(&task, &named)?;
        let deleted = self
            .api
            .delete_push_config(&task, &named)
            .await
            .map_err(|error| task_refusal(error, Operation::PushDelete))?;
        if !deleted {
            // Deleted meanwhile by another request.
            return Err(Refusal {
                code: TASK_NOT_FOUND,
                message: format!("task `{task_id}` has no push notification config `{named}` (deleted already)"),
                error: None,
            });
        }
        Ok(self.answer(Value::Null))
    }
}
