//! Redis with a replica and three Sentinels on loopback (five real
//! processes), for tests of primary loss and Sentinel failover. The primary
//! can be killed (SIGKILL); the Sentinels then promote the replica.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::{find_binary, free_port, tail, wait_until, Guard, START_TIMEOUT};

/// The Sentinels' name for the monitored primary.
pub const SERVICE: &str = "agentreach";

struct Node {
    port: u16,
    process: Option<Guard>,
}

/// A primary, one replica and three Sentinels monitoring them (quorum 2).
/// Killed on drop; their directories are removed.
pub struct RedisSentinels {
    servers: Vec<Node>,
    sentinels: Vec<Node>,
    binary: PathBuf,
    dir: tempfile::TempDir,
}

impl RedisSentinels {
    /// Starts the primary, the replica and the Sentinels, and waits until
    /// every Sentinel knows the replica and the two other Sentinels (so a
    /// failover can happen).
    pub fn start() -> Self {
        let binary = find_binary("redis-server", "redis-server");
        let mut last_log = String::new();
        for _ in 0..3 {
            let dir = tempfile::Builder::new()
                .prefix("agent-reach-redis-ha-")
                .tempdir()
                .unwrap_or_else(|error| panic!("cannot create a temp dir for redis: {error}"));
            let mut set = Self {
                servers: (0..2)
                    .map(|_| Node {
                        port: free_port(),
                        process: None,
                    })
                    .collect(),
                sentinels: (0..3)
                    .map(|_| Node {
                        port: free_port(),
                        process: None,
                    })
                    .collect(),
                binary: binary.clone(),
                dir,
            };
            match set.launch() {
                Ok(()) => return set,
                Err(log) => last_log = log,
            }
        }
        panic!("Redis with Sentinels did not come up; last log lines:\n{last_log}");
    }

    fn launch(&mut self) -> Result<(), String> {
        let primary = self.servers[0].port;
        self.spawn_server(0, None)?;
        self.spawn_server(1, Some(primary))?;
        for index in 0..3 {
            let port = self.sentinels[index].port;
            let config = self.dir.path().join(format!("sentinel-{index}.conf"));
            let text = format!(
                "port {port}\nbind 127.0.0.1\ndir {}\n\
                 sentinel monitor {SERVICE} 127.0.0.1 {primary} 2\n\
                 sentinel down-after-milliseconds {SERVICE} 1000\n\
                 sentinel failover-timeout {SERVICE} 10000\n\
                 sentinel parallel-syncs {SERVICE} 1\n",
                self.dir.path().display()
            );
            std::fs::write(&config, text).map_err(|error| error.to_string())?;
            let log = self.dir.path().join(format!("sentinel-{index}.log"));
            let mut command = Command::new(&self.binary);
            command.arg(&config).arg("--sentinel");
            self.sentinels[index].process = Some(Guard::spawn(&mut command, &log).map_err(|error| error.to_string())?);
        }
        let replica = SocketAddr::from(([127, 0, 0, 1], self.servers[1].port));
        let ready = wait_until(START_TIMEOUT, || {
            // The replica has finished its first sync (ROLE: slave ... connected) ...
            command(replica, "ROLE").is_some_and(|answer| answer.contains("connected"))
            // ... and every Sentinel knows it and the two others.
            && (0..3).all(|index| {
                let Some(answer) = command(self.sentinel_addr(index), &format!("SENTINEL master {SERVICE}")) else {
                    return false;
                };
                field(&answer, "num-slaves").as_deref() == Some("1")
                    && field(&answer, "num-other-sentinels").as_deref() == Some("2")
            })
        });
        if !ready {
            return Err(tail(&self.dir.path().join("sentinel-0.log")));
        }
        Ok(())
    }

    fn spawn_server(&mut self, index: usize, replica_of: Option<u16>) -> Result<(), String> {
        let port = self.servers[index].port;
        let data = self.dir.path().join(format!("redis-{index}"));
        std::fs::create_dir_all(&data).map_err(|error| error.to_string())?;
        let log = self.dir.path().join(format!("redis-{index}.log"));
        let mut command = Command::new(&self.binary);
        command
            .arg("--port")
            .arg(port.to_string())
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--dir")
            .arg(&data)
            .arg("--save")
            .arg("")
            .arg("--appendonly")
            .arg("yes")
            .arg("--appendfsync")
            .arg("everysec");
        if let Some(primary) = replica_of {
            command.arg("--replicaof").arg("127.0.0.1").arg(primary.to_string());
        }
        let mut guard = Guard::spawn(&mut command, &log).map_err(|error| error.to_string())?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let up = wait_until(START_TIMEOUT, || {
            guard.exited().is_some() || command_ok(addr, "PING", "+PONG")
        });
        if guard.exited().is_some() || !up {
            return Err(tail(&log));
        }
        self.servers[index].process = Some(guard);
        Ok(())
    }

    fn sentinel_addr(&self, index: usize) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.sentinels[index].port))
    }

    /// `redis+sentinel://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3/agentreach`
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port))
            .collect();
        format!("redis+sentinel://{}/{SERVICE}", hosts.join(","))
    }

    /// The data nodes' ports: the first started as primary, the second as its replica.
    pub fn server_ports(&self) -> [u16; 2] {
        [self.servers[0].port, self.servers[1].port]
    }

    /// The port of the primary as the first answering Sentinel names it.
    pub fn primary_port(&self) -> Option<u16> {
        (0..3).find_map(|index| {
            let answer = command(
                self.sentinel_addr(index),
                &format!("SENTINEL get-master-addr-by-name {SERVICE}"),
            )?;
            // *2\r\n$9\r\n127.0.0.1\r\n$5\r\n63790\r\n
            answer.lines().nth(4).and_then(|port| port.trim().parse().ok())
        })
    }

    /// `ROLE` of the data node on `port`: `master` or `slave`.
    pub fn role(&self, port: u16) -> Option<String> {
        let answer = command(SocketAddr::from(([127, 0, 0, 1], port)), "ROLE")?;
        answer.lines().nth(2).map(|role| role.trim().to_string())
    }

    /// Waits (at most 10 s) until the replica on `replica` has every write the
    /// primary on `primary` had when called: its replication offset reaches
    /// the primary's. Replication is asynchronous, so a test that kills the
    /// primary right after a write must wait for this to expect the write to
    /// survive.
    pub fn wait_replicated(&self, primary: u16, replica: u16) -> bool {
        let offset = |port: u16, name: &str| {
            command(SocketAddr::from(([127, 0, 0, 1], port)), "INFO replication").and_then(|answer| {
                answer
                    .lines()
                    .find_map(|line| line.strip_prefix(name))
                    .and_then(|value| value.trim().parse::<u64>().ok())
            })
        };
        let Some(target) = offset(primary, "master_repl_offset:") else {
            return false;
        };
        wait_until(Duration::from_secs(10), || {
            offset(replica, "slave_repl_offset:").is_some_and(|reached| reached >= target)
        })
    }

    /// Kills the data node on `port` (SIGKILL).
    pub fn kill_server(&mut self, port: u16) {
        if let Some(node) = self.servers.iter_mut().find(|node| node.port == port) {
            if let Some(mut process) = node.process.take() {
                process.kill();
            }
        }
    }

    /// Freezes the data node on `port` (SIGSTOP): its connections stay open
    /// and nothing is answered, as with a hung host or a network partition.
    /// [`RedisSentinels::thaw_server`] resumes it; dropping still kills it.
    pub fn freeze_server(&self, port: u16) {
        self.signal_server(port, libc::SIGSTOP);
    }

    /// Lets a frozen data node run again (SIGCONT).
    pub fn thaw_server(&self, port: u16) {
        self.signal_server(port, libc::SIGCONT);
    }

    fn signal_server(&self, port: u16, signal: libc::c_int) {
        let Some(process) = self
            .servers
            .iter()
            .find(|node| node.port == port)
            .and_then(|node| node.process.as_ref())
        else {
            panic!("no running Redis on port {port}");
        };
        let pid = libc::pid_t::try_from(process.child.id()).unwrap_or_else(|_| panic!("pid out of range"));
        // SAFETY: kill(2) with a pid this guard spawned and has not reaped.
        if unsafe { libc::kill(pid, signal) } != 0 {
            panic!("cannot signal redis-server: {}", std::io::Error::last_os_error());
        }
    }

    /// Starts the data node on `port` again (as a replica of `primary`; the
    /// Sentinels would reconfigure it anyway), and waits until it answers.
    pub fn restart_server_as_replica(&mut self, port: u16, primary: u16) {
        let Some(index) = self.servers.iter().position(|node| node.port == port) else {
            panic!("no Redis on port {port}");
        };
        self.kill_server(port);
        if let Err(log) = self.spawn_server(index, Some(primary)) {
            panic!("redis-server did not come back; last log lines:\n{log}");
        }
    }

    /// The directory holding the logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for RedisSentinels {
    fn drop(&mut self) {
        for node in self.sentinels.iter_mut().chain(self.servers.iter_mut()) {
            if let Some(mut process) = node.process.take() {
                process.kill();
            }
        }
    }
}

/// Sends one inline command and returns what came back within 300 ms.
pub(crate) fn command(addr: SocketAddr, line: &str) -> Option<String> {
    send(addr, format!("{line}\r\n").as_bytes(), Duration::from_millis(300))
}

/// Sends one command as a RESP array (each argument a bulk string, so spaces
/// and quotes need no escaping) and returns the reply within `wait`.
pub(crate) fn call(addr: SocketAddr, args: &[&str], wait: Duration) -> Option<String> {
    let mut request = format!("*{}\r\n", args.len());
    for arg in args {
        request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    send(addr, request.as_bytes(), wait)
}

fn send(addr: SocketAddr, request: &[u8], wait: Duration) -> Option<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()?;
    stream.set_read_timeout(Some(wait)).ok()?;
    stream.write_all(request).ok()?;
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(read) => {
                out.extend_from_slice(&buf[..read]);
                if complete(&out) {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    String::from_utf8(out).ok().filter(|text| !text.is_empty())
}

/// Whether `answer` holds one complete RESP2 reply.
fn complete(answer: &[u8]) -> bool {
    reply_end(answer, 0).is_some()
}

/// Where the reply starting at `at` ends, `None` when more bytes are needed.
fn reply_end(input: &[u8], at: usize) -> Option<usize> {
    let line_end = at + input.get(at..)?.windows(2).position(|pair| pair == b"\r\n")?;
    let header = std::str::from_utf8(input.get(at + 1..line_end)?).ok()?;
    let next = line_end + 2;
    match input.get(at)? {
        b'$' => {
            let length: i64 = header.parse().ok()?;
            if length < 0 {
                return Some(next);
            }
            let end = next + usize::try_from(length).ok()? + 2;
            (input.len() >= end).then_some(end)
        }
        b'*' => {
            let count: i64 = header.parse().ok()?;
            let mut end = next;
            for _ in 0..count.max(0) {
                end = reply_end(input, end)?;
            }
            Some(end)
        }
        _ => Some(next),
    }
}

pub(crate) fn command_ok(addr: SocketAddr, line: &str, expected: &str) -> bool {
    command(addr, line).is_some_and(|answer| answer.starts_with(expected))
}

/// The value after `name` in a flat RESP array of names and values.
fn field(answer: &str, name: &str) -> Option<String> {
    let lines: Vec<&str> = answer.lines().collect();
    let at = lines.iter().position(|line| *line == name)?;
    lines.get(at + 2).map(|value| value.to_string())
}
