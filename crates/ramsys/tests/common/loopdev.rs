//! Loop devices for the volume tests (issue 18): attached over an image
//! file with `losetup -f --show`, detached on drop, even when a test fails.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{assert_ok, stderr};

/// A loop device over an image file, detached on drop (also when a test
/// fails). `attach` returns None, with the reason printed, where loop
/// devices are unavailable.
pub struct Loop {
    dev: PathBuf,
}

impl Loop {
    pub fn attach(img: &Path) -> Option<Loop> {
        if !Path::new("/dev/loop-control").exists() {
            eprintln!("skipped: /dev/loop-control is absent (no loop devices)");
            return None;
        }
        let o = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(img)
            .output();
        match o {
            Ok(o) if o.status.success() => {
                let dev = String::from_utf8_lossy(&o.stdout).trim().to_string();
                Some(Loop {
                    dev: PathBuf::from(dev),
                })
            }
            Ok(o) => {
                eprintln!("skipped: losetup failed: {}", stderr(&o).trim());
                None
            }
            Err(e) => {
                eprintln!("skipped: cannot run losetup: {e}");
                None
            }
        }
    }

    pub fn path(&self) -> &str {
        self.dev.to_str().unwrap()
    }

    pub fn read(&self) -> Vec<u8> {
        std::fs::read(&self.dev).unwrap()
    }

    /// A device node for this device inside `dir` (a daemon's export).
    pub fn node_in(&self, dir: &Path, name: &str) -> PathBuf {
        let rdev = std::fs::metadata(&self.dev).unwrap().rdev();
        let p = dir.join(name);
        let (maj, min) = (libc_major(rdev), libc_minor(rdev));
        let o = Command::new("mknod")
            .arg(&p)
            .args(["b", &maj.to_string(), &min.to_string()])
            .output()
            .unwrap();
        assert_ok(&o);
        p
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.dev).status();
    }
}

fn libc_major(dev: u64) -> u64 {
    ((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0x0fff)
}

fn libc_minor(dev: u64) -> u64 {
    ((dev >> 12) & 0xffff_ff00) | (dev & 0xff)
}
