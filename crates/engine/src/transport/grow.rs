//! When to add data streams during a transfer (issue 21; seed 004: RFTP
//! fills a long fat pipe with parallel streams). transport::path sizes the
//! first links from the handshake RTT and an assumed 10 Gb/s; the path's
//! real capacity, loss and the peer's buffers are only seen once data
//! flows. So the source measures the aggregate delivery rate in stages:
//! after each change it lets the new links leave slow start (`settle`),
//! measures for `measure`, and adds half as many streams again while
//! the last addition raised the rate by at least [`MIN_GAIN`] and by a
//! quarter of what the added streams would carry at the old average
//! ([`MARGINAL`]); it stops
//! when it did not, at the stream limit (the sink's threads and the
//! buffers the daemon granted), or when too little is left to measure.
//! Streams are never taken away: a link that brought nothing costs one
//! thread and shares the same buffers.
//!
//! A mixed tree changes what limits the rate as it goes (issue 21): while
//! small files stream, reading is the limit and the source's send queue
//! runs empty; such a stage ([`STARVED`]) gets no verdict and is measured
//! again, so the big files that follow still get their streams. And the
//! first stage can run faster than the path holds (the sink's buffers
//! fill before its writers pace the credits), so it is never the baseline
//! of a stop; and a stage that falls below [`DROP`] of the last one with
//! more streams starts a new comparison instead of ending the adaptation
//! ([`REBASELINES`] times at most, both together).
//!
//! Sans I/O: the caller feeds the clock (time since the payload began),
//! the bytes delivered so far and the bytes still to send, and acts on
//! the [`Step`]; so the decision is tested with made-up rate series.

use std::time::Duration;

/// Least relative rise of the aggregate rate that justifies adding more.
pub const MIN_GAIN: f64 = 0.05;

/// And at least this share of what the streams added would bring at the
/// old average rate per stream (a 50 % larger count must bring 12.5 %):
/// streams that carry a quarter of their share are past the path's need.
pub const MARGINAL: f64 = 0.25;

/// A stage whose rate fell below this share of the last one's, with more
/// streams, was not measured under the same conditions (the sink's
/// buffers filling during the first stage, other content, other load):
/// it becomes the new baseline rather than the verdict, at most
/// [`REBASELINES`] times.
pub const DROP: f64 = 0.85;

/// How often a drop may restart the comparison.
pub const REBASELINES: u8 = 2;

/// A stage in which the source's send queue was empty at this share of
/// the looks or more was limited by reading (small files, the disk), not
/// by the links: it says nothing about more streams and is measured again.
pub const STARVED: f64 = 0.5;

/// Links with data in flight less than this share of a stage were held
/// back by the ends (the sink's credits, reading, CPU), not by the path
/// or their windows: more streams cannot help (TCP_INFO busy_time counts
/// the time a socket had unacknowledged or unsent data, window-limited
/// time included).
pub const BUSY_MIN: f64 = 0.5;

/// Links whose smoothed RTT averaged this multiple of their minimum over
/// a stage wait in a queue on the path: its bottleneck (or an emulator
/// short of CPU) is full, and more streams would only lengthen the queue
/// (BBR keeps at most about one BDP queued; a stream held back by its own
/// window queues nothing). Measured through wanem capped at 200 MB/s:
/// every count from 4 to 16 moved the same, and the streams added past
/// the start cost 4-13 % (docs/BENCHMARKS.md, issue 21).
pub const QUEUED: f64 = 1.5;

/// What the links say at one look (TCP_INFO; None where the transport
/// has none).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Links {
    /// Microseconds with data in flight so far, summed over the links.
    pub busy_us: Option<u64>,
    /// Smoothed RTT / minimum RTT now, the median link's.
    pub queueing: Option<f64>,
}

/// Paths shorter than this are a LAN: the first choice stands (more
/// streams there cost CPU and bring nothing; RTT 0 must not regress).
pub const LAN_RTT: Duration = Duration::from_millis(1);

/// What the caller should do now.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Keep going (still settling or measuring, or waiting for links).
    Wait,
    /// Ask for this many more streams, then call [`Grower::changed`].
    Add(u16),
    /// Adaptation is over; the reason, for --explain.
    Stop(String),
}

/// One stage's measurement, for the report.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Stage {
    /// Seconds since the payload began, at the end of the measurement.
    pub at_s: f64,
    pub streams: u16,
    /// Aggregate delivery rate over the measurement, MB/s.
    pub mb_s: f64,
    /// The links' own delivery rates (TCP_INFO) at its end, MB/s: the
    /// lowest, median and highest (empty where the transport has none).
    pub link_mb_s: Vec<f64>,
    /// Share of the stage the links had data in flight, % (TCP_INFO
    /// busy_time over links x time; None where the transport has none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub busy_pct: Option<f64>,
    /// The links' smoothed RTT over their minimum, averaged over the
    /// stage (the median link's; None where the transport has none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rtt_x: Option<f64>,
    /// What was decided after it.
    pub then: String,
}

/// What the adaptation did, for the report: its stages and why it
/// stopped (None: the transfer ended first).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Growth {
    pub stages: Vec<Stage>,
    pub stopped: Option<String>,
}

#[derive(Debug, Clone, Copy)]
enum Phase {
    /// Links changed at `since`; measurement starts after `settle`.
    Settling {
        since: Duration,
    },
    /// Measuring since `t0` with `bytes0` delivered and the links busy
    /// `busy0` microseconds then; of `looks` at the source's send queue,
    /// `empty` found it empty.
    Measuring {
        t0: Duration,
        bytes0: u64,
        busy0: Option<u64>,
        looks: u32,
        empty: u32,
        /// Sum and count of the queueing looks.
        queue: (f64, u32),
    },
    /// Streams asked for; waiting for [`Grower::changed`].
    Asking,
    Done,
}

/// The adaptation of one session's stream count.
#[derive(Debug, Clone)]
pub struct Grower {
    streams: u16,
    max: u16,
    settle: Duration,
    measure: Duration,
    phase: Phase,
    /// The last stage's (streams, bytes/s).
    last: Option<(u16, f64)>,
    /// Drops taken as a new baseline so far.
    rebased: u8,
    pub stages: Vec<Stage>,
    pub stopped: Option<String>,
}

impl Grower {
    /// Adaptation for a path of round trip `rtt`, starting at `now` with
    /// `streams` links, never past `max`. None when there is nothing to
    /// adapt (a LAN, no RTT sample, or already at the limit), with why.
    pub fn new(rtt: Option<Duration>, now: Duration, streams: u16, max: u16) -> Grower {
        let rtt = rtt.unwrap_or_default();
        // A new link needs ~8 round trips of slow start to reach a 4 MiB
        // window; the measurement spans enough round trips to average
        // out the emulator's and the kernel's burstiness.
        let settle = (rtt * 8).clamp(Duration::from_millis(500), Duration::from_secs(2));
        let measure = (rtt * 20).clamp(Duration::from_secs(1), Duration::from_secs(3));
        let mut g = Grower {
            streams,
            max,
            settle,
            measure,
            phase: Phase::Settling { since: now },
            last: None,
            rebased: 0,
            stages: Vec::new(),
            stopped: None,
        };
        if rtt < LAN_RTT {
            g.stop(format!(
                "RTT {:.2} ms is a LAN: {streams} streams kept",
                rtt.as_secs_f64() * 1e3
            ));
        } else if streams >= max {
            g.stop(format!("{streams} streams: at the limit ({max})"));
        }
        g
    }

    /// Attach the links' delivery rates (bytes/s) to the last stage.
    pub fn note_links(&mut self, mut rates: Vec<u64>) {
        let Some(s) = self.stages.last_mut() else {
            return;
        };
        if rates.is_empty() || !s.link_mb_s.is_empty() {
            return;
        }
        rates.sort_unstable();
        let mb = |r: u64| (r as f64 / 1e4).round() / 100.0;
        s.link_mb_s = vec![
            mb(rates[0]),
            mb(rates[rates.len() / 2]),
            mb(rates[rates.len() - 1]),
        ];
    }

    pub fn streams(&self) -> u16 {
        self.streams
    }

    pub fn done(&self) -> bool {
        matches!(self.phase, Phase::Done)
    }

    fn stop(&mut self, why: String) -> Step {
        self.phase = Phase::Done;
        self.stopped = Some(why.clone());
        Step::Stop(why)
    }

    /// One look: `bytes` delivered so far, the links `busy` (microseconds
    /// with data in flight, summed over links) so far, `remaining` still
    /// to send, whether the source's send queue is `starved` (empty) now.
    pub fn poll(
        &mut self,
        now: Duration,
        bytes: u64,
        links: Links,
        remaining: u64,
        starved: bool,
    ) -> Step {
        let busy = links.busy_us;
        match self.phase {
            Phase::Done | Phase::Asking => Step::Wait,
            Phase::Settling { since } => {
                if now >= since + self.settle {
                    self.measure_from(now, bytes, busy);
                }
                Step::Wait
            }
            Phase::Measuring {
                t0,
                bytes0,
                busy0,
                looks,
                empty,
                queue,
            } => {
                let (looks, empty) = (looks + 1, empty + u32::from(starved));
                let queue = match links.queueing {
                    Some(q) => (queue.0 + q, queue.1 + 1),
                    None => queue,
                };
                let dt = now.saturating_sub(t0);
                if dt < self.measure {
                    self.phase = Phase::Measuring {
                        t0,
                        bytes0,
                        busy0,
                        looks,
                        empty,
                        queue,
                    };
                    return Step::Wait;
                }
                let rate = bytes.saturating_sub(bytes0) as f64 / dt.as_secs_f64();
                let starved = empty as f64 / looks as f64;
                if starved >= STARVED {
                    self.starved(now, rate, starved, bytes, busy);
                    return Step::Wait;
                }
                let links = dt.as_secs_f64() * 1e6 * self.streams.max(1) as f64;
                let busy = match (busy0, busy) {
                    (Some(a), Some(b)) => Some((b.saturating_sub(a) as f64 / links).min(1.0)),
                    _ => None,
                };
                let rtt_x = (queue.1 > 0).then(|| queue.0 / queue.1 as f64);
                self.judge(now, rate, busy, rtt_x, remaining)
            }
        }
    }

    fn measure_from(&mut self, now: Duration, bytes: u64, busy: Option<u64>) {
        self.phase = Phase::Measuring {
            t0: now,
            bytes0: bytes,
            busy0: busy,
            looks: 0,
            empty: 0,
            queue: (0.0, 0),
        };
    }

    /// Reading, not the links, limited the stage: no verdict; measure
    /// again from now with the same streams. Consecutive such stages are
    /// reported as one (a long small-file stretch would make hundreds).
    fn starved(&mut self, now: Duration, rate: f64, share: f64, bytes: u64, busy: Option<u64>) {
        let then = format!(
            "wait: the send queue was empty in {:.0} % of the stage (reading was the limit, \
             not the links); measured again",
            share * 100.0
        );
        let stage = Stage {
            at_s: now.as_secs_f64(),
            streams: self.streams,
            mb_s: rate / 1e6,
            link_mb_s: Vec::new(),
            busy_pct: None,
            rtt_x: None,
            then,
        };
        match self.stages.last_mut() {
            Some(s) if s.then.starts_with("wait") && s.streams == self.streams => *s = stage,
            _ => self.stages.push(stage),
        }
        self.measure_from(now, bytes, busy);
    }

    /// A stage measured `rate` bytes/s with the current streams, whose
    /// links had data in flight `busy` of the time and an RTT `rtt_x`
    /// times their minimum.
    fn judge(
        &mut self,
        now: Duration,
        rate: f64,
        busy: Option<f64>,
        rtt_x: Option<f64>,
        remaining: u64,
    ) -> Step {
        let n = self.streams;
        let need = |m: u16| MIN_GAIN.max(MARGINAL * (n as f64 / m as f64 - 1.0));
        // The first stage runs ahead of the path while the sink's buffers
        // fill (measured through wanem at 50 ms: 590-710 MB/s in a first
        // stage of transfers that averaged 375-460): it is never the
        // baseline of a stop.
        let judged = self.stages.iter().filter(|s| !s.then.starts_with("wait"));
        let first = judged.count() == 1;
        let bar = |m: u16, r: f64| match first {
            true => r * (1.0 + need(m)),
            false => r * DROP,
        };
        let dropped = |m: u16, r: f64| m < n && rate < bar(m, r) && self.rebased < REBASELINES;
        // Another stage needs settle + measure at about this rate; with
        // less than twice that left it could not pay off.
        let stage_s = (self.settle + self.measure).as_secs_f64();
        let short = (remaining as f64) < rate * 2.0 * stage_s;
        let idle = busy.filter(|&b| b < BUSY_MIN);
        let queued = rtt_x.filter(|&q| q >= QUEUED);
        let (step, then) = match self.last {
            // The links waited for the ends (the sink's credits, reading,
            // the CPU) most of the stage: a longer path would not change
            // that, more streams share the same ends.
            _ if idle.is_some() => (
                None,
                format!(
                    "stop: {n} streams {} had data in flight only {:.0} % of the \
                     time: the ends, not the path, are the limit",
                    ramsys_units::format_rate(rate as u64),
                    idle.unwrap_or_default() * 100.0
                ),
            ),
            // A full bottleneck: the links' packets queue on the path.
            _ if queued.is_some() => (
                None,
                format!(
                    "stop: {n} streams {} with an RTT {:.1} x its minimum: the path's \
                     bottleneck is full, more streams would only queue",
                    ramsys_units::format_rate(rate as u64),
                    queued.unwrap_or_default()
                ),
            ),
            Some((m, r)) if dropped(m, r) && n < self.max && !short => {
                self.rebased += 1;
                let add = (n / 2).max(1).min(self.max - n);
                (
                    Some(add),
                    format!(
                        "{n} streams {}, {m} streams had {}: not comparable \
                         (a first stage runs ahead while the sink's buffers fill; other \
                         files, other load); a new baseline, add {add}",
                        ramsys_units::format_rate(rate as u64),
                        ramsys_units::format_rate(r as u64)
                    ),
                )
            }
            Some((m, r)) if rate < r * (1.0 + need(m)) => (
                None,
                format!(
                    "stop: {n} streams {} vs {m} streams {} (less than +{:.0} %)",
                    ramsys_units::format_rate(rate as u64),
                    ramsys_units::format_rate(r as u64),
                    need(m) * 100.0
                ),
            ),
            _ if n >= self.max => (None, format!("stop: at the limit ({})", self.max)),
            _ if short => (
                None,
                "stop: too little left to measure another stage".into(),
            ),
            _ => {
                let add = (n / 2).max(1).min(self.max - n);
                (Some(add), format!("add {add}"))
            }
        };
        self.stages.push(Stage {
            at_s: now.as_secs_f64(),
            streams: n,
            mb_s: rate / 1e6,
            link_mb_s: Vec::new(),
            busy_pct: busy.map(|b| (b * 1e3).round() / 10.0),
            rtt_x: rtt_x.map(|q| (q * 100.0).round() / 100.0),
            then: then.clone(),
        });
        self.last = Some((n, rate));
        match step {
            Some(add) => {
                self.phase = Phase::Asking;
                Step::Add(add)
            }
            None => self.stop(then),
        }
    }

    /// The payload is over (the sink settled): nothing more to adapt.
    pub fn end(&mut self, why: &str) {
        if !self.done() {
            self.stop(format!("stop: {why}"));
        }
    }

    /// The asked-for streams are up (or refused): `streams` links now,
    /// from `now`. A refusal lowers the limit to what was reached.
    pub fn changed(&mut self, now: Duration, streams: u16, refused: bool) {
        if self.done() {
            return;
        }
        if refused {
            self.max = streams;
        }
        if streams <= self.streams {
            // Nothing was added: there is nothing new to measure.
            let why = format!("stop: the sink granted no more streams ({streams})");
            self.stop(why);
            return;
        }
        self.streams = streams;
        self.phase = Phase::Settling { since: now };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    /// Drive a grower with a path whose aggregate rate is `rate(streams)`
    /// bytes/s, looking every 250 ms; adds take effect at once, up to
    /// `grant` streams. Returns the streams reached and the grower.
    fn drive(
        rtt_ms: u64,
        start: u16,
        max: u16,
        grant: u16,
        total: u64,
        rate: impl Fn(u16) -> f64,
    ) -> (u16, Grower) {
        drive_at(rtt_ms, start, max, grant, total, |n, _| (rate(n), false))
    }

    /// As [`drive`], the rate and whether the send queue is empty also
    /// depending on the time since the start.
    fn drive_at(
        rtt_ms: u64,
        start: u16,
        max: u16,
        grant: u16,
        total: u64,
        rate: impl Fn(u16, Duration) -> (f64, bool),
    ) -> (u16, Grower) {
        drive_busy(rtt_ms, start, max, grant, total, |n, t| {
            let (r, starved) = rate(n, t);
            (r, starved, None)
        })
    }

    /// As [`drive_at`], and the share of the time the links had data in
    /// flight (None: the transport does not say).
    fn drive_busy(
        rtt_ms: u64,
        start: u16,
        max: u16,
        grant: u16,
        total: u64,
        rate: impl Fn(u16, Duration) -> (f64, bool, Option<f64>),
    ) -> (u16, Grower) {
        drive_links(rtt_ms, start, max, grant, total, |n, t| {
            let (r, starved, b) = rate(n, t);
            (r, starved, b, None)
        })
    }

    /// As [`drive_busy`], and the links' RTT over its minimum.
    fn drive_links(
        rtt_ms: u64,
        start: u16,
        max: u16,
        grant: u16,
        total: u64,
        rate: impl Fn(u16, Duration) -> (f64, bool, Option<f64>, Option<f64>),
    ) -> (u16, Grower) {
        let mut g = Grower::new(Some(MS(rtt_ms)), Duration::ZERO, start, max);
        let (mut t, mut bytes, mut busy) = (Duration::ZERO, 0u64, Some(0u64));
        let tick = MS(250);
        while bytes < total && !g.done() {
            t += tick;
            let (r, starved, b, queueing) = rate(g.streams(), t);
            bytes += (r * tick.as_secs_f64()) as u64;
            let us = tick.as_micros() as f64 * g.streams() as f64;
            busy = b.and_then(|b| Some(busy? + (b * us) as u64));
            let links = Links {
                busy_us: busy,
                queueing,
            };
            match g.poll(t, bytes, links, total.saturating_sub(bytes), starved) {
                Step::Add(k) => {
                    let to = (g.streams() + k).min(grant);
                    assert!(to <= max);
                    g.changed(t, to, to < g.streams() + k);
                }
                Step::Wait | Step::Stop(_) => {}
            }
        }
        (g.streams(), g)
    }

    /// Each stream carries 25 MB/s until the path's 500 MB/s is full.
    fn path(n: u16) -> f64 {
        (n as f64 * 25e6).min(500e6)
    }

    #[test]
    fn adds_while_the_rate_grows_and_stops_when_it_does_not() {
        let (n, g) = drive(50, 4, 64, 64, 100 << 30, path);
        // 20 streams fill the path; one stage past it shows no gain.
        assert!((20..=40).contains(&n), "{n} {:?}", g.stages);
        let why = g.stopped.unwrap();
        assert!(why.contains("less than +"), "{why}");
        // Every stage but the last grew the rate.
        let r: Vec<f64> = g.stages.iter().map(|s| s.mb_s).collect();
        assert!(r.windows(2).rev().skip(1).all(|w| w[1] > w[0]), "{r:?}");
    }

    #[test]
    fn never_past_the_limit_or_what_the_sink_grants() {
        let (n, g) = drive(50, 4, 10, 64, 100 << 30, path);
        assert_eq!(n, 10);
        assert!(g.stopped.unwrap().contains("limit"));
        // The sink refuses past 6: the limit drops to what was reached.
        let (n, g) = drive(50, 4, 64, 6, 100 << 30, path);
        assert_eq!(n, 6);
        let why = g.stopped.unwrap();
        assert!(why.contains("granted no more"), "{why}");
    }

    #[test]
    fn a_lan_or_a_full_start_is_left_alone() {
        let g = Grower::new(Some(Duration::from_micros(80)), Duration::ZERO, 4, 32);
        assert!(g.done() && g.stopped.unwrap().contains("LAN"));
        let g = Grower::new(None, Duration::ZERO, 4, 32);
        assert!(g.done());
        let g = Grower::new(Some(MS(50)), Duration::ZERO, 32, 32);
        assert!(g.done() && g.stopped.unwrap().contains("limit"));
    }

    #[test]
    fn a_flat_rate_stops_after_one_addition() {
        // A path already full with 4 streams (disk-bound, say): the first
        // stage is no verdict's baseline, so one more addition is tried.
        let (n, g) = drive(20, 4, 64, 64, 100 << 30, |_| 300e6);
        assert_eq!(n, 9, "{:?}", g.stages);
        assert_eq!(g.stages.len(), 3);
        assert!(g.stages[1].then.contains("new baseline"));
    }

    #[test]
    fn a_short_transfer_is_not_measured_again() {
        // 400 MB at 100 MB/s: one stage measured, too little left after.
        let (n, g) = drive(50, 4, 64, 64, 400_000_000, |_| 100e6);
        assert_eq!(n, 4, "{:?}", g.stages);
        assert!(g.stopped.unwrap().contains("too little left"));
        // Nothing measured until the links settled.
        let mut g = Grower::new(Some(MS(50)), Duration::ZERO, 4, 64);
        assert_eq!(
            g.poll(MS(400), 1 << 20, Links::default(), 1 << 40, false),
            Step::Wait
        );
        assert!(g.stages.is_empty());
    }

    #[test]
    fn a_stage_limited_by_reading_is_measured_again_not_judged() {
        // Small files for the first 6 s: the queue is empty and 60 MB/s
        // whatever the count; then big files, 25 MB/s a stream up to 500.
        let (n, g) = drive_at(50, 8, 64, 64, 100 << 30, |n, t| {
            if t < Duration::from_secs(6) {
                (60e6, true)
            } else {
                (path(n), false)
            }
        });
        assert!(n >= 20, "{n} {:?}", g.stages);
        // The small-file stretch is one stage, reported as a wait.
        assert!(g.stages[0].then.starts_with("wait"), "{:?}", g.stages);
        assert!(!g.stages[1].then.starts_with("wait"), "{:?}", g.stages);
    }

    #[test]
    fn a_drop_with_more_streams_is_a_new_baseline_a_few_times() {
        // The first stage is inflated (the sink's buffers filling): 800
        // MB/s; then 25 MB/s a stream up to 500.
        let (n, g) = drive_at(50, 8, 64, 64, 100 << 30, |n, t| {
            if t < Duration::from_millis(1600) {
                (800e6, false)
            } else {
                (path(n), false)
            }
        });
        assert!(n >= 20, "{n} {:?}", g.stages);
        assert!(g.stages[1].then.contains("new baseline"), "{:?}", g.stages);
        // A path that only loses with more streams stops after the
        // allowed number of new baselines.
        let (_, g) = drive(50, 4, 64, 64, 100 << 30, |n| 1e9 / n as f64);
        let rebased = g.stages.iter().filter(|s| s.then.contains("new baseline"));
        assert_eq!(rebased.count(), REBASELINES as usize, "{:?}", g.stages);
        assert!(g.stopped.unwrap().contains("less than +"));
    }

    #[test]
    fn idle_links_stop_the_growth_busy_ones_let_it_go_on() {
        // The sink takes 300 MB/s whatever the count: the senders wait for
        // its credits, the links have data in flight 30 % of the time.
        // The first stage already says so: no stream is added.
        let (n, g) = drive_busy(50, 16, 32, 32, 100 << 30, |_, _| (300e6, false, Some(0.3)));
        assert_eq!(n, 16, "{:?}", g.stages);
        assert_eq!(g.stages.len(), 1);
        assert_eq!(g.stages[0].busy_pct, Some(30.0));
        let why = g.stopped.unwrap();
        assert!(why.contains("the ends, not the path"), "{why}");
        // Busy links on a path that still grows: growth goes on as before.
        let (n, g) = drive_busy(50, 4, 64, 64, 100 << 30, |n, _| {
            (path(n), false, Some(0.95))
        });
        assert!((20..=40).contains(&n), "{n} {:?}", g.stages);
        assert!(g.stopped.unwrap().contains("less than +"));
        // Links that become idle once the path is full stop it there
        // rather than after one more stage.
        let (n, g) = drive_busy(50, 8, 64, 64, 100 << 30, |n, _| {
            let b = if n >= 18 { 0.4 } else { 0.95 };
            (path(n), false, Some(b))
        });
        assert_eq!(n, 18, "{:?}", g.stages);
        assert!(g.stopped.unwrap().contains("in flight only 40 %"));
    }

    #[test]
    fn a_queueing_path_stops_the_growth_a_window_limited_one_does_not() {
        // A 200 MB/s bottleneck that 4 streams fill: the links' RTT is
        // 1.8 x its minimum (BBR keeps about a BDP queued). The first
        // stage stops it: no stream is added.
        let (n, g) = drive_links(50, 16, 32, 32, 100 << 30, |_, _| {
            (200e6, false, Some(1.0), Some(1.8))
        });
        assert_eq!(n, 16, "{:?}", g.stages);
        assert_eq!(g.stages[0].rtt_x, Some(1.8));
        assert!(g.stopped.unwrap().contains("bottleneck is full"));
        // Streams held back by their windows queue nothing: growth goes
        // on until the path fills, then the queue stops it.
        let (n, g) = drive_links(50, 4, 64, 64, 100 << 30, |n, _| {
            let q = if path(n) >= 500e6 { 1.7 } else { 1.05 };
            (path(n), false, Some(1.0), Some(q))
        });
        assert!((20..=30).contains(&n), "{n} {:?}", g.stages);
        assert!(g.stopped.unwrap().contains("bottleneck is full"));
    }
}
