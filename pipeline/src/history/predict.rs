//! What an instance's history predicts for now, and the weight `adaptive`
//! aims at from it. Pure functions of the recorded counts and the clock.
//!
//! The prediction of the failure rate at this hour:
//! - the *pattern*: this hour of the day on each of the past six days (bucket
//!   `n − 24·d`), summed; it counts once it holds [`MIN_PATTERN_CALLS`] and
//!   unless exactly one of those days failed (a one-off incident is not a
//!   pattern: an hour is predicted to fail once it failed on
//!   [`MIN_BAD_DAYS`] days, "seen twice");
//! - the *present*: the last minute (only its slices in this hour's bucket
//!   when there is a pattern: a minute of the hour before says nothing of
//!   this one, whose pattern may differ); when that holds fewer than
//!   [`MIN_RECENT_CALLS`] attempts (an instance at the floor gets few), the
//!   hour so far, and without a pattern the hour before as well, so a
//!   sparsely probed instance is judged on what it did, not forgotten at
//!   every hour's start;
//! - together: the pattern is a prior worth at most [`PATTERN_WEIGHT`]
//!   attempts, the present's attempts are added to it: `(K·f_pattern +
//!   failures) / (K + calls)`. At the start of an hour that failed on past
//!   days the prediction is the pattern's (the weight drops before the
//!   failures come back); an instance that no longer fails wins its weight
//!   back as its probes succeed.
//!
//! The target weight is `(1 − 3·f)` (each point of failure rate costs three
//! of weight: 30 % failures is 10 %) × the latency factor of the predicted
//! p50 against the fastest instance's ([`crate::health::latency_factor`]),
//! never below [`FLOOR`].

use std::fmt::Write as _;

use super::{quantile_of, Clock, Counts, Recorded, DAY, FULL, KINDS, LATENCY_BINS, RECENT_SLICES};
use crate::health::latency_factor;

/// The lowest learned weight (permille): 5 % of the registered weight, so a
/// recovering instance still gets probes.
pub const FLOOR: u32 = 50;
/// The pattern counts once this hour on past days holds this many attempts.
pub const MIN_PATTERN_CALLS: u64 = 10;
/// The present alone counts once it holds this many attempts.
pub const MIN_RECENT_CALLS: u64 = 5;
/// The most attempts the pattern is worth against the present's.
pub const PATTERN_WEIGHT: u64 = 50;
/// A past day's hour is "a failing one" from this failure rate.
pub const BAD_DAY: f64 = 0.10;
/// Failing days at this hour before the pattern predicts failures.
pub const MIN_BAD_DAYS: u32 = 2;
/// Points of weight lost per point of failure rate.
pub const FAILURE_SLOPE: f64 = 3.0;
/// Past days looked at.
const DAYS: u64 = 6;

/// This hour of the day on past days.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pattern {
    /// The hour of the day (`bucket % 24`).
    pub hour: u64,
    pub calls: u64,
    pub failures: u64,
    /// Past days with attempts at this hour.
    pub days: u32,
    /// Of those, days whose failure rate at this hour was at least [`BAD_DAY`].
    pub bad_days: u32,
}

impl Pattern {
    pub fn failure_rate(&self) -> f64 {
        self.failures as f64 / self.calls.max(1) as f64
    }
}

/// The present: the last minute, or a wider window when it says too little.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Recent {
    pub calls: u64,
    pub failures: u64,
    pub window: Window,
}

/// Which window [`Recent`] counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Window {
    #[default]
    LastMinute,
    /// This hour's bucket so far.
    HourSoFar,
    /// This hour's bucket so far and the one before.
    SinceLastHour,
}

impl Recent {
    pub fn failure_rate(&self) -> f64 {
        self.failures as f64 / self.calls.max(1) as f64
    }
}

/// What the history says of now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prediction {
    /// The failure rate now (0..=1); `None` when nothing is known yet.
    pub failure: Option<f64>,
    /// The p50 latency now (µs), when any answer is known.
    pub p50_us: Option<u64>,
    /// This hour on past days, when it holds enough attempts.
    pub pattern: Option<Pattern>,
    pub recent: Recent,
}

/// The prediction for `now_ms` from `recorded`.
pub(crate) fn predict(recorded: &Recorded, clock: &Clock, now_ms: u64) -> Prediction {
    let bucket = clock.bucket(now_ms);
    let mut past = Counts::default();
    let (mut days, mut bad_days) = (0, 0);
    for day in 1..=DAYS {
        let Some(counts) = bucket.checked_sub(day * DAY).and_then(|number| recorded.hour(number)) else {
            continue;
        };
        if counts.calls() == 0 {
            continue;
        }
        days += 1;
        if counts.calls() >= MIN_PATTERN_CALLS && counts.failures() as f64 >= BAD_DAY * counts.calls() as f64 {
            bad_days += 1;
        }
        past.add(counts);
    }
    let recurring = bad_days == 0 || bad_days >= MIN_BAD_DAYS;
    let pattern = (past.calls() >= MIN_PATTERN_CALLS && recurring).then_some(Pattern {
        hour: bucket % DAY,
        calls: past.calls(),
        failures: past.failures(),
        days,
        bad_days,
    });

    let slice = clock.slice(now_ms);
    let bucket_start = clock.bucket_start_ms(bucket);
    let mut present = Counts::default();
    for back in 0..RECENT_SLICES as u64 {
        let Some(number) = slice.checked_sub(back) else { break };
        if pattern.is_some() && clock.slice_start_ms(number) < bucket_start && back > 0 {
            break;
        }
        if let Some(counts) = recorded.slice(number) {
            present.add(counts);
        }
    }
    let mut window = Window::LastMinute;
    if present.calls() < MIN_RECENT_CALLS {
        let mut wider = recorded.hour(bucket).copied().unwrap_or_default();
        let mut wider_window = Window::HourSoFar;
        if pattern.is_none() {
            if let Some(before) = bucket.checked_sub(1).and_then(|number| recorded.hour(number)) {
                wider.add(before);
                wider_window = Window::SinceLastHour;
            }
        }
        if wider.calls() > present.calls() {
            present = wider;
            window = wider_window;
        }
    }
    let recent = Recent {
        calls: present.calls(),
        failures: present.failures(),
        window,
    };

    let prior = pattern.map(|pattern| (pattern.calls.min(PATTERN_WEIGHT) as f64, pattern.failure_rate()));
    let failure = match prior {
        Some((weight, rate)) => Some((weight * rate + recent.failures as f64) / (weight + recent.calls as f64)),
        None if recent.calls >= MIN_RECENT_CALLS => Some(recent.failure_rate()),
        None => None,
    };
    // Latencies: the pattern's bins scaled to its weight, plus the present's.
    let mut bins = [0.0f64; LATENCY_BINS];
    if let Some((weight, _)) = prior {
        let answered: f64 = past.words[KINDS..].iter().map(|count| f64::from(*count)).sum();
        if answered > 0.0 {
            for (bin, count) in bins.iter_mut().zip(&past.words[KINDS..]) {
                *bin += f64::from(*count) * weight / answered;
            }
        }
    }
    for (bin, count) in bins.iter_mut().zip(&present.words[KINDS..]) {
        *bin += f64::from(*count);
    }
    Prediction {
        failure,
        p50_us: quantile_of(&bins, 0.5),
        pattern,
        recent,
    }
}

/// What the target weight comes from (the larger loss).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    Failures,
    Latency,
    Healthy,
}

/// The weight `adaptive` aims at (permille, [`FLOOR`]..=1000) for
/// `prediction`, `fastest_p50_us` being the fastest instance's predicted
/// p50 in the same version (0 when none is known).
pub fn target(prediction: &Prediction, fastest_p50_us: u64) -> (u32, Cause) {
    let success = prediction
        .failure
        .map_or(1.0, |rate| (1.0 - FAILURE_SLOPE * rate).clamp(0.0, 1.0));
    let latency = prediction
        .p50_us
        .map_or(1.0, |p50| latency_factor(p50, fastest_p50_us) as f64 / 1000.0);
    let target = ((f64::from(FULL) * success * latency).round() as u32).clamp(FLOOR, FULL);
    let cause = if success >= 1.0 && latency >= 1.0 {
        Cause::Healthy
    } else if success <= latency {
        Cause::Failures
    } else {
        Cause::Latency
    };
    (target, cause)
}

/// At most doubling or halving per tick, within [`FLOOR`]..=1000.
pub fn bounded_step(current: u32, target: u32) -> u32 {
    target.clamp(current / 2, current.saturating_mul(2)).clamp(FLOOR, FULL)
}

/// Why the weight is what it is, for the log and the console, e.g.
/// "failure rate 31 % between 02:00 and 03:00 UTC for 5 days".
pub fn reason(prediction: &Prediction, cause: Cause, clock: &Clock, fastest_p50_us: u64) -> String {
    let mut text = String::new();
    let percent = |rate: f64| (rate * 100.0).round() as u64;
    let recent_window = match prediction.recent.window {
        Window::LastMinute => format!("in the last {}", describe_ms(clock.recent_ms())),
        Window::HourSoFar => format!("this {} so far", unit(clock)),
        Window::SinceLastHour => format!("this {} and the one before", unit(clock)),
    };
    match cause {
        Cause::Failures => match prediction.pattern {
            Some(pattern)
                if pattern.failure_rate() >= prediction.recent.failure_rate()
                    || prediction.recent.calls < MIN_RECENT_CALLS =>
            {
                let days = if pattern.bad_days > 0 {
                    pattern.bad_days
                } else {
                    pattern.days
                };
                let _ = write!(
                    text,
                    "failure rate {} % {} for {days} day{}",
                    percent(pattern.failure_rate()),
                    hour_of_day(pattern.hour, clock),
                    if days == 1 { "" } else { "s" }
                );
                if prediction.recent.calls > 0 {
                    let _ = write!(
                        text,
                        "; {} % of {} {recent_window}",
                        percent(prediction.recent.failure_rate()),
                        prediction.recent.calls
                    );
                }
            }
            _ => {
                let _ = write!(
                    text,
                    "failure rate {} % of {} attempt{} {recent_window}",
                    percent(prediction.recent.failure_rate()),
                    prediction.recent.calls,
                    if prediction.recent.calls == 1 { "" } else { "s" }
                );
            }
        },
        Cause::Latency => {
            let _ = write!(
                text,
                "p50 latency {} against {} for the fastest instance",
                describe_us(prediction.p50_us.unwrap_or(0)),
                describe_us(fastest_p50_us)
            );
        }
        Cause::Healthy => {
            let _ = write!(text, "healthy: ");
            match (prediction.failure, prediction.recent.calls) {
                (Some(rate), calls) if calls > 0 => {
                    let _ = write!(text, "failure rate {} % of {calls} {recent_window}", percent(rate));
                }
                _ => {
                    let _ = write!(text, "no failure on record");
                }
            }
            if let Some(p50) = prediction.p50_us {
                let _ = write!(text, ", p50 {}", describe_us(p50));
            }
        }
    }
    text
}

/// "between 02:00 and 03:00 UTC" for hourly buckets; with a compressed
/// bucket (a test or bench knob), "in bucket 2 of the day (buckets of 3 s)".
fn hour_of_day(hour: u64, clock: &Clock) -> String {
    if clock.bucket_ms == 3_600_000 {
        format!("between {:02}:00 and {:02}:00 UTC", hour, (hour + 1) % DAY)
    } else {
        format!(
            "in bucket {hour} of the day (buckets of {})",
            describe_ms(clock.bucket_ms)
        )
    }
}

/// "hour", or "bucket" when time is compressed.
fn unit(clock: &Clock) -> &'static str {
    if clock.bucket_ms == 3_600_000 {
        "hour"
    } else {
        "bucket"
    }
}

fn describe_ms(ms: u64) -> String {
    match ms {
        60_000 => "minute".to_string(),
        ms if ms % 1000 == 0 => format!("{} s", ms / 1000),
        ms => format!("{ms} ms"),
    }
}

fn describe_us(us: u64) -> String {
    if us >= 10_000 {
        format!("{} ms", us / 1000)
    } else {
        format!("{:.1} ms", us as f64 / 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::{History, Kind};
    use super::*;

    const HOUR: u64 = 3_600_000;

    fn clock() -> Clock {
        Clock::new(Duration::from_millis(HOUR))
    }

    /// `calls` attempts, `failures` of them failed, drained at `at_ms`.
    fn fill(history: &History, clock: &Clock, at_ms: u64, calls: u32, failures: u32) {
        for n in 0..calls {
            let kind = if n < failures {
                Kind::ServerError
            } else {
                Kind::Succeeded
            };
            history.record(kind, (kind == Kind::Succeeded).then_some(Duration::from_millis(5)));
        }
        history.drain(clock.bucket(at_ms), clock.slice(at_ms), false);
    }

    #[test]
    fn the_pattern_of_past_days_predicts_an_hour_before_it_fails() {
        let clock = clock();
        let history = History::new();
        let today_2am = 100 * 24 * HOUR + 2 * HOUR;
        for day in 1..=5 {
            fill(&history, &clock, today_2am - day * 24 * HOUR + 1000, 100, 31);
            // The hour before is healthy every day.
            fill(&history, &clock, today_2am - day * 24 * HOUR - HOUR + 1000, 100, 0);
        }
        // The minute before 02:00 today was healthy; it is another hour.
        fill(&history, &clock, today_2am - 1000, 100, 0);
        let prediction = history.with(|recorded| predict(recorded, &clock, today_2am + 10));
        let pattern = prediction.pattern.unwrap();
        assert_eq!((pattern.hour, pattern.days, pattern.bad_days), (2, 5, 5));
        assert!((prediction.failure.unwrap() - 0.31).abs() < 1e-9);
        let (target, cause) = target(&prediction, 5_000);
        assert_eq!((target, cause), (70, Cause::Failures));
        assert_eq!(
            reason(&prediction, cause, &clock, 5_000),
            "failure rate 31 % between 02:00 and 03:00 UTC for 5 days"
        );
    }

    #[test]
    fn a_one_off_incident_is_not_a_pattern_until_it_recurs() {
        let clock = clock();
        let history = History::new();
        let now = 100 * 24 * HOUR + 2 * HOUR + 1000;
        fill(&history, &clock, now - 24 * HOUR, 100, 40);
        fill(&history, &clock, now - 2 * 24 * HOUR, 100, 0);
        let prediction = history.with(|recorded| predict(recorded, &clock, now));
        assert_eq!((prediction.pattern, prediction.failure), (None, None), "seen once");
        fill(&history, &clock, now - 3 * 24 * HOUR, 100, 40);
        let prediction = history.with(|recorded| predict(recorded, &clock, now));
        let pattern = prediction.pattern.expect("seen twice");
        assert_eq!((pattern.days, pattern.bad_days, pattern.calls), (3, 2, 300));
    }

    #[test]
    fn the_present_outweighs_a_pattern_that_no_longer_holds() {
        let clock = clock();
        let history = History::new();
        let now = 100 * 24 * HOUR + 2 * HOUR + 30 * 60_000;
        fill(&history, &clock, now - 24 * HOUR, 100, 40);
        fill(&history, &clock, now - 2 * 24 * HOUR, 100, 40);
        // This hour, the last minute: 200 clean attempts.
        fill(&history, &clock, now - 5_000, 200, 0);
        let prediction = history.with(|recorded| predict(recorded, &clock, now));
        assert!(prediction.pattern.is_some());
        assert!(prediction.failure.unwrap() < 0.1, "{prediction:?}");
        // And a fresh failure with no pattern is seen in the last minute.
        let fresh = History::new();
        fill(&fresh, &clock, now - 5_000, 10, 5);
        let prediction = fresh.with(|recorded| predict(recorded, &clock, now));
        assert_eq!(prediction.failure, Some(0.5));
        let (_, cause) = target(&prediction, 0);
        assert!(
            reason(&prediction, cause, &clock, 0).starts_with("failure rate 50 % of 10 attempts in the last minute")
        );
        // Nothing known: no opinion.
        let empty = History::new();
        let prediction = empty.with(|recorded| predict(recorded, &clock, now));
        assert_eq!((prediction.failure, prediction.p50_us), (None, None));
        assert_eq!(target(&prediction, 0), (FULL, Cause::Healthy));
    }

    #[test]
    fn a_sparsely_probed_instance_is_judged_on_a_wider_window_and_not_forgotten_at_the_hours_start() {
        let clock = clock();
        let history = History::new();
        let start = 100 * 24 * HOUR + 5 * HOUR;
        // Twelve failures spread over the last hour, two an hour-minute apart: few per minute.
        for n in 0..12 {
            fill(&history, &clock, start - HOUR + n * 5 * 60_000, 1, 1);
        }
        // A minute into the new hour, one more failure.
        fill(&history, &clock, start + 30_000, 1, 1);
        let prediction = history.with(|recorded| predict(recorded, &clock, start + 40_000));
        assert_eq!(prediction.recent.window, Window::SinceLastHour);
        assert_eq!(prediction.failure, Some(1.0));
        let (_, cause) = target(&prediction, 0);
        assert_eq!(
            reason(&prediction, cause, &clock, 0),
            "failure rate 100 % of 13 attempts this hour and the one before"
        );
    }

    #[test]
    fn change_is_bounded_per_tick_and_never_below_the_floor() {
        assert_eq!(bounded_step(1000, 50), 500);
        assert_eq!(bounded_step(500, 50), 250);
        assert_eq!(bounded_step(60, 0), FLOOR);
        assert_eq!(bounded_step(50, 1000), 100);
        assert_eq!(bounded_step(800, 1000), 1000);
        assert_eq!(bounded_step(1000, 900), 900);
        let mut weight = FULL;
        let mut steps = 0;
        while weight > FLOOR {
            weight = bounded_step(weight, 0);
            steps += 1;
        }
        assert_eq!(steps, 5, "from full to the floor takes five ticks");
        let mut steps = 0;
        while weight < FULL {
            weight = bounded_step(weight, FULL);
            steps += 1;
        }
        assert_eq!(steps, 5, "and back to full five more");
    }

    #[test]
    fn a_slow_instance_is_weighed_by_its_latency() {
        let prediction = Prediction {
            failure: Some(0.0),
            p50_us: Some(50_000),
            pattern: None,
            recent: Recent {
                calls: 50,
                failures: 0,
                window: Window::LastMinute,
            },
        };
        let (target, cause) = target(&prediction, 5_000);
        assert_eq!(cause, Cause::Latency);
        assert_eq!(target, 600, "(2 × 5 ms + 20 ms) / 50 ms");
        assert_eq!(
            reason(&prediction, cause, &clock(), 5_000),
            "p50 latency 50 ms against 5.0 ms for the fastest instance"
        );
    }
}
