//! `ramsys://A,B,C/PATH` (issue 19, docs/SITE.md): the transfer goes to
//! the least-loaded of the listed daemons, chosen from the site's state
//! (seed 003 sec. 2.2.4-2.2.5: load balancing on fine-grained monitoring)
//! with one status round trip to the first daemon that answers. The listed
//! daemons must serve the same PATH namespace (a shared file system, or
//! copies of the data).

use std::time::Duration;

use ramsys_engine::daemon::site::redirect::least_loaded;

use crate::spec::Endpoint;

/// Replace a daemon endpoint's address list by the chosen daemon.
pub fn resolve(
    e: &mut Endpoint,
    key: &dyn Fn() -> anyhow::Result<Vec<u8>>,
    timeout: Duration,
) -> anyhow::Result<()> {
    let Endpoint::Daemon { addr, .. } = e else {
        return Ok(());
    };
    if !addr.contains(',') {
        return Ok(());
    }
    let list = addr.clone();
    let cands: Vec<&str> = list
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    let key = key()?;
    let mut last_err = None;
    for c in &cands {
        match crate::status::query(c, &key, timeout) {
            Ok(st) => {
                let pick = least_loaded(&cands, &st.site).unwrap_or(c);
                tracing::info!("{list}: chose {pick} (site view of {c})");
                *addr = pick.to_string();
                return Ok(());
            }
            Err(err) => last_err = Some(err),
        }
    }
    Err(last_err
        .unwrap_or_else(|| anyhow::anyhow!("empty daemon list"))
        .context(format!("none of the daemons {list} answered")))
}

/// A session a busy daemon sent to a peer of its site (Control::Redirect,
/// docs/SITE.md), as the summary reports it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Redirect {
    pub from: String,
    pub to: String,
    pub reason: String,
}

/// The one line the agent prints for a redirect it follows, control
/// characters escaped (the names come from the network).
pub fn redirect_line(from: &str, to: &str, reason: &str) -> String {
    format!(
        "{} is busy ({}); redirected to {}",
        from.escape_debug(),
        reason.escape_debug(),
        to.escape_debug()
    )
}

/// Follow the redirect `from` -> `to`, unless the session was redirected
/// already: the agent follows one redirect only, so a loop (or a chain of
/// busy daemons) ends in one line instead of bouncing.
pub fn follow(
    prev: Option<&Redirect>,
    from: &str,
    to: &str,
    reason: &str,
) -> Result<Redirect, String> {
    if let Some(p) = prev {
        return Err(format!(
            "{from} redirected the session to {to} after {} had redirected it to {from}: \
             a redirect chain is refused",
            p.from
        ));
    }
    if to.is_empty() || to == from {
        return Err(format!("{from} redirected the session to itself ({to:?})"));
    }
    Ok(Redirect {
        from: from.into(),
        to: to.into(),
        reason: reason.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_redirect_is_followed_a_chain_is_refused() {
        let r = follow(None, "a:1", "b:1", "busy").unwrap();
        assert_eq!((r.from.as_str(), r.to.as_str()), ("a:1", "b:1"));
        let e = follow(Some(&r), "b:1", "c:1", "busy").unwrap_err();
        assert!(e.contains("redirect chain is refused"), "{e}");
        assert!(!e.contains('\n'));
        // A loop back to the first daemon is a chain too.
        assert!(follow(Some(&r), "b:1", "a:1", "busy").is_err());
        assert!(follow(None, "a:1", "a:1", "busy").is_err());
    }
}
