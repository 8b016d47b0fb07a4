//! The [`Store`] operations of [`PostgresStore`]: begin, complete, release, wait, purges.

use super::single_flight::{Join, Landed};
use super::sql::PURGE_BATCH;
use super::transaction::Guarded;
use super::{backend, pipelined, Inner, PostgresStore, OPERATION};
use crate::fingerprint::RequestFingerprint;
use crate::store::encoding::{encode_headers, key_id};
use crate::store::inspect::{self, InProgress, Inspect, KeyState, Release};
use crate::store::shared;
use crate::store::{
    Begin, Completion, FencingToken, Maintenance, RecordKey, Store, StoreError, StoredResponse,
    Timings,
};
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio_postgres::types::ToSql;

impl Store for PostgresStore {
    async fn begin(
        &self,
        key: &RecordKey,
        request: &RequestFingerprint<'_>,
    ) -> Result<Begin, StoreError> {
        let inner = &self.inner;
        shared::begin(inner, key, request, |fp| inner.begin_coalesced(key, fp)).await
    }

    async fn complete(
        &self,
        key: &RecordKey,
        token: FencingToken,
        completion: Completion,
    ) -> Result<(), StoreError> {
        match completion {
            Completion::Response(response) => self.complete_response(key, token, response).await,
            Completion::Unavailable => self.complete_unavailable(key, token).await,
        }
    }

    fn timings(&self) -> Timings {
        self.inner.settings.timings()
    }

    async fn extend(&self, key: &RecordKey, token: FencingToken) -> Result<(), StoreError> {
        let inner = &self.inner;
        let (scope, k) = (key.scope().as_str(), key.key().as_str());
        inner
            .settings
            .timed(OPERATION, async {
                let client = inner.client().await?;
                let rows = inner
                    .query(&client, &inner.sql.extend, &[&scope, &k, &token.0])
                    .await?;
                if rows.is_empty() {
                    return Err(StoreError::ClaimLost);
                }
                Ok(())
            })
            .await
    }

    async fn release(&self, key: &RecordKey, token: FencingToken) -> Result<(), StoreError> {
        let inner = &self.inner;
        let (scope, k) = (key.scope().as_str(), key.key().as_str());
        let id = key_id(key);
        inner
            .settings
            .timed(OPERATION, async {
                let client = inner.client().await?;
                let params: [&(dyn ToSql + Sync); 3] = [&scope, &k, &token.0];
                inner
                    .query_then_notify(&client, &inner.sql.release, &params, &id)
                    .await?;
                Ok(())
            })
            .await
    }

    async fn wait(&self, key: &RecordKey, timeout: Duration) -> Result<(), StoreError> {
        let inner = &self.inner;
        // Registered (when it can be) before the first check, for the
        // wait's life: a transactional completion then wakes it.
        shared::Listens::ensure_listener(inner);
        let started = tokio::time::Instant::now();
        let _registered = inner.register_waiter(key).await;
        let timeout = timeout.saturating_sub(started.elapsed());
        shared::wait(inner, key_id(key), timeout, || inner.lock_remaining(key)).await
    }
}

impl Inner {
    /// `begin`'s statement, shared by concurrent identical calls.
    async fn begin_coalesced(&self, key: &RecordKey, fp: &[u8; 32]) -> Result<Begin, StoreError> {
        // Concurrent identical calls share one query (see `single_flight`): after a
        // completion's NOTIFY, its waiters would otherwise all queue up behind the pool.
        self.settings
            .timed(OPERATION, async {
                loop {
                    match self.flights.join(key, fp) {
                        Join::Lead(mut leader) => {
                            let begun = self.begin_query(key, fp, Some(&mut leader)).await;
                            leader.land(begun.as_ref().ok());
                            return begun;
                        }
                        Join::Follow(follower) => {
                            self.stats.begins_followed.fetch_add(1, Ordering::Relaxed);
                            match follower.landing().await {
                                Some(Landed::Shared(answer)) => {
                                    self.stats.begins_shared.fetch_add(1, Ordering::Relaxed);
                                    return Ok(answer);
                                }
                                // The claim is the leader's alone; the next answer is
                                // the same for all of us again.
                                Some(Landed::Claimed) => {}
                                // The leader failed or was dropped: query, uncoalesced
                                // (a failing database must not chain followers' waits).
                                None => return self.begin_query(key, fp, None).await,
                            }
                        }
                    }
                }
            })
            .await
    }
}

impl Maintenance for PostgresStore {
    async fn purge_expired(&self) -> Result<u64, StoreError> {
        let inner = &self.inner;
        let client = inner.settings.timed(OPERATION, inner.client()).await?;
        let mut purged = 0;
        // Bounded batches: each statement deletes (or reduces to tombstones)
        // at most `PURGE_BATCH` rows, and as many expired phases.
        loop {
            let (records, phases) = inner
                .settings
                .timed(OPERATION, inner.purged(&client, &inner.sql.purge, &[]))
                .await?;
            purged += records;
            if records.max(phases) < PURGE_BATCH {
                return Ok(purged);
            }
        }
    }

    /// Answers the larger of the records changed and the expired phases
    /// deleted, so that [`PurgeTask`](crate::store::purge::PurgeTask) goes on
    /// while either fills a batch.
    async fn purge_expired_batch(&self, limit: std::num::NonZeroU32) -> Result<u64, StoreError> {
        let inner = &self.inner;
        let limit = i64::from(limit.get());
        let (records, phases) = inner
            .settings
            .timed(OPERATION, async {
                let client = inner.client().await?;
                inner
                    .purged(&client, &inner.sql.purge_batch, &[&limit])
                    .await
            })
            .await?;
        Ok(records.max(phases))
    }

    async fn purge_scope(&self, scope: &crate::Scope) -> Result<u64, StoreError> {
        let inner = &self.inner;
        let name = scope.as_str();
        // One transaction holding the scope's lock exclusive: it waits for the
        // scope's transactional requests still running (their claims are rows
        // only they see until they commit), and the scope's new transactional
        // claims answer "in progress" until it ends. Read committed, so that
        // each DELETE sees what committed while it waited. The server gives up
        // waiting when this call does: `lock_timeout` is the operation timeout.
        let lock_timeout = inner.settings.operation_timeout().as_millis().max(1);
        let open = format!(
            "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL lock_timeout = {lock_timeout}"
        );
        let connection = Guarded::new(inner.settings.timed(OPERATION, inner.client()).await?);
        let client = connection.client();
        inner
            .settings
            .timed(OPERATION, async {
                let lock = inner.prepare(client, &inner.sql.lock_scope).await?;
                inner.count_round_trips(1);
                let (opened, locked) =
                    pipelined(client.batch_execute(&open), client.query(&lock, &[&name])).await;
                opened.map_err(backend)?;
                locked.map_err(backend).map(drop)
            })
            .await?;
        let mut purged = 0;
        loop {
            let deleted = inner
                .settings
                .timed(
                    OPERATION,
                    inner.execute(client, &inner.sql.purge_scope, &[&name]),
                )
                .await?;
            purged += deleted;
            if deleted < PURGE_BATCH {
                break;
            }
        }
        // After the records: a phase recorded meanwhile (its claim's row
        // locked before the records' DELETE reached it) has committed by now,
        // and goes too; no claim of the scope is left to record another.
        inner
            .settings
            .timed(
                OPERATION,
                inner.execute(client, &inner.sql.purge_scope_phases, &[&name]),
            )
            .await?;
        inner
            .settings
            .timed(OPERATION, async {
                inner.count_round_trips(1);
                client.batch_execute("COMMIT").await.map_err(backend)
            })
            .await?;
        // Here at once; on the other instances when the notification arrives
        // (each forgets every record it keeps near: purges are rare).
        if let Some(cache) = &inner.near_cache {
            cache.purge_scope(scope);
        }
        inner
            .settings
            .timed(
                OPERATION,
                inner.execute(client, &inner.sql.notify_purge, &[]),
            )
            .await?;
        connection.ended();
        Ok(purged)
    }
}

impl Inspect for PostgresStore {
    async fn inspect(&self, key: &RecordKey) -> Result<KeyState, StoreError> {
        let inner = &self.inner;
        let (scope, k) = (key.scope().as_str(), key.key().as_str());
        let rows = inner
            .settings
            .timed(OPERATION, async {
                let client = inner.client().await?;
                inner
                    .query(&client, &inner.sql.inspect, &[&scope, &k])
                    .await
            })
            .await?;
        let Some(row) = rows.first() else {
            return Ok(KeyState::Absent);
        };
        let get = |e: tokio_postgres::Error| backend(e);
        let state: &str = row.try_get("state").map_err(get)?;
        let expires = unix_ms(row.try_get("expires_ms").map_err(get)?);
        Ok(match state {
            "in_progress" => KeyState::InProgress(InProgress::new(
                FencingToken(row.try_get("token").map_err(get)?),
                row.try_get::<_, i32>("attempt").map_err(get)?.max(1) as u32,
                unix_ms(row.try_get("since_ms").map_err(get)?),
                expires,
            )),
            "completed" => {
                let status: i16 = row.try_get("status").map_err(get)?;
                KeyState::Completed {
                    status: http::StatusCode::from_u16(status as u16).map_err(backend)?,
                    body_bytes: row.try_get::<_, i64>("body_bytes").map_err(get)?.max(0) as u64,
                    expires,
                }
            }
            "expired" => KeyState::Tombstone { expires },
            _ => KeyState::Unavailable { expires },
        })
    }

    async fn release_stuck(
        &self,
        key: &RecordKey,
        token: FencingToken,
        actor: &str,
    ) -> Result<Release, StoreError> {
        let inner = &self.inner;
        let (scope, k) = (key.scope().as_str(), key.key().as_str());
        let id = key_id(key);
        let outcome = inner
            .settings
            .timed(OPERATION, async {
                let client = inner.client().await?;
                let params: [&(dyn ToSql + Sync); 3] = [&scope, &k, &token.0];
                let sql = &inner.sql.release_stuck;
                let rows = inner.query_then_notify(&client, sql, &params, &id).await?;
                let row = rows.first().ok_or_else(|| backend("no row"))?;
                let released: bool = row.try_get("released").map_err(backend)?;
                let alive: bool = row.try_get("alive").map_err(backend)?;
                let present: bool = row.try_get("present").map_err(backend)?;
                Ok(match (released, alive, present) {
                    (true, _, _) => Release::Released,
                    (false, true, _) => Release::OwnerAlive,
                    (false, false, true) => Release::NotOwner,
                    (false, false, false) => Release::Absent,
                })
            })
            .await;
        inspect::audit(actor, key, token, &outcome);
        outcome
    }
}

/// Milliseconds since the Unix epoch, as a time (saturating at the epoch).
fn unix_ms(ms: i64) -> std::time::SystemTime {
    std::time::UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64)
}

impl PostgresStore {
    async fn complete_response(
        &self,
        key: &RecordKey,
        token: FencingToken,
        response: StoredResponse,
    ) -> Result<(), StoreError> {
        let inner = &self.inner;
        let (scope, k) = (key.scope().as_str(), key.key().as_str());
        let status = response.status.as_u16() as i16;
        let headers = encode_headers(&response.headers);
        let body: &[u8] = &response.body;
        let id = key_id(key);
        let params: [&(dyn ToSql + Sync); 6] = [&scope, &k, &token.0, &status, &headers, &body];
        inner
            .settings
            .timed(OPERATION, async {
                let client = inner.client().await?;
                let rows = inner
                    .query_then_notify(&client, &inner.sql.complete, &params, &id)
                    .await?;
                if rows.is_empty() {
                    return Err(StoreError::ClaimLost);
                }
                Ok(())
            })
            .await
    }

    async fn complete_unavailable(
        &self,
        key: &RecordKey,
        token: FencingToken,
    ) -> Result<(), StoreError> {
        let inner = &self.inner;
        let (scope, k) = (key.scope().as_str(), key.key().as_str());
        let id = key_id(key);
        inner
            .settings
            .timed(OPERATION, async {
                let client = inner.client().await?;
                let params: [&(dyn ToSql + Sync); 3] = [&scope, &k, &token.0];
                let sql = &inner.sql.complete_unavailable;
                let rows = inner.query_then_notify(&client, sql, &params, &id).await?;
                if rows.is_empty() {
                    return Err(StoreError::ClaimLost);
                }
                Ok(())
            })
            .await
    }
}
