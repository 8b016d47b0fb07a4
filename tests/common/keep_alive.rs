//! What keeps a running claim alive, as scenarios any store runs: an owner
//! whose store stalls, or whose handler blocks its thread, past the moment its
//! claim would have expired, while a competitor keeps trying to take it over.
#![allow(dead_code)]

use bytes::Bytes;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::{sleep, Instant};
use tower_idempotency::engine::{Engine, Identity, Outcome};
use tower_idempotency::{store::Store, IdempotencyKey, Scope};

/// Between two tries of the competitor: many within the moment a lost claim
/// would be free.
const TRY_EVERY: Duration = Duration::from_millis(20);

fn unique(name: &str) -> (Scope, IdempotencyKey) {
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let key = format!("{name}-{}-{n}", std::process::id());
    (
        Scope::new(format!("keep-alive-{name}")),
        IdempotencyKey::parse(key.as_bytes()).unwrap(),
    )
}

/// Another instance asking for the same key: it must find it in progress
/// (its operation, had it run, counts in `runs` too).
async fn competitor_finds_it_in_progress(
    competitor: &Engine,
    (scope, key): &(Scope, IdempotencyKey),
    runs: &Arc<AtomicUsize>,
    when: &str,
) {
    let runs = runs.clone();
    let outcome = competitor
        .run_bytes(scope, key, Identity::Bytes(b"op"), move |_| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::io::Error>(Bytes::from_static(b"competitor"))
        })
        .await
        .unwrap();
    assert_eq!(
        outcome,
        Outcome::InProgress,
        "taken over {when}: the operation ran twice"
    );
}

/// Then the owner finishes: it ran once, and its result is what repeats get.
async fn finishes_once(
    owner: tokio::task::JoinHandle<Outcome<Bytes>>,
    competitor: &Engine,
    (scope, key): &(Scope, IdempotencyKey),
    runs: &Arc<AtomicUsize>,
) {
    let owned = Bytes::from_static(b"owner");
    assert_eq!(owner.await.unwrap(), Outcome::Executed(owned.clone()));
    let again = competitor
        .run_bytes(scope, key, Identity::Bytes(b"op"), |_| async {
            Ok::<_, std::io::Error>(Bytes::from_static(b"again"))
        })
        .await
        .unwrap();
    assert_eq!(again, Outcome::Replayed(owned));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// The owner's store (`owner`, reached through a proxy) stalls for
/// `fraction` of its lock, beginning exactly as the owner sends an
/// extension; `competitor` reaches the same records directly. Through the
/// stall and for half a lock after it, the competitor finds the key in
/// progress; then the owner finishes and its result replays.
///
/// `freeze_at_next_request(d)` arms the proxy; `stall_over()` says whether
/// the stall has ended.
pub async fn a_stall_of_the_owners_store_keeps_its_claim(
    owner: impl Store,
    competitor: impl Store,
    fraction: f64,
    freeze_at_next_request: impl FnOnce(Duration),
    stall_over: impl Fn() -> bool,
) {
    let lock = owner.timings().lock_timeout;
    assert_eq!(competitor.timings().lock_timeout, lock);
    let id = unique("stall");
    let runs = Arc::new(AtomicUsize::new(0));
    let (started, gate) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let owner = {
        let (engine, (scope, key)) = (Engine::new(owner), id.clone());
        let (runs, started, gate) = (runs.clone(), started.clone(), gate.clone());
        tokio::spawn(async move {
            let operation = move |_| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                started.notify_one();
                gate.notified().await;
                Ok::<_, std::io::Error>(Bytes::from_static(b"owner"))
            };
            let run = engine.run_bytes(&scope, &key, Identity::Bytes(b"op"), operation);
            run.await.unwrap()
        })
    };
    started.notified().await;
    // The handler is waiting, its claim is kept alive: the next thing the
    // owner sends is an extension, and the stall begins with it.
    let stall = lock.mul_f64(fraction);
    freeze_at_next_request(stall);
    let competitor = Engine::new(competitor).with_wait_timeout(Duration::ZERO);
    let armed = Instant::now();
    let mut ended = None;
    loop {
        competitor_finds_it_in_progress(&competitor, &id, &runs, "during or after the stall").await;
        match ended {
            None if stall_over() => ended = Some(Instant::now()),
            Some(at) if at.elapsed() > lock / 2 => break,
            _ => {}
        }
        assert!(
            armed.elapsed() < lock * 3,
            "the stall never ended: no extension was sent"
        );
        sleep(TRY_EVERY).await;
    }
    gate.notify_one();
    finishes_once(owner, &competitor, &id, &runs).await;
}

/// On a multi-thread runtime, an owner whose handler blocks its thread for
/// three times the lock keeps its claim: a competitor on `store` trying all
/// along finds it in progress; the handler runs once and its result replays.
pub async fn a_handler_blocking_its_thread_keeps_its_claim(store: impl Store + Clone) {
    let lock = store.timings().lock_timeout;
    let id = unique("blocking");
    let runs = Arc::new(AtomicUsize::new(0));
    let (blocking, done) = (Arc::new(Notify::new()), Arc::new(AtomicBool::new(false)));
    let owner = {
        let (engine, (scope, key)) = (Engine::new(store.clone()), id.clone());
        let (runs, blocking, done) = (runs.clone(), blocking.clone(), done.clone());
        tokio::spawn(async move {
            let operation = move |_| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                // Waits once (its keep-alive starts), then blocks: CPU work,
                // `std::fs`, a synchronous driver.
                tokio::task::yield_now().await;
                blocking.notify_one();
                std::thread::sleep(lock * 3);
                done.store(true, Ordering::SeqCst);
                Ok::<_, std::io::Error>(Bytes::from_static(b"owner"))
            };
            let run = engine.run_bytes(&scope, &key, Identity::Bytes(b"op"), operation);
            run.await.unwrap()
        })
    };
    blocking.notified().await;
    let competitor = Engine::new(store).with_wait_timeout(Duration::ZERO);
    while !done.load(Ordering::SeqCst) {
        competitor_finds_it_in_progress(&competitor, &id, &runs, "while its handler blocked").await;
        sleep(TRY_EVERY * 5).await;
    }
    finishes_once(owner, &competitor, &id, &runs).await;
}
