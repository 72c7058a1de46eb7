//! Users and passwords, on every engine that has them: however short, a
//! password is hidden where the address is shown and nowhere else (the
//! words around it come out whole); however long, it reaches no line and
//! no job; a URL written wrong is refused before anything is contacted,
//! without it; and a user with only the rights the manual gives can do
//! all lockrun does.

use std::process::Stdio;
use std::time::{Duration, Instant};

use super::{Fixture, stop};
use crate::support::*;

/// Short passwords whose letters are in lockrun's own words.
const SHORT: [&str; 3] = ["lock", "ok", "x"];

/// A password long and distinctive enough to be found in any line.
const LONG: &str = "s3cret-pw-7f3a";

/// Everything one invocation printed, stdout then stderr.
pub fn printed(ran: &Ran) -> String {
    format!("{}{}", ran.stdout(), ran.stderr())
}

/// No password as userinfo, and no mask anywhere but in the userinfo of an
/// address (`user:***@`): a mask elsewhere garbles a word and gives away
/// which letters the password has.
#[track_caller]
pub fn masked_only_in_addresses(what: &str, pw: &str, out: &str) {
    assert!(!out.contains(&format!(":{pw}@")), "{what}: {out}");
    let outside = out.replace(":***@", "");
    assert!(
        !outside.contains("***"),
        "{what}: a mask outside an address: {out}"
    );
}

/// doctor, a `-v` run of a job and `status` with `url`, whose password is `pw`.
fn plain_words(url: &str, pw: &str) {
    let doctor = on(url).arg("doctor").output();
    let out = printed(&doctor);
    assert!(
        matches!(doctor.out.status.code(), Some(0 | 1)),
        "doctor with {pw:?}: {out}"
    );
    masked_only_in_addresses(&format!("doctor with {pw:?}"), pw, &out);
    // Each check's own verdict comes out whole, "ok" among them.
    assert!(
        doctor.stdout().lines().any(|l| l.starts_with("ok  ")),
        "doctor with {pw:?} gave no check as ok: {out}"
    );

    let run = on(url)
        .args(["-v", "--ttl", "10s", "nox", "--", "true"])
        .succeeds();
    let err = run.stderr();
    masked_only_in_addresses(&format!("-v run with {pw:?}"), pw, &err);
    assert!(err.contains("acquired nox"), "-v run with {pw:?}: {err}");
    assert!(err.contains("exited with 0"), "-v run with {pw:?}: {err}");

    for args in [
        vec!["status", "nox"],
        vec!["status"],
        vec!["status", "--json", "nox"],
    ] {
        let ran = on(url).args(&args).output();
        let out = printed(&ran);
        masked_only_in_addresses(&format!("{args:?} with {pw:?}"), pw, &out);
        assert!(
            args.len() == 1 || out.contains("nox"),
            "{args:?} with {pw:?}: {out}"
        );
    }
}

/// Passwords of one or a few letters found in lockrun's words ("lock",
/// "ok", "x"): each masked in the address shown, and no word garbled.
pub fn short_passwords_garble_no_word(e: &dyn Fixture) {
    for pw in SHORT {
        let Some(url) = e.with_password(pw) else {
            return;
        };
        plain_words(&url, pw);
    }
}

/// A password in the URL, given as `LOCKRUN_URL` (as lockrun(1)
/// recommends) or `--url`, is in no line of a `-vv` run, of a request
/// refused, of `status`, `doctor` or `release --force`, and not in the
/// job's environment; the address is shown masked. A wrong one is not
/// shown either.
pub fn the_password_is_never_printed_nor_given_to_the_job(e: &dyn Fixture) {
    let Some(url) = e.with_password(LONG) else {
        return;
    };
    let scratch = Scratch::new();
    let holder = lockrun()
        .env("LOCKRUN_URL", &url)
        .args(["-vv", "--ttl", "3s", "p", "-c"])
        .arg(format!(
            "echo $$ > {}; env; echo url=$LOCKRUN_URL; exec sleep 60",
            scratch.path("pid").display()
        ))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    scratch.pid_in("pid");
    let mut seen = Vec::new();
    for args in [
        &["-vv", "-n", "p", "true"][..],
        &["-vv", "status", "p"],
        &["status", "--json", "p"],
        &["status"],
        &["status", "--json"],
        &["doctor"],
        &["-v", "doctor"],
        &["--ttl", "nonsense", "p", "true"],
    ] {
        let ran = on(&url).args(args).output();
        assert!(!printed(&ran).is_empty(), "{args:?} said nothing");
        seen.push((format!("{args:?}"), printed(&ran)));
    }
    let mut holder = holder;
    if e.breaks() {
        let ran = on(&url)
            .args(["-vv", "release", "--force", "--now", "p"])
            .output();
        seen.push(("release --force --now".into(), printed(&ran)));
    } else {
        stop(&mut holder);
    }
    let out = holder.wait_with_output().unwrap();
    let err = text(&out.stderr);
    assert!(
        err.contains("***"),
        "the -vv holder showed no masked address: {err}"
    );
    seen.push(("the holder and its job".into(), text(&out.stdout) + &err));
    // A wrong password: refused or not, never shown.
    let wrong = url.replace(LONG, &format!("wrong-{LONG}"));
    for args in [&["doctor"][..], &["-vv", "-w", "0", "p", "true"]] {
        let ran = on(&wrong).args(args).output();
        seen.push((format!("{args:?} with a wrong password"), printed(&ran)));
    }
    for (what, all) in seen {
        assert!(!all.contains(LONG), "{what} showed the password: {all}");
    }
}

/// A URL this engine cannot read is refused with 64 in one line naming
/// `--url`, within two seconds (nothing is contacted), without the
/// password it carries, and no job runs.
pub fn bad_urls_are_refused_with_one_line_and_no_password(e: &dyn Fixture) {
    let scratch = Scratch::new();
    let ran = scratch.path("ran");
    for url in e.bad_urls() {
        let started = Instant::now();
        let out = on(&url)
            .args(["x", "-c", &format!("touch {}", ran.display())])
            .output();
        let err = out.stderr();
        assert_eq!(out.out.status.code(), Some(64), "{url}: {err}");
        assert_eq!(err.lines().count(), 1, "{url}: not one line: {err}");
        assert!(err.contains("--url"), "{url}: {err}");
        assert!(!printed(&out).contains("s3cret"), "{url}: {err}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{url}: refused after {:?}",
            started.elapsed()
        );
    }
    assert!(!ran.exists(), "a job ran with a bad URL");
}

/// A user with only the rights lockrun-engines(7) gives runs a job, holds
/// and is refused beside a holder, reads `status`, waits and is handed the
/// name when `release --force` breaks the holder, shares with `-s`, and
/// lists every name.
pub fn the_rights_the_manual_lists_are_enough(e: &dyn Fixture) {
    let Some(url) = e.documented_user() else {
        return;
    };
    let token = on(&url)
        .args(["x", "-c", "echo $LOCKRUN_TOKEN"])
        .succeeds()
        .stdout();
    assert!(token.trim().parse::<u64>().unwrap() > 0, "token {token:?}");
    let scratch = Scratch::new();
    let mut h = on(&url)
        .args(["--ttl", "3s", "g", "-c"])
        .arg(format!(
            "echo $$ > {}; exec sleep 60",
            scratch.path("pid").display()
        ))
        .spawn();
    scratch.pid_in("pid");
    on(&url).args(["-n", "g", "true"]).code(75);
    on(&url).args(["status", "g"]).code(0);
    let mut waiter = on(&url).args(["-q", "g", "true"]).spawn();
    wait_queued(&url, "g", 1);
    if e.breaks() {
        on(&url).args(["release", "--force", "g"]).succeeds();
        assert_eq!(wait_child(&mut h, Duration::from_secs(20)).code(), Some(76));
    } else {
        assert_eq!(stop(&mut h), Some(143));
    }
    assert_eq!(
        wait_child(&mut waiter, Duration::from_secs(20)).code(),
        Some(0)
    );
    on(&url).args(["-s", "g", "true"]).succeeds();
    on(&url).arg("status").code(1);
    let _held = crate::operators::hold_name(&url, "listed");
    let listed = on(&url).arg("status").code(0).stdout();
    assert!(listed.contains("listed: held by"), "{listed}");
}
