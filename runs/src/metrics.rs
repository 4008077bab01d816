//! The runs' metrics (docs/metrics.md): runs started and ended by workflow
//! (and how they ended), and the calls their steps made.

/// `agent_reach_runs_*`.
pub struct RunMetrics {
    pub started: prometheus::IntCounterVec,
    pub ended: prometheus::IntCounterVec,
    pub calls: prometheus::IntCounterVec,
}

impl RunMetrics {
    pub fn register(registry: &prometheus::Registry) -> Result<Self, String> {
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let counter = prometheus::IntCounterVec::new(prometheus::Opts::new(name, help), labels)
                .map_err(|error| format!("{name}: {error}"))?;
            registry
                .register(Box::new(counter.clone()))
                .map_err(|error| format!("{name}: {error}"))?;
            Ok::<_, String>(counter)
        };
        Ok(Self {
            started: counter(
                "agent_reach_runs_started_total",
                "Workflow runs started, by workflow.",
                &["workflow"],
            )?,
            ended: counter(
                "agent_reach_runs_ended_total",
                "Workflow runs ended, by workflow and state (succeeded, failed, canceled).",
                &["workflow", "state"],
            )?,
            calls: counter(
                "agent_reach_run_calls_total",
                "Calls workflow runs' steps made (each attempt and compensation one task), by workflow.",
                &["workflow"],
            )?,
        })
    }
}
