//! What every front door does first: ask the store, and wait out a request
//! in progress.

use crate::fingerprint::RequestFingerprint;
use crate::store::erased::{ErasedStore, ErasedTransaction, ErasedTransactionalStore};
use crate::store::{Begin, Claim, RecordKey, StoreError, StoredResponse};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// The store's answer for one request, after waiting out a request in progress.
pub(crate) enum Decision {
    /// This caller owns the key; in transactional mode its transaction may be open.
    Claimed(Claim, Option<Box<dyn ErasedTransaction>>),
    /// The recorded result.
    Replay(Arc<StoredResponse>),
    /// The key was used by another request.
    KeyReused,
    /// Completed without a replayable result.
    Unavailable,
    /// Ran before; its record expired and only its tombstone is left.
    Expired,
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
    store: &Arc<dyn ErasedStore>,
    transactions: Option<&Arc<dyn ErasedTransactionalStore>>,
    record: &RecordKey,
    fingerprint: &RequestFingerprint<'_>,
    wait_timeout: Duration,
) -> Decision {
    let mut wait_until = None;
    loop {
        // Transactional mode: a claim may come with its transaction already open.
        let begun = match transactions {
            Some(transactions) => transactions.begin_in_transaction(record, fingerprint).await,
            None => store
                .begin(record, fingerprint)
                .await
                .map(|begun| (begun, None)),
        };
        match begun {
            Ok((Begin::Claimed(claim), opened)) => {
                if let Some(takeover) = claim.takeover {
                    tracing::warn!(
                        attempt = takeover.attempt,
                        previous_token = takeover.previous_token.get(),
                        "took over a claim whose owner did not complete it within its lock"
                    );
                }
                return Decision::Claimed(claim, opened);
            }
            Ok((Begin::Replay(stored), _)) => return Decision::Replay(stored),
            Ok((Begin::KeyReused, _)) => return Decision::KeyReused,
            Ok((Begin::ResponseUnavailable, _)) => return Decision::Unavailable,
            Ok((Begin::Expired, _)) => return Decision::Expired,
            Ok((Begin::InProgress, _)) => {
                let now = Instant::now();
                let until = *wait_until.get_or_insert(now + wait_timeout);
                if now >= until {
                    return Decision::InProgress;
                }
                if let Err(error) = store.wait(record, until - now).await {
                    return Decision::StoreFailed(error);
                }
            }
            Err(StoreError::QuotaExceeded) => return Decision::QuotaExceeded,
            Err(error) => return Decision::StoreFailed(error),
        }
    }
}
