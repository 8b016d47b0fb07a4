//! The [`Engine`]'s conformance check over a store (feature `test-util`):
//! what the engine promises holds on that store. The store's own suite is
//! [`store_conformance_tests!`](crate::store::conformance::store_conformance_tests); a store runs
//! this one beside it:
//!
//! ```
//! use tower_idempotency::store::conformance::Durations;
//! use tower_idempotency::MemoryStore;
//!
//! async fn memory_store(d: Durations) -> Option<MemoryStore> {
//!     Some(
//!         MemoryStore::builder()
//!             .with_lock_timeout(d.lock)
//!             .with_retention(d.retention)
//!             .build(),
//!     )
//! }
//!
//! tower_idempotency::engine_conformance_tests!(memory_store);
//! # fn main() {}
//! ```

// Exported at the crate root, as `#[macro_export]` requires, and documented
// here, beside the checks it runs, rather than at the top of the crate's page.
#[doc(inline)]
pub use crate::engine_conformance_tests;

use super::{Engine, EngineError, Identity, Outcome};
use crate::store::Store;
use crate::{IdempotencyKey, Scope};
use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;

/// A name no other test run uses.
fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", u64::from_le_bytes(crate::random::bytes()))
}

/// The [`Engine`] over the store: of 20 concurrent calls with
/// one identity, one runs the operation and the others get its value;
/// another identity under the key is refused; a failed operation frees its key.
#[doc(hidden)]
pub async fn the_engine_runs_an_operation_once_per_key<S: Store>(store: S) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let engine = Engine::new(store).with_wait_timeout(Duration::from_secs(10));
    let scope = Scope::new(unique("engine"));
    let key = IdempotencyKey::parse(b"message-000001").unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let calls: Vec<_> = (0..20)
        .map(|i| {
            let (engine, scope, key, runs) =
                (engine.clone(), scope.clone(), key.clone(), runs.clone());
            // The same message, its fields in two orders.
            let message: &'static [u8] = match i % 2 {
                0 => br#"{"id":1,"amount":5}"#,
                _ => br#"{ "amount": 5, "id": 1 }"#,
            };
            tokio::spawn(async move {
                let operation = move |_| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Ok::<_, std::io::Error>(Bytes::from_static(b"effect-1"))
                };
                engine
                    .run_bytes(&scope, &key, Identity::Json(message), operation)
                    .await
            })
        })
        .collect();
    let (mut executed, mut replayed) = (0, 0);
    for call in calls {
        match call.await.unwrap() {
            Ok(Outcome::Executed(value)) => {
                assert_eq!(value, Bytes::from_static(b"effect-1"));
                executed += 1;
            }
            Ok(Outcome::Replayed(value)) => {
                assert_eq!(value, Bytes::from_static(b"effect-1"));
                replayed += 1;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((executed, replayed), (1, 19));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let never = |_| async { Ok::<_, std::io::Error>(Bytes::from_static(b"second effect")) };
    let other = Identity::Json(br#"{"id":2,"amount":5}"#);
    assert!(matches!(
        engine.run_bytes(&scope, &key, other, never).await,
        Ok(Outcome::KeyReused)
    ));
    // A failed operation frees its key: the next delivery runs it.
    let failing = IdempotencyKey::parse(b"message-000002").unwrap();
    let fail = |_| async { Err::<Bytes, _>(std::io::Error::other("downstream refused")) };
    assert!(matches!(
        engine
            .run_bytes(&scope, &failing, Identity::Bytes(b"m2"), fail)
            .await,
        Err(EngineError::Operation(_))
    ));
    let succeed = |_| async { Ok::<_, std::io::Error>(Bytes::from_static(b"ok")) };
    assert!(matches!(
        engine
            .run_bytes(&scope, &failing, Identity::Bytes(b"m2"), succeed)
            .await,
        Ok(Outcome::Executed(_))
    ));
}

/// Generates the engine's `#[tokio::test]` for a store factory (see the
/// [module documentation](crate::engine::conformance)).
#[doc(hidden)]
#[macro_export]
macro_rules! engine_conformance_tests {
    ($factory:path) => {
        #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn the_engine_runs_an_operation_once_per_key() {
            if let Some(store) = $factory($crate::store::conformance::LONG).await {
                $crate::engine::conformance::the_engine_runs_an_operation_once_per_key(store).await;
            }
        }
    };
}
