//! The ZooKeeper engine against real servers from Debian's jar: what the
//! conformance suite cannot say on every engine (the token is the czxid, a
//! create whose reply was lost, a partition, revocation,
//! digest credentials, chroots and session timeouts). Tests that stop or
//! pause their server have one of their own; the rest share one, each on
//! a chroot of its own. The attacks on the engine (races, pauses,
//! expiries, odd input) are in `zookeeper/attacks.rs`, `zks://` in
//! `zookeeper/tls.rs`, its concurrency groups in `groups/zookeeper.rs`.

pub(crate) mod attacks;
mod tls;

use std::time::{Duration, Instant};

use crate::support::*;

/// A fresh chroot on the shared server: its URL (with `user:pass@` if given).
fn chroot_url(auth: Option<&str>) -> (String, u16, String) {
    let (port, chroot) = zk_chroot();
    let auth = auth.map(|a| format!("{a}@")).unwrap_or_default();
    (format!("zk://{auth}127.0.0.1:{port}{chroot}"), port, chroot)
}

/// The request nodes of `name` under the default prefix, with their czxid.
fn request_nodes(port: u16, chroot: &str, name: &str) -> Vec<(String, i64)> {
    let parent = format!("/lockrun/{name}");
    zk_do(port, Some(chroot), move |z| async move {
        let children = match z.list_children(&parent).await {
            Ok(c) => c,
            Err(zookeeper_client::Error::NoNode) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut out = Vec::new();
        for ch in children.into_iter().filter(|c| c.starts_with("q-")) {
            if let Ok(Some(st)) = z.check_stat(&format!("{parent}/{ch}")).await {
                out.push((ch, st.czxid));
            }
        }
        Ok(out)
    })
}

#[test]
fn the_token_is_the_lock_node_s_czxid() {
    let (url, port, chroot) = chroot_url(None);
    let scratch = Scratch::new();
    let token = scratch.path("token");
    let mut h = on(&url)
        .args(["tok", "-c"])
        .arg(format!(
            "echo $LOCKRUN_TOKEN > {}; exec sleep 60",
            token.display()
        ))
        .spawn();
    assert!(wait_until(Duration::from_secs(20), || {
        std::fs::read_to_string(&token).is_ok_and(|t| t.ends_with('\n'))
    }));
    let t: i64 = scratch.read("token").trim().parse().unwrap();
    let nodes = request_nodes(port, &chroot, "tok");
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    assert_eq!(nodes[0].1, t, "{nodes:?}");
    let shown = status_json(&url, "tok");
    assert_eq!(shown["token"].as_i64(), Some(t), "{shown}");
    signal(h.id() as i32, libc::SIGTERM);
    let _ = h.wait();
    // The next grant's token is higher.
    let next = on(&url)
        .args(["tok", "-c", "echo $LOCKRUN_TOKEN"])
        .succeeds();
    assert!(next.stdout().trim().parse::<i64>().unwrap() > t);
}

#[test]
fn a_create_whose_reply_was_lost_is_found_again_and_leaves_no_orphan() {
    let port = shared_zookeeper();
    let (_, chroot) = zk_chroot();
    let proxy = ZkProxy::start(port);
    let url = format!("{}{chroot}", proxy.url());
    proxy.lose_next_create();
    let out = on(&url)
        .args([
            "-v",
            "--ttl",
            "6s",
            "lost-reply",
            "-c",
            "echo $LOCKRUN_TOKEN",
        ])
        .succeeds();
    assert_eq!(proxy.lost.load(std::sync::atomic::Ordering::SeqCst), 1);
    let token: i64 = out.stdout().trim().parse().unwrap();
    assert!(token > 0);
    // One node was created, and it is gone with the run: nothing blocks
    // the name.
    assert!(request_nodes(port, &chroot, "lost-reply").is_empty());
    on(&url).args(["-n", "lost-reply", "true"]).succeeds();
}

#[test]
fn release_force_revokes_and_now_deletes() {
    let (url, port, chroot) = chroot_url(None);
    for now in [false, true] {
        let scratch = Scratch::new();
        let mut h = on(&url)
            .args(["--ttl", "3s", "rev", "-c"])
            .arg(format!(
                "echo $$ > {}; exec sleep 60",
                scratch.path("pid").display()
            ))
            .spawn();
        let job = scratch.pid_in("pid");
        let mut args = vec!["release", "--force"];
        if now {
            args.push("--now");
        }
        args.push("rev");
        on(&url).args(&args).succeeds();
        let before = request_nodes(port, &chroot, "rev");
        assert_eq!(before.len(), usize::from(!now), "now={now}: {before:?}");
        let code = wait_child(&mut h, Duration::from_secs(20)).code();
        assert_eq!(code, Some(76), "now={now}");
        assert!(!alive(job), "the job outlived its revoked lease");
    }
}

#[test]
fn digest_credentials_guard_the_nodes_and_a_wrong_password_is_69_unshown() {
    let (url, _, chroot) = chroot_url(Some("locker:right-pw"));
    let port = shared_zookeeper();
    let scratch = Scratch::new();
    let mut h = on(&url)
        .args(["guarded", "-c"])
        .arg(format!(
            "echo $$ > {}; exec sleep 60",
            scratch.path("pid").display()
        ))
        .spawn();
    scratch.pid_in("pid");
    let wrong = format!("zk://locker:s3cret-wrong@127.0.0.1:{port}{chroot}");
    for args in [
        &["-n", "guarded", "true"][..],
        &["status", "guarded"],
        &["release", "--force", "guarded"],
    ] {
        let out = on(&wrong).args(args).code(69);
        let err = out.stderr();
        assert!(!err.contains("s3cret-wrong"), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    }
    let out = on(&url).args(["doctor"]).output();
    assert!(!out.stdout().contains("right-pw") && !out.stderr().contains("right-pw"));
    let env = on(&url)
        .args(["-n", "other", "-c", "env"])
        .succeeds()
        .stdout();
    assert!(!env.contains("right-pw"), "{env}");
    signal(h.id() as i32, libc::SIGTERM);
    let _ = h.wait();
}

#[test]
fn a_chroot_that_does_not_exist_is_69_and_a_ttl_above_the_server_s_max_is_64() {
    let port = shared_zookeeper();
    let out = on(&format!("zk://127.0.0.1:{port}/no/such/chroot"))
        .args(["x", "true"])
        .code(69);
    assert!(out.stderr().contains("chroot"), "{}", out.stderr());
    let (url, _, _) = chroot_url(None);
    // The test servers allow sessions of at most 120 s.
    let out = on(&url).args(["--ttl", "300s", "x", "true"]).code(64);
    assert!(
        out.stderr().contains("maxSessionTimeout"),
        "{}",
        out.stderr()
    );
}

#[test]
fn a_partition_from_every_server_stops_the_job_on_schedule() {
    let port = shared_zookeeper();
    let (_, chroot) = zk_chroot();
    let proxy = ZkProxy::start(port);
    let url = format!("{}{chroot}", proxy.url());
    let scratch = Scratch::new();
    let mut h = on(&url)
        .args(["--ttl", "3s", "cut", "-c"])
        .arg(format!(
            "echo $$ > {}; exec sleep 60",
            scratch.path("pid").display()
        ))
        .spawn();
    let job = scratch.pid_in("pid");
    proxy.set_stall(true);
    let cut = Instant::now();
    let code = wait_child(&mut h, Duration::from_secs(20)).code();
    let took = cut.elapsed();
    proxy.set_stall(false);
    assert_eq!(code, Some(76));
    assert!(!alive(job));
    assert!(
        took < Duration::from_secs(3),
        "stopped {took:?} after the cut"
    );
}

/// The leader killed mid-job: the holder keeps its lease (its session moves
/// to the new leader) or stops with 76; the next holder never runs beside
/// it, and tokens keep growing.
#[test]
fn the_leader_killed_mid_job_keeps_the_lease_or_stops_it() {
    use crate::conformance::{logging_job, spans};
    let mut ens = Ensemble::start();
    let url = ens.url();
    let scratch = Scratch::new();
    let first = on(&url)
        .args(["--ttl", "6s", "lead", "-c"])
        .arg(logging_job(&scratch, "a", "4"))
        .spawn();
    assert!(wait_until(Duration::from_secs(20), || scratch.exists("log")));
    let second = on(&url)
        .args(["--ttl", "6s", "-w", "60", "lead", "-c"])
        .arg(logging_job(&scratch, "b", "0.2"))
        .spawn();
    let leader = ens.leader().expect("the ensemble has a leader");
    ens.servers[leader].kill();
    let (a, err_a) = exited(first, Duration::from_secs(60));
    assert!(matches!(a, Some(0 | 76)), "{a:?}: {err_a}");
    let (b, err_b) = exited(second, Duration::from_secs(60));
    assert_eq!(b, Some(0), "{err_b}");
    let s = spans(&scratch);
    assert_eq!(s.len(), 2, "{s:?}");
    assert!(s[0].end <= s[1].start, "the holders overlapped: {s:?}");
    assert!(s[1].token > s[0].token, "{s:?}");
}

/// A `--limit` slot's node deleted behind its holder's back is that
/// holder's lease broken: it stops, and its release leaves alone the node
/// that the next holder claimed at the same path meanwhile (deleting it
/// would let a third run in that slot beside the second).
#[test]
fn a_deleted_slot_node_stops_its_holder_whose_release_spares_the_next() {
    let (url, port, chroot) = chroot_url(None);
    let scratch = Scratch::new();
    let holder = |who: &str, gate: &str| {
        on(&url)
            .args(["--ttl", "3s", "--limit", "3", "slots", "-c"])
            .arg(format!(
                "echo $$ > {}; echo $LOCKRUN_SLOT > {}; \
                 while [ ! -e {} ]; do sleep 0.05; done",
                scratch.path(&format!("{who}pid")).display(),
                scratch.path(&format!("{who}slot")).display(),
                scratch.path(gate).display(),
            ))
            .spawn()
    };
    let slot_of = |who: &str| {
        let file = format!("{who}slot");
        assert!(wait_until(Duration::from_secs(20), || scratch
            .read(&file)
            .ends_with('\n')));
        scratch.read(&file).trim().to_string()
    };
    // p in slot 0, a in slot 1; p leaves, so slot 0 is free.
    let mut p = holder("p", "p-go");
    assert_eq!(slot_of("p"), "0");
    let mut a = holder("a", "never");
    assert_eq!(slot_of("a"), "1");
    std::fs::write(scratch.path("p-go"), "").unwrap();
    assert_eq!(wait_child(&mut p, Duration::from_secs(20)).code(), Some(0));
    let slot = |port: u16| {
        zk_do(port, Some(&chroot), |z| async move {
            match z.get_data("/lockrun/slots/s-1").await {
                Ok((data, _)) => Ok(Some(String::from_utf8_lossy(&data).into_owned())),
                Err(zookeeper_client::Error::NoNode) => Ok(None),
                Err(e) => Err(e),
            }
        })
    };
    let a_node = slot(port).expect("a's slot node");
    zk_delete(port, Some(&chroot), "/lockrun/slots/s-1");
    // b takes slot 1 again (a, without a slot node, is counted in slot 0).
    let mut b = holder("b", "b-go");
    assert_eq!(slot_of("b"), "1");
    let b_node = slot(port).expect("b's slot node");
    assert_ne!(a_node, b_node);
    let started = Instant::now();
    assert_eq!(wait_child(&mut a, Duration::from_secs(20)).code(), Some(76));
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    assert!(!alive(scratch.pid_in("apid")));
    // a's release spared b's slot node: b still holds, alone in slot 1.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(slot(port).as_deref(), Some(b_node.as_str()));
    std::fs::write(scratch.path("b-go"), "").unwrap();
    assert_eq!(wait_child(&mut b, Duration::from_secs(20)).code(), Some(0));
}

#[test]
fn a_closed_port_is_said_refused_at_once_with_its_address() {
    let port = free_port();
    let url = format!("zk://locker:s3cret-zk@127.0.0.1:{port}");
    let started = Instant::now();
    let out = on(&url).arg("doctor").code(69).stdout();
    assert!(out.contains("connection refused"), "{out}");
    assert!(out.contains(&format!("127.0.0.1:{port}")), "{out}");
    assert!(!out.contains("s3cret-zk"), "{out}");
    on(&url)
        .args(["x", "true"])
        .code(69)
        .says(&["connection refused", &format!("127.0.0.1:{port}")]);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}
