//! Single flight: concurrent identical `begin` calls in one process share one
//! query.
//!
//! When a request in progress completes, its `NOTIFY` wakes every duplicate
//! waiting on it and each calls `begin` again; without coalescing, N waiters queue
//! N identical queries behind the pool (999 queries through 16 connections: tens
//! of milliseconds). Here the first `begin` for a `(key, fingerprint)` leads a
//! *flight*; calls that arrive while the flight is open follow it and take its
//! answer instead of querying.
//!
//! - **Linearizable**: a flight stops taking followers just before its leader
//!   sends the statement ([`Leader::close`]). Every follower therefore started
//!   before the statement ran and ends after its answer arrived, so the answer
//!   describes the record at a moment inside the follower's own call. (Joining a
//!   flight whose statement was already sent could hand out an answer older than
//!   the call, e.g. "in progress" for a record that completed just before it.)
//!   Later calls start a new flight, which takes followers while it waits for a
//!   pooled connection: exactly when the pool is the bottleneck.
//! - **Shared**: `Replay`, `KeyReused` and `InProgress` answers. Never a claim: one
//!   token has one owner, so followers of a leader that claimed coalesce again
//!   (their next answer is `InProgress` for all of them).
//! - **Not shared**: errors, and nothing at all when the leader's future is
//!   dropped (cancelled, timed out). Its followers see the channel close and run
//!   their own query; nobody waits on a flight that will never land, and no answer
//!   is made up.
//!
//! It always coalesces, not only after a wake-up: the store cannot tell a woken
//! waiter's `begin` from a new request's (the layer calls the same method), a
//! burst of new duplicates queues up the same way, and the uncontended cost is
//! two short map operations and one small allocation next to a ~100 µs round trip.

use crate::store::{Begin, RecordKey};
use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use tokio::sync::watch;

/// A call's identity: only calls with the same key and canonical fingerprint
/// would get the same answer.
type FlightKey = (RecordKey, [u8; 32]);

/// What a flight's leader hands its followers; `None` until it lands.
type Landing = Option<Landed>;

#[derive(Clone)]
pub(super) enum Landed {
    /// A read-only answer, valid for every follower.
    Shared(Begin),
    /// The leader claimed the key: the answer is its own; query again.
    Claimed,
}

/// The open flights of one store.
#[derive(Default)]
pub(super) struct Flights {
    open: DashMap<FlightKey, watch::Receiver<Landing>>,
}

pub(super) enum Join<'a> {
    /// No open flight: run the query, then [`land`](Leader::land).
    Lead(Leader<'a>),
    /// An open flight: wait for its [`landing`](Follower::landing).
    Follow(Follower),
}

impl Flights {
    /// Leads a new flight for `(key, fingerprint)`, or follows the open one.
    pub(super) fn join(&self, key: &RecordKey, fingerprint: &[u8; 32]) -> Join<'_> {
        let id = (key.clone(), *fingerprint);
        match self.open.entry(id.clone()) {
            Entry::Occupied(open) => Join::Follow(Follower {
                landing: open.get().clone(),
            }),
            Entry::Vacant(vacant) => {
                let (tx, rx) = watch::channel(None);
                vacant.insert(rx);
                Join::Lead(Leader {
                    flights: self,
                    id: Some(id),
                    tx,
                })
            }
        }
    }

    /// Flights taking followers.
    #[cfg(feature = "test-util")]
    pub(super) fn open(&self) -> usize {
        self.open.len()
    }
}

/// The call that runs the query. Dropping it without landing (an error, or the
/// future cancelled) closes the channel: followers then query for themselves.
pub(super) struct Leader<'a> {
    flights: &'a Flights,
    /// `Some` while the flight takes followers.
    id: Option<FlightKey>,
    tx: watch::Sender<Landing>,
}

impl Leader<'_> {
    /// Stops taking followers: call just before the statement is sent.
    pub(super) fn close(&mut self) {
        if let Some(id) = self.id.take() {
            // While open, the id's entry is this flight's: only its leader removes
            // it, and nobody inserts over an occupied entry.
            self.flights.open.remove(&id);
        }
    }

    /// Hands the answer to the followers: a read-only one as is, a claim as
    /// [`Landed::Claimed`]; an error (`None`) as nothing (dropping the sender).
    pub(super) fn land(mut self, begun: Option<&Begin>) {
        self.close();
        let landed = match begun {
            Some(Begin::Claimed(_)) => Landed::Claimed,
            Some(answer) => Landed::Shared(answer.clone()),
            None => return,
        };
        // No receivers (no followers) is fine.
        let _ = self.tx.send(Some(landed));
    }
}

impl Drop for Leader<'_> {
    fn drop(&mut self) {
        self.close();
    }
}

/// A call waiting for another call's query.
pub(super) struct Follower {
    landing: watch::Receiver<Landing>,
}

impl Follower {
    /// The leader's answer, or `None` if it failed or was dropped.
    pub(super) async fn landing(mut self) -> Option<Landed> {
        // A value sent before the sender was dropped is still seen.
        let landed = self.landing.wait_for(Option::is_some).await.ok()?;
        landed.clone()
    }
}
