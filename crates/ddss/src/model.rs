//! Coherence models (seed 003 sec. 2.2.3, lines ~573-579): what a get may
//! return and which operations exclude each other. A segment's model is
//! fixed when it is allocated (`allocate_ss(nbytes, type)`, Table 2.1).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Model {
    /// Latest version; a lock held by another holder excludes both gets
    /// and puts.
    Strict,
    /// Latest version; another holder's lock excludes puts only.
    Write,
    /// Latest version; another holder's lock excludes gets only.
    Read,
    /// Whatever copy the reader has cached (fetched once).
    Null,
    /// At most `x` versions behind the home's latest.
    Delta(u64),
    /// At most `t` milliseconds old (time since the copy was confirmed
    /// current by the home).
    Temporal(u32),
    /// Latest version, but data crosses the network only when the 64-bit
    /// version changed.
    Version,
}

impl Model {
    /// Does another holder's lock refuse a get?
    pub fn lock_excludes_get(self) -> bool {
        matches!(self, Model::Strict | Model::Read)
    }

    /// Does another holder's lock refuse a put?
    pub fn lock_excludes_put(self) -> bool {
        matches!(self, Model::Strict | Model::Write)
    }

    /// How many versions a cached copy may lag and still be returned after
    /// the home confirmed the version (0: only the latest).
    pub fn slack(self) -> u64 {
        match self {
            Model::Delta(x) => x,
            _ => 0,
        }
    }
}

impl std::str::FromStr for Model {
    type Err = String;
    /// `strict`, `write`, `read`, `null`, `version`, `delta:X`, `temporal:MS`.
    fn from_str(s: &str) -> Result<Model, String> {
        let num = |v: &str| v.parse::<u64>().map_err(|e| format!("model {s}: {e}"));
        Ok(match s.split_once(':') {
            None => match s {
                "strict" => Model::Strict,
                "write" => Model::Write,
                "read" => Model::Read,
                "null" => Model::Null,
                "version" => Model::Version,
                _ => return Err(format!("unknown coherence model {s}")),
            },
            Some(("delta", v)) => Model::Delta(num(v)?),
            Some(("temporal", v)) => Model::Temporal(
                u32::try_from(num(v)?).map_err(|_| format!("model {s}: too large"))?,
            ),
            Some(_) => return Err(format!("unknown coherence model {s}")),
        })
    }
}

impl std::fmt::Display for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Model::Strict => write!(f, "strict"),
            Model::Write => write!(f, "write"),
            Model::Read => write!(f, "read"),
            Model::Null => write!(f, "null"),
            Model::Version => write!(f, "version"),
            Model::Delta(x) => write!(f, "delta:{x}"),
            Model::Temporal(t) => write!(f, "temporal:{t}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_roundtrip() {
        for m in [
            Model::Strict,
            Model::Write,
            Model::Read,
            Model::Null,
            Model::Version,
            Model::Delta(3),
            Model::Temporal(50),
        ] {
            assert_eq!(m.to_string().parse::<Model>().unwrap(), m);
        }
        assert!("delta:x".parse::<Model>().is_err());
        assert!("weird".parse::<Model>().is_err());
    }
}
