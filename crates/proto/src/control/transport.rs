//! What hosts and links report about the transport: TCP buffer limits, a stage
//! of stream growth and its links, raw-channel interfaces.

use serde::{Deserialize, Serialize};

/// A host's TCP buffer limits ([`crate::auth::Accept`]): the maxima of
/// `net.ipv4.tcp_wmem` and `net.ipv4.tcp_rmem`, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TcpBuffers {
    pub wmem_max: u64,
    pub rmem_max: u64,
}

/// What a stage's links said ([`Control::GrownLinks`](super::Control::GrownLinks)); None where the
/// transport has no TCP_INFO.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageLinks {
    /// Share of the stage the links had data in flight, per mille.
    pub busy_pm: Option<u16>,
    /// The links' smoothed RTT over their minimum, hundredths.
    pub rtt_x100: Option<u32>,
}

/// One stage of a server-side source's stream adaptation ([`Control::Grown`](super::Control::Grown)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrowStage {
    /// Milliseconds since the payload began, at the end of the measurement.
    pub at_ms: u32,
    pub streams: u16,
    /// Aggregate delivery rate over the measurement, kB/s (1000 bytes).
    pub kb_s: u64,
    /// The links' own delivery rates at its end, kB/s: lowest, median,
    /// highest (empty where the transport has none).
    pub link_kb_s: Vec<u64>,
    /// What was decided after it.
    pub then: String,
}

/// One interface a daemon offers raw channels on (docs/TYCHE.md,
/// "Negotiation"): the agent pairs its own interfaces with these (same
/// subnet of an address, then a probe channel) and dials data links to
/// `mac`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RawIface {
    pub name: String,
    pub ifindex: u32,
    pub mac: [u8; 6],
    pub mtu: u32,
    /// The NIC's NUMA node, None when unknown.
    pub node: Option<u32>,
    /// The interface's IP addresses (text), for pairing by subnet.
    pub addrs: Vec<String>,
}
