//! The claimed run, written once for every front door: the plain or
//! transactional branch, the transaction opened and shared, the claim kept
//! alive, and the one ordering each ending depends on (commit, then keep; or
//! roll back, then release; "outcome unknown" when a commit's fate is not
//! known).
//!
//! A door hands [`Claimed::run`] its [`Work`]; the work gets a [`Finish`] and
//! ends with one of its methods, which say what became of the claim: nothing
//! to keep ([`Finish::release`]), a result to record ([`Finish::record`]), a
//! key kept without one ([`Finish::unavailable`], [`Finish::failed`]), or a
//! recording that follows the answer ([`Finish::hand_over`], plain mode).

use super::attempt::Attempt;
use super::claim::{open_transaction, ClaimGuard, NotOpened};
use super::in_flight::Running;
use super::keep_alive::kept_alive;
use super::phases::Phases;
use super::recorder::Recorder;
use crate::downstream::DownstreamSecret;
use crate::store::erased::{ErasedTransaction, SharedStore};
use crate::store::{Claim, Completion, RecordKey, StoreError, StoredResponse};
use crate::telemetry;
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// What a front door runs for a claim.
pub(crate) trait Work: Send + 'static {
    /// What the door answers.
    type Output: Send + 'static;

    /// Starts the work; it ends by spending `finish`.
    fn start(self, finish: Finish) -> impl Future<Output = Self::Output> + Send + 'static;

    /// The claim's transaction did not open: the work never ran.
    fn not_run(self, why: NotRun) -> Self::Output;
}

/// Why claimed work never ran.
pub(crate) enum NotRun {
    /// Taken over before it ran (its lock ran out): the new owner runs it.
    TakenOver,
    /// The store failed to open the claim's transaction; the key was freed.
    Failed(StoreError),
}

/// A claim the store granted, not yet run.
pub(crate) struct Claimed {
    record: RecordKey,
    claim: Claim,
    /// In transactional mode, the transaction `begin` may have opened with it.
    opened: Option<Box<dyn ErasedTransaction>>,
}

/// The future [`Claimed::run`] returns: on the heap, to be moved into a task.
pub(crate) type ClaimedRun<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl Claimed {
    pub(crate) fn new(
        record: RecordKey,
        claim: Claim,
        opened: Option<Box<dyn ErasedTransaction>>,
    ) -> Self {
        Self {
            record,
            claim,
            opened,
        }
    }

    pub(crate) fn record(&self) -> &RecordKey {
        &self.record
    }

    pub(crate) fn attempt(&self) -> Attempt {
        Attempt::from(self.claim)
    }

    /// Shares the claim's [`Phases`] with the work through `extensions`
    /// when `store` records phases; nothing (no allocation) otherwise.
    pub(crate) fn share_phases(
        &self,
        store: &SharedStore,
        secret: Option<&DownstreamSecret>,
        extensions: &mut http::Extensions,
    ) {
        Phases::share(store, &self.record, self.claim.token, secret, extensions);
    }

    /// Gives the claim back before any work ran (shed by an in-flight limit).
    pub(crate) async fn shed(self, store: &SharedStore) {
        if let Some(transaction) = self.opened {
            transaction.rollback().await;
        }
        let guard = ClaimGuard::new(store.store().clone(), self.record, self.claim.token);
        guard.release().await;
    }

    /// Runs `work` for this claim, counted as running until it ends: in
    /// transactional mode inside the claim's transaction, otherwise with the
    /// claim extended while it runs. Each mode is its own box, so the plain
    /// one stays as small as its work.
    pub(crate) fn run<W: Work>(
        self,
        store: &SharedStore,
        running: Running,
        work: W,
    ) -> ClaimedRun<W::Output> {
        let span = tracing::Span::current();
        let Self {
            record,
            claim,
            opened,
        } = self;
        let token = claim.token;
        match store.transactions().cloned() {
            // The transaction holds the claim: no heartbeat.
            Some(transactions) => {
                let guard = ClaimGuard::new(store.store().clone(), record, token);
                telemetry::boxed_in_span(
                    async move {
                        let _running = running;
                        match open_transaction(&*transactions, guard, token, opened).await {
                            Ok((claim, transaction)) => {
                                let finish = Finish {
                                    claim,
                                    transaction: Some(transaction),
                                };
                                work.start(finish).await
                            }
                            Err(NotOpened::TakenOver) => work.not_run(NotRun::TakenOver),
                            Err(NotOpened::Failed(error)) => work.not_run(NotRun::Failed(error)),
                        }
                    },
                    span,
                )
            }
            None => {
                let guard = ClaimGuard::new(store.store().clone(), record.clone(), token);
                let finish = Finish {
                    claim: guard,
                    transaction: None,
                };
                let work = kept_alive(work.start(finish), store.store().clone(), record, token);
                telemetry::boxed_in_span(
                    Counted {
                        work,
                        _running: running,
                    },
                    span,
                )
            }
        }
    }
}

pin_project! {
    /// Work counted as running until it ends.
    struct Counted<W> {
        #[pin]
        work: W,
        _running: Running,
    }
}

impl<W: Future> Future for Counted<W> {
    type Output = W::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<W::Output> {
        self.project().work.poll(cx)
    }
}

/// How a claimed run's ending went for its record.
pub(crate) enum Recorded {
    /// Recorded (committed with the work's writes, in transactional mode).
    Yes,
    /// Plain mode: the store refused or failed; a failing store is tried
    /// again in the background, and the claim is kept until its lock
    /// expires, so no retry runs the work again before.
    Failed,
    /// Transactional mode: the commit failed. Rolled back, or (the
    /// connection lost during the commit itself) unknown: then the record
    /// committed with the writes. The work ran either way.
    Unknown(StoreError),
}

/// The claim of running work, spent by how the work ended. Dropped unspent
/// (the work panicked, or its future was dropped), the transaction rolls
/// back and the key is released, in the background.
pub(crate) struct Finish {
    claim: ClaimGuard,
    transaction: Option<Box<dyn ErasedTransaction>>,
}

impl Finish {
    /// Puts the transaction's handle into the work's extensions (nothing in
    /// plain mode).
    pub(crate) fn share(&self, extensions: &mut http::Extensions) {
        if let Some(transaction) = &self.transaction {
            transaction.share(extensions);
        }
    }

    /// Nothing happened that must be kept: the writes roll back, then the
    /// key is freed for a retry.
    pub(crate) async fn release(self) {
        let Self { claim, transaction } = self;
        if let Some(transaction) = transaction {
            transaction.rollback().await;
        }
        claim.release().await;
    }

    /// Keeps the claim for a recording that follows the answer (plain mode:
    /// a body streamed to the caller while it is recorded). In transactional
    /// mode the record is the commit, which must come before the answer:
    /// `Err(self)`.
    pub(crate) fn hand_over(self) -> Result<Recorder, Self> {
        if self.transaction.is_some() {
            return Err(self);
        }
        let store = self.claim.store.clone();
        let (record, token) = self.claim.keep();
        Ok(Recorder::new(store, record, token))
    }

    /// The work ran and answered `stored`: recorded for every retry.
    pub(crate) async fn record(self, stored: StoredResponse) -> Recorded {
        self.complete(Completion::Response(stored), "").await
    }

    /// The work ran but its answer cannot be replayed (too large, trailers):
    /// the key is kept, with the writes, as "response unavailable".
    pub(crate) async fn unavailable(self, why: &'static str) -> Recorded {
        self.complete(Completion::Unavailable, why).await
    }

    /// The work failed: its writes roll back; the key is kept as "response
    /// unavailable" if `keep` (its failures are not run again), else freed.
    pub(crate) async fn failed(self, keep: bool, why: &'static str) {
        let Self { claim, transaction } = self;
        if let Some(transaction) = transaction {
            transaction.rollback().await;
        }
        match keep {
            true => {
                let store = claim.store.clone();
                let (record, token) = claim.keep();
                Recorder::new(store, record, token).unavailable(why).await;
            }
            false => claim.release().await,
        }
    }

    /// The one ordering of a completion. Transactional: commit, then keep
    /// (or, the commit failed, release: refused if it did commit). Plain:
    /// keep first, so a dropped future leaves the key held until its lock
    /// expires rather than free for a second run, then record.
    async fn complete(self, completion: Completion, why: &'static str) -> Recorded {
        let Self { claim, transaction } = self;
        if let Some(transaction) = transaction {
            return match transaction.commit(completion).await {
                Ok(()) => {
                    let _ = claim.keep();
                    Recorded::Yes
                }
                Err(error) => {
                    tracing::warn!(%error, "the handler's transaction did not commit");
                    claim.release().await;
                    Recorded::Unknown(error)
                }
            };
        }
        let store = claim.store.clone();
        let (record, token) = claim.keep();
        let recorder = Recorder::new(store, record, token);
        match completion {
            Completion::Response(stored) => match recorder.complete(stored).await {
                true => Recorded::Yes,
                false => Recorded::Failed,
            },
            Completion::Unavailable => {
                recorder.unavailable(why).await;
                Recorded::Yes
            }
        }
    }
}
