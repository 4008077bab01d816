//! The words every service shares, defined once: an instance's [`Status`]
//! (DESIGN §2) and a call's [`Priority`] (DESIGN §3). Their string forms are
//! part of the wire contract; an unknown word is an error, never a default.

use serde::{Deserialize, Serialize};

/// An instance's lifecycle: `starting → ready ↔ busy/overloaded → draining`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Registered, not routable yet (the agent has not marked itself ready).
    Starting,
    Ready,
    /// Self-reported load; still routable.
    Busy,
    /// Self-reported overload: traffic only when nothing else is left.
    Overloaded,
    /// Graceful shutdown: no new traffic.
    Draining,
}

/// A status word that is not one of [`Status::ALL`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownStatus(pub String);

impl std::fmt::Display for UnknownStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "unknown status `{}` (expected starting, ready, busy, overloaded or draining)",
            self.0
        )
    }
}

impl std::error::Error for UnknownStatus {}

impl Status {
    pub const ALL: [Status; 5] = [
        Status::Starting,
        Status::Ready,
        Status::Busy,
        Status::Overloaded,
        Status::Draining,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Starting => "starting",
            Status::Ready => "ready",
            Status::Busy => "busy",
            Status::Overloaded => "overloaded",
            Status::Draining => "draining",
        }
    }

    pub fn parse(text: &str) -> Result<Self, UnknownStatus> {
        Self::ALL
            .into_iter()
            .find(|status| status.as_str() == text)
            .ok_or_else(|| UnknownStatus(text.to_string()))
    }

    /// Takes ordinary traffic (`ready`, `busy`). `overloaded` is a last resort
    /// the router may still choose when nothing else is left.
    pub fn is_routable(self) -> bool {
        matches!(self, Status::Ready | Status::Busy)
    }

    /// Whether an instance may move from `self` to `next`. Nothing goes back
    /// to `starting`, and `draining` is final: a draining instance leaves by
    /// deregistering (or re-registering as a new life).
    pub fn can_become(self, next: Status) -> bool {
        match (self, next) {
            (current, next) if current == next => true,
            (Status::Draining, _) | (_, Status::Starting) => false,
            _ => true,
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Status {
    type Err = UnknownStatus;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text)
    }
}

/// How urgent a call is: task queues and tag gates serve `high` first.
/// Ordered most urgent first (`High < Normal < Low`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    High,
    #[default]
    Normal,
    Low,
}

impl Priority {
    pub const ALL: [Priority; 3] = [Priority::High, Priority::Normal, Priority::Low];

    pub fn as_str(self) -> &'static str {
        match self {
            Priority::High => "high",
            Priority::Normal => "normal",
            Priority::Low => "low",
        }
    }

    /// Higher is more urgent (`high` 2, `normal` 1, `low` 0), for max-heaps.
    pub fn urgency(self) -> u8 {
        match self {
            Priority::High => 2,
            Priority::Normal => 1,
            Priority::Low => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_round_trip_and_unknown_words_are_errors() {
        for status in Status::ALL {
            assert_eq!(Status::parse(status.as_str()), Ok(status));
            assert_eq!(
                serde_json::to_value(status).unwrap(),
                serde_json::json!(status.as_str())
            );
        }
        assert_eq!(Status::parse("Ready"), Err(UnknownStatus("Ready".into())));
        assert!(Status::parse("").is_err());
        assert!(serde_json::from_str::<Status>("\"sleeping\"").is_err());
    }

    #[test]
    fn lifecycle_rules() {
        assert!(Status::Starting.can_become(Status::Ready));
        assert!(Status::Ready.can_become(Status::Busy));
        assert!(Status::Overloaded.can_become(Status::Ready));
        assert!(Status::Ready.can_become(Status::Draining));
        assert!(!Status::Ready.can_become(Status::Starting));
        assert!(!Status::Draining.can_become(Status::Ready));
        assert!(Status::Busy.is_routable() && !Status::Overloaded.is_routable() && !Status::Starting.is_routable());
    }

    #[test]
    fn priorities_order_most_urgent_first() {
        let mut all = [Priority::Low, Priority::High, Priority::Normal];
        all.sort();
        assert_eq!(all, Priority::ALL);
        assert!(Priority::High.urgency() > Priority::Normal.urgency());
        assert_eq!(serde_json::to_value(Priority::Low).unwrap(), serde_json::json!("low"));
    }
}
