//! The placement plan the daemon follows, and its text rendering.

use crate::model::{stage_rate, Assignment, DeviceKind, Instance, Resolved};
use ramsys_units::format_size as human_bytes;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write;

pub use crate::model::Role;

/// One group of threads of one role on one device, pinned one per CPU.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ThreadGroup {
    pub role: Role,
    pub device: String,
    pub count: u32,
    /// CPU of each thread (`count` entries).
    pub cpus: Vec<usize>,
}

/// Buffer memory to allocate on one node (seed 000 6.1.5 bulk allocation).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BufferAlloc {
    /// Kernel node id.
    pub node: u32,
    pub bytes: u64,
}

/// Parallel streams (one per network thread, seed 000 5.2.1) on one NIC.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamAlloc {
    pub nic: String,
    pub count: u32,
}

/// What the plan expects to reach and what limits it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Prediction {
    /// Role of the stage that limits the slowest request ("reader",
    /// "writer", "sender", "receiver"), or "none" for an empty plan.
    pub bottleneck: String,
    /// Predicted aggregate end-to-end throughput, Gbps.
    pub gbps: f64,
}

/// A placement plan. Serialises to
/// `{"threads": [...], "buffers": [...], "streams": [...], "predicted": {...}}`,
/// plus `"notes"` only when there is something to warn about.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub threads: Vec<ThreadGroup>,
    pub buffers: Vec<BufferAlloc>,
    pub streams: Vec<StreamAlloc>,
    pub predicted: Prediction,
    /// Caveats (unknown device node, invalid instance, no exact solution).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl Plan {
    /// An empty plan that explains why it is empty.
    pub fn empty(note: String) -> Plan {
        Plan {
            threads: Vec::new(),
            buffers: Vec::new(),
            streams: Vec::new(),
            predicted: Prediction {
                bottleneck: "none".into(),
                gbps: 0.0,
            },
            notes: vec![note],
        }
    }

    /// Threads of `role` on `device`, summed over groups.
    pub fn count(&self, role: Role, device: &str) -> u32 {
        self.threads
            .iter()
            .filter(|t| t.role == role && t.device == device)
            .map(|t| t.count)
            .sum()
    }
}

/// Turn an assignment into a plan: hand out CPUs, place buffers with the
/// network-side threads, count streams, predict.
pub(crate) fn build(inst: &Instance, r: &Resolved, a: &Assignment) -> Plan {
    let host = &inst.host;
    let mut next_cpu = vec![0usize; r.n];
    let mut threads = Vec::new();
    let mut buffers: BTreeMap<u32, u64> = BTreeMap::new();
    let mut streams: BTreeMap<String, u32> = BTreeMap::new();
    let per_thread = u64::from(inst.params.buffers_per_thread) * inst.params.block_bytes;
    for q in 0..r.requests() {
        let (sin, sout) = (&r.stages[2 * q], &r.stages[2 * q + 1]);
        // Buffers follow the network stage (seed 000 6.1.5: TCP/IP costs more
        // than storage I/O, so buffers sit on the NIC's node); a storage-only
        // copy keeps them with its writers.
        let buf_stage = if host.devices[sin.device].kind == DeviceKind::Nic
            && host.devices[sout.device].kind != DeviceKind::Nic
        {
            0
        } else {
            1
        };
        for k in 0..2 {
            let st = &r.stages[2 * q + k];
            let g = &a.threads[q][k];
            let dev = &host.devices[st.device];
            let mut cpus = Vec::new();
            for (c, &cnt) in g.iter().enumerate() {
                for _ in 0..cnt {
                    let free = &r.free_cpus[c];
                    // Budget <= free CPUs, so this wraps only if a caller
                    // bypassed it (then threads share CPUs rather than fail).
                    if !free.is_empty() {
                        cpus.push(free[next_cpu[c] % free.len()]);
                        next_cpu[c] += 1;
                    }
                }
                if k == buf_stage && cnt > 0 {
                    *buffers.entry(host.nodes[c].id).or_default() += u64::from(cnt) * per_thread;
                }
            }
            let count: u32 = g.iter().sum();
            if dev.kind == DeviceKind::Nic && count > 0 {
                *streams.entry(dev.name.clone()).or_default() += count;
            }
            if count > 0 {
                threads.push(ThreadGroup {
                    role: st.role,
                    device: dev.name.clone(),
                    count,
                    cpus,
                });
            }
        }
    }
    let gbps = crate::eval::evaluate_resolved(r, a);
    // Bottleneck: the slower stage of the slowest request.
    let bottleneck = (0..r.requests())
        .map(|q| {
            let i = stage_rate(&r.stages[2 * q], &a.threads[q][0]);
            let o = stage_rate(&r.stages[2 * q + 1], &a.threads[q][1]);
            let (x, k) = if o < i { (o, 1) } else { (i, 0) };
            (x / r.weight[q], r.stages[2 * q + k].role)
        })
        .min_by(|x, y| x.0.total_cmp(&y.0))
        .map(|(_, role)| role.as_str().to_string())
        .unwrap_or_else(|| "none".into());
    Plan {
        threads,
        buffers: buffers
            .into_iter()
            .map(|(node, bytes)| BufferAlloc { node, bytes })
            .collect(),
        streams: streams
            .into_iter()
            .map(|(nic, count)| StreamAlloc { nic, count })
            .collect(),
        predicted: Prediction {
            bottleneck,
            gbps: (gbps * 1000.0).round() / 1000.0,
        },
        notes: r.notes.clone(),
    }
}

/// Compact CPU list: `0-3,8,10-11`.
fn cpu_list(cpus: &[usize]) -> String {
    let mut v = cpus.to_vec();
    v.sort_unstable();
    v.dedup();
    let mut out = String::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        if !out.is_empty() {
            out.push(',');
        }
        if j > i {
            let _ = write!(out, "{}-{}", v[i], v[j]);
        } else {
            let _ = write!(out, "{}", v[i]);
        }
        i = j + 1;
    }
    out
}

/// Human-readable rendering of a plan (`ramsys plan`, `ramsys cp --explain`).
pub fn render_text(plan: &Plan) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "predicted {:.1} Gbps, bottleneck: {}",
        plan.predicted.gbps, plan.predicted.bottleneck
    );
    if plan.threads.is_empty() {
        let _ = writeln!(s, "threads: none");
    } else {
        let _ = writeln!(s, "threads:");
        for t in &plan.threads {
            let _ = writeln!(
                s,
                "  {:<8} {:<12} x{:<3} cpus {}",
                t.role.as_str(),
                t.device,
                t.count,
                cpu_list(&t.cpus)
            );
        }
    }
    if !plan.buffers.is_empty() {
        let list: Vec<String> = plan
            .buffers
            .iter()
            .map(|b| format!("node {}: {}", b.node, human_bytes(b.bytes)))
            .collect();
        let _ = writeln!(s, "buffers: {}", list.join(", "));
    }
    if !plan.streams.is_empty() {
        let list: Vec<String> = plan
            .streams
            .iter()
            .map(|x| format!("{} x{}", x.nic, x.count))
            .collect();
        let _ = writeln!(s, "streams: {}", list.join(", "));
    }
    for n in &plan.notes {
        let _ = writeln!(s, "note: {n}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_list_compacts_ranges() {
        assert_eq!(cpu_list(&[3, 0, 1, 2, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(cpu_list(&[]), "");
        assert_eq!(cpu_list(&[5]), "5");
    }

    #[test]
    fn human_bytes_units() {
        assert_eq!(human_bytes(16 << 20), "16.0 MiB");
        assert_eq!(human_bytes(2 << 30), "2.0 GiB");
        assert_eq!(human_bytes(512), "512 B");
    }
}
