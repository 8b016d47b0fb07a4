//! Which responses are recorded for replay.

use http::response::Parts;
use http::StatusCode;

/// Decides whether a response is recorded and replayed for later retries.
///
/// A response that is not recorded frees the key, so a corrected request can
/// run. Closures `Fn(&http::response::Parts) -> bool` implement this trait.
///
/// ```
/// use tower_idempotency::{RecordPolicy, RecordCreated};
///
/// let (created, ()) = http::Response::builder().status(201).body(()).unwrap().into_parts();
/// let (ok, ()) = http::Response::builder().status(200).body(()).unwrap().into_parts();
/// assert!(RecordCreated.should_record(&created));
/// assert!(!RecordCreated.should_record(&ok));
///
/// let any_success = |parts: &http::response::Parts| parts.status.is_success();
/// assert!(any_success.should_record(&ok));
/// ```
pub trait RecordPolicy: Clone + Send + Sync + 'static {
    /// Returns `true` to record the response under the key.
    fn should_record(&self, response: &Parts) -> bool;
}

impl<F> RecordPolicy for F
where
    F: Fn(&Parts) -> bool + Clone + Send + Sync + 'static,
{
    fn should_record(&self, response: &Parts) -> bool {
        self(response)
    }
}

/// Records `201 Created` only: the contract's default.
#[derive(Clone, Copy, Debug, Default)]
pub struct RecordCreated;

impl RecordPolicy for RecordCreated {
    fn should_record(&self, response: &Parts) -> bool {
        response.status == StatusCode::CREATED
    }
}

/// Records every `2xx` response.
#[derive(Clone, Copy, Debug, Default)]
pub struct RecordSuccess;

impl RecordPolicy for RecordSuccess {
    fn should_record(&self, response: &Parts) -> bool {
        response.status.is_success()
    }
}
