//! A lease on an SQL database: our row, the connections it keeps from its
//! grant on (the one it was granted on and a spare), lent to its renewals
//! and its release so that neither needs a new connection, and renewal
//! from any connection. The dialect says how a row is renewed and
//! released.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::Dialect;
use crate::backend::table::split_label;
use crate::backend::{Error, Held, MinHold, Renewal, Renewer, Renewing, Request};
use crate::log;

/// Our row: which name and slot, and the owner value that proves it ours.
#[derive(Clone)]
pub struct Ours<D> {
    pub tables: D,
    pub name: String,
    pub slot: u32,
    pub owner: String,
    pub ttl_ms: i64,
}

/// A granted lease.
pub struct SqlHeld<D: Dialect> {
    /// A client never connected: new connections are made from it.
    unconnected: D::Client,
    ours: Ours<D>,
    /// `--min-hold`: the release keeps the row until the grant plus this.
    min_hold: Option<Duration>,
    /// The lease's connections, lent to each renewal and to the release.
    kept: Arc<Mutex<Kept<D::Client>>>,
}

/// The connections a lease keeps from its grant on, so that neither its
/// renewals nor its release need a connection the server may not have to
/// give (a fleet of waiters can take every one): the one it was granted on
/// and a spare opened beside the job. A renewal borrows the spare first (a
/// renewal stuck on one leaves the other), the release the grant's (it
/// holds what wakes the next waiter); a new connection is made only when
/// both are out, with an attempt left behind.
struct Kept<C> {
    grant: Option<C>,
    spare: Option<C>,
}

/// Which of the lease's connections a client was, to give it back there.
#[derive(Clone, Copy)]
enum Lent {
    Grant,
    Spare,
    New,
}

impl<C> Kept<C> {
    /// One of the lease's connections, if one is in: for the release the
    /// grant's first, for a renewal the spare first.
    fn lend(kept: &Mutex<Kept<C>>, release: bool) -> Option<(C, Lent)> {
        let mut k = kept.lock().unwrap_or_else(|e| e.into_inner());
        let grant = |k: &mut Kept<C>| k.grant.take().map(|c| (c, Lent::Grant));
        let spare = |k: &mut Kept<C>| k.spare.take().map(|c| (c, Lent::Spare));
        if release {
            grant(&mut k).or_else(|| spare(&mut k))
        } else {
            spare(&mut k).or_else(|| grant(&mut k))
        }
    }

    /// Back where it came from; a new one becomes the spare if there is none.
    fn give_back(kept: &Mutex<Kept<C>>, c: C, from: Lent) {
        let mut k = kept.lock().unwrap_or_else(|e| e.into_inner());
        let slot = match from {
            Lent::Grant => &mut k.grant,
            Lent::Spare | Lent::New => &mut k.spare,
        };
        if slot.is_none() {
            *slot = Some(c);
        }
    }
}

impl<D: Dialect> SqlHeld<D> {
    /// `client` is the connection the lease was granted on (it may have
    /// none left, when the dialect could not keep it). `open` opens the
    /// spare on a client of its own (None: it could not), on a thread of
    /// its own: the job need not wait for it, and the first renewal is a
    /// third of the ttl away.
    pub fn new(
        client: D::Client,
        tables: &D,
        req: &Request,
        slot: u32,
        open: impl FnOnce(D::Client) -> Option<D::Client> + Send + 'static,
    ) -> SqlHeld<D> {
        let held = SqlHeld {
            unconnected: D::fresh(&client),
            ours: Ours {
                tables: tables.clone(),
                name: req.name.to_string(),
                slot,
                owner: req.owner.secret.clone(),
                ttl_ms: req.timing.ttl.as_millis() as i64,
            },
            min_hold: req.min_hold,
            kept: Arc::new(Mutex::new(Kept {
                grant: Some(client),
                spare: None,
            })),
        };
        let (kept, unconnected) = (Arc::clone(&held.kept), D::fresh(&held.unconnected));
        // Best effort: without a thread, or a connection, there is no spare.
        let _ = std::thread::Builder::new()
            .name("lockrun-spare".into())
            .spawn(move || {
                if let Some(spare) = open(unconnected) {
                    Kept::give_back(&kept, spare, Lent::New);
                }
            });
        held
    }
}

impl<D: Dialect> Held for SqlHeld<D> {
    fn renewer(&self) -> Renewing {
        // Any connection can extend the row: each renewal borrows one of
        // the lease's, or makes its own when both are out.
        let (unconnected, ours) = (D::fresh(&self.unconnected), self.ours.clone());
        let kept = Arc::clone(&self.kept);
        Renewing::Anywhere(Box::new(move || {
            Box::new(SqlRenewer {
                unconnected: D::fresh(&unconnected),
                kept: Arc::clone(&kept),
                ours: ours.clone(),
            })
        }))
    }

    fn release(mut self: Box<Self>, window: MinHold) -> Result<bool, Error> {
        self.min_hold = window.of(self.min_hold);
        let o = &self.ours;
        let doing = format!("releasing {}", o.name);
        let window = window_us(self.min_hold);
        let (mut client, _) = Kept::lend(&self.kept, true)
            .unwrap_or_else(|| (D::fresh(&self.unconnected), Lent::New));
        let (kept, ours) = o
            .tables
            .release(&mut client, o, window)
            .map_err(|e| client.as_ref().failed(&doing, e))?;
        if kept {
            log::info(format!(
                "released {}; kept by --min-hold until {} after its grant",
                o.name,
                crate::text::duration(self.min_hold.unwrap_or_default())
            ));
        } else {
            log::info(format!("released {}", o.name));
        }
        Ok(ours)
    }
}

/// A release's window (`--min-hold`) in whole µs, the servers'
/// resolution, rounded up: it ends no sooner than asked.
fn window_us(min_hold: Option<Duration>) -> i64 {
    min_hold.map_or(0, |d| {
        i64::try_from(d.as_nanos().div_ceil(1000)).unwrap_or(i64::MAX)
    })
}

struct SqlRenewer<D: Dialect> {
    unconnected: D::Client,
    kept: Arc<Mutex<Kept<D::Client>>>,
    ours: Ours<D>,
}

impl<D: Dialect> Renewer for SqlRenewer<D> {
    fn renew(&mut self) -> Result<Renewal, Error> {
        let (mut client, from) = Kept::lend(&self.kept, false)
            .unwrap_or_else(|| (D::fresh(&self.unconnected), Lent::New));
        let o = &self.ours;
        // Extended only while the row is still ours and unexpired on the
        // server's clock; no row means lost.
        let renewed = o.tables.renew(&mut client, o);
        let missing = renewed.is_err() && D::missing(&client);
        // Given back also when it broke: it connects again at its next use.
        Kept::give_back(&self.kept, client, from);
        let label = match renewed {
            Ok(label) => label,
            // The table (or schema) is gone, and our row with it.
            Err(_) if missing => None,
            Err(e) => return Err(e),
        };
        let Some(label) = label else {
            return Ok(Renewal::Lost);
        };
        // Renewed all the same: the lease stays ours while the job stops.
        if let (_, Some(by)) = split_label(&label) {
            return Ok(Renewal::Preempted { by: by.to_string() });
        }
        Ok(Renewal::Renewed {
            ttl: Duration::from_millis(o.ttl_ms as u64),
        })
    }
}
