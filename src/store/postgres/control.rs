//! Recognises SQL that would end (or start) a transaction, so that the
//! handle a transactional handler writes through refuses it: a handler's own
//! `COMMIT` or `ROLLBACK` would end the claim's transaction, and every write
//! after it would commit on its own, unrecorded, while a retry ran again.

/// Run instead of refused text: it fails, which aborts the request's
/// transaction, so nothing of the request commits.
pub(super) const REFUSED: &str = "DO $refused$ BEGIN RAISE EXCEPTION USING \
ERRCODE = '2D000', \
MESSAGE = 'transaction control is refused in the request''s transaction: the idempotency layer commits it with the recorded response or rolls it back', \
HINT = 'Answer a status the layer does not record to roll back, or use a savepoint.'; \
END $refused$";

/// Whether a statement of `sql` (one or several, separated by `;`) begins,
/// commits, rolls back or prepares a transaction. Savepoints are allowed.
/// Strings, quoted identifiers, dollar-quoted bodies and comments are skipped.
pub(super) fn ends_transaction(sql: &str) -> bool {
    let b = sql.as_bytes();
    let mut words: Vec<String> = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        match c {
            b';' => {
                if controls(&words) {
                    return true;
                }
                words.clear();
                i += 1;
            }
            b'-' if next == Some(b'-') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if next == Some(b'*') => {
                let mut depth = 0usize;
                while i < b.len() {
                    if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                        depth += 1;
                        i += 2;
                    } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        i += 1;
                    }
                }
            }
            b'\'' => {
                // An escape string when the word just before it is `E`.
                let escapes =
                    i > 0 && matches!(b[i - 1], b'e' | b'E') && (i < 2 || !is_word_byte(b[i - 2]));
                i = skip_quoted(b, i, b'\'', escapes);
                push(&mut words, "'");
            }
            b'"' => {
                i = skip_quoted(b, i, b'"', false);
                push(&mut words, "\"");
            }
            b'$' => match dollar_tag(b, i) {
                Some(tag) => {
                    let body = i + tag.len();
                    i = find(b, body, tag).map_or(b.len(), |end| end + tag.len());
                    push(&mut words, "$");
                }
                None => {
                    i += 1;
                    push(&mut words, "$");
                }
            },
            c if c.is_ascii_alphabetic() || c == b'_' || c >= 0x80 => {
                let start = i;
                while i < b.len() && (is_word_byte(b[i]) || b[i] == b'$') {
                    i += 1;
                }
                push(&mut words, &sql[start..i].to_ascii_lowercase());
            }
            c if c.is_ascii_whitespace() => i += 1,
            _ => {
                push(&mut words, "(");
                i += 1;
            }
        }
    }
    controls(&words)
}

/// Keeps a statement's first words (an other token stands as a symbol).
fn push(words: &mut Vec<String>, word: &str) {
    if words.len() < 4 {
        words.push(word.to_owned());
    }
}

fn is_word_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c >= 0x80
}

/// Whether a statement starting with `words` is transaction control other
/// than savepoints.
fn controls(words: &[String]) -> bool {
    let word = |n: usize| words.get(n).map_or("", String::as_str);
    match word(0) {
        "begin" | "start" | "commit" | "end" | "abort" => true,
        "prepare" => word(1) == "transaction",
        // `ROLLBACK [WORK | TRANSACTION] TO [SAVEPOINT] name` stays inside.
        "rollback" => {
            let after = match word(1) {
                "work" | "transaction" => word(2),
                other => other,
            };
            after != "to"
        }
        _ => false,
    }
}

/// The index just past the quoted text opening at `start` (`quote` doubled
/// inside stands for itself; with `escapes`, a backslash escapes any byte).
fn skip_quoted(b: &[u8], start: usize, quote: u8, escapes: bool) -> usize {
    let mut i = start + 1;
    while i < b.len() {
        if escapes && b[i] == b'\\' {
            i += 2;
        } else if b[i] == quote {
            if b.get(i + 1) == Some(&quote) {
                i += 2;
            } else {
                return i + 1;
            }
        } else {
            i += 1;
        }
    }
    b.len()
}

/// The dollar-quote tag (`$$` or `$name$`) opening at `start`, if one does.
fn dollar_tag(b: &[u8], start: usize) -> Option<&[u8]> {
    let mut i = start + 1;
    while i < b.len() {
        match b[i] {
            b'$' => return Some(&b[start..=i]),
            c if c.is_ascii_alphabetic() || c == b'_' || c >= 0x80 => i += 1,
            c if c.is_ascii_digit() && i > start + 1 => i += 1,
            _ => return None,
        }
    }
    None
}

fn find(haystack: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    haystack
        .get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| from + p)
}

#[cfg(test)]
mod tests {
    use super::ends_transaction;

    #[test]
    fn transaction_control_is_recognised_in_every_statement_and_spelling() {
        for sql in [
            "COMMIT",
            "commit work",
            "  END",
            "end transaction",
            "ABORT",
            "ROLLBACK",
            "rollback and chain",
            "ROLLBACK PREPARED 'x'",
            "PREPARE TRANSACTION 'x'",
            "BEGIN",
            "start transaction isolation level serializable",
            "SELECT 1; COMMIT",
            "INSERT INTO t VALUES ('a;b'); rollback",
            "/* a /* nested */ comment */ COMMIT",
            "-- a comment\nCOMMIT",
            "SELECT $$;$$; END",
            "SELECT $tag$ $$ ; $tag$; ABORT",
            "SELECT E'\\';'; COMMIT",
            "SELECT \"a;\"\"b\"; COMMIT",
        ] {
            assert!(ends_transaction(sql), "{sql}");
        }
    }

    #[test]
    fn savepoints_and_quoted_words_are_not_transaction_control() {
        for sql in [
            "INSERT INTO orders (sku) VALUES ('COMMIT')",
            "SAVEPOINT a",
            "ROLLBACK TO SAVEPOINT a",
            "rollback work to a",
            "ROLLBACK TRANSACTION TO a",
            "RELEASE SAVEPOINT a",
            "SELECT 'x; commit'",
            "SELECT $$ ; ROLLBACK $$",
            "SELECT 1 /* ; COMMIT */",
            "SELECT 1 -- ; COMMIT",
            "SELECT CASE WHEN true THEN 1 END",
            "SELECT \"end\" FROM (SELECT 1 AS \"end\") t",
            "SELECT $1::text",
            "DO $$ BEGIN PERFORM 1; END $$",
            "PREPARE q AS SELECT 1",
            "",
        ] {
            assert!(!ends_transaction(sql), "{sql}");
        }
    }
}
