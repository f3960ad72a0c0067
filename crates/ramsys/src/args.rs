//! The arguments of the transfer commands (`cp`, `sync`, and the storage
//! and ssh options they share with `serve` and `ssh-serve`), in a module of
//! their own so that every command can use them without depending on the
//! others (issue 16).

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use ramsys_engine::storage::cache::DirectMode;
use ramsys_engine::TransferOptions;

use crate::spec::parse_size;
use crate::KeyArgs;

#[derive(Args, Debug)]
pub struct CpArgs {
    /// Copy directories recursively.
    #[arg(short = 'r', long = "recursive")]
    pub recursive: bool,
    /// Parallel data streams (default: sized from the path's round trip
    /// when connecting, 4 on a LAN and more on long paths; at least the
    /// scheduler's plan with --numa auto; 4 for a local copy).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub streams: Option<u16>,
    /// Block size: unit of disk access and network transfer.
    #[arg(long, default_value = "4M", value_parser = crate::spec::parse_block_size)]
    pub block_size: u64,
    /// Send at most RATE bytes per second, all streams together (rsync's
    /// units: a bare number is KiB/s; K, M, G are powers of 1024, KB, MB,
    /// GB of 1000; e.g. 20M). Applied by the source: this agent, or the
    /// daemon or ssh end it pulls from.
    #[arg(long, value_name = "RATE", value_parser = ramsys_engine::data::rate::parse_rate)]
    pub bwlimit: Option<u64>,
    /// TCP congestion control for the links this agent opens (a name in
    /// /proc/sys/net/ipv4/tcp_available_congestion_control). Default: bbr
    /// where the kernel has it, else the system default.
    #[arg(long, value_name = "NAME")]
    pub congestion: Option<String>,
    /// Turn off per-block checksums and whole-file digests.
    #[arg(long)]
    pub no_checksum: bool,
    /// Local copies: move large files' data through the engine's blocks
    /// (hashed end to end) instead of copy_file_range in the kernel.
    #[arg(long)]
    pub no_copy_range: bool,
    /// Encrypt and authenticate every data block (AEAD keyed per session;
    /// docs/SECURITY.md). Bare `--encrypt` picks AES-256-GCM with CPU
    /// support, else ChaCha20-Poly1305.
    #[arg(long, value_name = "auto|aes-256-gcm|chacha20-poly1305", num_args = 0..=1,
          default_missing_value = "auto", require_equals = true)]
    pub encrypt: Option<ramsys_engine::transport::crypto::Cipher>,
    /// One JSON object per line: progress events and a final summary.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub key: KeyArgs,
    /// Read the key from the first line of stdin instead of a file (keeps
    /// it off command lines; used by third-party ssh copies).
    #[arg(long, conflicts_with = "key_file")]
    pub key_stdin: bool,
    #[command(flatten)]
    pub ssh: SshArgs,
    /// Reader threads (source side of this agent; default: the
    /// scheduler's plan with --numa auto, else 4).
    #[arg(long)]
    pub readers: Option<usize>,
    /// Writer threads (sink side of this agent; default: the scheduler's
    /// plan with --numa auto, else 4).
    #[arg(long)]
    pub writers: Option<usize>,
    /// Credits (blocks in flight) per stream when this agent is the sink.
    #[arg(long, default_value_t = 8)]
    pub window: u32,
    /// Buffer memory of this agent.
    #[arg(long, default_value = "192M", value_parser = parse_size)]
    pub memory: u64,
    /// Seconds to wait for a daemon to answer.
    #[arg(long, default_value_t = 10)]
    pub connect_timeout: u64,
    /// Seconds without a word from the peer before the transfer gives up
    /// (rsync's --timeout): every message renews it, and a source still
    /// scanning says so, so a big tree never outgrows it (issue 36).
    /// 0: wait as long as the connection lives (TCP keepalive notices a
    /// vanished host).
    #[arg(long, default_value_t = 60, value_name = "SECS")]
    pub timeout: u64,
    /// fsync every file before renaming it into place.
    #[arg(long)]
    pub fsync: bool,
    /// NUMA placement: off (leave to the OS), auto (follow the devices,
    /// seed 000 sec. 6.1.5) or a node number (everything there).
    #[arg(long, default_value = "auto", value_name = "off|auto|NODE")]
    pub numa: ramsys_topo::NumaMode,
    /// Print where threads ran, where buffers live and which NIC each
    /// stream used, and the scheduler's plan.
    #[arg(long)]
    pub explain: bool,
    /// With several NICs reaching the daemon: how streams are spread over
    /// them (seed 002 sec. 6.3); each link's source address is bound to
    /// its NIC.
    #[arg(
        long,
        default_value = "affinity-aware",
        value_name = "round-robin|affinity-aware|dynamic"
    )]
    pub channels: ramsys_topo::ChannelPolicy,
    #[command(flatten)]
    pub raw: crate::rawpick::RawArgs,
    #[command(flatten)]
    pub storage: StorageArgs,
    #[command(flatten)]
    pub select: SelectArgs,
    #[command(flatten)]
    pub archive: ArchiveArgs,
    /// Resume an interrupted transfer: run again with the same arguments;
    /// only what is missing or wrong moves (block checksums; the sink
    /// keeps its temp files and a SQLite journal; docs/SYNC.md). Files of
    /// 64 MiB and more are journalled by default, so a transfer that ran
    /// without this flag can still be resumed with it.
    #[arg(long, conflicts_with = "no_resume")]
    pub resume: bool,
    /// Keep no temp files or journal when interrupted (the default keeps
    /// those of files of 64 MiB and more for a later --resume).
    #[arg(long)]
    pub no_resume: bool,
    /// Leave every file DST already has as it is, whatever its content;
    /// copy only what is missing (rsync's --ignore-existing, cp's
    /// --no-clobber).
    #[arg(long, visible_alias = "no-clobber")]
    pub ignore_existing: bool,
    /// Leave files that are newer in DST than in SRC (by mtime; rsync's
    /// and cp's --update).
    #[arg(short = 'u', long)]
    pub update: bool,
    /// Write into an existing block device named as DST, in place (rsync's
    /// --write-devices): it must be at least as large as the source, is
    /// never truncated, and is read back and verified after writing. Without
    /// it a device DST is refused (docs/STORAGE.md "Volumes").
    #[arg(long)]
    pub write_devices: bool,
    /// Stripe one push over every daemon of `ramsys://A,B,C/DST` that
    /// answers: each receives its share of the files at once, into a DST
    /// they share (a shared file system; docs/SITE.md "Striping"). Between
    /// two sites (`ramsys://A1,A2/SRC ramsys://B1,B2/DST`) Ai sends its
    /// share to Bi. A lost daemon or pair fails its share only; rerun with
    /// --resume to finish.
    #[arg(long)]
    pub stripe: bool,
    /// With --stripe between two sites (`ramsys://A1,A2/SRC
    /// ramsys://B1,B2/DST`): the source data is split per daemon, each
    /// source daemon sends all it holds under SRC (docs/SITE.md "Between
    /// two sites"); without it SRC is one shared tree dealt into shares.
    #[arg(long)]
    pub split_sources: bool,
    /// Sources, then the destination.
    #[arg(required = true, num_args = 2.., value_name = "SRC... DST")]
    pub paths: Vec<String>,
}

impl CpArgs {
    /// The sync flags cp's own options set (SyncOpen, docs/SYNC.md).
    /// `--resume` reuses what an interrupted run left; the journal that
    /// makes that possible is on unless `--no-resume` (issue 15).
    pub fn sink_flags(&self) -> u32 {
        use ramsys_engine::request::sync::flags::*;
        let bit = |on: bool, b: u32| if on { b } else { 0 };
        bit(self.write_devices, WRITE_DEVICES)
            | bit(self.ignore_existing, IGNORE_EXISTING)
            | bit(self.update, UPDATE)
            | match (self.resume, self.no_resume) {
                (true, _) => RESUME | JOURNAL,
                (false, false) => JOURNAL,
                (false, true) => 0,
            }
    }

    pub fn load_key(&self) -> anyhow::Result<Vec<u8>> {
        if !self.key_stdin {
            return self.key.load();
        }
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::stdin().lock(), &mut line)
            .context("reading the key from stdin")?;
        let key = line.trim().as_bytes().to_vec();
        anyhow::ensure!(key.len() >= 16, "--key-stdin: expected a key line on stdin");
        Ok(key)
    }
}

/// Faithful copies (issue 20; engine `archive`): rsync's `-a` and the
/// attributes it and `-X`/`-A` keep. Modes, mtimes, symlinks (as links)
/// and hard links within the tree are kept by every copy.
#[derive(Args, Debug, Clone, Default)]
pub struct ArchiveArgs {
    /// Archive: -r, -o, -g, --devices and --specials (rsync's -rlptgoD;
    /// links, permissions, times and hard links are always kept).
    #[arg(short = 'a', long)]
    pub archive: bool,
    /// Keep owners (by name, mapped through the destination's passwd;
    /// needs root at the destination).
    #[arg(short = 'o', long)]
    pub owner: bool,
    /// Keep groups (by name, mapped through the destination's group file).
    #[arg(short = 'g', long)]
    pub group: bool,
    /// Map owners and groups by number instead of by name.
    #[arg(long)]
    pub numeric_ids: bool,
    /// Keep extended attributes (user.*; also trusted.* and security.*
    /// when both ends run as root).
    #[arg(short = 'X', long)]
    pub xattrs: bool,
    /// Keep POSIX ACLs (named users and groups mapped by name).
    #[arg(short = 'A', long)]
    pub acls: bool,
    /// Copy FIFOs and sockets.
    #[arg(long)]
    pub specials: bool,
    /// Copy character and block devices (needs root at the destination).
    #[arg(long)]
    pub devices: bool,
    /// --devices and --specials.
    #[arg(short = 'D')]
    pub devices_specials: bool,
    /// Keep access times.
    #[arg(short = 'U', long)]
    pub atimes: bool,
    /// Accepted for rsync's -H: hard links within the tree are always kept.
    #[arg(short = 'H', long)]
    pub hard_links: bool,
}

impl ArchiveArgs {
    /// The engine's bits (proto::attrs::preserve).
    pub fn preserve(&self) -> u32 {
        use ramsys_proto::attrs::preserve::*;
        let a = self.archive;
        let d = self.devices_specials;
        let mut f = 0;
        for (bit, on) in [
            (OWNER, a || self.owner),
            (GROUP, a || self.group),
            (SPECIALS, a || d || self.specials),
            (DEVICES, a || d || self.devices),
            (XATTRS, self.xattrs),
            (ACLS, self.acls),
            (ATIMES, self.atimes),
        ] {
            if on {
                f |= bit;
            }
        }
        // Ids alone mean nothing without owners or groups, ACLs aside.
        if self.numeric_ids && f != 0 {
            f |= NUMERIC_IDS;
        }
        f
    }

    /// The same flags on a command line (a third-party copy's HOST1).
    pub fn to_args(&self) -> Vec<String> {
        use ramsys_proto::attrs::preserve::*;
        let f = self.preserve();
        [
            (OWNER, "--owner"),
            (GROUP, "--group"),
            (NUMERIC_IDS, "--numeric-ids"),
            (XATTRS, "--xattrs"),
            (ACLS, "--acls"),
            (SPECIALS, "--specials"),
            (DEVICES, "--devices"),
            (ATIMES, "--atimes"),
        ]
        .into_iter()
        .filter(|(b, _)| f & b != 0)
        .map(|(_, s)| s.to_string())
        .collect()
    }
}

/// What to send (issue 20): rsync's filter rules (issue 35, docs/SYNC.md
/// "Filters"), applied by the source's scan (locally, or by a daemon or
/// ssh source), and size limits.
#[derive(Args, Debug, Clone, Default)]
pub struct SelectArgs {
    /// Leave out what matches PATTERN (rsync's rules and wildmatch: `*`
    /// stops at `/`, `**` does not, `dir/***` is dir and all in it; a
    /// leading `/` anchors at the transfer root; a trailing `/` matches
    /// directories only; `- ` or `+ ` before the pattern picks the kind).
    /// Rules apply in command-line order with the other rule options, first
    /// match wins. A PATTERN may begin with `-` (`--exclude -foo-` or
    /// `--exclude=-foo-`). `sync --delete` leaves excluded destination
    /// files alone, as rsync does.
    #[arg(long, value_name = "PATTERN", allow_hyphen_values = true)]
    pub exclude: Vec<String>,
    /// Keep what matches PATTERN even if a later rule excludes it.
    #[arg(long, value_name = "PATTERN", allow_hyphen_values = true)]
    pub include: Vec<String>,
    /// An rsync filter rule: `- PAT`/`exclude PAT`, `+ PAT`/`include PAT`,
    /// `!`/`clear` (forget the rules so far), `. FILE`/`merge FILE`,
    /// hide/show (sender only), protect/risk (--delete only), modifiers
    /// `!` (not matching) `s` `r` (`-! */`, `exclude,! */`).
    #[arg(long, short = 'f', value_name = "RULE", allow_hyphen_values = true)]
    pub filter: Vec<String>,
    /// Read exclude patterns from FILE, one per line (`+ PAT` includes,
    /// `- PAT` excludes, `!` clears; `#` and `;` start comments; `-` is
    /// stdin).
    #[arg(long, value_name = "FILE")]
    pub exclude_from: Vec<PathBuf>,
    /// Read include patterns from FILE (as --exclude-from).
    #[arg(long, value_name = "FILE")]
    pub include_from: Vec<PathBuf>,
    /// Send only the paths listed in FILE (one per line, relative to the
    /// source directory; `-` reads stdin) and the directories leading to
    /// them; the contents of a listed directory only with -r. As in rsync,
    /// the listed paths land directly under DST.
    #[arg(long, value_name = "FILE")]
    pub files_from: Option<PathBuf>,
    /// Skip regular files smaller than SIZE (e.g. 1K, 4M).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub min_size: Option<u64>,
    /// Skip regular files larger than SIZE.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub max_size: Option<u64>,
    /// The rules in command-line order ([`SelectArgs::order`]), in their
    /// wire form (engine request::rules).
    #[arg(skip)]
    pub rules: Vec<Vec<u8>>,
}

impl SelectArgs {
    /// Put the rule options in command-line order (first match wins, so
    /// their order matters, as in rsync; clap keeps each flag's values
    /// apart, its indices tell the order), read their files and apply
    /// clears and merges. A bad rule is one line naming it.
    pub fn order(&mut self, m: &clap::ArgMatches) -> anyhow::Result<()> {
        use ramsys_engine::request::rules::{RuleList, Syntax};
        enum Item<'a> {
            Rule(&'a str, Syntax),
            File(&'static str, &'a PathBuf, Syntax),
        }
        let mut at: Vec<(usize, Item)> = Vec::new();
        let old = |include| Syntax::Old { include };
        for (id, vals, syn) in [
            ("exclude", &self.exclude, old(false)),
            ("include", &self.include, old(true)),
            ("filter", &self.filter, Syntax::Filter),
        ] {
            let idx = m.indices_of(id).into_iter().flatten();
            at.extend(idx.zip(vals).map(|(i, v)| (i, Item::Rule(v, syn))));
        }
        for (id, opt, files, syn) in [
            (
                "exclude_from",
                "--exclude-from",
                &self.exclude_from,
                old(false),
            ),
            (
                "include_from",
                "--include-from",
                &self.include_from,
                old(true),
            ),
        ] {
            let idx = m.indices_of(id).into_iter().flatten();
            at.extend(idx.zip(files).map(|(i, f)| (i, Item::File(opt, f, syn))));
        }
        at.sort_by_key(|a| a.0);
        let mut list = RuleList::default();
        for (_, item) in at {
            match item {
                Item::Rule(r, syn) => list.add(r.as_bytes(), syn),
                Item::File(opt, f, syn) => list.add_file(f, syn).map_err(|e| format!("{opt}: {e}")),
            }
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        self.rules = list.rules.iter().map(|r| r.to_wire()).collect();
        Ok(())
    }

    /// The selection to send; `recursive` is -r (what lies below a
    /// --files-from directory).
    pub fn selection(&self, recursive: bool) -> anyhow::Result<ramsys_proto::control::Selection> {
        use ramsys_engine::request::filter::Filter;
        anyhow::ensure!(
            self.max_size.is_none_or(|m| m > 0),
            "--max-size must be more than 0"
        );
        let files = match &self.files_from {
            None => Default::default(),
            Some(f) => {
                let read = |r: &mut dyn std::io::BufRead| read_list(r);
                let v = if f.as_os_str() == "-" {
                    read(&mut std::io::stdin().lock()).context("--files-from -")?
                } else {
                    std::fs::File::open(f)
                        .and_then(|file| read(&mut std::io::BufReader::new(file)))
                        .with_context(|| format!("--files-from {}", f.display()))?
                };
                anyhow::ensure!(!v.is_empty(), "--files-from {}: no paths", f.display());
                v
            }
        };
        let sel = ramsys_proto::control::Selection {
            rules: self.rules.clone(),
            min_size: self.min_size.unwrap_or(0),
            max_size: self.max_size.unwrap_or(0),
            files,
            files_recursive: recursive,
        };
        Filter::new(&sel).map_err(|e| anyhow::anyhow!("filter rules: {e}"))?;
        Ok(sel)
    }
}

/// `ramsys sync`: cp's options and endpoints, plus change detection.
#[derive(Args, Debug)]
pub struct SyncArgs {
    /// Compare whole-file content digests (computed in parallel by the side
    /// holding each file) instead of size and mtime.
    #[arg(long)]
    pub checksum: bool,
    /// Remove destination entries the source no longer has (after the new
    /// data is in place, only inside the destination).
    #[arg(long)]
    pub delete: bool,
    /// List what would be sent and deleted; change nothing.
    #[arg(long, short = 'n')]
    pub dry_run: bool,
    /// `--watch` and its tuning (continuous replication, issue 38).
    #[command(flatten)]
    pub watch: WatchArgs,
    #[command(flatten)]
    pub cp: CpArgs,
}

/// Storage-engine flags (issue 4), shared by `cp` and `serve`.
#[derive(Args, Debug, Clone)]
pub struct StorageArgs {
    /// Turn off O_DIRECT (kernel-bypass) reads and writes of large files
    /// (the same as --direct never).
    #[arg(long)]
    pub no_direct: bool,
    /// O_DIRECT for large files: auto (reads bypass the page cache only for
    /// files mostly not in it), always, or never (docs/STORAGE.md).
    /// Default auto (serve: the config's `direct`, else auto).
    #[arg(long, value_name = "auto|always|never")]
    pub direct: Option<DirectMode>,
    /// Storage I/O engine: sync (pread/pwrite) or uring (batched io_uring;
    /// falls back to sync where the kernel has none).
    #[arg(long, value_name = "sync|uring")]
    pub io_engine: Option<ramsys_engine::storage::IoEngine>,
    /// Source data engine of this process (a push, a local copy, or a
    /// daemon's source): file, or null (blocks produced without reading).
    #[arg(long, default_value = "file", value_name = "file|null")]
    pub source_engine: ramsys_engine::storage::DataEngine,
    /// Sink data engine of this process (a pull, a local copy, or a
    /// daemon's sink; a push's sink is the daemon's own setting): file, or
    /// null (blocks verified and discarded).
    #[arg(long, default_value = "file", value_name = "file|null")]
    pub sink_engine: ramsys_engine::storage::DataEngine,
    /// With --source-engine null: send one synthetic file of this size
    /// instead of scanning the sources.
    #[arg(long, default_value = "0", value_parser = parse_size)]
    pub null_size: u64,
    /// Keep scan order instead of sorting each device queue by physical
    /// location (FIEMAP).
    #[arg(long)]
    pub no_sort: bool,
    /// Storage threads per device: N for all, or e.g. hdd=1,ssd=4,nvme=8,mem=4.
    #[arg(long, value_name = "SPEC")]
    pub device_threads: Option<ramsys_engine::storage::DeviceThreads>,
    /// Where this process is the source: readers send their own blocks
    /// (inline), hand them to one sender thread per stream (queued), or
    /// auto: inline when readers == streams on a path with an RTT up to
    /// 1 ms, else queued (seed 002 sec. 7; docs/NUMA.md sec. 8).
    /// A pull's source is the daemon: its --send-path or config decides.
    #[arg(long, value_name = "inline|queued|auto")]
    pub send_path: Option<ramsys_engine::types::sendpath::SendPath>,
    /// Where this process is the source: the bytes of files of 64 KiB and
    /// more in the page cache go from the file to a TCP link with
    /// sendfile, with no copy in user space (auto), or through a buffer
    /// like the rest (off;
    /// RAMSYS_SENDFILE=0 does the same). docs/STORAGE.md.
    #[arg(long, value_name = "auto|off", value_parser = ["auto", "off"])]
    pub send_zerocopy: Option<String>,
}

impl StorageArgs {
    /// Default options with these storage settings applied.
    pub fn options(&self) -> TransferOptions {
        let d = TransferOptions::default();
        TransferOptions {
            direct: !self.no_direct && self.direct != Some(DirectMode::Never),
            direct_mode: self.direct.unwrap_or_default(),
            io_engine: self.io_engine.unwrap_or(d.io_engine),
            source_engine: self.source_engine,
            sink_engine: self.sink_engine,
            null_size: self.null_size,
            sort: !self.no_sort,
            device_threads: self.device_threads.unwrap_or(d.device_threads),
            send_path: self.send_path.unwrap_or(d.send_path),
            send_zerocopy: self.send_zerocopy.as_deref() != Some("off"),
            ..d
        }
    }
}

/// How to reach `HOST:PATH` endpoints (scp's options).
#[derive(Args, Debug, Clone)]
pub struct SshArgs {
    /// Port of sshd on remote hosts (ssh -p).
    #[arg(long, value_name = "PORT")]
    pub ssh_port: Option<u16>,
    /// Option for ssh, passed as `-o OPT` (repeatable), e.g.
    /// --ssh-opt StrictHostKeyChecking=yes.
    #[arg(long, value_name = "OPT")]
    pub ssh_opt: Vec<String>,
    /// Identity (private key) file for ssh (ssh -i).
    #[arg(short = 'i', long = "identity", value_name = "FILE")]
    pub identity: Option<PathBuf>,
    /// The ssh program, with extra arguments if any (split on spaces).
    #[arg(long, default_value = "ssh", value_name = "CMD")]
    pub ssh_cmd: String,
    /// Path of the ramsys binary on remote hosts, given to the remote
    /// shell as is (like rsync's --rsync-path). `auto`: a ramsys of this
    /// exact version on the remote PATH, else this binary copied over ssh
    /// into ~/.cache/ramsys/bin/ there (a static build runs anywhere).
    #[arg(long, default_value = "ramsys", value_name = "PATH")]
    pub remote_ramsys: String,
    /// Carry the data through the ssh connection instead of direct TCP
    /// streams (hosts that accept only ssh). Without it this happens by
    /// itself, with one line saying so, when the direct connection to the
    /// remote end cannot be made.
    #[arg(long)]
    pub ssh_tunnel: bool,
}

/// `sync --watch` and its tuning.
#[derive(Args, Debug, Clone)]
pub struct WatchArgs {
    /// Keep DST following SRC: a full sync, then every change as it
    /// happens (renames as renames, deletes as deletes with --delete), until
    /// interrupted (docs/WATCH.md).
    #[arg(long)]
    pub watch: bool,
    /// A file written but not closed is sent once quiet this long (ms).
    #[arg(long, value_name = "MS", default_value_t = 2000, requires = "watch")]
    pub watch_quiet: u64,
    /// How long changes gather before a batch leaves (ms).
    #[arg(long, value_name = "MS", default_value_t = 20, requires = "watch")]
    pub watch_batch: u64,
    /// A full scan this often as a safety net (seconds; 0 = only at start
    /// and after a queue overflow).
    #[arg(long, value_name = "S", default_value_t = 3600, requires = "watch")]
    pub watch_rescan: u64,
    /// Change detection: auto (fanotify where allowed, else inotify),
    /// fanotify, inotify.
    #[arg(long, value_name = "KIND", default_value = "auto", requires = "watch")]
    pub watch_backend: ramsys_watch::Backend,
    /// The job's journal of pending changes (default: one per SRC and DST
    /// under $XDG_STATE_HOME/ramsys/watch, else ~/.local/state/ramsys/watch).
    #[arg(long, value_name = "FILE", requires = "watch")]
    pub watch_journal: Option<PathBuf>,
}

impl WatchArgs {
    pub fn pending(&self, mirror: bool) -> ramsys_watch::PendingConfig {
        ramsys_watch::PendingConfig {
            quiet: std::time::Duration::from_millis(self.watch_quiet),
            mirror,
            ..Default::default()
        }
    }
}

/// A `--files-from` list, a path a line (`\r\n` too, empty lines skipped),
/// read line by line into one packed list (issue 36: millions of lines).
/// Not UTF-8 is refused, as before: the list names paths as text.
fn read_list(r: &mut dyn std::io::BufRead) -> std::io::Result<ramsys_proto::control::PathList> {
    let mut list = ramsys_proto::control::PathList::default();
    let mut line = Vec::new();
    while r.read_until(b'\n', &mut line)? > 0 {
        let l = line.strip_suffix(b"\n").unwrap_or(&line);
        let l = l.strip_suffix(b"\r").unwrap_or(l);
        std::str::from_utf8(l)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        if !l.is_empty() {
            list.push(l)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
        }
        line.clear();
    }
    list.shrink_to_fit();
    Ok(list)
}

#[cfg(test)]
mod list_tests {
    use super::read_list;

    #[test]
    fn a_files_from_list_reads_a_path_a_line() {
        let l = read_list(&mut &b"a/b\r\n\n./c\nlast"[..]).unwrap();
        let got: Vec<&[u8]> = l.iter().collect();
        assert_eq!(got, [&b"a/b"[..], b"./c", b"last"]);
        assert!(read_list(&mut &b"ok\n\xff\n"[..]).is_err());
        assert!(read_list(&mut &b"\n\r\n"[..]).unwrap().is_empty());
    }
}
