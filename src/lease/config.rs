//! The lease layer's configuration, shared by its services.

use super::key::JobCost;
use crate::lease::store::{Budget, JobStore};
use crate::response::Responder;
use http::Method;
use std::sync::Arc;
use std::time::Duration;

/// What a [`LeaseLayer`](super::LeaseLayer) was configured with.
#[derive(Clone)]
pub(crate) struct LeaseConfig<K, E> {
    pub(crate) store: Arc<dyn JobStore>,
    pub(crate) kind: Arc<str>,
    pub(crate) methods: Vec<Method>,
    pub(crate) key: K,
    pub(crate) scope: E,
    pub(crate) owner: Arc<str>,
    pub(crate) budget: Option<Budget>,
    pub(crate) cost: Option<Arc<dyn JobCost>>,
    pub(crate) body_limit: usize,
    pub(crate) body_timeout: Option<Duration>,
    pub(crate) location_prefix: Arc<str>,
    pub(crate) responder: Responder,
}
