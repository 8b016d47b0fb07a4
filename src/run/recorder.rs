//! Completing a claim whose work ran: its result recorded, or the key kept
//! as "response unavailable", with a failing store tried again in the
//! background while the caller gets its answer.

use crate::store::erased::ErasedStore;
use crate::store::{Completion, FencingToken, RecordKey, StoreError, StoredResponse};
use std::future::Future;
use std::sync::Arc;

/// Completes a kept claim (plain mode) once its work's result is known.
pub(crate) struct Recorder {
    store: Arc<dyn ErasedStore>,
    record: RecordKey,
    token: FencingToken,
}

impl Recorder {
    pub(crate) fn new(store: Arc<dyn ErasedStore>, record: RecordKey, token: FencingToken) -> Self {
        Self {
            store,
            record,
            token,
        }
    }

    /// The claim's store, key and token (to keep it alive while recording).
    pub(crate) fn claim(&self) -> (&Arc<dyn ErasedStore>, &RecordKey, FencingToken) {
        (&self.store, &self.record, self.token)
    }

    /// Records `stored`; `false` if the store refused or failed (a failing
    /// store is then tried again in the background).
    ///
    /// A plain function returning one async block: the future holds the
    /// recorder's parts once, not once per level of nested async functions.
    pub(crate) fn complete(self, stored: StoredResponse) -> impl Future<Output = bool> + Send {
        let Self {
            store,
            record,
            token,
        } = self;
        async move {
            // The store takes its own copy: this one is kept for retries.
            let completion = || Completion::Response(stored.clone());
            let error = match store.complete(&record, token, completion()).await {
                Ok(()) => return true,
                Err(error) => error,
            };
            retry(
                store,
                error,
                "its response could not be recorded",
                move |store| {
                    let (record, completion) =
                        (record.clone(), Completion::Response(stored.clone()));
                    async move { store.complete(&record, token, completion).await }
                },
            );
            false
        }
    }

    /// Completes the key without a replayable response.
    pub(crate) fn unavailable(self, why: &'static str) -> impl Future<Output = ()> + Send {
        let Self {
            store,
            record,
            token,
        } = self;
        async move {
            tracing::warn!(why, "the handler ran; its response is not replayable");
            let unavailable = Completion::Unavailable;
            let Err(error) = store.complete(&record, token, unavailable).await else {
                return;
            };
            retry(
                store,
                error,
                "its completion could not be recorded",
                move |store| {
                    let record = record.clone();
                    async move {
                        store
                            .complete(&record, token, Completion::Unavailable)
                            .await
                    }
                },
            );
        }
    }
}

/// After a completion's first attempt failed: a refusal (`ClaimLost`) is
/// final; a failing store (an outage, a failover) is tried again in the
/// background with a backoff, for up to the store's lock timeout, while the
/// caller gets its answer: the effect happened, and a key left in progress
/// would run again once its lock ran out.
fn retry<F, Fut>(
    store: Arc<dyn ErasedStore>,
    error: StoreError,
    what: &'static str,
    mut completion: F,
) where
    F: FnMut(Arc<dyn ErasedStore>) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), StoreError>> + Send,
{
    let StoreError::Backend(error) = error else {
        tracing::warn!(%error, "the handler ran but {what}");
        return;
    };
    tracing::warn!(%error, "the handler ran but {what}; trying again");
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let deadline = tokio::time::Instant::now() + store.timings().lock_timeout;
    runtime.spawn(async move {
        let mut pause = std::time::Duration::from_millis(50);
        loop {
            tokio::time::sleep(pause).await;
            match completion(store.clone()).await {
                Ok(()) => return,
                Err(StoreError::Backend(_)) if tokio::time::Instant::now() + pause < deadline => {
                    pause = (pause * 2).min(std::time::Duration::from_secs(1));
                }
                Err(error) => {
                    tracing::warn!(%error, "the handler ran but {what}");
                    return;
                }
            }
        }
    });
}
