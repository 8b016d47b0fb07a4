//! What the integration test binaries of tower-idempotency share: servers to
//! test against (PostgreSQL, Redis, a TCP proxy that cuts or freezes them, the
//! test binary re-run as a server process), a real HTTP client and the
//! examples as processes, the layer's in-process harness, an exact model of
//! JSON, and the scenarios several binaries run on their own store (cancel at
//! every poll, every fault at every poll, keep-alive, stall at every phase,
//! the headers replayed with a recorded body).
//!
//! Each binary is a folder beside this one (`idempotency/main.rs`, ...) and
//! uses these as `tower_idempotency_tests::...`. Gated on the features of the
//! same names as the library's, as the binaries are.

pub mod cancel;
pub mod exact_json;
#[cfg(feature = "test-util")]
pub mod faults;
pub mod http;
pub mod keep_alive;
pub mod oneshot;
pub mod phase_cost;
pub mod representation;
pub mod stalls;
pub mod support;
