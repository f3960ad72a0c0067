//! A hand-written malicious peer that speaks the protocol: the daemon must
//! refuse hostile paths without following them, never write outside its
//! root, and survive protocol abuse.

mod common;

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use ramsys_engine::session::{ClientLinks, Connect, LinkProvider};
use ramsys_engine::transport::tcp::Tcp;
use ramsys_engine::transport::wire::{exchange_preamble, read_header, recv_control, send_control};
use ramsys_engine::transport::Link;
use ramsys_proto::control::{Confirm, Entry, EntryKind, Open, Propose, Role};
use ramsys_proto::data::{encode_table, hash_block, table_len, Segment};
use ramsys_proto::frame::{FrameHeader, FrameKind};
use ramsys_proto::Control;

const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

struct Evil {
    ctl: Box<dyn Link>,
    links: ClientLinks,
    data: Vec<Box<dyn Link>>,
    confirm: Confirm,
}

impl Evil {
    /// Open the data links (the sink accepts them after SyncDone).
    fn open_links(&mut self) {
        self.data = self.links.open(self.confirm.streams).unwrap();
    }
}

/// Authenticate with the right key and negotiate a push session.
fn open_push(addr: &str, dest: &[u8]) -> Evil {
    let t = Tcp::default();
    let s = Connect::new(addr, KEY, Duration::from_secs(5))
        .open(&t)
        .unwrap();
    let mut ctl = s.ctl;
    send_control(
        &mut *ctl,
        &Control::Open(Open {
            server_role: Role::Sink,
            paths: vec![dest.to_vec()],
            recursive: true,
            streams: 1,
            block_size: 1 << 16,
            checksum: true,
        }),
    )
    .unwrap();
    send_control(
        &mut *ctl,
        &Control::Propose(Propose {
            roots: 1,
            streams: 1,
            block_size: 1 << 16,
            capacity_mbps: 0,
            checksum: true,
            cipher: 0,
        }),
    )
    .unwrap();
    let confirm = match recv_control(&mut *ctl).unwrap() {
        Control::Confirm(c) => c,
        other => panic!("expected Confirm, got {other:?}"),
    };
    let links = ClientLinks {
        transport: Arc::new(Tcp::default()),
        addr: addr.to_string(),
        session: s.session,
        session_key: s.session_key,
        timeout: Duration::from_secs(5),
    };
    Evil {
        ctl,
        links,
        data: Vec::new(),
        confirm,
    }
}

fn entry(id: u64, path: &[u8], kind: EntryKind) -> Entry {
    Entry {
        id,
        path: path.to_vec(),
        kind,
        mode: 0o644,
        mtime_s: 0,
        mtime_ns: 0,
    }
}

/// Everything except the daemon's root must stay as it was.
fn outside_untouched(parent: &Path) {
    let names: Vec<String> = std::fs::read_dir(parent)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    for n in &names {
        assert!(
            ["root", "key", "outside"].contains(&n.as_str()),
            "unexpected entry {n} next to the root"
        );
    }
}

fn setup() -> (tempfile::TempDir, TestDaemon) {
    let t = tempfile::tempdir().unwrap();
    let key = key_file(t.path());
    std::fs::write(&key, KEY).unwrap();
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::create_dir(t.path().join("outside")).unwrap();
    let d = TestDaemon::start(&root, &key);
    (t, d)
}

#[test]
fn hostile_paths_abort_the_session_and_touch_nothing() {
    let (t, d) = setup();
    let bad: [&[u8]; 7] = [
        b"../escape",
        b"top/../../escape",
        b"/abs/escape",
        b"nul\0byte",
        b"top/./x",
        b"top//x",
        b"",
    ];
    for p in bad {
        let mut e = open_push(&d.addr, b"");
        // An empty path is refused for anything but a directory record,
        // which stands for DST itself (`SRC/`, issue 15).
        let kind = if p.is_empty() {
            EntryKind::File { size: 0 }
        } else {
            EntryKind::Dir
        };
        send_control(&mut *e.ctl, &Control::Entries(vec![entry(0, p, kind)])).unwrap();
        let _ = send_control(
            &mut *e.ctl,
            &Control::MetaEnd {
                entries: 1,
                files: 0,
                bytes: 0,
            },
        );
        match recv_control(&mut *e.ctl) {
            Ok(Control::Abort { reason }) => assert!(
                reason.contains("path") || reason.contains("malformed"),
                "{reason}"
            ),
            other => panic!(
                "path {:?}: expected Abort, got {other:?}",
                String::from_utf8_lossy(p)
            ),
        }
    }
    outside_untouched(t.path());
    assert!(std::fs::read_dir(t.path().join("outside"))
        .unwrap()
        .next()
        .is_none());
    assert!(
        std::fs::read_dir(&d.root).unwrap().next().is_none(),
        "nothing created in the root either"
    );
}

#[test]
fn writes_through_symlinks_are_refused_without_following() {
    let (t, d) = setup();
    let outside = t.path().join("outside");
    // A symlink inside the export pointing out of it (left by a local user
    // or an earlier transfer).
    std::os::unix::fs::symlink(&outside, d.root.join("link")).unwrap();
    let mut e = open_push(&d.addr, b"");
    send_control(
        &mut *e.ctl,
        &Control::Entries(vec![
            entry(0, b"link/subdir", EntryKind::Dir),
            entry(1, b"link/pwned", EntryKind::File { size: 5 }),
        ]),
    )
    .unwrap();
    send_control(
        &mut *e.ctl,
        &Control::MetaEnd {
            entries: 2,
            files: 1,
            bytes: 5,
        },
    )
    .unwrap();
    let sync = recv_control(&mut *e.ctl).unwrap();
    let Control::SyncDone { failures } = sync else {
        panic!("expected SyncDone, got {sync:?}")
    };
    assert_eq!(failures.len(), 1, "the directory through the symlink fails");
    assert!(failures[0].reason.contains("symlink"), "{:?}", failures[0]);
    e.open_links();
    // Send the file's payload anyway.
    let link = &mut e.data[0];
    let h = read_header(&mut **link, 0).unwrap().unwrap();
    assert_eq!(h.kind, FrameKind::Credit);
    let mut c = [0u8; 4];
    std::io::Read::read_exact(&mut **link, &mut c).unwrap();
    let payload = b"pwned";
    let segs = [Segment {
        file_id: 1,
        offset: 0,
        len: 5,
    }];
    let mut hashes = [0u64];
    let ck = hash_block(&segs, payload, &mut hashes);
    send_block(&mut **link, &segs, ck, payload);
    link.write_all(&FrameHeader::new(FrameKind::End, 0, 0).encode())
        .unwrap();
    send_control(&mut *e.ctl, &Control::FilesDone(vec![(1, hashes[0])])).unwrap();
    send_control(&mut *e.ctl, &Control::EndOfData { files: 1, bytes: 5 }).unwrap();
    let Control::Complete(c) = recv_final(&mut *e.ctl) else {
        panic!("expected Complete")
    };
    assert_eq!(c.files, 0);
    assert!(c
        .failures
        .iter()
        .any(|f| f.path == b"link/pwned" && f.reason.contains("symlink")));
    assert!(
        std::fs::read_dir(&outside).unwrap().next().is_none(),
        "nothing written through the link"
    );
    assert!(temp_files(&d.root).is_empty());
    outside_untouched(t.path());
}

/// The sink's last message, past any Settled it sent during the payload.
fn recv_final(ctl: &mut dyn Link) -> Control {
    loop {
        match recv_control(ctl).unwrap() {
            Control::Settled => {}
            m => return m,
        }
    }
}

#[test]
fn directory_swapped_for_a_symlink_mid_transfer_is_not_followed() {
    // TOCTOU: the tree exists at the sink (SyncDone), then a local user
    // swaps a directory for a symlink out of the export before the file's
    // data arrives. The sink resolves every path with openat2
    // RESOLVE_NO_SYMLINKS, so the write fails instead of following it.
    let (t, d) = setup();
    let outside = t.path().join("outside");
    let mut e = open_push(&d.addr, b"");
    send_control(
        &mut *e.ctl,
        &Control::Entries(vec![
            entry(0, b"top", EntryKind::Dir),
            entry(1, b"top/d", EntryKind::Dir),
            entry(2, b"top/d/x", EntryKind::File { size: 5 }),
        ]),
    )
    .unwrap();
    send_control(
        &mut *e.ctl,
        &Control::MetaEnd {
            entries: 3,
            files: 1,
            bytes: 5,
        },
    )
    .unwrap();
    let Control::SyncDone { failures } = recv_control(&mut *e.ctl).unwrap() else {
        panic!("expected SyncDone")
    };
    assert!(failures.is_empty(), "{failures:?}");
    assert!(d.root.join("top/d").is_dir());
    std::fs::rename(d.root.join("top/d"), d.root.join("top/d.orig")).unwrap();
    std::os::unix::fs::symlink(&outside, d.root.join("top/d")).unwrap();
    e.open_links();
    let link = &mut e.data[0];
    let h = read_header(&mut **link, 0).unwrap().unwrap();
    assert_eq!(h.kind, FrameKind::Credit);
    let mut c = [0u8; 4];
    std::io::Read::read_exact(&mut **link, &mut c).unwrap();
    let segs = [Segment {
        file_id: 2,
        offset: 0,
        len: 5,
    }];
    let mut hashes = [0u64];
    let ck = hash_block(&segs, b"pwned", &mut hashes);
    send_block(&mut **link, &segs, ck, b"pwned");
    link.write_all(&FrameHeader::new(FrameKind::End, 0, 0).encode())
        .unwrap();
    send_control(&mut *e.ctl, &Control::FilesDone(vec![(2, hashes[0])])).unwrap();
    send_control(&mut *e.ctl, &Control::EndOfData { files: 1, bytes: 5 }).unwrap();
    let Control::Complete(c) = recv_final(&mut *e.ctl) else {
        panic!("expected Complete")
    };
    assert_eq!(c.files, 0, "the write must fail, not follow the link");
    assert!(
        c.failures.iter().any(|f| f.path == b"top/d/x"),
        "{:?}",
        c.failures
    );
    assert!(
        std::fs::read_dir(&outside).unwrap().next().is_none(),
        "written through the swapped-in symlink"
    );
    assert!(temp_files(&d.root).is_empty());
    outside_untouched(t.path());
}

fn send_block(link: &mut dyn Link, segs: &[Segment], ck: u64, payload: &[u8]) {
    let mut table = vec![0u8; table_len(segs.len())];
    let tl = encode_table(ck, segs, &mut table);
    let h = FrameHeader::new(
        FrameKind::Data,
        segs.len() as u16,
        (tl + payload.len()) as u32,
    );
    link.write_all(&h.encode()).unwrap();
    link.write_all(&table).unwrap();
    link.write_all(payload).unwrap();
}

#[test]
fn data_for_unknown_files_or_past_eof_aborts() {
    let (t, d) = setup();
    for (fid, off) in [(7u64, 0u64), (1, 3)] {
        let mut e = open_push(&d.addr, b"");
        send_control(
            &mut *e.ctl,
            &Control::Entries(vec![
                entry(0, b"top", EntryKind::Dir),
                entry(1, b"top/f", EntryKind::File { size: 4 }),
            ]),
        )
        .unwrap();
        send_control(
            &mut *e.ctl,
            &Control::MetaEnd {
                entries: 2,
                files: 1,
                bytes: 4,
            },
        )
        .unwrap();
        assert!(matches!(
            recv_control(&mut *e.ctl).unwrap(),
            Control::SyncDone { .. }
        ));
        e.open_links();
        let link = &mut e.data[0];
        let _ = read_header(&mut **link, 0).unwrap();
        let mut c = [0u8; 4];
        std::io::Read::read_exact(&mut **link, &mut c).unwrap();
        let segs = [Segment {
            file_id: fid,
            offset: off,
            len: 4,
        }];
        let mut hs = [0u64];
        let ck = hash_block(&segs, b"abcd", &mut hs);
        send_block(&mut **link, &segs, ck, b"abcd");
        match recv_control(&mut *e.ctl) {
            Ok(Control::Abort { reason }) => assert!(reason.contains("protocol"), "{reason}"),
            other => panic!("expected Abort, got {other:?}"),
        }
        assert!(!d.root.join("top/f").exists());
        assert!(temp_files(&d.root).is_empty());
    }
    outside_untouched(t.path());
}

#[test]
fn sending_beyond_credits_aborts() {
    let (_t, d) = setup();
    let mut e = open_push(&d.addr, b"");
    let window = e.confirm.credits_per_stream as usize;
    send_control(
        &mut *e.ctl,
        &Control::Entries(vec![entry(0, b"f", EntryKind::File { size: 1 << 20 })]),
    )
    .unwrap();
    send_control(
        &mut *e.ctl,
        &Control::MetaEnd {
            entries: 1,
            files: 1,
            bytes: 1 << 20,
        },
    )
    .unwrap();
    assert!(matches!(
        recv_control(&mut *e.ctl).unwrap(),
        Control::SyncDone { .. }
    ));
    e.open_links();
    // Ignore credits entirely and flood the link.
    let link = &mut e.data[0];
    let payload = vec![1u8; 1024];
    for i in 0..(window + 200) {
        let segs = [Segment {
            file_id: 0,
            offset: (i * 1024) as u64 % (1 << 20),
            len: 1024,
        }];
        let mut hs = [0u64];
        let ck = hash_block(&segs, &payload, &mut hs);
        let mut table = vec![0u8; table_len(1)];
        encode_table(ck, &segs, &mut table);
        let h = FrameHeader::new(FrameKind::Data, 1, (table.len() + payload.len()) as u32);
        if link.write_all(&h.encode()).is_err()
            || link.write_all(&table).is_err()
            || link.write_all(&payload).is_err()
        {
            break;
        }
    }
    match recv_control(&mut *e.ctl) {
        Ok(Control::Abort { reason }) => assert!(
            reason.contains("credit") || reason.contains("data past"),
            "{reason}"
        ),
        other => panic!("expected Abort, got {other:?}"),
    }
    assert!(!d.root.join("f").exists());
}

#[test]
fn data_links_without_credentials_are_refused() {
    let (_t, d) = setup();
    // A real session is open...
    let _e = open_push(&d.addr, b"");
    // ...and a stranger tries to join it with a made-up MAC.
    let t = Tcp::default();
    use ramsys_engine::transport::Transport;
    let mut l = t.connect(&d.addr, Duration::from_secs(5)).unwrap();
    exchange_preamble(&mut *l).unwrap();
    send_control(
        &mut *l,
        &Control::Join {
            session: 0,
            stream: 0,
            nonce: [0; 32],
            mac: [0; 32],
        },
    )
    .unwrap();
    match recv_control(&mut *l) {
        Ok(Control::Error { message, .. }) => assert!(message.contains("credentials"), "{message}"),
        other => panic!("expected Error, got {other:?}"),
    }
    // Garbage instead of a preamble is dropped too.
    let mut l = t.connect(&d.addr, Duration::from_secs(5)).unwrap();
    l.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let mut buf = [0u8; 64];
    let n = std::io::Read::read(&mut *l, &mut buf).unwrap_or(0);
    assert!(n <= 8, "daemon answers garbage with at most its preamble");
}
