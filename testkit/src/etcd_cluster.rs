//! A 3-member etcd cluster on loopback (three real processes), for tests of
//! member and leader loss. Each member can be killed (SIGKILL) and started
//! again on its ports and data.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::{exchange, find_binary, free_port, tail, wait_until, Guard, START_TIMEOUT};

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    process: Option<Guard>,
}

/// Three etcd members forming one cluster. Killed on drop; data dirs removed.
pub struct EtcdCluster {
    members: Vec<Member>,
    binary: PathBuf,
    dir: tempfile::TempDir,
}

impl EtcdCluster {
    /// Starts three members and waits until every one reports healthy (a
    /// leader is elected).
    pub fn start() -> Self {
        let binary = find_binary("etcd", "etcd-server");
        let mut last_log = String::new();
        for _ in 0..5 {
            let dir = tempfile::Builder::new()
                .prefix("agent-reach-etcd-cluster-")
                .tempdir()
                .unwrap_or_else(|error| panic!("cannot create a temp dir for etcd: {error}"));
            let members = (0..3)
                .map(|index| Member {
                    name: format!("member{index}"),
                    client_port: free_port(),
                    peer_port: free_port(),
                    process: None,
                })
                .collect();
            let mut cluster = Self {
                members,
                binary: binary.clone(),
                dir,
            };
            let spawned = (0..3)
                .map(|index| cluster.spawn(index))
                .collect::<Result<Vec<()>, String>>();
            match spawned.and_then(|_| cluster.wait_healthy()) {
                Ok(()) => return cluster,
                Err(log) => last_log = log,
            }
        }
        panic!("the etcd cluster did not become healthy; last log lines:\n{last_log}");
    }

    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|member| format!("{}=http://127.0.0.1:{}", member.name, member.peer_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn log(&self, index: usize) -> PathBuf {
        self.dir.path().join(format!("{}.log", self.members[index].name))
    }

    fn spawn(&mut self, index: usize) -> Result<(), String> {
        let initial_cluster = self.initial_cluster();
        let log = self.log(index);
        let member = &self.members[index];
        let data = self.dir.path().join(format!("data-{}", member.name));
        let client = format!("http://127.0.0.1:{}", member.client_port);
        let peer = format!("http://127.0.0.1:{}", member.peer_port);
        let mut command = Command::new(&self.binary);
        command
            .arg(format!("--name={}", member.name))
            .arg(format!("--data-dir={}", data.display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster={initial_cluster}"))
            .arg("--initial-cluster-token=agent-reach-testkit")
            .arg("--initial-cluster-state=new")
            .arg("--log-level=warn")
            // etcd's defaults: what an operator runs, elections in about 1 s.
            .arg("--heartbeat-interval=100")
            .arg("--election-timeout=1000")
            .env("ETCD_UNSUPPORTED_ARCH", std::env::consts::ARCH);
        let guard = Guard::spawn(&mut command, &log).map_err(|error| error.to_string())?;
        self.members[index].process = Some(guard);
        Ok(())
    }

    /// Waits until every running member answers `/health` true.
    fn wait_healthy(&mut self) -> Result<(), String> {
        let running: Vec<usize> = (0..3).filter(|index| self.members[*index].process.is_some()).collect();
        let mut exited = None;
        let healthy = wait_until(START_TIMEOUT, || {
            for index in &running {
                if let Some(process) = self.members[*index].process.as_mut() {
                    if process.exited().is_some() {
                        exited = Some(*index);
                        return true;
                    }
                }
            }
            running.iter().all(|index| self.healthy(*index))
        });
        if let Some(index) = exited {
            return Err(tail(&self.log(index)));
        }
        if !healthy {
            return Err(running
                .iter()
                .map(|index| tail(&self.log(*index)))
                .collect::<Vec<_>>()
                .join("\n---\n"));
        }
        Ok(())
    }

    fn addr(&self, index: usize) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.members[index].client_port))
    }

    /// Whether member `index` answers `/health` true (it sees a leader).
    pub fn healthy(&self, index: usize) -> bool {
        exchange(self.addr(index), b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .is_some_and(|answer| answer.contains("\"health\":\"true\""))
    }

    /// Every member's client URL, in member order.
    pub fn endpoints(&self) -> Vec<String> {
        (0..3).map(|index| self.endpoint(index)).collect()
    }

    /// Member `index`'s process id while it runs (benches read its CPU time and memory from /proc).
    pub fn pid(&self, index: usize) -> Option<u32> {
        self.members[index].process.as_ref().map(|process| process.child.id())
    }

    /// `http://127.0.0.1:PORT` of member `index`.
    pub fn endpoint(&self, index: usize) -> String {
        format!("http://127.0.0.1:{}", self.members[index].client_port)
    }

    /// The index of the member that is leader now, as the running members
    /// report it (etcd's JSON gateway, `/v3/maintenance/status`).
    pub fn leader(&self) -> Option<usize> {
        for index in 0..3 {
            if self.members[index].process.is_none() {
                continue;
            }
            let body = "{}";
            let request = format!(
                "POST /v3/maintenance/status HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            let Some(answer) = read_to_close(self.addr(index), request.as_bytes()) else {
                continue;
            };
            let (Some(member), Some(leader)) = (json_field(&answer, "member_id"), json_field(&answer, "leader")) else {
                continue;
            };
            if member == leader {
                return Some(index);
            }
        }
        None
    }

    /// Kills member `index` (SIGKILL), keeping its data for [`EtcdCluster::restart`].
    pub fn kill(&mut self, index: usize) {
        if let Some(mut process) = self.members[index].process.take() {
            process.kill();
        }
    }

    /// Starts member `index` again on its ports and data, and waits until it is healthy.
    pub fn restart(&mut self, index: usize) {
        self.kill(index);
        if let Err(log) = self.spawn(index).and_then(|_| self.wait_healthy()) {
            panic!("etcd member {index} did not come back; last log lines:\n{log}");
        }
    }

    /// The directory holding the members' logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// Sends `request` and reads until the peer closes (HTTP/1.0).
fn read_to_close(addr: SocketAddr, request: &[u8]) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()?;
    stream.set_read_timeout(Some(Duration::from_millis(1000))).ok()?;
    stream.write_all(request).ok()?;
    let mut out = String::new();
    stream.read_to_string(&mut out).ok()?;
    Some(out)
}

/// The string value of `"field":"…"` in a flat JSON answer (etcd's gateway
/// writes 64-bit ids as strings).
fn json_field(text: &str, field: &str) -> Option<String> {
    let key = format!("\"{field}\":\"");
    let start = text.find(&key)? + key.len();
    let end = text[start..].find('"')?;
    Some(text[start..start + end].to_string())
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for index in 0..3 {
            self.kill(index);
        }
    }
}
