//! [`SqlIdentifier`]: a schema or table name the stores accept.

use super::sql::is_identifier;
use crate::config::{validated_str, ConfigError};

/// A plain lower-case PostgreSQL identifier, `[a-z_][a-z0-9_]{0,62}`: the
/// schema and table names of [`PostgresStore`](crate::PostgresStore) and
/// `PostgresJobStore`.
///
/// The stores write these names into their SQL, so nothing else is
/// accepted: no quoting, case folding or length truncation can then make
/// two configurations meet on one table, or one name mean something else.
/// Made by `parse` or `try_from`, which refuse anything else with
/// [`ConfigError::SqlIdentifier`].
///
/// ```
/// use tower_idempotency::store::SqlIdentifier;
///
/// let table: SqlIdentifier = "idempotency_records".parse()?;
/// assert_eq!(table.as_str(), "idempotency_records");
/// assert!(SqlIdentifier::try_from("Records").is_err());
/// assert!(SqlIdentifier::try_from("records; DROP TABLE users").is_err());
/// # Ok::<(), tower_idempotency::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SqlIdentifier(String);

validated_str!(SqlIdentifier, is_identifier, ConfigError::SqlIdentifier);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_lower_case_identifiers_are_accepted() {
        for ok in ["a", "_", "idempotency_records", "t0", &"x".repeat(63)] {
            assert_eq!(SqlIdentifier::try_from(ok).unwrap().as_str(), ok);
        }
        for bad in [
            "",
            "0table",
            "Table",
            "public.t",
            "t\"; DROP TABLE users; --",
            "tàble",
            &"x".repeat(64),
        ] {
            assert_eq!(
                bad.parse::<SqlIdentifier>(),
                Err(ConfigError::SqlIdentifier(bad.to_owned()))
            );
        }
    }
}
