//! The requester's side of the coherence models (seed 003 sec. 2.2.3):
//! its cached copies and, per get, whether the copy may be returned
//! without asking the home (null, temporal) or which conditional get to
//! send (every other model: "the actual data transfer only if the current
//! version does not match", lines ~575-577). Sans-I/O.
//!
//! Temporal mechanism (the seed leaves it undefined): a copy is returned
//! locally for `t` ms after the home last confirmed it current (a Data
//! reply, or Unchanged with slack 0); after that the get becomes a
//! version-based one. Delta(x): the home answers Unchanged while the
//! requester's version is at most x behind, so data moves only once the
//! copy is more than x versions stale.

use std::collections::HashMap;

use crate::model::Model;
use crate::msg::{Op, Reply};

#[derive(Debug, Clone)]
struct Entry {
    version: u64,
    model: Model,
    data: Vec<u8>,
    /// Requester clock (ms) when the home last confirmed this version as
    /// current.
    confirmed_ms: u64,
}

/// What a get returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Value {
    pub version: u64,
    pub data: Vec<u8>,
    /// Did the data cross the network for this get?
    pub moved: bool,
}

/// What to do for a get.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Return the cached copy; nothing is sent.
    Local(Value),
    /// Send this op to the home, then [`Cache::on_get_reply`].
    Ask(Op),
}

/// Cached copies keyed by (home, name).
#[derive(Default)]
pub struct Cache {
    entries: HashMap<(String, String), Entry>,
}

impl Cache {
    pub fn plan_get(&self, home: &str, name: &str, now_ms: u64) -> Plan {
        let k = (home.to_string(), name.to_string());
        let ask = |have: Option<u64>, slack: u64| {
            Plan::Ask(Op::Get {
                name: name.to_string(),
                have,
                slack,
            })
        };
        match self.entries.get(&k) {
            None => ask(None, 0),
            Some(e) => {
                let local = || {
                    Plan::Local(Value {
                        version: e.version,
                        data: e.data.clone(),
                        moved: false,
                    })
                };
                match e.model {
                    Model::Null => local(),
                    Model::Temporal(t) if now_ms.saturating_sub(e.confirmed_ms) < t as u64 => {
                        local()
                    }
                    m => ask(Some(e.version), m.slack()),
                }
            }
        }
    }

    /// The home's reply to the get planned above: the value to return,
    /// or None if the reply is not a get's.
    pub fn on_get_reply(&mut self, home: &str, name: &str, r: Reply, now_ms: u64) -> Option<Value> {
        let k = (home.to_string(), name.to_string());
        match r {
            Reply::Data {
                version,
                model,
                data,
            } => {
                self.entries.insert(
                    k,
                    Entry {
                        version,
                        model,
                        data: data.clone(),
                        confirmed_ms: now_ms,
                    },
                );
                Some(Value {
                    version,
                    data,
                    moved: true,
                })
            }
            Reply::Unchanged { version, model } => {
                let e = self.entries.get_mut(&k)?;
                e.model = model;
                if version == e.version {
                    e.confirmed_ms = now_ms;
                }
                Some(Value {
                    version: e.version,
                    data: e.data.clone(),
                    moved: false,
                })
            }
            _ => None,
        }
    }

    /// Our own put succeeded at `version`: the copy we wrote is current.
    pub fn on_put(
        &mut self,
        home: &str,
        name: &str,
        model: Option<Model>,
        version: u64,
        data: &[u8],
        now_ms: u64,
    ) {
        let k = (home.to_string(), name.to_string());
        let model = match (model, self.entries.get(&k)) {
            (Some(m), _) => m,
            (None, Some(e)) => e.model,
            // Unknown model: do not cache (the next get asks).
            (None, None) => return,
        };
        self.entries.insert(
            k,
            Entry {
                version,
                model,
                data: data.to_vec(),
                confirmed_ms: now_ms,
            },
        );
    }

    /// Drop every cached segment of `home` (a member that left).
    pub fn forget_home(&mut self, home: &str) {
        self.entries.retain(|(h, _), _| h != home);
    }

    /// Drop a copy (segment released, home gone).
    pub fn forget(&mut self, home: &str, name: &str) {
        self.entries.remove(&(home.to_string(), name.to_string()));
    }

    /// Remember a segment's model before anything was read (allocation).
    pub fn model_of(&self, home: &str, name: &str) -> Option<Model> {
        self.entries
            .get(&(home.to_string(), name.to_string()))
            .map(|e| e.model)
    }
}

/// Property tests per coherence model: several writers and readers
/// interleaved at random against one home; every get is checked against
/// the home's version history.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Step {
        Put(u8),
        Get(u8),
        Tick(u8),
    }

    fn steps() -> impl Strategy<Value = Vec<Step>> {
        proptest::collection::vec(
            prop_oneof![
                (0u8..3).prop_map(Step::Put),
                (0u8..3).prop_map(Step::Get),
                (1u8..40).prop_map(Step::Tick),
            ],
            1..120,
        )
    }

    /// Runs `steps` for `model`; calls `check(model, got, history, now,
    /// moved_ok)` on every get. history[v] = time version v became current.
    fn run(model: Model, steps: &[Step]) -> Result<(), TestCaseError> {
        let mut home = Store::new(1024);
        home.handle(
            9,
            Op::Allocate {
                name: "k".into(),
                capacity: 16,
                model,
            },
            0,
        )
        .unwrap();
        let mut readers: Vec<Cache> = (0..3).map(|_| Cache::default()).collect();
        let mut last: Vec<Option<u64>> = vec![None; 3];
        let mut history: Vec<u64> = vec![0]; // version 0 current from t=0
        let mut now = 0u64;
        for s in steps {
            match *s {
                Step::Tick(d) => now += d as u64,
                Step::Put(w) => {
                    let v = history.len() as u64;
                    let r = home
                        .handle(
                            w as u64 + 10,
                            Op::Put {
                                name: "k".into(),
                                data: v.to_le_bytes().to_vec(),
                                token: 0,
                            },
                            now,
                        )
                        .unwrap();
                    prop_assert_eq!(r, Reply::Stored { version: v });
                    history.push(now);
                }
                Step::Get(r) => {
                    let c = &mut readers[r as usize];
                    let latest = history.len() as u64 - 1;
                    let got = match c.plan_get("h", "k", now) {
                        Plan::Local(v) => v,
                        Plan::Ask(op) => {
                            let reply = home.handle(r as u64 + 20, op, now).unwrap();
                            c.on_get_reply("h", "k", reply, now).unwrap()
                        }
                    };
                    // The data is the version it claims.
                    if got.version > 0 {
                        prop_assert_eq!(got.data.clone(), got.version.to_le_bytes().to_vec());
                    }
                    match model {
                        Model::Strict | Model::Write | Model::Read | Model::Version => {
                            prop_assert_eq!(got.version, latest, "stale read under {}", model);
                        }
                        Model::Delta(x) => prop_assert!(latest - got.version <= x),
                        Model::Temporal(t) => {
                            // The copy was current at some instant within t.
                            let superseded = history.get(got.version as usize + 1).copied();
                            if let Some(at) = superseded {
                                prop_assert!(
                                    now.saturating_sub(at) < t as u64 || at >= now,
                                    "older than {} ms",
                                    t
                                );
                            }
                        }
                        Model::Null => prop_assert!(got.version <= latest),
                    }
                    // Version-based: data moves only on change.
                    if model == Model::Version {
                        let changed = last[r as usize] != Some(got.version);
                        prop_assert_eq!(got.moved, changed, "moved without a change");
                    }
                    last[r as usize] = Some(got.version);
                }
            }
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn strict_never_stale(s in steps()) { run(Model::Strict, &s)?; }
        #[test]
        fn write_never_stale(s in steps()) { run(Model::Write, &s)?; }
        #[test]
        fn read_never_stale(s in steps()) { run(Model::Read, &s)?; }
        #[test]
        fn version_never_stale(s in steps()) { run(Model::Version, &s)?; }
        #[test]
        fn delta_at_most_x_behind(s in steps(), x in 0u64..4) { run(Model::Delta(x), &s)?; }
        #[test]
        fn temporal_at_most_t_old(s in steps(), t in 1u32..60) { run(Model::Temporal(t), &s)?; }
        #[test]
        fn null_returns_some_version(s in steps()) { run(Model::Null, &s)?; }
    }
}
