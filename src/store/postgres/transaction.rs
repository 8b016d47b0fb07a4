//! Transactional mode: the handler writes through the transaction that also
//! records its response, so both commit together or not at all.
//!
//! One pooled connection runs `BEGIN`, the key's advisory lock and the read of
//! its record in one round trip. Nobody else can see an uncommitted row, so the
//! claim is the lock alone, held by the handler's transaction: duplicates on
//! every instance find it held ("in progress", never a wait on a pooled
//! connection), and the record is written once, by the completion `INSERT`
//! pipelined with `COMMIT`, which makes it and the handler's writes durable in
//! one commit. The transaction's session is the claim's proof of life: while it
//! lives no one can take the key over, however long the handler takes, and a
//! process that dies takes its transaction and lock with it (PostgreSQL rolls
//! back as soon as it sees the connection close), so the key is free at once.
//! `idle_in_transaction_session_timeout` is switched off for these
//! transactions (transaction-local): a handler waiting on a slow provider must
//! not lose its claim to a server timeout while it still runs. A transaction
//! that is not READ COMMITTED claims with a row instead (see `begin_locked`).
//!
//! From the first byte written to its connection until the transaction's end
//! is known, the connection is owned by a [`Guarded`]: a future dropped at any
//! await (a client hang-up, an outer timeout, the store's operation timeout)
//! closes the connection instead of handing it back to the pool inside an open
//! transaction.

use super::single_flight::{Join, Landed, Leader};
use super::{backend, pipelined, Inner, PostgresStore, OPERATION};
use crate::fingerprint::RequestFingerprint;
use crate::store::shared;
use crate::store::{
    Begin, Completion, FencingToken, RecordKey, RecordTransaction, StoreError, TransactionalStore,
};
use deadpool_postgres::Object;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::sync::{Mutex, OwnedMutexGuard};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Row, Statement};

/// The transaction a claimed request's handler writes through, in its
/// request extensions under [`IdempotencyLayer::transactional`](crate::IdempotencyLayer::transactional).
///
/// Its statements commit together with the recorded response when the
/// response is recorded, and are rolled back otherwise (the record policy
/// declined it, the handler failed or panicked, the process died). Its
/// [`TransactionClient`] refuses `COMMIT`, `ROLLBACK` and other transaction
/// control (savepoints are allowed).
///
/// ```no_run
/// use axum::{http::StatusCode, Extension};
/// use tower_idempotency::PostgresTransaction;
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
    pub(super) connection: Arc<Mutex<Held>>,
}

/// The transaction's connection until the layer ends the transaction. Dropped
/// while still holding it (by the last clone of the handle), its guard closes it.
pub(super) struct Held(pub(super) Option<Guarded>);

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

/// The connection of a [`PostgresTransaction`], borrowed for some queries:
/// `tokio_postgres::Client`'s query methods, of the same signatures.
///
/// It refuses transaction control (`BEGIN`, `COMMIT`, `END`, `ROLLBACK`,
/// `ABORT`, `PREPARE TRANSACTION`) in any statement of the text it is given:
/// the text is not run, and the error it fails with aborts the transaction, so
/// nothing of the request commits. Ending the layer's transaction would let the
/// writes after it commit unrecorded while a retry runs the request again.
/// Savepoints (`SAVEPOINT`, `ROLLBACK TO`, `RELEASE`) are allowed.
pub struct TransactionClient(OwnedMutexGuard<Held>);

impl TransactionClient {
    fn client(&self) -> &tokio_postgres::Client {
        self.0 .0.as_ref().expect("checked in client()").client()
    }

    /// `Client::query`.
    pub async fn query<T: ?Sized + TransactionQuery>(
        &self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        match statement.query() {
            Query::Text(sql) => self.client().query(checked(sql), params).await,
            Query::Prepared(prepared) => self.client().query(prepared, params).await,
        }
    }

    /// `Client::query_one`.
    pub async fn query_one<T: ?Sized + TransactionQuery>(
        &self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, tokio_postgres::Error> {
        match statement.query() {
            Query::Text(sql) => self.client().query_one(checked(sql), params).await,
            Query::Prepared(prepared) => self.client().query_one(prepared, params).await,
        }
    }

    /// `Client::query_opt`.
    pub async fn query_opt<T: ?Sized + TransactionQuery>(
        &self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, tokio_postgres::Error> {
        match statement.query() {
            Query::Text(sql) => self.client().query_opt(checked(sql), params).await,
            Query::Prepared(prepared) => self.client().query_opt(prepared, params).await,
        }
    }

    /// `Client::execute`.
    pub async fn execute<T: ?Sized + TransactionQuery>(
        &self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, tokio_postgres::Error> {
        match statement.query() {
            Query::Text(sql) => self.client().execute(checked(sql), params).await,
            Query::Prepared(prepared) => self.client().execute(prepared, params).await,
        }
    }

    /// `Client::batch_execute`: every statement of `sql` is checked.
    pub async fn batch_execute(&self, sql: &str) -> Result<(), tokio_postgres::Error> {
        self.client().batch_execute(checked(sql)).await
    }

    /// `Client::simple_query`: every statement of `sql` is checked.
    pub async fn simple_query(
        &self,
        sql: &str,
    ) -> Result<Vec<tokio_postgres::SimpleQueryMessage>, tokio_postgres::Error> {
        self.client().simple_query(checked(sql)).await
    }

    /// `Client::prepare`, for [`query`](Self::query) and the others.
    pub async fn prepare(&self, sql: &str) -> Result<TransactionStatement, tokio_postgres::Error> {
        self.prepare_typed(sql, &[]).await
    }

    /// `Client::prepare_typed`.
    pub async fn prepare_typed(
        &self,
        sql: &str,
        types: &[tokio_postgres::types::Type],
    ) -> Result<TransactionStatement, tokio_postgres::Error> {
        let statement = self.client().prepare_typed(checked(sql), types).await?;
        Ok(TransactionStatement(statement))
    }
}

/// `sql`, or the statement that refuses it.
fn checked(sql: &str) -> &str {
    match super::control::ends_transaction(sql) {
        true => super::control::REFUSED,
        false => sql,
    }
}

/// A statement [`TransactionClient::prepare`] prepared (and checked).
#[derive(Clone, Debug)]
pub struct TransactionStatement(Statement);

impl TransactionStatement {
    /// The types of its parameters.
    pub fn params(&self) -> &[tokio_postgres::types::Type] {
        self.0.params()
    }

    /// The columns of its rows.
    pub fn columns(&self) -> &[tokio_postgres::Column] {
        self.0.columns()
    }
}

mod sealed {
    /// What a [`TransactionQuery`](super::TransactionQuery) runs.
    pub enum Query<'a> {
        Text(&'a str),
        Prepared(&'a tokio_postgres::Statement),
    }

    pub trait Sealed {
        fn query(&self) -> Query<'_>;
    }
}
use sealed::Query;

/// What [`TransactionClient`]'s query methods take: SQL text (`&str`,
/// `&String`), checked before it runs, or a [`TransactionStatement`].
pub trait TransactionQuery: sealed::Sealed {}

impl sealed::Sealed for str {
    fn query(&self) -> Query<'_> {
        Query::Text(self)
    }
}
impl TransactionQuery for str {}

impl sealed::Sealed for String {
    fn query(&self) -> Query<'_> {
        Query::Text(self)
    }
}
impl TransactionQuery for String {}

impl sealed::Sealed for TransactionStatement {
    fn query(&self) -> Query<'_> {
        Query::Prepared(&self.0)
    }
}
impl TransactionQuery for TransactionStatement {}

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

/// [`PostgresStore`]'s [`RecordTransaction`]: the layer commits it with the
/// recorded response or rolls it back; the handler writes through the
/// [`PostgresTransaction`] it shares.
pub struct PostgresRecordTransaction {
    inner: Arc<Inner>,
    key: RecordKey,
    token: FencingToken,
    /// The claim was made in this transaction (not committed before it).
    holds_claim: bool,
    /// The transaction's id: the completion records only in it.
    xact: i64,
    /// Whether the completion inserts the record or updates the claim's row.
    record: Record,
    /// The claimed request's, when known: its record is then kept near.
    fingerprint: Option<[u8; 32]>,
    handle: PostgresTransaction,
}

impl std::fmt::Debug for PostgresRecordTransaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresRecordTransaction")
            .field("key", &self.key)
            .field("token", &self.token)
            .field("holds_claim", &self.holds_claim)
            .field("record", &self.record)
            .finish_non_exhaustive()
    }
}

/// A pooled connection whose transaction state is not known to be idle: from
/// the first byte of a transaction until its end is known. Dropped while it
/// holds one (a cancelled future, an error), it closes the connection, which
/// rolls back whatever was open; only [`ended`](Self::ended) pools it again.
pub(super) struct Guarded(Option<Object>);

impl Guarded {
    pub(super) fn new(connection: Object) -> Self {
        Self(Some(connection))
    }

    pub(super) fn client(&self) -> &Object {
        self.0.as_ref().expect("held until ended")
    }

    /// Its transaction is known to have ended: back to the pool.
    pub(super) fn ended(mut self) {
        drop(self.0.take());
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        if let Some(connection) = self.0.take() {
            discard(connection);
        }
    }
}

/// Opens the transaction, takes the key's lock and reads its record, in one
/// round trip. A claim comes back with its transaction (the claim is the
/// lock, held by it; the record is written only at completion); any other
/// answer rolls it back off the answer's path. A transaction that is not READ
/// COMMITTED reads with a snapshot older than its lock: its claims are rows
/// written in the transaction instead ([`begin_row_claim`]).
async fn begin_locked(
    inner: &Arc<Inner>,
    key: &RecordKey,
    fp: &[u8; 32],
    leader: &mut Leader<'_>,
) -> Result<(Begin, Option<Opened>), StoreError> {
    if inner.stats.row_claims.load(Ordering::Relaxed) {
        return begin_row_claim(inner, key, fp, leader).await;
    }
    let (scope, k) = (key.scope().as_str(), key.key().as_str());
    let key_fp = fp;
    let fp = fp.as_slice();
    let connection = Guarded::new(inner.client().await?);
    leader.close();
    let claim = inner
        .prepare(connection.client(), &inner.sql.claim_key)
        .await?;
    inner.count_round_trips(1);
    let (sent, epoch) = (tokio::time::Instant::now(), inner.near_epoch());
    let client = connection.client();
    let (opened, row) = pipelined(
        client.batch_execute("BEGIN"),
        client.query_one(&claim, &[&scope, &k, &fp]),
    )
    .await;
    opened.map_err(backend)?;
    let row = row.map_err(backend)?;
    let read_committed: bool = row.try_get(11).map_err(backend)?;
    if !read_committed {
        inner.stats.row_claims.store(true, Ordering::Relaxed);
        rollback(inner, connection, None).await;
        return begin_row_claim(inner, key, key_fp, leader).await;
    }
    let begun = super::decode_begin(&row)?;
    inner.remember_read(key, key_fp, &begun, &row, sent, epoch);
    let over: Option<bool> = row.try_get(10).map_err(backend)?;
    let record = match over {
        Some(true) => Record::Replace,
        _ => Record::Insert,
    };
    kept_if_claimed(inner, connection, begun, &row, record)
}

/// A claim keeps its transaction open (`row` carries its id), to be
/// recorded by `record`; any other answer (a replay, a refusal, "in
/// progress") had the transaction for nothing, and it is ended in the
/// background so that the answer is not delayed.
fn kept_if_claimed(
    inner: &Arc<Inner>,
    connection: Guarded,
    begun: Begin,
    row: &Row,
    record: Record,
) -> Result<(Begin, Option<Opened>), StoreError> {
    Ok(match begun {
        Begin::Claimed(_) => {
            let xact: Option<i64> = row.try_get(9).map_err(backend)?;
            let xact = xact.ok_or_else(|| backend("a claim without its transaction's id"))?;
            let opened = Opened {
                connection,
                xact,
                record,
            };
            (begun, Some(opened))
        }
        _ => {
            let inner = inner.clone();
            tokio::spawn(async move { rollback(&inner, connection, None).await });
            (begun, None)
        }
    })
}

/// When a completion sends its key's wake-up.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Wake {
    /// After its commit, pipelined with it.
    Always,
    /// After its commit, only if its statement answered that the key has
    /// waiters (see `Sql::register_waiter`), or failed.
    IfWaited,
}

/// A claim's transaction, open.
struct Opened {
    connection: Guarded,
    xact: i64,
    record: Record,
}

/// How a claim's completion records its response.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Record {
    /// The claim is the key's lock alone, over no row: the record is
    /// inserted.
    Insert,
    /// The claim is the key's lock alone, over an expired row it locked: the
    /// record replaces it.
    Replace,
    /// The claim is a row (made in the transaction, or committed before it):
    /// the completion updates it.
    Update,
}

impl Record {
    /// Only a plain insert's statement answers whether the key has waiters;
    /// the others always wake them.
    fn wake(self) -> Wake {
        match self {
            Record::Insert => Wake::IfWaited,
            Record::Replace | Record::Update => Wake::Always,
        }
    }
}

/// Opens the transaction and runs `begin`'s statement in it, in one round
/// trip: the claim is a row written in the transaction. A rival's record
/// committed after the statement's snapshot makes it answer nothing; a new
/// transaction sees it (whatever the isolation level).
async fn begin_row_claim(
    inner: &Arc<Inner>,
    key: &RecordKey,
    fp: &[u8; 32],
    leader: &mut Leader<'_>,
) -> Result<(Begin, Option<Opened>), StoreError> {
    let (scope, k) = (key.scope().as_str(), key.key().as_str());
    let key_fp = fp;
    let fp = fp.as_slice();
    for _ in 0..super::BEGIN_ATTEMPTS {
        let connection = Guarded::new(inner.client().await?);
        leader.close();
        let begin = inner
            .prepare(connection.client(), &inner.sql.begin_locked)
            .await?;
        inner.count_round_trips(1);
        let (sent, epoch) = (tokio::time::Instant::now(), inner.near_epoch());
        let (opened, begun) = pipelined(
            connection.client().batch_execute(OPEN),
            connection.client().query(&begin, &[&scope, &k, &fp]),
        )
        .await;
        opened.map_err(backend)?;
        let rows = begun.map_err(backend)?;
        let Some(row) = rows.first() else {
            inner.stats.begin_retries.fetch_add(1, Ordering::Relaxed);
            rollback(inner, connection, None).await;
            continue;
        };
        let begun = super::decode_begin(row)?;
        inner.remember_read(key, key_fp, &begun, row, sent, epoch);
        return kept_if_claimed(inner, connection, begun, row, Record::Update);
    }
    Err(backend(format!(
        "begin saw the record change under it {} times in a row",
        super::BEGIN_ATTEMPTS
    )))
}

/// How a transaction of this mode starts when its claim is a row (the
/// lock-only claim sets the same in its lock statement): its session's idle
/// timeout would end a live claim whose handler waits on something slow.
pub(super) const OPEN: &str = "BEGIN; SET LOCAL idle_in_transaction_session_timeout = 0";

impl TransactionalStore for PostgresStore {
    type Transaction = PostgresRecordTransaction;

    async fn begin_in_transaction(
        &self,
        key: &RecordKey,
        request: &RequestFingerprint<'_>,
    ) -> Result<(Begin, Option<PostgresRecordTransaction>), StoreError> {
        let inner = &self.inner;
        shared::Listens::ensure_listener(inner);
        let fp = request.fingerprint().as_bytes();
        if let Some(known) = inner.known(key, fp) {
            return Ok((known, None));
        }
        // Coalesced as `begin` is: only a flight's leader opens a transaction.
        let (begun, connection) = inner
            .settings
            .timed(OPERATION, async {
                loop {
                    match inner.flights.join(key, fp) {
                        Join::Lead(mut leader) => {
                            let begun = begin_locked(inner, key, fp, &mut leader).await;
                            leader.land(begun.as_ref().ok().map(|(begun, _)| begun));
                            return begun;
                        }
                        Join::Follow(follower) => match follower.landing().await {
                            Some(Landed::Shared(answer)) => return Ok((answer, None)),
                            // Claimed by the leader, or the leader gave up: ask again.
                            Some(Landed::Claimed) | None => {}
                        },
                    }
                }
            })
            .await?;
        match (begun, connection) {
            (Begin::Claimed(claim), Some(opened)) => {
                let mut transaction =
                    PostgresRecordTransaction::new(inner, key, claim.token, opened, true);
                transaction.fingerprint = Some(*fp);
                Ok((Begin::Claimed(claim), Some(transaction)))
            }
            (begun, _) => Ok((begun, None)),
        }
    }

    async fn open(
        &self,
        key: &RecordKey,
        token: FencingToken,
    ) -> Result<PostgresRecordTransaction, StoreError> {
        let inner = &self.inner;
        let (scope, k) = (key.scope().as_str(), key.key().as_str());
        let connection = Guarded::new(inner.settings.timed(OPERATION, inner.client()).await?);
        let locked = inner
            .settings
            .timed(OPERATION, async {
                let statement = inner
                    .prepare(connection.client(), &inner.sql.lock_claim)
                    .await?;
                inner.count_round_trips(1);
                let (began, locked) = pipelined(
                    connection.client().batch_execute(OPEN),
                    connection
                        .client()
                        .query(&statement, &[&scope, &k, &token.0]),
                )
                .await;
                began.map_err(backend)?;
                match locked.map_err(backend)?.first() {
                    Some(row) => row.try_get::<_, i64>(0).map(Some).map_err(backend),
                    None => Ok(None),
                }
            })
            .await?;
        let Some(xact) = locked else {
            rollback(inner, connection, None).await;
            return Err(StoreError::ClaimLost);
        };
        let opened = Opened {
            connection,
            xact,
            record: Record::Update,
        };
        Ok(PostgresRecordTransaction::new(
            inner, key, token, opened, false,
        ))
    }
}

/// Ends `connection`'s transaction; pooled again once that is known. A claim
/// made in it is gone with it: `notify` wakes its waiters at once.
pub(super) async fn rollback(inner: &Inner, connection: Guarded, notify: Option<&RecordKey>) {
    inner.count_round_trips(1);
    let sql = match notify {
        Some(key) => {
            let id = crate::store::encoding::key_id(key);
            let channel = &inner.sql.channel;
            format!("ROLLBACK; SELECT pg_notify('{channel}', '{id}')")
        }
        None => "ROLLBACK".to_owned(),
    };
    let ended = inner
        .settings
        .timed(OPERATION, async {
            connection
                .client()
                .batch_execute(&sql)
                .await
                .map_err(backend)
        })
        .await;
    if ended.is_ok() {
        connection.ended();
    }
}

impl PostgresRecordTransaction {
    /// The transaction of `key`'s claim under `token`, open on `connection`.
    fn new(
        inner: &Arc<Inner>,
        key: &RecordKey,
        token: FencingToken,
        opened: Opened,
        holds_claim: bool,
    ) -> Self {
        let Opened {
            connection,
            xact,
            record,
        } = opened;
        Self {
            inner: inner.clone(),
            key: key.clone(),
            token,
            holds_claim,
            xact,
            record,
            fingerprint: None,
            handle: PostgresTransaction {
                connection: Arc::new(Mutex::new(Held(Some(connection)))),
            },
        }
    }

    /// Runs the completion `sql` pipelined with `COMMIT` and, after it, the
    /// key's wake-up (never inside the transaction: see `Sql::notify`):
    /// pipelined too, or, for a statement that answers whether the key has
    /// waiters (`Record::wake`), sent only when it has (or when the
    /// completion failed: the key is free again). The completion fails (and
    /// so aborts the transaction, which turns the COMMIT into a rollback)
    /// unless it matched the claim: the handler's writes never commit
    /// unrecorded.
    async fn complete_and_commit(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<(), StoreError> {
        let inner = &self.inner;
        let connection = self.take_connection().await?;
        let id = crate::store::encoding::key_id(&self.key);
        let committed = inner
            .settings
            .timed(OPERATION, async {
                let statement = inner.prepare(connection.client(), sql).await?;
                let notify = inner
                    .prepare(connection.client(), &inner.sql.notify)
                    .await?;
                inner.count_round_trips(1);
                let client = connection.client();
                let (completed, commit) = match self.record.wake() {
                    Wake::Always => {
                        let (completed, (commit, _woken)) = pipelined(
                            client.query(&statement, params),
                            pipelined(
                                client.batch_execute("COMMIT"),
                                client.execute(&notify, &[&id]),
                            ),
                        )
                        .await;
                        (completed, commit)
                    }
                    Wake::IfWaited => {
                        let (completed, commit) = pipelined(
                            client.query(&statement, params),
                            client.batch_execute("COMMIT"),
                        )
                        .await;
                        let waited = match &completed {
                            Ok(rows) => !rows
                                .first()
                                .is_some_and(|row| matches!(row.try_get::<_, bool>(0), Ok(false))),
                            Err(_) => true,
                        };
                        if waited && commit.is_ok() {
                            inner.count_round_trips(1);
                            let _woken = client.execute(&notify, &[&id]).await;
                        }
                        (completed, commit)
                    }
                };
                completed.map_err(backend)?;
                // A wake-up that failed only delays waiters (they re-check):
                // it never makes a commit that happened look failed.
                commit.map_err(backend)
            })
            .await;
        // Aborted or unknown: never back to the pool in a transaction.
        if committed.is_ok() {
            connection.ended();
        }
        committed
    }

    /// The connection, once the handler's clones of the handle let go of it.
    async fn take_connection(&self) -> Result<Guarded, StoreError> {
        let taken = self
            .inner
            .settings
            .timed(OPERATION, async {
                // Guarded before this future can be dropped again.
                Ok(self.handle.connection.lock().await.0.take())
            })
            .await?;
        taken.ok_or_else(|| backend("the request's transaction has ended"))
    }
}

impl RecordTransaction for PostgresRecordTransaction {
    fn share(&self, extensions: &mut http::Extensions) {
        extensions.insert(self.handle.clone());
    }

    fn holds_claim(&self) -> bool {
        self.holds_claim
    }

    async fn commit(self, completion: Completion) -> Result<(), StoreError> {
        let (scope, k) = (self.key.scope().as_str(), self.key.key().as_str());
        let sql = &self.inner.sql;
        // A lock-only claim inserts the record: it needs the request's
        // fingerprint, which such a claim always keeps.
        let fp = match (self.record, &self.fingerprint) {
            (Record::Update, _) => None,
            (_, Some(fp)) => Some(fp.as_slice()),
            (_, None) => return Err(backend("a claim without its fingerprint")),
        };
        let replace = self.record == Record::Replace;
        let response = match completion {
            Completion::Response(response) => response,
            Completion::Unavailable => {
                return match fp {
                    Some(fp) => {
                        let params: [&(dyn ToSql + Sync); 5] =
                            [&scope, &k, &fp, &self.token.0, &self.xact];
                        let sql = match replace {
                            true => &sql.replace_locked_unavailable,
                            false => &sql.record_locked_unavailable,
                        };
                        self.complete_and_commit(sql, &params).await
                    }
                    None => {
                        let params: [&(dyn ToSql + Sync); 4] =
                            [&scope, &k, &self.token.0, &self.xact];
                        let sql = &sql.complete_locked_unavailable;
                        self.complete_and_commit(sql, &params).await
                    }
                };
            }
        };
        let status = response.status.as_u16() as i16;
        let headers = crate::store::encoding::encode_headers(&response.headers);
        let body: &[u8] = &response.body;
        match fp {
            Some(fp) => {
                let params: [&(dyn ToSql + Sync); 8] = [
                    &scope,
                    &k,
                    &fp,
                    &self.token.0,
                    &self.xact,
                    &status,
                    &headers,
                    &body,
                ];
                let sql = match replace {
                    true => &sql.replace_locked,
                    false => &sql.record_locked,
                };
                self.complete_and_commit(sql, &params).await
            }
            None => {
                let params: [&(dyn ToSql + Sync); 7] = [
                    &scope,
                    &k,
                    &self.token.0,
                    &status,
                    &headers,
                    &body,
                    &self.xact,
                ];
                self.complete_and_commit(&sql.complete_locked, &params)
                    .await
            }
        }
    }

    async fn rollback(self) {
        // Otherwise a clone of the handle holds it past the handler's end: the
        // last clone dropped discards it.
        if let Ok(connection) = self.take_connection().await {
            let notify = self.holds_claim.then_some(&self.key);
            rollback(&self.inner, connection, notify).await;
        }
    }
}

impl Drop for PostgresRecordTransaction {
    fn drop(&mut self) {
        // Neither committed nor rolled back (a panic, a cancelled handler).
        // At once if no clone of the handle is using it, else when the last goes.
        if let Ok(mut held) = self.handle.connection.try_lock() {
            drop(held.0.take());
        }
    }
}
