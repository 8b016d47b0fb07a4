//! `IdempotencyLayer` and `MemoryStore`: the layer's answers, failures and
//! recording, hostile input, exactly-once effects (with PostgreSQL and child
//! processes when the features allow), the store's conformance suite and its
//! adversarial checks, and the fingerprint's properties. One test binary, so
//! CI links the dependency graph once for all of them; each module is the
//! file of the same name.

// Helpers the modules below share, declared once.
#[path = "support/exact_json.rs"]
mod exact_json;
mod http;
mod oneshot;
#[cfg(feature = "postgres")]
mod support;

#[path = "axum_routing.rs"]
mod axum_routing;
#[path = "engine.rs"]
mod engine;
#[path = "exactly_once.rs"]
mod exactly_once;
#[path = "hostile_input.rs"]
mod hostile_input;
#[path = "layer.rs"]
mod layer;
#[path = "layer_failures.rs"]
mod layer_failures;
#[path = "layer_recording.rs"]
mod layer_recording;
#[path = "layer_retention.rs"]
mod layer_retention;
// The store conformance suite is behind `test-util`.
#[path = "cancel_memory.rs"]
mod cancel_memory;
#[cfg(feature = "test-util")]
#[path = "memory_store.rs"]
mod memory_store;
#[path = "memory_store_adversarial/main.rs"]
mod memory_store_adversarial;
#[path = "proptest_fingerprint.rs"]
mod proptest_fingerprint;
#[path = "takeover.rs"]
mod takeover;

#[path = "keep_alive_memory.rs"]
mod keep_alive_memory;
#[path = "simulation/mod.rs"]
mod simulation;
