//! A process that ends with its test, children and all: started in a process
//! group of its own, killed as a group when dropped (pass or fail), and
//! anything that left the group but still names the test's `marker` (a
//! temp dir it was given, say) found in `/proc` and killed too. Killing a
//! parent alone is not enough for programs that start others: chromedriver
//! leaves the Chromium it started (and its helpers) running.

use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// A spawned process group.
pub struct ProcessGroup {
    child: Child,
    marker: Option<String>,
}

impl ProcessGroup {
    /// Spawns `command` as the leader of a new process group. `marker`, when
    /// given, is text every process of the group has on its command line (a
    /// profile directory, a port): processes that moved to another group or
    /// session are found by it.
    pub fn spawn(command: &mut Command, marker: Option<&str>) -> std::io::Result<Self> {
        let child = command.process_group(0).spawn()?;
        Ok(Self {
            child,
            marker: marker.map(str::to_string),
        })
    }

    /// Whether the group's leader has exited.
    pub fn exited(&mut self) -> bool {
        self.child.try_wait().ok().flatten().is_some()
    }

    /// The group leader's pid (the group's id).
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The pids of every running process whose command line holds `marker`.
    pub fn processes_marked(marker: &str) -> Vec<i32> {
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        let own = std::process::id();
        entries
            .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| u32::try_from(*pid).is_ok_and(|pid| pid != own))
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains(marker))
            })
            // A zombie (already dead, not yet reaped by its parent) holds nothing.
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .map(|stat| {
                        stat.rsplit(')')
                            .next()
                            .map(str::trim_start)
                            .is_some_and(|rest| !rest.starts_with('Z'))
                    })
                    .unwrap_or(false)
            })
            .collect()
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        if let Ok(group) = libc::pid_t::try_from(self.child.id()) {
            // SAFETY: killpg(2) on the group this guard created (its leader is our child, not yet reaped).
            unsafe { libc::killpg(group, libc::SIGKILL) };
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let Some(marker) = &self.marker else { return };
        // Whatever left the group: killed by its mark, until none is left (bounded).
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = Self::processes_marked(marker);
            if left.is_empty() || Instant::now() >= deadline {
                return;
            }
            for pid in left {
                // SAFETY: kill(2) on a process that names this test's own marker.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
