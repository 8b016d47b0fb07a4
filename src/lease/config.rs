//! The lease layer's configuration, shared by its services.

use super::key::JobCost;
use crate::lease::store::erased::ErasedJobStore;
use crate::lease::store::Budget;
use crate::options::Options;
use std::sync::Arc;

/// What a [`LeaseLayer`](super::LeaseLayer) was configured with.
#[derive(Clone)]
pub(crate) struct LeaseConfig<K, E> {
    pub(crate) key: K,
    pub(crate) scope: E,
    /// Everything else: what changing the scope's type keeps.
    pub(crate) settings: LeaseSettings,
}

#[derive(Clone)]
pub(crate) struct LeaseSettings {
    pub(crate) store: Arc<dyn ErasedJobStore>,
    pub(crate) kind: Arc<str>,
    pub(crate) owner: Arc<str>,
    pub(crate) budget: Option<Budget>,
    pub(crate) cost: Option<Arc<dyn JobCost>>,
    pub(crate) location_prefix: Arc<str>,
    pub(crate) started_status: StartedStatus,
    pub(crate) options: Options,
}

/// The status of a start that created or stole its job
/// ([`LeaseLayer::with_started_status`](crate::LeaseLayer::with_started_status)):
/// one of the three a start may answer, nothing else.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum StartedStatus {
    /// `202 Accepted`: the work was accepted and runs after the answer.
    #[default]
    Accepted,
    /// `200 OK`, like a join: the body's `created` or `stolen` says it started.
    Ok,
    /// `201 Created`, with the job's `Location`.
    Created,
}

impl From<StartedStatus> for http::StatusCode {
    fn from(status: StartedStatus) -> Self {
        match status {
            StartedStatus::Accepted => Self::ACCEPTED,
            StartedStatus::Ok => Self::OK,
            StartedStatus::Created => Self::CREATED,
        }
    }
}

impl<K, E> std::ops::Deref for LeaseConfig<K, E> {
    type Target = LeaseSettings;

    fn deref(&self) -> &LeaseSettings {
        &self.settings
    }
}

impl<K, E> std::ops::DerefMut for LeaseConfig<K, E> {
    fn deref_mut(&mut self) -> &mut LeaseSettings {
        &mut self.settings
    }
}
