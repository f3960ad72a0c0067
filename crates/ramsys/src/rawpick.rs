//! `--transport tcp|raw|auto` and `--raw-iface` (issue 18, seed 002):
//! the agent asks the daemon for its raw-channel interfaces (RawQuery),
//! pairs them with its own (engine transport::rawlink) and, if that
//! works, carries the session's data links as raw channels while the
//! control link stays TCP. `raw`: anything in the way is one line and a
//! non-zero exit; `auto`: TCP instead.

use std::net::ToSocketAddrs;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use ramsys_engine::roles::client::{raw_offer, Remote};
use ramsys_engine::transport::channels::nics_towards;
use ramsys_engine::transport::rawlink::{pair, Mode, RawTransport, Split};
use ramsys_engine::transport::Transport;

#[derive(Args, Debug, Clone, Default)]
pub struct RawArgs {
    /// Data links over TCP, over raw-Ethernet channels (the daemon must
    /// offer them, `serve --raw-iface`, on this host's L2 segment; needs
    /// CAP_NET_RAW), or auto: raw when that works, else TCP. The control
    /// link is always TCP (docs/TYCHE.md).
    #[arg(long, default_value = "tcp", value_name = "tcp|raw|auto")]
    pub transport: Mode,
    /// This host's interface for raw channels (repeatable: links are
    /// spread over them by --channels). Default: the interfaces on the
    /// route to the daemon's address.
    #[arg(long, value_name = "IFACE")]
    pub raw_iface: Vec<String>,
    /// Large raw-channel slot copies on a copy thread (seed 003's MCNI;
    /// default: env RAMSYS_COPY_OFFLOAD, else auto = on with >= 4 CPUs).
    #[arg(long, value_name = "on|off|auto")]
    pub copy_offload: Option<ramsys_rawnet::offload::Mode>,
}

/// Where the daemon is and how to authenticate there.
pub struct Daemon<'a> {
    pub addr: &'a str,
    pub key: &'a [u8],
    pub timeout: Duration,
    /// A session started over ssh (its daemon serves one session and
    /// offers no raw channels).
    pub via_ssh: bool,
}

/// `control` as is (`tcp`, or `auto` when raw is not possible), or a
/// transport whose data links are raw channels; with `auto`, why raw was
/// not used (the summary says so: issue 35).
pub fn data_transport(
    a: &RawArgs,
    d: &Daemon,
    policy: ramsys_topo::ChannelPolicy,
    buffer_node: Option<u32>,
    control: Arc<dyn Transport>,
) -> anyhow::Result<(Arc<dyn Transport>, Option<String>)> {
    if a.transport == Mode::Tcp {
        return Ok((control, None));
    }
    if let Some(m) = a.copy_offload {
        ramsys_rawnet::offload::set_mode(m);
    }
    match raw_pairs(a, d, control.clone()) {
        Ok(pairs) => {
            let shown: Vec<String> = pairs
                .iter()
                .map(|p| format!("{} -> {} (MTU {})", p.local, p.peer, p.mtu))
                .collect();
            tracing::info!("raw channels: {}", shown.join(", "));
            let data = Arc::new(RawTransport::new(pairs, policy, buffer_node)?);
            Ok((Arc::new(Split { control, data }), None))
        }
        Err(e) if a.transport == Mode::Auto => {
            tracing::info!("{e}; data links over TCP");
            Ok((control, Some(e)))
        }
        Err(e) => Err(anyhow::anyhow!(e)),
    }
}

fn raw_pairs(
    a: &RawArgs,
    d: &Daemon,
    control: Arc<dyn Transport>,
) -> Result<Vec<ramsys_engine::transport::rawlink::RawPair>, String> {
    if d.via_ssh {
        return Err("raw transport: not for sessions started over ssh".into());
    }
    let topo = ramsys_topo::discover(std::path::Path::new("/")).ok();
    let locals = if a.raw_iface.is_empty() {
        let ip = d
            .addr
            .to_socket_addrs()
            .ok()
            .and_then(|mut i| i.next())
            .map(|s| s.ip())
            .ok_or_else(|| format!("raw transport: cannot resolve {}", d.addr))?;
        if ip.is_loopback() {
            return Err(format!(
                "raw transport: {} is a loopback address; raw channels need an Ethernet segment",
                d.addr
            ));
        }
        topo.as_ref()
            .map(|t| nics_towards(t, ip).into_iter().map(|n| n.nic).collect())
            .unwrap_or_default()
    } else {
        a.raw_iface.clone()
    };
    let remote = Remote {
        transport: control,
        addr: d.addr.to_string(),
        key: d.key.to_vec(),
        connect_timeout: d.timeout,
        user: None,
    };
    let offer = raw_offer(&remote).map_err(|e| format!("raw transport: {e}"))?;
    pair(&locals, &offer, topo.as_ref(), d.addr)
}
