//! The agent's side of a transfer with a daemon: push (we are the source)
//! or pull (we are the sink).

use std::sync::Arc;
use std::time::Duration;

use ramsys_proto::control::{Open, Role};
use ramsys_proto::Control;

use crate::fsops::Root;
use crate::request::walk::Top;
use crate::resources::EngineResources;
use crate::session::{client_connect, ClientLinks};
use crate::sink::{run_sink, SinkSpec};
use crate::source::{run_source, SourceSpec};
use crate::stats::{Report, Stats};
use crate::transport::Transport;
use crate::wire::send_control;
use crate::{EngineError, TransferOptions};

/// Connection parameters for a daemon.
pub struct Remote {
    pub transport: Arc<dyn Transport>,
    pub addr: String,
    pub key: Vec<u8>,
    pub connect_timeout: Duration,
}

/// Send local `tops` (under `root`) to `dest` on the daemon.
pub fn push(
    remote: &Remote,
    root: Arc<Root>,
    tops: Vec<Top>,
    dest: Vec<u8>,
    opts: &TransferOptions,
    res: &EngineResources,
    stats: Arc<Stats>,
) -> Result<Report, EngineError> {
    let mut s = client_connect(
        &*remote.transport,
        &remote.addr,
        &remote.key,
        remote.connect_timeout,
    )?;
    send_control(
        &mut *s.ctl,
        &Control::Open(Open {
            server_role: Role::Sink,
            paths: vec![dest],
            recursive: opts.recursive,
        }),
    )?;
    let mut links = ClientLinks {
        transport: remote.transport.clone(),
        addr: remote.addr.clone(),
        session: s.session,
        session_key: s.session_key,
        timeout: remote.connect_timeout,
    };
    run_source(
        s.ctl,
        &mut links,
        SourceSpec { root, tops },
        opts,
        res,
        stats,
    )
}

/// Fetch `paths` from the daemon into `dest` under the local `root`.
pub fn pull(
    remote: &Remote,
    paths: Vec<Vec<u8>>,
    root: Arc<Root>,
    dest: Vec<u8>,
    opts: &TransferOptions,
    res: &EngineResources,
    stats: Arc<Stats>,
) -> Result<Report, EngineError> {
    let mut s = client_connect(
        &*remote.transport,
        &remote.addr,
        &remote.key,
        remote.connect_timeout,
    )?;
    send_control(
        &mut *s.ctl,
        &Control::Open(Open {
            server_role: Role::Source,
            paths,
            recursive: opts.recursive,
        }),
    )?;
    let mut links = ClientLinks {
        transport: remote.transport.clone(),
        addr: remote.addr.clone(),
        session: s.session,
        session_key: s.session_key,
        timeout: remote.connect_timeout,
    };
    let spec = SinkSpec {
        root,
        dest,
        session: s.session,
    };
    run_sink(s.ctl, &mut links, spec, opts, res, stats)
}
