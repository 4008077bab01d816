//! Hot reload, once for every file a service follows (the ACL, the tenant
//! map, listener TLS files, the assertion keys): poll the files, and when
//! their bytes changed, parse them and apply the result; an edit that does
//! not parse, or files that cannot be read, keep the last good value, and
//! each is logged once (until the files change again).
//!
//! The owner of the value ([`Follow`]) says how to parse and apply; the loop
//! ([`Reload::spawn`]) holds it weakly and stops once the owner is gone.

use std::path::PathBuf;
use std::sync::Weak;
use std::time::Duration;

/// What a followed set of files feeds.
pub trait Follow: Send + Sync + 'static {
    /// What the files parse into.
    type Value: Send;

    /// Parses the files' contents (one per path, in the order given);
    /// `Err` names every problem, and the last good value stays.
    fn parse(&self, contents: &[Vec<u8>]) -> Result<Self::Value, String>;

    /// Applies a parsed value; answers whether it changed anything (only
    /// then is the reload logged: an edit of comments is not news).
    fn apply(&self, value: Self::Value) -> bool;

    /// Each outcome of a look at changed files (the owner's metrics).
    fn observe(&self, outcome: Outcome) {
        let _ = outcome;
    }
}

/// What a look at changed files came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Parsed and applied.
    Applied,
    /// Changed, but they do not parse: the last good value stays.
    Rejected,
    /// They cannot be read: the last good value stays.
    Unreadable,
}

/// Files to follow: what they are (for logs, e.g. `"ACL"`), where, how often.
#[derive(Debug, Clone)]
pub struct Reload {
    pub what: &'static str,
    pub paths: Vec<PathBuf>,
    pub every: Duration,
}

/// Where a followed set of files is: what was last read (compared with the
/// next read), and whether the files were unreadable at the last look.
#[derive(Debug, Default)]
pub struct Seen {
    last: Option<Vec<Vec<u8>>>,
}

impl Seen {
    /// Files whose current contents were read (and applied) when the owner was built.
    pub fn applied(contents: Vec<Vec<u8>>) -> Self {
        Self { last: Some(contents) }
    }
}

impl Reload {
    /// The files' contents, in order.
    pub fn read(&self) -> std::io::Result<Vec<Vec<u8>>> {
        self.paths.iter().map(std::fs::read).collect()
    }

    /// Looks at the files once: `None` when nothing changed since `seen`.
    pub fn check<F: Follow>(&self, owner: &F, seen: &mut Seen) -> Option<Outcome> {
        let paths = self.shown();
        let contents = match self.read() {
            Ok(contents) => contents,
            Err(error) => {
                // Logged once: the next readable contents are applied, whatever they are.
                seen.last.take()?;
                tracing::error!(
                    message = "File unreadable; keeping the last good value.",
                    what = self.what, paths = %paths, %error
                );
                owner.observe(Outcome::Unreadable);
                return Some(Outcome::Unreadable);
            }
        };
        if seen.last.as_ref() == Some(&contents) {
            return None;
        }
        let parsed = owner.parse(&contents);
        seen.last = Some(contents);
        let outcome = match parsed {
            Ok(value) => {
                if owner.apply(value) {
                    tracing::info!(message = "File reloaded.", what = self.what, paths = %paths);
                }
                Outcome::Applied
            }
            Err(problems) => {
                tracing::error!(
                    message = "File edit rejected; keeping the last good value.",
                    what = self.what, paths = %paths, %problems
                );
                Outcome::Rejected
            }
        };
        owner.observe(outcome);
        Some(outcome)
    }

    /// Looks at the files every `every` until `owner` is dropped, starting
    /// from `seen` (what the owner was built from).
    pub fn spawn<F: Follow>(self, owner: Weak<F>, mut seen: Seen) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(self.every);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // The first tick is immediate: the owner was just built from the files.
            ticker.tick().await;
            loop {
                ticker.tick().await;
                let Some(owner) = owner.upgrade() else {
                    return;
                };
                // The files are small and local (as every reload before this one read them).
                self.check(&*owner, &mut seen);
            }
        })
    }

    fn shown(&self) -> String {
        let names: Vec<String> = self.paths.iter().map(|path| path.display().to_string()).collect();
        names.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    use super::*;

    /// Follows a file holding a number.
    #[derive(Default)]
    struct Number {
        value: Mutex<u32>,
        outcomes: Mutex<Vec<Outcome>>,
        applied: AtomicUsize,
    }

    impl Follow for Number {
        type Value = u32;

        fn parse(&self, contents: &[Vec<u8>]) -> Result<u32, String> {
            let text = std::str::from_utf8(&contents[0]).map_err(|error| error.to_string())?;
            text.trim().parse().map_err(|error| format!("`{text}`: {error}"))
        }

        fn apply(&self, value: u32) -> bool {
            self.applied.fetch_add(1, Ordering::SeqCst);
            let mut current = self.value.lock().unwrap();
            let changed = *current != value;
            *current = value;
            changed
        }

        fn observe(&self, outcome: Outcome) {
            self.outcomes.lock().unwrap().push(outcome);
        }
    }

    #[test]
    fn changes_apply_broken_edits_and_lost_files_keep_the_last_good_value() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("n");
        std::fs::write(&path, "1").unwrap();
        let reload = Reload {
            what: "number",
            paths: vec![path.clone()],
            every: Duration::from_secs(1),
        };
        let owner = Number::default();
        let mut seen = Seen::applied(reload.read().unwrap());
        assert_eq!(reload.check(&owner, &mut seen), None, "unchanged: nothing to do");
        std::fs::write(&path, "2").unwrap();
        assert_eq!(reload.check(&owner, &mut seen), Some(Outcome::Applied));
        assert_eq!(*owner.value.lock().unwrap(), 2);
        std::fs::write(&path, "two").unwrap();
        assert_eq!(reload.check(&owner, &mut seen), Some(Outcome::Rejected));
        assert_eq!(reload.check(&owner, &mut seen), None, "a broken edit is reported once");
        assert_eq!(*owner.value.lock().unwrap(), 2, "the last good value stays");
        std::fs::remove_file(&path).unwrap();
        assert_eq!(reload.check(&owner, &mut seen), Some(Outcome::Unreadable));
        assert_eq!(reload.check(&owner, &mut seen), None, "a lost file is reported once");
        // Back with the contents it had before it went: applied again.
        std::fs::write(&path, "2").unwrap();
        assert_eq!(reload.check(&owner, &mut seen), Some(Outcome::Applied));
        assert_eq!(owner.applied.load(Ordering::SeqCst), 2);
        assert_eq!(
            *owner.outcomes.lock().unwrap(),
            [
                Outcome::Applied,
                Outcome::Rejected,
                Outcome::Unreadable,
                Outcome::Applied
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_loop_follows_until_the_owner_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("n");
        std::fs::write(&path, "1").unwrap();
        let reload = Reload {
            what: "number",
            paths: vec![path.clone()],
            every: Duration::from_millis(100),
        };
        let owner = Arc::new(Number::default());
        let seen = Seen::applied(reload.read().unwrap());
        let task = reload.spawn(Arc::downgrade(&owner), seen);
        std::fs::write(&path, "7").unwrap();
        for _ in 0..100 {
            if *owner.value.lock().unwrap() == 7 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(*owner.value.lock().unwrap(), 7);
        drop(owner);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap();
    }
}
