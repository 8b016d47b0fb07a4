use super::*;

fn canon(s: &str) -> String {
    String::from_utf8(canonicalize_json(s.as_bytes()).unwrap()).unwrap()
}

/// What the single-pass path produces, if it takes the document.
fn fast(input: &str) -> Option<Vec<u8>> {
    let mut buffers = Buffers {
        out: Vec::new(),
        scratch: Vec::new(),
    };
    let mut fast = FastCanonical {
        input: input.as_bytes(),
        at: 0,
        buf: &mut buffers,
        members: Vec::new(),
        shape: Shape::default(),
    };
    fast.document()?;
    Some(buffers.out)
}

fn slow(input: &str) -> Result<Vec<u8>, String> {
    let buffers = Buffers {
        out: Vec::new(),
        scratch: Vec::new(),
    };
    canonicalize_with_serde(input.as_bytes(), buffers).map_err(|e| e.to_string())
}

#[test]
fn single_pass_path_agrees_with_serde_path_or_declines() {
    let numbers = [
        "0",
        "-0",
        "1",
        "-1",
        "10.5",
        "1.50",
        "0.05",
        "1e2",
        "1E+2",
        "1e-7",
        "1e21",
        "1e20",
        "123456789012345",
        "1234567890123456",
        "123456789012345678",
        "1234567890123456789",
        "9007199254740993",
        "0.1",
        "0.30000000000000004",
        "4.35",
        "1e-400",
        "1e400",
        "2.5e-300",
        "-0.0",
        "0e5",
        "5e-324",
        "1.7976931348623157e308",
        "333333333.33333329",
        "0.000001",
        "0.0000001",
        "0.10000000000000001",
        "12345678901234567890",
        "12345678901234567891",
        "-1e-400",
        "90071992547409930e-1",
        "123456789012345678901234567890",
    ];
    let strings = [
        r#""""#,
        r#""a""#,
        "\"é€😀\"",
        r#""\n\t\"\\\/""#,
        r#""\u00e9\u20AC""#,
        r#""\ud83d\ude00""#,
        r#""\ud800""#,
        r#""\u0000\u001f""#,
        "\"\u{7f}\"",
    ];
    let mut docs: Vec<String> = Vec::new();
    docs.extend(numbers.iter().map(|n| n.to_string()));
    docs.extend(strings.iter().map(|s| s.to_string()));
    for n in numbers {
        for s in strings {
            docs.push(format!(
                r#"{{ "z": [{n}, {s}], "a": {{"é": null, "b": {s}}}, "\u00e9x": true, "דּ": {n} }}"#
            ));
            docs.push(format!("[{n},{s},{{}},[],false]"));
            docs.push(format!("{{{s}:{n},\"x\":1}}"));
        }
    }
    for bad in [
        "",
        " ",
        "01",
        "1.",
        ".5",
        "-",
        "+1",
        "1e",
        "[1,]",
        r#"{"a":1,}"#,
        r#"{"a" 1}"#,
        "[1 2]",
        r#"{"a":1,"a":2}"#,
        "\"\u{1}\"",
        "tru",
        "nul",
        "[",
        "{}}",
        "1 2",
        r#""\x""#,
        r#""\u12""#,
    ] {
        docs.push(bad.to_string());
    }
    docs.push("[".repeat(64) + &"]".repeat(64));
    docs.push("[".repeat(65) + &"]".repeat(65));
    docs.push("[".repeat(129) + &"]".repeat(129));
    for doc in &docs {
        if let Some(out) = fast(doc) {
            assert_eq!(Ok(out), slow(doc), "{doc}");
        }
        assert_eq!(
            canonicalize_json(doc.as_bytes()).map_err(|e| e.to_string()),
            slow(doc),
            "{doc}"
        );
    }
}

#[test]
fn rfc8785_section_3_2_2_example() {
    let input = r#"{
      "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
      "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
      "literals": [null, true, false]
    }"#;
    // RFC 8785 writes `[333333333.3333333,1e+30,4.5,0.002,1e-27]`, the
    // doubles' ECMAScript forms; numbers keep their literals instead (the one
    // deviation). Keys and the string are as RFC 8785 writes them.
    let want = r#"{"literals":[null,true,false],"numbers":[333333333.33333329,1E30,4.50,2e-3,0.000000000000000000000000001],"string":"€$\u000f\nA'B\"\\\\\"/"}"#;
    assert_eq!(canon(input), want);
}

#[test]
fn sorts_keys_by_utf16_code_units() {
    // RFC 8785 section 3.2.3: U+1F600 (surrogates D83D DE00) sorts before U+FB33.
    let input = "{\"\u{20ac}\":1,\"\\r\":2,\"\u{fb33}\":3,\"1\":4,\"\u{1f600}\":5,\"\u{80}\":6,\"\u{f6}\":7}";
    let want = "{\"\\r\":2,\"1\":4,\"\u{80}\":6,\"\u{f6}\":7,\"\u{20ac}\":1,\"\u{1f600}\":5,\"\u{fb33}\":3}";
    assert_eq!(canon(input), want);
}

#[test]
fn nested_objects_are_sorted_recursively() {
    assert_eq!(
        canon(r#"{"z":{"b":[{"d":1,"c":2}],"a":null},"y":[]}"#),
        r#"{"y":[],"z":{"a":null,"b":[{"c":2,"d":1}]}}"#
    );
}

#[test]
fn rejects_duplicates_lone_surrogates_and_deep_nesting() {
    assert!(canonicalize_json(br#"{"a":1,"b":{"x":1,"x":1}}"#).is_err());
    assert!(canonicalize_json(br#"["\ud800"]"#).is_err());
    assert!(canonicalize_json(b"\"\xff\"").is_err());
    let deep = "[".repeat(100_000) + &"]".repeat(100_000);
    assert!(canonicalize_json(deep.as_bytes()).is_err());
    let ok_depth = "[".repeat(100) + &"]".repeat(100);
    assert!(canonicalize_json(ok_depth.as_bytes()).is_ok());
    assert!(canonicalize_json(b"1e400").is_err());
    assert!(canonicalize_json(b"{} {}").is_err());
}

#[test]
fn numbers_keep_their_literal_text() {
    for source in [
        "18446744073709551615",
        "-9007199254740993",
        "123456789012345678901234",
        "0.10000000000000001",
        "0.1000000000000000",
        "1e-400",
        "-1E-400",
        "1E+2",
        "2.4703282292062327e-324",
        "1.7976931348623157e308",
        "179769313486231570000000000e282",
        "1e-1073741825",
        "0e99999999999999999999",
        "[-0,0.0,-0.0,0e7,-0E-3,1.50]",
    ] {
        assert_eq!(canon(source), source, "{source}");
        assert_fast_agrees(source);
        assert_fast_agrees(&format!("{{\"k\":{source},\"a\":{source}}}"));
    }
    // Out of double range: raw bytes, as serde_json refuses them.
    for source in [
        "1e400",
        "-1.8e308",
        "1.7976931348623159e308",
        "1e99999999999999999999",
        &"9".repeat(309),
    ] {
        assert!(canonicalize_json(source.as_bytes()).is_err(), "{source}");
        assert!(fast(source).is_none(), "{source}");
    }
    assert_eq!(canon(&"9".repeat(308)), "9".repeat(308));
}

#[test]
fn json_content_types() {
    assert!(is_json_content_type(b"application/json"));
    assert!(is_json_content_type(b"Application/JSON; charset=utf-8"));
    assert!(is_json_content_type(b"application/merge-patch+json"));
    assert!(!is_json_content_type(b"text/json"));
    assert!(!is_json_content_type(b"application/jsonx"));
    assert!(!is_json_content_type(b"application/x-www-form-urlencoded"));
}

/// The single-pass path takes `doc` and agrees with the serde_json path.
fn assert_fast_agrees(doc: &str) {
    let want = slow(doc);
    match fast(doc) {
        Some(out) => assert_eq!(
            Ok(String::from_utf8(out).unwrap()),
            want.map(|w| String::from_utf8(w).unwrap()),
            "{doc}"
        ),
        None => panic!("the single-pass path declined {doc}"),
    }
}

#[test]
fn numbers_are_copied_as_written_on_the_single_pass_path() {
    // The single-pass path takes all of these, and writes them as they are.
    let cases = [
        "0",
        "-0",
        "7",
        "-7",
        "999999999999999",
        "-999999999999999",
        "9999999999999999",
        "9007199254740993",
        "999999999999999999",
        "999999999999999999999",
        "9999999999999999999999",
        "10.5",
        "-10.5",
        "1.50",
        "10.0",
        "-0.0",
        "0.10",
        // Any number of significant digits, as written.
        "12345678901234.5",
        "123456789012345.6",
        "1234567890123456.7",
        "0.333333333333333314829616256247",
        "0.123456789012345",
        "0.1234567890123456",
        "0.30000000000000004",
        "0.000001",
        "-0.000001",
        "0.000001234567890123",
        "0.0000001",
        "0.0000009",
        "0.00000123",
        "1e21",
        "1e20",
        "1E2",
        "1.5e1",
        "1.5E-7",
        "0.5",
        "5e-324",
    ];
    for source in cases {
        for doc in [
            source.to_string(),
            format!("[{source}]"),
            format!("{{\"k\":{source}}}"),
            format!("{{\"k\" : {source} , \"a\":{source}}}"),
        ] {
            assert_fast_agrees(&doc);
        }
        assert_eq!(canon(source), source, "{source}");
    }
    for bad in [
        "01",
        "-01",
        "00.5",
        "1.",
        "-",
        "-a",
        ".5",
        "1e",
        "1e+",
        "1.e5",
        "+1",
        "NaN",
        "-NaN",
        "Infinity",
        "-Infinity",
        "0x10",
        "1.5.1",
        "1e5e5",
        "--1",
        "1_000",
        "١",
    ] {
        assert!(fast(bad).is_none(), "{bad}");
        assert!(canonicalize_json(bad.as_bytes()).is_err(), "{bad}");
        let doc = format!("{{\"k\":{bad}}}");
        assert!(fast(&doc).is_none(), "{doc}");
    }
}

#[test]
fn keys_sort_by_prefix_then_in_full() {
    for doc in [
        // Keys sharing their first 8 bytes, of 8 and more bytes.
        r#"{"customer_name":1,"customer_id":2,"customer":3,"customers":4}"#,
        r#"{"abcdefgh":1,"abcdefg":2,"abcdefghi":3,"abcdefgz":4}"#,
        r#"{"b":1,"a":2,"":3}"#,
        // UTF-16 order: U+1F600 (surrogates) sorts before U+FB33, both after U+20AC.
        "{\"\u{fb33}\":1,\"\u{1f600}\":2,\"\u{20ac}\":3,\"z\":4}",
        "{\"a\u{1f600}\":1,\"a\u{fb33}\":2,\"a\":3}",
        "{\"\u{e9}t\u{e9}\":1,\"ete\":2,\"\u{e9}\":3}",
        // Keys ending near the end of the input (no 8 bytes left to read).
        r#"{"b":1,"a":2}"#,
        r#"{"a":1}"#,
        // Whitespace around colons and commas, pretty-printed.
        "{\n  \"b\" : 1,\n  \"a\": \"x\" ,\"c\"\t:true\n}",
        // Members written as they come (nested values, escapes) mixed with
        // members copied at the end.
        r#"{"z":{"y":1,"x":[2,{"b":1,"a":0}]},"m":"a\nb","a":1,"n":null,"b":[]}"#,
        r#"{"b":"\u00e9","a":"é","c":{}}"#,
    ] {
        assert_fast_agrees(doc);
    }
    // More members than the pairwise ranking takes: sorted by `sort_unstable_by`.
    let keys: Vec<String> = (0..40)
        .map(|i| format!("key{:03}", (i * 17) % 40))
        .collect();
    let shuffled = keys
        .iter()
        .enumerate()
        .map(|(i, k)| format!("\"{k}\":{i}"))
        .collect::<Vec<_>>()
        .join(",");
    assert_fast_agrees(&format!("{{{shuffled}}}"));
    let mut sorted = keys.clone();
    sorted.sort();
    let in_order = sorted
        .iter()
        .map(|k| format!("\"{k}\":1"))
        .collect::<Vec<_>>()
        .join(",");
    assert_fast_agrees(&format!("{{{in_order}}}"));
    // Duplicates, short or long, among few or many members: declined.
    for doc in [
        r#"{"a":1,"a":2}"#.to_string(),
        r#"{"b":1,"a":1,"b":2}"#.to_string(),
        r#"{"abcdefghij":1,"x":0,"abcdefghij":2}"#.to_string(),
        "{\"\u{1f600}\":1,\"\u{1f600}\":2}".to_string(),
        format!("{{{shuffled},\"key007\":0}}"),
        format!("{{{in_order},\"key007\":0}}"),
    ] {
        assert!(fast(&doc).is_none(), "{doc}");
        assert!(canonicalize_json(doc.as_bytes()).is_err(), "{doc}");
    }
}

#[test]
fn strings_scanned_eight_bytes_at_a_time() {
    // A quote, escape, control or non-ASCII byte at every offset of the
    // 8-byte words, as key and as value.
    for len in 0..20 {
        let plain = "abcdefghijklmnopqrstuvwxyz"[..len].to_string();
        for special in ["", "\\n", "\\\"", "\\u00e9", "é", "😀", "\u{7f}", "\u{1}"] {
            for at in [0, len / 2, len] {
                let text = format!("{}{special}{}", &plain[..at], &plain[at..]);
                for doc in [
                    format!("\"{text}\""),
                    format!("[\"{text}\",\"{text}\"]"),
                    format!("{{\"{text}\":\"{text}\",\"k\":1}}"),
                    format!("{{\"k\":1,\"{text}\":[]}}"),
                ] {
                    if let Some(out) = fast(&doc) {
                        assert_eq!(Ok(out), slow(&doc), "{doc}");
                    }
                    assert_eq!(
                        canonicalize_json(doc.as_bytes()).map_err(|e| e.to_string()),
                        slow(&doc),
                        "{doc}"
                    );
                }
            }
        }
    }
    assert!(fast("\"abc\u{1}defghijk\"").is_none());
    assert!(fast("\"abcdefghijk").is_none());
    assert!(fast("{\"abcdefghijk").is_none());
    assert!(fast("{\"abcdefghijk\\u0041\":1}").is_none());
}

#[test]
fn random_documents_agree_with_the_serde_path() {
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
        }
        fn pick<'s>(&mut self, from: &[&'s str]) -> &'s str {
            from[self.below(from.len() as u64) as usize]
        }
    }
    const KEYS: &[&str] = &[
        "a",
        "b",
        "sku",
        "qty",
        "price",
        "note",
        "customer",
        "customer_id",
        "customer_name",
        "",
        "é",
        "😀",
        "\u{fb33}",
        "abcdefgh",
        "abcdefghi",
        "a\\nb",
        "price2",
    ];
    const NUMBERS: &[&str] = &[
        "0",
        "-0",
        "1",
        "-12",
        "10.5",
        "0.25",
        "1.50",
        "1e3",
        "-2.5E-8",
        "0.0000001",
        "0.000001",
        "123456789012345",
        "1234567890123456",
        "0.1234567890123456",
        "4.35",
    ];
    const STRINGS: &[&str] = &[
        "",
        "x",
        "gift wrap",
        "SKU-000001",
        "é",
        "a\\\"b",
        "\\u00e9",
        "😀 emoji",
        "tab\\t",
    ];
    const SPACES: &[&str] = &["", "", "", " ", "\n  ", "\t"];
    fn value(rng: &mut Rng, depth: u32, out: &mut String) {
        match rng.below(if depth > 3 { 5 } else { 7 }) {
            0 | 1 => out.push_str(rng.pick(NUMBERS)),
            2 | 3 => {
                out.push('"');
                out.push_str(rng.pick(STRINGS));
                out.push('"');
            }
            4 => out.push_str(rng.pick(&["true", "false", "null"])),
            5 => {
                out.push('[');
                for i in 0..rng.below(4) {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(rng.pick(SPACES));
                    value(rng, depth + 1, out);
                }
                out.push(']');
            }
            _ => {
                out.push('{');
                for i in 0..rng.below(20) {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(rng.pick(SPACES));
                    out.push('"');
                    out.push_str(rng.pick(KEYS));
                    out.push('"');
                    out.push_str(rng.pick(SPACES));
                    out.push(':');
                    out.push_str(rng.pick(SPACES));
                    value(rng, depth + 1, out);
                    out.push_str(rng.pick(SPACES));
                }
                out.push('}');
            }
        }
    }
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut taken = 0;
    for _ in 0..20_000 {
        let mut doc = String::new();
        value(&mut rng, 0, &mut doc);
        if let Some(out) = fast(&doc) {
            taken += 1;
            assert_eq!(Ok(out), slow(&doc), "{doc}");
        }
        assert_eq!(
            canonicalize_json(doc.as_bytes()).map_err(|e| e.to_string()),
            slow(&doc),
            "{doc}"
        );
    }
    assert!(taken > 5_000, "the single-pass path took only {taken}");
}

#[test]
fn members_ranked_in_every_order_around_sixteen() {
    // Distinct keys, some sharing their 8-byte prefix, one outside the BMP,
    // in several orders, for objects around the 16 members ranked as they
    // are read; values copied from the source, spaced, or written as read.
    let keys = [
        "sku",
        "qty",
        "price",
        "note",
        "a",
        "",
        "customer",
        "customer_id",
        "customer_name",
        "abcdefgh",
        "abcdefghi",
        "z",
        "é",
        "\u{fb33}",
        "b",
        "items",
        "id",
        "zz",
        "y",
        "x",
    ];
    let values = [
        "1",
        "\"v\"",
        " 2.5",
        "{\"b\":1,\"a\":[2]}",
        "true",
        "\"\\n\"",
    ];
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for n in 1..=keys.len() {
        for (pick, &with_astral) in [false, false, true].iter().enumerate() {
            let mut chosen: Vec<String> = keys[..n].iter().map(|k| k.to_string()).collect();
            if with_astral {
                chosen[n / 2] = format!("{}\u{1f600}", chosen[n / 2]);
            }
            let mut orders = vec![chosen.clone()];
            let mut reversed = chosen.clone();
            reversed.reverse();
            orders.push(reversed);
            let mut sorted = chosen.clone();
            sorted.sort();
            orders.push(sorted);
            for _ in 0..4 {
                let mut shuffled = chosen.clone();
                for i in (1..n).rev() {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    shuffled.swap(i, (seed % (i as u64 + 1)) as usize);
                }
                orders.push(shuffled);
            }
            for keys in orders {
                let members: Vec<String> = keys
                    .iter()
                    .enumerate()
                    .map(|(i, k)| format!("\"{k}\":{}", values[(i + pick) % values.len()]))
                    .collect();
                assert_fast_agrees(&format!("{{{}}}", members.join(",")));
                // And with a duplicate of one of them: declined.
                let dup = format!("{{{},\"{}\":0}}", members.join(","), keys[n / 3]);
                assert!(fast(&dup).is_none(), "{dup}");
            }
        }
    }
}

#[test]
fn escapes_decoded_and_escaped_again_in_one_pass() {
    for s in [
        r#"\"\\\/\b\f\n\r\t"#,
        r#"\u0000\u0001\u001f\u001F\u0020\u007f\u0080"#,
        r#"\u0022\u005c\u005C\u002f\u00e9\u00E9\u20ac\uffff"#,
        r#"é\nü\t日本\"end"#,
        r#"\u0041BC\u0044"#,
        r#"a\\b\\"#,
        r#"😀\n😀"#,
        r#"\ud83d\ude00"#, // a surrogate pair: declined by the single-pass path
        r#"\ud800"#,
        r#"\x"#,
        r#"\u12"#,
        r#"\u12g4"#,
    ] {
        for doc in [format!("\"{s}\""), format!("{{\"k\":\"{s}\",\"a\":1}}")] {
            if let Some(out) = fast(&doc) {
                assert_eq!(Ok(out), slow(&doc), "{doc}");
            } else {
                assert!(s.contains(r"\ud") || s.contains(r"\x") || s.contains(r"\u12"));
            }
        }
    }
}

#[test]
fn whitespace_and_separators_at_every_width_and_cut() {
    // Indentation of 0..=20 spaces after newlines (CRLF too), spaces around
    // colons and commas; and every prefix of such a document, which is
    // either declined or agrees with the serde_json path.
    for indent in 0..=20 {
        let pad = " ".repeat(indent);
        for nl in ["\n", "\r\n", "\n\t"] {
            let doc = format!(
                "{{{nl}{pad}\"sku\": \"A\",{nl}{pad}\"qty\" :1 ,{nl}{pad}\"items\":{nl}{pad}[{nl}{pad}{{\"b\":1,\"a\" : [ 2 ,{nl}{pad}3 ]}}{nl}{pad}]{nl}}}{nl}"
            );
            assert_fast_agrees(&doc);
            for cut in 0..doc.len() {
                let part = &doc[..cut];
                if let Some(out) = fast(part) {
                    assert_eq!(Ok(out), slow(part), "{part:?}");
                }
            }
        }
    }
    for doc in [
        r#"{"a":1,"b":2}"#,
        r#"{"a":"x","b":"y"}"#,
        r#"{"abcdefghijk":1,"b":{"c":"d"}}"#,
        "{\"a\":\u{0}1}",
        "{\"a\"\u{0}:1}",
        "[1,\u{0}2]",
    ] {
        for cut in 0..=doc.len() {
            let part = &doc[..cut];
            match fast(part) {
                Some(out) => assert_eq!(Ok(out), slow(part), "{part:?}"),
                None => {
                    if cut == doc.len() && !doc.contains('\u{0}') {
                        panic!("declined {doc}");
                    }
                }
            }
        }
    }
}

/// Keys where UTF-8 byte order and UTF-16 code unit order disagree, at the
/// same position: U+FB33 (UTF-16 0xFB33) sorts after U+1F600 (0xD83D 0xDE00),
/// though its UTF-8 bytes (EF ...) sort before (F0 ...).
#[test]
fn keys_above_the_surrogates_sort_after_non_bmp_keys() {
    let expected = "{\"\u{1f600}\":2,\"\u{fb33}\":1}";
    for doc in [
        "{\"\u{fb33}\":1,\"\u{1f600}\":2}",
        "{\"\u{1f600}\":2,\"\u{fb33}\":1}",
    ] {
        assert_eq!(
            canonicalize_json(doc.as_bytes()).unwrap(),
            expected.as_bytes(),
            "{doc}"
        );
        assert_fast_agrees(doc);
    }
    // Same 8-byte prefix, the difference after it.
    let doc = "{\"prefix__\u{fb33}\":1,\"prefix__\u{1f600}\":2}";
    assert_eq!(
        canonicalize_json(doc.as_bytes()).unwrap(),
        "{\"prefix__\u{1f600}\":2,\"prefix__\u{fb33}\":1}".as_bytes()
    );
    assert_fast_agrees(doc);
}

#[test]
fn the_serde_path_writes_each_number_from_its_own_literal() {
    // Escaped keys and deep nesting send these to the serde_json path, which
    // sees numbers as doubles: each must still be written from its literal,
    // in document order, past strings holding digits, quotes and backslashes.
    let deep = format!(
        "{}9007199254740993, -0, 1e-400{}",
        "[".repeat(40),
        "]".repeat(40)
    );
    let want_deep = format!(
        "{}9007199254740993,-0,1e-400{}",
        "[".repeat(40),
        "]".repeat(40)
    );
    for (doc, want) in [
        (
            r#"{"b\"2": "x\\\"3 -4", "\u0061": [12345678901234567890, 0.10000000000000001], "c": 1.50}"#.to_string(),
            r#"{"a":[12345678901234567890,0.10000000000000001],"b\"2":"x\\\"3 -4","c":1.50}"#.to_string(),
        ),
        (deep, want_deep),
    ] {
        assert!(fast(&doc).is_none(), "the single-pass path declines {doc}");
        assert_eq!(String::from_utf8(slow(&doc).unwrap()).unwrap(), want);
        assert_eq!(canon(&doc), want);
    }
}

/// The fingerprint as its definition states it, with buffers of its own.
fn fingerprint_by_definition(key: &IdempotencyKey, body: &[u8]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    for part in ["POST", "/orders", key.as_str(), "acme"] {
        hasher.update(part.as_bytes());
        hasher.update(b"\n");
    }
    let canonical = canonicalize_json(body).ok();
    hasher.update(canonical.as_deref().unwrap_or(body));
    hasher.finalize().into()
}

#[test]
fn buffers_kept_between_fingerprints_never_carry_one_body_into_the_next() {
    let key = IdempotencyKey::parse(b"order-0001").unwrap();
    let big = format!("[{}1]", "1,".repeat(40_000));
    // Every path in turn, and sizes that shrink, grow and pass the kept limit.
    let bodies: [&[u8]; 9] = [
        br#"{"b":[1,2,3],"a":{"y":1,"x":2}}"#,
        br#"{"a":1}"#,
        big.as_bytes(),
        br#"{"\u0062":1,"a":2}"#,
        br#"{"a":1,"a":2}"#,
        b"{not json",
        br#"{"z":"long value to grow the buffer","m":[{"q":1,"p":2}]}"#,
        b"[]",
        br#"{"b":[1,2,3],"a":{"y":1,"x":2}}"#,
    ];
    for _ in 0..2 {
        for body in bodies {
            let computed = json_fingerprint(body);
            assert_eq!(computed.0, fingerprint_by_definition(&key, body));
        }
    }
}

/// The fingerprint of `POST /orders` with key `order-0001`, scope `acme` and
/// a JSON `body`.
fn json_fingerprint(body: impl AsRef<[u8]>) -> Fingerprint {
    let key = IdempotencyKey::parse(b"order-0001").unwrap();
    let json = http::HeaderValue::from_static("application/json");
    Fingerprint::compute(
        &http::Method::POST,
        "/orders",
        &key,
        "acme",
        Some(&json),
        body.as_ref(),
    )
}

/// Each pair holds the same IEEE 754 double, but a typed handler reads two
/// requests: `2.0` is refused for an integer field, a decimal keeps the scale
/// of `1.50`, `-0` keeps its sign, and raw text differs. On both paths: a
/// plain object (single-pass) and one with an escaped key (serde_json).
#[test]
fn numbers_a_typed_handler_tells_apart_never_share_a_fingerprint() {
    for (a, b) in [
        ("2", "2.0"),
        ("1.5", "1.50"),
        ("2", "20e-1"),
        ("-0", "0"),
        ("1e2", "100"),
        ("1E2", "1e2"),
        ("0.1", "1e-1"),
        ("1e+2", "1e2"),
    ] {
        for doc in [
            |n: &str| format!(r#"{{"qty":{n},"sku":"A"}}"#),
            |n: &str| format!(r#"{{"\u0071ty":{n},"sku":"A"}}"#),
            |n: &str| format!("[{n}]"),
        ] {
            let (da, db) = (doc(a), doc(b));
            assert_ne!(json_fingerprint(&da), json_fingerprint(&db), "{da} vs {db}");
            assert_ne!(canon(&da), canon(&db), "{da} vs {db}");
        }
    }
}

/// What does not change a value a handler reads still does not count.
#[test]
fn key_order_whitespace_and_escapes_still_share_a_fingerprint() {
    let canonical = r#"{"qty":2,"ship":{"city":"Lyon","zip":"69001"},"sku":"A-1"}"#;
    for doc in [
        canonical,
        r#"{"sku":"A-1","ship":{"zip":"69001","city":"Lyon"},"qty":2}"#,
        "{\n  \"sku\" : \"A-1\",\n\t\"qty\": 2 , \"ship\":{ \"zip\":\"69001\" ,\"city\" :\"Lyon\"}\r\n}\n",
        r#"{"sku":"A\u002d1","ship":{"zip":"\u0036\u0039001","city":"L\u0079on"},"qty":2}"#,
        r#"{"\u0073ku":"A-1","qty":2,"ship":{"city":"Lyon","\u007aip":"69001"}}"#,
    ] {
        assert_eq!(canon(doc), canonical, "{doc}");
        assert_eq!(json_fingerprint(doc), json_fingerprint(canonical), "{doc}");
    }
    // A `\/` escape is `/`.
    assert_eq!(canon(r#"["a\/b"]"#), r#"["a/b"]"#);
}

/// The digest of a body as the fingerprint defines it, by the reference
/// canonicaliser (serde_json) alone: SHA-256 over the request line and its
/// canonical form, or its raw bytes when it has none.
fn reference_digest(key: &IdempotencyKey, body: &[u8]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    for part in ["POST", "/orders", key.as_str(), "acme"] {
        hasher.update(part.as_bytes());
        hasher.update(b"\n");
    }
    let buffers = Buffers {
        out: Vec::new(),
        scratch: Vec::new(),
    };
    let canonical = canonicalize_with_serde(body, buffers).ok();
    hasher.update(canonical.as_deref().unwrap_or(body));
    hasher.finalize().into()
}

/// A JSON document to render, canonically or with one defect.
enum Doc {
    /// A number or literal, as written.
    Literal(&'static str),
    String(&'static str),
    Array(Vec<Doc>),
    Object(Vec<(&'static str, Doc)>),
}

/// The one way a rendering departs from the canonical form, at the `at`-th
/// place where it can.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Defect {
    None,
    /// Two neighbouring members swapped.
    Unsorted,
    /// A space before a token.
    Space,
    /// `/` written `\/`.
    EscapedSlash,
    /// A non-ASCII character written as its `\u` escape.
    EscapedNonAscii,
    /// An ASCII letter written as its `\u` escape.
    EscapedAscii,
}

struct Render {
    defect: Defect,
    at: u64,
    seen: u64,
    /// Whether the defect was made.
    made: bool,
    out: String,
}

impl Render {
    /// Whether to make the defect at this place (its kind being `kind`).
    fn here(&mut self, kind: Defect) -> bool {
        if self.defect != kind || self.made {
            return false;
        }
        self.seen += 1;
        self.made = self.seen > self.at;
        self.made
    }

    fn space(&mut self) {
        if self.here(Defect::Space) {
            self.out.push(' ');
        }
    }

    fn string(&mut self, s: &str) {
        self.out.push('"');
        for c in s.chars() {
            match c {
                '"' => self.out.push_str("\\\""),
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                '\t' => self.out.push_str("\\t"),
                '\0'..='\u{1f}' => self.out.push_str(&format!("\\u{:04x}", c as u32)),
                '/' if self.here(Defect::EscapedSlash) => self.out.push_str("\\/"),
                c if !c.is_ascii() && self.here(Defect::EscapedNonAscii) => {
                    for unit in c.encode_utf16(&mut [0; 2]) {
                        self.out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                c if c.is_ascii_alphabetic() && self.here(Defect::EscapedAscii) => {
                    self.out.push_str(&format!("\\u{:04X}", c as u32));
                }
                c => self.out.push(c),
            }
        }
        self.out.push('"');
    }

    fn doc(&mut self, doc: &Doc) {
        self.space();
        match doc {
            Doc::Literal(text) => self.out.push_str(text),
            Doc::String(s) => self.string(s),
            Doc::Array(items) => {
                self.out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        self.out.push(',');
                    }
                    self.doc(item);
                }
                self.space();
                self.out.push(']');
            }
            Doc::Object(members) => {
                let mut sorted: Vec<_> = members.iter().collect();
                sorted.sort_by(|a, b| cmp_utf16(a.0, b.0));
                for i in 1..sorted.len() {
                    // Swapping equal keys (a duplicate) changes nothing.
                    if sorted[i - 1].0 != sorted[i].0 && self.here(Defect::Unsorted) {
                        sorted.swap(i - 1, i);
                    }
                }
                self.out.push('{');
                for (i, (key, value)) in sorted.into_iter().enumerate() {
                    if i > 0 {
                        self.out.push(',');
                    }
                    self.space();
                    self.string(key);
                    self.space();
                    self.out.push(':');
                    self.doc(value);
                }
                self.space();
                self.out.push('}');
            }
        }
        self.space();
    }
}

/// Bodies already canonical are hashed as they are; every other body (almost
/// canonical, deeply nested, invalid) still gets the digest of its canonical
/// form by the reference canonicaliser, or of its raw bytes.
#[test]
fn canonical_bodies_hashed_as_they_are_agree_with_the_reference_digest() {
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
        }
        fn pick<T: Copy>(&mut self, from: &[T]) -> T {
            from[self.below(from.len() as u64) as usize]
        }
    }
    const KEYS: &[&str] = &[
        "a",
        "b",
        "ab",
        "sku",
        "qty",
        "price",
        "note",
        "a/b",
        "",
        "é",
        "e",
        "😀",
        "\u{fb33}",
        "\u{e000}",
        "abcdefgh",
        "abcdefghi",
        "abcdefghj",
        "customer_id",
        "customer_name",
        "quote\"d",
        "new\nline",
    ];
    const LITERALS: &[&str] = &[
        "0",
        "-0",
        "1",
        "1.0",
        "10.5",
        "1.50",
        "1e2",
        "1E+2",
        "-2.5e-8",
        "123456789012345678901234567890",
        "1e400",
        "-1e-400",
        "true",
        "false",
        "null",
    ];
    const STRINGS: &[&str] = &[
        "",
        "x",
        "gift wrap",
        "SKU-000001",
        "a/b",
        "é",
        "café crème",
        "😀 emoji",
        "\u{e000}",
        "q\"uote",
        "back\\slash",
        "tab\t",
        "\u{1}",
        "abcdefghijklmnopqrstuvwxyz",
    ];
    fn doc(rng: &mut Rng, depth: u32) -> Doc {
        match rng.below(if depth > 4 { 4 } else { 7 }) {
            0 | 1 => Doc::Literal(rng.pick(LITERALS)),
            2 | 3 => Doc::String(rng.pick(STRINGS)),
            4 => Doc::Array((0..rng.below(4)).map(|_| doc(rng, depth + 1)).collect()),
            _ => {
                let mut keys: Vec<&str> = (0..rng.below(18)).map(|_| rng.pick(KEYS)).collect();
                // Mostly distinct keys; now and then a duplicate.
                if rng.below(8) != 0 {
                    keys.sort_unstable();
                    keys.dedup();
                }
                Doc::Object(keys.into_iter().map(|k| (k, doc(rng, depth + 1))).collect())
            }
        }
    }
    /// `doc` inside `levels` arrays and objects.
    fn nested(rng: &mut Rng, levels: u64, doc: Doc) -> Doc {
        (0..levels).fold(doc, |inner, _| {
            if rng.below(2) == 0 {
                Doc::Array(vec![inner])
            } else {
                Doc::Object(vec![(rng.pick(KEYS), inner)])
            }
        })
    }
    const DEFECTS: [Defect; 6] = [
        Defect::None,
        Defect::Unsorted,
        Defect::Space,
        Defect::EscapedSlash,
        Defect::EscapedNonAscii,
        Defect::EscapedAscii,
    ];
    let key = IdempotencyKey::parse(b"order-0001").unwrap();
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut proven = 0;
    let mut almost = [0; DEFECTS.len()];
    for case in 0..12_000 {
        let mut body = doc(&mut rng, 0);
        if case % 50 == 0 {
            // Around the depth this scan proves (32) and the parser's (128).
            let levels = rng.pick(&[30, 31, 32, 33, 40, 127, 128, 129]);
            body = nested(&mut rng, levels, body);
        }
        let defect = rng.pick(&DEFECTS);
        let mut render = Render {
            defect,
            at: rng.below(6),
            seen: 0,
            made: false,
            out: String::new(),
        };
        render.doc(&body);
        let mut text = render.out.into_bytes();
        match rng.below(20) {
            // Invalid: cut short, or followed by more.
            0 => text.truncate(rng.below(text.len() as u64 + 1) as usize),
            1 => text.extend_from_slice(rng.pick(&[&b" "[..], b"x", b"{}", b"]", b","])),
            _ => {}
        }
        let digest = json_fingerprint(&text);
        let shown = String::from_utf8_lossy(&text);
        assert_eq!(
            digest.0,
            reference_digest(&key, &text),
            "{defect:?}: {shown}"
        );
        let canonical = is_canonical(&text);
        if canonical {
            proven += 1;
            // Not only the same digest: the canonical form is the body itself.
            let buffers = Buffers {
                out: Vec::new(),
                scratch: Vec::new(),
            };
            assert_eq!(
                canonicalize_with_serde(&text, buffers).ok().as_deref(),
                Some(&text[..]),
                "{shown}"
            );
        } else if render.made {
            almost[DEFECTS.iter().position(|&d| d == defect).unwrap()] += 1;
        }
    }
    // Every kind of near miss was made and declined, and canonical bodies
    // were proven so: neither branch is vacuous.
    assert!(proven > 2_000, "{proven} bodies proven canonical");
    for (defect, n) in DEFECTS.iter().zip(almost).skip(1) {
        assert!(n > 100, "{n} bodies almost canonical by {defect:?}");
    }
}

/// What the flat-object path writes for the object `doc`, if it takes it.
fn flat(doc: &str) -> Option<String> {
    let mut buffers = Buffers {
        out: Vec::new(),
        scratch: Vec::new(),
    };
    let mut fast = FastCanonical {
        input: doc.as_bytes(),
        at: 0,
        buf: &mut buffers,
        members: Vec::new(),
        shape: Shape::default(),
    };
    fast.flat_object()?;
    assert_eq!(fast.at, doc.len(), "{doc}");
    Some(String::from_utf8(buffers.out).unwrap())
}

#[test]
fn flat_objects_are_sorted_in_one_go_or_left_to_the_general_path() {
    let taken = [
        r#"{"sku":"SKU-1","qty":1,"price":10.5,"note":"gift wrap"}"#,
        r#"{"b":true,"a":false,"c":null,"":-0,"d":"é€😀"}"#,
        r#"{"note":"x","sku":"y"}"#,
        r#"{"a":1}"#,
        // Long keys whose first 8 bytes differ.
        r#"{"customer":"c","currency":"EUR","abcdefghij":1}"#,
        r#"{"p":1,"o":2,"n":3,"m":4,"l":5,"k":6,"j":7,"i":8,"h":9,"g":10,"f":11,"e":12,"d":13,"c":14,"b":15,"a":16}"#,
    ];
    for doc in taken {
        let want = String::from_utf8(slow(doc).unwrap()).unwrap();
        assert_eq!(flat(doc).as_deref(), Some(&want[..]), "{doc}");
        assert_eq!(canon(doc), want, "{doc}");
    }
    let left = [
        // Long keys sharing their first 8 bytes, either way round.
        r#"{"customer_name":"n","customer_id":1}"#,
        r#"{"customer_id":1,"customer_name":"n"}"#,
        r#"{"abcdefgh":1,"abcdefghi":2}"#,
        // A duplicate key, short or long.
        r#"{"a":1,"b":2,"a":3}"#,
        r#"{"abcdefghi":1,"abcdefghi":2}"#,
        // Seventeen members.
        r#"{"q":0,"p":1,"o":2,"n":3,"m":4,"l":5,"k":6,"j":7,"i":8,"h":9,"g":10,"f":11,"e":12,"d":13,"c":14,"b":15,"a":16}"#,
        // Not ASCII, escapes, whitespace, nesting, the empty object.
        r#"{"é":1,"e":2}"#,
        r#"{"a\u0062":1,"a":2}"#,
        r#"{"b":"x\/y","a":2}"#,
        r#"{"b":1, "a":2}"#,
        r#"{"b" :1,"a":2}"#,
        r#"{"b":1,"a":[2]}"#,
        r#"{"b":1,"a":{}}"#,
        "{}",
        // Not JSON.
        r#"{"b":1,"a":2"#,
        r#"{"b":1,"a":01}"#,
        r#"{"b":1,"a":tru}"#,
        r#"{"b":1,}"#,
        r#"{"b":1"#,
    ];
    for doc in left {
        assert_eq!(flat(doc), None, "{doc}");
        assert_eq!(
            canonicalize_json(doc.as_bytes()).map_err(|e| e.to_string()),
            slow(doc),
            "{doc}"
        );
    }
}

/// Records after the first with its keys in its order reuse its shape; any
/// change in the second record (a byte replaced, a space inserted, cut short)
/// is either canonicalised as the serde_json path does or left to it.
#[test]
fn records_sharing_the_first_ones_keys_match_the_serde_path_under_every_edit() {
    let first = r#"{"sku":"SKU-1","qty":1,"a_rather_long_key":true,"note":"gift wrap"}"#;
    let second = r#"{"sku":"SKU-2","qty":22,"a_rather_long_key":null,"note":"é"}"#;
    let check = |doc: &str, reused: &mut usize| {
        let want = slow(doc);
        if let Some(got) = fast(doc) {
            assert_eq!(Ok(&got), want.as_ref(), "{doc}");
            *reused += 1;
        }
        assert_eq!(
            canonicalize_json(doc.as_bytes()).map_err(|e| e.to_string()),
            want,
            "{doc}"
        );
    };
    let mut taken = 0;
    let edits: &[&str] = &[
        "\"", "\\", "}", "{", ",", ":", "a", "z", "0", " ", "[", "é", "\u{1}",
    ];
    for at in 0..=second.len() {
        if !second.is_char_boundary(at) {
            continue;
        }
        let (head, tail) = second.split_at(at);
        // Cut short, a byte inserted, a byte replaced; then the same keys
        // once more, so that a shape taken from a bad record is tried too.
        let mut variants = vec![head.to_owned()];
        for edit in edits {
            variants.push(format!("{head}{edit}{tail}"));
            if let Some(c) = tail.chars().next() {
                variants.push(format!("{head}{edit}{}", &tail[c.len_utf8()..]));
            }
        }
        for v in variants {
            check(&format!("[{first},{v},{first}]"), &mut taken);
            check(
                &format!(r#"{{"items":[{first},{v}],"n":{first}}}"#),
                &mut taken,
            );
        }
    }
    assert!(taken > 100, "{taken} documents taken by the single pass");
    // Same keys in another order, fewer, more, and a key that only starts alike.
    for v in [
        r#"{"qty":1,"sku":"x","a_rather_long_key":1,"note":""}"#,
        r#"{"sku":"x","qty":1,"a_rather_long_key":1}"#,
        r#"{"sku":"x","qty":1,"a_rather_long_key":1,"note":"","z":0}"#,
        r#"{"sku":"x","qty":1,"a_rather_long_key_":1,"note":""}"#,
        r#"{"sku":"x","qty":1,"a_rather_long_kez":1,"note":""}"#,
        r#"{"sku":"x","qty":1,"a_rather_long_key":1,"note":"","note":""}"#,
    ] {
        check(&format!("[{first},{v}]"), &mut taken);
        // At the very end of the input, where no 16-byte window fits.
        check(&format!("[{first},{v}"), &mut taken);
    }
}

#[test]
fn a_failed_proof_pauses_the_proofs_and_a_canonical_body_resumes_them() {
    // A thread of its own: the proofs' state is per thread.
    std::thread::spawn(|| {
        let key = IdempotencyKey::parse(b"order-0001").unwrap();
        let digest = |body: &[u8]| {
            // Whichever way it went, the digest of the canonical form.
            assert_eq!(json_fingerprint(body).0, reference_digest(&key, body));
        };
        let skip = || SKIP.with(|skip| skip.get());
        let unsorted = br#"{"sku":"SKU-1","qty":2}"#;
        let canonical = br#"{"qty":2,"sku":"SKU-1"}"#;
        assert_eq!(skip(), 0);
        digest(unsorted);
        assert_eq!(
            skip(),
            Proofs::SKIPPED,
            "a failed proof pauses the next ones"
        );
        digest(canonical);
        assert_eq!(skip(), 0, "a canonical body brings the proof back");
        digest(unsorted);
        for left in (0..Proofs::SKIPPED).rev() {
            digest(unsorted);
            assert_eq!(skip(), left);
        }
        digest(unsorted);
        assert_eq!(
            skip(),
            Proofs::SKIPPED,
            "proven again once the pause ran out"
        );
        // Bodies the canonicaliser refuses are hashed raw, and change nothing.
        digest(b"{\"a\":");
        assert_eq!(skip(), Proofs::SKIPPED - 1);
    })
    .join()
    .unwrap();
}
