//! Heavy concurrency: one holder per key, and `len()` under racing purges.

use super::*;
use tower_idempotency::store::Completion;
use tower_idempotency::store::Maintenance;

/// Hundreds of tasks on a few keys: at most one holder per key at any time,
/// every task ends with a replay or its own claim, and `len()` matches.
#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn many_tasks_one_holder_per_key() {
    const KEYS: usize = 32;
    const TASKS_PER_KEY: usize = 24;
    let store = MemoryStore::new();
    let holders: Arc<Vec<AtomicBool>> =
        Arc::new((0..KEYS).map(|_| AtomicBool::new(false)).collect());
    let claims = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for t in 0..KEYS * TASKS_PER_KEY {
        let (store, holders, claims) = (store.clone(), holders.clone(), claims.clone());
        tasks.push(tokio::spawn(async move {
            let k = t % KEYS;
            let key = record(&format!("s{}", k % 3), &format!("conc-key-{k:08}"));
            loop {
                match store.begin(&key, &fp("same")).await.unwrap() {
                    Begin::Claimed(Claim { token, .. }) => {
                        claims.fetch_add(1, Ordering::SeqCst);
                        assert!(
                            !holders[k].swap(true, Ordering::SeqCst),
                            "two holders of key {k}"
                        );
                        tokio::task::yield_now().await;
                        holders[k].store(false, Ordering::SeqCst);
                        // Odd keys are released by their first holders: the
                        // next waiter claims; the last one completes.
                        if k % 2 == 1 && t / KEYS < TASKS_PER_KEY / 2 {
                            store.release(&key, token).await.unwrap();
                        } else {
                            store
                                .complete(
                                    &key,
                                    token,
                                    Completion::Response(body_response(format!("k{k}"))),
                                )
                                .await
                                .unwrap();
                        }
                        return;
                    }
                    Begin::Replay(response) => {
                        assert_eq!(response.body, format!("k{k}"));
                        return;
                    }
                    Begin::InProgress => {
                        store.wait(&key, Duration::from_secs(5)).await.unwrap();
                    }
                    other => panic!("{other:?} on key {k}"),
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(store.len(), KEYS, "one completed record per key");
    for k in 0..KEYS {
        let key = record(&format!("s{}", k % 3), &format!("conc-key-{k:08}"));
        assert_eq!(
            replayed(&store, &key, &fp("same")).await.body,
            format!("k{k}")
        );
    }
    assert!(claims.load(Ordering::SeqCst) >= KEYS);
    drain_and_check(&store, &["s0", "s1", "s2"]).await;
}

/// Every first begin on a fresh key races hundreds of others: exactly one
/// claim per key, and `len()` is exactly the number of keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn exactly_one_claim_per_key_under_contention() {
    const KEYS: usize = 50;
    const TASKS_PER_KEY: usize = 20;
    let store = MemoryStore::new();
    let barrier = Arc::new(tokio::sync::Barrier::new(KEYS * TASKS_PER_KEY));
    let tasks: Vec<_> = (0..KEYS * TASKS_PER_KEY)
        .map(|t| {
            let (store, barrier) = (store.clone(), barrier.clone());
            tokio::spawn(async move {
                let k = t % KEYS;
                let key = record("race", &format!("race-key-{k:08}"));
                barrier.wait().await;
                (k, store.begin(&key, &fp("same")).await.unwrap())
            })
        })
        .collect();
    let mut claims = vec![0; KEYS];
    for task in tasks {
        match task.await.unwrap() {
            (k, Begin::Claimed(_)) => claims[k] += 1,
            (_, Begin::InProgress) => {}
            (k, other) => panic!("key {k}: unexpected {other:?}"),
        }
    }
    assert!(claims.iter().all(|&c| c == 1), "claims per key: {claims:?}");
    assert_eq!(store.len(), KEYS);
    drain_and_check(&store, &["race"]).await;
}

/// Claims, completions, releases and purges of one scope race claims of
/// another; `len()` never underflows (wraps) mid-way, and at the end it is
/// exactly what the purges find.
#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn len_stays_consistent_under_concurrent_purges() {
    let store = MemoryStore::new();
    let stop = Arc::new(AtomicBool::new(false));
    let observer = {
        let (store, stop) = (store.clone(), stop.clone());
        tokio::spawn(async move {
            let mut max = 0;
            while !stop.load(Ordering::Relaxed) {
                max = max.max(store.len());
                tokio::task::yield_now().await;
            }
            max
        })
    };
    let purger = {
        let (store, stop) = (store.clone(), stop.clone());
        tokio::spawn(async move {
            let mut purged = 0;
            while !stop.load(Ordering::Relaxed) {
                purged += store.purge_scope(&Scope::new("victim")).await.unwrap();
                tokio::task::yield_now().await;
            }
            purged
        })
    };
    let workers: Vec<_> = (0..16)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut kept = 0usize;
                for i in 0..300 {
                    let scope = if i % 2 == 0 { "victim" } else { "kept" };
                    let key = record(scope, &format!("w{w}-key-{i:08}"));
                    let Begin::Claimed(Claim { token, .. }) =
                        store.begin(&key, &fp("x")).await.unwrap()
                    else {
                        panic!("fresh key not claimed");
                    };
                    let result = match i % 3 {
                        0 => store.release(&key, token).await,
                        _ => {
                            store
                                .complete(&key, token, Completion::Response(body_response("r")))
                                .await
                        }
                    };
                    match (scope, result) {
                        ("kept", Ok(())) => kept += usize::from(i % 3 != 0),
                        ("kept", Err(e)) => panic!("kept scope lost its claim: {e}"),
                        // A purge may have removed the victim's claim first.
                        (_, Ok(()) | Err(StoreError::ClaimLost)) => {}
                        (_, Err(e)) => panic!("unexpected {e}"),
                    }
                }
                kept
            })
        })
        .collect();
    let mut kept = 0;
    for worker in workers {
        kept += worker.await.unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let max = observer.await.unwrap();
    purger.await.unwrap();
    assert!(max <= 16 * 300, "len() wrapped around: {max}");
    assert_eq!(
        store.purge_scope(&Scope::new("kept")).await.unwrap() as usize,
        kept
    );
    store.purge_scope(&Scope::new("victim")).await.unwrap();
    assert_eq!(store.len(), 0);
}

/// A purge that removes a claim the instant it is inserted must not subtract
/// it before the claim was counted: `len()` would wrap to ~`usize::MAX` for a
/// moment, and a concurrent `begin` of a new key would find the store "full"
/// (a spurious `CapacityExceeded`, after a whole-map sweep). OS threads and
/// blocking calls maximise preemption between the two steps.
#[test]
fn len_never_wraps_when_a_purge_races_a_new_claim() {
    let store = MemoryStore::new();
    let stop = Arc::new(AtomicBool::new(false));
    let wrapped = Arc::new(AtomicUsize::new(0));
    let full = Arc::new(AtomicUsize::new(0));
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let mut threads = Vec::new();
    {
        let (store, stop, wrapped) = (store.clone(), stop.clone(), wrapped.clone());
        threads.push(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if store.len() > 1 << 40 {
                    wrapped.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for _ in 0..4 {
        let (store, stop) = (store.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let rt = runtime();
            while !stop.load(Ordering::Relaxed) {
                rt.block_on(store.purge_scope(&Scope::new("victim")))
                    .unwrap();
            }
        }));
    }
    for w in 0..6 {
        let (store, stop, full) = (store.clone(), stop.clone(), full.clone());
        threads.push(std::thread::spawn(move || {
            let rt = runtime();
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let scope = if w % 3 == 0 { "bystander" } else { "victim" };
                let key = record(scope, &format!("w{w}-key-{i:012}"));
                i += 1;
                match rt.block_on(store.begin(&key, &fp("x"))) {
                    Ok(Begin::Claimed(Claim { token, .. })) if scope == "bystander" => {
                        rt.block_on(store.release(&key, token)).unwrap();
                    }
                    Ok(Begin::Claimed(_)) => {}
                    Err(StoreError::Backend(e))
                        if e.downcast_ref::<tower_idempotency::store::MemoryStoreError>()
                            .is_some() =>
                    {
                        full.fetch_add(1, Ordering::Relaxed);
                    }
                    other => panic!("fresh key {key:?}: {other:?}"),
                }
            }
        }));
    }
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::Relaxed);
    for thread in threads {
        thread.join().unwrap();
    }
    let (wrapped, full) = (
        wrapped.load(Ordering::Relaxed),
        full.load(Ordering::Relaxed),
    );
    assert_eq!(wrapped, 0, "len() wrapped below zero {wrapped} times");
    assert_eq!(
        full, 0,
        "an empty store answered CapacityExceeded {full} times"
    );
    let rt = runtime();
    rt.block_on(store.purge_scope(&Scope::new("victim")))
        .unwrap();
    assert_eq!(store.len(), 0);
}
