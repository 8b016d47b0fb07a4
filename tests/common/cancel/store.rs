//! Every `Store` method cut at every poll, for any store: after each cut the
//! key is free or owned (never stuck past its lock), an acknowledged
//! completion replays, the store still serves other keys with completions
//! that last, and the backend's own invariants hold (`Probe`). Each binary
//! that has a store runs them on it with `store_cut_tests!`.
#![allow(dead_code)]

use super::driver::{at_every_poll, Cut};
use bytes::Bytes;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tower_idempotency::store::conformance::{fingerprint, record};
use tower_idempotency::store::Claim;
use tower_idempotency::store::Completion;
use tower_idempotency::store::Maintenance;
use tower_idempotency::{
    store::{Begin, FencingToken, RecordKey, Store, StoredResponse},
    Scope,
};

/// What a store's backend can tell beyond the `Store` API.
pub trait Probe {
    /// Its own invariants broken after a cut, once background cleanup had a
    /// moment (PostgreSQL: pooled connections left inside a transaction).
    fn violations(&self) -> impl Future<Output = Vec<String>>;

    /// Whether `key`'s completion is durable, read outside the store's own
    /// connections; `None` where the API's answer is all there is.
    fn committed(&self, key: &RecordKey) -> impl Future<Output = Option<bool>>;
}

/// A store with nothing to probe beyond its API.
pub struct NoProbe;

impl Probe for NoProbe {
    async fn violations(&self) -> Vec<String> {
        Vec::new()
    }

    async fn committed(&self, _: &RecordKey) -> Option<bool> {
        None
    }
}

/// A store under test, its probe, and its lock timeout.
pub struct Harness<S, P> {
    pub store: S,
    pub probe: P,
    pub lock: Duration,
}

/// A key in a scope no other test uses.
pub fn fresh_key() -> RecordKey {
    record(&fresh_scope(), "key-00000001")
}

/// A fresh key of the one scope all canaries share (so that they add no
/// scope indexes for a store's purges to walk).
fn canary_key() -> RecordKey {
    static SCOPE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    static N: AtomicUsize = AtomicUsize::new(0);
    let scope = SCOPE.get_or_init(fresh_scope);
    record(
        scope,
        &format!("canary-{:08}", N.fetch_add(1, Ordering::Relaxed)),
    )
}

pub fn fresh_scope() -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "cut-{}-{nanos}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

pub fn done(body: &'static [u8]) -> StoredResponse {
    StoredResponse {
        status: http::StatusCode::CREATED,
        headers: Vec::new(),
        body: Bytes::from_static(body),
    }
}

fn is_replay_of(begun: &Begin, body: &[u8]) -> bool {
    matches!(begun, Begin::Replay(stored) if stored.body == body)
}

impl<S: Store + Clone, P: Probe> Harness<S, P> {
    pub async fn claim(&self, key: &RecordKey) -> FencingToken {
        match self.store.begin(key, &fingerprint("cut")).await {
            Ok(Begin::Claimed(Claim { token, .. })) => token,
            other => panic!("expected a claim of a fresh key, got {other:?}"),
        }
    }

    /// What `begin` answers once the key is not in progress: within the lock
    /// timeout and some slack, or the key is stuck.
    pub async fn settled(&self, what: &str, key: &RecordKey) -> Begin {
        self.try_settled(key)
            .await
            .unwrap_or_else(|broken| panic!("{what}: {broken}"))
    }

    async fn try_settled(&self, key: &RecordKey) -> Result<Begin, String> {
        let slack = Duration::from_secs(2);
        let deadline = tokio::time::Instant::now() + self.lock + slack;
        loop {
            match self.store.begin(key, &fingerprint("cut")).await {
                Ok(Begin::InProgress) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
                Ok(Begin::InProgress) => {
                    return Err(format!(
                        "the key is still in progress {slack:?} after its lock ran out"
                    ))
                }
                Ok(begun) => return Ok(begun),
                Err(error) => return Err(format!("begin failed while the key settles: {error}")),
            }
        }
    }

    /// The checks every cut gets: the backend's invariants, and completions
    /// of other keys that are acknowledged, replayed and durable.
    pub async fn after_cut(&self, what: &str) {
        let broken = self.broken().await;
        assert!(
            broken.is_empty(),
            "{what}: after the cut:\n  {}",
            broken.join("\n  ")
        );
    }

    /// [`after_cut`](Self::after_cut) for a cut that may have left `key`
    /// claimed: also waits for the key to settle, and reports all that broke.
    pub async fn after_cut_settled(&self, what: &str, key: &RecordKey) -> Begin {
        let mut broken = self.broken().await;
        let settled = self.try_settled(key).await;
        if let Err(stuck) = &settled {
            broken.push(format!("the cut key: {stuck}"));
        }
        assert!(
            broken.is_empty(),
            "{what}: after the cut:\n  {}",
            broken.join("\n  ")
        );
        settled.unwrap()
    }

    /// The backend's invariants right after the cut, completions of other
    /// keys (which may run into what the cut left), and the invariants again.
    async fn broken(&self) -> Vec<String> {
        let mut broken = self.probe.violations().await;
        broken.extend(self.canaries().await);
        for violation in self.probe.violations().await {
            if !broken.contains(&violation) {
                broken.push(violation);
            }
        }
        broken
    }

    /// Four fresh keys claimed and completed at once (more than the test
    /// pools' connections, so each connection serves one): every completion
    /// acknowledged must replay and be durable.
    async fn canaries(&self) -> Vec<String> {
        let runs: Vec<_> = (0..4)
            .map(|_| {
                let (store, key) = (self.store.clone(), canary_key());
                tokio::spawn(async move {
                    let run = async {
                        let begun = store.begin(&key, &fingerprint("canary")).await;
                        let Ok(Begin::Claimed(Claim { token, .. })) = begun else {
                            return Err(format!("a fresh key's begin answered {begun:?}"));
                        };
                        let completed = store
                            .complete(&key, token, Completion::Response(done(b"canary")))
                            .await;
                        completed.map_err(|e| format!("complete failed: {e}"))
                    };
                    let limit = Duration::from_secs(15);
                    let ran = tokio::time::timeout(limit, run).await;
                    let ran = ran.unwrap_or_else(|_| Err(format!("no answer within {limit:?}")));
                    (key, ran)
                })
            })
            .collect();
        let mut broken = Vec::new();
        for run in runs {
            let (key, completed) = run.await.expect("canary task");
            if let Err(error) = completed {
                broken.push(format!("canary {}: {error}", key.key().as_str()));
                continue;
            }
            if self.probe.committed(&key).await == Some(false) {
                broken.push(format!(
                    "canary {}: complete answered Ok, but its completion is not committed \
                     (an acknowledged completion would be lost)",
                    key.key().as_str()
                ));
            }
            let replay = self.store.begin(&key, &fingerprint("canary")).await;
            if !matches!(&replay, Ok(b) if is_replay_of(b, b"canary")) {
                broken.push(format!(
                    "canary {}: an acknowledged completion answers {replay:?}, not its replay",
                    key.key().as_str()
                ));
            }
        }
        broken
    }

    /// An acknowledged completion of `key` replays and is durable.
    pub async fn replays(&self, what: &str, key: &RecordKey, body: &[u8]) {
        let begun = self.store.begin(key, &fingerprint("cut")).await;
        assert!(
            matches!(&begun, Ok(b) if is_replay_of(b, body)),
            "{what}: an acknowledged completion answers {begun:?}"
        );
        assert_ne!(
            self.probe.committed(key).await,
            Some(false),
            "{what}: an acknowledged completion is not committed"
        );
    }
}

fn label<T>(method: &str, cut: &Cut<T>) -> String {
    match cut.dropped() {
        true => format!("{method} cut after {} polls", cut.polls),
        false => format!("{method} completed after {} polls", cut.polls),
    }
}

pub async fn begin<S: Store + Clone, P: Probe>(h: &Harness<S, P>) {
    at_every_poll(
        "begin",
        |_| async {
            let (store, key) = (h.store.clone(), fresh_key());
            let cut_key = key.clone();
            let future = async move { store.begin(&cut_key, &fingerprint("cut")).await };
            (future, key)
        },
        |cut, key| async move {
            let what = label("begin", &cut);
            match cut.output {
                Some(Ok(Begin::Claimed(Claim { token, .. }))) => {
                    h.after_cut(&what).await;
                    h.store
                        .complete(&key, token, Completion::Response(done(b"ok")))
                        .await
                        .unwrap();
                    h.replays(&what, &key, b"ok").await;
                }
                Some(other) => panic!("{what}: a fresh key answered {other:?}"),
                None => {
                    let begun = h.after_cut_settled(&what, &key).await;
                    assert!(matches!(begun, Begin::Claimed(_)), "{what}: {begun:?}");
                }
            }
        },
    )
    .await;
}

/// `complete` or `complete_unavailable` (`body` `None`), cut.
pub async fn complete<S: Store + Clone, P: Probe>(h: &Harness<S, P>, unavailable: bool) {
    let method = if unavailable {
        "complete_unavailable"
    } else {
        "complete"
    };
    let is_completed = move |begun: &Begin| match unavailable {
        true => matches!(begun, Begin::ResponseUnavailable),
        false => is_replay_of(begun, b"done"),
    };
    at_every_poll(
        method,
        |_| async {
            let key = fresh_key();
            let token = h.claim(&key).await;
            let (store, cut_key) = (h.store.clone(), key.clone());
            let future = async move {
                match unavailable {
                    true => {
                        store
                            .complete(&cut_key, token, Completion::Unavailable)
                            .await
                    }
                    false => {
                        store
                            .complete(&cut_key, token, Completion::Response(done(b"done")))
                            .await
                    }
                }
            };
            (future, key)
        },
        |cut, key| async move {
            let what = label(method, &cut);
            match cut.output {
                Some(Ok(())) => {
                    h.after_cut(&what).await;
                    let begun = h.store.begin(&key, &fingerprint("cut")).await.unwrap();
                    assert!(is_completed(&begun), "{what}: acknowledged, then {begun:?}");
                    assert_ne!(h.probe.committed(&key).await, Some(false), "{what}");
                }
                Some(Err(error)) => panic!("{what}: the owner's completion failed: {error}"),
                // Either it went through, or the claim's lock runs out.
                None => {
                    let begun = h.after_cut_settled(&what, &key).await;
                    assert!(
                        is_completed(&begun) || matches!(begun, Begin::Claimed(_)),
                        "{what}: {begun:?}"
                    );
                }
            }
        },
    )
    .await;
}

/// `extend` (`release` false) or `release`, cut.
pub async fn extend_or_release<S: Store + Clone, P: Probe>(h: &Harness<S, P>, release: bool) {
    let method = if release { "release" } else { "extend" };
    at_every_poll(
        method,
        |_| async {
            let key = fresh_key();
            let token = h.claim(&key).await;
            let (store, cut_key) = (h.store.clone(), key.clone());
            let future = async move {
                match release {
                    true => store.release(&cut_key, token).await,
                    false => store.extend(&cut_key, token).await,
                }
            };
            (future, key)
        },
        |cut, key| async move {
            let what = label(method, &cut);
            if let Some(result) = &cut.output {
                assert!(
                    result.is_ok(),
                    "{what}: the owner's call failed: {result:?}"
                );
            }
            let begun = match (release, &cut.output) {
                // Released: free at once.
                (true, Some(_)) => {
                    h.after_cut(&what).await;
                    h.store.begin(&key, &fingerprint("cut")).await.unwrap()
                }
                _ => h.after_cut_settled(&what, &key).await,
            };
            assert!(matches!(begun, Begin::Claimed(_)), "{what}: {begun:?}");
        },
    )
    .await;
}

pub async fn wait<S: Store + Clone, P: Probe>(h: &Harness<S, P>) {
    at_every_poll(
        "wait",
        |_| async {
            let key = fresh_key();
            let token = h.claim(&key).await;
            let (store, cut_key) = (h.store.clone(), key.clone());
            let future = async move { store.wait(&cut_key, Duration::from_millis(300)).await };
            (future, (key, token))
        },
        |cut, (key, token)| async move {
            let what = label("wait", &cut);
            h.after_cut(&what).await;
            // A later waiter of the same key is still woken by its completion.
            let waiter = tokio::spawn({
                let (store, key) = (h.store.clone(), key.clone());
                async move { store.wait(&key, Duration::from_secs(30)).await }
            });
            h.store
                .complete(&key, token, Completion::Response(done(b"done")))
                .await
                .unwrap();
            let woken = tokio::time::timeout(Duration::from_secs(5), waiter).await;
            assert!(
                matches!(woken, Ok(Ok(Ok(())))),
                "{what}: a later waiter was not woken by the completion: {woken:?}"
            );
            h.replays(&what, &key, b"done").await;
        },
    )
    .await;
}

pub async fn purge_expired<S: Store + Maintenance + Clone, P: Probe>(h: &Harness<S, P>) {
    let kept = fresh_key();
    let token = h.claim(&kept).await;
    h.store
        .complete(&kept, token, Completion::Response(done(b"kept")))
        .await
        .unwrap();
    let kept = &kept;
    at_every_poll(
        "purge_expired",
        |_| async {
            let store = h.store.clone();
            (async move { store.purge_expired().await }, ())
        },
        |cut, ()| async move {
            let what = label("purge_expired", &cut);
            h.after_cut(&what).await;
            if let Some(result) = &cut.output {
                assert!(result.is_ok(), "{what}: {result:?}");
            }
            h.replays(&what, kept, b"kept").await;
        },
    )
    .await;
}

pub async fn purge_scope<S: Store + Maintenance + Clone, P: Probe>(h: &Harness<S, P>) {
    at_every_poll(
        "purge_scope",
        |_| async {
            let scope = fresh_scope();
            let keys: Vec<RecordKey> = (0..3)
                .map(|i| record(&scope, &format!("key-0000000{i}")))
                .collect();
            for key in &keys {
                let token = h.claim(key).await;
                h.store
                    .complete(key, token, Completion::Response(done(b"done")))
                    .await
                    .unwrap();
            }
            let store = h.store.clone();
            let future = async move { store.purge_scope(&Scope::new(scope)).await };
            (future, keys)
        },
        |cut, keys| async move {
            let what = label("purge_scope", &cut);
            h.after_cut(&what).await;
            for key in &keys {
                let begun = h.store.begin(key, &fingerprint("cut")).await.unwrap();
                match &cut.output {
                    Some(Ok(3)) => assert!(matches!(begun, Begin::Claimed(_)), "{what}: {begun:?}"),
                    Some(other) => panic!("{what}: purged {other:?} of 3"),
                    // Each record is either purged or whole.
                    None => assert!(
                        matches!(begun, Begin::Claimed(_)) || is_replay_of(&begun, b"done"),
                        "{what}: {begun:?}"
                    ),
                }
            }
        },
    )
    .await;
}

/// One test per `Store` method, in the module that invokes it, on the store
/// `$harness().await` builds (`None` skips), with the functions of this module.
#[macro_export]
macro_rules! store_cut_tests {
    ($harness:ident) => {
        $crate::store_cut_tests!(@one $harness, begin_cut_at_every_poll, |h| $crate::cancel::store::begin(h));
        $crate::store_cut_tests!(@one $harness, complete_cut_at_every_poll, |h| $crate::cancel::store::complete(h, false));
        $crate::store_cut_tests!(@one $harness, complete_unavailable_cut_at_every_poll, |h| $crate::cancel::store::complete(h, true));
        $crate::store_cut_tests!(@one $harness, extend_cut_at_every_poll, |h| $crate::cancel::store::extend_or_release(h, false));
        $crate::store_cut_tests!(@one $harness, release_cut_at_every_poll, |h| $crate::cancel::store::extend_or_release(h, true));
        $crate::store_cut_tests!(@one $harness, wait_cut_at_every_poll, |h| $crate::cancel::store::wait(h));
        $crate::store_cut_tests!(@one $harness, purge_expired_cut_at_every_poll, |h| $crate::cancel::store::purge_expired(h));
        $crate::store_cut_tests!(@one $harness, purge_scope_cut_at_every_poll, |h| $crate::cancel::store::purge_scope(h));
    };
    (@one $harness:ident, $name:ident, |$h:ident| $run:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let Some(harness) = $harness().await else {
                return;
            };
            let $h = &harness;
            $run.await;
        }
    };
}
