//! Channels (seed 002 sec. 3, 5, 6.3): with several NICs that reach the
//! peer, every link is bound to one NIC by the channel scheduler's policy
//! (round robin, affinity-aware, dynamic) and its socket's source address
//! is that NIC's address (bind, then connect), so each stream leaves
//! through the NIC the scheduler chose and `--explain` can show it.
//!
//! Every connection of the session goes through here, the control link
//! included: it is one more (light) channel. Binding the source address
//! selects the NIC when each NIC sits on its own subnet or the host routes
//! by source (policy routing); on one shared subnet without source routing
//! the kernel may still send through its preferred route, with this
//! source address.

use std::io;
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Mutex;
use std::time::Duration;

use ramsys_topo::{Channel, ChannelPolicy, ChannelScheduler, Topology};

use super::tcp::tune;
use super::{Link, Transport};

/// One NIC a channel can use: name, node, and the local address to bind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NicChannel {
    pub nic: String,
    pub node: Option<u32>,
    pub addr: IpAddr,
}

/// The NICs of `topo` that can carry links to `peer`: every up NIC with an
/// address of the peer's family whose subnet holds the peer (loopback:
/// the loopback addresses of `lo`). Fewer than two means no choice.
pub fn nics_towards(topo: &Topology, peer: IpAddr) -> Vec<NicChannel> {
    let mut out = Vec::new();
    for n in &topo.nics {
        if n.operstate.as_deref() == Some("down") {
            continue;
        }
        for a in &n.addresses {
            let ok = if peer.is_loopback() {
                a.addr.is_loopback() && a.addr.is_ipv4() == peer.is_ipv4()
            } else {
                !a.addr.is_loopback() && a.contains(peer) && a.addr != peer
            };
            if ok {
                out.push(NicChannel {
                    nic: n.name.clone(),
                    node: n.numa_node,
                    addr: a.addr,
                });
                break;
            }
        }
    }
    out
}

/// A TCP transport that binds each link to a NIC chosen by a
/// [`ChannelScheduler`].
pub struct ChannelTcp {
    pub socket_buffer: Option<usize>,
    nics: Vec<NicChannel>,
    sched: Mutex<ChannelScheduler>,
    /// The node of the buffers the links carry (affinity-aware policy).
    buffer_node: Option<u32>,
}

impl ChannelTcp {
    /// [`nics_towards`], for callers holding only the type.
    pub fn towards(topo: &Topology, peer: IpAddr) -> Vec<NicChannel> {
        nics_towards(topo, peer)
    }

    pub fn new(
        nics: Vec<NicChannel>,
        policy: ChannelPolicy,
        buffer_node: Option<u32>,
    ) -> anyhow::Result<ChannelTcp> {
        let chans = nics
            .iter()
            .map(|n| Channel {
                nic: n.nic.clone(),
                node: n.node,
                capacity_mbps: ramsys_topo::channel::DEFAULT_CAPACITY_MBPS,
            })
            .collect();
        Ok(ChannelTcp {
            socket_buffer: None,
            sched: Mutex::new(ChannelScheduler::new(chans, policy)?),
            nics,
            buffer_node,
        })
    }

    pub fn nics(&self) -> &[NicChannel] {
        &self.nics
    }

    /// The NIC for the next link. Each link counts as one unit of work, so
    /// the affinity-aware policy spreads links evenly over the NICs on the
    /// buffers' node ("equal kBs to each channel", seed 002 sec. 5).
    fn next(&self) -> &NicChannel {
        let i = self.sched.lock().unwrap().pick(self.buffer_node, 1);
        &self.nics[i]
    }
}

fn connect_from(local: IpAddr, to: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::for_address(to), Type::STREAM, None)?;
    s.bind(&SocketAddr::new(local, 0).into())?;
    s.connect_timeout(&to.into(), timeout)?;
    Ok(s.into())
}

impl Transport for ChannelTcp {
    fn connect(&self, addr: &str, timeout: Duration) -> io::Result<Box<dyn Link>> {
        let nic = self.next();
        let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{addr}: no address"));
        for a in addr.to_socket_addrs()? {
            if a.is_ipv4() != nic.addr.is_ipv4() {
                continue;
            }
            match connect_from(nic.addr, a, timeout) {
                Ok(s) => {
                    tune(&s, self.socket_buffer);
                    return Ok(Box::new(s));
                }
                Err(e) => {
                    last = io::Error::new(e.kind(), format!("via {} ({}): {e}", nic.nic, nic.addr))
                }
            }
        }
        Err(last)
    }
    fn name(&self) -> &'static str {
        "tcp-channels"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two loopback addresses stand in for two NICs: round robin binds the
    /// links alternately to each, and each link's local address shows it.
    #[test]
    fn links_are_bound_to_the_chosen_nic() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let at = l.local_addr().unwrap().to_string();
        let nics = vec![
            NicChannel {
                nic: "a".into(),
                node: Some(0),
                addr: "127.0.0.1".parse().unwrap(),
            },
            NicChannel {
                nic: "b".into(),
                node: Some(1),
                addr: "127.0.0.2".parse().unwrap(),
            },
        ];
        let t = ChannelTcp::new(nics.clone(), ChannelPolicy::RoundRobin, None).unwrap();
        let locals: Vec<String> = (0..4)
            .map(|_| {
                let link = t.connect(&at, Duration::from_secs(5)).unwrap();
                link.local().rsplit_once(':').unwrap().0.to_string()
            })
            .collect();
        assert_eq!(locals, ["127.0.0.1", "127.0.0.2", "127.0.0.1", "127.0.0.2"]);
        // Affinity-aware with buffers on node 1: every link on NIC b.
        let t = ChannelTcp::new(nics, ChannelPolicy::AffinityAware, Some(1)).unwrap();
        for _ in 0..3 {
            let link = t.connect(&at, Duration::from_secs(5)).unwrap();
            assert!(link.local().starts_with("127.0.0.2:"), "{}", link.local());
        }
    }
}
