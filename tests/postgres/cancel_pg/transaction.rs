//! `TransactionalStore` and `RecordTransaction` methods cut at every poll.
//! After each cut, besides the pool's invariants: the handler's write
//! committed exactly when the completion did, and the key settles.

use super::cases::{done, fresh_key, Probe};
use super::driver::at_every_poll;
use super::{postgres, PgProbe};
use tower_idempotency::store::conformance::fingerprint;
use tower_idempotency::store::Claim;
use tower_idempotency::store::Completion;
use tower_idempotency::store::{PostgresRecordTransaction, RecordTransaction, TransactionalStore};
use tower_idempotency::{
    store::{Begin, RecordKey, Store},
    PostgresStore, PostgresTransaction,
};

type Harness = super::Harness<PostgresStore, PgProbe>;

/// A fresh key's claim with its transaction open, and a row written through it.
async fn open_with_effect(h: &Harness) -> (RecordKey, PostgresRecordTransaction) {
    let key = fresh_key();
    let (begun, opened) = h
        .store
        .begin_in_transaction(&key, &fingerprint("cut"))
        .await
        .unwrap();
    let Begin::Claimed(Claim { token, .. }) = begun else {
        panic!("a fresh key answered {begun:?}");
    };
    let transaction = match opened {
        Some(transaction) => transaction,
        None => h.store.open(&key, token).await.unwrap(),
    };
    write_effect(&h.probe, &key, &transaction).await;
    (key, transaction)
}

async fn write_effect(probe: &PgProbe, key: &RecordKey, transaction: &PostgresRecordTransaction) {
    let mut extensions = http::Extensions::new();
    transaction.share(&mut extensions);
    let handle = extensions.get::<PostgresTransaction>().unwrap().clone();
    let client = handle.client().await.unwrap();
    let sql = format!("INSERT INTO {}_effects (key) VALUES ($1)", probe.table);
    client
        .execute(&sql, &[&key.scope().as_str()])
        .await
        .unwrap();
}

/// Completes `key`'s claim, with a write, through the transaction it opened.
async fn commit_through(h: &Harness, key: &RecordKey, transaction: PostgresRecordTransaction) {
    write_effect(&h.probe, key, &transaction).await;
    transaction
        .commit(Completion::Response(done(b"done")))
        .await
        .unwrap();
    h.replays("the transaction's commit", key, b"done").await;
    assert_eq!(h.probe.effects(key.scope().as_str()).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn begin_in_transaction_cut_at_every_poll() {
    let Some(h) = postgres().await else { return };
    let h = &h;
    at_every_poll(
        "begin_in_transaction",
        |_| async {
            let (store, key) = (h.store.clone(), fresh_key());
            let cut_key = key.clone();
            let future = async move {
                store
                    .begin_in_transaction(&cut_key, &fingerprint("cut"))
                    .await
            };
            (future, key)
        },
        |cut, key| async move {
            let what = format!("begin_in_transaction cut after {} polls", cut.polls);
            match cut.output {
                Some(Ok((Begin::Claimed(Claim { token, .. }), opened))) => {
                    let transaction = match opened {
                        Some(transaction) => transaction,
                        None => h.store.open(&key, token).await.unwrap(),
                    };
                    commit_through(h, &key, transaction).await;
                    h.after_cut(&what).await;
                }
                Some(other) => panic!("{what}: a fresh key answered {:?}", other.map(|b| b.0)),
                None => {
                    let begun = h.after_cut_settled(&what, &key).await;
                    assert!(matches!(begun, Begin::Claimed(_)), "{what}: {begun:?}");
                }
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_cut_at_every_poll() {
    let Some(h) = postgres().await else { return };
    let h = &h;
    at_every_poll(
        "open",
        |_| async {
            let key = fresh_key();
            let token = h.claim(&key).await;
            let (store, cut_key) = (h.store.clone(), key.clone());
            (async move { store.open(&cut_key, token).await }, key)
        },
        |cut, key| async move {
            let what = format!("open cut after {} polls", cut.polls);
            match cut.output {
                Some(Ok(transaction)) => {
                    commit_through(h, &key, transaction).await;
                    h.after_cut(&what).await;
                }
                Some(Err(error)) => panic!("{what}: the owner's open failed: {error}"),
                None => {
                    let begun = h.after_cut_settled(&what, &key).await;
                    assert!(matches!(begun, Begin::Claimed(_)), "{what}: {begun:?}");
                }
            }
        },
    )
    .await;
}

/// How a claim's transaction is ended by the method under test.
#[derive(Clone, Copy, Debug)]
enum End {
    Commit,
    CommitUnavailable,
    Rollback,
}

async fn end_cut_at_every_poll(end: End) {
    let Some(h) = postgres().await else { return };
    let h = &h;
    let method = &format!("{end:?}");
    at_every_poll(
        method,
        |_| async {
            let (key, transaction) = open_with_effect(h).await;
            let future = async move {
                match end {
                    End::Commit => {
                        transaction
                            .commit(Completion::Response(done(b"done")))
                            .await
                    }
                    End::CommitUnavailable => transaction.commit(Completion::Unavailable).await,
                    End::Rollback => {
                        transaction.rollback().await;
                        Ok(())
                    }
                }
            };
            (future, key)
        },
        |cut, key| async move {
            let what = format!(
                "{method} cut after {} polls (dropped: {})",
                cut.polls,
                cut.dropped()
            );
            if let Some(Err(error)) = &cut.output {
                panic!("{what}: the owner's {method} failed: {error}");
            }
            let committed = |begun: &Begin| match end {
                End::Commit => matches!(begun, Begin::Replay(stored) if stored.body == "done"),
                End::CommitUnavailable => matches!(begun, Begin::ResponseUnavailable),
                End::Rollback => false,
            };
            let begun = match (end, &cut.output) {
                (End::Commit | End::CommitUnavailable, Some(Ok(()))) => {
                    h.after_cut(&what).await;
                    h.store.begin(&key, &fingerprint("cut")).await.unwrap()
                }
                _ => h.after_cut_settled(&what, &key).await,
            };
            let effects = h.probe.effects(key.scope().as_str()).await;
            if committed(&begun) {
                assert_eq!(
                    effects, 1,
                    "{what}: the completion committed without the write"
                );
                assert_eq!(h.probe.committed(&key).await, Some(true), "{what}");
            } else {
                assert!(
                    matches!(begun, Begin::Claimed(_))
                        && !matches!(cut.output, Some(Ok(())) if !matches!(end, End::Rollback)),
                    "{what}: acknowledged, then {begun:?}"
                );
                assert_eq!(
                    effects, 0,
                    "{what}: the write committed without the completion"
                );
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_cut_at_every_poll() {
    end_cut_at_every_poll(End::Commit).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_unavailable_cut_at_every_poll() {
    end_cut_at_every_poll(End::CommitUnavailable).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_cut_at_every_poll() {
    end_cut_at_every_poll(End::Rollback).await;
}
