//! [`ConfigError`]: why a configuration value was refused.
//!
//! Options that can be wrong take a type that can only hold a valid value
//! (a table name, a Redis prefix, a job kind, a secret), made by `parse`,
//! `try_from` or `new`, each returning this error: a mistake surfaces as an
//! `Err` at startup, where `?` reports it, never as a panic.

use std::fmt;

/// A configuration value that was refused, and why.
///
/// Returned by the constructors of the validated option types
/// (`SqlIdentifier`, `RedisPrefix`, `JobKind`, [`KeyReuseStatus`](crate::KeyReuseStatus),
/// [`DownstreamSecret`](crate::downstream::DownstreamSecret)). It implements
/// [`std::error::Error`], so `?` turns it into the application's error type.
///
/// ```
/// use tower_idempotency::{ConfigError, downstream::DownstreamSecret};
///
/// let refused = DownstreamSecret::new(b"too short").unwrap_err();
/// assert_eq!(refused, ConfigError::ShortSecret { len: 9, min: 16 });
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// A PostgreSQL schema or table name that is not a plain lower-case
    /// identifier `[a-z_][a-z0-9_]{0,62}`: the name refused.
    SqlIdentifier(String),
    /// A Redis key prefix that is not 1 to 64 of `[A-Za-z0-9_.:-]`: the
    /// prefix refused.
    RedisPrefix(String),
    /// An empty job kind: two layers sharing a job store could not be told
    /// apart.
    EmptyJobKind,
    /// A status for a reused key other than `409` and `422`: the status
    /// refused.
    KeyReuseStatus(http::StatusCode),
    /// A downstream secret shorter than
    /// [`MIN_SECRET_LEN`](crate::downstream::MIN_SECRET_LEN) bytes: its
    /// length (never its bytes).
    ShortSecret {
        /// The refused secret's length, in bytes.
        len: usize,
        /// The shortest length accepted, in bytes.
        min: usize,
    },
    /// A [`PurgeTask`](crate::store::purge::PurgeTask) period of zero, or
    /// one too long to add its jitter to: the period refused.
    PurgePeriod(std::time::Duration),
    /// A [`PurgeTask`](crate::store::purge::PurgeTask) jitter that is not a
    /// fraction from 0 up to (not including) 1.
    PurgeJitter,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::SqlIdentifier(name) => write!(
                f,
                "{name:?} is not a plain lower-case SQL identifier [a-z_][a-z0-9_]{{0,62}}"
            ),
            Self::RedisPrefix(prefix) => write!(
                f,
                "{prefix:?} is not a Redis key prefix of 1 to 64 of [A-Za-z0-9_.:-]"
            ),
            Self::EmptyJobKind => f.write_str("a job kind must not be empty"),
            Self::KeyReuseStatus(status) => write!(
                f,
                "{status} is not a key reuse status: 409 Conflict or 422 Unprocessable Entity"
            ),
            Self::ShortSecret { len, min } => write!(
                f,
                "a downstream secret needs at least {min} bytes, not {len}"
            ),
            Self::PurgePeriod(period) => write!(
                f,
                "{period:?} is not a purge period: it must be above zero and fit its jitter"
            ),
            Self::PurgeJitter => {
                f.write_str("a purge jitter must be a fraction from 0 up to (not including) 1")
            }
        }
    }
}

impl std::error::Error for ConfigError {}

/// The conversions of a validated string option `$name($inner)`: `FromStr`,
/// `TryFrom<&str>` and `TryFrom<String>` (each checked by `$valid`, refused
/// with `$refused(value)`), `as_str`, `AsRef<str>` and `Display`.
#[cfg_attr(
    not(any(feature = "postgres", feature = "redis", feature = "leases")),
    allow(unused_macros)
)]
macro_rules! validated_str {
    ($name:ident, $valid:expr, $refused:expr) => {
        impl $name {
            /// The value, as given.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = $crate::config::ConfigError;

            fn try_from(value: String) -> Result<Self, Self::Error> {
                let valid: fn(&str) -> bool = $valid;
                let refused: fn(String) -> $crate::config::ConfigError = $refused;
                match valid(&value) {
                    true => Ok(Self(value.into())),
                    false => Err(refused(value)),
                }
            }
        }

        impl TryFrom<&str> for $name {
            type Error = $crate::config::ConfigError;

            fn try_from(value: &str) -> Result<Self, Self::Error> {
                Self::try_from(value.to_owned())
            }
        }

        impl ::std::str::FromStr for $name {
            type Err = $crate::config::ConfigError;

            fn from_str(value: &str) -> Result<Self, Self::Err> {
                Self::try_from(value.to_owned())
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}
#[cfg_attr(
    not(any(feature = "postgres", feature = "redis", feature = "leases")),
    allow(unused_imports)
)]
pub(crate) use validated_str;
