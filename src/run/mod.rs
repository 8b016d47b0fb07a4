//! The run-once core under every front door: the store's decision (waiting
//! out a request in progress), the claim held until it is kept or released,
//! its keep-alive, the count of runs under way, and the claimed run itself
//! ([`claimed`]), in which the order of commit, keep and release that the
//! promise depends on is written once.
//!
//! The doors above it (`idempotency/` for HTTP requests, `engine/` for any
//! other operation) bring their work and map the decision to their answers;
//! nothing here knows HTTP bodies.

pub(crate) mod attempt;
pub(crate) mod claim;
pub(crate) mod claimed;
pub(crate) mod decide;
pub(crate) mod in_flight;
pub(crate) mod keep_alive;
pub(crate) mod phases;
pub(crate) mod recorder;
