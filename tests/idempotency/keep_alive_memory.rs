//! A running claim on `MemoryStore` is kept alive by a task of its own: a
//! handler blocking its thread does not stop it.

use std::time::Duration;
use tower_idempotency::MemoryStore;
use tower_idempotency_tests::keep_alive;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_blocking_its_thread_past_its_lock_is_not_taken_over() {
    let store = MemoryStore::builder()
        .with_lock_timeout(Duration::from_secs(1))
        .build();
    keep_alive::a_handler_blocking_its_thread_keeps_its_claim(store).await;
}
