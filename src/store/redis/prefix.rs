//! [`RedisPrefix`]: the key prefix a [`RedisStore`](crate::RedisStore) accepts.

use crate::config::{validated_str, ConfigError};

/// The prefix of a [`RedisStore`](crate::RedisStore)'s keys and pub/sub
/// channel: 1 to 64 of ASCII letters, digits, `_`, `-`, `.` and `:`.
///
/// Braces are refused because they would change a key's hash tag (and so
/// the Cluster slot a record and its scope's index share); spaces and
/// control bytes because keys are logged and typed at `redis-cli`. Made by
/// `parse` or `try_from`, which refuse anything else with
/// [`ConfigError::RedisPrefix`].
///
/// ```
/// use tower_idempotency::store::RedisPrefix;
///
/// let prefix: RedisPrefix = "checkout:v2".parse()?;
/// assert_eq!(prefix.as_str(), "checkout:v2");
/// assert!(RedisPrefix::try_from("{checkout}").is_err());
/// assert!(RedisPrefix::try_from("").is_err());
/// # Ok::<(), tower_idempotency::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RedisPrefix(String);

validated_str!(RedisPrefix, is_prefix, ConfigError::RedisPrefix);

fn is_prefix(prefix: &str) -> bool {
    !prefix.is_empty()
        && prefix.len() <= 64
        && prefix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.:".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_short_tag_free_prefixes_are_accepted() {
        for ok in [
            "idempotency",
            "a",
            "checkout:v2",
            "A-b_c.d",
            &"p".repeat(64),
        ] {
            assert_eq!(RedisPrefix::try_from(ok).unwrap().as_str(), ok);
        }
        for bad in ["", "{tag}", "a b", "new\nline", "préfixe", &"p".repeat(65)] {
            assert_eq!(
                bad.parse::<RedisPrefix>(),
                Err(ConfigError::RedisPrefix(bad.to_owned()))
            );
        }
    }
}
