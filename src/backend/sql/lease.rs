//! A lease on an SQL database: our row, the connection it was granted on
//! (release needs no new connect), and its renewal from any connection,
//! each renewer on one of its own. The dialect says how a row is renewed
//! and released.

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
    client: D::Client,
    ours: Ours<D>,
    /// `--min-hold`: the release keeps the row until the grant plus this.
    min_hold: Option<Duration>,
    /// The first renewer's connection, where the dialect opened one at the
    /// grant: a user whose connections are capped and then all taken by
    /// waiters still renews.
    spare: Arc<Mutex<Option<D::Client>>>,
}

impl<D: Dialect> SqlHeld<D> {
    pub fn new(
        client: D::Client,
        tables: &D,
        req: &Request,
        slot: u32,
        spare: Option<D::Client>,
    ) -> SqlHeld<D> {
        SqlHeld {
            client,
            ours: Ours {
                tables: tables.clone(),
                name: req.name.to_string(),
                slot,
                owner: req.owner.secret.clone(),
                ttl_ms: req.timing.ttl.as_millis() as i64,
            },
            min_hold: req.min_hold,
            spare: Arc::new(Mutex::new(spare)),
        }
    }
}

impl<D: Dialect> Held for SqlHeld<D> {
    fn renewer(&self) -> Renewing {
        // Any connection can extend the row: each renewer opens its own.
        let (client, ours) = (D::fresh(&self.client), self.ours.clone());
        let spare = Arc::clone(&self.spare);
        Renewing::Anywhere(Box::new(move || {
            let opened = spare.lock().ok().and_then(|mut s| s.take());
            Box::new(SqlRenewer {
                client: opened.unwrap_or_else(|| D::fresh(&client)),
                ours: ours.clone(),
            })
        }))
    }

    fn release(mut self: Box<Self>, window: MinHold) -> Result<bool, Error> {
        self.min_hold = window.of(self.min_hold);
        let o = &self.ours;
        let doing = format!("releasing {}", o.name);
        let window = window_us(self.min_hold);
        let (kept, ours) = o
            .tables
            .release(&mut self.client, o, window)
            .map_err(|e| self.client.as_ref().failed(&doing, e))?;
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
    client: D::Client,
    ours: Ours<D>,
}

impl<D: Dialect> Renewer for SqlRenewer<D> {
    fn renew(&mut self) -> Result<Renewal, Error> {
        let o = &self.ours;
        // Extended only while the row is still ours and unexpired on the
        // server's clock; no row means lost.
        let label = match o.tables.renew(&mut self.client, o) {
            Ok(label) => label,
            // The table (or schema) is gone, and our row with it.
            Err(_) if D::missing(&self.client) => None,
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
