//! `acl.yaml` hot reload when the file is a Kubernetes ConfigMap volume.
//!
//! The kubelet never writes a mounted ConfigMap file in place. It lays the
//! volume out as
//!
//! ```text
//! dir/..2026_12_01_10_00_00.000000001/acl.yaml   the real file
//! dir/..data -> ..2026_12_01_10_00_00.000000001  one symlink to swap
//! dir/acl.yaml -> ..data/acl.yaml                what the service is told to read
//! ```
//!
//! and publishes an update by writing a new timestamped directory, pointing a
//! fresh `..data_tmp` symlink at it, renaming that over `..data` (one atomic
//! step) and deleting the old directory. A watcher keyed on the old file's
//! inode, or one that only looks for writes to `dir/acl.yaml`, misses that.
//! These tests do exactly what the kubelet does and poll (bounded) until the
//! service's policy follows.

#![cfg(unix)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use agent_reach_access::AclHandle;

const FIRST: &str = "version: 1\npermissions:\n  - caller: alice\n    allow: [order.query]\n";
const SECOND: &str = "version: 1\npermissions:\n  - caller: bob\n    allow: [order.query]\n";
const BROKEN: &str = "version: 1\npermissions: {not yaml";

/// How long a published change may take to apply: a few reload intervals.
const APPLY_WITHIN: Duration = Duration::from_secs(5);

/// A directory laid out like a mounted ConfigMap, updated like the kubelet does.
struct ConfigMapVolume {
    dir: tempfile::TempDir,
    current: Option<PathBuf>,
    generation: u32,
}

impl ConfigMapVolume {
    fn new(acl: &str) -> Self {
        let mut volume = Self {
            dir: tempfile::tempdir().unwrap(),
            current: None,
            generation: 0,
        };
        volume.publish(acl);
        std::os::unix::fs::symlink("..data/acl.yaml", volume.dir.path().join("acl.yaml")).unwrap();
        volume
    }

    /// The path a service is given (`--acl dir/acl.yaml`).
    fn acl_path(&self) -> PathBuf {
        self.dir.path().join("acl.yaml")
    }

    /// The kubelet's update: new timestamped dir, `..data_tmp` → it, rename
    /// over `..data`, remove the old dir.
    fn publish(&mut self, acl: &str) {
        self.generation += 1;
        let name = format!("..2026_12_01_10_00_{:02}.{:09}", self.generation, self.generation);
        let fresh = self.dir.path().join(&name);
        std::fs::create_dir(&fresh).unwrap();
        std::fs::write(fresh.join("acl.yaml"), acl).unwrap();
        let tmp = self.dir.path().join("..data_tmp");
        std::os::unix::fs::symlink(&name, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.path().join("..data")).unwrap();
        if let Some(old) = self.current.replace(fresh) {
            std::fs::remove_dir_all(old).unwrap();
        }
    }

    fn data_target(&self) -> PathBuf {
        std::fs::read_link(self.dir.path().join("..data")).unwrap()
    }
}

async fn wait_for(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + APPLY_WITHIN;
    while !condition() {
        assert!(tokio::time::Instant::now() < deadline, "{what} within {APPLY_WITHIN:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn metric(registry: &prometheus::Registry, line: &str) -> bool {
    prometheus::TextEncoder::new()
        .encode_to_string(&registry.gather())
        .unwrap()
        .lines()
        .any(|candidate| candidate == line)
}

fn assert_symlink(path: &Path) {
    assert!(
        std::fs::symlink_metadata(path).unwrap().file_type().is_symlink(),
        "{} must stay a symlink, as in a ConfigMap volume",
        path.display()
    );
}

#[tokio::test]
async fn reload_follows_the_configmap_symlink_flip() {
    let mut volume = ConfigMapVolume::new(FIRST);
    let metrics = prometheus::Registry::new();
    let handle = AclHandle::load_and_watch(&volume.acl_path(), &metrics).unwrap();
    assert!(handle.current().may_call("alice", "order.query"));
    assert!(!handle.current().may_call("bob", "order.query"));

    let before = volume.data_target();
    volume.publish(SECOND);
    assert_ne!(volume.data_target(), before, "..data now points at the new directory");
    assert_symlink(&volume.acl_path());
    wait_for("the flipped policy applies", || {
        handle.current().may_call("bob", "order.query")
    })
    .await;
    assert!(
        !handle.current().may_call("alice", "order.query"),
        "the old policy is gone"
    );
    assert!(metric(&metrics, "agent_reach_acl_reloads_total{outcome=\"ok\"} 1"));

    // And again: the watcher does not hold on to the first flip's directory.
    volume.publish(FIRST);
    wait_for("a second flip applies", || {
        handle.current().may_call("alice", "order.query")
    })
    .await;
    assert!(!handle.current().may_call("bob", "order.query"));
}

#[tokio::test]
async fn a_broken_configmap_update_keeps_the_last_good_policy() {
    let mut volume = ConfigMapVolume::new(FIRST);
    let metrics = prometheus::Registry::new();
    let handle = AclHandle::load_and_watch(&volume.acl_path(), &metrics).unwrap();

    volume.publish(BROKEN);
    wait_for("the broken update is reported", || {
        metric(&metrics, "agent_reach_acl_file_valid 0")
    })
    .await;
    assert!(metric(&metrics, "agent_reach_acl_reloads_total{outcome=\"error\"} 1"));
    assert!(
        handle.current().may_call("alice", "order.query"),
        "the last good policy stays in force"
    );

    // The fix, published the same way, applies and clears the alarm.
    volume.publish(SECOND);
    wait_for("the fixed policy applies", || {
        handle.current().may_call("bob", "order.query")
    })
    .await;
    assert!(metric(&metrics, "agent_reach_acl_file_valid 1"));
    assert!(!handle.current().may_call("alice", "order.query"));
}
