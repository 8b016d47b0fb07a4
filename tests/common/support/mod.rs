//! Helpers shared by integration tests.
#![allow(dead_code)]

pub mod child;
#[cfg(feature = "postgres")]
pub mod pg;
pub mod proxy;
#[cfg(feature = "redis")]
pub mod redis;
