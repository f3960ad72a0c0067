//! Striped transfers (issue 19, docs/SITE.md "Striping"; GridFTP's striped
//! servers): `ramsys cp -r SRC ramsys://A,B,C/DST --stripe` splits one
//! transfer over every listed daemon that answers, each daemon receiving
//! its share of the files in a session of its own, all at once, into the
//! same DST on a file system they share. One summary for the whole.
//!
//! Shares are whole files (a big file's blocks are not split across
//! daemons): the agent lists the sources' regular files and deals them
//! out largest first to the share that would finish first with it (LPT
//! scheduling, within 4/3 of the best split), each daemon's share sized
//! by its load in the site view (the scheduler reads site state), hard
//! links of one inode in one share (so they stay links); directories and every other entry go
//! to the first share. Each session is an ordinary push whose scan is
//! limited to its share by the `--files-from` selection (request::filter),
//! so a share's parent directories are created by whichever session gets
//! there first. A lost daemon fails its share only; running the same
//! command again with `--resume` over the daemons that answer sends what
//! is missing (the sinks compare with what DST holds).

use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ramsys_engine::client::{push, Remote};
use ramsys_engine::fsops::{Confinement, Root};
use ramsys_engine::request::walk::Top;
use ramsys_engine::resources::ResourceConfig;
use ramsys_engine::site::redirect::{score, FRESH_MS};
use ramsys_engine::stats::FailedPath;
use ramsys_engine::transport::tcp::Tcp;
use ramsys_engine::{EngineError, EngineResources, Report, Stats, TransferOptions};

/// One striped push, as the agent resolved it.
pub struct Job {
    /// The listed daemons (`A,B,C`).
    pub daemons: Vec<String>,
    pub dest: Vec<u8>,
    pub tops: Vec<Top>,
    pub opts: TransferOptions,
    pub res_cfg: ResourceConfig,
    pub connect_timeout: Duration,
    pub key: Vec<u8>,
}

/// What one daemon's share did, for the summary.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Stripe {
    pub daemon: String,
    /// Files and bytes of the share (planned).
    pub share_files: u64,
    pub share_bytes: u64,
    /// What the session reports it moved.
    pub files: u64,
    pub bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A path from the transfer root (the walk's wire name) and its size.
#[derive(Debug, Clone)]
struct Item {
    wire: Vec<u8>,
    size: u64,
    /// Hard links of one inode share this key (0: none).
    inode: (u64, u64),
}

/// Every entry below the tops, as the walk names them: regular files with
/// their sizes, everything else (directories, links, specials) with size 0
/// in `others`.
fn list(root: &Path, tops: &[Top]) -> anyhow::Result<(Vec<Item>, Vec<Vec<u8>>)> {
    let (mut files, mut others) = (Vec::new(), Vec::new());
    for t in tops {
        let path = root.join(std::ffi::OsStr::from_bytes(&t.rel));
        scan(&path, t.name.clone(), &mut files, &mut others)?;
    }
    Ok((files, others))
}

fn scan(
    path: &Path,
    wire: Vec<u8>,
    files: &mut Vec<Item>,
    others: &mut Vec<Vec<u8>>,
) -> anyhow::Result<()> {
    let md =
        std::fs::symlink_metadata(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    if md.is_file() {
        let inode = if md.nlink() > 1 {
            (md.dev(), md.ino())
        } else {
            (0, 0)
        };
        files.push(Item {
            wire,
            size: md.len(),
            inode,
        });
        return Ok(());
    }
    if !wire.is_empty() {
        others.push(wire.clone());
    }
    if md.is_dir() {
        let rd = std::fs::read_dir(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        for e in rd {
            let e = e.map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            let name = e.file_name();
            let w = if wire.is_empty() {
                name.as_bytes().to_vec()
            } else {
                [&wire[..], b"/", name.as_bytes()].concat()
            };
            scan(&e.path(), w, files, others)?;
        }
    }
    Ok(())
}

/// Bytes and paths moved as one (a file, or an inode's hard links).
type Unit = (u64, Vec<Vec<u8>>);
/// A share: its paths, files and bytes.
type Share = (Vec<Vec<u8>>, u64, u64);

/// Deal `files` into one share per weight: largest first onto the share
/// that would finish first with it (bytes / weight, ties: the lower
/// index), an inode's hard links together; `others` go to share 0.
/// Deterministic for a given tree and weights.
fn deal(mut files: Vec<Item>, others: Vec<Vec<u8>>, weights: &[f64]) -> Vec<Share> {
    // Group hard links: one unit per inode, sized once.
    let mut units: BTreeMap<(u64, u64), Unit> = BTreeMap::new();
    let mut singles = Vec::new();
    for f in files.drain(..) {
        if f.inode == (0, 0) {
            singles.push((f.size, vec![f.wire]));
        } else {
            let u = units.entry(f.inode).or_insert((f.size, vec![]));
            u.1.push(f.wire);
        }
    }
    let mut all: Vec<Unit> = singles.into_iter().chain(units.into_values()).collect();
    all.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    let n = weights.len().max(1);
    let w = |i: usize| weights.get(i).copied().unwrap_or(1.0).max(1e-3);
    let mut shares: Vec<Share> = vec![(vec![], 0, 0); n];
    shares[0].0 = others;
    for (size, paths) in all {
        let end = |i: usize| (shares[i].2 + size) as f64 / w(i);
        let i = (0..n)
            .min_by(|&a, &b| end(a).total_cmp(&end(b)).then(a.cmp(&b)))
            .expect("at least one share");
        shares[i].1 += paths.len() as u64;
        shares[i].2 += size;
        shares[i].0.extend(paths);
    }
    shares
}

/// The daemons of the list that answer a status query (one line for each
/// that does not), each with its weight: from the site view of the first
/// that answers, `1 / (1 + score)` (site::redirect::score: CPU load plus a
/// quarter per task), so a fully busy daemon gets half the bytes of an idle
/// one; 1 for a daemon that is not in that view (daemons outside a site).
fn answering(
    daemons: &[String],
    key: &[u8],
    timeout: Duration,
    json: bool,
) -> (Vec<String>, Vec<f64>) {
    let mut view = None;
    let up: Vec<String> = daemons
        .iter()
        .filter(|d| match crate::status::query(d, key, timeout) {
            Ok(st) => {
                view.get_or_insert(st.site);
                true
            }
            Err(e) => {
                if !json {
                    eprintln!("ramsys: {d} does not answer ({e:#}); striping without it");
                }
                false
            }
        })
        .cloned()
        .collect();
    let view = view.unwrap_or_default();
    let w = up
        .iter()
        .map(|d| {
            view.iter()
                .find(|m| &m.addr == d && m.age_ms <= FRESH_MS && m.error.is_none())
                .map_or(1.0, |m| 1.0 / (1.0 + score(m)))
        })
        .collect();
    (up, w)
}

/// Run the stripes; the merged report (a failed share is one failed
/// entry naming its daemon) and each stripe's outcome.
pub fn run(job: Job, json: bool) -> anyhow::Result<(Result<Report, EngineError>, Vec<Stripe>)> {
    let (daemons, weights) = answering(&job.daemons, &job.key, job.connect_timeout, json);
    anyhow::ensure!(
        !daemons.is_empty(),
        "none of the daemons {} answered",
        job.daemons.join(",")
    );
    let root = Path::new("/");
    let (files, others) = list(root, &job.tops)?;
    let shares = deal(files, others, &weights);
    let n = daemons.len();
    let res_cfg = ResourceConfig {
        // The agent's --memory, split between the stripes.
        memory: (job.res_cfg.memory / n).max(job.res_cfg.buffer_size * 8),
        ..job.res_cfg.clone()
    };
    let mut handles = Vec::new();
    for (daemon, (paths, nfiles, nbytes)) in daemons.iter().zip(shares) {
        if paths.is_empty() {
            continue; // more daemons than entries (an empty list selects all)
        }
        let mut opts = job.opts.clone();
        opts.select.files = paths;
        opts.select.files_recursive = false;
        let (daemon, key, tops, dest) = (
            daemon.clone(),
            job.key.clone(),
            job.tops.clone(),
            job.dest.clone(),
        );
        let (cfg, timeout) = (res_cfg.clone(), job.connect_timeout);
        let h = std::thread::Builder::new()
            .name("stripe".into())
            .spawn(move || {
                let r = one(&daemon, key, tops, dest, &opts, &cfg, timeout);
                (daemon, nfiles, nbytes, r)
            })?;
        handles.push(h);
    }
    let mut total: Option<Report> = None;
    let mut stripes = Vec::new();
    let mut first_err = None;
    for h in handles {
        let (daemon, share_files, share_bytes, r) = h.join().expect("stripe thread");
        let mut s = Stripe {
            daemon: daemon.clone(),
            share_files,
            share_bytes,
            files: 0,
            bytes: 0,
            error: None,
        };
        match r {
            Ok(rep) => {
                s.files = rep.files;
                s.bytes = rep.bytes;
                total = Some(match total.take() {
                    None => rep,
                    Some(t) => merge(t, rep),
                });
            }
            Err(e) => {
                s.error = Some(e.to_string());
                first_err.get_or_insert(e);
            }
        }
        stripes.push(s);
    }
    let result = match total {
        None => Err(first_err.expect("no stripe ran without an error")),
        Some(mut t) => {
            for s in stripes.iter().filter(|s| s.error.is_some()) {
                t.failed.push(FailedPath {
                    path: format!("(share of {}: {} files)", s.daemon, s.share_files),
                    reason: format!(
                        "{}; run again with --resume to finish",
                        s.error.as_deref().unwrap_or_default()
                    ),
                });
            }
            Ok(t)
        }
    };
    Ok((result, stripes))
}

/// One share: an ordinary push to `daemon` with the share's selection.
fn one(
    daemon: &str,
    key: Vec<u8>,
    tops: Vec<Top>,
    dest: Vec<u8>,
    opts: &TransferOptions,
    cfg: &ResourceConfig,
    timeout: Duration,
) -> Result<Report, EngineError> {
    let res = EngineResources::new(cfg).map_err(|e| EngineError::local(e.to_string()))?;
    let remote = Remote {
        transport: Arc::new(Tcp {
            socket_buffer: None,
        }),
        addr: daemon.to_string(),
        key,
        connect_timeout: timeout,
        user: None,
    };
    let root = Arc::new(
        Root::open(Path::new("/"), Confinement::None)
            .map_err(|e| EngineError::local(format!("cannot open /: {e}")))?,
    );
    let stats = Arc::new(Stats::default());
    let r = push(
        &remote,
        root.clone(),
        tops.clone(),
        dest.clone(),
        opts,
        &res,
        stats,
    );
    // A busy daemon may send its share to a peer (Control::Redirect):
    // follow it once, as a plain push does (crate::pick::follow).
    let Err(EngineError::Redirected { to, reason }) = r else {
        return r;
    };
    crate::pick::follow(None, daemon, &to, &reason).map_err(EngineError::Local)?;
    let remote = Remote { addr: to, ..remote };
    let mut opts = opts.clone();
    opts.redirected_from = Some(daemon.to_string());
    let stats = Arc::new(Stats::default());
    match push(&remote, root, tops, dest, &opts, &res, stats) {
        Err(EngineError::Redirected { to, reason }) => Err(EngineError::Local(
            crate::pick::follow(
                Some(&crate::pick::Redirect {
                    from: daemon.into(),
                    to: remote.addr.clone(),
                    reason: String::new(),
                }),
                &remote.addr,
                &to,
                &reason,
            )
            .expect_err("a second redirect is a chain"),
        )),
        r => r,
    }
}

/// One report for the whole transfer.
fn merge(mut a: Report, b: Report) -> Report {
    a.files += b.files;
    a.bytes += b.bytes;
    a.failed.extend(b.failed);
    a.peer_cpu_s = match (a.peer_cpu_s, b.peer_cpu_s) {
        (Some(x), Some(y)) => Some(x + y),
        (x, y) => x.or(y),
    };
    a.streams += b.streams;
    a.links.extend(b.links);
    a.unchanged += b.unchanged;
    a.handoffs += b.handoffs;
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(w: &str, size: u64, inode: u64) -> Item {
        Item {
            wire: w.as_bytes().to_vec(),
            size,
            inode: (if inode > 0 { 1 } else { 0 }, inode),
        }
    }

    #[test]
    fn deals_largest_first_keeps_links_together_and_others_on_share_0() {
        let files = vec![
            item("t/a", 100, 0),
            item("t/b", 60, 0),
            item("t/c", 50, 0),
            item("t/d", 40, 0),
            item("t/l1", 30, 7),
            item("t/sub/l2", 30, 7),
        ];
        let others = vec![b"t".to_vec(), b"t/sub".to_vec()];
        let s = deal(files, others, &[1.0; 3]);
        let names = |i: usize| -> Vec<String> {
            s[i].0
                .iter()
                .map(|p| String::from_utf8_lossy(p).into_owned())
                .collect()
        };
        // 100 -> 0, 60 -> 1, 50 -> 2, 40 -> 2 (50 < 60), links (30) -> 1.
        assert_eq!(names(0), ["t", "t/sub", "t/a"]);
        assert_eq!(names(1), ["t/b", "t/l1", "t/sub/l2"]);
        assert_eq!(names(2), ["t/c", "t/d"]);
        assert_eq!((s[0].2, s[1].2, s[2].2), (100, 90, 90));
        assert_eq!((s[0].1, s[1].1, s[2].1), (1, 3, 2));
        // More daemons than files: the extra shares are empty.
        let s = deal(vec![item("f", 1, 0)], vec![], &[1.0; 3]);
        assert!(s[1].0.is_empty() && s[2].0.is_empty());
        // A daemon of weight 0.5 (busy) gets about half the bytes of one
        // of weight 1: of 8 files of 10 bytes, 6 and 2 (ending at 60 and
        // 40 bytes per unit of weight; 4 and 4 would end at 40 and 80).
        let files = (0..8).map(|i| item(&format!("f{i}"), 10, 0)).collect();
        let s = deal(files, vec![], &[1.0, 0.5]);
        assert_eq!((s[0].2, s[1].2), (60, 20));
    }

    #[test]
    fn lists_a_tree_as_the_walk_names_it() {
        let d = tempfile::tempdir().unwrap();
        let t = d.path().join("top");
        std::fs::create_dir_all(t.join("sub/empty")).unwrap();
        std::fs::write(t.join("sub/f"), b"12345").unwrap();
        std::fs::hard_link(t.join("sub/f"), t.join("g")).unwrap();
        std::os::unix::fs::symlink("f", t.join("sub/link")).unwrap();
        let rel = t.as_os_str().as_bytes()[1..].to_vec();
        let tops = [Top {
            rel,
            name: b"top".to_vec(),
        }];
        let (mut files, mut others) = list(Path::new("/"), &tops).unwrap();
        files.sort_by(|a, b| a.wire.cmp(&b.wire));
        others.sort();
        let w: Vec<_> = files.iter().map(|f| (&f.wire[..], f.size)).collect();
        assert_eq!(w, [(&b"top/g"[..], 5), (&b"top/sub/f"[..], 5)]);
        assert_eq!(files[0].inode, files[1].inode);
        assert_ne!(files[0].inode, (0, 0));
        assert_eq!(
            others,
            [&b"top"[..], b"top/sub", b"top/sub/empty", b"top/sub/link"]
        );
    }
}
