//! Transactional mode: the handler writes through the transaction that also
//! records its response, so both commit together or not at all.
//!
//! The claim is committed first (by `begin`, as in plain mode), so duplicates
//! on every instance see it in progress. Then one pooled connection runs
//! `BEGIN` and locks the claimed row under its token (`SELECT ... FOR UPDATE`,
//! pipelined with `BEGIN`); the handler's statements run in that transaction;
//! the completion `UPDATE` and `COMMIT` end it (pipelined too). While the row
//! is locked no `begin` can take it over, however long the handler takes: a
//! takeover needs the lock expired *and* the row unlocked, and a row whose
//! transaction ended without a completion (the owner's process or connection
//! died) is free as soon as its lock has expired.

use super::single_flight::{Join, Landed, Leader};
use super::{backend, Inner, PostgresStore};
use crate::store::{
    Begin, FencingToken, RecordKey, RecordTransaction, StoreError, StoredResponse,
    TransactionalStore,
};
use crate::RequestFingerprint;
use async_trait::async_trait;
use deadpool_postgres::Object;
use std::future::Future;
use std::ops::Deref;
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;
use tokio::sync::{Mutex, OwnedMutexGuard};

/// The transaction a claimed request's handler writes through, in its
/// request extensions under [`IdempotencyLayer::transactional`](crate::IdempotencyLayer::transactional).
///
/// Its statements commit together with the recorded response when the
/// response is recorded, and are rolled back otherwise (the cache policy
/// declined it, the handler failed or panicked, the process died). Do not send
/// `COMMIT`, `ROLLBACK` or `SAVEPOINT` handling of your own through it.
///
/// ```no_run
/// use axum::{http::StatusCode, Extension};
/// use tower_idempotency::store::PostgresTransaction;
///
/// async fn create_order(Extension(tx): Extension<PostgresTransaction>) -> StatusCode {
///     let Ok(client) = tx.client().await else {
///         return StatusCode::SERVICE_UNAVAILABLE;
///     };
///     match client.execute("INSERT INTO orders (sku) VALUES ('A-1')", &[]).await {
///         Ok(_) => StatusCode::CREATED,
///         Err(_) => StatusCode::INTERNAL_SERVER_ERROR,
///     }
/// }
/// ```
#[derive(Clone)]
pub struct PostgresTransaction {
    connection: Arc<Mutex<Held>>,
}

/// The transaction's connection until the layer ends the transaction. Dropped
/// while still holding it (by the last clone of the handle), it discards it.
struct Held(Option<Object>);

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(connection) = self.0.take() {
            discard(connection);
        }
    }
}

impl std::fmt::Debug for PostgresTransaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresTransaction")
            .finish_non_exhaustive()
    }
}

impl PostgresTransaction {
    /// The transaction's connection, for `tokio_postgres` queries. Fails once
    /// the transaction has ended (a clone kept past the handler).
    pub async fn client(&self) -> Result<TransactionClient, StoreError> {
        let guard = self.connection.clone().lock_owned().await;
        if guard.0.is_none() {
            return Err(backend("the request's transaction has ended"));
        }
        Ok(TransactionClient(guard))
    }
}

/// The connection of a [`PostgresTransaction`], borrowed for some queries.
pub struct TransactionClient(OwnedMutexGuard<Held>);

impl Deref for TransactionClient {
    type Target = tokio_postgres::Client;

    fn deref(&self) -> &tokio_postgres::Client {
        self.0 .0.as_ref().expect("checked in client()")
    }
}

impl std::fmt::Debug for TransactionClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransactionClient").finish_non_exhaustive()
    }
}

/// Takes a connection whose transaction state is unknown out of the pool:
/// closing it makes PostgreSQL roll back whatever was left open.
fn discard(connection: Object) {
    drop(Object::take(connection));
}

/// Polls both futures together, so that two statements on one connection are
/// pipelined in one round trip (tokio-postgres sends a request when polled).
async fn pipelined<A: Future, B: Future>(a: A, b: B) -> (A::Output, B::Output) {
    let (mut a, mut b) = (pin!(a), pin!(b));
    let (mut ra, mut rb) = (None, None);
    std::future::poll_fn(|cx| {
        if ra.is_none() {
            if let Poll::Ready(v) = a.as_mut().poll(cx) {
                ra = Some(v);
            }
        }
        if rb.is_none() {
            if let Poll::Ready(v) = b.as_mut().poll(cx) {
                rb = Some(v);
            }
        }
        match (ra.take(), rb.take()) {
            (Some(a), Some(b)) => Poll::Ready((a, b)),
            (a, b) => {
                (ra, rb) = (a, b);
                Poll::Pending
            }
        }
    })
    .await
}

struct PgRecordTransaction {
    inner: Arc<Inner>,
    key: RecordKey,
    token: FencingToken,
    handle: PostgresTransaction,
}

/// A connection inside a transaction that nobody owns yet: closed if dropped
/// (the future cancelled, an error), never pooled mid-transaction.
struct Pending(Option<Object>);

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(connection) = self.0.take() {
            discard(connection);
        }
    }
}

/// `begin`'s statement with `BEGIN` and a lock of the claim pipelined behind
/// it, on one connection: a fresh request's claim and its transaction in one
/// round trip. The connection, inside its transaction, is left in `pending`.
async fn begin_and_lock(
    inner: &Inner,
    key: &RecordKey,
    fp: &[u8; 32],
    leader: &mut Leader<'_>,
    pending: &mut Pending,
) -> Result<Begin, StoreError> {
    let (scope, k) = (key.scope().as_str(), key.key().as_str());
    let fp = fp.as_slice();
    let connection = inner.client().await?;
    leader.close();
    let begin = inner.prepare(&connection, &inner.sql.begin).await?;
    let lock = inner
        .prepare(&connection, &inner.sql.lock_fresh_claim)
        .await?;
    inner.count_round_trips(1);
    let (begun, (opened, locked)) = pipelined(
        connection.query(&begin, &[&scope, &k, &fp]),
        pipelined(
            connection.batch_execute("BEGIN"),
            connection.query(&lock, &[&scope, &k]),
        ),
    )
    .await;
    if opened.is_err() {
        discard(connection);
    } else {
        pending.0 = Some(connection);
    }
    let rows = begun.map_err(backend)?;
    let Some(row) = rows.first() else {
        // A rival committed after the snapshot: decide as `begin` does.
        if let Some(connection) = pending.0.take() {
            rollback(inner, connection).await;
        }
        return inner.begin_query(key, fp, None).await;
    };
    let begun = super::decode_begin(row)?;
    if let Begin::Claimed(token) = begun {
        let ours = locked
            .ok()
            .and_then(|rows| rows.first().map(|row| row.get::<_, i64>(0)))
            == Some(token.0);
        if !ours {
            // Not locked here: the layer opens the transaction by itself.
            if let Some(connection) = pending.0.take() {
                rollback(inner, connection).await;
            }
        }
    }
    Ok(begun)
}

#[async_trait]
impl TransactionalStore for PostgresStore {
    async fn begin_in_transaction(
        &self,
        key: &RecordKey,
        request: &RequestFingerprint<'_>,
    ) -> Result<(Begin, Option<Box<dyn RecordTransaction>>), StoreError> {
        let inner = &self.inner;
        inner.ensure_listener();
        let fp = request.fingerprint().as_bytes();
        let mut pending = Pending(None);
        // Coalesced as `begin` is: only a flight's leader opens a transaction.
        let begun = inner
            .timed(async {
                loop {
                    match inner.flights.join(key, fp) {
                        Join::Lead(mut leader) => {
                            let begun =
                                begin_and_lock(inner, key, fp, &mut leader, &mut pending).await;
                            leader.land(&begun);
                            return begun;
                        }
                        Join::Follow(follower) => match follower.landing().await {
                            Some(Landed::Shared(answer)) => return Ok(answer),
                            Some(Landed::Claimed) => {}
                            None => return inner.begin_query(key, fp, None).await,
                        },
                    }
                }
            })
            .await?;
        let connection = pending.0.take();
        match (begun.clone(), connection) {
            (Begin::Claimed(token), Some(connection)) => {
                let transaction = PgRecordTransaction::new(inner, key, token, connection);
                Ok((begun, Some(Box::new(transaction))))
            }
            (_, Some(connection)) => {
                // A replay, a refusal or "in progress": the transaction was for
                // nothing. Ended in the background so the answer is not delayed.
                let inner = inner.clone();
                tokio::spawn(async move { rollback(&inner, connection).await });
                Ok((begun, None))
            }
            (_, None) => Ok((begun, None)),
        }
    }

    async fn open(
        &self,
        key: &RecordKey,
        token: FencingToken,
    ) -> Result<Box<dyn RecordTransaction>, StoreError> {
        let inner = &self.inner;
        let (scope, k) = (key.scope().as_str(), key.key().as_str());
        let connection = inner.timed(inner.client()).await?;
        let locked = inner
            .timed(async {
                let statement = inner.prepare(&connection, &inner.sql.lock_claim).await?;
                inner.count_round_trips(1);
                let (began, locked) = pipelined(
                    connection.batch_execute("BEGIN"),
                    connection.query(&statement, &[&scope, &k, &token.0]),
                )
                .await;
                began.map_err(backend)?;
                Ok(!locked.map_err(backend)?.is_empty())
            })
            .await;
        match locked {
            Ok(true) => Ok(Box::new(PgRecordTransaction::new(
                inner, key, token, connection,
            ))),
            Ok(false) => {
                rollback(inner, connection).await;
                Err(StoreError::ClaimLost)
            }
            Err(error) => {
                discard(connection);
                Err(error)
            }
        }
    }
}

async fn rollback(inner: &Inner, connection: Object) {
    inner.count_round_trips(1);
    match inner
        .timed(async { connection.batch_execute("ROLLBACK").await.map_err(backend) })
        .await
    {
        Ok(()) => drop(connection), // back to the pool, outside any transaction
        Err(_) => discard(connection),
    }
}

impl PgRecordTransaction {
    /// The transaction of `key`'s claim under `token`, open on `connection`.
    fn new(inner: &Arc<Inner>, key: &RecordKey, token: FencingToken, connection: Object) -> Self {
        Self {
            inner: inner.clone(),
            key: key.clone(),
            token,
            handle: PostgresTransaction {
                connection: Arc::new(Mutex::new(Held(Some(connection)))),
            },
        }
    }

    /// Runs the completion `sql` pipelined with `COMMIT`. The completion fails
    /// (and so aborts the transaction, which turns the COMMIT into a rollback)
    /// unless it matched the claim: the handler's writes never commit
    /// unrecorded.
    async fn complete_and_commit(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<(), StoreError> {
        let inner = &self.inner;
        let connection = self.take_connection().await?;
        let committed = inner
            .timed(async {
                let statement = inner.prepare(&connection, sql).await?;
                inner.count_round_trips(1);
                let (completed, commit) = pipelined(
                    connection.query(&statement, params),
                    connection.batch_execute("COMMIT"),
                )
                .await;
                completed.map_err(backend)?;
                commit.map_err(backend)
            })
            .await;
        if committed.is_err() {
            // Aborted or unknown: never back to the pool in a transaction.
            discard(connection);
        }
        committed
    }

    /// The connection, once the handler's clones of the handle let go of it.
    async fn take_connection(&self) -> Result<Object, StoreError> {
        let taken = self
            .inner
            .timed(async { Ok(self.handle.connection.lock().await.0.take()) })
            .await?;
        taken.ok_or_else(|| backend("the request's transaction has ended"))
    }
}

#[async_trait]
impl RecordTransaction for PgRecordTransaction {
    fn share(&self, extensions: &mut http::Extensions) {
        extensions.insert(self.handle.clone());
    }

    async fn commit(self: Box<Self>, response: StoredResponse) -> Result<(), StoreError> {
        let (scope, k) = (self.key.scope().as_str(), self.key.key().as_str());
        let status = response.status.as_u16() as i16;
        let headers = crate::store::encoding::encode_headers(&response.headers);
        let body: &[u8] = &response.body;
        let id = crate::store::encoding::key_id(&self.key);
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 7] =
            [&scope, &k, &self.token.0, &status, &headers, &body, &id];
        self.complete_and_commit(&self.inner.sql.complete_locked, &params)
            .await
    }

    async fn commit_unavailable(self: Box<Self>) -> Result<(), StoreError> {
        let (scope, k) = (self.key.scope().as_str(), self.key.key().as_str());
        let id = crate::store::encoding::key_id(&self.key);
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
            [&scope, &k, &self.token.0, &id];
        self.complete_and_commit(&self.inner.sql.complete_locked_unavailable, &params)
            .await
    }

    async fn rollback(self: Box<Self>) {
        // Otherwise a clone of the handle holds it past the handler's end: the
        // last clone dropped discards it.
        if let Ok(connection) = self.take_connection().await {
            rollback(&self.inner, connection).await;
        }
    }
}

impl Drop for PgRecordTransaction {
    fn drop(&mut self) {
        // Neither committed nor rolled back (a panic, a cancelled handler).
        // At once if no clone of the handle is using it, else when the last goes.
        if let Ok(mut held) = self.handle.connection.try_lock() {
            if let Some(connection) = held.0.take() {
                discard(connection);
            }
        }
    }
}
