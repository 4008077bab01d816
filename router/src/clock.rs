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

/// The monotonic instant matching an absolute epoch-ms deadline, so timers are
/// immune to wall-clock steps while the request runs.
pub fn instant_for_epoch_ms(deadline_ms: u64) -> Instant {
    let now_epoch = epoch_ms();
    let now = Instant::now();
    if deadline_ms >= now_epoch {
        // A deadline centuries away must not overflow `Instant`; a year is "never" here.
        let wait = Duration::from_millis(deadline_ms - now_epoch).min(MAX_WAIT);
        now.checked_add(wait).unwrap_or(now)
    } else {
        now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn far_and_past_deadlines_do_not_overflow() {
        let far = instant_for_epoch_ms(u64::MAX);
        assert!(far > Instant::now() + Duration::from_secs(3600));
        assert!(instant_for_epoch_ms(0) <= Instant::now());
    }
}
