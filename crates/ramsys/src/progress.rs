//! Progress while a transfer runs: a bar on a terminal, JSON lines with
//! --json, nothing otherwise.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ramsys_engine::Stats;

pub struct Progress {
    stop: Arc<AtomicBool>,
    /// Dropped at finish: wakes the reporter at once instead of letting it
    /// sleep out its tick (which would add up to 100 ms to every copy).
    wake: Option<crossbeam_channel::Sender<()>>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Progress {
    pub fn start(stats: Arc<Stats>, json: bool) -> Progress {
        let stop = Arc::new(AtomicBool::new(false));
        let tty = std::io::stderr().is_terminal();
        let (wake, tick) = crossbeam_channel::bounded::<()>(0);
        let handle = if json || tty {
            let s = stop.clone();
            Some(std::thread::spawn(move || report(stats, s, json, tick)))
        } else {
            None
        };
        Progress {
            stop,
            wake: Some(wake),
            handle,
        }
    }

    pub fn finish(mut self) {
        self.stop.store(true, Ordering::Release);
        drop(self.wake.take());
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn report(
    stats: Arc<Stats>,
    stop: Arc<AtomicBool>,
    json: bool,
    tick: crossbeam_channel::Receiver<()>,
) {
    let t0 = Instant::now();
    let bar = if json {
        None
    } else {
        let b = indicatif::ProgressBar::new(0);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:30} {bytes}/{total_bytes} {binary_bytes_per_sec} {msg} ETA {eta}",
            )
            .unwrap(),
        );
        Some(b)
    };
    let mut last = Instant::now() - Duration::from_secs(10);
    while !stop.load(Ordering::Acquire) {
        // Sleeps one tick, or returns at once when `finish` drops the sender.
        if let Err(crossbeam_channel::RecvTimeoutError::Disconnected) =
            tick.recv_timeout(Duration::from_millis(100))
        {
            break;
        }
        let (bytes, files, tb, tf) = stats.snapshot();
        if let Some(b) = &bar {
            b.set_length(tb);
            b.set_position(bytes);
            b.set_message(format!("{files}/{tf} files"));
        } else if last.elapsed() >= Duration::from_secs(1) {
            last = Instant::now();
            let secs = t0.elapsed().as_secs_f64();
            let line = serde_json::json!({
                "event": "progress",
                "bytes": bytes,
                "files": files,
                "total_bytes": tb,
                "total_files": tf,
                "elapsed_s": secs,
                "mb_s": bytes as f64 / 1e6 / secs.max(1e-9),
            });
            let mut o = std::io::stdout().lock();
            let _ = writeln!(o, "{line}");
            let _ = o.flush();
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
}
