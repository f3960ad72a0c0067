//! Where a session's task runs (issue 7): its NIC and counters, and the
//! plan (MSMRAP heuristic over the topology and the I/O model) whose
//! thread counts the task follows.

use std::path::Path;
use std::sync::Arc;

use crate::session::options::TransferOptions;
use crate::types::stats::Stats;

use super::DaemonShared;

/// Where a session's task runs: its NIC and local address, its counters.
pub(super) struct Place {
    pub(super) nic: String,
    pub(super) local_addr: String,
    pub(super) stats: Arc<Stats>,
}

/// Issue 7: when a task starts, plan it (MSMRAP heuristic over the
/// topology, the I/O model if configured, the task's storage device and
/// NIC) and run its storage threads with the plan's count, within the pools
/// (admission may still grant fewer). The plan shows in `ramsys status`.
/// The stream count stays the one agreed with the client, capped by the
/// pools: the agent plans its own end. Re-planning: docs/SCHEDULER.md.
pub(super) fn follow_plan(
    sh: &DaemonShared,
    task: &crate::daemon::TaskGuard,
    sink: bool,
    path: &Path,
    local: &str,
    opts: &mut TransferOptions,
) {
    let Some(p) = sh.placement.get() else {
        return;
    };
    // The host's load as the site sees it (our own record, the same a
    // peer reads), less the daemon's own share: CPUs other work keeps busy
    // are out of the plan's budget, so a busy host runs fewer threads.
    let load = sh
        .site
        .get()
        .and_then(|s| s.members().into_iter().next())
        .map(|m| (m.cpu_load, m.own_cpu));
    let busy = load.map_or(0, |(l, own)| {
        ramsys_sched::busy_from_load(l - own, p.topo.nodes.iter().map(|n| n.cpus.len()).sum())
    });
    let Some((plan, storage, nic, busy)) =
        p.task_plan(sink, path, local, opts.block_size as u64, busy)
    else {
        return;
    };
    let configured = p.device_threads.get(&storage).copied();
    // Floor 1 for readers: the storage layer already gives a rotational
    // device one thread per device queue (seed 000 6.1.2), so the plan
    // cannot starve it; writers: SINK_WRITERS_MIN (buffered writes).
    let floor = if sink {
        crate::daemon::config::placement::SINK_WRITERS_MIN
    } else {
        1
    };
    let c = crate::daemon::config::placement::task_counts(
        &plan,
        sink,
        &storage,
        &nic,
        configured,
        &sh.res.config,
        floor,
    );
    if sink {
        let plain = crate::daemon::config::placement::task_counts(
            &plan,
            sink,
            &storage,
            &nic,
            configured,
            &sh.res.config,
            1,
        );
        opts.bulk_writers = (plain.storage < c.storage).then_some(plain.storage);
        opts.writers = c.storage;
    } else {
        opts.readers = c.storage;
    }
    tracing::info!(
        "task {}: plan {storage} {} {nic}: {} storage threads, {:.1} Gbps predicted ({} bound)",
        task.id(),
        if sink { "<-" } else { "->" },
        c.storage,
        plan.predicted.gbps,
        plan.predicted.bottleneck
    );
    if let Ok(mut v) = serde_json::to_value(&plan) {
        v["storage_device"] = storage.into();
        v["nic"] = nic.into();
        v["followed"] =
            serde_json::json!({"storage_threads": c.storage, "planned_network_threads": c.network});
        if let Some((l, own)) = load {
            v["host_load"] = serde_json::json!({"cpu_load": l, "own_cpu": own, "busy_cpus": busy});
        }
        task.set_plan(v);
    }
}
