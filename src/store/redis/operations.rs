//! The [`Store`] operations of [`RedisStore`]: one script each.

use super::command::{eval, Headers, Name, Tag};
use super::listen::PURGED;
use super::{backend, millis, Connection, Inner, RedisStore, OPERATION};
use crate::store::encoding::decode_headers;
use crate::store::inspect::{self, InProgress, Inspect, KeyState, Release};
use crate::store::shared;
use crate::store::{
    Begin, Claim, Completion, FencingToken, Maintenance, RecordKey, Store, StoreError,
    StoredResponse, Timings,
};
use crate::{fingerprint::RequestFingerprint, Scope};
use bytes::Bytes;
use http::StatusCode;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::Value;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

/// Index entries read (and records purged) per `purge_scope` script.
const PURGE_BATCH: isize = 500;

impl Inner {
    /// The command of `release` and of an operator's `release_stuck`
    /// (which adds its own arguments): the record and its scope's index,
    /// then scope, key, token, channel and the record's name, which already
    /// names it uniquely: the wake-up message's id.
    fn release_command(
        &self,
        script: &redis::Script,
        key: &RecordKey,
        token: FencingToken,
    ) -> redis::Cmd {
        let tag = self.tag(key);
        let record = tag.record(key.key().as_str());
        let mut cmd = eval(script, 2, 0);
        cmd.arg(record)
            .arg(tag.index())
            .arg(key.scope().as_str())
            .arg(key.key().as_str())
            .arg(token.0)
            .arg(&self.channel)
            .arg(record);
        cmd
    }

    pub(super) async fn invoke<T: redis::FromRedisValue>(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        self.count_round_trip();
        let mut connection = self.connection.clone();
        invocation
            .invoke_async(&mut connection)
            .await
            .map_err(backend)
    }

    /// Waits until the configured number of replicas of `record`'s primary
    /// acknowledged the writes sent so far; `Ok` without replica acks.
    pub(super) async fn replicated(&self, record: Name<'_>) -> Result<(), StoreError> {
        let Some(acks) = self.config.replica_acks else {
            return Ok(());
        };
        let record = record.to_string();
        let mut wait = redis::cmd("WAIT");
        wait.arg(acks.replicas).arg(millis(acks.timeout).max(1));
        self.count_round_trip();
        let acknowledged: usize = match &self.connection {
            Connection::Server(c) => wait.query_async(&mut c.clone()).await,
            // To the primary the script ran on: WAIT counts that connection's writes.
            Connection::Cluster(c) => {
                let route = redis::cluster_routing::Route::with_key(&record, SlotAddr::Master);
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                c.clone()
                    .route_command(wait, routing)
                    .await
                    .and_then(|v| redis::from_redis_value(v).map_err(Into::into))
            }
        }
        .map_err(backend)?;
        if acknowledged < acks.replicas {
            return Err(backend(format!(
                "{acknowledged} of {} replicas acknowledged within {:?}",
                acks.replicas, acks.timeout
            )));
        }
        Ok(())
    }

    async fn lock_remaining(&self, key: &RecordKey) -> Result<Option<Duration>, StoreError> {
        let tag = self.tag(key);
        let script = &self.scripts.lock_remaining;
        let mut cmd = eval(script, 1, 0);
        cmd.arg(tag.record(key.key().as_str()));
        let ms: i64 = self
            .settings
            .timed(OPERATION, self.run(script, &cmd))
            .await?;
        // -1: not in progress; -2 (gone) cannot follow a present state.
        Ok((ms >= 0).then(|| Duration::from_millis(ms as u64)))
    }

    /// Completes the claim with `response`, or as unavailable.
    async fn finish(
        &self,
        key: &RecordKey,
        token: FencingToken,
        response: Option<&StoredResponse>,
    ) -> Result<(), StoreError> {
        let tag = self.tag(key);
        let record = tag.record(key.key().as_str());
        let script = &self.scripts.complete;
        let mut cmd = eval(script, 4, response.map_or(0, |r| r.body.len() + 256));
        cmd.arg(record)
            .arg(tag.index())
            .arg(tag.tombstone(key.key().as_str()))
            .arg(tag.phases(key.key().as_str()))
            .arg(key.scope().as_str())
            .arg(key.key().as_str())
            .arg(token.0);
        match response {
            Some(response) => cmd
                .arg("c")
                .arg(response.status.as_u16())
                .arg(Headers(&response.headers))
                .arg(&response.body[..]),
            None => cmd.arg("u"),
        };
        self.settings
            .timed(OPERATION, async {
                let done: i64 = self.run(script, &cmd).await?;
                if done != 1 {
                    return Err(StoreError::ClaimLost);
                }
                // Written: its replication is awaited again until the operation's
                // timeout. After a failover the new primary may not have it: the
                // claim is then still ours and in progress there, and the caller
                // runs the completion again.
                loop {
                    let error = match self.replicated(record).await {
                        Ok(()) => return Ok(()),
                        Err(error) => error,
                    };
                    tracing::warn!(%error, "a completion is not replicated yet");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    let mut read = redis::cmd("HMGET");
                    read.arg(record).arg("st").arg("tok");
                    self.count_round_trip();
                    let state: (Option<String>, Option<String>) = read
                        .query_async(&mut self.connection.clone())
                        .await
                        .map_err(backend)?;
                    match state {
                        (Some(st), Some(tok)) if st != "p" && tok == token.0.to_string() => {}
                        (Some(st), Some(tok)) if st == "p" && tok == token.0.to_string() => {
                            return Err(backend("the completion was lost in a failover"));
                        }
                        _ => return Err(StoreError::ClaimLost),
                    }
                }
            })
            .await
    }
}

impl Inner {
    /// Deletes `scope`'s records, batch by batch through its index.
    async fn delete_scope(&self, scope: &Scope) -> Result<u64, StoreError> {
        let tag = super::command::Tag::of(&self.config.prefix, scope.as_str());
        let index = tag.index();
        // The phases first: one recorded after this pass has a record,
        // deleted below with its phase hash.
        self.delete_scope_phases(scope, &tag).await?;
        let mut purged = 0u64;
        // Entries of other scopes sharing the tag stay: skip past them.
        let mut kept: isize = 0;
        loop {
            let members = self.index_batch(index, kept).await?;
            if members.is_empty() {
                return Ok(purged);
            }
            let script = &self.scripts.purge_scope;
            let mut cmd = eval(script, 1 + 3 * members.len(), 0);
            cmd.arg(index);
            for member in &members {
                cmd.arg(tag.record(member))
                    .arg(tag.tombstone(member))
                    .arg(tag.phases(member));
            }
            cmd.arg(scope.as_str()).arg(&members);
            let (deleted, removed): (u64, isize) = self
                .settings
                .timed(OPERATION, self.run(script, &cmd))
                .await?;
            purged += deleted;
            kept += members.len() as isize - removed;
        }
    }

    /// The next [`PURGE_BATCH`] members of a scope's index (of records or of
    /// phases) from position `from`: what the purges delete batch by batch.
    async fn index_batch(
        &self,
        index: impl redis::ToRedisArgs + Send + Sync,
        from: isize,
    ) -> Result<Vec<String>, StoreError> {
        self.settings
            .timed(OPERATION, async {
                self.count_round_trip();
                redis::cmd("ZRANGE")
                    .arg(index)
                    .arg(from)
                    .arg(from + PURGE_BATCH - 1)
                    .query_async(&mut self.connection.clone())
                    .await
                    .map_err(backend)
            })
            .await
    }

    /// Deletes `scope`'s recovery points (not counted: they are not
    /// records), batch by batch through its phase index.
    async fn delete_scope_phases(&self, scope: &Scope, tag: &Tag<'_>) -> Result<(), StoreError> {
        let index = tag.phase_index().to_string();
        let mut kept: isize = 0;
        loop {
            let members = self.index_batch(&index, kept).await?;
            if members.is_empty() {
                return Ok(());
            }
            let mut invocation = self.scripts.purge_scope_phases.key(&index);
            invocation.arg(scope.as_str());
            for member in &members {
                invocation.key(tag.phases(member).to_string()).arg(member);
            }
            let removed: isize = self
                .settings
                .timed(OPERATION, self.invoke(&invocation))
                .await?;
            kept += members.len() as isize - removed;
        }
    }

    /// Trims every scope index this store's prefix names, on every primary.
    async fn trim_indexes(&self) -> Result<u64, StoreError> {
        let pattern = format!("{}:{{*}}:i", self.config.prefix);
        let primaries = match &self.connection {
            Connection::Server(_) => vec![None],
            Connection::Cluster(_) => self.primaries().await?.into_iter().map(Some).collect(),
        };
        let mut trimmed = 0;
        for primary in primaries {
            let mut cursor = 0u64;
            loop {
                let mut scan = redis::cmd("SCAN");
                scan.arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(1000);
                let (next, indexes): (u64, Vec<String>) = self
                    .settings
                    .timed(OPERATION, self.on_node(scan, primary.as_ref()))
                    .await?;
                for index in indexes {
                    let script = &self.scripts.trim_index;
                    let mut cmd = eval(script, 1, 0);
                    cmd.arg(index);
                    let removed: u64 = self
                        .settings
                        .timed(OPERATION, self.run(script, &cmd))
                        .await?;
                    trimmed += removed;
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(trimmed)
    }

    /// Runs `cmd` on the server, or on the Cluster node at `node`.
    pub(super) async fn on_node<T: redis::FromRedisValue>(
        &self,
        cmd: redis::Cmd,
        node: Option<&(String, u16)>,
    ) -> Result<T, StoreError> {
        self.count_round_trip();
        let value = match (&self.connection, node) {
            (Connection::Cluster(c), Some((host, port))) => {
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                });
                c.clone().route_command(cmd, routing).await
            }
            (connection, _) => cmd.query_async(&mut connection.clone()).await,
        }
        .map_err(backend)?;
        redis::from_redis_value(value).map_err(backend)
    }

    /// The Cluster's reachable primaries, from `CLUSTER NODES`.
    pub(super) async fn primaries(&self) -> Result<Vec<(String, u16)>, StoreError> {
        let nodes: String = self
            .on_node(redis::cmd("CLUSTER").arg("NODES").clone(), None)
            .await?;
        Ok(nodes
            .lines()
            .filter_map(|line| {
                let mut fields = line.split(' ');
                let address = fields.nth(1)?;
                let flags = fields.next()?;
                let primary = flags.split(',').any(|f| f == "master")
                    && !flags.split(',').any(|f| f == "fail" || f == "fail?");
                let (host, port) = address.split('@').next()?.rsplit_once(':')?;
                primary.then(|| Some((host.to_owned(), port.parse().ok()?)))?
            })
            .collect())
    }
}

/// `begin`'s answer, and for a completed record its remaining TTL.
fn decode_begin(reply: Vec<Value>) -> Result<(Begin, Option<Duration>), StoreError> {
    let corrupt = |what: &str| backend(format!("unexpected begin reply: {what}"));
    let takeover = reply.len() > 2;
    let mut fields = reply.into_iter();
    let outcome: String = fields
        .next()
        .map(redis::from_redis_value)
        .transpose()
        .map_err(backend)?
        .ok_or_else(|| corrupt("empty"))?;
    let mut next = |what: &str| fields.next().ok_or_else(|| corrupt(what));
    let begun = match outcome.as_str() {
        "claimed" => {
            let token: String = redis::from_redis_value(next("token")?).map_err(backend)?;
            let token = FencingToken(token.parse().map_err(|_| corrupt("token"))?);
            if !takeover {
                return Ok((Begin::Claimed(Claim::first(token)), None));
            }
            // A takeover names the claim it replaced.
            let attempt: u32 = redis::from_redis_value(next("attempt")?).map_err(backend)?;
            let previous: String =
                redis::from_redis_value(next("previous token")?).map_err(backend)?;
            let previous = previous.parse().map_err(|_| corrupt("previous token"))?;
            let began: String =
                redis::from_redis_value(next("previous start")?).map_err(backend)?;
            let began: u64 = began.parse().map_err(|_| corrupt("previous start"))?;
            let began = UNIX_EPOCH + Duration::from_millis(began);
            Begin::Claimed(Claim::takeover(
                token,
                attempt,
                FencingToken(previous),
                began,
            ))
        }
        "replay" => {
            let status: u16 = redis::from_redis_value(next("status")?).map_err(backend)?;
            let status = StatusCode::from_u16(status)
                .map_err(|_| backend("stored response status is invalid"))?;
            let headers: Vec<u8> = redis::from_redis_value(next("headers")?).map_err(backend)?;
            let body: Vec<u8> = redis::from_redis_value(next("body")?).map_err(backend)?;
            Begin::Replay(Arc::new(StoredResponse {
                status,
                headers: decode_headers(&headers)?,
                body: Bytes::from(body),
            }))
        }
        "mismatch" => Begin::KeyReused,
        "in_progress" => Begin::InProgress,
        "unavailable" => Begin::ResponseUnavailable,
        "expired" => Begin::Expired,
        other => return Err(corrupt(other)),
    };
    // PTTL: -1 (no TTL) or -2 (gone) give no bound, so nothing is kept near.
    let remaining = match begun {
        Begin::Replay(_) | Begin::ResponseUnavailable => fields
            .next()
            .and_then(|v| redis::from_redis_value::<i64>(v).ok())
            .filter(|ms| *ms > 0)
            .map(|ms| Duration::from_millis(ms as u64)),
        _ => None,
    };
    Ok((begun, remaining))
}

impl Store for RedisStore {
    async fn begin(
        &self,
        key: &RecordKey,
        request: &RequestFingerprint<'_>,
    ) -> Result<Begin, StoreError> {
        shared::begin(&self.inner, key, request, |fingerprint| {
            self.begin_script(key, fingerprint)
        })
        .await
    }

    async fn complete(
        &self,
        key: &RecordKey,
        token: FencingToken,
        completion: Completion,
    ) -> Result<(), StoreError> {
        let response = match &completion {
            Completion::Response(response) => Some(response),
            Completion::Unavailable => None,
        };
        self.inner.finish(key, token, response).await
    }

    fn timings(&self) -> Timings {
        self.inner.settings.timings()
    }

    async fn extend(&self, key: &RecordKey, token: FencingToken) -> Result<(), StoreError> {
        let inner = &self.inner;
        let tag = inner.tag(key);
        let script = &inner.scripts.extend;
        let mut cmd = eval(script, 4, 0);
        cmd.arg(tag.record(key.key().as_str()))
            .arg(tag.index())
            .arg(tag.phases(key.key().as_str()))
            .arg(tag.phase_index())
            .arg(key.scope().as_str())
            .arg(key.key().as_str())
            .arg(token.0)
            .arg(millis(inner.settings.lock_timeout()))
            .arg(millis(inner.claim_kept()))
            .arg(millis(inner.index_kept()))
            .arg(millis(inner.phases_kept()));
        let extended: i64 = inner
            .settings
            .timed(OPERATION, inner.run(script, &cmd))
            .await?;
        match extended {
            1 => Ok(()),
            _ => Err(StoreError::ClaimLost),
        }
    }

    async fn release(&self, key: &RecordKey, token: FencingToken) -> Result<(), StoreError> {
        let inner = &self.inner;
        let script = &inner.scripts.release;
        let cmd = inner.release_command(script, key, token);
        let _released: i64 = inner
            .settings
            .timed(OPERATION, inner.run(script, &cmd))
            .await?;
        Ok(())
    }

    async fn wait(&self, key: &RecordKey, timeout: Duration) -> Result<(), StoreError> {
        let inner = &self.inner;
        let id = inner.tag(key).record(key.key().as_str()).to_string();
        shared::wait(inner, id, timeout, || inner.lock_remaining(key)).await
    }
}

impl RedisStore {
    /// `begin`'s script; a claim waits for the configured replica acks.
    async fn begin_script(
        &self,
        key: &RecordKey,
        fingerprint: &[u8; 32],
    ) -> Result<Begin, StoreError> {
        let inner = &self.inner;
        let tag = inner.tag(key);
        let record = tag.record(key.key().as_str());
        let script = &inner.scripts.begin;
        let mut cmd = eval(script, 3, 0);
        cmd.arg(record)
            .arg(tag.index())
            .arg(tag.tombstone(key.key().as_str()))
            .arg(key.scope().as_str())
            .arg(key.key().as_str())
            .arg(&fingerprint[..]);
        inner
            .settings
            .timed(OPERATION, async {
                let (sent, epoch) = (tokio::time::Instant::now(), inner.near_epoch());
                let reply: Vec<Value> = inner.run(script, &cmd).await?;
                let (begun, remaining) = decode_begin(reply)?;
                if let Begin::Claimed(claim) = begun {
                    if let Err(error) = inner.replicated(record).await {
                        // Not running the handler on a claim a failover could lose.
                        let _ = self.release(key, claim.token).await;
                        return Err(error);
                    }
                }
                inner.remember_begun(key, fingerprint, &begun, remaining, sent, epoch);
                Ok(begun)
            })
            .await
    }
}

impl Inspect for RedisStore {
    async fn inspect(&self, key: &RecordKey) -> Result<KeyState, StoreError> {
        let inner = &self.inner;
        let tag = inner.tag(key);
        let script = &inner.scripts.inspect;
        let mut cmd = eval(script, 2, 0);
        cmd.arg(tag.record(key.key().as_str()))
            .arg(tag.tombstone(key.key().as_str()))
            .arg(key.scope().as_str())
            .arg(key.key().as_str());
        let reply: Vec<String> = inner
            .settings
            .timed(OPERATION, inner.run(script, &cmd))
            .await?;
        let number = |i: usize| -> Result<i64, StoreError> {
            reply
                .get(i)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| backend("a malformed inspection reply"))
        };
        let at = |ms: i64| UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64);
        Ok(match reply.first().map(String::as_str) {
            Some("p") => KeyState::InProgress(InProgress::new(
                FencingToken(number(1)?),
                u32::try_from(number(2)?).unwrap_or(1).max(1),
                at(number(3)?),
                at(number(4)?),
            )),
            Some("c") => KeyState::Completed {
                status: StatusCode::from_u16(number(1)? as u16).map_err(backend)?,
                body_bytes: number(2)?.max(0) as u64,
                expires: at(number(3)?),
            },
            Some("u") => KeyState::Unavailable {
                expires: at(number(1)?),
            },
            Some("x") => KeyState::Tombstone {
                expires: at(number(1)?),
            },
            _ => KeyState::Absent,
        })
    }

    async fn release_stuck(
        &self,
        key: &RecordKey,
        token: FencingToken,
        actor: &str,
    ) -> Result<Release, StoreError> {
        let inner = &self.inner;
        let script = &inner.scripts.release_stuck;
        let mut cmd = inner.release_command(script, key, token);
        cmd.arg(millis(inner.settings.lock_timeout() / 10));
        let outcome = inner
            .settings
            .timed(OPERATION, inner.run::<i64>(script, &cmd))
            .await
            .map(|released| match released {
                1 => Release::Released,
                2 => Release::OwnerAlive,
                0 => Release::NotOwner,
                _ => Release::Absent,
            });
        inspect::audit(actor, key, token, &outcome);
        outcome
    }
}

impl Maintenance for RedisStore {
    /// Redis deletes expired records itself (key TTLs); this trims the
    /// entries of expired records from every scope index, and returns how
    /// many it removed. It scans the whole key space (of every primary on a
    /// Cluster): run it rarely, if at all — indexes also trim themselves on
    /// one claim in eight and expire after their last record.
    async fn purge_expired(&self) -> Result<u64, StoreError> {
        self.inner.trim_indexes().await
    }

    async fn purge_scope(&self, scope: &Scope) -> Result<u64, StoreError> {
        let inner = &self.inner;
        let deleted = inner.delete_scope(scope).await;
        // Here at once; on the other instances when the message arrives (each
        // forgets every record it keeps near: purges are rare). Also after a
        // purge that failed midway: some of its records may be gone.
        if let Some(cache) = &inner.near_cache {
            cache.purge_scope(scope);
        }
        let published = inner
            .settings
            .timed(OPERATION, async {
                inner.count_round_trip();
                redis::cmd("PUBLISH")
                    .arg(&inner.channel)
                    .arg(PURGED)
                    .query_async::<i64>(&mut inner.connection.clone())
                    .await
                    .map_err(backend)
            })
            .await;
        let deleted = deleted?;
        published?;
        Ok(deleted)
    }
}
