//! Network namespaces joined by veth pairs, for the tests and benches of
//! raw channels (issue 18: two namespaces joined by veth pairs, a third
//! one forging frames). Created with iproute2 and deleted on drop; code
//! runs inside a namespace on a scoped thread that setns(2)es into it, and
//! the sockets it opens stay in that namespace when used from elsewhere.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::process::Command;

fn run_ip(args: &[&str]) -> io::Result<()> {
    let out = Command::new("ip").args(args).output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// A named network namespace, deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    /// Create a namespace (its loopback up). A unique name per process is
    /// the caller's: tests use their pid.
    pub fn create(name: &str) -> io::Result<Netns> {
        let _ = run_ip(&["netns", "del", name]);
        run_ip(&["netns", "add", name])?;
        let ns = Netns {
            name: name.to_string(),
        };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// `ip -n NAME args...`
    pub fn ip(&self, args: &[&str]) -> io::Result<()> {
        let mut v = vec!["-n", self.name.as_str()];
        v.extend_from_slice(args);
        run_ip(&v)
    }

    /// Run `f` on a thread inside the namespace.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> io::Result<T> {
        let file = File::open(format!("/run/netns/{}", self.name))?;
        std::thread::scope(|s| {
            s.spawn(|| {
                // SAFETY: setns on a namespace file we opened; it changes
                // only this (scoped) thread's network namespace.
                if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(f())
            })
            .join()
            .map_err(|_| io::Error::other("namespace thread panicked"))?
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = run_ip(&["netns", "del", &self.name]);
    }
}

/// A veth pair: `an` in `a`, `bn` in `b`, both up with `mtu`.
pub fn veth(a: &Netns, an: &str, b: &Netns, bn: &str, mtu: usize) -> io::Result<()> {
    run_ip(&[
        "link", "add", an, "netns", &a.name, "type", "veth", "peer", "name", bn, "netns", &b.name,
    ])?;
    let m = mtu.to_string();
    for (ns, n) in [(a, an), (b, bn)] {
        ns.ip(&["link", "set", n, "mtu", &m, "up"])?;
    }
    // Carrier comes up a moment after both ends are: wait for it so the
    // first frames are not lost to a link still coming up.
    for (ns, n) in [(a, an), (b, bn)] {
        for _ in 0..200 {
            let out = Command::new("ip")
                .args(["-n", &ns.name, "link", "show", "dev", n])
                .output()?;
            if String::from_utf8_lossy(&out.stdout).contains("LOWER_UP") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
    Ok(())
}

/// Why namespace tests cannot run here, if they cannot (not root, no
/// iproute2, no CAP_SYS_ADMIN).
///
/// Probed once per process: tests run in parallel, and probes under one
/// name raced (one test's `netns del` removed another's probe, which then
/// skipped with "File exists").
pub fn unavailable() -> Option<String> {
    static PROBED: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    PROBED.get_or_init(probe).clone()
}

fn probe() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root (network namespaces need CAP_SYS_ADMIN)".into());
    }
    let probe = format!("rawnet-probe-{}", std::process::id());
    match Netns::create(&probe) {
        Ok(_) => None,
        Err(e) => Some(format!("cannot create a network namespace: {e}")),
    }
}
