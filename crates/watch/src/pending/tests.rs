//! The pending set against a model: a source tree changed at random, the
//! changes a kernel would report fed in, batches taken, delivered late,
//! failed at random (before or after their operations), and applied to a
//! model destination the way the sink applies them. Once everything is
//! closed and delivered, DST must equal SRC: no change lost, whatever the
//! interleaving.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;
use crate::change::join;

#[derive(Debug, Clone, PartialEq)]
enum Node {
    Dir,
    File(u32),
}

type Tree = BTreeMap<Vec<u8>, Node>;

fn subtree(t: &Tree, p: &[u8]) -> Vec<Vec<u8>> {
    t.keys().filter(|k| under(k, p)).cloned().collect()
}

fn parent_ok(t: &Tree, p: &[u8]) -> bool {
    let par = parent(p);
    par.is_empty() || t.get(par) == Some(&Node::Dir)
}

/// Copy `p` (its whole subtree if `tree`) and its parents from SRC; false
/// where DST holds a directory in a file's way (the sink fails that file).
fn copy_in(src: &Tree, dst: &mut Tree, p: &[u8], tree: bool, hold: &[Vec<u8>]) -> bool {
    let Some(n) = src.get(p) else { return true };
    let mut par = parent(p);
    while !par.is_empty() {
        dst.insert(par.to_vec(), Node::Dir);
        par = parent(par);
    }
    match n {
        Node::File(_) if dst.get(p) == Some(&Node::Dir) => false,
        Node::File(_) => {
            dst.insert(p.to_vec(), n.clone());
            true
        }
        Node::Dir => {
            dst.insert(p.to_vec(), Node::Dir);
            if tree {
                for k in subtree(src, p) {
                    if hold.contains(&k) {
                        continue;
                    }
                    if !(src[&k] != Node::Dir && dst.get(&k) == Some(&Node::Dir)) {
                        dst.insert(k.clone(), src[&k].clone());
                    }
                }
            }
            true
        }
    }
}

/// What the rules exclude stays at DST under --delete, and so do the
/// directories holding it (rsync's rule): `held` paths `old` had go back
/// into `dst` with their parents.
fn keep_held(dst: &mut Tree, old: &Tree, held: &[Vec<u8>]) {
    for k in held {
        let Some(n) = old.get(k) else { continue };
        let mut par = parent(k);
        let mut blocked = false;
        while !par.is_empty() {
            blocked |= dst.get(par).is_some_and(|n| *n != Node::Dir);
            par = parent(par);
        }
        if blocked {
            continue;
        }
        let mut par = parent(k);
        while !par.is_empty() {
            dst.insert(par.to_vec(), Node::Dir);
            par = parent(par);
        }
        dst.insert(k.clone(), n.clone());
    }
}

struct World {
    src: Tree,
    dst: Tree,
    open: Vec<Vec<u8>>,
    p: Pending,
    now: Instant,
    version: u32,
    inflight: Option<Batch>,
    mirror: bool,
    /// Changes the kernel reported that the watcher has not read yet:
    /// with `late`, an event reaches the pending set only at
    /// [`Step::Events`], after batches that read the tree it changed.
    queue: VecDeque<Change>,
    late: bool,
}

#[derive(Debug, Clone)]
enum Step {
    Mkdir(usize),
    Create(usize),
    Write(usize),
    Close(usize),
    Rename(usize, usize),
    /// `mv a b; mkdir a` (or a new file at `a`): something new at the old
    /// name right after a rename.
    Replace(usize, usize),
    Delete(usize),
    Take,
    /// 0 delivered, 1 failed before its ops, 2 ops arrived, data failed.
    Deliver(u8),
    Tick,
    Overflow,
    /// The watcher reads the events queued so far.
    Events,
}

const NAMES: [&[u8]; 8] = [b"a", b"b", b"a/x", b"a/y", b"b/x", b"a/x/z", b"c", b"b/x/z"];

fn step() -> impl Strategy<Value = Step> {
    let i = 0..NAMES.len();
    prop_oneof![
        i.clone().prop_map(Step::Mkdir),
        i.clone().prop_map(Step::Create),
        i.clone().prop_map(Step::Write),
        i.clone().prop_map(Step::Close),
        (i.clone(), i.clone()).prop_map(|(a, b)| Step::Rename(a, b)),
        i.prop_map(Step::Delete),
        Just(Step::Take),
        (0u8..3).prop_map(Step::Deliver),
        Just(Step::Tick),
        Just(Step::Overflow),
    ]
}

/// With events read late: the watcher lags the tree.
fn late_step() -> impl Strategy<Value = Step> {
    let i = 0..NAMES.len();
    prop_oneof![
        3 => step(),
        1 => Just(Step::Events),
        1 => Just(Step::Take),
        1 => Just(Step::Deliver(0)),
        1 => (i.clone(), i).prop_map(|(a, b)| Step::Replace(a, b)),
    ]
}

impl World {
    fn new(mirror: bool) -> World {
        let cfg = PendingConfig {
            quiet: Duration::from_millis(100),
            cap: 1000,
            mirror,
        };
        World {
            src: Tree::new(),
            dst: Tree::new(),
            open: Vec::new(),
            p: Pending::new(cfg),
            now: Instant::now(),
            version: 0,
            inflight: None,
            mirror,
            queue: VecDeque::new(),
            late: false,
        }
    }

    fn ev(&mut self, c: Change) {
        if self.late {
            self.queue.push_back(c);
        } else {
            self.p.apply(c, self.now, 0);
        }
    }

    fn events(&mut self) {
        while let Some(c) = self.queue.pop_front() {
            self.p.apply(c, self.now, 0);
        }
        self.p.caught_up(self.p.ended());
    }

    /// The batch ended; the job then tells the pending set whether the
    /// watcher has caught up (an event still queued: not yet).
    fn finish(&mut self, ok: bool, failed: &[Vec<u8>]) {
        self.p.finish(ok, failed, self.now);
        if self.queue.is_empty() {
            self.p.caught_up(self.p.ended());
        }
    }

    fn run(&mut self, s: &Step) {
        let name = |i: &usize| NAMES[*i].to_vec();
        match s {
            Step::Mkdir(i) => {
                let p = name(i);
                if !self.src.contains_key(&p) && parent_ok(&self.src, &p) {
                    self.src.insert(p.clone(), Node::Dir);
                    self.ev(Change::Created {
                        path: p,
                        dir: true,
                        settled: true,
                    });
                }
            }
            Step::Create(i) => {
                let p = name(i);
                if !self.src.contains_key(&p) && parent_ok(&self.src, &p) {
                    self.version += 1;
                    self.src.insert(p.clone(), Node::File(self.version));
                    self.open.push(p.clone());
                    self.ev(Change::Created {
                        path: p,
                        dir: false,
                        settled: false,
                    });
                }
            }
            Step::Write(i) => {
                let p = name(i);
                if let Some(Node::File(_)) = self.src.get(&p) {
                    self.version += 1;
                    self.src.insert(p.clone(), Node::File(self.version));
                    if !self.open.contains(&p) {
                        self.open.push(p.clone());
                    }
                    self.ev(Change::Modified(p));
                }
            }
            Step::Close(i) => {
                let p = name(i);
                if let Some(k) = self.open.iter().position(|o| *o == p) {
                    self.open.remove(k);
                    self.ev(Change::Closed(p));
                }
            }
            Step::Rename(a, b) => self.rename(name(a), name(b)),
            Step::Replace(a, b) => {
                let old = self.src.get(&name(a)).cloned();
                self.rename(name(a), name(b));
                if let (Some(n), false) = (old, self.src.contains_key(&name(a))) {
                    let dir = n == Node::Dir;
                    let again = if dir {
                        Step::Mkdir(*a)
                    } else {
                        Step::Create(*a)
                    };
                    self.run(&again);
                }
            }
            Step::Delete(i) => self.delete(name(i)),
            Step::Take => {
                if self.inflight.is_none() {
                    self.inflight = self.p.take(self.now, 3).0;
                }
            }
            Step::Deliver(how) => self.deliver(*how),
            Step::Tick => self.now += Duration::from_millis(150),
            Step::Overflow => self.ev(Change::Overflow),
            Step::Events => self.events(),
        }
    }

    fn rename(&mut self, a: Vec<u8>, b: Vec<u8>) {
        if !self.src.contains_key(&a)
            || self.src.contains_key(&b)
            || !parent_ok(&self.src, &b)
            || under(&b, &a)
        {
            return;
        }
        let dir = self.src[&a] == Node::Dir;
        for k in subtree(&self.src, &a) {
            let n = self.src.remove(&k).unwrap();
            self.src.insert(moved(&k, &a, &b), n);
        }
        for o in &mut self.open {
            if under(o, &a) {
                *o = moved(o, &a, &b);
            }
        }
        self.ev(Change::Renamed {
            from: a,
            to: b,
            dir,
        });
    }

    fn delete(&mut self, p: Vec<u8>) {
        if !self.src.contains_key(&p) {
            return;
        }
        // rm -r: children first, as the kernel reports them.
        for k in subtree(&self.src, &p).into_iter().rev() {
            let dir = self.src.remove(&k).unwrap() == Node::Dir;
            self.open.retain(|o| *o != k);
            self.ev(Change::Deleted { path: k, dir });
        }
    }

    /// The sink's side of a batch: operations in order, then the data as
    /// the source reads it now (a listed path gone is skipped).
    fn deliver(&mut self, how: u8) {
        let Some(b) = self.inflight.take() else {
            return;
        };
        if how == 1 {
            self.finish(false, &[]);
            return;
        }
        let mut missing = Vec::new();
        for (_, op) in &b.ops {
            match op {
                Op::Rename { from, to, dir } => {
                    // The sink renames only an entry of the kind the
                    // source renamed (a later batch may have put another
                    // there).
                    if self
                        .dst
                        .get(from)
                        .is_some_and(|n| (*n == Node::Dir) == *dir)
                    {
                        // The sink makes `to`'s missing parents first
                        // (watchops::make_parents).
                        let mut par = parent(to);
                        while !par.is_empty() && !self.dst.contains_key(par) {
                            self.dst.insert(par.to_vec(), Node::Dir);
                            par = parent(par);
                        }
                        for k in subtree(&self.dst, to) {
                            self.dst.remove(&k);
                        }
                        for k in subtree(&self.dst, from) {
                            let n = self.dst.remove(&k).unwrap();
                            self.dst.insert(moved(&k, from, to), n);
                        }
                    } else {
                        missing.push((to.clone(), *dir));
                    }
                }
                Op::Delete { path, dir } => {
                    if self.dst.get(path).is_none_or(|n| (*n == Node::Dir) != *dir) {
                        continue;
                    }
                    for k in subtree(&self.dst, path) {
                        self.dst.remove(&k);
                    }
                }
            }
        }
        self.p.ops_applied(&missing, self.now);
        if how == 2 {
            self.finish(false, &[]);
            return;
        }
        let mut failed = Vec::new();
        // Files still being written (b.hold) are left out: not sent, and
        // (excluded) not deleted.
        if b.full {
            let mut dst: Tree = self
                .src
                .iter()
                .filter(|(k, _)| !b.hold.contains(k))
                .map(|(k, n)| (k.clone(), n.clone()))
                .collect();
            keep_held(&mut dst, &self.dst, &b.hold);
            if !self.mirror {
                for (k, n) in &self.dst {
                    dst.entry(k.clone()).or_insert_with(|| n.clone());
                }
            }
            self.dst = dst;
        }
        // A listed path that is a directory now is sent with its subtree.
        // A batch holding a mirror is sent with --delete (replicate::job):
        // below every listed path DST then ends as SRC is, extra entries
        // removed and a directory in a file's way made way for.
        let exact = b.files.iter().any(|(_, k)| *k == Kind::Mirror);
        for (p, _) in &b.files {
            if exact && self.src.contains_key(p) {
                let old = self.dst.clone();
                for k in subtree(&old, p) {
                    self.dst.remove(&k);
                }
                keep_held(&mut self.dst, &old, &b.hold);
            }
            if !copy_in(&self.src, &mut self.dst, p, true, &b.hold) {
                failed.push(p.clone());
            }
        }
        self.finish(true, &failed);
    }

    /// Close everything, wait out the quiet time, deliver until nothing is
    /// left.
    fn settle(&mut self) {
        if self.inflight.is_some() {
            self.deliver(0);
        }
        self.events();
        self.late = false;
        for o in std::mem::take(&mut self.open) {
            self.ev(Change::Closed(o));
        }
        self.now += Duration::from_secs(1);
        for _ in 0..100 {
            self.inflight = self.p.take(self.now, 3).0;
            if self.inflight.is_none() {
                return;
            }
            self.deliver(0);
        }
        panic!("batches never ran out");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    /// Mirror mode (`--delete`): DST ends up equal to SRC.
    #[test]
    fn mirror_converges(steps in proptest::collection::vec(step(), 0..60)) {
        let mut w = World::new(true);
        for s in &steps {
            w.run(s);
        }
        w.settle();
        prop_assert_eq!(&w.dst, &w.src, "steps {:?}", steps);
        prop_assert_eq!(w.p.depth(), 0);
    }

    /// Mirror mode with the watcher behind: events reach the pending set
    /// after batches that read the tree they changed.
    #[test]
    fn mirror_converges_with_late_events(steps in proptest::collection::vec(late_step(), 0..60)) {
        let mut w = World::new(true);
        w.late = true;
        for s in &steps {
            w.run(s);
        }
        w.settle();
        prop_assert_eq!(&w.dst, &w.src, "steps {:?}", steps);
        prop_assert_eq!(w.p.depth(), 0);
    }

    /// Without --delete DST holds everything SRC holds, as it is now.
    #[test]
    fn copy_mode_keeps_everything(steps in proptest::collection::vec(step(), 0..60)) {
        let mut w = World::new(false);
        for s in &steps {
            w.run(s);
        }
        w.settle();
        // Where DST holds an entry of another kind in the way (a directory
        // where SRC now has a file), the sink cannot replace it without
        // --delete, as rsync cannot: everything else is there.
        let kind = |n: &Node| *n == Node::Dir;
        let blocked = |k: &Vec<u8>| {
            let mut p: &[u8] = k;
            loop {
                if let (Some(s), Some(d)) = (w.src.get(p), w.dst.get(p)) {
                    if kind(s) != kind(d) {
                        return true;
                    }
                }
                if p.is_empty() {
                    return false;
                }
                p = parent(p);
            }
        };
        for (k, n) in &w.src {
            if !blocked(k) {
                prop_assert_eq!(w.dst.get(k), Some(n), "{:?} steps {:?}", String::from_utf8_lossy(k), steps);
            }
        }
    }
}

#[test]
fn a_file_whose_directory_is_renamed_before_its_batch_reads_it_is_sent() {
    // mkdir a, replicated; a/x written and closed; its batch is cut; mv a
    // c on disk; the batch reads a/x, finds it gone, ends; only then does
    // the rename's event arrive. DST's a goes to c by the rename op: x must
    // follow under its new name (issue 38: lost until the next full scan).
    let mut w = World::new(true);
    w.run(&Step::Mkdir(0));
    w.settle();
    assert_eq!(w.dst, w.src);
    w.late = true;
    for s in [Step::Create(2), Step::Close(2), Step::Events, Step::Take] {
        w.run(&s);
    }
    let b = w.inflight.as_ref().unwrap();
    assert_eq!(b.files, vec![(b"a/x".to_vec(), Kind::File)]);
    for s in [Step::Rename(0, 6), Step::Deliver(0)] {
        w.run(&s);
    }
    assert!(!w.dst.contains_key(b"a/x".as_slice()));
    w.run(&Step::Events);
    w.settle();
    assert_eq!(w.dst, w.src);
    assert!(w.dst.contains_key(b"c/x".as_slice()));
    assert_eq!(w.p.depth(), 0);
}

/// `mv a c; mkdir a` and a file written into the new `a`, all on disk
/// before a batch cut earlier reads `a` (or below it, or everything), with
/// the rename's event read only after that batch ended (issue 38,
/// docs/WATCH.md "Renames behind a batch"): the batch puts the new `a`'s
/// entries at DST's `a`, and the rename's event must not carry them onto
/// `c`. `before` runs with events at once (settled), `cut` with events
/// late and must leave a batch in flight.
fn replaced_behind_a_batch(before: &[Step], cut: &[Step], made: Step) {
    let mut w = World::new(true);
    for s in before {
        w.run(s);
    }
    w.settle();
    assert_eq!(w.dst, w.src);
    w.late = true;
    for s in cut {
        w.run(s);
    }
    assert!(w.inflight.is_some(), "{cut:?}: no batch in flight");
    for s in [
        Step::Rename(0, 6),
        Step::Mkdir(0),
        made.clone(),
        Step::Deliver(0),
    ] {
        w.run(&s);
    }
    // The batch read the new `a`'s file.
    let Step::Create(i) = made else {
        unreachable!()
    };
    let new = NAMES[i];
    assert!(w.src.contains_key(new));
    assert_eq!(w.dst.get(new), w.src.get(new), "{cut:?}");
    w.run(&Step::Events);
    w.settle();
    assert_eq!(w.dst, w.src, "{cut:?}");
    assert_eq!(w.p.depth(), 0);
}

#[test]
fn a_file_read_at_a_name_renamed_and_made_again_is_not_carried_to_the_new_name() {
    // The batch lists a/x (written again), and reads the new a/x.
    let before = [Step::Mkdir(0), Step::Create(2), Step::Create(3)];
    let cut = [Step::Write(2), Step::Close(2), Step::Events, Step::Take];
    replaced_behind_a_batch(&before, &cut, Step::Create(2));
}

#[test]
fn a_tree_read_at_a_name_renamed_and_made_again_is_not_carried_to_the_new_name() {
    // The batch lists the tree a (new) and reads the new a: its a/y would
    // stay at DST's c.
    let cut = [
        Step::Mkdir(0),
        Step::Create(2),
        Step::Close(2),
        Step::Events,
        Step::Take,
    ];
    replaced_behind_a_batch(&[], &cut, Step::Create(3));
}

#[test]
fn a_full_scan_that_read_a_name_renamed_and_made_again_is_not_carried_to_the_new_name() {
    let before = [Step::Mkdir(0), Step::Create(2), Step::Create(3)];
    let cut = [Step::Overflow, Step::Events, Step::Take];
    replaced_behind_a_batch(&before, &cut, Step::Create(2));
}

#[test]
fn a_file_read_where_a_directory_now_is_comes_back_as_a_mirror() {
    // b/x listed as a file; mv b a; mkdir -p b/x before the batch reads
    // it: the batch puts a directory at DST's b/x, which the rename's
    // late event carries to a/x, where SRC has the file.
    let mut w = World::new(true);
    w.late = true;
    for s in [Step::Mkdir(1), Step::Create(4), Step::Events, Step::Take] {
        w.run(&s);
    }
    w.run(&Step::Deliver(0));
    for s in [
        Step::Rename(1, 0),
        Step::Mkdir(1),
        Step::Mkdir(4),
        Step::Tick,
        Step::Take,
    ] {
        w.run(&s);
    }
    let b = w.inflight.as_ref().unwrap();
    assert_eq!(b.files, vec![(b"b/x".to_vec(), Kind::File)]);
    w.run(&Step::Deliver(0));
    assert_eq!(w.dst.get(b"b/x".as_slice()), Some(&Node::Dir));
    w.settle();
    assert_eq!(w.dst, w.src);
    assert_eq!(w.p.depth(), 0);
}

/// The late-events property test's `Step::Replace` found it (docs/WATCH.md
/// "Deletes behind a batch"): b/x waits as a file; rm b/x; mv b c; mkdir
/// b; mv c b/x; mkdir c. The next batch lists b/x and puts the directory it
/// finds there at DST's b/x; then the late events come: the delete of the
/// file b/x must not leave that directory for the rename b -> c to carry
/// onto c/x, where SRC has nothing.
#[test]
fn a_name_deleted_behind_a_batch_that_read_it_is_not_carried_by_a_rename() {
    let mut w = World::new(true);
    w.late = true;
    let steps = [
        Step::Create(6),
        Step::Mkdir(1),
        Step::Rename(6, 4),
        Step::Events,
        Step::Take,
        Step::Deliver(0),
        Step::Delete(4),
        Step::Replace(1, 6),
        Step::Replace(6, 4),
        Step::Take,
    ];
    for s in &steps {
        w.run(s);
    }
    let b = w.inflight.as_ref().unwrap();
    assert_eq!(b.files, vec![(b"b/x".to_vec(), Kind::File)]);
    w.run(&Step::Deliver(0));
    assert_eq!(w.dst.get(b"b/x".as_slice()), Some(&Node::Dir));
    w.settle();
    assert_eq!(w.dst, w.src);
    assert_eq!(w.p.depth(), 0);
}

/// The same with the events at once, while the batch that lists b/x is in
/// flight: rm b/x; mv b c; mkdir -p b/x, then the batch reads b/x.
#[test]
fn a_name_deleted_while_its_batch_is_in_flight_is_not_carried_by_a_rename() {
    let mut w = World::new(true);
    w.run(&Step::Mkdir(1));
    w.settle();
    for s in [Step::Create(4), Step::Close(4), Step::Take] {
        w.run(&s);
    }
    let b = w.inflight.as_ref().unwrap();
    assert_eq!(b.files, vec![(b"b/x".to_vec(), Kind::File)]);
    for s in [
        Step::Delete(4),
        Step::Rename(1, 6),
        Step::Mkdir(1),
        Step::Mkdir(4),
        Step::Deliver(0),
    ] {
        w.run(&s);
    }
    assert_eq!(w.dst.get(b"b/x".as_slice()), Some(&Node::Dir));
    w.settle();
    assert_eq!(w.dst, w.src);
    assert_eq!(w.p.depth(), 0);
}

/// The tree b goes out; mv b a; mkdir -p b/x; a/x made and still being
/// written, all before the batch reads b (docs/WATCH.md "Files held out of
/// a mirror"). The batch puts the directory b/x at DST, the rename's late
/// event carries it onto a/x, and the mirror of a that follows holds a/x
/// out, leaving that directory at DST's a/x. Returns that world.
fn held_out_of_a_mirror() -> World {
    let mut w = World::new(true);
    w.late = true;
    for s in [
        Step::Mkdir(1),
        Step::Events,
        Step::Take,
        Step::Rename(1, 0),
        Step::Mkdir(1),
        Step::Mkdir(4),
        Step::Create(2),
        Step::Deliver(0),
        Step::Events,
        Step::Take,
    ] {
        w.run(&s);
    }
    let b = w.inflight.as_ref().unwrap();
    assert!(b.files.contains(&(b"a".to_vec(), Kind::Mirror)), "{b:?}");
    assert_eq!(b.hold, vec![b"a/x".to_vec()]);
    w.run(&Step::Deliver(0));
    assert_eq!(w.dst.get(b"a/x".as_slice()), Some(&Node::Dir));
    w
}

#[test]
fn a_file_held_out_of_a_mirror_replaces_the_directory_at_its_name() {
    let mut w = held_out_of_a_mirror();
    w.settle();
    assert_eq!(w.dst, w.src);
    assert_eq!(w.p.depth(), 0);
}

#[test]
fn a_file_held_out_of_a_mirror_renamed_leaves_nothing_at_its_old_name() {
    let mut w = held_out_of_a_mirror();
    for s in [Step::Rename(2, 6), Step::Events] {
        w.run(&s);
    }
    w.settle();
    assert_eq!(w.dst, w.src);
    assert_eq!(w.p.depth(), 0);
}

#[test]
fn a_file_held_out_of_a_mirror_deleted_leaves_nothing_at_its_name() {
    let mut w = held_out_of_a_mirror();
    for s in [Step::Delete(2), Step::Events] {
        w.run(&s);
    }
    w.settle();
    assert_eq!(w.dst, w.src);
    assert_eq!(w.p.depth(), 0);
}

#[test]
fn a_rename_after_the_watcher_caught_up_stays_a_rename() {
    // The batch that read a/x ended with nothing queued: the rename that
    // follows happened after its reads and moves 0 bytes.
    let mut w = World::new(true);
    for s in [Step::Mkdir(0), Step::Create(2), Step::Close(2), Step::Take] {
        w.run(&s);
    }
    w.run(&Step::Deliver(0));
    w.run(&Step::Rename(0, 6));
    let b = w.p.take(w.now, 10).0.unwrap();
    assert_eq!(
        b.ops,
        vec![(
            1,
            Op::Rename {
                from: b"a".to_vec(),
                to: b"c".to_vec(),
                dir: true
            }
        )]
    );
    assert!(b.files.is_empty(), "{:?}", b.files);
}

#[test]
fn a_file_waits_for_its_close_or_quiet_time() {
    let mut p = Pending::new(PendingConfig {
        quiet: Duration::from_secs(2),
        ..Default::default()
    });
    let t = Instant::now();
    p.apply(
        Change::Created {
            path: b"f".to_vec(),
            dir: false,
            settled: false,
        },
        t,
        0,
    );
    p.apply(Change::Modified(b"f".to_vec()), t, 0);
    let (b, next) = p.take(t, 100);
    assert!(b.is_none());
    assert_eq!(next, Some(t + Duration::from_secs(2)));
    p.apply(Change::Closed(b"f".to_vec()), t, 4096);
    let (b, _) = p.take(t, 100);
    let b = b.unwrap();
    assert_eq!(b.files, vec![(b"f".to_vec(), Kind::File)]);
    assert_eq!(b.bytes, 4096);
    p.finish(true, &[], t);
    assert_eq!(p.depth(), 0);
    // Written and never closed (a log): sent once quiet.
    p.apply(Change::Modified(b"log".to_vec()), t, 0);
    assert!(p.take(t + Duration::from_secs(1), 100).0.is_none());
    assert!(p.take(t + Duration::from_secs(2), 100).0.is_some());
}

#[test]
fn a_rename_is_one_operation_and_pending_writes_follow_it() {
    let mut p = Pending::new(PendingConfig::default());
    let t = Instant::now();
    p.apply(Change::Modified(b"d/big".to_vec()), t, 1 << 30);
    p.apply(
        Change::Renamed {
            from: b"d".to_vec(),
            to: b"e".to_vec(),
            dir: true,
        },
        t,
        0,
    );
    let (b, _) = p.take(t + Duration::from_secs(5), 100);
    let b = b.unwrap();
    assert_eq!(
        b.ops,
        vec![(
            1,
            Op::Rename {
                from: b"d".to_vec(),
                to: b"e".to_vec(),
                dir: true
            }
        )]
    );
    assert_eq!(b.files, vec![(b"e/big".to_vec(), Kind::File)]);
    // The root's mtime moved with the rename.
    assert_eq!(b.dirs, vec![b"".to_vec()]);
    let log = p.drain_log();
    assert!(log.contains(&LogRec::Move {
        from: b"d".to_vec(),
        to: b"e".to_vec()
    }));
}

#[test]
fn a_tree_in_flight_renamed_comes_back_as_a_mirror() {
    // mkdir a; its tree goes out; mv a c; mkdir -p a/x before the batch
    // reads a: DST gets a/x at a, which the rename op carries to c.
    let mut w = World::new(true);
    for s in [Step::Mkdir(0), Step::Take, Step::Rename(0, 6)] {
        w.run(&s);
    }
    let (b, _) = w.p.take(w.now, 10);
    assert!(b.is_none(), "one batch in flight");
    for s in [Step::Mkdir(0), Step::Mkdir(2), Step::Deliver(0)] {
        w.run(&s);
    }
    let b = w.p.take(w.now, 10).0.unwrap();
    assert!(
        b.files.contains(&(b"c".to_vec(), Kind::Mirror)),
        "{:?}",
        b.files
    );
    w.inflight = Some(b);
    w.settle();
    assert_eq!(w.dst, w.src);
    assert!(!w.dst.contains_key(b"c/x".as_slice()));
}

#[test]
fn a_new_tree_goes_without_its_files_still_being_written() {
    let mut p = Pending::new(PendingConfig::default());
    let t = Instant::now();
    let created = |path: &[u8], dir| Change::Created {
        path: path.to_vec(),
        dir,
        settled: dir,
    };
    p.apply(created(b"d", true), t, 0);
    p.apply(created(b"d/done", false), t, 0);
    p.apply(Change::Closed(b"d/done".to_vec()), t, 10);
    p.apply(created(b"d/writing", false), t, 0);
    p.apply(created(b"other", false), t, 0);
    let b = p.take(t, 100).0.unwrap();
    assert!(b.files.contains(&(b"d".to_vec(), Kind::Tree)));
    // Held: the tree would read it half-written. Not held: a file outside
    // every listed tree (nothing would send it).
    assert_eq!(b.hold, vec![b"d/writing".to_vec()]);
    p.finish(true, &[], t);
    p.apply(Change::Closed(b"d/writing".to_vec()), t, 10);
    let b = p.take(t, 100).0.unwrap();
    assert_eq!(b.files, vec![(b"d/writing".to_vec(), Kind::File)]);
    assert!(b.hold.is_empty());
}

#[test]
fn overflow_and_cap_ask_for_a_full_scan() {
    let mut p = Pending::new(PendingConfig {
        cap: 10,
        ..Default::default()
    });
    let t = Instant::now();
    for i in 0..11 {
        p.apply(Change::Closed(join(b"d", format!("{i}").as_bytes())), t, 0);
    }
    assert_eq!(p.counters.collapses, 1);
    assert!(p.full_requested());
    assert_eq!(p.depth(), 0);
    let (b, _) = p.take(t, 100);
    assert!(b.unwrap().full);
    p.finish(false, &[], t);
    assert!(p.full_requested(), "a failed full scan is due again");
    p.apply(Change::Overflow, t, 0);
    assert_eq!(p.counters.overflows, 1);
}

#[test]
fn a_failed_batch_goes_back_and_its_applied_ops_do_not() {
    let mut p = Pending::new(PendingConfig::default());
    let t = Instant::now();
    p.apply(
        Change::Deleted {
            path: b"x".to_vec(),
            dir: false,
        },
        t,
        0,
    );
    p.apply(Change::Closed(b"y".to_vec()), t, 0);
    let b = p.take(t, 100).0.unwrap();
    assert_eq!(b.ops.len(), 1);
    p.ops_applied(&[], t);
    p.finish(false, &[], t);
    let b = p.take(t, 100).0.unwrap();
    assert!(b.ops.is_empty());
    assert_eq!(b.files, vec![(b"y".to_vec(), Kind::File)]);
}
