//! The scripts' commands, built without intermediate copies: each `EVALSHA`
//! is one [`Cmd`] whose arguments (key names, the response's headers and
//! body) are written into it once, from borrowed parts. `redis`'s
//! `ScriptInvocation` would copy every argument into a vector of its own
//! first, then into the command.

use super::{backend, Inner};
use crate::store::{RecordKey, StoreError};
use http::{HeaderName, HeaderValue};
use redis::{Cmd, ErrorKind, FromRedisValue, RedisWrite, Script, ServerErrorKind, ToRedisArgs};
use sha2::{Digest, Sha256};
use std::io::Write;

/// The hash tag a scope's records share, as `{prefix}:{digest}:`: the scope's
/// digest is computed once per operation, and each name is written straight
/// into its command.
pub(super) struct Tag<'a> {
    prefix: &'a str,
    /// The first 16 bytes of the scope's SHA-256, in lower-case hex.
    digest: [u8; 32],
}

impl<'a> Tag<'a> {
    pub(super) fn of(prefix: &'a str, scope: &str) -> Self {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let sha = Sha256::digest(scope.as_bytes());
        let mut digest = [0u8; 32];
        for (pair, b) in digest.chunks_exact_mut(2).zip(&sha[..16]) {
            pair[0] = DIGITS[usize::from(b >> 4)];
            pair[1] = DIGITS[usize::from(b & 0xf)];
        }
        Self { prefix, digest }
    }

    /// `key`'s record: a hash.
    pub(super) fn record<'k>(&'k self, key: &'k str) -> Name<'k> {
        Name {
            tag: self,
            kind: "r:",
            key,
        }
    }

    /// `key`'s tombstone, once its record expired.
    pub(super) fn tombstone<'k>(&'k self, key: &'k str) -> Name<'k> {
        Name {
            tag: self,
            kind: "x:",
            key,
        }
    }

    /// `key`'s recovery points: a hash.
    pub(super) fn phases<'k>(&'k self, key: &'k str) -> Name<'k> {
        Name {
            tag: self,
            kind: "p:",
            key,
        }
    }

    /// The scope's index of phase hashes.
    pub(super) fn phase_index(&self) -> Name<'_> {
        Name {
            tag: self,
            kind: "pi",
            key: "",
        }
    }

    /// The scope's index.
    pub(super) fn index(&self) -> Name<'_> {
        Name {
            tag: self,
            kind: "i",
            key: "",
        }
    }
}

/// One key name of a record, written as a command's argument without a
/// `String` of its own.
#[derive(Clone, Copy)]
pub(super) struct Name<'a> {
    tag: &'a Tag<'a>,
    kind: &'static str,
    key: &'a str,
}

impl Name<'_> {
    fn write_to(&self, out: &mut impl Write) -> std::io::Result<()> {
        out.write_all(self.tag.prefix.as_bytes())?;
        out.write_all(b":{")?;
        out.write_all(&self.tag.digest)?;
        out.write_all(b"}:")?;
        out.write_all(self.kind.as_bytes())?;
        out.write_all(self.key.as_bytes())
    }
}

impl std::fmt::Display for Name<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let digest = std::str::from_utf8(&self.tag.digest).map_err(|_| std::fmt::Error)?;
        write!(
            f,
            "{}:{{{digest}}}:{}{}",
            self.tag.prefix, self.kind, self.key
        )
    }
}

impl ToRedisArgs for Name<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        // Writing into a command's buffer cannot fail.
        let _ = self.write_to(&mut out.writer_for_next_arg());
    }
}

/// Response headers as one argument, in the encoding of
/// [`encode_headers`](crate::store::encoding::encode_headers), written
/// straight into the command.
pub(super) struct Headers<'a>(pub(super) &'a [(HeaderName, HeaderValue)]);

impl ToRedisArgs for Headers<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut arg = out.writer_for_next_arg();
        for (name, value) in self.0 {
            let _ = arg.write_all(name.as_str().as_bytes());
            let _ = arg.write_all(b":");
            let _ = arg.write_all(value.as_bytes());
            let _ = arg.write_all(b"\r\n");
        }
    }
}

/// `EVALSHA` of `script` with `keys` keys: its keys and arguments follow.
pub(super) fn eval(script: &Script, keys: usize, capacity: usize) -> Cmd {
    let mut cmd = Cmd::with_capacity(3 + keys + 12, 384 + capacity);
    cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys);
    cmd
}

impl Inner {
    /// Runs `cmd` (an [`eval`] of `script`), loading the script first when
    /// the server does not know it yet (after a restart or a failover).
    pub(super) async fn run<T: FromRedisValue>(
        &self,
        script: &Script,
        cmd: &Cmd,
    ) -> Result<T, StoreError> {
        self.count_round_trip();
        let mut connection = self.connection.clone();
        match cmd.query_async(&mut connection).await {
            Err(error) if error.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.count_round_trips(2);
                script.load_async(&mut connection).await.map_err(backend)?;
                cmd.query_async(&mut connection).await.map_err(backend)
            }
            answer => answer.map_err(backend),
        }
    }

    /// The tag of `key`'s scope.
    pub(super) fn tag(&self, key: &RecordKey) -> Tag<'_> {
        Tag::of(&self.config.prefix, key.scope().as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::encoding::encode_headers;

    #[test]
    fn names_and_headers_are_written_as_strings_and_the_shared_encoding_would() {
        let tag = Tag::of("idem", "acme");
        let digest = crate::store::encoding::hex(&Sha256::digest(b"acme")[..16]);
        assert_eq!(
            tag.record("key-0000001").to_string(),
            format!("idem:{{{digest}}}:r:key-0000001")
        );
        assert_eq!(tag.index().to_string(), format!("idem:{{{digest}}}:i"));
        let headers = vec![
            (
                HeaderName::from_static("link"),
                HeaderValue::from_static("</a>; rel=\"a\""),
            ),
            (
                HeaderName::from_static("etag"),
                HeaderValue::from_bytes(b" \xff:x\t").unwrap(),
            ),
        ];
        let mut cmd = Cmd::new();
        cmd.arg(tag.tombstone("k-1"))
            .arg(Headers(&headers))
            .arg(Headers(&[]));
        let args: Vec<Vec<u8>> = cmd
            .args_iter()
            .map(|a| match a {
                redis::Arg::Simple(bytes) => bytes.to_vec(),
                _ => unreachable!("no cursors"),
            })
            .collect();
        assert_eq!(
            args,
            vec![
                tag.tombstone("k-1").to_string().into_bytes(),
                encode_headers(&headers),
                Vec::new()
            ]
        );
    }
}
