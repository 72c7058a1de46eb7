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

/// `status` reads a name with a `--min-hold` window, then asks the
/// server's clock with a write to the name's node. ZooKeeper removes that
/// node (a container) once its last child goes, which may come in
/// between: the name is then read again and shown as it now is, free,
/// not a failure.
#[test]
fn status_reads_again_a_name_whose_node_went_before_the_clock() {
    use std::sync::atomic::Ordering::SeqCst;
    let port = shared_zookeeper();
    let (_, chroot) = zk_chroot();
    let direct = format!("zk://127.0.0.1:{port}{chroot}");
    let proxy = ZkProxy::start(port);
    let via = format!("{}{chroot}", proxy.url());
    on(&direct)
        .args(["--min-hold", "60s", "gone", "true"])
        .succeeds();
    // Held by its window.
    on(&direct).args(["status", "gone"]).succeeds();
    proxy.hold_set_data(true);
    let child = on(&via)
        .args(["status", "gone"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let asked = wait_until(Duration::from_secs(20), || {
        proxy.set_data_held.load(SeqCst) > 0
    });
    // The window ends and the name's node goes, as ZooKeeper removes an
    // empty container, while the write that reads the clock is held.
    let mut nodes: Vec<String> = zk_tree(port, Some(&chroot))
        .into_iter()
        .map(|(p, _)| p)
        .filter(|p| p == "/lockrun/gone" || p.starts_with("/lockrun/gone/"))
        .collect();
    nodes.sort_by_key(|p| std::cmp::Reverse(p.matches('/').count()));
    for p in &nodes {
        zk_delete(port, Some(&chroot), p);
    }
    proxy.hold_set_data(false);
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(asked, "status never asked for the clock: {stdout} {stderr}");
    assert!(!nodes.is_empty(), "no node of the name was found");
    assert_eq!(
        out.status.code(),
        Some(1),
        "expected free (1); deleted {nodes:?}; stdout: {stdout}; stderr: {stderr}"
    );
    assert!(stderr.is_empty(), "{stderr}");
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

/// Request nodes written as lockrun writes them (the prefix's and each
/// name's container, an ephemeral sequential node with its record) on a
/// session that keeps them until this is dropped.
struct KeptRequests {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for KeptRequests {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Queue `requests` (name, label), in order, on a session of their own:
/// what keeps them, and each one's token (its czxid). Every create is sent
/// before the first reply is awaited, so that thousands take seconds.
fn keep_requests(
    port: u16,
    chroot: &str,
    requests: Vec<(String, String)>,
) -> (KeptRequests, Vec<i64>) {
    let (made_tx, made) = std::sync::mpsc::channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let cs = format!("127.0.0.1:{port}{chroot}");
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let z = zookeeper_client::Client::connector()
                .with_session_timeout(Duration::from_secs(60))
                .connect(&cs)
                .await
                .expect("connect to ZooKeeper");
            let _ = made_tx.send(write_requests(&z, &requests).await);
            // The session lives on this thread's runtime until the test is done.
            let _ = stopped.await;
            // Closed, not left to expire, it takes its nodes with it now.
            drop(z);
            tokio::time::sleep(Duration::from_millis(200)).await;
        })
    });
    let tokens = made
        .recv_timeout(Duration::from_secs(300))
        .expect("the requests were never written")
        .expect("writing the requests");
    let kept = KeptRequests {
        stop: Some(stop),
        thread: Some(thread),
    };
    (kept, tokens)
}

async fn write_requests(
    z: &zookeeper_client::Client,
    requests: &[(String, String)],
) -> Result<Vec<i64>, zookeeper_client::Error> {
    use futures_util::future::try_join_all;
    use zookeeper_client::{Acl, Acls, AuthId, CreateMode, Permission as P};
    // The prefix's ACL as lockrun gives it: any identity may create a name.
    let prefix = [Acl::new(
        P::READ | P::CREATE | P::DELETE,
        AuthId::new("world", "anyone"),
    )];
    let root = CreateMode::Container.with_acls(Acls::new(&prefix));
    match z.create("/lockrun", b"", &root).await {
        Ok(_) | Err(zookeeper_client::Error::NodeExists) => {}
        Err(e) => return Err(e),
    }
    let mut parents: Vec<String> = requests
        .iter()
        .map(|(n, _)| format!("/lockrun/{n}"))
        .collect();
    parents.dedup();
    let container = CreateMode::Container.with_acls(Acls::anyone_all());
    try_join_all(parents.iter().map(|p| z.create(p, b"", &container))).await?;
    let paths: Vec<String> = (0..requests.len())
        .map(|i| format!("/lockrun/{}/q-{i:032x}-", requests[i].0))
        .collect();
    let ephemeral = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
    let made = try_join_all(paths.iter().zip(requests).map(|(path, (_, label))| {
        let record = serde_json::json!({"label": label, "mode": "x", "ttl_ms": 60000});
        z.create(path, record.to_string().as_bytes(), &ephemeral)
    }))
    .await?;
    Ok(made.into_iter().map(|(stat, _)| stat.czxid).collect())
}

/// `status` without a name at fleet size: the names are read a batch at a
/// time, each batch's requests sent together (several round trips a name
/// would take over ten seconds).
#[test]
fn ten_thousand_names_are_listed_in_seconds() {
    let (url, port, chroot) = chroot_url(None);
    let requests = (1..=10_000)
        .map(|i| (format!("n{i:05}"), format!("host:{i}")))
        .collect();
    let (_kept, tokens) = keep_requests(port, &chroot, requests);
    let started = Instant::now();
    let out = on(&url).arg("status").code(0).stdout();
    let took = started.elapsed();
    println!("status of 10,000 names on ZooKeeper: {took:?}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 10_000);
    for (i, line) in lines.iter().enumerate() {
        let held = format!(
            "n{:05}: held by host:{}, token {},",
            i + 1,
            i + 1,
            tokens[i]
        );
        assert!(line.starts_with(&held), "{line}");
    }
    assert!(took < Duration::from_secs(10), "{took:?}");
    let started = Instant::now();
    let ran = on(&url).args(["status", "--json"]).code(0);
    let took = started.elapsed();
    println!("status --json of 10,000 names on ZooKeeper: {took:?}");
    let v = ran.json();
    let all = v.as_array().unwrap();
    assert_eq!(all.len(), 10_000);
    for (i, name) in all.iter().enumerate() {
        assert_eq!(name["name"], format!("n{:05}", i + 1), "{name}");
        assert_eq!(name["holder"], format!("host:{}", i + 1), "{name}");
        assert_eq!(name["token"].as_i64(), Some(tokens[i]), "{name}");
        assert_eq!(name["waiters"].as_u64(), Some(0), "{name}");
    }
    assert!(took < Duration::from_secs(10), "{took:?}");
}

/// `status NAME` reads a long queue's records in one multi-read.
#[test]
fn a_name_with_500_waiters_is_read_quickly() {
    let (url, port, chroot) = chroot_url(None);
    let requests = (0..=500)
        .map(|i| ("crowded".to_string(), format!("host:{i}")))
        .collect();
    let (_kept, tokens) = keep_requests(port, &chroot, requests);
    let started = Instant::now();
    let ran = on(&url).args(["status", "--json", "crowded"]).code(0);
    let took = started.elapsed();
    println!("status of a name with 500 waiters on ZooKeeper: {took:?}");
    let v = ran.json();
    assert_eq!(v["holder"], "host:0", "{v}");
    assert_eq!(v["token"].as_i64(), Some(tokens[0]), "{v}");
    assert_eq!(v["waiters"].as_u64(), Some(500), "{v}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    let out = on(&url).args(["status", "crowded"]).code(0).stdout();
    assert!(
        out.starts_with(&format!("crowded: held by host:0, token {},", tokens[0])),
        "{out}"
    );
    assert!(out.trim_end().ends_with("; 500 waiting"), "{out}");
}
