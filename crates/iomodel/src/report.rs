//! Text report: bandwidth matrices, CPU-centric and memory-centric views,
//! bandwidth NUMA factors (seed 000 Tables 4.2/4.7) and the class listing in
//! the format of seed 000 Listing 4.1.

use crate::model::{Model, ModelEntry};
use crate::perf::SchedFactor;
use crate::Mode;
use std::fmt::Write;

fn fmt_opt(v: Option<f64>, prec: usize) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.prec$}"))
}

fn matrix(out: &mut String, title: &str, m: &[Vec<Option<f64>>], cols: &[u32]) {
    let rows: Vec<usize> = (0..m.len())
        .filter(|&k| m[k].iter().any(Option::is_some))
        .collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(out, "{title}");
    let _ = write!(out, "{:>8}", "");
    for c in cols {
        let _ = write!(out, "{:>9}", format!("MEM{c}"));
    }
    out.push('\n');
    for k in rows {
        let _ = write!(out, "{:>8}", format!("CPU{k}"));
        for &c in cols {
            let _ = write!(
                out,
                "{:>9}",
                fmt_opt(m[k].get(c as usize).copied().flatten(), 2)
            );
        }
        out.push('\n');
    }
    out.push('\n');
}

fn view(out: &mut String, e: &ModelEntry) {
    let (name, what) = match e.mode {
        Mode::Write => (
            "CPU-centric view (device write)",
            "threads and sink on the target, source node varies",
        ),
        Mode::Read => (
            "Memory-centric view (device read)",
            "threads and source on the target, sink node varies",
        ),
    };
    let _ = writeln!(out, "Node {} {name}: {what}", e.target);
    let _ = writeln!(
        out,
        "  {:>5} {:>9} {:>9} {:>9} {:>7} {:>6}",
        "node", "min", "median", "max", "factor", "class"
    );
    for s in &e.per_node {
        let _ = writeln!(
            out,
            "  {:>5} {:>9.2} {:>9.2} {:>9.2} {:>7} {:>6}",
            s.node,
            s.min_gbps,
            s.median_gbps,
            s.max_gbps,
            fmt_opt(e.numa_factor.get(s.node as usize).copied().flatten(), 2),
            e.class_of(s.node).map_or("-".into(), |c| c.to_string()),
        );
    }
    let _ = writeln!(out, "  Bandwidth NUMA factor (local / remote):");
    let ids: Vec<u32> = e.per_node.iter().map(|s| s.node).collect();
    let _ = write!(out, "    {:<12}", "Node ID");
    for n in &ids {
        let _ = write!(out, "{n:>7}");
    }
    let _ = write!(out, "\n    {:<12}", "NUMA factor");
    for n in &ids {
        let f = e.numa_factor.get(*n as usize).copied().flatten();
        let s = match f {
            Some(f) if (f - 1.0).abs() < 1e-9 => "1".to_string(),
            other => fmt_opt(other, 2),
        };
        let _ = write!(out, "{s:>7}");
    }
    out.push_str("\n\n");
}

/// Class lines as in Listing 4.1: the target first inside class 1.
fn levels(out: &mut String, title: &str, e: &ModelEntry) {
    let _ = writeln!(out, "{title} :");
    for (i, c) in e.classes.iter().enumerate() {
        let mut ids: Vec<u32> = c.clone();
        if let Some(p) = ids.iter().position(|&n| n == e.target) {
            ids.remove(p);
            ids.insert(0, e.target);
        }
        let list: Vec<String> = ids.iter().map(u32::to_string).collect();
        let (bw, src) = e.class_bandwidths();
        let _ = writeln!(
            out,
            "    Class{}: {:<24} ({:.2} Gbps {src})",
            i + 1,
            list.join(" "),
            bw[i]
        );
    }
}

/// Render the human-readable report.
pub fn render_text(m: &Model) -> String {
    let mut out = String::new();
    let cpus: usize = m.host.nodes.iter().map(|n| n.cpus.len()).sum();
    let _ = writeln!(out, "{} nodes available", m.host.nodes.len());
    let _ = writeln!(out, "{cpus} CPUs available");
    let _ = writeln!(out, "Last-level cache = {} bytes", m.host.llc_bytes);
    if let Some(e) = m.entries.first() {
        let _ = writeln!(
            out,
            "Buffer size per thread = {} bytes, {} repetitions x {} copies",
            e.bytes_per_thread, e.reps, e.iters
        );
        let _ = writeln!(
            out,
            "Number of Threads used in this profiling = {}",
            e.threads
        );
    }
    let _ = writeln!(out, "NUMA operations: {}", m.numa_ops);
    let unverified = m.entries.iter().any(|e| !e.placement_verified);
    let _ = writeln!(
        out,
        "Buffer placement: {}\n",
        if unverified {
            "NOT verified (kernel cannot report page nodes)"
        } else {
            "verified (sampled pages on the intended node)"
        }
    );
    let cols = m.host.node_ids();
    matrix(
        &mut out,
        "Bandwidth matrix, device write (Gbps, median; CPUk = threads and sink on k, MEMi = source on i):",
        &m.write_matrix_gbps,
        &cols,
    );
    matrix(
        &mut out,
        "Bandwidth matrix, device read (Gbps, median; CPUk = threads and source on k, MEMi = sink on i):",
        &m.read_matrix_gbps,
        &cols,
    );
    for e in &m.entries {
        view(&mut out, e);
    }
    let mut targets: Vec<u32> = m.entries.iter().map(|e| e.target).collect();
    targets.dedup();
    for t in targets {
        let _ = writeln!(out, "Node {t} IO model:");
        for e in m.entries.iter().filter(|e| e.target == t) {
            let title = match e.mode {
                Mode::Write => "CPU Centric levels",
                Mode::Read => "Memory Centric levels",
            };
            levels(&mut out, title, e);
        }
        out.push('\n');
    }
    let _ = writeln!(out, "NUMA scheduling factor (seed 000 Eq. 3.2):");
    for e in &m.entries {
        let s = match &e.sched_factor {
            SchedFactor::Unavailable { reason } => {
                format!("not measurable on this host: {reason}")
            }
            SchedFactor::Measured { per_node, note } => {
                let v: Vec<String> = per_node
                    .iter()
                    .enumerate()
                    .filter_map(|(i, f)| f.map(|f| format!("{i}:{f:.2}")))
                    .collect();
                format!("{} ({note})", v.join(" "))
            }
        };
        let _ = writeln!(out, "    node {} {}: {s}", e.target, e.mode);
    }
    if let Some(c) = &m.calibration {
        let _ = writeln!(out, "\nCalibrated with: {}", c.method);
    }
    out
}
