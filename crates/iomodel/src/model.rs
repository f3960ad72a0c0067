//! The model file (what `ramsys iomodel -o FILE` writes and `ramsys serve
//! --config` reads) and the aggregate predictor of seed 001 Eq. 1 / seed 000
//! Eq. 4.1.

use crate::charact::{Measurement, NodeStat};
use crate::classify::classify_nodes;
use crate::layout::HostLayout;
use crate::perf::{sched_factor, SchedFactor};
use crate::Mode;
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Bumped on incompatible changes of the file format.
pub const MODEL_VERSION: u32 = 1;

/// One target node and mode: per-node bandwidths and the performance classes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelEntry {
    pub target: u32,
    pub mode: Mode,
    pub threads: usize,
    pub bytes_per_thread: usize,
    pub reps: u32,
    pub iters: u32,
    pub placement_verified: bool,
    /// min/median/max per varying node.
    pub per_node: Vec<NodeStat>,
    /// Median aggregate Gbps indexed by node id (null = not measured).
    pub bandwidth_gbps: Vec<Option<f64>>,
    /// Bandwidth NUMA factor, local / remote (seed 000 Tables 4.2, 4.7).
    pub numa_factor: Vec<Option<f64>>,
    /// Performance classes, best first, ids ascending (class 1 = local package).
    pub classes: Vec<Vec<u32>>,
    /// Mean memcpy bandwidth per class.
    pub class_avg_gbps: Vec<f64>,
    /// Absolute per-class bandwidth from one real transfer per class
    /// (`calibrate`); the predictor prefers it when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibrated_gbps: Option<Vec<f64>>,
    /// Seed 000 Eq. 3.2, or why it could not be measured.
    pub sched_factor: SchedFactor,
}

impl ModelEntry {
    /// Per-class bandwidths the predictor uses, and their origin.
    pub fn class_bandwidths(&self) -> (&[f64], &'static str) {
        match &self.calibrated_gbps {
            Some(c) if c.len() == self.classes.len() => (c, "calibrated"),
            _ => (&self.class_avg_gbps, "memcpy"),
        }
    }
    /// 1-based class of `node`.
    pub fn class_of(&self, node: u32) -> Option<usize> {
        self.classes
            .iter()
            .position(|c| c.contains(&node))
            .map(|i| i + 1)
    }
}

/// How the classes were calibrated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CalibrationInfo {
    /// What the one transfer per class was (e.g. file write/read, bytes, directory).
    pub method: String,
}

/// The model file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Model {
    pub version: u32,
    pub generator: String,
    pub host: HostLayout,
    pub numa_ops: String,
    /// Median Gbps, `[target k][node i]` (rows for non-targets are null).
    pub write_matrix_gbps: Vec<Vec<Option<f64>>>,
    pub read_matrix_gbps: Vec<Vec<Option<f64>>>,
    pub entries: Vec<ModelEntry>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<CalibrationInfo>,
}

/// Read and validate a model file.
pub fn load_model(path: impl AsRef<Path>) -> Result<Model> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading model {}", path.display()))?;
    let m: Model =
        serde_json::from_str(&text).with_context(|| format!("parsing model {}", path.display()))?;
    if m.version != MODEL_VERSION {
        bail!(
            "model {} has version {}, expected {MODEL_VERSION}",
            path.display(),
            m.version
        );
    }
    for e in &m.entries {
        if e.classes.len() != e.class_avg_gbps.len() {
            bail!("model entry for node {} has mismatched classes", e.target);
        }
    }
    Ok(m)
}

/// Write a model file (pretty JSON).
pub fn save_model(model: &Model, path: impl AsRef<Path>) -> Result<()> {
    let path = path.as_ref();
    let mut s = serde_json::to_string_pretty(model)?;
    s.push('\n');
    std::fs::write(path, s).with_context(|| format!("writing model {}", path.display()))
}

impl Model {
    /// Build the model from Algorithm 1 measurements. `counters` is the
    /// outcome of the hardware-counter probe (Eq. 3.2).
    pub fn from_measurements(
        host: HostLayout,
        numa_ops: String,
        ms: Vec<Measurement>,
        counters: &Result<(), String>,
    ) -> Result<Model> {
        let width = host.nodes.iter().map(|n| n.id + 1).max().unwrap_or(1) as usize;
        let mut write = vec![vec![None; width]; width];
        let mut read = vec![vec![None; width]; width];
        let mut entries = Vec::new();
        for m in ms {
            let mut bw = vec![None; width];
            let mut misses = vec![None; width];
            for s in &m.per_node {
                if let Some(slot) = bw.get_mut(s.node as usize) {
                    *slot = Some(s.median_gbps);
                    misses[s.node as usize] = s.llc_misses_per_mib;
                }
            }
            let local = bw.get(m.target as usize).copied().flatten();
            let numa_factor = bw
                .iter()
                .map(|v| match (local, v) {
                    (Some(l), Some(v)) if *v > 0.0 => Some(l / v),
                    _ => None,
                })
                .collect();
            let out = classify_nodes(m.target, &host.packages, &bw)?;
            let row = match m.mode {
                Mode::Write => &mut write,
                Mode::Read => &mut read,
            };
            if let Some(r) = row.get_mut(m.target as usize) {
                r.clone_from(&bw);
            }
            let sf = match counters {
                Err(reason) => SchedFactor::Unavailable {
                    reason: reason.clone(),
                },
                Ok(()) => sched_factor(m.target, &misses, &bw),
            };
            entries.push(ModelEntry {
                target: m.target,
                mode: m.mode,
                threads: m.threads,
                bytes_per_thread: m.bytes_per_thread,
                reps: m.reps,
                iters: m.iters,
                placement_verified: m.placement_verified,
                per_node: m.per_node,
                bandwidth_gbps: bw,
                numa_factor,
                classes: out.classes,
                class_avg_gbps: out.class_avg_gbps,
                calibrated_gbps: None,
                sched_factor: sf,
            });
        }
        Ok(Model {
            version: MODEL_VERSION,
            generator: format!("ramsys-iomodel {}", env!("CARGO_PKG_VERSION")),
            host,
            numa_ops,
            write_matrix_gbps: write,
            read_matrix_gbps: read,
            entries,
            calibration: None,
        })
    }

    /// The entry for `target`/`mode`; `None` picks the first matching one.
    pub fn entry(&self, target: Option<u32>, mode: Option<Mode>) -> Result<&ModelEntry> {
        self.entries
            .iter()
            .find(|e| {
                (target.is_none() || target == Some(e.target))
                    && (mode.is_none() || mode == Some(e.mode))
            })
            .ok_or_else(|| anyhow!("model has no entry for node {target:?}, mode {mode:?}"))
    }
}

/// Parse `--mix CLASS=SHARE,...`: classes are 1-based as printed; shares are
/// relative weights (`50`, `50%` or `0.5`), normalised to sum to 100 %.
pub fn parse_mix(s: &str) -> Result<Vec<(usize, f64)>> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (c, v) = part
            .split_once('=')
            .ok_or_else(|| anyhow!("mix item {part:?} is not CLASS=SHARE"))?;
        let c = c.trim();
        let c = c
            .strip_prefix("class")
            .or(c.strip_prefix("Class"))
            .unwrap_or(c);
        let class: usize = c.parse().with_context(|| format!("class in {part:?}"))?;
        let v: f64 = v
            .trim()
            .trim_end_matches('%')
            .parse()
            .with_context(|| format!("share in {part:?}"))?;
        if class == 0 || !v.is_finite() || v < 0.0 {
            bail!("bad mix item {part:?} (classes start at 1, shares >= 0)");
        }
        out.push((class, v));
    }
    if out.is_empty() {
        bail!("empty mix");
    }
    Ok(out)
}

/// Seed 001 Eq. 1: BW_io = sum_i alpha_i % x BW_i, with the alphas normalised.
pub fn predict_gbps(class_bw: &[f64], mix: &[(usize, f64)]) -> Result<f64> {
    let total: f64 = mix.iter().map(|m| m.1).sum();
    if total <= 0.0 {
        bail!("mix shares sum to zero");
    }
    mix.iter().try_fold(0.0, |acc, &(class, share)| {
        let bw = class_bw
            .get(class - 1)
            .ok_or_else(|| anyhow!("class {class} not in model ({} classes)", class_bw.len()))?;
        Ok(acc + share / total * bw)
    })
}

/// |predicted - measured| / measured.
pub fn relative_error(predicted: f64, measured: f64) -> f64 {
    (predicted - measured).abs() / measured
}

/// Result of `predict`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Prediction {
    pub target: u32,
    pub mode: Mode,
    /// `calibrated` or `memcpy`.
    pub source: String,
    pub predicted_gbps: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_gbps: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relative_error: Option<f64>,
}

/// Eq. 1 against one model entry.
pub fn predict(
    model: &Model,
    target: Option<u32>,
    mode: Option<Mode>,
    mix: &[(usize, f64)],
    measured: Option<f64>,
) -> Result<Prediction> {
    let e = model.entry(target, mode)?;
    let (bw, source) = e.class_bandwidths();
    let p = predict_gbps(bw, mix)?;
    Ok(Prediction {
        target: e.target,
        mode: e.mode,
        source: source.into(),
        predicted_gbps: p,
        measured_gbps: measured,
        relative_error: measured.map(|m| relative_error(p, m)),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A model of seed 001 Table V with the RDMA_READ class bandwidths of the
    /// Eq. 1 example (class 2 = 21.998, class 3 = 18.036) as calibration.
    pub(crate) fn table_v_model() -> Model {
        let host = HostLayout::synthetic(8, 4, 2, 5 << 20, vec![7]);
        let per = [40.4, 40.4, 48.6, 48.6, 27.9, 40.4, 49.1, 49.1];
        let ms = vec![Measurement {
            target: 7,
            mode: Mode::Read,
            threads: 4,
            bytes_per_thread: 5 << 20,
            reps: 1,
            iters: 1,
            placement_verified: true,
            per_node: per
                .iter()
                .enumerate()
                .map(|(i, &v)| NodeStat {
                    node: i as u32,
                    min_gbps: v,
                    median_gbps: v,
                    max_gbps: v,
                    llc_misses_per_mib: None,
                })
                .collect(),
        }];
        let mut m =
            Model::from_measurements(host, "test".into(), ms, &Err("no counters".into())).unwrap();
        m.entries[0].calibrated_gbps = Some(vec![22.0, 21.998, 18.036, 16.1]);
        m
    }

    #[test]
    fn eq1_reproduces_seed_example() {
        let m = table_v_model();
        assert_eq!(
            m.entries[0].classes,
            vec![vec![6, 7], vec![2, 3], vec![0, 1, 5], vec![4]]
        );
        let mix = parse_mix("2=50,3=50").unwrap();
        let p = predict(&m, Some(7), Some(Mode::Read), &mix, Some(19.415)).unwrap();
        assert_eq!(p.source, "calibrated");
        assert!(
            (p.predicted_gbps - 20.017).abs() < 5e-4,
            "{}",
            p.predicted_gbps
        );
        let err = p.relative_error.unwrap() * 100.0;
        assert_eq!(format!("{err:.1}"), "3.1");
        // Same with fractions or percent signs.
        let p2 = predict_gbps(
            &[22.0, 21.998, 18.036],
            &parse_mix("class2=0.5, 3=0.5").unwrap(),
        )
        .unwrap();
        assert!((p2 - 20.017).abs() < 5e-4);
        let p3 = predict_gbps(&[22.0, 21.998, 18.036], &parse_mix("2=50%,3=50%").unwrap()).unwrap();
        assert!((p3 - p2).abs() < 1e-12);
    }

    #[test]
    fn predictor_falls_back_to_memcpy_averages() {
        let mut m = table_v_model();
        m.entries[0].calibrated_gbps = None;
        let p = predict(&m, None, None, &parse_mix("1=1").unwrap(), None).unwrap();
        assert_eq!(p.source, "memcpy");
        assert!((p.predicted_gbps - 49.1).abs() < 1e-9);
        assert!(predict(&m, None, None, &parse_mix("5=1").unwrap(), None).is_err());
        assert!(predict(&m, Some(3), None, &parse_mix("1=1").unwrap(), None).is_err());
        assert!(parse_mix("0=5").is_err());
        assert!(parse_mix("2").is_err());
        assert!(parse_mix("").is_err());
        assert!(predict_gbps(&[1.0], &[(1, 0.0)]).is_err());
    }

    #[test]
    fn model_file_round_trips() {
        let m = table_v_model();
        let e = &m.entries[0];
        assert_eq!(e.class_of(4), Some(4));
        assert!((e.numa_factor[4].unwrap() - 49.1 / 27.9).abs() < 1e-12);
        assert_eq!(m.read_matrix_gbps[7][2], Some(48.6));
        assert_eq!(m.write_matrix_gbps[7][2], None);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("model.json");
        save_model(&m, &p).unwrap();
        assert_eq!(load_model(&p).unwrap(), m);
        let mut bad = serde_json::to_value(&m).unwrap();
        bad["version"] = serde_json::json!(99);
        std::fs::write(&p, bad.to_string()).unwrap();
        assert!(load_model(&p).unwrap_err().to_string().contains("version"));
    }
}
