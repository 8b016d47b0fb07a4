//! What every front door does first: ask the store, wait out a request in
//! progress, and hold a claim until it is kept or released.

use crate::store::{
    Begin, FencingToken, RecordKey, RecordTransaction, Store, StoreError, StoredResponse,
    TransactionalStore,
};
use crate::RequestFingerprint;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// The store's answer for one request, after waiting out a request in progress.
pub(crate) enum Decision {
    /// This caller owns the key; in transactional mode its transaction may be open.
    Claimed(FencingToken, Option<Box<dyn RecordTransaction>>),
    /// The recorded result.
    Replay(Arc<StoredResponse>),
    /// The key was used by another request.
    Mismatch,
    /// Completed without a replayable result.
    Unavailable,
    /// Still in progress after the wait.
    InProgress,
    /// The scope holds as many records as its quota allows.
    QuotaExceeded,
    /// The store failed (or waiting failed).
    StoreFailed(StoreError),
}

/// Asks the store about `record` until it answers something other than "in
/// progress", waiting for the owner at most `wait_timeout` from the first such
/// answer (most requests never wait). Every pass, including the ones after a
/// wait, compares fingerprints in `begin`.
pub(crate) async fn decide(
    store: &Arc<dyn Store>,
    transactions: Option<&Arc<dyn TransactionalStore>>,
    record: &RecordKey,
    fingerprint: &RequestFingerprint<'_>,
    wait_timeout: Duration,
) -> Decision {
    let mut wait_until = None;
    loop {
        let begun = match transactions {
            Some(transactions) => transactions
                .begin_in_transaction(record, fingerprint)
                .await
                .map(|(begun, opened)| match begun {
                    Begin::Claimed(token) => Ok(Decision::Claimed(token, opened)),
                    other => Err(other),
                }),
            None => store
                .begin(record, fingerprint)
                .await
                .map(|begun| match begun {
                    Begin::Claimed(token) => Ok(Decision::Claimed(token, None)),
                    other => Err(other),
                }),
        };
        match begun {
            Ok(Ok(claimed)) => return claimed,
            Ok(Err(Begin::Replay(stored))) => return Decision::Replay(stored),
            Ok(Err(Begin::Mismatch)) => return Decision::Mismatch,
            Ok(Err(Begin::ResponseUnavailable)) => return Decision::Unavailable,
            Ok(Err(Begin::InProgress)) => {
                let now = Instant::now();
                let until = *wait_until.get_or_insert(now + wait_timeout);
                if now >= until {
                    return Decision::InProgress;
                }
                if let Err(error) = store.wait(record, until - now).await {
                    return Decision::StoreFailed(error);
                }
            }
            Ok(Err(Begin::Claimed(_))) => unreachable!("claims are matched above"),
            Err(StoreError::ScopeQuotaExceeded) => return Decision::QuotaExceeded,
            Err(error) => return Decision::StoreFailed(error),
        }
    }
}

/// Holds a claim while its work runs. Dropped while still armed (the work
/// panicked, or its future was dropped), it releases the key in the
/// background so a retry can run.
pub(crate) struct ClaimGuard {
    pub(crate) store: Arc<dyn Store>,
    /// The claim, until it is kept or released.
    pub(crate) armed: Option<(RecordKey, FencingToken)>,
}

impl ClaimGuard {
    pub(crate) fn new(store: Arc<dyn Store>, record: RecordKey, token: FencingToken) -> Self {
        Self {
            store,
            armed: Some((record, token)),
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
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let store = self.store.clone();
            runtime.spawn(async move {
                let _ = store.release(&record, token).await;
            });
        }
    }
}
