//! The `maxmemory-policy` check at connect, which
//! [`RedisStoreBuilder::assume_noeviction`](super::RedisStoreBuilder::assume_noeviction)
//! turns off.
//!
//! Every record has a TTL, so every evicting policy may delete one under
//! memory pressure: `volatile-ttl` the in-flight claim first (its TTL is the
//! shortest), the LRU, LFU and random ones completed records too. A deleted
//! claim or record is a key nobody holds: its retry runs the handler again.
//! Only `noeviction` (writes fail instead, a `503`) keeps the guarantee.

use super::{backend, Connection, RedisStore, OPERATION};
use crate::store::StoreError;
use std::collections::HashMap;

/// Fails unless every primary that answers has `maxmemory-policy noeviction`
/// (or `assume_noeviction`, which only warns).
pub(super) async fn check(store: &RedisStore, assume_noeviction: bool) -> Result<(), StoreError> {
    if assume_noeviction {
        tracing::warn!(
            "RedisStore: maxmemory-policy not checked (assume_noeviction): unless every \
             Redis node runs with maxmemory-policy noeviction, memory pressure deletes \
             claims and records, and their retries run their handlers again"
        );
        return Ok(());
    }
    let inner = &store.inner;
    let primaries = match &inner.connection {
        Connection::Server(_) => vec![None],
        Connection::Cluster(_) => inner.primaries().await?.into_iter().map(Some).collect(),
    };
    let mut checked = 0;
    for primary in &primaries {
        let node = match primary {
            Some((host, port)) => format!("{host}:{port}"),
            None => "the server".to_owned(),
        };
        let mut get = redis::cmd("CONFIG");
        get.arg("GET").arg("maxmemory-policy");
        let get = inner.on_node::<HashMap<String, String>>(get, primary.as_ref());
        let policy = match inner.settings.timed(OPERATION, get).await {
            Ok(reply) => reply.get("maxmemory-policy").cloned(),
            // A primary that cannot be reached now is not checked; the
            // others are, and the store fails for its keys anyway.
            Err(error) if primary.is_some() && unreachable(&error) => {
                tracing::warn!(%error, node, "RedisStore: maxmemory-policy not checked");
                continue;
            }
            Err(error) => return Err(unreadable(&node, &error.to_string())),
        };
        match policy.as_deref() {
            Some("noeviction") => checked += 1,
            Some(policy) => return Err(evicting(&node, policy)),
            None => return Err(unreadable(&node, "no such parameter")),
        }
    }
    if checked == 0 {
        return Err(unreadable("the Cluster", "no primary answered"));
    }
    Ok(())
}

fn unreachable(error: &StoreError) -> bool {
    let StoreError::Backend(error) = error else {
        return false;
    };
    match error.downcast_ref::<redis::RedisError>() {
        Some(e) => e.is_io_error() || e.is_connection_dropped() || e.is_timeout(),
        // The operation's own timeout.
        None => true,
    }
}

fn evicting(node: &str, policy: &str) -> StoreError {
    backend(format!(
        "Redis maxmemory-policy is {policy} on {node}: an evicting policy deletes claims and \
         records under memory pressure, and the retries of those requests run their handlers \
         again; set maxmemory-policy noeviction (docs/redis.md)"
    ))
}

fn unreadable(node: &str, why: &str) -> StoreError {
    backend(format!(
        "cannot read Redis maxmemory-policy on {node} ({why}): it must be noeviction, or \
         evictions delete claims and records and their retries run again; if CONFIG is \
         disabled and the service guarantees noeviction, connect with \
         RedisStore::builder().assume_noeviction()"
    ))
}
