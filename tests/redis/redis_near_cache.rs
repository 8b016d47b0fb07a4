//! `RedisStore`'s near cache, on a standalone server and on a Cluster: a
//! replay of a record this instance completed or read costs no round trip,
//! never outlives the record, a purge on any instance reaches every
//! instance's cache, and without a subscriber (or disabled) every `begin`
//! asks Redis.

use std::time::Duration;
use tokio::time::Instant;
use tower_idempotency::store::conformance::{fingerprint, record, response};
use tower_idempotency::store::Claim;
use tower_idempotency::store::Completion;
use tower_idempotency::store::Maintenance;
use tower_idempotency::store::NearCache;
use tower_idempotency::{
    store::{Begin, FencingToken, RecordKey, RedisStoreBuilder, Store},
    RedisStore,
};
use tower_idempotency_tests::support::redis as r;

/// How to reach one deployment: the standalone server or the Cluster.
enum Deployment {
    Standalone(String),
    Cluster(Vec<String>),
}

impl Deployment {
    /// Both deployments (or none, skipping loudly, unless `REQUIRE_REDIS=1`).
    fn both(test: &str) -> Vec<Self> {
        match (r::url(test), r::cluster(test)) {
            (Some(url), Some(nodes)) => vec![Self::Standalone(url), Self::Cluster(nodes)],
            _ => Vec::new(),
        }
    }

    /// A store of this deployment, configured by `builder`.
    async fn connect(&self, builder: RedisStoreBuilder) -> RedisStore {
        match self {
            Self::Standalone(url) => builder.connect(url).await.expect("connect to Redis"),
            Self::Cluster(nodes) => {
                let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
                builder
                    .connect_cluster(&nodes)
                    .await
                    .expect("connect to the Redis Cluster")
            }
        }
    }

    /// Two instances of one store (one prefix), both subscribed.
    async fn two_instances(
        &self,
        f: impl Fn(RedisStoreBuilder) -> RedisStoreBuilder,
    ) -> (RedisStore, RedisStore) {
        let builder =
            f(RedisStore::builder().with_prefix(r::unique_prefix("near").parse().unwrap()));
        let a = self.connect(builder.clone()).await;
        let b = self.connect(builder).await;
        until_listening(&a).await;
        until_listening(&b).await;
        (a, b)
    }
}

async fn until_listening(store: &RedisStore) {
    store.start_listener();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !store.is_listening() {
        assert!(Instant::now() < deadline, "the subscriber never connected");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn fresh_key() -> RecordKey {
    record("tenant", &r::unique_prefix("order"))
}

async fn claim(store: &RedisStore, key: &RecordKey, body: &str) -> FencingToken {
    match store.begin(key, &fingerprint(body)).await.unwrap() {
        Begin::Claimed(Claim { token, .. }) => token,
        other => panic!("a fresh key is claimed, not {other:?}"),
    }
}

async fn replays(store: &RedisStore, key: &RecordKey, times: usize) {
    for _ in 0..times {
        match store.begin(key, &fingerprint("order")).await.unwrap() {
            Begin::Replay(stored) => assert_eq!(stored.body, "created"),
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_keys_retries_reach_redis_once_per_instance() {
    for deployment in Deployment::both("near cache: hot key") {
        let (a, b) = deployment.two_instances(|s| s).await;
        let key = fresh_key();
        let token = claim(&a, &key, "order").await;
        a.complete(&key, token, Completion::Response(response(b"created")))
            .await
            .unwrap();
        // Even the instance that completed it reads it once (completions are
        // not kept near: most keys are never retried), then answers near.
        let before = a.round_trips();
        replays(&a, &key, 100).await;
        assert_eq!(a.round_trips() - before, 1, "completed here: read once");
        // Another instance reads it once, then answers near.
        let before = b.round_trips();
        replays(&b, &key, 100).await;
        assert_eq!(b.round_trips() - before, 1, "read once");
        // Another request under the key is refused near as well.
        let before = b.round_trips();
        assert!(matches!(
            b.begin(&key, &fingerprint("another")).await,
            Ok(Begin::KeyReused)
        ));
        assert_eq!(b.round_trips() - before, 0);
        // A completion without a response too.
        let key = fresh_key();
        let token = claim(&a, &key, "order").await;
        a.complete(&key, token, Completion::Unavailable)
            .await
            .unwrap();
        let before = (a.round_trips(), b.round_trips());
        for store in [&a, &b, &a, &b] {
            assert!(matches!(
                store.begin(&key, &fingerprint("order")).await,
                Ok(Begin::ResponseUnavailable)
            ));
        }
        assert_eq!(
            (a.round_trips(), b.round_trips()),
            (before.0 + 1, before.1 + 1)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_on_one_instance_reaches_the_near_cache_of_every_instance() {
    for deployment in Deployment::both("near cache: purge") {
        let (a, b) = deployment
            .two_instances(|s| s.with_retention(Duration::from_secs(60)))
            .await;
        let key = fresh_key();
        let token = claim(&a, &key, "order").await;
        a.complete(&key, token, Completion::Response(response(b"created")))
            .await
            .unwrap();
        replays(&b, &key, 1).await;
        let before = b.round_trips();
        replays(&b, &key, 1).await;
        assert_eq!(b.round_trips() - before, 0, "kept near by b");
        assert_eq!(a.purge_scope(key.scope()).await.unwrap(), 1);
        // Here at once.
        assert!(matches!(
            a.begin(&key, &fingerprint("order")).await,
            Ok(Begin::Claimed(_))
        ));
        // There once the message arrived (well within the cache's 10 s TTL):
        // the key then answers "in progress" (a's new claim), never the
        // purged record.
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            match b.begin(&key, &fingerprint("order")).await.unwrap() {
                Begin::InProgress => break,
                Begin::Replay(_) => assert!(Instant::now() < deadline, "the purge never arrived"),
                other => panic!("{other:?}"),
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The message woke no waiter and was not taken for a record's name.
        assert_eq!(b.watched_keys(), 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_near_record_never_outlives_its_retention() {
    let retention = Duration::from_secs(1);
    for deployment in Deployment::both("near cache: retention") {
        let (a, b) = deployment
            .two_instances(|s| s.with_retention(retention))
            .await;
        let key = fresh_key();
        let token = claim(&a, &key, "order").await;
        let completed = Instant::now();
        a.complete(&key, token, Completion::Response(response(b"created")))
            .await
            .unwrap();
        replays(&a, &key, 1).await;
        // b reads it half-way through its retention: b keeps it for what is
        // left of the record's TTL, not for a whole retention from the read.
        tokio::time::sleep(Duration::from_millis(500)).await;
        replays(&b, &key, 1).await;
        tokio::time::sleep_until(completed + retention + Duration::from_millis(100)).await;
        // Past the retention: the server's tombstone answers, not a near copy.
        for store in [&b, &a] {
            assert!(matches!(
                store.begin(&key, &fingerprint("order")).await,
                Ok(Begin::Expired)
            ));
        }
    }
}

/// A user that may do everything but subscribe: the store's subscriber never
/// connects, so purges elsewhere could not reach its near cache.
async fn unsubscribable_user(deployment: &Deployment) -> (String, String) {
    let user = r::unique_prefix("nosub").replace('-', "_");
    let urls = match deployment {
        Deployment::Standalone(url) => vec![url.clone()],
        // ACLs are per node: every node the client or the subscriber may use.
        Deployment::Cluster(nodes) => nodes.clone(),
    };
    for url in &urls {
        let mut conn = r::connection(url).await;
        let _: () = redis::cmd("ACL")
            .arg(&["SETUSER", &user, "on", ">secret", "~*", "&*", "+@all"])
            .arg(&["-subscribe", "-psubscribe", "-ssubscribe"])
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    (user, "secret".to_owned())
}

fn with_user(url: &str, (user, password): &(String, String)) -> String {
    url.replacen("redis://", &format!("redis://{user}:{password}@"), 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsubscribed_or_disabled_every_begin_asks_redis() {
    for deployment in Deployment::both("near cache: off") {
        let credentials = unsubscribable_user(&deployment).await;
        let unheard = match &deployment {
            Deployment::Standalone(url) => Deployment::Standalone(with_user(url, &credentials)),
            Deployment::Cluster(nodes) => {
                Deployment::Cluster(nodes.iter().map(|n| with_user(n, &credentials)).collect())
            }
        };
        let unheard = unheard
            .connect(
                RedisStore::builder().with_prefix(r::unique_prefix("unheard").parse().unwrap()),
            )
            .await;
        unheard.start_listener();
        let disabled = RedisStore::builder()
            .with_prefix(r::unique_prefix("disabled").parse().unwrap())
            .with_near_cache(NearCache::disabled());
        let disabled = deployment.connect(disabled).await;
        until_listening(&disabled).await;
        for store in [&unheard, &disabled] {
            let key = fresh_key();
            let token = claim(store, &key, "order").await;
            store
                .complete(&key, token, Completion::Response(response(b"created")))
                .await
                .unwrap();
            let before = store.round_trips();
            replays(store, &key, 3).await;
            assert_eq!(store.round_trips() - before, 3, "{store:?}");
        }
        assert!(!unheard.is_listening());
    }
}
