use super::*;
use std::sync::Mutex;

/// A link that records writes and shutdowns.
#[derive(Clone, Default)]
struct Fake {
    shut: Arc<AtomicBool>,
    out: Arc<Mutex<Vec<u8>>>,
}
impl std::io::Read for Fake {
    fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
        Ok(0)
    }
}
impl std::io::Write for Fake {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.out.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
impl Link for Fake {
    fn try_clone_link(&self) -> std::io::Result<Box<dyn Link>> {
        Ok(Box::new(self.clone()))
    }
    fn shutdown_both(&self) {
        self.shut.store(true, Ordering::Relaxed);
    }
    fn peer(&self) -> String {
        "fake".into()
    }
    fn local(&self) -> String {
        "fake".into()
    }
    fn set_read_timeout(&self, _: Option<Duration>) -> std::io::Result<()> {
        Ok(())
    }
}

fn streams(relinks: Relinks, n: usize) -> (Streams, Vec<Fake>) {
    let links: Vec<Fake> = (0..n).map(|_| Fake::default()).collect();
    let handles = links
        .iter()
        .map(|l| Box::new(l.clone()) as Box<dyn Link>)
        .collect();
    let st = Streams::new(
        relinks,
        handles,
        "peer:1".into(),
        Arc::new(Stats::default()),
        Arc::new(AtomicBool::new(false)),
    );
    (st, links)
}

fn joined(stream: u16, epoch: u16) -> (Joined, Fake) {
    let f = Fake::default();
    let j = Joined {
        stream,
        epoch,
        link: Box::new(f.clone()),
        accepted: false,
    };
    (j, f)
}

fn io_err() -> EngineError {
    EngineError::Io(std::io::ErrorKind::ConnectionReset.into())
}

#[test]
fn server_replaces_a_lost_stream_and_refuses_stale_ones() {
    let (_tx, rx) = unbounded();
    let (mut st, _links) = streams(Relinks::Accept(rx), 2);
    assert!(st.lost(0, 0, &io_err()).is_none());
    assert_eq!(st.state(0), State::Lost);
    // One link still live: progress is possible.
    assert!(st.check().is_ok());
    let (j, f) = joined(0, 3);
    let j = st.arrived(j).expect("starts at once");
    assert!(!f.out.lock().unwrap().is_empty(), "JoinOk sent");
    st.started(0, j.epoch, j.link);
    assert_eq!((st.state(0), st.epoch(0)), (State::Live, 3));
    // An older attempt arriving late is refused.
    let (j, _) = joined(0, 2);
    assert!(st.arrived(j).is_none());
    // Out of range.
    let (j, _) = joined(7, 1);
    assert!(st.arrived(j).is_none());
    assert!(st.ran(0, 3) && st.ran(1, 0) && !st.ran(0, 2));
}

#[test]
fn replacement_waits_for_the_old_thread() {
    let (_tx, rx) = unbounded();
    let (mut st, links) = streams(Relinks::Accept(rx), 1);
    let (j, _) = joined(0, 1);
    // The peer saw the link break first: the old one is closed and the
    // new one kept until the old thread reports.
    assert!(st.arrived(j).is_none());
    assert!(links[0].shut.load(Ordering::Relaxed));
    let j = st.lost(0, 0, &io_err()).expect("waiting replacement");
    assert_eq!(j.epoch, 1);
    // Every link is down, but the replacement is on its way through
    // the event queue: no failure until it is started.
    st.requeue_arrival(j).unwrap();
    assert!(st.check().is_ok(), "failed with the replacement queued");
    let Ok(LinkEvent::Up(j)) = st.events.try_recv() else {
        panic!("replacement not queued");
    };
    let j = st.arrived(j).expect("starts now");
    st.started(0, j.epoch, j.link);
    assert_eq!((st.state(0), st.epoch(0)), (State::Live, 1));
    assert!(st.check().is_ok());
}

#[test]
fn a_queued_replacement_keeps_a_dialling_client_alive() {
    let (mut st, _links) = streams(Relinks::Dial(refusing_dialer()), 1);
    let (j, _) = joined(0, 1);
    st.arrived(j);
    let j = st.lost(0, 0, &io_err()).expect("waiting replacement");
    st.requeue_arrival(j).unwrap();
    assert!(st.check().is_ok(), "failed with the replacement queued");
}

/// A dialler whose every attempt is refused (3 tries).
fn refusing_dialer() -> Arc<Dialer> {
    struct Refuse;
    impl Transport for Refuse {
        fn connect(&self, _: &str, _: Duration) -> std::io::Result<Box<dyn Link>> {
            Err(std::io::ErrorKind::ConnectionRefused.into())
        }
        fn name(&self) -> &'static str {
            "refuse"
        }
    }
    Arc::new(Dialer {
        transport: Arc::new(Refuse),
        addr: "host:1".into(),
        session: 1,
        key: [0; 32],
        timeout: Duration::from_secs(1),
        backoff: Backoff {
            tries: 3,
            first: Duration::from_millis(1),
            budget: Duration::from_secs(5),
        },
    })
}

#[test]
fn all_links_lost_and_dials_failing_is_one_clear_error() {
    let d = refusing_dialer();
    let (mut st, _) = streams(Relinks::Dial(d), 2);
    st.lost(0, 0, &io_err());
    st.lost(1, 0, &io_err());
    // Dialling: still hope.
    assert!(st.check().is_ok());
    let mut ended = 0;
    while ended < 2 {
        match st.events.recv_timeout(Duration::from_secs(10)).unwrap() {
            LinkEvent::GaveUp {
                stream,
                attempts,
                reason,
            } => {
                assert_eq!(attempts, 3);
                assert!(st.gave_up(stream, attempts, reason));
                ended += 1;
            }
            LinkEvent::Up(_) => panic!("refused transport connected"),
        }
    }
    let e = st.check().unwrap_err().to_string();
    assert!(
        e.starts_with("all data links lost to peer:1: ")
            && e.ends_with("; 6 reconnect attempts failed"),
        "{e}"
    );
    assert_eq!(st.stats.link_retries.load(Ordering::Relaxed), 6);
}

#[test]
fn an_added_stream_joins_with_epoch_one_and_is_not_a_replacement() {
    let (_tx, rx) = unbounded();
    let (mut st, _) = streams(Relinks::Accept(rx), 2);
    assert_eq!(st.add(), 2);
    assert_eq!((st.count(), st.state(2)), (3, State::Joining));
    // Not a lost link: nothing waits for it, progress is possible.
    assert_eq!(st.waiting(), 0);
    assert!(st.check().is_ok());
    let (j, f) = joined(2, 1);
    let j = st.arrived(j).expect("starts at once");
    assert!(!f.out.lock().unwrap().is_empty(), "JoinOk sent");
    assert!(st.started(2, j.epoch, j.link), "an added stream");
    assert_eq!(st.stats.links_replaced.load(Ordering::Relaxed), 0);
    // One that never came ends quietly; settling ends a waiting one.
    let n = st.add();
    assert!(!st.gave_up(n, 5, "refused".into()));
    assert_eq!(st.state(n as usize), State::Done);
    let n = st.add();
    st.unwanted(n);
    assert_eq!(st.state(n as usize), State::Done);
    let (j, _) = joined(n, 1);
    assert!(st.arrived(j).is_none(), "a refused stream takes no link");
    let n = st.add();
    assert_eq!(st.settle(), 0);
    assert_eq!(st.state(n as usize), State::Done);
}

#[test]
fn streams_that_ended_normally_need_nothing() {
    let (_tx, rx) = unbounded();
    let (mut st, _) = streams(Relinks::Accept(rx), 2);
    st.ended(0);
    st.lost(1, 0, &io_err());
    assert!(st.check().is_ok());
    assert_eq!(st.settle(), 1);
    assert_eq!(st.waiting(), 0);
}
