//! `ramsys iomodel`: the NUMA I/O bandwidth model of seed 001 (whole paper)
//! and seed 000 ch. 4.
//!
//! * [`characterize`] runs Algorithm 1: memcpy threads pinned to a target
//!   node stand in for a device's DMA engine (seed 001 sec. V-A).
//! * [`classify()`] groups nodes into performance classes (Tables IV/V).
//! * [`predict()`] is the aggregate predictor, seed 001 Eq. 1.
//! * [`calibrate()`] attaches absolute bandwidths with one transfer per class.
//! * [`Model`] is the JSON model file; [`load_model`] reads it.
//!
//! The CLI entry point is [`run`] with [`IomodelArgs`]. See docs/IOMODEL.md.

pub mod calibrate;
pub mod charact;
pub mod classify;
pub mod layout;
pub mod model;
pub mod numa;
pub mod perf;
pub mod report;

pub use calibrate::{calibrate, Calibrator, FileCalibrator};
pub use charact::{characterize, CharConfig, Measurement, NodeStat};
pub use classify::{classify, classify_nodes, ClassifyInput, ClassifyOutput, CLASS_GAP};
pub use layout::{HostLayout, NodeLayout};
pub use model::{
    load_model, parse_mix, predict, predict_gbps, relative_error, save_model, Model, ModelEntry,
    Prediction,
};
pub use numa::{LinuxNuma, NodeBuf, NumaOps, SimNuma};
pub use report::render_text;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Simulated I/O direction (seed 001 sec. V-A, Fig. 9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Device read: source on the target node, sink on node i.
    Read,
    /// Device write: source on node i, sink on the target node.
    Write,
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::Read => "read",
            Mode::Write => "write",
        })
    }
}

/// `--mode` of the characterization.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ModeSel {
    Read,
    Write,
    #[default]
    Both,
}

impl ModeSel {
    pub fn modes(self) -> Vec<Mode> {
        match self {
            ModeSel::Read => vec![Mode::Read],
            ModeSel::Write => vec![Mode::Write],
            ModeSel::Both => vec![Mode::Write, Mode::Read],
        }
    }
}

/// `ramsys iomodel ...`
#[derive(clap::Args, Debug, Clone)]
pub struct IomodelArgs {
    #[command(subcommand)]
    pub cmd: Option<IomodelCmd>,
    /// Root of the sysfs tree to read the host layout from.
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub sysroot: PathBuf,
    /// Target node to characterize (repeatable); default: nodes with I/O devices, else all.
    #[arg(long = "node", value_name = "K")]
    pub nodes: Vec<u32>,
    /// Simulated I/O direction.
    #[arg(long, value_enum, default_value_t = ModeSel::Both)]
    pub mode: ModeSel,
    /// Fewer repetitions (3 x 1 copy instead of 7 x 2); same buffer-size rule.
    #[arg(long)]
    pub quick: bool,
    /// Print the model as JSON instead of the text report.
    #[arg(long)]
    pub json: bool,
    /// Write the JSON model file (for `ramsys serve --config`).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Override timed repetitions.
    #[arg(long, value_name = "N")]
    pub reps: Option<u32>,
    /// Override full-buffer copies per repetition.
    #[arg(long, value_name = "N")]
    pub iters: Option<u32>,
    /// Override the per-thread buffer size in MiB (default 4 x LLC / threads).
    #[arg(long, value_name = "MIB")]
    pub buf_mib: Option<usize>,
    /// Run on a simulated host: JSON {"write_gbps": [[..]], "read_gbps": [[..]]}
    /// indexed [target][node]; use with --sysroot pointing at a fixture tree.
    #[arg(long, value_name = "FILE")]
    pub simulate: Option<PathBuf>,
}

/// Subcommands of `ramsys iomodel`.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum IomodelCmd {
    /// Group per-node bandwidths into performance classes (JSON in, JSON out).
    Classify {
        /// Input JSON file (`-` = stdin).
        file: PathBuf,
    },
    /// Predict aggregate bandwidth for a mix of classes (seed 001 Eq. 1).
    Predict {
        /// Model file written by `ramsys iomodel -o`.
        model: PathBuf,
        /// CLASS=SHARE,... (classes 1-based as printed; shares are relative weights).
        #[arg(long, value_name = "CLASS=SHARE,...")]
        mix: String,
        /// Target node of the model entry (default: first entry).
        #[arg(long = "node", value_name = "K")]
        node: Option<u32>,
        /// Mode of the model entry (default: first entry).
        #[arg(long, value_enum)]
        mode: Option<Mode>,
        /// Measured aggregate Gbps, to report the relative error.
        #[arg(long, value_name = "GBPS")]
        measured: Option<f64>,
        #[arg(long)]
        json: bool,
    },
    /// Attach absolute bandwidths to the classes with one file transfer per class.
    Calibrate {
        /// Model file to calibrate.
        model: PathBuf,
        /// Directory for the scratch file (on the storage to calibrate).
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        /// MiB written/read per class.
        #[arg(long, value_name = "MIB", default_value_t = 256)]
        size_mib: u64,
        /// Output file (default: rewrite MODEL in place).
        #[arg(short = 'o', long = "output", value_name = "FILE")]
        output: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
}

/// Bandwidth matrices for [`SimNuma`] (`--simulate`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SimSpec {
    pub write_gbps: Vec<Vec<f64>>,
    pub read_gbps: Vec<Vec<f64>>,
    #[serde(default)]
    pub jitter: f64,
}

/// Characterize a host and build its model: reads the layout under
/// `sysroot`, runs Algorithm 1 with `ops`, probes hardware counters for
/// Eq. 3.2 when `ops` is the real host.
pub fn characterize_host(
    layout: HostLayout,
    ops: &dyn NumaOps,
    cfg: &CharConfig,
    real_host: bool,
) -> Result<Model> {
    let mut cfg = cfg.clone();
    let counters = if real_host {
        perf::probe()
    } else {
        Err("simulated host has no hardware counters".into())
    };
    cfg.hw_counters = counters.is_ok();
    let ms = characterize(&layout, ops, &cfg)?;
    Model::from_measurements(layout, ops.describe(), ms, &counters)
}

fn char_config(args: &IomodelArgs) -> CharConfig {
    let mut cfg = if args.quick {
        CharConfig::quick()
    } else {
        CharConfig::standard()
    };
    cfg.targets.clone_from(&args.nodes);
    cfg.modes = args.mode.modes();
    if let Some(r) = args.reps {
        cfg.reps = r;
    }
    if let Some(i) = args.iters {
        cfg.iters = i;
    }
    cfg.bytes_per_thread = args.buf_mib.map(|m| m << 20);
    cfg
}

/// Print to stdout; a closed pipe (`| head`) is not an error.
fn emit(s: &str) -> Result<()> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(s.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}

fn read_input(path: &Path) -> Result<String> {
    if path == Path::new("-") {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)?;
        Ok(s)
    } else {
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
    }
}

/// Entry point for `ramsys iomodel`.
pub fn run(args: &IomodelArgs) -> Result<()> {
    match &args.cmd {
        None => {
            let layout = HostLayout::from_sysfs(&args.sysroot)?;
            let cfg = char_config(args);
            let model = match &args.simulate {
                Some(p) => {
                    let spec: SimSpec = serde_json::from_str(&read_input(p)?)
                        .with_context(|| format!("parsing {}", p.display()))?;
                    let mut sim = SimNuma::new(layout.clone(), spec.write_gbps, spec.read_gbps);
                    sim.jitter = spec.jitter;
                    characterize_host(layout, &sim, &cfg, false)?
                }
                None => characterize_host(layout, &LinuxNuma, &cfg, true)?,
            };
            if let Some(o) = &args.output {
                save_model(&model, o)?;
            }
            if args.json {
                emit(&(serde_json::to_string_pretty(&model)? + "\n"))?;
            } else {
                emit(&render_text(&model))?;
            }
        }
        Some(IomodelCmd::Classify { file }) => {
            let input: ClassifyInput = serde_json::from_str(&read_input(file)?)
                .with_context(|| format!("parsing {}", file.display()))?;
            emit(&(serde_json::to_string(&classify(&input)?)? + "\n"))?;
        }
        Some(IomodelCmd::Predict {
            model,
            mix,
            node,
            mode,
            measured,
            json,
        }) => {
            if measured.is_some_and(|m| m.is_nan() || m <= 0.0) {
                bail!("--measured must be positive");
            }
            let m = load_model(model)?;
            let p = predict(&m, *node, *mode, &parse_mix(mix)?, *measured)?;
            if *json {
                println!("{}", serde_json::to_string(&p)?);
            } else {
                println!(
                    "node {} {}: predicted aggregate bandwidth {:.3} Gbps ({} class bandwidths)",
                    p.target, p.mode, p.predicted_gbps, p.source
                );
                if let (Some(meas), Some(err)) = (p.measured_gbps, p.relative_error) {
                    println!(
                        "measured {meas:.3} Gbps, relative error {:.1} %",
                        err * 100.0
                    );
                }
            }
        }
        Some(IomodelCmd::Calibrate {
            model,
            dir,
            size_mib,
            output,
            json,
        }) => {
            let mut m = load_model(model)?;
            let dir = dir.clone().unwrap_or_else(std::env::temp_dir);
            let mut cal = FileCalibrator::new(dir, size_mib << 20, m.host.clone());
            calibrate(&mut m, &mut cal)?;
            save_model(&m, output.as_ref().unwrap_or(model))?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&m)?);
            } else {
                for e in &m.entries {
                    let cal = e.calibrated_gbps.as_deref().unwrap_or_default();
                    for (i, c) in e.classes.iter().enumerate() {
                        println!(
                            "node {} {} Class{}: {:?} memcpy {:.2} Gbps, calibrated {:.2} Gbps",
                            e.target,
                            e.mode,
                            i + 1,
                            c,
                            e.class_avg_gbps[i],
                            cal[i]
                        );
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        args: IomodelArgs,
    }

    fn parse(argv: &[&str]) -> IomodelArgs {
        Cli::try_parse_from(std::iter::once("iomodel").chain(argv.iter().copied()))
            .unwrap()
            .args
    }

    #[test]
    fn cli_parses_the_documented_interface() {
        let a = parse(&[
            "--node", "7", "--node", "6", "--mode", "read", "--quick", "--json", "-o", "m.json",
        ]);
        assert_eq!(a.nodes, vec![7, 6]);
        assert_eq!(a.mode, ModeSel::Read);
        assert!(a.quick && a.json && a.cmd.is_none());
        assert_eq!(a.output, Some(PathBuf::from("m.json")));
        let cfg = char_config(&a);
        assert_eq!((cfg.reps, cfg.iters, cfg.modes), (3, 1, vec![Mode::Read]));
        let a = parse(&["predict", "m.json", "--mix", "2=50,3=50"]);
        assert!(matches!(a.cmd, Some(IomodelCmd::Predict { ref mix, .. }) if mix == "2=50,3=50"));
        let a = parse(&["classify", "in.json"]);
        assert!(matches!(a.cmd, Some(IomodelCmd::Classify { .. })));
        let a = parse(&["calibrate", "m.json", "--dir", "/tmp", "--size-mib", "8"]);
        assert!(matches!(
            a.cmd,
            Some(IomodelCmd::Calibrate { size_mib: 8, .. })
        ));
        assert!(Cli::try_parse_from(["iomodel", "--mode", "sideways"]).is_err());
    }

    #[test]
    fn cli_end_to_end_on_a_fixture_topology() {
        let dir = tempfile::tempdir().unwrap();
        let root = crate::layout::tests::fixture(&dir.path().join("root"), 8, 4, &[7]);
        let mut w = vec![vec![30.0; 8]; 8];
        w[7] = vec![44.5, 44.5, 26.6, 26.6, 44.5, 44.5, 51.2, 51.2];
        let mut r = vec![vec![30.0; 8]; 8];
        r[7] = vec![40.4, 40.4, 48.6, 48.6, 27.9, 40.4, 49.1, 49.1];
        let sim = dir.path().join("sim.json");
        std::fs::write(
            &sim,
            serde_json::json!({"write_gbps": w, "read_gbps": r}).to_string(),
        )
        .unwrap();
        let model = dir.path().join("model.json");
        let (root_s, sim_s, model_s) = (
            root.to_str().unwrap(),
            sim.to_str().unwrap(),
            model.to_str().unwrap(),
        );
        run(&parse(&[
            "--sysroot",
            root_s,
            "--simulate",
            sim_s,
            "--quick",
            "-o",
            model_s,
        ]))
        .unwrap();
        let m = load_model(&model).unwrap();
        assert_eq!(m.entries.len(), 2);
        assert_eq!(m.entries[0].target, 7);
        assert_eq!(
            m.entries[0].classes,
            vec![vec![6, 7], vec![0, 1, 4, 5], vec![2, 3]]
        );
        assert_eq!(m.entries[0].threads, 4);
        // 4 x 5 MiB LLC split over 4 threads.
        assert_eq!(m.entries[0].bytes_per_thread, 5 << 20);
        run(&parse(&[
            "predict",
            model_s,
            "--mix",
            "2=50,3=50",
            "--mode",
            "read",
            "--measured",
            "40",
        ]))
        .unwrap();
        let p = predict(
            &m,
            Some(7),
            Some(Mode::Read),
            &parse_mix("2=50,3=50").unwrap(),
            None,
        )
        .unwrap();
        // Sim times are rounded to whole nanoseconds.
        assert!((p.predicted_gbps - (48.6 + 40.4) / 2.0).abs() < 1e-3);
        let cin = dir.path().join("c.json");
        std::fs::write(
            &cin,
            r#"{"target_node":7,"mode":"read","packages":[[0,1],[2,3],[4,5],[6,7]],
                "bandwidth_gbps":[40.1,40.9,49.0,47.2,27.9,39.9,50.0,48.0]}"#,
        )
        .unwrap();
        run(&parse(&["classify", cin.to_str().unwrap()])).unwrap();
        assert!(run(&parse(&["predict", model_s, "--mix", "9=1"])).is_err());
    }
}
