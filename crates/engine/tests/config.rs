//! `serve --config` parsing and the daemon placement it leads to, on the
//! fixture topologies of crates/topo/tests/fixtures (issue 5, 6, 7).

use std::path::{Path, PathBuf};

use ramsys_engine::daemon::config::placement::{daemon_placement, task_counts, ServeInputs};
use ramsys_engine::daemon::config::{DaemonConfig, Purpose};
use ramsys_engine::types::sendpath::SendPath;
use ramsys_topo::{NumaMode, Topology};

fn fixture(name: &str) -> Topology {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../topo/tests/fixtures")
        .join(name);
    ramsys_topo::discover(&p).unwrap()
}

fn cpus_of(t: &Topology, node: u32) -> Vec<usize> {
    t.node(node).unwrap().cpus.clone()
}

fn inputs() -> ServeInputs {
    ServeInputs {
        buffer_size: 4 << 20,
        ..Default::default()
    }
}

#[test]
fn parses_every_key() {
    let c = DaemonConfig::parse(
        r#"
numa = "auto"
memory = "512M"
max_streams = 8
readers = 3
writers = 5
model = "m.json"
send_path = "inline"
direct = "never"
max_rate = "200M"
[devices.sdb]
capacity_gbps = 6
threads = 2
[devices.eth1]
purpose = "storage"
capacity_gbps = 2.5
[users.alice]
key_file = "keys/alice"
root = "/srv/alice"
read_only = true
max_rate = 1048576
"#,
        Path::new("/etc/ramsys"),
    )
    .unwrap();
    assert_eq!(c.numa, Some(NumaMode::Auto));
    assert_eq!(c.memory, Some(512 << 20));
    // The config's `memory` and `serve --memory` share one unit rule
    // (issue 37's user-facing bug: "512MB" was refused here, 2^20-based
    // there): both now read 512 000 000.
    for (text, bytes) in [
        ("512MB", 512_000_000),
        ("512MiB", 512 << 20),
        ("512M", 512 << 20),
    ] {
        let c = DaemonConfig::parse(&format!("memory = \"{text}\"\n"), Path::new(".")).unwrap();
        assert_eq!(c.memory, Some(bytes), "{text}");
        assert_eq!(ramsys_units::parse_size(text), Ok(bytes), "{text}");
    }
    assert_eq!(c.max_streams, Some(8));
    assert_eq!((c.readers, c.writers), (Some(3), Some(5)));
    assert_eq!(c.model, Some(PathBuf::from("/etc/ramsys/m.json")));
    assert_eq!(c.send_path, Some(SendPath::Inline));
    assert_eq!(
        c.direct,
        Some(ramsys_engine::storage::cache::DirectMode::Never)
    );
    assert_eq!(c.devices["sdb"].threads, Some(2));
    assert_eq!(c.devices["sdb"].capacity_gbps, Some(6.0));
    assert_eq!(c.devices["eth1"].purpose, Some(Purpose::Storage));
    assert_eq!(c.capacities().get("eth1"), Some(&2.5));
    assert_eq!(c.users.len(), 1);
    assert_eq!(c.users[0].name, "alice");
    assert_eq!(c.users[0].key_file, PathBuf::from("/etc/ramsys/keys/alice"));
    assert!(c.users[0].read_only);
    assert_eq!(c.max_rate, Some(200 << 20));
    assert_eq!(c.users[0].max_rate, Some(1 << 20));
    assert_eq!(
        DaemonConfig::parse("numa = 1", Path::new("."))
            .unwrap()
            .numa,
        Some(NumaMode::Node(1))
    );
    assert_eq!(
        DaemonConfig::parse("", Path::new(".")).unwrap(),
        DaemonConfig::default()
    );
}

#[test]
fn invalid_files_name_the_key_in_one_line() {
    for (text, key) in [
        ("readers = 0", "`readers`"),
        ("readers = \"x\"", "`readers`"),
        ("numa = \"sideways\"", "`numa`"),
        ("memory = \"12Q\"", "`memory`"),
        ("send_path = \"fast\"", "`send_path`"),
        ("direct = \"maybe\"", "`direct`"),
        ("max_rate = \"fast\"", "`max_rate`"),
        ("max_rate = -1", "`max_rate`"),
        ("max_rate = 100", "`max_rate`"),
        ("bogus = 1", "`bogus`"),
        ("[devices.sda]\nthreads = -2", "`devices.sda.threads`"),
        ("[devices.sda]\npurpose = \"fun\"", "`devices.sda.purpose`"),
        (
            "[devices.sda]\ncapacity_gbps = 0",
            "`devices.sda.capacity_gbps`",
        ),
        ("[devices.sda]\nspeed = 1", "`devices.sda.speed`"),
        ("devices = 3", "`devices`"),
        ("[users.bob]\nroot = \"/r\"", "[users.bob]"),
        ("users = 1", "`users`"),
    ] {
        let e = DaemonConfig::parse(text, Path::new(".")).unwrap_err();
        assert!(e.contains(key), "{text:?}: {e}");
        assert!(!e.contains('\n'), "{text:?}: {e}");
    }
    let e = DaemonConfig::parse("readers = 3\nmemory = [", Path::new(".")).unwrap_err();
    assert!(e.contains("line 2"), "{e}");
    assert!(!e.contains('\n'), "{e}");
}

/// Seed 004 front end: SSD on node 0, the 40 GbE NIC eth2 on node 1.
#[test]
fn seed004_daemon_pools_follow_root_device_and_listen_nic() {
    let t = fixture("seed004-frontend");
    let p = daemon_placement(
        t.clone(),
        false,
        &DaemonConfig::default(),
        &inputs(),
        Path::new("/ssd/export"),
        "192.168.40.10:7000",
    )
    .unwrap();
    assert_eq!(p.nic.as_deref(), Some("eth2"));
    let ssd = t.device_for_path(Path::new("/ssd/export")).unwrap();
    assert_eq!(p.storage.as_deref(), Some(ssd.name.as_str()));
    let r = &p.resources;
    assert_eq!(r.storage_cpus, cpus_of(&t, 0));
    assert_eq!(r.net_cpus, cpus_of(&t, 1));
    assert_eq!(r.buffer_node, Some(1));
    // SSD: sized by type (seed 000 6.1.2) or by the plan, whichever is more.
    assert!(r.readers >= 2, "{r:?}");
    assert_eq!(r.readers, r.writers);
    assert_eq!(
        r.max_streams,
        ramsys_engine::data::resources::DEFAULT_MAX_STREAMS
    );
    assert!(
        p.lines.iter().any(|l| l.contains("node 1")),
        "{:?}",
        p.lines
    );

    // The config overrides counts and memory; numa off leaves pinning to the OS.
    let cfg = DaemonConfig::parse(
        &format!(
            "numa = \"off\"\nmemory = \"64M\"\n[devices.{}]\nthreads = 7\n[devices.eth2]\nthreads = 5\n",
            ssd.name
        ),
        Path::new("."),
    )
    .unwrap();
    let p = daemon_placement(
        t.clone(),
        false,
        &cfg,
        &inputs(),
        Path::new("/ssd/export"),
        "192.168.40.10:7000",
    )
    .unwrap();
    let r = &p.resources;
    assert_eq!((r.readers, r.writers, r.max_streams), (7, 7, 5));
    assert_eq!(r.memory, 64 << 20);
    assert!(r.storage_cpus.is_empty() && r.net_cpus.is_empty());
    assert_eq!(r.buffer_node, None);

    // The command line beats the config: --numa 0 puts everything on node 0.
    let cli = ServeInputs {
        numa: Some(NumaMode::Node(0)),
        readers: Some(3),
        ..inputs()
    };
    let p = daemon_placement(
        t.clone(),
        false,
        &cfg,
        &cli,
        Path::new("/ssd/export"),
        "192.168.40.10:7000",
    )
    .unwrap();
    assert_eq!(p.resources.readers, 3);
    assert_eq!(p.resources.writers, 7);
    assert_eq!(p.resources.net_cpus, cpus_of(&t, 0));
    assert_eq!(p.resources.buffer_node, Some(0));
}

/// Seed 000 E5-4620: devices on node 1. A wildcard listen address takes
/// the first physical NIC of purpose data; marking it "storage" skips it.
#[test]
fn seed000_wildcard_listen_picks_a_data_nic() {
    let t = fixture("seed000-intel4s");
    let phys: Vec<String> = t
        .nics
        .iter()
        .filter(|n| !n.is_virtual && n.operstate.as_deref() != Some("down"))
        .map(|n| n.name.clone())
        .collect();
    assert!(!phys.is_empty());
    let p = daemon_placement(
        t.clone(),
        false,
        &DaemonConfig::default(),
        &inputs(),
        Path::new("/data/set"),
        "0.0.0.0:7000",
    )
    .unwrap();
    assert_eq!(p.nic.as_deref(), Some(phys[0].as_str()));
    let node = t.nic(&phys[0]).unwrap().numa_node;
    if let Some(n) = node {
        assert_eq!(p.resources.net_cpus, cpus_of(&t, n));
        assert_eq!(p.resources.buffer_node, Some(n));
    }
    let data = t.device_for_path(Path::new("/data/set")).unwrap();
    assert_eq!(data.numa_node, Some(1));
    assert_eq!(p.resources.storage_cpus, cpus_of(&t, 1));
    if phys.len() > 1 {
        let cfg = DaemonConfig::parse(
            &format!("[devices.{}]\npurpose = \"storage\"\n", phys[0]),
            Path::new("."),
        )
        .unwrap();
        let p = daemon_placement(
            t.clone(),
            false,
            &cfg,
            &inputs(),
            Path::new("/data/set"),
            "0.0.0.0:7000",
        )
        .unwrap();
        assert_eq!(p.nic.as_deref(), Some(phys[1].as_str()));
    }
}

/// Seed 001 AMD host, SSD and NICs on node 7: pools on node 7 for every
/// fixture-described path; a task plan exists and its counts stay within
/// the pools.
#[test]
fn seed001_task_plan_within_pools() {
    let t = fixture("seed001-amd8n");
    let nic7 = t
        .nics
        .iter()
        .find(|n| n.numa_node == Some(7) && !n.addresses.is_empty())
        .expect("a NIC with an address on node 7");
    let listen = format!("{}:7000", nic7.addresses[0].addr);
    let p = daemon_placement(
        t.clone(),
        false,
        &DaemonConfig::default(),
        &inputs(),
        Path::new("/ssd1"),
        &listen,
    )
    .unwrap();
    assert_eq!(p.resources.storage_cpus, cpus_of(&t, 7));
    assert_eq!(p.resources.net_cpus, cpus_of(&t, 7));
    let (plan, storage, nic, none) = p
        .task_plan(false, Path::new("/ssd1/big"), &listen, 4 << 20, 0)
        .unwrap();
    assert_eq!(none, 0);
    // The host three quarters busy with other work (its published load
    // less the daemon's own, docs/SCHEDULER.md "Site state"): fewer threads.
    let cpus: usize = t.nodes.iter().map(|n| n.cpus.len()).sum();
    let (busy, _, _, marked) = p
        .task_plan(
            false,
            Path::new("/ssd1/big"),
            &listen,
            4 << 20,
            cpus * 3 / 4,
        )
        .unwrap();
    assert_eq!(marked, cpus * 3 / 4);
    let threads =
        |p: &ramsys_sched::Plan| p.threads.iter().map(|g| g.count as usize).sum::<usize>();
    // (This host plans 2 threads idle, within what a quarter of its CPUs
    // give; the cut shows in ramsys-sched's a_busy_host_gives_fewer_threads.)
    assert!(threads(&busy) <= threads(&plan) && busy.count(ramsys_sched::Role::Reader, "sdb") >= 1);
    // Every CPU but one busy: still a plan, on at most that CPU's budget.
    let (all, _, _, marked) = p
        .task_plan(false, Path::new("/ssd1/big"), &listen, 4 << 20, cpus)
        .unwrap();
    assert_eq!(marked, cpus - 1);
    let used: std::collections::BTreeSet<usize> = all
        .threads
        .iter()
        .flat_map(|g| g.cpus.iter().copied())
        .collect();
    assert!(used.len() <= 1, "{used:?}");
    assert_eq!(storage, "sdb");
    assert_eq!(nic, nic7.name);
    let c = task_counts(&plan, false, &storage, &nic, None, &p.resources, 1);
    assert!(c.storage >= 1 && c.storage <= p.resources.readers);
    assert!(c.network >= 1 && c.network <= p.resources.max_streams);
    assert_eq!(
        c.storage,
        (plan.count(ramsys_sched::Role::Reader, "sdb") as usize).clamp(1, p.resources.readers)
    );
    // A configured count wins over the plan.
    let c = task_counts(&plan, false, &storage, &nic, Some(2), &p.resources, 1);
    assert_eq!(c.storage, 2);
}

/// Issue 6: the I/O model named in the config reaches the scheduler. On the
/// seed 004 host a model in which the NIC's own node sends badly (2 Gbps)
/// and node 0 well moves the senders off node 1.
#[test]
fn model_in_config_changes_the_plan() {
    let t = fixture("seed004-frontend");
    let dir = tempfile::tempdir().unwrap();
    let model = serde_json::json!({
        "version": ramsys_iomodel::model::MODEL_VERSION,
        "generator": "test",
        "host": {"nodes": [{"id": 0, "cpus": cpus_of(&t, 0)}, {"id": 1, "cpus": cpus_of(&t, 1)}],
                 "packages": [[0], [1]], "llc_bytes": 20971520, "io_nodes": [0, 1]},
        "numa_ops": "test",
        // [target k][node i]: device on node 1 written from node 0 at 40, from node 1 at 2.
        "write_matrix_gbps": [[40.0, 20.0], [40.0, 2.0]],
        "read_matrix_gbps": [[40.0, 20.0], [20.0, 40.0]],
        "entries": []
    });
    std::fs::write(dir.path().join("m.json"), model.to_string()).unwrap();
    std::fs::write(dir.path().join("ramsys.toml"), "model = \"m.json\"\n").unwrap();
    let with = DaemonConfig::load(&dir.path().join("ramsys.toml")).unwrap();
    let listen = "192.168.40.10:7000";
    let root = Path::new("/ssd/export");
    let plain = daemon_placement(
        t.clone(),
        false,
        &DaemonConfig::default(),
        &inputs(),
        root,
        listen,
    )
    .unwrap();
    let modelled = daemon_placement(t.clone(), false, &with, &inputs(), root, listen).unwrap();
    assert!(modelled.model.is_some());
    let senders = |p: &ramsys_engine::daemon::config::placement::DaemonPlacement| {
        let (plan, _, _, _) = p
            .task_plan(false, Path::new("/ssd/x"), listen, 4 << 20, 0)
            .unwrap();
        let cpus: Vec<usize> = plan
            .threads
            .iter()
            .filter(|g| g.role == ramsys_sched::Role::Sender)
            .flat_map(|g| g.cpus.clone())
            .collect();
        (plan, cpus)
    };
    let (a, a_cpus) = senders(&plain);
    let (b, b_cpus) = senders(&modelled);
    assert_ne!(a, b);
    let node1 = cpus_of(&t, 1);
    assert!(a_cpus.iter().all(|c| node1.contains(c)), "{a_cpus:?}");
    assert!(b_cpus.iter().any(|c| !node1.contains(c)), "{b_cpus:?}");

    // A model file that does not exist is an error naming it.
    let bad = DaemonConfig::parse("model = \"nope.json\"", dir.path()).unwrap();
    let e = daemon_placement(t, false, &bad, &inputs(), root, listen).unwrap_err();
    assert!(format!("{e:#}").contains("nope.json"), "{e:#}");
}

/// Issue 17: a disk that says it is rotational (this VM's virtio vda) gets
/// one reader (seed 000 6.1.2: one head) but SINK_WRITERS_MIN writers,
/// since a sink writes through the page cache.
#[test]
fn a_rotational_disk_gets_one_reader_and_the_sink_writer_floor() {
    let t = fixture("this-vm");
    let p = daemon_placement(
        t,
        false,
        &DaemonConfig::default(),
        &inputs(),
        Path::new("/var/tmp"),
        "127.0.0.1:7000",
    )
    .unwrap();
    assert_eq!(p.storage.as_deref(), Some("vda"));
    let r = &p.resources;
    assert_eq!(
        (r.readers, r.writers),
        (
            1,
            ramsys_engine::daemon::config::placement::SINK_WRITERS_MIN
        )
    );
}
