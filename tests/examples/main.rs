//! The examples, driven over loopback HTTP (and the checkout demo as a
//! process): checkout's contract and binary, per-route axum, plain hyper,
//! gRPC-Web, layer order, the queue consumer (as processes), and the client
//! helpers. One test binary; each
//! module is the file of the same name.

// Helpers the modules below share, declared once.
mod http;

#[path = "checkout_binary.rs"]
mod checkout_binary;
#[path = "checkout_contract.rs"]
mod checkout_contract;
#[path = "examples_axum_per_route.rs"]
mod examples_axum_per_route;
#[cfg(feature = "client")]
#[path = "examples_client.rs"]
mod examples_client;
#[path = "examples_consumer.rs"]
mod examples_consumer;
#[path = "examples_grpc_web.rs"]
mod examples_grpc_web;
#[path = "examples_hyper_service_fn.rs"]
mod examples_hyper_service_fn;
#[path = "examples_layer_order.rs"]
mod examples_layer_order;
