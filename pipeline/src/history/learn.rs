//! The learning task: every tick (a 360th of a bucket, 10 s by default) it
//! drains each slot's counters into its history, predicts each instance's
//! failure rate and latency for now ([`super::predict`]), and moves each
//! instance's `adaptive` weight towards the target by at most ×2 or ÷2,
//! never below the floor, never for an instance whose weight an operator
//! set. Every move by more than a quarter since the last one shown is
//! logged and kept for the console with its reason ([`super::changes`]).
//! Off the request path: the request path reads the result, one atomic per
//! candidate.

use std::sync::Weak;
use std::time::Duration;

use super::changes::{worth_showing, Changes, WeightChange};
use super::predict::{self, bounded_step, Cause, Prediction};
use super::{Clock, FULL};
use crate::clock;
use crate::service::RouterService;
use crate::snapshot::{Snapshot, VersionGroup};

/// Runs every tick until the service is dropped.
pub(crate) async fn run(service: Weak<RouterService>, history_clock: Clock) {
    let mut ticker = tokio::time::interval(Duration::from_millis(history_clock.tick_ms()));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let Some(service) = service.upgrade() else {
            return;
        };
        let snapshot = service.snapshot().load_full();
        learn(
            &snapshot,
            &history_clock,
            clock::epoch_ms(),
            service.history_exchanging(),
            service.weight_changes(),
        );
    }
}

/// One tick over every version group of `snapshot` at `now_ms`.
pub(crate) fn learn(snapshot: &Snapshot, clock: &Clock, now_ms: u64, exchanging: bool, changes: &Changes) {
    for capability in snapshot.capabilities.values() {
        for group in &capability.versions {
            learn_group(&capability.name, group, clock, now_ms, exchanging, changes);
        }
    }
}

fn learn_group(
    capability: &str,
    group: &VersionGroup,
    clock: &Clock,
    now_ms: u64,
    exchanging: bool,
    changes: &Changes,
) {
    let (bucket, slice) = (clock.bucket(now_ms), clock.slice(now_ms));
    let predictions: Vec<Prediction> = group
        .histories
        .iter()
        .map(|history| {
            history.drain(bucket, slice, exchanging);
            history.with(|recorded| predict::predict(recorded, clock, now_ms))
        })
        .collect();
    let fastest = predictions
        .iter()
        .filter_map(|prediction| prediction.p50_us)
        .min()
        .unwrap_or(0);
    for ((instance, history), prediction) in group.instances.iter().zip(&group.histories).zip(&predictions) {
        history.publish_prediction(
            prediction.failure.map(|rate| (rate * f64::from(FULL)).round() as u32),
            prediction.p50_us,
        );
        let current = history.learned_permille();
        // An operator's weight is theirs: adaptive never scales it.
        let (target, cause, next) = if instance.operator_weight {
            (FULL, Cause::Healthy, FULL)
        } else {
            let (target, cause) = predict::target(prediction, fastest);
            (target, cause, bounded_step(current, target))
        };
        if next != current {
            history.set_learned(next);
        }
        let shown = history.with_mut(|recorded| {
            let shown = worth_showing(recorded.logged, next);
            let from = recorded.logged;
            if shown {
                recorded.logged = next;
            }
            shown.then_some(from)
        });
        let Some(from) = shown else { continue };
        let reason = predict::reason(prediction, cause, clock, fastest);
        tracing::info!(
            message = "Adaptive weight changed.",
            capability, version = %group.version_text, agent_id = %instance.agent_id,
            from_permille = from, to_permille = next, target_permille = target, %reason
        );
        changes.push(WeightChange {
            at_ms: now_ms,
            capability: capability.to_string(),
            version: group.version_text.clone(),
            agent_id: instance.agent_id.clone(),
            from_permille: from,
            to_permille: next,
            target_permille: target,
            reason,
        });
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use agent_reach_proto::registry as pb;

    use super::super::predict::FLOOR;
    use super::super::Kind;
    use super::*;
    use crate::metrics::Metrics;
    use crate::snapshot::SnapshotBuilder;

    fn instance(id: &str, operator_weight: bool) -> pb::AgentInstance {
        pb::AgentInstance {
            agent_id: id.to_string(),
            name: "a".to_string(),
            endpoint: format!("http://127.0.0.1:1/{id}"),
            weight: 1,
            status: "ready".to_string(),
            operator_weight,
            capabilities: vec![pb::CapabilityDescriptor {
                name: "order.query".to_string(),
                version: "1.0.0".to_string(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn snapshot() -> Snapshot {
        let mut builder = SnapshotBuilder::new(Metrics::new().unwrap());
        builder.apply(pb::WatchEvent {
            revision: 1,
            kind: Some(pb::watch_event::Kind::Snapshot(pb::Snapshot {
                instances: vec![
                    instance("failing", false),
                    instance("healthy", false),
                    instance("pinned", true),
                ],
                ..Default::default()
            })),
        });
        builder.build()
    }

    #[test]
    fn weights_move_by_bounded_steps_to_the_floor_and_an_operators_weight_never_moves() {
        let snapshot = snapshot();
        let group = &snapshot.capabilities["order.query"].versions[0];
        let by_id = |id: &str| {
            let index = group
                .instances
                .iter()
                .position(|instance| instance.agent_id == id)
                .unwrap();
            group.histories[index].clone()
        };
        let (failing, healthy, pinned) = (by_id("failing"), by_id("healthy"), by_id("pinned"));
        let clock = Clock::new(Duration::from_secs(3600));
        let changes = Changes::default();
        let mut now = 1_000 * 3_600_000;
        let mut seen = Vec::new();
        for _ in 0..8 {
            for _ in 0..20 {
                for history in [&failing, &pinned] {
                    history.record(Kind::ServerError, None);
                    history.record(Kind::Succeeded, Some(Duration::from_millis(2)));
                }
                healthy.record(Kind::Succeeded, Some(Duration::from_millis(2)));
            }
            learn(&snapshot, &clock, now, false, &changes);
            seen.push(failing.learned_permille());
            now += clock.tick_ms();
        }
        // Failing half the time: the target is the floor; at most halved per tick.
        assert_eq!(seen, [500, 250, 125, 62, FLOOR, FLOOR, FLOOR, FLOOR]);
        assert_eq!(healthy.learned_permille(), FULL);
        assert_eq!(pinned.learned_permille(), FULL, "an operator's weight is never scaled");
        assert_eq!(failing.predicted_failure_permille(), Some(500));
        let shown = changes.newest(Some("order.query"), 10);
        // Each halving is more than a quarter; 62 → 50 is not.
        assert_eq!(shown.len(), 4, "{shown:?}");
        assert!(shown.iter().all(|change| change.agent_id == "failing"));
        assert_eq!((shown[0].from_permille, shown[0].to_permille), (125, 62));
        assert!(
            shown[0].reason.starts_with("failure rate 50 % of "),
            "{}",
            shown[0].reason
        );
        // It recovers: the failures leave the last minute, the successes take their place.
        for _ in 0..12 {
            for _ in 0..5 {
                failing.record(Kind::Succeeded, Some(Duration::from_millis(2)));
            }
            now += clock.tick_ms();
            learn(&snapshot, &clock, now, false, &changes);
        }
        assert_eq!(
            failing.learned_permille(),
            FULL,
            "back to full weight once it answers again"
        );
    }
}
