//! The run-once engine outside HTTP, over `MemoryStore`: typed values,
//! running to completion when the caller goes away, keep-alive, a dead
//! owner's key taken over and fenced, failures freed or recorded, panics.
//! (The conformance suite runs the engine against every store; a store
//! outage is tested against a real Redis server.)

use bytes::Bytes;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tower_idempotency::engine::{Engine, EngineError, Identity, OnFailure, Outcome};
use tower_idempotency::store::Claim;
use tower_idempotency::store::Completion;
use tower_idempotency::store::{Begin, RecordKey};
use tower_idempotency::{
    fingerprint::Fingerprint,
    store::{Store, StoreError},
    IdempotencyKey, MemoryStore, Scope,
};

fn key(k: &str) -> IdempotencyKey {
    IdempotencyKey::parse(k.as_bytes()).unwrap()
}

#[tokio::test]
async fn typed_values_are_recorded_as_json_and_replayed_as_the_same_value() {
    #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
    struct Charge {
        id: u64,
        amount: u64,
    }
    let engine = Engine::new(MemoryStore::new());
    let scope = Scope::new("payments");
    let run =
        |n: u64| {
            let engine = engine.clone();
            let scope = scope.clone();
            async move {
                engine
                .run(&scope, &key("msg-typed-1"), Identity::Bytes(b"m"), move |_| async move {
                    Ok::<_, std::io::Error>(Charge { id: n, amount: 500 })
                })
                .await
                .unwrap()
            }
        };
    assert_eq!(
        run(1).await,
        Outcome::Executed(Charge { id: 1, amount: 500 })
    );
    assert_eq!(
        run(2).await,
        Outcome::Replayed(Charge { id: 1, amount: 500 })
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimed_operation_runs_to_completion_when_its_caller_goes_away() {
    let engine = Engine::new(MemoryStore::new());
    let scope = Scope::new("jobs");
    let done = Arc::new(AtomicUsize::new(0));
    let operation = {
        let done = done.clone();
        move |_| async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            done.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::io::Error>(Bytes::from_static(b"finished"))
        }
    };
    let job = key("job-000001");
    let call = engine.run_bytes(&scope, &job, Identity::Bytes(b"j"), operation);
    // The caller gives up after 50 ms; the operation goes on.
    assert!(tokio::time::timeout(Duration::from_millis(50), call)
        .await
        .is_err());
    assert_eq!(engine.in_flight().count(), 1);
    engine.in_flight().idle().await;
    assert_eq!(done.load(Ordering::SeqCst), 1);
    let again = |_| async { Ok::<_, std::io::Error>(Bytes::from_static(b"second run")) };
    let replay = engine
        .run_bytes(&scope, &key("job-000001"), Identity::Bytes(b"j"), again)
        .await
        .unwrap();
    assert_eq!(replay, Outcome::Replayed(Bytes::from_static(b"finished")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_operation_keeps_its_claim_past_the_lock_timeout() {
    let store = MemoryStore::builder()
        .with_lock_timeout(Duration::from_millis(200))
        .build();
    let engine = Engine::new(store).with_wait_timeout(Duration::ZERO);
    let scope = Scope::new("jobs");
    let runs = Arc::new(AtomicUsize::new(0));
    let slow = {
        let runs = runs.clone();
        move |_| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(900)).await;
            Ok::<_, std::io::Error>(Bytes::from_static(b"slow"))
        }
    };
    let first = tokio::spawn({
        let (engine, scope) = (engine.clone(), scope.clone());
        async move {
            engine
                .run_bytes(&scope, &key("job-slow-01"), Identity::Bytes(b"s"), slow)
                .await
        }
    });
    // Well past the 200 ms lock: still in progress, never run twice.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let runs = runs.clone();
        let again = move |_| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::io::Error>(Bytes::new())
        };
        let answer = engine
            .run_bytes(&scope, &key("job-slow-01"), Identity::Bytes(b"s"), again)
            .await
            .unwrap();
        assert_eq!(answer, Outcome::InProgress);
    }
    assert_eq!(
        first.await.unwrap().unwrap(),
        Outcome::Executed(Bytes::from_static(b"slow"))
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_owners_key_is_taken_over_with_a_higher_token_and_the_owner_is_fenced() {
    let store = MemoryStore::builder()
        .with_lock_timeout(Duration::from_millis(200))
        .build();
    let scope = Scope::new("jobs");
    let record = RecordKey::new(scope.clone(), key("job-dead-01"));
    // The owner claims the key as the engine would, then dies.
    let fingerprint = Fingerprint::compute(
        &http::Method::from_bytes(b"RUN").unwrap(),
        "tower-idempotency:operation",
        record.key(),
        "jobs",
        None,
        b"d",
    );
    let Begin::Claimed(Claim { token: dead, .. }) =
        store.begin(&record, &fingerprint.into()).await.unwrap()
    else {
        panic!("a fresh key");
    };
    let engine = Engine::new(store.clone()).with_wait_timeout(Duration::from_secs(2));
    let seen = Arc::new(std::sync::Mutex::new(None));
    let operation = {
        let seen = seen.clone();
        move |context: tower_idempotency::engine::RunContext| async move {
            *seen.lock().unwrap() = Some((context.token(), context.attempt()));
            Ok::<_, std::io::Error>(Bytes::from_static(b"taken over"))
        }
    };
    let answer = engine
        .run_bytes(&scope, record.key(), Identity::Bytes(b"d"), operation)
        .await
        .unwrap();
    assert_eq!(answer, Outcome::Executed(Bytes::from_static(b"taken over")));
    let (token, attempt) = seen.lock().unwrap().expect("the operation ran");
    assert!(token > dead, "{token:?} after {dead:?}");
    // The operation knows it took over, and from whom: it can reconcile.
    assert_eq!(attempt.token(), token);
    assert!(attempt.is_takeover());
    assert_eq!(attempt.number(), 2);
    assert_eq!(attempt.previous_token(), Some(dead));
    assert!(matches!(
        store.complete(&record, dead, Completion::Unavailable).await,
        Err(StoreError::ClaimLost)
    ));
}

#[tokio::test]
async fn recorded_failures_are_never_run_again_and_panics_free_the_key() {
    let engine = Engine::new(MemoryStore::new()).with_on_failure(OnFailure::Record);
    let scope = Scope::new("jobs");
    let runs = Arc::new(AtomicUsize::new(0));
    let failing = |runs: Arc<AtomicUsize>| {
        move |_| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Err::<Bytes, _>(std::io::Error::other("card declined"))
        }
    };
    let k = key("job-fails-1");
    let first = engine
        .run_bytes(&scope, &k, Identity::Bytes(b"f"), failing(runs.clone()))
        .await;
    assert!(matches!(first, Err(EngineError::Operation(_))));
    let second = engine
        .run_bytes(&scope, &k, Identity::Bytes(b"f"), failing(runs.clone()))
        .await;
    assert!(matches!(second, Ok(Outcome::Failed)));
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    let k = key("job-panics1");
    let panicking = |_| async {
        if true {
            panic!("the operation panicked");
        }
        Ok::<_, std::io::Error>(Bytes::new())
    };
    let answer = engine
        .run_bytes(&scope, &k, Identity::Bytes(b"p"), panicking)
        .await;
    assert!(matches!(answer, Err(EngineError::Panicked)));
    // The claim was released while unwinding: the next delivery runs.
    let mut runs_after = None;
    for _ in 0..50 {
        let ok = |_| async { Ok::<_, std::io::Error>(Bytes::from_static(b"ran")) };
        match engine
            .run_bytes(&scope, &k, Identity::Bytes(b"p"), ok)
            .await
        {
            Ok(Outcome::Executed(_)) => {
                runs_after = Some(());
                break;
            }
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    assert!(
        runs_after.is_some(),
        "the panicked operation's key was not freed"
    );
}

/// A value whose encoding panics (a buggy `Serialize` impl).
#[derive(Debug)]
struct Unencodable;

impl serde::Serialize for Unencodable {
    fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        panic!("a Serialize bug (expected by this test)")
    }
}

impl<'de> serde::Deserialize<'de> for Unencodable {
    fn deserialize<D: serde::Deserializer<'de>>(_: D) -> Result<Self, D::Error> {
        Ok(Self)
    }
}

/// The operation ran (its effects happened), then encoding its value
/// panicked: that is a value that cannot be encoded, so the key is completed
/// without one, never freed, and no later delivery runs the operation again,
/// even long after the claim's lock.
#[tokio::test(start_paused = true)]
async fn a_value_whose_encoding_panics_is_never_run_again() {
    let lock = Duration::from_secs(1);
    let engine = Engine::new(MemoryStore::builder().with_lock_timeout(lock).build());
    let scope = Scope::new("payments");
    let runs = Arc::new(AtomicUsize::new(0));
    let charge = |runs: Arc<AtomicUsize>| {
        move |_| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::io::Error>(Unencodable)
        }
    };
    let k = key("charge-encode-1");
    let first = engine
        .run(&scope, &k, Identity::Bytes(b"c"), charge(runs.clone()))
        .await;
    assert!(matches!(first, Err(EngineError::Value(_))), "{first:?}");
    tokio::time::sleep(lock * 3).await;
    for _ in 0..2 {
        let again = engine
            .run(&scope, &k, Identity::Bytes(b"c"), charge(runs.clone()))
            .await;
        assert!(matches!(again, Ok(Outcome::Failed)), "{again:?}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the operation ran again");
}

#[tokio::test]
async fn an_operation_and_an_http_request_never_share_a_fingerprint() {
    let key = key("order-00001");
    let json = http::HeaderValue::from_static("application/json");
    let body = br#"{"sku":"A"}"#;
    let http = Fingerprint::compute(
        &http::Method::POST,
        "/orders",
        &key,
        "acme",
        Some(&json),
        body,
    );
    let run = Fingerprint::compute(
        &http::Method::from_bytes(b"RUN").unwrap(),
        "tower-idempotency:operation",
        &key,
        "acme",
        Some(&json),
        body,
    );
    assert_ne!(http, run);
}

/// A message redelivered after its record's retention: the engine reports
/// `Outcome::Expired` (the tombstone) and does not run the operation again;
/// another message under the key is still `KeyReused`.
#[tokio::test(start_paused = true)]
async fn a_redelivery_past_the_retention_is_expired_and_never_runs_again() {
    let day = Duration::from_secs(24 * 3600);
    let store = MemoryStore::builder()
        .with_retention(day)
        .with_tombstone(7 * day)
        .build();
    let engine = Engine::new(store);
    let scope = Scope::new("payments");
    let runs = Arc::new(AtomicUsize::new(0));
    let charge = |runs: Arc<AtomicUsize>| {
        move |_| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::io::Error>(Bytes::from_static(b"charged"))
        }
    };
    let k = key("msg-late-0001");
    let first = engine
        .run_bytes(
            &scope,
            &k,
            Identity::Bytes(b"order 42"),
            charge(runs.clone()),
        )
        .await;
    assert!(matches!(first, Ok(Outcome::Executed(_))));
    tokio::time::advance(2 * day).await;
    let late = engine
        .run_bytes(
            &scope,
            &k,
            Identity::Bytes(b"order 42"),
            charge(runs.clone()),
        )
        .await;
    assert!(matches!(late, Ok(Outcome::Expired)), "{late:?}");
    let other = engine
        .run_bytes(
            &scope,
            &k,
            Identity::Bytes(b"order 43"),
            charge(runs.clone()),
        )
        .await;
    assert!(matches!(other, Ok(Outcome::KeyReused)), "{other:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
