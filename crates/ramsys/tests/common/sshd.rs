//! An sshd of our own on 127.0.0.1 (and ::1 where the machine has it):
//! generated host and user keys and a config in a temp dir, for the tests
//! of `[USER@]HOST:PATH` endpoints (tests/ssh.rs, tests/archive.rs).

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::bin;

pub const SSHD: &str = "/usr/sbin/sshd";

/// An sshd on 127.0.0.1 with its own keys, killed on drop.
pub struct Sshd {
    pub child: Child,
    pub port: u16,
    pub dir: tempfile::TempDir,
    /// sshd's log lines, kept for failure messages.
    pub log: Arc<Mutex<Vec<String>>>,
}

pub fn keygen(path: &Path) {
    let o = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(path)
        .output()
        .expect("ssh-keygen");
    assert!(o.status.success(), "ssh-keygen: {o:?}");
}

/// Whether this machine has IPv6 loopback.
pub fn ipv6() -> bool {
    TcpListener::bind("[::1]:0").is_ok()
}

impl Sshd {
    /// None (with the reason printed) when this machine has no sshd.
    pub fn start() -> Option<Sshd> {
        if !Path::new(SSHD).exists() {
            eprintln!("skipping: {SSHD} not installed (scripts/install-deps.sh installs it)");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        keygen(&d.join("host_key"));
        keygen(&d.join("user_key"));
        keygen(&d.join("other_key"));
        std::fs::copy(d.join("user_key.pub"), d.join("authorized_keys")).unwrap();
        // sshd's privilege-separation directory (Debian's sshd needs it).
        let _ = std::fs::create_dir_all("/run/sshd");
        for _ in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let cfg = d.join("sshd_config");
            std::fs::write(
                &cfg,
                format!(
                    "Port {port}\nListenAddress 127.0.0.1\nHostKey {hk}\n\
                     AuthorizedKeysFile {ak}\nStrictModes no\nUsePAM no\n\
                     PermitRootLogin yes\nPasswordAuthentication no\n\
                     KbdInteractiveAuthentication no\nPidFile none\n\
                     MaxStartups 100\nLogLevel VERBOSE\nAcceptEnv XDG_CACHE_HOME\n{v6}",
                    hk = d.join("host_key").display(),
                    ak = d.join("authorized_keys").display(),
                    v6 = if ipv6() { "ListenAddress ::1\n" } else { "" },
                ),
            )
            .unwrap();
            let mut child = Command::new(SSHD)
                .args(["-D", "-e", "-f"])
                .arg(&cfg)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start sshd");
            let (tx, rx) = std::sync::mpsc::channel();
            let log = Arc::new(Mutex::new(Vec::new()));
            let l2 = log.clone();
            let err = child.stderr.take().unwrap();
            // Keep draining sshd's log so it never blocks on a full pipe.
            std::thread::spawn(move || {
                for line in BufReader::new(err).lines() {
                    let Ok(line) = line else { break };
                    if line.contains("Server listening") {
                        let _ = tx.send(true);
                    }
                    l2.lock().unwrap().push(line);
                }
                let _ = tx.send(false);
            });
            if rx.recv_timeout(Duration::from_secs(20)) == Ok(true) {
                return Some(Sshd {
                    child,
                    port,
                    dir,
                    log,
                });
            }
            let _ = child.kill();
            let _ = child.wait();
            eprintln!(
                "sshd on port {port} did not start: {:?}",
                log.lock().unwrap()
            );
        }
        panic!("could not start sshd");
    }

    pub fn key(&self) -> PathBuf {
        self.dir.path().join("user_key")
    }

    /// The ssh options every test passes, with `identity` and `remote`.
    pub fn opts_with(&self, identity: &Path, remote: &str) -> Vec<String> {
        vec![
            "--ssh-port".into(),
            self.port.to_string(),
            "-i".into(),
            identity.display().to_string(),
            "--ssh-opt".into(),
            "StrictHostKeyChecking=no".into(),
            "--ssh-opt".into(),
            "UserKnownHostsFile=/dev/null".into(),
            "--ssh-opt".into(),
            "BatchMode=yes".into(),
            "--remote-ramsys".into(),
            remote.into(),
        ]
    }

    pub fn opts(&self) -> Vec<String> {
        self.opts_with(&self.key(), bin())
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
