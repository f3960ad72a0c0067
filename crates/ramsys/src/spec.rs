//! Parsing of command-line values: endpoints and sizes.

/// A transfer endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Local(std::path::PathBuf),
    /// ramsys://HOST:PORT/PATH; path relative to the daemon root.
    Daemon {
        addr: String,
        path: Vec<u8>,
    },
}

pub fn parse_endpoint(s: &str) -> anyhow::Result<Endpoint> {
    if let Some(rest) = s.strip_prefix("ramsys://") {
        let (hostport, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        anyhow::ensure!(!hostport.is_empty(), "{s}: missing HOST:PORT");
        let addr = if hostport.starts_with('[')
            || hostport
                .rsplit_once(':')
                .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        {
            hostport.to_string()
        } else {
            anyhow::bail!("{s}: missing port (ramsys://HOST:PORT/PATH)");
        };
        let path = path.trim_matches('/');
        for c in path.split('/') {
            anyhow::ensure!(c != "..", "{s}: '..' is not allowed in daemon paths");
        }
        let path: String = path
            .split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .collect::<Vec<_>>()
            .join("/");
        Ok(Endpoint::Daemon {
            addr,
            path: path.into_bytes(),
        })
    } else {
        anyhow::ensure!(!s.is_empty(), "empty path");
        Ok(Endpoint::Local(s.into()))
    }
}

/// "4M", "4MiB", "512k", "1G", "65536".
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (n, unit) = t.split_at(digits);
    let n: u64 = n.parse().map_err(|_| format!("invalid size {s:?}"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => return Err(format!("invalid size unit in {s:?} (use K, M or G)")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert_eq!(
            parse_endpoint("ramsys://h:7/a/b/").unwrap(),
            Endpoint::Daemon {
                addr: "h:7".into(),
                path: b"a/b".to_vec()
            }
        );
        assert_eq!(
            parse_endpoint("ramsys://127.0.0.1:9").unwrap(),
            Endpoint::Daemon {
                addr: "127.0.0.1:9".into(),
                path: vec![]
            }
        );
        assert!(parse_endpoint("ramsys://h/a").is_err());
        assert!(parse_endpoint("ramsys://h:1/../x").is_err());
        assert_eq!(
            parse_endpoint("x:y").unwrap(),
            Endpoint::Local("x:y".into())
        );
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4M"), Ok(4 << 20));
        assert_eq!(parse_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_size("100"), Ok(100));
        assert!(parse_size("4Q").is_err());
        assert!(parse_size("").is_err());
    }
}
