use super::*;
use crate::data::resources::ResourceConfig;

fn res(threads: usize) -> EngineResources {
    EngineResources::new(&ResourceConfig {
        memory: 64 * 4096,
        buffer_size: 4096,
        readers: threads,
        writers: threads,
        max_streams: threads,
        ..Default::default()
    })
    .unwrap()
}

fn wait_for(st: &DaemonState, id: u64, s: TaskState) {
    let t0 = Instant::now();
    while st.lock().tasks.get(&id).map(|t| t.state) != Some(s) {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "task {id} never became {s:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn fair_share_then_suspend_then_wake() {
    let r = Arc::new(res(4));
    let st = DaemonState::start(Duration::from_secs(10));
    st.open_session(1, "u", "p", "sink", vec![]);
    let a = st.new_task(
        1,
        Dir::In,
        "0:1",
        "memory",
        "lo",
        Arc::new(Stats::default()),
    );
    let b = st.new_task(
        1,
        Dir::In,
        "0:1",
        "memory",
        "lo",
        Arc::new(Stats::default()),
    );
    // Two contenders: the first gets half the pool, not all of it.
    let ga = a.reserve_sink(&r, 8, 8, 4).unwrap();
    assert_eq!(ga.receivers.len(), 2);
    assert_eq!(ga.writers.len(), 2);
    a.transferring(2);
    let gb = b.reserve_sink(&r, 8, 8, 4).unwrap();
    assert_eq!(gb.receivers.len(), 2);
    b.transferring(2);
    assert_eq!(r.receivers.idle(), 0);
    // A third task finds the pools empty: suspended, then woken by
    // the exit of another and served.
    let c = Arc::new(st.new_task(
        1,
        Dir::In,
        "0:1",
        "memory",
        "lo",
        Arc::new(Stats::default()),
    ));
    let c2 = c.clone();
    let r2 = r.clone();
    let h = std::thread::spawn(move || c2.reserve_sink(&r2, 8, 8, 4).map(|g| g.receivers.len()));
    wait_for(&st, c.id(), TaskState::Suspended);
    drop(ga);
    drop(a);
    assert_eq!(h.join().unwrap().unwrap(), 2);
    assert!(st.counters.retries.load(Relaxed) >= 1);
    assert_eq!(st.counters.suspensions.load(Relaxed), 1);
}

#[test]
fn idle_device_budget_is_stolen_and_counted() {
    let r = res(4);
    let st = DaemonState::start(Duration::from_secs(10));
    st.add_device("8:0", "ssd");
    st.add_device("8:16", "ssd");
    // Device 8:16 starves (no tasks): a task of 8:0 may use its budget.
    let t = st.new_task(1, Dir::Out, "8:0", "ssd", "lo", Arc::new(Stats::default()));
    let (_s, rd) = t.reserve_source(&r, 1, 4).unwrap();
    assert_eq!(rd.len(), 4);
    assert_eq!(st.counters.steals.load(Relaxed), 1);
    drop(t);
    assert_eq!(st.lock().lanes["8:0"].held[Dir::Out as usize], 0);
}

#[test]
fn site_view_sets_the_share_of_a_shared_device() {
    use crate::daemon::site::redirect::member;
    let r = res(4);
    let st = DaemonState::start(Duration::from_secs(10));
    let t = st.new_task(1, Dir::In, "0:1", "ssd", "lo", Arc::new(Stats::default()));
    let g = t.reserve_sink(&r, 1, 4, 2).unwrap();
    t.transferring(1);
    assert_eq!(g.writers.len(), 4);
    let gate = t.storage_gate().unwrap();
    assert_eq!(gate.limit(), None, "no site view: all writers");
    assert_eq!(
        st.storage_use(),
        vec![StorageUse {
            id: st.lock().lanes["0:1"].storage.id,
            tasks: 1,
            threads: 4
        }]
    );
    let id = st.lock().lanes["0:1"].storage.id;
    let peer = |tasks: u16, age: u64| {
        let mut m = member("p:1", 0.0, 1, 1, age);
        m.storage = vec![StorageUse {
            id,
            tasks,
            threads: 4 * tasks,
        }];
        m
    };
    let me = member("me:1", 0.0, 1, 1, 0);
    // A peer writing the same device: half the budget each.
    st.apply_site("me:1", &[me.clone(), peer(1, 10)]);
    assert_eq!(gate.limit(), Some(2));
    let q = |st: &DaemonState| st.lock().lanes["0:1"].site;
    assert_eq!(
        q(&st),
        Some(DeviceShare {
            members: 2,
            tasks: 2,
            threads: 8,
            budget: 4,
            share: 2
        })
    );
    // Three tasks there against our one: a quarter (one writer).
    st.apply_site("me:1", &[me.clone(), peer(3, 10)]);
    assert_eq!(gate.limit(), Some(1));
    // Another device's users do not count, nor a stale member.
    let mut other = peer(3, 10);
    other.storage[0].id ^= 1;
    st.apply_site("me:1", &[me.clone(), other]);
    assert_eq!((gate.limit(), q(&st)), (None, None));
    st.apply_site("me:1", &[me.clone(), peer(3, 5_000)]);
    assert_eq!(gate.limit(), None);
    // The view applies to a task granted later too, at its grant.
    st.apply_site("me:1", &[me, peer(1, 10)]);
    let t2 = st.new_task(2, Dir::In, "0:1", "ssd", "lo", Arc::new(Stats::default()));
    drop(g);
    drop(t);
    let g2 = t2.reserve_sink(&r, 1, 4, 2).unwrap();
    assert_eq!(g2.writers.len(), 4);
    t2.transferring(1);
    assert_eq!(t2.storage_gate().unwrap().limit(), Some(2));
    // A finished task's gate is open (its threads are gone).
    assert!(st.lock().finished.iter().all(|t| t.gate.limit().is_none()));
    // A source on the same device: our two tasks against the peer's
    // one take 3 of the 4 (Sainte-Lague), split 2 (the older) and 1;
    // the readers are capped at the grant (no gate), the writers gated.
    let t3 = st.new_task(3, Dir::Out, "0:1", "ssd", "lo", Arc::new(Stats::default()));
    let (_s, rd) = t3.reserve_source(&r, 1, 4).unwrap();
    assert_eq!(rd.len(), 1);
    assert_eq!(t3.storage_gate().unwrap().limit(), None);
    assert_eq!(t2.storage_gate().unwrap().limit(), Some(2));
    assert_eq!(st.lock().lanes["0:1"].site.map(|d| d.share), Some(3));
    // It claims the 4 it would hold alone, not the 1 it got.
    assert_eq!(st.storage_use()[0].threads, 8);
}

#[test]
fn queue_is_fifo_per_device() {
    let r = res(2);
    let st = DaemonState::start(Duration::from_secs(10));
    let a = st.new_task(
        1,
        Dir::Out,
        "0:1",
        "memory",
        "lo",
        Arc::new(Stats::default()),
    );
    let b = st.new_task(
        2,
        Dir::Out,
        "0:1",
        "memory",
        "lo",
        Arc::new(Stats::default()),
    );
    wait_for(&st, a.id(), TaskState::Active);
    // The head is being served; the next one waits its turn.
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(b.state(), TaskState::Waiting);
    let _g = a.reserve_source(&r, 1, 1).unwrap();
    a.transferring(1);
    wait_for(&st, b.id(), TaskState::Active);
}
