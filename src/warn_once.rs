//! Misconfigurations logged at `WARN` once per route, not once per request.
//!
//! A layer that answers every caller `401`, or a handler whose `200` is never
//! recorded, is a setup mistake: it should be loud the first time and quiet
//! after, on every route it affects, without a client sending random paths
//! being able to grow the memory it takes.

use std::collections::HashSet;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex};

/// Routes remembered per layer; past this, nothing more is warned.
const MAX_ROUTES: usize = 256;

/// What was warned about.
#[derive(Clone, Copy, Hash)]
pub(crate) enum Cause {
    /// No scope in the request: `401`.
    NoScope,
    /// A `2xx` with this status that the record policy declined.
    NotRecorded(u16),
}

/// The `(cause, path)` pairs a layer has warned about, as keyed hashes: a
/// collision only silences a warning.
#[derive(Clone, Default)]
pub(crate) struct WarnOnce(Arc<Seen>);

#[derive(Default)]
struct Seen {
    hasher: RandomState,
    seen: Mutex<HashSet<u64>>,
}

impl WarnOnce {
    /// Whether this is the first time `cause` is seen on `path` (and there
    /// is room to remember it).
    pub(crate) fn first(&self, cause: Cause, path: &str) -> bool {
        let hash = self.0.hasher.hash_one((cause, path));
        let mut seen = self.0.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.len() >= MAX_ROUTES {
            return false;
        }
        seen.insert(hash)
    }
}

impl std::fmt::Debug for WarnOnce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WarnOnce")
    }
}

/// A claimed handler's `2xx` that the policy declined: its key was released.
pub(crate) fn not_recorded(warned: &WarnOnce, status: http::StatusCode, path: &str) {
    if status.is_success() && warned.first(Cause::NotRecorded(status.as_u16()), path) {
        tracing::warn!(
            status = status.as_u16(),
            path,
            "the handler answered {status}, which the record policy does not record: \
             the key was released and a retry runs the handler again. The default \
             policy records only `201 Created`; `.with_record_policy(RecordSuccess)` \
             records every 2xx. Such answers carry `Idempotency-Status: not-recorded` \
             (logged once per route and status)"
        );
    }
}

/// A request without a scope, answered `401`: at `DEBUG` every time, and at
/// `WARN` once per route with the likely cause, since a layer mounted outside
/// the layer that authenticates answers every valid caller `401`.
pub(crate) fn no_scope(warned: &WarnOnce, layer: &'static str, path: &str) {
    if warned.first(Cause::NoScope, path) {
        tracing::warn!(
            layer,
            path,
            "a request reached the {layer} layer with no Scope in the request \
             extensions and was answered 401: mount the layer inside (after) the layer \
             that authenticates and inserts a Scope (in axum, the layer added later is \
             the outer one), or use `.with_scope(...)`; for a single tenant: \
             `.with_scope(|_: &http::request::Parts| Some(Scope::new(\"default\")))` \
             (logged once per route)"
        );
    }
    tracing::debug!(layer, "no scope: 401 unauthorized");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn once_per_cause_and_path_and_bounded() {
        let warned = WarnOnce::default();
        assert!(warned.first(Cause::NoScope, "/a"));
        assert!(!warned.first(Cause::NoScope, "/a"));
        assert!(warned.first(Cause::NotRecorded(200), "/a"));
        assert!(warned.first(Cause::NotRecorded(204), "/a"));
        assert!(warned.first(Cause::NoScope, "/b"));
        for i in 0..2 * MAX_ROUTES {
            warned.first(Cause::NoScope, &format!("/{i}"));
        }
        assert_eq!(warned.0.seen.lock().unwrap().len(), MAX_ROUTES);
        assert!(!warned.first(Cause::NoScope, "/new"));
    }
}
