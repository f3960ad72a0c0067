//! Algorithm 1 (seed 001 sec. V-A; seed 000 sec. 4.3.1): memcpy threads pinned
//! to the target node k stand in for a device's DMA engine. Device write: the
//! source is on node i, the sink on k. Device read: the source on k, the sink
//! on i. One thread per core of k, released together from a barrier.

use crate::layout::HostLayout;
use crate::numa::{CopyCtx, NodeBuf, NumaOps};
use crate::perf::HwCounter;
use crate::Mode;
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::time::Duration;

/// Floor for the per-thread buffer so tiny LLCs still give a stable timing.
pub const MIN_BYTES_PER_THREAD: usize = 1 << 20;

/// How to run the characterization.
#[derive(Debug, Clone)]
pub struct CharConfig {
    /// Target nodes; empty = `HostLayout::default_targets()`.
    pub targets: Vec<u32>,
    pub modes: Vec<Mode>,
    /// Bytes per thread buffer; `None` = 4 x LLC split over the threads
    /// (seed 001 sec. III-B: arrays at least four times the largest cache).
    pub bytes_per_thread: Option<usize>,
    /// Timed repetitions (min/median/max are taken over these).
    pub reps: u32,
    /// Full-buffer copies per repetition.
    pub iters: u32,
    /// Pages sampled per buffer for the placement check.
    pub placement_samples: usize,
    /// Count LLC misses per thread (Eq. 3.2 proxy) when perf counters work.
    pub hw_counters: bool,
}

impl CharConfig {
    /// Default run: 7 repetitions of 2 full copies. On a 2-socket host with a
    /// 30-60 MB LLC this is ~0.5 s per (target, source, mode) triple.
    pub fn standard() -> Self {
        CharConfig {
            targets: Vec::new(),
            modes: vec![Mode::Write, Mode::Read],
            bytes_per_thread: None,
            reps: 7,
            iters: 2,
            placement_samples: 64,
            hw_counters: false,
        }
    }
    /// `--quick`: 3 repetitions of one copy, same buffer rule.
    pub fn quick() -> Self {
        CharConfig {
            reps: 3,
            iters: 1,
            ..Self::standard()
        }
    }
}

/// Aggregate bandwidth of all threads of the target for one varying node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeStat {
    pub node: u32,
    pub min_gbps: f64,
    pub median_gbps: f64,
    pub max_gbps: f64,
    /// LLC misses per MiB copied, when hardware counters were readable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llc_misses_per_mib: Option<f64>,
}

/// All measurements for one target node and mode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    pub target: u32,
    pub mode: Mode,
    pub threads: usize,
    pub bytes_per_thread: usize,
    pub reps: u32,
    pub iters: u32,
    /// Whether every sampled page was found on its intended node.
    pub placement_verified: bool,
    pub per_node: Vec<NodeStat>,
}

/// Median of a non-empty sample.
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// Allocate and check placement. Returns `false` when the kernel cannot say.
fn alloc_verified(
    ops: &dyn NumaOps,
    node: u32,
    bytes: usize,
    samples: usize,
) -> Result<(NodeBuf, bool)> {
    let buf = ops
        .alloc_on_node(node, bytes)
        .with_context(|| format!("allocating {bytes} bytes on node {node}"))?;
    match ops.page_nodes(&buf, samples)? {
        None => Ok((buf, false)),
        Some(nodes) => {
            let off = nodes.iter().filter(|&&n| n != node).count();
            if off > 0 {
                bail!(
                    "placement check failed: {off} of {} sampled pages not on node {node}",
                    nodes.len()
                );
            }
            Ok((buf, true))
        }
    }
}

/// Per-thread outcome: per-rep durations and LLC misses (if counted).
type ThreadOut = (Vec<Duration>, Option<u64>);

/// One copy thread: pin to the target node, meet the others at the barrier,
/// then time `reps` repetitions, each started together from the barrier.
#[allow(clippy::too_many_arguments)]
fn copy_thread(
    ops: &dyn NumaOps,
    cpus: &[u32],
    ctx: CopyCtx,
    src: &NodeBuf,
    dst: &mut NodeBuf,
    cfg: &CharConfig,
    barrier: &Barrier,
    failed: &AtomicBool,
) -> Result<ThreadOut> {
    let pinned = ops.pin_current_thread(cpus);
    if pinned.is_err() {
        failed.store(true, Ordering::SeqCst);
    }
    let counter = if cfg.hw_counters {
        HwCounter::llc_misses().ok()
    } else {
        None
    };
    // Every thread reaches this barrier, so one failure cannot deadlock the rest.
    barrier.wait();
    pinned?;
    if failed.load(Ordering::SeqCst) {
        bail!("another copy thread failed to pin");
    }
    let start = counter.as_ref().and_then(|c| c.read().ok());
    let mut durs = Vec::with_capacity(cfg.reps as usize);
    for _ in 0..cfg.reps {
        barrier.wait();
        durs.push(ops.timed_copy(&ctx, src, dst, cfg.iters));
    }
    let misses = match (counter.as_ref(), start) {
        (Some(c), Some(a)) => c.read().ok().map(|b| b.saturating_sub(a)),
        _ => None,
    };
    Ok((durs, misses))
}

/// Aggregate Gbps per repetition: all threads start at the barrier, so the
/// wall time of a repetition is the slowest thread's copy time.
pub fn aggregate_gbps(
    per_thread: &[Vec<Duration>],
    bytes_per_thread: usize,
    iters: u32,
) -> Vec<f64> {
    let reps = per_thread.iter().map(Vec::len).min().unwrap_or(0);
    let bits = per_thread.len() as f64 * bytes_per_thread as f64 * iters as f64 * 8.0;
    (0..reps)
        .map(|r| {
            let wall = per_thread
                .iter()
                .map(|d| d[r])
                .max()
                .unwrap_or_default()
                .as_secs_f64()
                .max(1e-12);
            bits / wall / 1e9
        })
        .collect()
}

/// Run Algorithm 1 for every target and mode in `cfg`.
pub fn characterize(
    layout: &HostLayout,
    ops: &dyn NumaOps,
    cfg: &CharConfig,
) -> Result<Vec<Measurement>> {
    if cfg.reps == 0 || cfg.iters == 0 {
        bail!("reps and iters must be positive");
    }
    let targets = if cfg.targets.is_empty() {
        layout.default_targets()
    } else {
        cfg.targets.clone()
    };
    let mut out = Vec::new();
    for &k in &targets {
        let node = layout
            .node(k)
            .ok_or_else(|| anyhow!("node {k} not in host layout {:?}", layout.node_ids()))?;
        if node.cpus.is_empty() {
            bail!("node {k} has no CPUs to run the copy threads");
        }
        // Algorithm 1 line 2: one thread per core of the target node.
        let m = node.cpus.len();
        let bytes = cfg.bytes_per_thread.unwrap_or_else(|| {
            ((4 * layout.llc_bytes as usize).div_ceil(m)).max(MIN_BYTES_PER_THREAD)
        });
        let mut verified = true;
        // The k-side buffers serve as sink (write) and source (read) for every i.
        let mut k_set = Vec::with_capacity(m);
        for _ in 0..m {
            let (b, v) = alloc_verified(ops, k, bytes, cfg.placement_samples)?;
            verified &= v;
            k_set.push(b);
        }
        let mut results: Vec<Measurement> = cfg
            .modes
            .iter()
            .map(|&mode| Measurement {
                target: k,
                mode,
                threads: m,
                bytes_per_thread: bytes,
                reps: cfg.reps,
                iters: cfg.iters,
                placement_verified: true,
                per_node: Vec::new(),
            })
            .collect();
        for i in layout.node_ids() {
            let mut i_set = Vec::with_capacity(m);
            for _ in 0..m {
                let (b, v) = alloc_verified(ops, i, bytes, cfg.placement_samples)?;
                verified &= v;
                i_set.push(b);
            }
            for res in results.iter_mut() {
                let ctx = CopyCtx {
                    target: k,
                    other: i,
                    mode: res.mode,
                    threads: m,
                };
                let pairs: Vec<(&NodeBuf, &mut NodeBuf)> = match res.mode {
                    Mode::Write => i_set.iter().zip(k_set.iter_mut()).collect(),
                    Mode::Read => k_set.iter().zip(i_set.iter_mut()).collect(),
                };
                let (per_thread, misses) = run_threads(ops, &node.cpus, ctx, pairs, cfg)
                    .with_context(|| format!("target {k}, node {i}, {:?}", res.mode))?;
                let gbps = aggregate_gbps(&per_thread, bytes, cfg.iters);
                let mib =
                    (m * bytes) as f64 * cfg.iters as f64 * cfg.reps as f64 / (1 << 20) as f64;
                res.per_node.push(NodeStat {
                    node: i,
                    min_gbps: gbps.iter().copied().fold(f64::INFINITY, f64::min),
                    median_gbps: median(&gbps),
                    max_gbps: gbps.iter().copied().fold(0.0, f64::max),
                    llc_misses_per_mib: misses.map(|x| x as f64 / mib),
                });
            }
        }
        for r in results.iter_mut() {
            r.placement_verified = verified;
        }
        out.extend(results);
    }
    Ok(out)
}

/// Spawn the copy threads of one group and collect per-thread durations.
fn run_threads(
    ops: &dyn NumaOps,
    cpus: &[u32],
    ctx: CopyCtx,
    pairs: Vec<(&NodeBuf, &mut NodeBuf)>,
    cfg: &CharConfig,
) -> Result<(Vec<Vec<Duration>>, Option<u64>)> {
    let m = pairs.len();
    let barrier = Barrier::new(m);
    let failed = AtomicBool::new(false);
    let outs: Vec<Result<ThreadOut>> = std::thread::scope(|s| {
        let handles: Vec<_> = pairs
            .into_iter()
            .map(|(src, dst)| {
                let (barrier, failed) = (&barrier, &failed);
                s.spawn(move || copy_thread(ops, cpus, ctx, src, dst, cfg, barrier, failed))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow!("copy thread panicked")))
            })
            .collect()
    });
    let outs = outs.into_iter().collect::<Result<Vec<_>>>()?;
    let misses = outs.iter().try_fold(0u64, |acc, o| o.1.map(|v| acc + v));
    Ok((outs.into_iter().map(|o| o.0).collect(), misses))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numa::{LinuxNuma, SimNuma};

    /// AMD 8-node host of seed 001 with devices on node 7: Table IV/V class
    /// averages as the node-7 rows; other rows local-biased.
    fn amd_sim() -> SimNuma {
        let layout = HostLayout::synthetic(8, 4, 2, 5 << 20, vec![7]);
        let mut w = vec![vec![30.0; 8]; 8];
        let mut r = vec![vec![30.0; 8]; 8];
        for k in 0..8 {
            w[k][k] = 50.0;
            r[k][k] = 50.0;
        }
        w[7] = vec![44.5, 44.5, 26.6, 26.6, 44.5, 44.5, 51.2, 51.2];
        r[7] = vec![40.4, 40.4, 48.6, 48.6, 27.9, 40.4, 49.1, 49.1];
        let mut s = SimNuma::new(layout, w, r);
        s.jitter = 0.02;
        s
    }

    fn small(reps: u32) -> CharConfig {
        CharConfig {
            bytes_per_thread: Some(1 << 20),
            reps,
            iters: 1,
            ..CharConfig::standard()
        }
    }

    #[test]
    fn median_and_aggregate() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        let ms = Duration::from_millis;
        // Two threads, 1 MB each; the slower thread (2 ms) sets the wall time.
        let g = aggregate_gbps(&[vec![ms(1), ms(4)], vec![ms(2), ms(1)]], 1_000_000, 1);
        assert!(
            (g[0] - 8.0).abs() < 1e-9 && (g[1] - 4.0).abs() < 1e-9,
            "{g:?}"
        );
    }

    #[test]
    fn simulated_eight_node_host_reproduces_tables() {
        let sim = amd_sim();
        let layout = HostLayout::synthetic(8, 4, 2, 5 << 20, vec![7]);
        let t = std::time::Instant::now();
        let ms = characterize(&layout, &sim, &small(5)).unwrap();
        assert!(t.elapsed() < Duration::from_secs(5));
        assert_eq!(ms.len(), 2);
        let w = &ms[0];
        assert_eq!((w.target, w.mode, w.threads), (7, Mode::Write, 4));
        assert!(w.placement_verified);
        assert_eq!(w.per_node.len(), 8);
        for s in &w.per_node {
            assert!(s.min_gbps <= s.median_gbps && s.median_gbps <= s.max_gbps);
        }
        // Jitter is +-2 %, so the medians sit near the configured values.
        assert!((w.per_node[2].median_gbps - 26.6).abs() < 26.6 * 0.021);
        let model = crate::Model::from_measurements(layout, sim.describe(), ms, &Err("sim".into()))
            .unwrap();
        assert_eq!(
            model.entries[0].classes,
            vec![vec![6, 7], vec![0, 1, 4, 5], vec![2, 3]]
        );
        assert_eq!(
            model.entries[1].classes,
            vec![vec![6, 7], vec![2, 3], vec![0, 1, 5], vec![4]]
        );
        let text = crate::render_text(&model);
        assert!(
            text.contains("CPU Centric levels :\n    Class1: 7 6 "),
            "{text}"
        );
        assert!(text.contains("    Class4: 4 "), "{text}");
        assert!(text.contains("not measurable on this host: sim"), "{text}");
    }

    #[test]
    fn all_targets_fill_the_matrix() {
        let sim = amd_sim();
        let layout = HostLayout::synthetic(8, 4, 2, 5 << 20, vec![]);
        let cfg = CharConfig {
            modes: vec![Mode::Write],
            ..small(1)
        };
        let ms = characterize(&layout, &sim, &cfg).unwrap();
        assert_eq!(
            ms.iter().map(|m| m.target).collect::<Vec<_>>(),
            (0..8).collect::<Vec<_>>()
        );
        let model = crate::Model::from_measurements(layout, sim.describe(), ms, &Err("sim".into()))
            .unwrap();
        let m = &model.write_matrix_gbps;
        assert!(m.iter().all(|r| r.iter().all(Option::is_some)));
        assert!((m[3][3].unwrap() - 50.0).abs() < 1.1);
        assert!((m[3][0].unwrap() - 30.0).abs() < 0.7);
        assert!(model.read_matrix_gbps.iter().flatten().all(Option::is_none));
    }

    #[test]
    fn misplaced_pages_and_bad_targets_are_errors() {
        let layout = HostLayout::synthetic(8, 4, 2, 5 << 20, vec![7]);
        let mut sim = amd_sim();
        sim.misplace_node = Some(3);
        let e = characterize(&layout, &sim, &small(1)).unwrap_err();
        assert!(format!("{e:#}").contains("placement check failed"), "{e:#}");
        let cfg = CharConfig {
            targets: vec![9],
            ..small(1)
        };
        assert!(characterize(&layout, &amd_sim(), &cfg).is_err());
        // A layout whose CPUs the simulator does not know: pinning fails in
        // every thread, and the barrier must not deadlock.
        let other = HostLayout::synthetic(8, 5, 2, 5 << 20, vec![7]);
        let e = characterize(&other, &amd_sim(), &small(1)).unwrap_err();
        assert!(format!("{e:#}").contains("not in layout"), "{e:#}");
    }

    #[test]
    fn runs_end_to_end_on_this_host() {
        let layout = HostLayout::from_sysfs(std::path::Path::new("/")).unwrap();
        let k = layout.default_targets()[0];
        let cfg = CharConfig {
            targets: vec![k],
            bytes_per_thread: Some(2 << 20),
            reps: 3,
            iters: 2,
            ..CharConfig::standard()
        };
        let ms = characterize(&layout, &LinuxNuma, &cfg).unwrap();
        assert_eq!(ms.len(), 2);
        for m in &ms {
            assert_eq!(m.threads, layout.node(k).unwrap().cpus.len());
            assert_eq!(m.per_node.len(), layout.nodes.len());
            for s in &m.per_node {
                assert!(
                    s.min_gbps > 0.0 && s.min_gbps <= s.median_gbps && s.median_gbps <= s.max_gbps
                );
            }
        }
        let model = crate::characterize_host(layout, &LinuxNuma, &cfg, true).unwrap();
        assert!(model.entries[0].class_avg_gbps[0] > 0.0);
        assert!(model.entries[0].classes[0].contains(&k));
    }
}
