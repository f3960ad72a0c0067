//! Calibration: attach absolute bandwidths to the performance classes with
//! one real transfer per class (seed 001 sec. V-B: "we can examine only one
//! node from each class"). The memcpy model gives the relative levels; a real
//! device transfer from a representative node of each class gives the
//! absolute number the predictor (Eq. 1) then uses.

use crate::layout::HostLayout;
use crate::model::{CalibrationInfo, Model, ModelEntry};
use crate::numa::{LinuxNuma, NumaOps};
use crate::Mode;
use anyhow::{anyhow, bail, Context, Result};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::PathBuf;
use std::time::Instant;

/// Performs one real transfer per class.
pub trait Calibrator {
    /// Called before the classes of one model entry (target node, mode).
    fn begin_entry(&mut self, _target: u32, _mode: Mode) -> Result<()> {
        Ok(())
    }
    /// Transfer from/to a representative `node` of `class` (1-based, as
    /// printed: class 1 = local package) and return the achieved Gbps.
    fn measure(&mut self, class: usize, node: u32) -> Result<f64>;
    /// One line for the model file.
    fn describe(&self) -> String {
        "external calibrator".into()
    }
}

/// The class member whose memcpy bandwidth is closest to the class mean
/// (lowest id on ties), so one transfer stands for the whole class.
pub fn representative(entry: &ModelEntry, class_idx: usize) -> Option<u32> {
    let avg = *entry.class_avg_gbps.get(class_idx)?;
    let bw = |n: u32| entry.bandwidth_gbps.get(n as usize).copied().flatten();
    entry
        .classes
        .get(class_idx)?
        .iter()
        .copied()
        .min_by(|&a, &b| {
            let da = bw(a).map_or(f64::INFINITY, |v| (v - avg).abs());
            let db = bw(b).map_or(f64::INFINITY, |v| (v - avg).abs());
            da.total_cmp(&db).then(a.cmp(&b))
        })
}

/// Measure one representative per class of every entry and store the
/// results as `calibrated_gbps`.
pub fn calibrate(model: &mut Model, cal: &mut dyn Calibrator) -> Result<()> {
    for e in model.entries.iter_mut() {
        cal.begin_entry(e.target, e.mode)?;
        let mut out = Vec::with_capacity(e.classes.len());
        for c in 0..e.classes.len() {
            let node = representative(e, c).ok_or_else(|| anyhow!("empty class {}", c + 1))?;
            let g = cal.measure(c + 1, node).with_context(|| {
                format!(
                    "calibrating node {} class {} via node {node}",
                    e.target,
                    c + 1
                )
            })?;
            if !g.is_finite() || g <= 0.0 {
                bail!("calibrator returned {g} Gbps for class {}", c + 1);
            }
            out.push(g);
        }
        e.calibrated_gbps = Some(out);
    }
    model.calibration = Some(CalibrationInfo {
        method: cal.describe(),
    });
    Ok(())
}

/// Built-in storage calibrator: a thread pinned to the representative node,
/// with its buffer bound there, writes (device write) or reads (device read)
/// a file in `dir`, bypassing the page cache with O_DIRECT where the file
/// system allows it (fsync / fadvise otherwise).
pub struct FileCalibrator {
    pub dir: PathBuf,
    pub bytes: u64,
    pub block: usize,
    layout: HostLayout,
    mode: Mode,
}

impl FileCalibrator {
    pub fn new(dir: PathBuf, bytes: u64, layout: HostLayout) -> Self {
        FileCalibrator {
            dir,
            bytes,
            block: 4 << 20,
            layout,
            mode: Mode::Write,
        }
    }

    fn open(path: &std::path::Path, write: bool) -> Result<(File, bool)> {
        let mk = |direct: bool| {
            let mut o = OpenOptions::new();
            if write {
                o.write(true).create(true).truncate(true);
            } else {
                o.read(true);
            }
            if direct {
                o.custom_flags(libc::O_DIRECT);
            }
            o.open(path)
        };
        match mk(true) {
            Ok(f) => Ok((f, true)),
            // tmpfs and some overlay setups refuse O_DIRECT.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok((mk(false)?, false)),
            Err(e) => Err(e).with_context(|| format!("opening {}", path.display())),
        }
    }

    fn transfer(&self, node: u32) -> Result<f64> {
        let cpus = self
            .layout
            .node(node)
            .filter(|n| !n.cpus.is_empty())
            .map(|n| n.cpus.clone())
            // A CPU-less node: run anywhere, the buffer placement still counts.
            .unwrap_or_default();
        let ops = LinuxNuma;
        if !cpus.is_empty() {
            ops.pin_current_thread(&cpus)?;
        }
        let mut buf = ops.alloc_on_node(node, self.block)?;
        let blocks = self.bytes.div_ceil(self.block as u64).max(1);
        let total = blocks * self.block as u64;
        let path = self.dir.join(format!(
            ".ramsys-iomodel-calib-{}-{node}",
            std::process::id()
        ));
        let write_file = |buf: &[u8]| -> Result<()> {
            let (mut f, _) = Self::open(&path, true)?;
            for _ in 0..blocks {
                f.write_all(buf)?;
            }
            f.sync_all()?;
            Ok(())
        };
        let result = (|| -> Result<f64> {
            match self.mode {
                Mode::Write => {
                    let t = Instant::now();
                    write_file(buf.as_slice())?;
                    Ok(total as f64 * 8.0 / t.elapsed().as_secs_f64() / 1e9)
                }
                Mode::Read => {
                    write_file(buf.as_slice())?;
                    let (mut f, direct) = Self::open(&path, false)?;
                    if !direct {
                        // SAFETY: valid fd; advisory call with no memory effects.
                        unsafe {
                            libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED)
                        };
                    }
                    let t = Instant::now();
                    let mut got = 0u64;
                    loop {
                        let n = f.read(buf.as_mut_slice())?;
                        if n == 0 {
                            break;
                        }
                        got += n as u64;
                    }
                    let secs = t.elapsed().as_secs_f64();
                    if got != total {
                        bail!("read {got} of {total} bytes");
                    }
                    Ok(total as f64 * 8.0 / secs / 1e9)
                }
            }
        })();
        let _ = std::fs::remove_file(&path);
        result
    }
}

impl Calibrator for FileCalibrator {
    fn begin_entry(&mut self, _target: u32, mode: Mode) -> Result<()> {
        self.mode = mode;
        Ok(())
    }

    fn measure(&mut self, _class: usize, node: u32) -> Result<f64> {
        // Pin a fresh thread so the caller's affinity is left alone.
        std::thread::scope(|s| {
            s.spawn(|| self.transfer(node))
                .join()
                .map_err(|_| anyhow!("calibration thread panicked"))?
        })
    }

    fn describe(&self) -> String {
        format!(
            "file write/read of {} bytes in {} per class (storage path)",
            self.bytes,
            self.dir.display()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::table_v_model;

    struct Fixed(Vec<(usize, u32)>);
    impl Calibrator for Fixed {
        fn measure(&mut self, class: usize, node: u32) -> Result<f64> {
            self.0.push((class, node));
            Ok([22.0, 21.998, 18.036, 16.1][class - 1])
        }
    }

    #[test]
    fn one_transfer_per_class_from_a_representative() {
        let mut m = table_v_model();
        m.entries[0].calibrated_gbps = None;
        let mut cal = Fixed(Vec::new());
        calibrate(&mut m, &mut cal).unwrap();
        // Table V classes {6,7} {2,3} {0,1,5} {4}: ties resolve to the lowest id.
        assert_eq!(cal.0, vec![(1, 6), (2, 2), (3, 0), (4, 4)]);
        assert_eq!(
            m.entries[0].calibrated_gbps,
            Some(vec![22.0, 21.998, 18.036, 16.1])
        );
        assert_eq!(
            m.calibration.as_ref().unwrap().method,
            "external calibrator"
        );
    }

    #[test]
    fn file_calibrator_measures_this_host() {
        let dir = tempfile::tempdir().unwrap();
        let layout = HostLayout::from_sysfs(std::path::Path::new("/")).unwrap();
        let node = layout.default_targets()[0];
        let mut cal = FileCalibrator::new(dir.path().to_path_buf(), 8 << 20, layout);
        cal.block = 1 << 20;
        for mode in [Mode::Write, Mode::Read] {
            cal.begin_entry(node, mode).unwrap();
            let g = cal.measure(1, node).unwrap();
            assert!(g > 0.0 && g.is_finite(), "{mode:?}: {g}");
        }
        // The scratch file is removed.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
