//! Third-party copies (`HOST1:P HOST2:Q`): a sink on HOST2, `ramsys cp`
//! on HOST1 towards it, and its JSON output relayed as our summary.

use super::*;

/// `HOST1:P... HOST2:Q`: if this is a third-party copy, run it and return
/// the exit code; data moves HOST1 -> HOST2 directly.
pub fn third_party(
    a: &CpArgs,
    sync: u32,
    srcs: &[Endpoint],
    dst: &Endpoint,
) -> anyhow::Result<Option<i32>> {
    let Endpoint::Ssh(d) = dst else {
        return Ok(None);
    };
    let ssh_srcs: Vec<&SshEndpoint> = srcs
        .iter()
        .filter_map(|s| match s {
            Endpoint::Ssh(e) => Some(e),
            _ => None,
        })
        .collect();
    if ssh_srcs.is_empty() {
        return Ok(None);
    }
    if ssh_srcs.len() != srcs.len() {
        bail!("sources must be all local or all on one ssh host");
    }
    let h = ssh_srcs[0];
    if ssh_srcs
        .iter()
        .any(|e| e.host != h.host || e.user != h.user)
    {
        bail!("all remote sources must be on the same host");
    }
    anyhow::ensure!(
        a.select.files_from.is_none(),
        "--files-from is not supported for a copy between two ssh hosts (the list is here)"
    );
    let sink = serve(a, d, ServeRole::Sink, &[d.path.as_str()]).with_context(|| d.display())?;
    let dest = String::from_utf8(sink.offer.dest.clone().unwrap_or_default())
        .map_err(|_| anyhow::anyhow!("{}: destination name is not UTF-8", d.display()))?;
    let url = format!("ramsys://{}/{}", sink.addr, dest);
    let args = source_cp_args(a, sync, &ssh_srcs, &url);
    let mut p = a.ssh.spawn(h, &args, &sink.key, sink.user.as_deref())?;
    let code = relay(a, &mut p);
    let code = match code {
        Some(c) => {
            p.wait(Duration::from_secs(10));
            let err = p.stderr_text();
            if !err.is_empty() && c != 0 {
                say!("ramsys: {}: {err}", p.host);
            }
            c
        }
        None => {
            let e = p.failure(&a.ssh.remote_ramsys);
            return Err(e.context(h.display()));
        }
    };
    sink.finish();
    Ok(Some(code))
}

/// HOST1's command line: `cp|sync --key-stdin --json OPTIONS -- SRC... URL`.
pub(super) fn source_cp_args(
    a: &CpArgs,
    sync: u32,
    srcs: &[&SshEndpoint],
    url: &str,
) -> Vec<String> {
    use ramsys_engine::request::sync::flags::*;
    let mut v: Vec<String> = vec![if sync & SYNC != 0 { "sync" } else { "cp" }.into()];
    v.extend(["--key-stdin".into(), "--json".into()]);
    for (flag, on) in [
        ("--checksum", sync & SYNC != 0 && sync & CHECKSUM != 0),
        ("--delete", sync & DELETE != 0),
        ("--dry-run", sync & DRY_RUN != 0),
        ("--resume", sync & RESUME != 0),
        ("--no-resume", sync & JOURNAL == 0),
        ("--write-devices", sync & WRITE_DEVICES != 0),
        ("--ignore-existing", sync & IGNORE_EXISTING != 0),
        ("--update", sync & UPDATE != 0),
        ("-r", a.recursive || a.archive.archive),
        ("--no-checksum", a.no_checksum),
    ] {
        if on {
            v.push(flag.into());
        }
    }
    v.push(format!("--block-size={}", a.block_size));
    v.extend(a.archive.to_args());
    // The selection, rules in order (HOST1's scan applies it), each as the
    // --filter rule it is on the wire (clears and merges already applied).
    // These words go through HOST1's shell: quoted.
    for r in &a.select.rules {
        v.push(shell_quote(&format!(
            "--filter={}",
            String::from_utf8_lossy(r)
        )));
    }
    if let Some(n) = a.select.min_size {
        v.push(format!("--min-size={n}"));
    }
    if let Some(n) = a.select.max_size {
        v.push(format!("--max-size={n}"));
    }
    if let Some(s) = a.streams {
        v.push(format!("--streams={s}"));
    }
    // HOST1 is the source: its senders apply the limit (in bytes/s).
    if let Some(b) = a.bwlimit {
        v.push(format!("--bwlimit={b}B"));
    }
    if let Some(r) = a.readers {
        v.push(format!("--readers={r}"));
    }
    v.push(format!("--memory={}", a.memory));
    v.push(format!("--connect-timeout={}", a.connect_timeout));
    v.push(format!("--numa={}", a.numa));
    if let Some(c) = a.encrypt {
        use ramsys_engine::transport::crypto::Cipher;
        v.push(
            match c {
                Cipher::None => "--encrypt=none",
                Cipher::Aes256Gcm => "--encrypt=aes-256-gcm",
                Cipher::ChaCha20Poly1305 => "--encrypt=chacha20-poly1305",
            }
            .into(),
        );
    }
    if let Ok(serde_json::Value::String(c)) = serde_json::to_value(a.channels) {
        v.push(format!("--channels={c}"));
    }
    v.extend(storage_args(a, false));
    v.push("--".into());
    v.extend(srcs.iter().map(|e| quote_path(&e.path)));
    v.push(shell_quote(url));
    v
}

/// Relay HOST1's `--json` output: progress and the summary line as they
/// are with --json, else a bar on a terminal and cp's summary line.
/// Returns cp's exit code, or None if it ended without a summary.
fn relay(a: &CpArgs, p: &mut SshProc) -> Option<i32> {
    let bar = (!a.json && std::io::stderr().is_terminal()).then(|| {
        let b = indicatif::ProgressBar::new(0);
        if let Ok(s) =
            indicatif::ProgressStyle::with_template("{bar:30} {bytes}/{total_bytes} {msg}")
        {
            b.set_style(s);
        }
        b
    });
    let mut summary = None;
    let mut line = String::new();
    loop {
        line.clear();
        match p.stdout.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line.trim()) else {
            continue;
        };
        if a.json {
            let mut o = std::io::stdout().lock();
            let _ = o.write_all(line.as_bytes());
            let _ = o.flush();
        }
        match v["event"].as_str() {
            Some("progress") => {
                if let Some(b) = &bar {
                    b.set_length(v["total_bytes"].as_u64().unwrap_or(0));
                    b.set_position(v["bytes"].as_u64().unwrap_or(0));
                    let bps = v["mb_s"].as_f64().unwrap_or(0.0) * 1e6;
                    b.set_message(ramsys_units::format_rate(bps as u64));
                }
            }
            Some("summary") => summary = Some(v),
            _ => {}
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let v = summary?;
    let ok = v["ok"].as_bool() == Some(true);
    if !a.json {
        print_summary(&v, &p.host);
    }
    Some(i32::from(!ok))
}

fn print_summary(v: &serde_json::Value, host: &str) {
    if let Some(e) = v["error"].as_str() {
        say!("ramsys: error: {host}: {e}");
        return;
    }
    for f in v["failed"].as_array().into_iter().flatten() {
        say!(
            "ramsys: failed: {}: {}",
            f["path"].as_str().unwrap_or("?"),
            f["reason"].as_str().unwrap_or("?")
        );
    }
    if v.get("unchanged").is_some() {
        println!(
            "{} files unchanged, {} entries deleted",
            v["unchanged"].as_u64().unwrap_or(0),
            v["deleted"].as_u64().unwrap_or(0)
        );
    }
    tell!(
        "copied {} files, {} in {:.2} s ({}), from {host}",
        v["files"].as_u64().unwrap_or(0),
        ramsys_units::format_size(v["bytes"].as_u64().unwrap_or(0)),
        v["wall_s"].as_f64().unwrap_or(0.0),
        // mb_s in the JSON summary is 10^6 bytes/s (bench/README.md).
        ramsys_units::format_rate((v["mb_s"].as_f64().unwrap_or(0.0) * 1e6) as u64),
    );
}
