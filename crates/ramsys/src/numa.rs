//! The agent's NUMA handling (seed 000 sec. 6.1.5; docs/NUMA.md): where
//! each engine of a transfer runs and where its buffers live, the channels
//! of its streams, and the `--explain` report of what was decided and what
//! the threads actually did.

use std::path::Path;
use std::sync::Arc;

use ramsys_engine::daemon::placement::{
    apply, describe_nic, describe_storage, nic_for_addr, plan_end, sched_instance, storage_for_path,
};
use ramsys_engine::data::resources::ResourceConfig;
use ramsys_engine::transport::channels::ChannelTcp;
use ramsys_engine::transport::Transport;
use ramsys_engine::{EngineResources, Report, TransferOptions};
use ramsys_topo::Role;

/// The thread and stream counts the user set on the command line: the
/// plan does not override them (`Numa::follow`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Fixed {
    pub streams: Option<u16>,
    pub readers: Option<usize>,
    pub writers: Option<usize>,
}

/// NUMA placement of this agent's engines, and the --explain report.
pub struct Numa {
    topo: Option<ramsys_topo::Topology>,
    mode: ramsys_topo::NumaMode,
    explain: bool,
    lines: Vec<String>,
    /// The scheduler plan of the last configured end: (storage, NIC, plan).
    last: Option<(String, String, ramsys_sched::Plan)>,
}

impl Numa {
    pub fn new(mode: ramsys_topo::NumaMode, explain: bool) -> Numa {
        let mut lines = Vec::new();
        let topo = if mode == ramsys_topo::NumaMode::Off && !explain {
            None
        } else {
            match ramsys_topo::discover(Path::new("/")) {
                Ok(t) => {
                    lines.push(format!(
                        "host: {} NUMA node(s){}, numa mode {mode}",
                        t.nodes.len(),
                        if t.numa_synthetic {
                            " (no NUMA in sysfs; one synthetic node)"
                        } else {
                            ""
                        }
                    ));
                    Some(t)
                }
                Err(e) => {
                    lines.push(format!(
                        "hardware discovery failed ({e}); placement left to the OS"
                    ));
                    None
                }
            }
        };
        Numa {
            topo,
            mode,
            explain,
            lines,
            last: None,
        }
    }

    /// Pin pools and place buffers for one engine end.
    pub fn configure(
        &mut self,
        label: &str,
        role: Role,
        storage_path: Option<&Path>,
        peer: Option<&str>,
        base: &ResourceConfig,
    ) -> ResourceConfig {
        let Some(topo) = &self.topo else {
            return base.clone();
        };
        let probe = storage_path.map(|p| {
            let abs = std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
            if abs.exists() {
                abs
            } else {
                abs.parent().map(Path::to_path_buf).unwrap_or(abs)
            }
        });
        let storage = probe
            .as_deref()
            .and_then(|p| storage_for_path(topo, p, true));
        let nic = peer.and_then(|a| nic_for_addr(topo, a));
        match plan_end(topo, role, storage, nic, self.mode) {
            Ok(plan) => {
                let (sw, nw) = match role {
                    Role::Source => ("readers", "senders"),
                    Role::Sink => ("writers", "receivers"),
                };
                self.lines.push(format!(
                    "{label}: storage {} ; NIC {}",
                    describe_storage(storage),
                    describe_nic(nic),
                ));
                self.lines.push(format!(
                    "{label}: {sw} planned on {} — {}",
                    place(&plan.storage_threads),
                    plan.storage_threads.reason
                ));
                if let Some(n) = &plan.network_threads {
                    self.lines.push(format!(
                        "{label}: {nw} planned on {} — {}",
                        place(n),
                        n.reason
                    ));
                }
                self.lines.push(format!(
                    "{label}: buffers planned on {} — {}",
                    place(&plan.buffers),
                    plan.buffers.reason
                ));
                if let (Some(s), Some(n)) = (storage, nic) {
                    let (from, to) = match role {
                        Role::Source => (s.name.as_str(), n.name.as_str()),
                        Role::Sink => (n.name.as_str(), s.name.as_str()),
                    };
                    let inst = sched_instance(topo, None, from, to, base.buffer_size as u64);
                    let sp = ramsys_sched::plan(&inst);
                    self.last = Some((s.name.clone(), n.name.clone(), sp.clone()));
                    for l in ramsys_sched::render_text(&sp).lines() {
                        self.lines.push(format!("{label}: scheduler: {l}"));
                    }
                }
                apply(&plan, base.clone())
            }
            Err(e) => {
                self.lines
                    .push(format!("{label}: placement failed ({e}); left to the OS"));
                base.clone()
            }
        }
    }

    /// Issue 7: with --numa auto, run the end just configured with the
    /// plan's storage-thread count (readers or writers) and at least its
    /// network-thread count of streams, unless the user set them. Streams
    /// keep a floor of 4: the plan counts CPU and device bandwidth, while
    /// parallel streams also work around TCP's per-flow window on long
    /// paths (seed 000 sec. 5.2.1), which the plan does not model.
    pub fn follow(&mut self, label: &str, role: Role, opts: &mut TransferOptions, a: &Fixed) {
        if self.mode != ramsys_topo::NumaMode::Auto {
            return;
        }
        let Some((storage, nic, plan)) = self.last.take() else {
            return;
        };
        use ramsys_sched::Role as R;
        let (sr, nr) = match role {
            Role::Source => (R::Reader, R::Sender),
            Role::Sink => (R::Writer, R::Receiver),
        };
        let st = (plan.count(sr, &storage) as usize).max(1);
        let net = plan.count(nr, &nic) as u16;
        let mut done = Vec::new();
        match role {
            Role::Source if a.readers.is_none() => {
                opts.readers = st;
                done.push(format!("{st} reader(s)"));
            }
            Role::Sink if a.writers.is_none() => {
                let floor = ramsys_engine::daemon::config::placement::SINK_WRITERS_MIN;
                opts.bulk_writers = (st < floor).then_some(st);
                let st = st.max(floor);
                opts.writers = st;
                done.push(format!("{st} writer(s)"));
            }
            _ => {}
        }
        if a.streams.is_none() {
            opts.streams = net.clamp(4, 256);
            done.push(format!("{} stream(s)", opts.streams));
        }
        if !done.is_empty() {
            self.lines
                .push(format!("{label}: following the plan: {}", done.join(", ")));
        }
    }

    /// Seed 002 channels: with two or more NICs towards `addr`, a transport
    /// that binds each link to the NIC the channel scheduler picks;
    /// otherwise `plain` (the kernel chooses).
    pub fn channels(
        &mut self,
        addr: &str,
        policy: ramsys_topo::ChannelPolicy,
        buffer_node: Option<u32>,
        plain: Arc<dyn Transport>,
    ) -> Arc<dyn Transport> {
        use std::net::ToSocketAddrs;
        let Some(topo) = &self.topo else {
            return plain;
        };
        let Some(peer) = addr.to_socket_addrs().ok().and_then(|mut i| i.next()) else {
            return plain;
        };
        let nics = ChannelTcp::towards(topo, peer.ip());
        if nics.len() < 2 {
            return plain;
        }
        let names: Vec<String> = nics
            .iter()
            .map(|n| {
                format!(
                    "{} ({}, node {})",
                    n.nic,
                    n.addr,
                    n.node.map_or("unknown".into(), |x| x.to_string())
                )
            })
            .collect();
        match ChannelTcp::new(nics, policy, buffer_node) {
            Ok(t) => {
                self.lines.push(format!(
                    "channels: {} over {}",
                    serde_json::to_value(policy)
                        .map(|v| v.as_str().unwrap_or("").to_string())
                        .unwrap_or_default(),
                    names.join(", ")
                ));
                Arc::new(t)
            }
            Err(e) => {
                self.lines.push(format!("channels: not used ({e})"));
                plain
            }
        }
    }

    pub fn buffers(&mut self, label: &str, res: &EngineResources) {
        let mb = ramsys_units::format_size((res.buffers.count() * res.buffers.buf_size()) as u64);
        match res.verify_buffers() {
            Some(Ok(v)) => {
                let where_: Vec<String> = v
                    .iter()
                    .map(|(n, p)| format!("{p} pages on node {n}"))
                    .collect();
                self.lines.push(format!(
                    "{label}: buffer pool {mb} bound to node {}, verified by move_pages: {}",
                    res.buffers.node().map_or("?".into(), |n| n.to_string()),
                    where_.join(", ")
                ));
            }
            Some(Err(e)) => self.lines.push(format!(
                "{label}: buffer pool {mb}; placement check failed: {e}"
            )),
            None => self.lines.push(format!(
                "{label}: buffer pool {mb} on the heap (OS placement)"
            )),
        }
    }

    pub fn threads(&mut self, label: &str, res: &EngineResources) {
        for p in [&res.readers, &res.senders, &res.receivers, &res.writers] {
            let seen = p.observed_cpus();
            if seen.is_empty() {
                continue;
            }
            let node = |c: &usize| {
                self.topo
                    .as_ref()
                    .and_then(|t| t.node_of_cpu(*c))
                    .map_or("?".into(), |n| n.to_string())
            };
            let nodes: std::collections::BTreeSet<String> = seen.iter().map(node).collect();
            self.lines.push(format!(
                "{label}: {} threads ran on CPUs {} (node {}), pinned to {}",
                p.name(),
                ramsys_topo::fmt_cpus(&seen),
                nodes.into_iter().collect::<Vec<_>>().join(","),
                if p.cpus().is_empty() {
                    "nothing (OS placement)".to_string()
                } else {
                    ramsys_topo::fmt_cpus(p.cpus())
                }
            ));
        }
    }

    pub fn streams(&mut self, rep: &Report) {
        self.lines.push(format!(
            "congestion control: {}",
            ramsys_engine::transport::tcp::congestion()
                .unwrap_or("the system default (no bbr here, none asked)")
        ));
        if let Some(c) = &rep.stream_choice {
            self.lines.push(format!(
                "streams: {} chosen from the path ({}); the peer confirmed {}",
                c.streams, c.why, rep.streams
            ));
            let mib = ramsys_units::format_size;
            let tcp = |l: &ramsys_engine::transport::path::TcpLimits| {
                format!(
                    "tcp_wmem max {}, tcp_rmem max {}",
                    mib(l.wmem_max),
                    mib(l.rmem_max)
                )
            };
            let remote = match &c.tcp_remote {
                Some(l) => tcp(l),
                None => "did not say (taken as here)".into(),
            };
            self.lines.push(format!(
                "streams: TCP buffers here {}; the daemon {remote}",
                tcp(&c.tcp_local)
            ));
            if let Some(g) = &c.growth {
                for s in &g.stages {
                    let busy = match (s.busy_pct, s.rtt_x) {
                        (Some(b), Some(q)) => format!(" (links busy {b:.0} %, RTT x{q:.2})"),
                        (Some(b), None) => format!(" (links busy {b:.0} %)"),
                        (None, Some(q)) => format!(" (links' RTT x{q:.2})"),
                        _ => String::new(),
                    };
                    self.lines.push(format!(
                        "streams: at {:.1} s {} streams moved {:.0} MB/s{busy}: {}",
                        s.at_s, s.streams, s.mb_s, s.then
                    ));
                }
                let end = g.stopped.as_deref().unwrap_or("the transfer ended first");
                self.lines
                    .push(format!("streams: {} at the end ({end})", rep.streams));
            }
        }
        if let Some(p) = rep.send_path {
            self.lines.push(format!(
                "send path: {} ({} blocks through the sender queue, {} sent zero-copy \
                 from the page cache)",
                p.name(),
                rep.handoffs,
                rep.zerocopy_blocks
            ));
        }
        if let Some(u) = &rep.storage {
            let mb = ramsys_units::format_size;
            self.lines.push(format!(
                "storage ({}s here, --direct {}): large files {} with O_DIRECT, \
                 {} through the page cache",
                u.side,
                format!("{:?}", u.mode).to_lowercase(),
                mb(u.direct_bytes),
                mb(u.cached_bytes)
            ));
        }
        for (i, l) in rep.links.iter().enumerate() {
            let (local, peer) = (&l.local, &l.peer);
            // A raw channel's local end names its interface: "raw:MAC@IF".
            let nic = self
                .topo
                .as_ref()
                .and_then(|t| match local.rsplit_once('@') {
                    Some((_, ifname)) if local.starts_with("raw:") => t.nic(ifname),
                    _ => nic_for_addr(t, local),
                });
            self.lines.push(format!(
                "stream {i} ({}): {local} -> {peer} via {}",
                l.kind,
                nic.map(|n| format!(
                    "{} (node {})",
                    n.name,
                    n.numa_node.map_or("unknown".into(), |x| x.to_string())
                ))
                .unwrap_or_else(|| "unknown NIC".into())
            ));
        }
    }

    /// A line of the run's own for --explain.
    pub fn note(&mut self, line: String) {
        self.lines.push(line);
    }

    pub fn print(&self) {
        if self.explain {
            for l in &self.lines {
                say!("explain: {l}");
            }
        }
    }
}

fn place(p: &ramsys_topo::Placement) -> String {
    match p.node {
        Some(n) => format!("node {n} CPUs {}", ramsys_topo::fmt_cpus(&p.cpus)),
        None => format!("any node, CPUs {}", ramsys_topo::fmt_cpus(&p.cpus)),
    }
}
