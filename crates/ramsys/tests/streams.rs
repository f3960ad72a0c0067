//! Streams sized from the path (issue 21; engine transport/path.rs): with
//! no --streams the agent reads the control link's handshake RTT before it
//! dials the data links and reports the choice; on loopback that is the
//! LAN count (RTT 0 does not change), an explicit --streams is never
//! overridden, and a local copy (its path is memory) is not sized at all.
//! The long-path numbers are in docs/BENCHMARKS.md (bench/wanem).

mod common;

use common::*;

fn summary(o: &std::process::Output) -> serde_json::Value {
    let out = String::from_utf8_lossy(&o.stdout);
    let line = out
        .lines()
        .rev()
        .find(|l| l.contains("\"summary\""))
        .unwrap();
    serde_json::from_str(line).unwrap()
}

#[test]
fn loopback_keeps_the_lan_count_and_says_why() {
    let t = tree_and_daemon(65536);
    let (key, src) = (&t.key, t.src.display().to_string());
    for (i, pull) in [false, true].into_iter().enumerate() {
        let out = t.t.path().join(format!("out{i}"));
        let (from, to) = if pull {
            std::fs::rename(&t.src, t.root.join("src")).unwrap();
            (t.d.url("src"), out.display().to_string())
        } else {
            (src.clone(), t.d.url(&format!("in{i}")))
        };
        let o = ramsys(key, &["cp", "-r", "--json", &from, &to]);
        assert_ok(&o);
        let v = summary(&o);
        let c = &v["stream_choice"];
        assert_eq!(c["streams"], 4, "pull {pull}: {v}");
        assert_eq!(v["streams"], 4, "pull {pull}: {v}");
        let rtt = c["rtt_us"].as_u64().expect("an RTT sample on loopback");
        assert!(rtt < 20_000, "loopback RTT {rtt} us");
        assert!(c["why"].as_str().unwrap().contains("ms x"), "{c}");
    }
}

#[test]
fn an_explicit_count_or_a_local_copy_is_not_sized() {
    let t = tree_and_daemon(65536);
    let src = t.src.display().to_string();
    let o = ramsys(
        &t.key,
        &["cp", "-r", "--json", "--streams", "6", &src, &t.d.url("x")],
    );
    assert_ok(&o);
    let v = summary(&o);
    assert!(v["stream_choice"].is_null(), "{v}");
    assert_eq!(v["streams"], 6, "{v}");
    let local = t.t.path().join("local").display().to_string();
    let o = ramsys(&t.key, &["cp", "-r", "--json", &src, &local]);
    assert_ok(&o);
    assert!(summary(&o)["stream_choice"].is_null());
}
