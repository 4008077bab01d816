//! Time helpers: a cheap monotonic millisecond clock for breakers and health,
//! and wall-clock epoch milliseconds for envelope deadlines.

use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The longest wait a deadline can ask for.
const MAX_WAIT: Duration = Duration::from_secs(365 * 24 * 3600);

fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

/// Monotonic milliseconds since the first call in this process.
pub fn now_ms() -> u64 {
    origin().elapsed().as_millis() as u64
}

/// Wall-clock epoch milliseconds (the unit of envelope `deadline`s).
pub fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_millis() as u64)
        .unwrap_or(0)
}

/// Both clocks read once: a request's "now", so its deadline, the check that
/// it has not passed and its first timings cost two clock reads, not six.
#[derive(Debug, Clone, Copy)]
pub struct Now {
    pub epoch_ms: u64,
    pub instant: Instant,
}

impl Now {
    pub fn read() -> Self {
        Self {
            epoch_ms: epoch_ms(),
            instant: Instant::now(),
        }
    }

    /// The monotonic instant matching an absolute epoch-ms deadline, so timers
    /// are immune to wall-clock steps while the request runs (`instant` for a
    /// deadline already past).
    pub fn instant_for(&self, deadline_ms: u64) -> Instant {
        if deadline_ms >= self.epoch_ms {
            // A deadline centuries away must not overflow `Instant`; a year is "never" here.
            let wait = Duration::from_millis(deadline_ms - self.epoch_ms).min(MAX_WAIT);
            self.instant.checked_add(wait).unwrap_or(self.instant)
        } else {
            self.instant
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn far_and_past_deadlines_do_not_overflow() {
        let now = Now::read();
        assert!(now.instant_for(u64::MAX) > now.instant + Duration::from_secs(3600));
        assert_eq!(now.instant_for(0), now.instant);
        assert_eq!(
            now.instant_for(now.epoch_ms + 1500),
            now.instant + Duration::from_millis(1500)
        );
    }
}
