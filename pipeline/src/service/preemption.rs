//! Preemption (DESIGN §9): which capabilities may be paused, and the pause
//! request the router sends the instances that may run a delivery.

use super::RouterService;

impl RouterService {
    /// Whether any version of `capability` is preemptible (DESIGN §9).
    pub fn is_preemptible(&self, capability: &str) -> bool {
        self.snapshot
            .load()
            .capabilities
            .get(capability)
            .is_some_and(|found| found.versions.iter().any(|group| group.described.preemptible))
    }

    /// Asks the instances of `capability`'s preemptible versions to pause
    /// the delivery of `request_id` that `caller`'s task is running (DESIGN
    /// §9): each gets the pause request under an assertion for that call;
    /// the one running it answers `202`. Returns how many did (0 or 1).
    pub async fn pause(&self, caller: &agent_reach_access::Caller, capability: &str, request_id: &str) -> usize {
        let snapshot = self.snapshot.load_full();
        let Some(found) = snapshot.capabilities.get(capability) else {
            return 0;
        };
        let body = serde_json::json!({ "request_id": request_id, "capability": capability }).to_string();
        let now = crate::clock::Now::read();
        let deadline_ms = now.epoch_ms + 2000;
        let traceparent = crate::trace::TraceContext::from_header(None).forward_header();
        let mut asked = std::collections::HashSet::new();
        let mut accepted = 0;
        let instances = found
            .versions
            .iter()
            .filter(|group| group.described.preemptible)
            .flat_map(|group| group.instances.iter());
        for instance in instances {
            if !asked.insert(instance.agent_id.as_str()) {
                continue;
            }
            let Ok(authorization) = self.assertions.header(
                caller,
                (&instance.agent_id, capability),
                // A pause request is the router's own, outside any chain.
                &agent_reach_access::Delegation::direct(Vec::new()),
                None,
                deadline_ms,
                now.epoch_ms,
            ) else {
                continue;
            };
            let headers = crate::forward::ForwardHeaders {
                traceparent: &traceparent,
                authorization: authorization.as_bytes(),
            };
            let answered = self
                .forwarder
                .pause(
                    &instance.uri,
                    body.as_bytes(),
                    &headers,
                    now.instant_for(deadline_ms),
                    now.instant,
                )
                .await;
            if matches!(answered, crate::forward::AttemptResult::Answered { status, .. } if status == http::StatusCode::ACCEPTED)
            {
                accepted += 1;
                tracing::info!(message = "Paused a delivery for higher-priority work.", capability, request_id, agent_id = %instance.agent_id);
            }
        }
        accepted
    }
}
