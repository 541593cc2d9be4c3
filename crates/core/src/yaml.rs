//! YAML text to JSON values and back: the one way every crate of the project reads and writes
//! YAML (policies, scenarios, cluster files, Kubernetes objects, the anchors' configurations).
//!
//! Reading follows YAML 1.2's core schema: `true`/`false` are the only booleans (`on`, `yes`,
//! `y` stay strings), `null`, `~` and an empty value are null, numbers are decimal, `0x` hex or
//! `0o` octal, and a number written with leading zeros (`080`) or underscores (`1_000`) stays a
//! string. Quoted scalars are strings. Non-string mapping keys become their text. Duplicate keys,
//! and floats that JSON cannot hold (`.inf`, `.nan`), are errors.
//!
//! Writing quotes every string that a YAML 1.1 reader (Go's YAML packages, PyYAML) or a YAML 1.2
//! reader would take for something else (`"on"`, `"y"`, `"080"`, `"1.0"`, `"null"`, `"1:20"`), so
//! that Kubernetes tools and the Cluster Autoscaler read back the same strings.
//!
//! Positions are 1-based lines and columns; columns count characters, not bytes.

use serde::Serialize;
use serde_json::Value;
use serde_saphyr::{MessageFormatter, UserMessageFormatter};

/// Invalid YAML, at a 1-based line and column; displays as `LINE:COL: message`. An error with no
/// known position is at 1:1.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{line}:{col}: {message}")]
pub struct YamlError {
    pub line: usize,
    pub col: usize,
    pub message: String,
}

impl From<serde_saphyr::Error> for YamlError {
    fn from(e: serde_saphyr::Error) -> Self {
        let (line, col) = e
            .location()
            .map_or((1, 1), |l| (l.line() as usize, l.column() as usize));
        YamlError {
            line: line.max(1),
            col: col.max(1),
            message: UserMessageFormatter
                .format_message(e.without_snippet())
                .into_owned(),
        }
    }
}

fn options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        strict_booleans: true,
        leading_zero_numbers_as_strings: true,
        underscored_numbers_as_strings: true,
        with_snippet: false,
    }
}

/// The one document of `text` (null for an empty text); a text of several documents is an error.
pub fn parse(text: &str) -> Result<Value, YamlError> {
    Ok(serde_saphyr::from_str_with_options(text, options())?)
}

/// Every document of `text`, in order; empty and null documents are left out.
pub fn parse_all(text: &str) -> Result<Vec<Value>, YamlError> {
    let docs: Vec<Value> = serde_saphyr::from_multiple_with_options(text, options())?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// [`parse`] for bytes, which must be UTF-8.
pub fn parse_slice(bytes: &[u8]) -> Result<Value, YamlError> {
    let text = std::str::from_utf8(bytes).map_err(|e| YamlError {
        line: 1,
        col: 1,
        message: format!("not UTF-8: {e}"),
    })?;
    parse(text)
}

/// `value` as one YAML document, block style, ending with a newline.
pub fn to_string<T: Serialize>(value: &T) -> Result<String, serde_saphyr::SerializeError> {
    serde_saphyr::to_string(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn scalar(text: &str) -> Value {
        parse(&format!("k: {text}\n")).unwrap()["k"].clone()
    }

    #[test]
    fn core_schema_scalars() {
        let cases = [
            ("1", json!(1)),
            ("-7", json!(-7)),
            ("+1", json!(1)),
            ("0", json!(0)),
            ("0x1F", json!(31)),
            ("0o17", json!(15)),
            ("1.0", json!(1.0)),
            ("1e3", json!(1000.0)),
            (".5", json!(0.5)),
            ("-.5", json!(-0.5)),
            ("18446744073709551615", json!(u64::MAX)),
            ("true", json!(true)),
            ("False", json!(false)),
            ("null", Value::Null),
            ("~", Value::Null),
            ("", Value::Null),
            // Strings in YAML 1.2, whatever YAML 1.1 made of them.
            ("\"1.0\"", json!("1.0")),
            ("'7'", json!("7")),
            ("080", json!("080")),
            ("-080", json!("-080")),
            ("00", json!("00")),
            ("017", json!("017")),
            ("1_000", json!("1_000")),
            ("on", json!("on")),
            ("off", json!("off")),
            ("yes", json!("yes")),
            ("no", json!("no")),
            ("y", json!("y")),
            ("n", json!("n")),
            ("tRue", json!("tRue")),
            ("1:20", json!("1:20")),
            ("2024-01-01", json!("2024-01-01")),
            ("500m", json!("500m")),
            ("2Gi", json!("2Gi")),
            ("nan", json!("nan")),
            ("!!str 5", json!("5")),
            ("'null'", json!("null")),
        ];
        for (text, want) in cases {
            assert_eq!(scalar(text), want, "{text:?}");
        }
    }

    #[test]
    fn collections_keys_anchors_and_block_scalars() {
        let v =
            parse("a: [1, {b: c}]\n1: one\ntrue: yes\nd: &x {e: f}\ng: *x\nh: |\n  two\n  lines\n")
                .unwrap();
        assert_eq!(
            v,
            json!({
                "a": [1, {"b": "c"}],
                "1": "one",
                "true": "yes",
                "d": {"e": "f"},
                "g": {"e": "f"},
                "h": "two\nlines\n",
            })
        );
        assert_eq!(parse("").unwrap(), Value::Null);
        assert_eq!(parse("# only a comment\n").unwrap(), Value::Null);
        assert_eq!(parse("[]").unwrap(), json!([]));
    }

    #[test]
    fn json_is_yaml() {
        let v = json!({"kind": "List", "items": [{"a": 1.5, "b": null, "c": "on", "d": [true]}]});
        assert_eq!(parse(&v.to_string()).unwrap(), v);
        assert_eq!(parse_slice(v.to_string().as_bytes()).unwrap(), v);
        assert!(parse_slice(b"a: \xff").is_err());
    }

    #[test]
    fn several_documents() {
        let text = "a: 1\n---\n---\nb: [x]\n...\n--- null\n---\nc: on\n";
        assert_eq!(
            parse_all(text).unwrap(),
            [json!({"a": 1}), json!({"b": ["x"]}), json!({"c": "on"})]
        );
        assert_eq!(parse_all("").unwrap(), Vec::<Value>::new());
        assert_eq!(parse_all("- 1\n").unwrap(), [json!([1])]);
        // One document is expected; two are an error.
        assert!(parse(text).is_err());
        // An error in a later document has that document's position.
        let e = parse_all("a: 1\n---\nb: [1\nc: 2\n").unwrap_err();
        assert_eq!((e.line, e.col), (4, 2), "{e}");
    }

    #[test]
    fn errors_have_positions() {
        let cases = [
            // The next line's `:` is illegal in the unterminated flow sequence.
            ("zones: [us-east-1a\npools: []\n", 2, 6),
            // An unterminated quoted string: where it starts.
            ("zones: [\"us-east-1a]\npools: []\n", 1, 9),
            // A tab where indentation is expected: just past the tab.
            ("pools:\n\t- name: a\n", 2, 2),
            ("a: 1\nb\n", 2, 1),
            // The repeated key.
            ("zones: [a]\npools: []\nzones: [b]\n", 3, 1),
            ("p:\n  - name: a\n    name: b\n", 3, 5),
            // Columns count characters.
            ("ключ: [é, \"x\n", 1, 11),
            // JSON has no infinity.
            ("a: .inf\n", 1, 4),
        ];
        for (text, line, col) in cases {
            let e = parse(text).unwrap_err();
            assert_eq!((e.line, e.col), (line, col), "{text:?}: {e}");
            assert!(!e.message.contains(" line "), "{text:?}: {e}");
            assert!(!e.message.contains('\n'), "{text:?}: {e}");
        }
        let e = parse("a: 1\na: 2\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "2:1: duplicate mapping key `a` is not allowed here"
        );
        let e = parse("a: .nan\n").unwrap_err();
        assert_eq!(e.to_string(), "1:4: value `.nan` is not a finite number");
    }

    /// Strings that YAML 1.1 reads as booleans, nulls, numbers, timestamps or merge keys.
    const YAML_1_1_SPECIAL: &str = "on off yes no y Y n true null ~ 080 1.0 1 0x1F 1e3 1_000 \
                                    2024-01-01 1:20 .inf << =";
    /// Strings that would be YAML syntax if written plain.
    const SYNTAX: [&str; 26] = [
        "",
        "a: b",
        "- x",
        "#c",
        "x #c",
        "trailing ",
        " lead",
        "*a",
        "&a",
        "!t",
        "@x",
        "'q",
        "\"q",
        "%x",
        "[x]",
        "{x}",
        "?",
        ":",
        "-",
        "tab\there",
        "multi\nline\n",
        "é",
        "a,b",
        "`x",
        "|",
        ">",
    ];

    #[test]
    fn written_strings_read_back_as_strings_in_yaml_1_1_and_1_2() {
        let special: Vec<&str> = YAML_1_1_SPECIAL.split_whitespace().collect();
        for s in special.iter().chain(&SYNTAX) {
            let v = json!({ "k": s });
            let text = to_string(&v).unwrap();
            assert_eq!(parse(&text).unwrap(), v, "{s:?} written as {text:?}");
        }
        for s in special {
            let text = to_string(&json!({ "k": s })).unwrap();
            assert!(text.starts_with("k: \""), "{s:?} written as {text:?}");
        }
        // Names and quantities need no quotes.
        assert_eq!(
            to_string(&json!({"nvidia.com/gpu": "500m", "effect": "NoSchedule"})).unwrap(),
            "effect: NoSchedule\nnvidia.com/gpu: 500m\n"
        );
    }

    #[test]
    fn round_trips() {
        let v = json!({
            "apiVersion": "v1",
            "items": [
                {"metadata": {"name": "a", "labels": {"x": "on"}}, "n": 3, "f": 0.25},
                {"empty": {}, "none": [], "null": null, "neg": -1e300, "big": u64::MAX},
                [[1, 2], [3]],
            ],
            "text": "line one\nline two\n",
        });
        let text = to_string(&v).unwrap();
        assert!(text.ends_with('\n'));
        assert_eq!(parse(&text).unwrap(), v, "{text}");
        // Typed values write through serde too.
        #[derive(Serialize)]
        struct Pool {
            name: &'static str,
            max: u32,
            zones: Vec<&'static str>,
        }
        let text = to_string(&Pool {
            name: "on",
            max: 3,
            zones: vec!["a", "b"],
        })
        .unwrap();
        assert_eq!(
            parse(&text).unwrap(),
            json!({"name": "on", "max": 3, "zones": ["a", "b"]})
        );
    }
}
