//! The input model and the MSMRAP objective (seed 000 ch. 5, Eqs. 5.1-5.6).
//!
//! The dissertation states MSMRAP for the sending host as "minimise the sum
//! of per-task times" with data sizes `beta` and thread counts `gamma` between
//! storage node u, memory node v and NIC node w. For a daemon that runs one
//! or a few transfers at once the useful form is the rate form: every request
//! moves its bytes through two stages (in: source device -> memory, out:
//! memory -> sink device) and the workload finishes when the slowest request
//! does. Minimising that makespan is maximising `lambda` with every request
//! carrying `lambda * D_r`; the reported objective is the aggregate
//! end-to-end throughput `lambda * sum(D_r)` (for one request simply the
//! minimum of its two stages).
//!
//! Mapping to the seed's notation:
//! * `gamma[r][s][c]` (integer): threads of stage s of request r on CPU node c
//!   (seed gamma_d(u,v) for the disk stage, gamma_n(v,w) for the network stage).
//! * `beta[r][s][c]` (continuous, Gbps): the rate those threads carry (seed
//!   beta, data per time instead of data).
//! * Eq. 5.1 (linear per-thread scaling up to the path limit):
//!   `beta <= gamma * B0(c, d)` and `sum beta on path (c, d) <= Bmax(c, d)`.
//! * Eqs. 5.2/5.3 (all data is moved; what enters memory leaves it):
//!   `sum_c beta[r][in][c] >= lambda D_r` and `sum_c beta[r][out][c] >= lambda D_r`.
//! * Eq. 5.4, corrected (seed README): the per-node thread budget counts the
//!   storage threads *and the network threads* (the dissertation sums gamma_d
//!   twice): `sum_{r,s} gamma[r][s][c] <= C_c`.
//! * Eq. 5.5: `gamma[r][s][c] <= ceil(Bmax / B0)`.
//! * Eq. 5.6, corrected (seed README): the dissertation allows gamma = 0 with
//!   beta > 0 (a division by zero in Eq. 5.1). Here `beta <= gamma * B0`, so
//!   beta may be positive only where gamma is.
//!
//! Buffers are not a free variable: seed 000 6.1.5 sizes a task's buffers by
//! its network threads and pins them on the NIC's node, so the buffers of a
//! request follow the threads of its network stage (see `plan::build`).

use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fmt;

/// One NUMA node of the host.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Node {
    /// Kernel node id (`/sys/devices/system/node/nodeN`).
    pub id: u32,
    /// Logical CPUs of the node.
    pub cpus: Vec<usize>,
    /// CPUs already busy with other work (other tasks, pinned applications):
    /// they are neither counted in the node's budget nor handed out.
    #[serde(default)]
    pub busy_cpus: Vec<usize>,
}

/// What a device is used for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// Block device (readers / writers).
    Storage,
    /// Network interface (senders / receivers).
    Nic,
}

/// A storage device or NIC.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Device {
    /// Device name as the user sees it (`nvme0n1`, `eth0`); used in the plan.
    pub name: String,
    pub kind: DeviceKind,
    /// NUMA node id the device hangs off, `None` when sysfs reports -1.
    pub node: Option<u32>,
    /// Device ceiling in Gbps per direction (line rate, PCIe link, disk).
    pub capacity_gbps: f64,
}

/// The host: nodes, devices, and optionally the SLIT distance matrix.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Host {
    pub nodes: Vec<Node>,
    pub devices: Vec<Device>,
    /// `distances[i][j]`: SLIT distance between `nodes[i]` and `nodes[j]`
    /// (10 = local). Used only to derive a default [`IoModel`].
    #[serde(default)]
    pub distances: Option<Vec<Vec<u32>>>,
}

impl Host {
    /// Mark `n` more CPUs busy with other work (seed 000 Eq. 5.4: the node
    /// budget C_c counts free CPUs only; 5.2.3: contention from other
    /// applications), e.g. the host's measured CPU load that is not the
    /// daemon's own (the site's monitoring, docs/SITE.md). The busy CPUs go
    /// one at a time to the node with the most free CPUs (lower index on a
    /// tie), each the node's highest-numbered free CPU: the lowest serve
    /// device interrupts (the reserve, docs/SCHEDULER.md). At least one CPU
    /// stays free, so a task always gets a plan. Returns how many it marked.
    pub fn add_busy(&mut self, n: usize) -> usize {
        let free = |x: &Node| x.cpus.iter().filter(|c| !x.busy_cpus.contains(c)).count();
        let total: usize = self.nodes.iter().map(free).sum();
        let n = n.min(total.saturating_sub(1));
        for _ in 0..n {
            let Some(i) =
                (0..self.nodes.len()).max_by_key(|&i| (free(&self.nodes[i]), std::cmp::Reverse(i)))
            else {
                return 0;
            };
            let node = &mut self.nodes[i];
            if let Some(&c) = node.cpus.iter().rev().find(|c| !node.busy_cpus.contains(c)) {
                node.busy_cpus.push(c);
            }
        }
        n
    }

    /// CPUs of the host.
    pub fn cpu_count(&self) -> usize {
        self.nodes.iter().map(|n| n.cpus.len()).sum()
    }
}

/// CPUs that other work keeps busy: `others` (the busy fraction of all
/// CPUs that is not the daemon's own, 0-1) of `cpus`, rounded.
pub fn busy_from_load(others: f64, cpus: usize) -> usize {
    (others.clamp(0.0, 1.0) * cpus as f64).round() as usize
}

/// Bandwidth of one (CPU node, device node) path, from the I/O model
/// (seed 001 Tables IV/V; seed 000 Table 5.1 B^0 and B^max).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Path {
    /// B^0: what one thread on the CPU node moves to/from a device on the
    /// device node, Gbps.
    pub single_gbps: f64,
    /// B^max: what all threads on that path together can move, Gbps.
    pub max_gbps: f64,
}

/// Per-path bandwidths, `read[c][d]` / `write[c][d]` with `c` and `d` indices
/// into `Host::nodes` (CPU node, device node). `read` is device -> memory
/// (disk read, NIC receive; seed 001 Table V), `write` is memory -> device
/// (disk write, NIC send; seed 001 Table IV).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IoModel {
    pub read: Vec<Vec<Path>>,
    pub write: Vec<Vec<Path>>,
}

/// Defaults of [`IoModel::from_distances`]: what one local thread and one
/// local path move when no measured model is available.
pub const DEFAULT_LOCAL_SINGLE_GBPS: f64 = 10.0;
/// See [`DEFAULT_LOCAL_SINGLE_GBPS`].
pub const DEFAULT_LOCAL_MAX_GBPS: f64 = 50.0;

impl IoModel {
    /// A model derived from SLIT distances: bandwidth scales with 10/distance
    /// (seed 001 Table IV memcpy: 51.2 local vs 26.6 Gbps class 3, about the
    /// 10/22 two-hop ratio). Without distances every remote pair is 20.
    pub fn from_distances(n: usize, distances: Option<&Vec<Vec<u32>>>) -> IoModel {
        let table: Vec<Vec<Path>> = (0..n)
            .map(|c| {
                (0..n)
                    .map(|d| {
                        let dist = distances
                            .and_then(|m| m.get(c).and_then(|row| row.get(d)).copied())
                            .filter(|&x| x >= 10)
                            .unwrap_or(if c == d { 10 } else { 20 });
                        let f = 10.0 / f64::from(dist);
                        Path {
                            single_gbps: DEFAULT_LOCAL_SINGLE_GBPS * f,
                            max_gbps: DEFAULT_LOCAL_MAX_GBPS * f,
                        }
                    })
                    .collect()
            })
            .collect();
        IoModel {
            read: table.clone(),
            write: table,
        }
    }
}

/// One transfer as seen on this host: data flows from `source` to `sink`.
/// A sending host has storage -> NIC, a receiving host NIC -> storage, a
/// local copy storage -> storage.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// Device name the data comes from.
    pub source: String,
    /// Device name the data goes to.
    pub sink: String,
    /// Bytes to move; weights concurrent requests (all equal when absent).
    #[serde(default)]
    pub bytes: Option<u64>,
}

/// Knobs of the model; the defaults follow the seeds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Params {
    /// C of Table 5.1: threads per node that do not degrade the node. `None`:
    /// one per free CPU.
    pub max_threads_per_node: Option<u32>,
    /// CPUs kept free on every node that hosts a device in use, for its
    /// interrupts (seed 000 4.2.2: node 6 beat node 7 because node 7 served
    /// the interrupts). On a one-node host only if a CPU is left for threads.
    pub irq_reserved_cpus: u32,
    /// Cap on threads of one stage (seed 000 5.1.3: about eight threads
    /// saturate a device; kept a little above to let slow paths catch up).
    pub max_threads_per_stage: u32,
    /// Buffers per network thread (seed 000 6.1.5 sizes buffers by the
    /// number of network threads) and the block size of one buffer.
    pub buffers_per_thread: u32,
    pub block_bytes: u64,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            max_threads_per_node: None,
            irq_reserved_cpus: 1,
            max_threads_per_stage: 12,
            buffers_per_thread: 8,
            block_bytes: 2 << 20,
        }
    }
}

/// Everything the scheduler needs for one decision.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Instance {
    pub host: Host,
    /// Measured I/O model; `None` derives one from `host.distances`.
    #[serde(default)]
    pub model: Option<IoModel>,
    pub requests: Vec<Request>,
    #[serde(default)]
    pub params: Params,
}

/// Why an instance cannot be scheduled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SchedError {
    NoNodes,
    NoRequests,
    UnknownDevice(String),
    UnknownNode { device: String, node: u32 },
    BadModel(String),
}

impl fmt::Display for SchedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SchedError::NoNodes => write!(f, "host has no NUMA nodes"),
            SchedError::NoRequests => write!(f, "no requests to schedule"),
            SchedError::UnknownDevice(d) => write!(f, "unknown device {d}"),
            SchedError::UnknownNode { device, node } => {
                write!(f, "device {device} is on node {node}, which the host lacks")
            }
            SchedError::BadModel(m) => write!(f, "I/O model: {m}"),
        }
    }
}

impl std::error::Error for SchedError {}

/// Role of a thread group (seed 000 6.1.5: readers/writers, senders/receivers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Reader,
    Writer,
    Sender,
    Receiver,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Reader => "reader",
            Role::Writer => "writer",
            Role::Sender => "sender",
            Role::Receiver => "receiver",
        }
    }
}

/// Direction of a stage relative to its device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Dir {
    Read,
    Write,
}

/// One pipeline stage of one request, with its per-CPU-node bandwidths.
#[derive(Clone, Debug)]
pub(crate) struct Stage {
    pub role: Role,
    pub device: usize,
    pub dir: Dir,
    /// Index of the device's node, `None` when unknown.
    pub dev_node: Option<usize>,
    pub cap: f64,
    /// B^0(c, d) per CPU node index.
    pub b0: Vec<f64>,
    /// B^max(c, d) per CPU node index.
    pub bmax: Vec<f64>,
    /// Eq. 5.5 bound per CPU node (also capped by the node budget).
    pub ub: Vec<u32>,
}

/// An instance checked and flattened for the solvers. Stage `k` of request
/// `r` is `stages[2 * r + k]`, k = 0 the in-stage, k = 1 the out-stage.
#[derive(Clone, Debug)]
pub(crate) struct Resolved {
    pub n: usize,
    /// Per-node thread budget C_c (free CPUs minus IRQ reserve, capped by C).
    pub budget: Vec<u32>,
    /// CPUs that may be handed to threads, per node, in order.
    pub free_cpus: Vec<Vec<usize>>,
    pub stages: Vec<Stage>,
    /// Normalised request weights D_r (max 1).
    pub weight: Vec<f64>,
    pub max_per_stage: u32,
    pub notes: Vec<String>,
}

impl Resolved {
    pub fn requests(&self) -> usize {
        self.stages.len() / 2
    }
}

/// Whether two stages compete for the same interconnect path (and so the
/// same B^max): same direction, same device node, same CPU node.
pub(crate) fn path_key(st: &Stage, c: usize) -> Option<(Dir, usize, usize)> {
    st.dev_node.map(|d| (st.dir, c, d))
}

impl Instance {
    /// Check the instance and flatten it for the solvers: one stage per
    /// request end, the free CPUs and thread budget of every node, each
    /// stage's per-node thread bound (eq. 5.5) and the requests' weights.
    pub(crate) fn resolve(&self) -> Result<Resolved, SchedError> {
        let n = self.host.nodes.len();
        if n == 0 {
            return Err(SchedError::NoNodes);
        }
        if self.requests.is_empty() {
            return Err(SchedError::NoRequests);
        }
        let derived;
        let model = match &self.model {
            Some(m) => m,
            None => {
                derived = IoModel::from_distances(n, self.host.distances.as_ref());
                &derived
            }
        };
        check_model(model, n)?;
        let mut notes = Vec::new();
        let (mut stages, used_dev_nodes) = self.stages(model, &mut notes)?;
        let (budget, free_cpus) = self.budgets(&used_dev_nodes);
        let max_per_stage = self.params.max_threads_per_stage.max(1);
        for st in &mut stages {
            st.ub = upper_bounds(st, &budget, max_per_stage);
        }
        Ok(Resolved {
            n,
            budget,
            free_cpus,
            stages,
            weight: self.weights(),
            max_per_stage,
            notes,
        })
    }

    /// One stage per end of every request (source end, then sink end), with
    /// its device's bandwidths from every CPU node; also which nodes hold a
    /// device (their lowest CPUs take the interrupts, see [`Self::budgets`]).
    fn stages(
        &self,
        model: &IoModel,
        notes: &mut Vec<String>,
    ) -> Result<(Vec<Stage>, Vec<bool>), SchedError> {
        let host = &self.host;
        let n = host.nodes.len();
        let idx_of: HashMap<u32, usize> = host
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.id, i))
            .collect();
        let mut stages = Vec::with_capacity(2 * self.requests.len());
        let mut used_dev_nodes = vec![false; n];
        for req in &self.requests {
            for (k, name) in [(0, &req.source), (1, &req.sink)] {
                let di = host
                    .devices
                    .iter()
                    .position(|d| &d.name == name)
                    .ok_or_else(|| SchedError::UnknownDevice(name.to_string()))?;
                let dev = &host.devices[di];
                let dev_node = match dev.node {
                    Some(id) => Some(*idx_of.get(&id).ok_or_else(|| SchedError::UnknownNode {
                        device: dev.name.clone(),
                        node: id,
                    })?),
                    None => None,
                };
                let (dir, role) = match (k, dev.kind) {
                    (0, DeviceKind::Storage) => (Dir::Read, Role::Reader),
                    (0, DeviceKind::Nic) => (Dir::Read, Role::Receiver),
                    (_, DeviceKind::Storage) => (Dir::Write, Role::Writer),
                    (_, DeviceKind::Nic) => (Dir::Write, Role::Sender),
                };
                let table = if dir == Dir::Read {
                    &model.read
                } else {
                    &model.write
                };
                let (b0, bmax) = match dev_node {
                    Some(d) => (0..n)
                        .map(|c| (table[c][d].single_gbps, table[c][d].max_gbps))
                        .unzip(),
                    None => {
                        let note = format!(
                            "device {} has no known NUMA node: its threads are spread over all nodes",
                            dev.name
                        );
                        if !notes.contains(&note) {
                            notes.push(note);
                        }
                        node_averages(table, n)
                    }
                };
                if let Some(d) = dev_node {
                    used_dev_nodes[d] = true;
                }
                stages.push(Stage {
                    role,
                    device: di,
                    dir,
                    dev_node,
                    cap: dev.capacity_gbps.max(0.0),
                    b0,
                    bmax,
                    ub: Vec::new(),
                });
            }
        }
        Ok((stages, used_dev_nodes))
    }

    /// Every node's free CPUs (minus the interrupt reserve on nodes that
    /// hold a device) and its thread budget.
    fn budgets(&self, used_dev_nodes: &[bool]) -> (Vec<u32>, Vec<Vec<usize>>) {
        let n = self.host.nodes.len();
        let mut budget = Vec::with_capacity(n);
        let mut free_cpus = Vec::with_capacity(n);
        for (i, node) in self.host.nodes.iter().enumerate() {
            let mut free: Vec<usize> = node
                .cpus
                .iter()
                .copied()
                .filter(|c| !node.busy_cpus.contains(c))
                .collect();
            free.sort_unstable();
            free.dedup();
            let reserve = self.params.irq_reserved_cpus as usize;
            // On a one-node host the reserve must leave a CPU for the
            // threads; with more nodes the neighbours take the work.
            if used_dev_nodes[i] && reserve > 0 && (n > 1 || free.len() > reserve) {
                // Lowest-numbered CPUs take the device interrupts (seed 000
                // 4.2.2, 7.2.2: IRQs land on the first CPUs by default).
                free.drain(..reserve.min(free.len()));
            }
            let mut b = free.len() as u32;
            if let Some(c) = self.params.max_threads_per_node {
                b = b.min(c);
            }
            budget.push(b);
            free_cpus.push(free);
        }
        (budget, free_cpus)
    }

    /// Requests weighted by their size relative to the largest when every
    /// size is known, equally otherwise.
    fn weights(&self) -> Vec<f64> {
        let maxb = self
            .requests
            .iter()
            .map(|r| r.bytes.unwrap_or(1) as f64)
            .fold(0.0, f64::max);
        let all_known = self.requests.iter().all(|r| r.bytes.is_some());
        self.requests
            .iter()
            .map(|r| {
                if all_known && maxb > 0.0 {
                    (r.bytes.unwrap_or(0) as f64 / maxb).max(1e-6)
                } else {
                    1.0
                }
            })
            .collect()
    }
}

/// The model's read and write tables must be n x n.
fn check_model(model: &IoModel, n: usize) -> Result<(), SchedError> {
    for (name, t) in [("read", &model.read), ("write", &model.write)] {
        if t.len() != n || t.iter().any(|row| row.len() != n) {
            return Err(SchedError::BadModel(format!(
                "{name} table must be {n}x{n} (one row and column per node)"
            )));
        }
    }
    Ok(())
}

/// A device of unknown attachment: expect the average over all possible
/// device nodes from every CPU node, and spread its threads (heuristic).
fn node_averages(table: &[Vec<Path>], n: usize) -> (Vec<f64>, Vec<f64>) {
    (0..n)
        .map(|c| {
            let s: f64 = table[c].iter().map(|p| p.single_gbps).sum();
            let m: f64 = table[c].iter().map(|p| p.max_gbps).sum();
            (s / n as f64, m / n as f64)
        })
        .unzip()
}

/// A stage's thread bound per node: eq. 5.5 (more threads than
/// ceil(Bmax/B0) cannot help), the node's budget and the per-stage cap.
fn upper_bounds(st: &Stage, budget: &[u32], max_per_stage: u32) -> Vec<u32> {
    (0..budget.len())
        .map(|c| {
            if st.b0[c] <= 0.0 || st.bmax[c] <= 0.0 {
                0
            } else {
                let k = (st.bmax[c] / st.b0[c] - 1e-9).ceil().max(1.0) as u32;
                k.min(budget[c]).min(max_per_stage)
            }
        })
        .collect()
}

/// Decision variables gamma: `threads[r][k][c]` threads of stage k (0 = in,
/// 1 = out) of request r on node index c.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    pub threads: Vec<[Vec<u32>; 2]>,
}

impl Assignment {
    pub(crate) fn zero(r: &Resolved) -> Assignment {
        Assignment {
            threads: (0..r.requests())
                .map(|_| [vec![0; r.n], vec![0; r.n]])
                .collect(),
        }
    }

    pub(crate) fn stage(&self, k: usize) -> &[u32] {
        &self.threads[k / 2][k % 2]
    }

    /// Total threads on each node (left side of the corrected Eq. 5.4).
    pub fn per_node(&self, n: usize) -> Vec<u32> {
        let mut v = vec![0; n];
        for req in &self.threads {
            for st in req {
                for (c, &g) in st.iter().enumerate().take(n) {
                    v[c] += g;
                }
            }
        }
        v
    }
}

/// Whether `a` satisfies the integer constraints: corrected Eq. 5.4 (node
/// budget), Eq. 5.5 (path bound) and the per-stage cap.
pub(crate) fn feasible(r: &Resolved, a: &Assignment) -> bool {
    if a.threads.len() != r.requests() || a.threads.iter().flatten().any(|s| s.len() != r.n) {
        return false;
    }
    let per_node = a.per_node(r.n);
    if per_node.iter().zip(&r.budget).any(|(u, b)| u > b) {
        return false;
    }
    r.stages.iter().enumerate().all(|(k, st)| {
        let g = a.stage(k);
        g.iter().zip(&st.ub).all(|(x, u)| x <= u) && g.iter().sum::<u32>() <= r.max_per_stage
    })
}

/// Rate of one stage in isolation: sum over nodes of min(gamma B0, Bmax),
/// capped by the device (Eq. 5.1's linear-until-the-limit assumption).
pub(crate) fn stage_rate(st: &Stage, g: &[u32]) -> f64 {
    let s: f64 = g
        .iter()
        .enumerate()
        .map(|(c, &x)| (f64::from(x) * st.b0[c]).min(st.bmax[c]))
        .sum();
    s.min(st.cap)
}

/// Whether the stages share any path or device-direction (then an LP is
/// needed to split the shared capacity).
pub(crate) fn shares_resources(r: &Resolved) -> bool {
    let mut devs = std::collections::HashSet::new();
    let mut paths = std::collections::HashSet::new();
    for st in &r.stages {
        if !devs.insert((st.device, st.dir)) {
            return true;
        }
        if let Some(d) = st.dev_node {
            if !paths.insert((st.dir, d)) {
                return true;
            }
        }
    }
    false
}
