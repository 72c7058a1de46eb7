//! A waiter ended by a signal it can catch (SIGINT, SIGTERM, SIGHUP,
//! SIGQUIT) leaves the queue first, then dies of the signal as it would
//! have (lockrun(1) "Waiting"). Engines block in waits of their own (a
//! blocking read, a LISTEN, a watch, GET_LOCK), so the main thread is not
//! asked to notice: while a request waits, a thread of its own hears the
//! signal and runs the engine's way out, on a connection of the engine's
//! own, within the request's op time. The way out takes a grant of ours
//! too: the main thread may be granted at that very moment. The main
//! thread (the driver, `drive.rs`) starts no further look or wait
//! meanwhile; one already under way may still make one more call, which
//! the way out, sent later, normally follows (on the SQL engines it waits
//! for the name's lock to do so).
//! Before a request joins a queue, and for one that never waits (`-n`), a
//! signal ends lockrun as it always did.
//!
//! The watcher lives from the moment the request waits until the job's own
//! handling of signals is in place (`disarm`, before the job starts): a
//! signal in between gives back a grant just made.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM};
use signal_hook::iterator::{Handle, Signals};

use super::{Error, bounded};
use crate::log;

/// An engine's way out of the queue for this request: from a fresh
/// connection of its own, remove every place and grant of the request's
/// owner. The caller bounds it.
pub type Leave = Box<dyn FnOnce() -> Result<(), Error> + Send>;

/// The signals a waiter leaves on: those that end it and that it can catch.
const QUITS: [i32; 4] = [SIGHUP, SIGINT, SIGQUIT, SIGTERM];

/// The way out of the request of the moment, and its bound.
type WayOut = Arc<Mutex<Option<(Leave, Duration)>>>;

struct Watcher {
    handle: Handle,
    thread: JoinHandle<()>,
    way_out: WayOut,
}

static WATCHER: Mutex<Option<Watcher>> = Mutex::new(None);

/// A signal came: the watcher is leaving, and lockrun ends with it.
static LEAVING: AtomicBool = AtomicBool::new(false);

/// From now until `disarm`, a signal in `QUITS` runs `leave` (within `op`)
/// and then ends lockrun as the signal would have. A later call, for a new
/// request of the same run, replaces the way out. When no watcher can be
/// had, signals end lockrun as before.
pub fn arm(leave: Leave, op: Duration) {
    let mut watcher = WATCHER.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(w) = watcher.as_ref() {
        *w.way_out.lock().unwrap_or_else(PoisonError::into_inner) = Some((leave, op));
        return;
    }
    // A signal ignored when lockrun started (nohup, a background job of a
    // shell) stays ignored.
    let sigs: Vec<i32> = QUITS
        .into_iter()
        .filter(|&s| !crate::sys::is_ignored(s))
        .collect();
    if sigs.is_empty() {
        return;
    }
    let Ok(mut signals) = Signals::new(&sigs) else {
        return;
    };
    let handle = signals.handle();
    let way_out: WayOut = Arc::new(Mutex::new(Some((leave, op))));
    let theirs = Arc::clone(&way_out);
    let started = std::thread::Builder::new()
        .name("lockrun-quit".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                quit(sig, &theirs);
            }
        });
    match started {
        Ok(thread) => {
            *watcher = Some(Watcher {
                handle,
                thread,
                way_out,
            });
        }
        // Unregistered as it goes: the signals end lockrun by default again.
        Err(_) => handle.close(),
    }
}

/// The job's own handling of signals is in place: the watcher goes, and
/// nothing of it stays registered. A signal it heard already ends lockrun
/// here, once its way out is done.
pub fn disarm() {
    let watcher = WATCHER
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();
    if let Some(w) = watcher {
        w.handle.close();
        let _ = w.thread.join();
        // The last owner of the registration: dropped, it unregisters.
        drop(w.handle);
    }
}

/// Called by a request's main thread between its calls to the server:
/// once the watcher is leaving, it makes none (one would take back a place
/// just given up), and waits to end with the signal.
pub fn stay_if_leaving() {
    while LEAVING.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Leave the queue, then die of `sig`.
fn quit(sig: i32, way_out: &WayOut) {
    LEAVING.store(true, Ordering::SeqCst);
    let way = way_out
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();
    if let Some((leave, op)) = way
        && let Err(e) = bounded("leaving the queue", op, leave)
    {
        log::info(format!("{e}; the place lapses on its own"));
    }
    // The default action, raised on ourselves: SIGQUIT dumps core as it would have.
    let _ = signal_hook::low_level::emulate_default_handler(sig);
}
