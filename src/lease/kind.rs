//! [`JobKind`]: what a [`LeaseLayer`](crate::LeaseLayer)'s jobs are.

use crate::config::{validated_str, ConfigError};
use std::sync::Arc;

/// The kind of job a [`LeaseLayer`](crate::LeaseLayer) starts (`"export"`,
/// `"report"`): any non-empty string.
///
/// A job is identified by `(tenant, kind, key)`: the kind keeps apart two
/// layers that share a job store and key their jobs alike (say `/exports`
/// and `/imports`, both by month). An empty kind could not be told apart
/// from a missing one, so `parse` and `try_from` refuse it with
/// [`ConfigError::EmptyJobKind`].
///
/// ```
/// use tower_idempotency::lease::JobKind;
///
/// let kind: JobKind = "report".parse()?;
/// assert_eq!(kind.as_str(), "report");
/// assert!(JobKind::try_from("").is_err());
/// # Ok::<(), tower_idempotency::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct JobKind(Arc<str>);

validated_str!(JobKind, |kind| !kind.is_empty(), |_| {
    ConfigError::EmptyJobKind
});

impl From<JobKind> for Arc<str> {
    fn from(kind: JobKind) -> Self {
        kind.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_kind_is_refused() {
        assert_eq!("".parse::<JobKind>(), Err(ConfigError::EmptyJobKind));
        assert_eq!(
            JobKind::try_from(String::new()),
            Err(ConfigError::EmptyJobKind)
        );
        assert_eq!(JobKind::try_from(" ").unwrap().as_str(), " ");
    }
}
