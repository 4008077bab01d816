//! `agent_reach_tasks_*`, registered only on routers with the slow path on
//! (names and labels in docs/metrics.md).

pub(crate) struct TaskMetrics {
    pub(crate) submitted: prometheus::IntCounterVec,
    pub(crate) finished: prometheus::IntCounterVec,
    pub(crate) backlog: prometheus::IntGaugeVec,
    pub(crate) dead_letters: prometheus::IntGauge,
    pub(crate) callback_failures: prometheus::IntCounter,
    pub(crate) state_seconds: prometheus::HistogramVec,
    pub(crate) paused: prometheus::IntCounterVec,
}

impl TaskMetrics {
    pub(crate) fn register(registry: &prometheus::Registry) -> Result<Self, prometheus::Error> {
        use prometheus::{HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts};
        let submitted = IntCounterVec::new(
            Opts::new(
                "agent_reach_tasks_submitted_total",
                "Tasks accepted (stored), by priority.",
            ),
            &["priority"],
        )?;
        let finished = IntCounterVec::new(
            Opts::new(
                "agent_reach_tasks_finished_total",
                "Tasks ended by this router, by outcome.",
            ),
            &["outcome"],
        )?;
        let backlog = IntGaugeVec::new(
            Opts::new(
                "agent_reach_tasks_backlog",
                "Tasks waiting to be delivered, by capability and priority (the earliest sign of a slowing agent).",
            ),
            &["capability", "priority"],
        )?;
        let dead_letters = IntGauge::new(
            "agent_reach_tasks_dead_letters",
            "Callbacks parked in the dead-letter stream.",
        )?;
        let callback_failures = IntCounter::new(
            "agent_reach_tasks_callback_failures_total",
            "Callback attempts that failed (each is retried on the schedule, then dead-lettered).",
        )?;
        let state_seconds = HistogramVec::new(
            HistogramOpts::new(
                "agent_reach_tasks_state_seconds",
                "Time tasks spent in a state before leaving it.",
            )
            .buckets(vec![0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0, 600.0]),
            &["state"],
        )?;
        registry.register(Box::new(submitted.clone()))?;
        registry.register(Box::new(finished.clone()))?;
        registry.register(Box::new(backlog.clone()))?;
        registry.register(Box::new(dead_letters.clone()))?;
        registry.register(Box::new(callback_failures.clone()))?;
        let paused = IntCounterVec::new(
            Opts::new(
                "agent_reach_tasks_paused_total",
                "Task deliveries paused (DESIGN §9 preemption), by capability and why: `preempted` (its agent paused it for higher-priority work) or `no_room` (a resumed task found no room yet).",
            ),
            &["capability", "reason"],
        )?;
        registry.register(Box::new(state_seconds.clone()))?;
        registry.register(Box::new(paused.clone()))?;
        Ok(Self {
            submitted,
            finished,
            backlog,
            dead_letters,
            callback_failures,
            state_seconds,
            paused,
        })
    }
}
