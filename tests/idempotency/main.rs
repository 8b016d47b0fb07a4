//! `IdempotencyLayer` and `MemoryStore`: the layer's answers, failures and
//! recording, the downstream keys it hands to handlers, hostile input, exactly-once effects (with PostgreSQL and child
//! processes when the features allow), the store's conformance suite and its
//! adversarial checks, and the fingerprint's properties. One test binary, so
//! CI links the dependency graph once for all of them; each module is the
//! file (or folder) of the same name beside this one.

// The helpers they share are the tests package's library
// (`tower_idempotency_tests`, in tests/common/).

#[cfg(feature = "admin")]
mod admin_router;
mod axum_routing;
mod downstream_keys;
mod engine;
mod exactly_once;
mod faults_memory;
mod hostile_input;
mod layer;
mod layer_failures;
mod layer_recording;
mod layer_retention;
// The store conformance suite is behind `test-util`.
mod cancel_memory;
mod clock_step;
#[cfg(feature = "test-util")]
mod memory_store;
mod memory_store_adversarial;
mod phases;
mod phases_within_a_run;
mod proptest_fingerprint;
mod replay_fidelity;
mod store_panics;
mod takeover;

mod keep_alive_memory;
mod simulation;
