//! The policy's decisions, with a fake clock and a fake process table.

use super::*;

fn timing() -> Timing {
    Timing::new(Duration::from_secs(3), None).unwrap()
}

fn at(ms: u64) -> Boot {
    Boot(Duration::from_secs(1000) + Duration::from_millis(ms))
}

fn signals(actions: &[Action], sig: i32) -> Vec<i32> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Signal(p, s) if *s == sig => Some(p.clone()),
            _ => None,
        })
        .flatten()
        .collect()
}

#[test]
fn terminal_keys_are_not_forwarded_twice() {
    let mut p = Policy::new(timing(), true);
    let int = |t| Event::Signal {
        sig: libc::SIGINT,
        from_terminal: t,
    };
    assert!(p.on(int(true), at(0)).is_empty());
    assert_eq!(p.on(int(false), at(0)), [Action::Forward(libc::SIGINT)]);
    // Without a shared group, a signal always goes on to the job.
    let mut p = Policy::new(timing(), false);
    assert_eq!(p.on(int(true), at(0)), [Action::Forward(libc::SIGINT)]);
}

#[test]
fn only_the_terminal_suspends_lockrun() {
    let mut p = Policy::new(timing(), true);
    let stop = |sig, t| Event::Signal {
        sig,
        from_terminal: t,
    };
    assert_eq!(
        p.on(stop(libc::SIGTSTP, true), at(0)),
        [Action::Suspend(libc::SIGTSTP)]
    );
    assert_eq!(
        p.on(stop(libc::SIGTTIN, true), at(0)),
        [Action::Suspend(libc::SIGTTIN)]
    );
    // `kill -TSTP lockrun` stops the job, never lockrun.
    assert_eq!(
        p.on(stop(libc::SIGTSTP, false), at(0)),
        [Action::Forward(libc::SIGTSTP)]
    );
    assert!(p.on(stop(libc::SIGTTOU, false), at(0)).is_empty());
}

#[test]
fn loss_terms_everything_then_kills_before_expiry() {
    let t = timing();
    let mut p = Policy::new(t, false);
    let deadline = at(3000);
    let procs = [10, 11, 12];
    assert!(p.on(Event::Lost("gone".into()), at(1000)).is_empty());
    let a = p.tick(at(1000), Some(deadline), &procs);
    assert_eq!(signals(&a, libc::SIGTERM), procs);
    assert_eq!(signals(&a, libc::SIGCONT), procs);
    assert!(signals(&a, libc::SIGKILL).is_empty());
    // A process forked during the grace gets SIGTERM too, once.
    let a = p.tick(at(1100), Some(deadline), &[10, 11, 12, 13]);
    assert_eq!(signals(&a, libc::SIGTERM), [13]);
    // SIGKILL after the grace (ttl/10), to whatever is there then.
    let kill = at(1000).add(t.grace);
    assert!(
        signals(
            &p.tick(kill.sub(Duration::from_millis(1)), Some(deadline), &procs),
            libc::SIGKILL
        )
        .is_empty()
    );
    assert_eq!(
        signals(&p.tick(kill, Some(deadline), &procs), libc::SIGKILL),
        procs
    );
    assert_eq!(
        signals(&p.tick(kill, Some(deadline), &[14]), libc::SIGKILL),
        [14]
    );
    let o = p.outcome();
    assert_eq!(o.lost.as_deref(), Some("gone"));
}

#[test]
fn the_kill_comes_slack_before_expiry_even_with_a_long_grace() {
    let t = Timing::new(Duration::from_secs(10), Some(Duration::from_secs(2))).unwrap();
    let mut p = Policy::new(t, false);
    let deadline = at(2500);
    p.on(Event::Lost("x".into()), at(1000));
    let kill_at = deadline.sub(t.slack);
    assert!(kill_at < at(1000).add(t.grace));
    assert!(signals(&p.tick(kill_at, Some(deadline), &[5]), libc::SIGKILL) == [5]);
}

#[test]
fn a_missed_deadline_is_a_loss() {
    let t = timing();
    let mut p = Policy::new(t, false);
    let deadline = at(3000);
    assert_eq!(
        p.next_tick(at(0), Some(deadline)),
        Some(t.lost_at(deadline))
    );
    assert!(
        p.tick(
            t.lost_at(deadline).sub(Duration::from_millis(1)),
            Some(deadline),
            &[]
        )
        .is_empty()
    );
    p.tick(t.lost_at(deadline), Some(deadline), &[7]);
    assert!(p.outcome().lost.is_some());
}

#[test]
fn no_deadline_means_no_loss_by_time() {
    let mut p = Policy::new(timing(), false);
    assert_eq!(p.next_tick(at(0), None), None);
    assert!(p.tick(at(1_000_000), None, &[]).is_empty());
    p.on(Event::JobEnded(JobEnd::Exited(0)), at(0));
    let o = p.outcome();
    assert_eq!(o.lost, None);
    assert_eq!(o.end, Some(JobEnd::Exited(0)));
}

#[test]
fn leftovers_get_term_then_kill_after_the_grace() {
    let t = timing();
    let mut p = Policy::new(t, false);
    p.on(Event::JobEnded(JobEnd::Exited(3)), at(0));
    let a = p.tick(at(0), None, &[20]);
    assert_eq!(signals(&a, libc::SIGTERM), [20]);
    let a = p.tick(at(100), None, &[20, 21]);
    assert_eq!(signals(&a, libc::SIGTERM), [21]);
    let a = p.tick(at(0).add(t.grace), None, &[20, 21]);
    assert_eq!(signals(&a, libc::SIGKILL), [20]);
    let a = p.tick(at(100).add(t.grace), None, &[21]);
    assert_eq!(signals(&a, libc::SIGKILL), [21]);
    let a = p.tick(at(100).add(t.grace).add(UNKILLABLE_AFTER), None, &[21]);
    assert!(matches!(a.as_slice(), [Action::Alert(_)]), "{a:?}");
    assert_eq!(p.outcome().end, Some(JobEnd::Exited(3)));
}

#[test]
fn a_failure_after_the_start_stops_the_job_and_reports_it() {
    let mut p = Policy::new(timing(), false);
    p.on(Event::Failed("no thread".into()), at(0));
    let a = p.tick(at(0), None, &[1234]);
    assert_eq!(signals(&a, libc::SIGTERM), [1234]);
    // A later loss does not change why.
    p.on(Event::Lost("x".into()), at(1));
    let o = p.outcome();
    assert_eq!(o.failed.as_deref(), Some("no thread"));
    assert_eq!(o.lost, None);
}

#[test]
fn a_big_tree_is_lost_and_killed_earlier_by_its_cost() {
    let t = timing();
    let deadline = at(3000);
    let mut p = Policy::new(t, false);
    let plain = p.lost_at(deadline);
    // 2,000 processes found in 20 ms: 20 ms + 2,000 × the teardown.
    p.measured(2000, Duration::from_millis(20));
    let cost = Duration::from_millis(20) + DEATH_PER_PROCESS * 2000;
    assert_eq!(p.lost_at(deadline), plain.sub(cost));
    assert!(
        p.check_time(
            p.lost_at(deadline).sub(Duration::from_millis(1)),
            Some(deadline)
        )
        .is_empty()
    );
    assert!(!p.is_stopping());
    p.check_time(p.lost_at(deadline), Some(deadline));
    assert_eq!(p.walk(p.lost_at(deadline), Some(deadline)), Walk::Freeze);
    let a = p.tick(p.lost_at(deadline), Some(deadline), &[10, 11]);
    assert_eq!(signals(&a, libc::SIGTERM), [10, 11]);
    // SIGKILL after the full grace, which still ends `slack + cost` early.
    let kill = plain.sub(cost).add(t.grace);
    assert_eq!(kill, deadline.sub(t.slack + cost));
    assert_eq!(
        p.walk(kill.sub(Duration::from_millis(1)), Some(deadline)),
        Walk::Freeze
    );
    assert_eq!(p.walk(kill, Some(deadline)), Walk::Kill);
    assert_eq!(
        signals(&p.tick(kill, Some(deadline), &[10]), libc::SIGKILL),
        [10]
    );
}

#[test]
fn a_tree_too_big_for_the_ttl_is_killed_at_once_and_named() {
    let t = timing();
    let deadline = at(3000);
    let mut p = Policy::new(t, false);
    // Far more than the 3 s lease leaves: the loss comes as early as
    // the renewals allow, with no grace, and a line says which ttl fits.
    p.measured(20_000, Duration::from_millis(300));
    let a = p.tick(at(0), Some(deadline), &[]);
    match a.as_slice() {
        [Action::Alert(m)] => assert!(
            m.contains("20000 processes") && m.contains("--ttl 13s"),
            "{m}"
        ),
        other => panic!("{other:?}"),
    }
    assert!(p.tick(at(1), Some(deadline), &[]).is_empty(), "said once");
    let lost = t.lost_at(deadline).sub(t.spare());
    p.check_time(lost, Some(deadline));
    assert_eq!(p.walk(lost, Some(deadline)), Walk::Kill);
    let a = p.tick(lost, Some(deadline), &[10]);
    assert_eq!(signals(&a, libc::SIGKILL), [10]);
    // Without a lease that can expire there is nothing to warn about.
    let mut p = Policy::new(t, false);
    p.measured(20_000, Duration::from_millis(300));
    assert!(p.tick(at(0), None, &[]).is_empty());
}

#[test]
fn a_walk_freezes_only_what_was_not_told_yet() {
    let mut p = Policy::new(timing(), false);
    assert_eq!(p.walk(at(0), None), Walk::List);
    p.on(Event::Lost("x".into()), at(0));
    assert_eq!(p.walk(at(0), None), Walk::Freeze);
    p.tick(at(0), None, &[10]);
    assert!(p.knows(10) && !p.knows(11));
}

#[test]
fn a_cheaper_walk_never_takes_a_loss_back() {
    let t = timing();
    let deadline = at(3000);
    let mut p = Policy::new(t, false);
    p.measured(4000, Duration::from_millis(50));
    let lost = p.lost_at(deadline);
    // Lost by time, before the walk; the walk freezes what it finds and
    // then measures a job that shrank: the loss stands, and everything
    // frozen gets SIGTERM and SIGCONT.
    p.check_time(lost, Some(deadline));
    assert_eq!(p.walk(lost, Some(deadline)), Walk::Freeze);
    p.measured(1, Duration::from_micros(10));
    assert!(!p.loses(lost, Some(deadline)));
    let a = p.tick(lost, Some(deadline), &[10]);
    assert_eq!(signals(&a, libc::SIGTERM), [10]);
    assert_eq!(signals(&a, libc::SIGCONT), [10]);
    assert!(p.is_stopping());
}

#[test]
fn a_walk_sends_what_tick_decides() {
    let t = timing();
    let mut p = Policy::new(t, false);
    assert_eq!(p.signals_for(10, at(0), None), (NONE, NONE));
    // Leftovers: SIGTERM when found, SIGKILL after the grace.
    p.on(Event::JobEnded(JobEnd::Exited(0)), at(0));
    assert_eq!(p.signals_for(10, at(0), None), (NONE, TERM));
    assert_eq!(signals(&p.tick(at(0), None, &[10]), libc::SIGTERM), [10]);
    assert_eq!(p.signals_for(10, at(1), None), (NONE, NONE));
    let later = at(0).add(t.grace);
    assert_eq!(p.signals_for(10, later, None), (KILL, NONE));
    assert_eq!(signals(&p.tick(later, None, &[10]), libc::SIGKILL), [10]);
    // On loss: frozen when found, SIGTERM and SIGCONT once its children
    // are read; SIGKILL from the kill point on.
    p.on(Event::Lost("x".into()), at(5));
    assert_eq!(p.signals_for(10, at(5), None), (FREEZE, TERM));
    assert_eq!(signals(&p.tick(at(5), None, &[10]), libc::SIGTERM), [10]);
    assert_eq!(p.signals_for(10, at(6), None), (NONE, NONE));
    let kill = at(5).add(t.grace);
    assert_eq!(p.signals_for(10, kill, None), (KILL, NONE));
    assert_eq!(signals(&p.tick(kill, None, &[10]), libc::SIGKILL), [10]);
}
