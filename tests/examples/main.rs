//! The examples, driven over loopback HTTP (and the checkout demo as a
//! process): checkout's contract and binary, checkout charging the card
//! processor and killed mid-charge, per-route axum, plain hyper,
//! gRPC-Web, layer order, the queue consumer (as processes), and the client
//! helpers. One test binary; each module is the file of the same name beside
//! this one.

// The helpers they share are the tests package's library
// (`tower_idempotency_tests`, in tests/common/).

mod checkout_as_written;
mod checkout_binary;
mod checkout_contract;
mod checkout_phased;
mod checkout_processor;
mod docs_commands;
mod examples_axum_per_route;
#[cfg(feature = "client")]
mod examples_client;
mod examples_consumer;
mod examples_grpc_web;
mod examples_hyper_service_fn;
mod examples_layer_order;
