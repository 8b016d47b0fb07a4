//! What every front door does with a claim: hold it until it is kept or
//! released, open its transaction, and run its work to completion whatever
//! the caller does.

use crate::store::erased::{ErasedStore, ErasedTransaction, ErasedTransactionalStore};
use crate::store::{FencingToken, RecordKey, StoreError};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

/// Holds a claim while its work runs. Dropped while still armed (the work
/// panicked, or its future was dropped), it releases the key in the
/// background so a retry can run.
pub(crate) struct ClaimGuard {
    pub(crate) store: Arc<dyn ErasedStore>,
    /// The claim, until it is kept or released.
    pub(crate) armed: Option<(RecordKey, FencingToken)>,
    /// The claim lives in a transaction: ending that frees it, no release is sent.
    pub(crate) in_transaction: bool,
}

impl ClaimGuard {
    pub(crate) fn new(store: Arc<dyn ErasedStore>, record: RecordKey, token: FencingToken) -> Self {
        Self {
            store,
            armed: Some((record, token)),
            in_transaction: false,
        }
    }

    /// The claim's record key.
    pub(crate) fn record(&self) -> &RecordKey {
        &self.armed.as_ref().expect("an armed claim").0
    }

    /// Disarms the guard, keeping the claim.
    pub(crate) fn keep(mut self) -> (RecordKey, FencingToken) {
        self.armed.take().expect("an armed claim")
    }

    pub(crate) async fn release(mut self) {
        if self.in_transaction {
            self.armed = None;
            return;
        }
        let (record, token) = self.armed.as_ref().expect("an armed claim");
        // Best effort: if the store is down, the claim's lock expiry frees the key.
        let _ = self.store.release(record, *token).await;
        // Disarmed only now: if this future is dropped mid-release, `drop` retries.
        self.armed = None;
    }
}

impl Drop for ClaimGuard {
    fn drop(&mut self) {
        let Some((record, token)) = self.armed.take() else {
            return;
        };
        if self.in_transaction {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let store = self.store.clone();
            runtime.spawn(async move {
                let _ = store.release(&record, token).await;
            });
        }
    }
}

/// Why a claim's transaction did not open.
pub(crate) enum NotOpened {
    /// Taken over before the work ran (its lock ran out): the claim is kept,
    /// the new owner runs the work.
    TakenOver,
    /// The store failed: the claim was released.
    Failed(StoreError),
}

/// The claim's transaction: the one `begin` opened with it, or a new one.
pub(crate) async fn open_transaction(
    transactions: &dyn ErasedTransactionalStore,
    claim: ClaimGuard,
    token: FencingToken,
    opened: Option<Box<dyn ErasedTransaction>>,
) -> Result<(ClaimGuard, Box<dyn ErasedTransaction>), NotOpened> {
    let opened = match opened {
        Some(transaction) => Ok(transaction),
        None => transactions.open(claim.record(), token).await,
    };
    match opened {
        Ok(transaction) => {
            let mut claim = claim;
            claim.in_transaction = transaction.holds_claim();
            Ok((claim, transaction))
        }
        Err(StoreError::ClaimLost) => {
            let _ = claim.keep();
            Err(NotOpened::TakenOver)
        }
        Err(error) => {
            claim.release().await;
            Err(NotOpened::Failed(error))
        }
    }
}

/// The work panicked (its claim guard released the key while unwinding), or
/// the runtime is shutting down.
pub(crate) struct Panicked;

/// Runs claimed `work` to completion whether or not the caller still waits
/// for it. Most work finishes on its first poll, which runs here; work that
/// has to wait is handed to a task of its own before this future returns
/// `Pending`, the only point where a caller can drop it, so it is never cut.
/// Outside a runtime it is simply awaited.
pub(crate) async fn run_to_completion<T: Send + 'static>(
    mut work: Pin<Box<dyn Future<Output = T> + Send>>,
) -> Result<T, Panicked> {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return Ok(work.await);
    };
    let first = std::future::poll_fn(|cx| {
        let polled = std::panic::catch_unwind(AssertUnwindSafe(|| work.as_mut().poll(cx)));
        Poll::Ready(polled)
    })
    .await;
    match first {
        Ok(Poll::Ready(answer)) => return Ok(answer),
        Ok(Poll::Pending) => {}
        Err(_) => return Err(Panicked),
    }
    runtime.spawn(work).await.map_err(|_| Panicked)
}
