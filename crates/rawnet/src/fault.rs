//! Fault injection for raw channels (issue 18: "loss, duplication,
//! reordering and corruption injected by a fault hook in the transport";
//! netem is not available here). The hook sits on a channel's receive path
//! (and on the in-memory link of the tests), so the reliability layer sees
//! exactly what a bad wire would give it. Seeded, so a failing run repeats.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Probabilities (0.0-1.0) of each fault per frame.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FaultRates {
    pub loss: f64,
    pub duplicate: f64,
    pub reorder: f64,
    pub corrupt: f64,
}

impl FaultRates {
    /// The same rate for every fault.
    pub fn all(p: f64) -> FaultRates {
        FaultRates {
            loss: p,
            duplicate: p,
            reorder: p,
            corrupt: p,
        }
    }
    /// Parse `loss=0.01,dup=0.01,reorder=0.01,corrupt=0.01` or a single
    /// number for all four.
    pub fn parse(s: &str) -> Result<FaultRates, String> {
        if let Ok(p) = s.trim().parse::<f64>() {
            return Ok(FaultRates::all(p));
        }
        let mut r = FaultRates::default();
        for part in s.split(',') {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("fault spec {part:?}: want name=probability"))?;
            let v: f64 = v
                .trim()
                .parse()
                .map_err(|_| format!("fault spec {part:?}: not a number"))?;
            match k.trim() {
                "loss" => r.loss = v,
                "dup" | "duplicate" => r.duplicate = v,
                "reorder" => r.reorder = v,
                "corrupt" => r.corrupt = v,
                _ => return Err(format!("fault spec {part:?}: unknown fault")),
            }
        }
        Ok(r)
    }
}

/// The variable that injects faults into a process's raw channels (the
/// daemon's and the agent's, for end-to-end tests): a [`FaultRates::parse`]
/// spec, e.g. `0.01` or `loss=0.05,dup=0.05`.
pub const FAULTS_ENV: &str = "RAMSYS_RAW_FAULTS";

/// Faults for a new channel from [`FAULTS_ENV`] (a fresh seed each), None
/// when unset, empty or malformed (a malformed spec is logged: a test
/// asking for faults must not silently run without them).
pub fn from_env() -> Option<(FaultRates, u64)> {
    let s = std::env::var(FAULTS_ENV).ok()?;
    if s.trim().is_empty() {
        return None;
    }
    match FaultRates::parse(&s) {
        Ok(r) => Some((r, rand::random())),
        Err(e) => {
            tracing::error!("{FAULTS_ENV}: {e}; no faults injected");
            None
        }
    }
}

/// Counters of what the hook did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultCounts {
    pub lost: u64,
    pub duplicated: u64,
    pub reordered: u64,
    pub corrupted: u64,
}

/// A fault hook: feed it every frame, it emits what the bad wire delivers.
pub struct Faults {
    rates: FaultRates,
    rng: StdRng,
    /// A frame held back to be delivered after the next one (reordering);
    /// its buffer is allocated once.
    held: Vec<u8>,
    held_len: Option<usize>,
    pub counts: FaultCounts,
}

impl Faults {
    pub fn new(rates: FaultRates, seed: u64, max_frame: usize) -> Faults {
        Faults {
            rates,
            rng: StdRng::seed_from_u64(seed),
            held: vec![0u8; max_frame],
            held_len: None,
            counts: FaultCounts::default(),
        }
    }

    /// Pass one frame through the hook; `emit` receives 0, 1, 2 or 3
    /// frames (a duplicate, a held-back earlier frame).
    pub fn apply(&mut self, frame: &mut [u8], mut emit: impl FnMut(&[u8])) {
        let r = self.rates;
        if self.rng.gen::<f64>() < r.loss {
            self.counts.lost += 1;
            return;
        }
        if !frame.is_empty() && self.rng.gen::<f64>() < r.corrupt {
            let bit = self.rng.gen_range(0..frame.len() * 8);
            frame[bit / 8] ^= 1 << (bit % 8);
            self.counts.corrupted += 1;
        }
        if self.held_len.is_none()
            && frame.len() <= self.held.len()
            && self.rng.gen::<f64>() < r.reorder
        {
            self.held[..frame.len()].copy_from_slice(frame);
            self.held_len = Some(frame.len());
            self.counts.reordered += 1;
            return;
        }
        emit(frame);
        if self.rng.gen::<f64>() < r.duplicate {
            self.counts.duplicated += 1;
            emit(frame);
        }
        if let Some(n) = self.held_len.take() {
            emit(&self.held[..n]);
        }
    }

    /// Deliver a held-back frame now (the wire went idle).
    pub fn flush(&mut self, mut emit: impl FnMut(&[u8])) {
        if let Some(n) = self.held_len.take() {
            emit(&self.held[..n]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse() {
        assert_eq!(FaultRates::parse("0.05").unwrap(), FaultRates::all(0.05));
        let r = FaultRates::parse("loss=0.01, reorder=0.02").unwrap();
        assert_eq!((r.loss, r.reorder, r.duplicate), (0.01, 0.02, 0.0));
        assert!(FaultRates::parse("jitter=1").is_err());
        assert!(FaultRates::parse("loss").is_err());
    }

    #[test]
    fn faults_happen_at_about_their_rates() {
        let mut f = Faults::new(FaultRates::all(0.05), 7, 64);
        let mut out = 0u64;
        for i in 0..20_000u32 {
            let mut fr = i.to_be_bytes();
            f.apply(&mut fr, |_| out += 1);
        }
        f.flush(|_| out += 1);
        let c = f.counts;
        for n in [c.lost, c.duplicated, c.reordered, c.corrupted] {
            assert!((600..1400).contains(&n), "{c:?}");
        }
        assert_eq!(out, 20_000 - c.lost + c.duplicated);
    }
}
