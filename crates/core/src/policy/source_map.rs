//! Maps YAML node paths to source positions, so errors found after serde
//! deserialization can be reported as `FILE:LINE:COL: message`.
//!
//! Lines and columns are 1-based; columns count characters, not bytes.
//! Only the first document is read.

use crate::hash::HashMap;
use std::fmt;

use serde_saphyr::granit_parser::{Event, Marker, Parser, ScalarStyle, ScanError, Span};

use crate::yaml::YamlError;

/// One step in a path from the document root.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PathSeg {
    Key(String),
    Index(usize),
}

impl From<&str> for PathSeg {
    fn from(key: &str) -> Self {
        PathSeg::Key(key.to_string())
    }
}

impl From<usize> for PathSeg {
    fn from(index: usize) -> Self {
        PathSeg::Index(index)
    }
}

/// A 1-based line and column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Location {
    pub line: usize,
    pub col: usize,
}

impl Location {
    pub const START: Location = Location { line: 1, col: 1 };
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.col)
    }
}

impl From<Marker> for Location {
    // Parser markers have 1-based lines and 0-based columns.
    fn from(m: Marker) -> Self {
        Location {
            line: m.line().max(1),
            col: m.col() + 1,
        }
    }
}

fn syntax_error(e: ScanError) -> YamlError {
    let loc = Location::from(*e.marker());
    YamlError {
        line: loc.line,
        col: loc.col,
        message: e.info(),
    }
}

#[derive(Debug, Clone)]
struct Entry {
    /// Position of the mapping key, for mapping entries.
    key: Option<Location>,
    value: Location,
    /// Character offset of `value`.
    value_index: usize,
}

/// Positions of every node of the first YAML document, by path.
#[derive(Debug, Clone, Default)]
pub struct SourceMap {
    entries: HashMap<Vec<PathSeg>, Entry>,
}

impl SourceMap {
    pub fn parse(text: &str) -> Result<SourceMap, YamlError> {
        let mut builder = Builder::default();
        let mut parser = Parser::new_from_str(text);
        // Pull events directly (not `Parser::load`) to stop after the first document.
        while let Some(next) = parser.next_event() {
            let (event, span) = next.map_err(syntax_error)?;
            let done = matches!(event, Event::DocumentEnd | Event::StreamEnd);
            builder.on_event(event, span);
            if done {
                break;
            }
        }
        Ok(SourceMap {
            entries: builder.entries,
        })
    }

    /// Position of the key for a mapping entry, of the item for a sequence
    /// index, or of the root node for an empty path.
    pub fn locate(&self, path: &[PathSeg]) -> Option<Location> {
        self.entries.get(path).map(|e| e.key.unwrap_or(e.value))
    }

    /// Position where the node's value starts. For a key with an empty
    /// (null) value this is the key's position.
    pub fn locate_value(&self, path: &[PathSeg]) -> Option<Location> {
        self.entries.get(path).map(|e| e.value)
    }

    /// `locate` for the longest non-empty prefix of `path` that exists, or
    /// 1:1 (start of file) if there is none.
    pub fn locate_nearest(&self, path: &[PathSeg]) -> Location {
        (1..=path.len())
            .rev()
            .find_map(|n| path.get(..n).and_then(|p| self.locate(p)))
            .unwrap_or(Location::START)
    }
}

/// Converts a serde_path_to_error path; `Unknown` segments are skipped.
pub fn path_from_serde(path: &serde_path_to_error::Path) -> Vec<PathSeg> {
    use serde_path_to_error::Segment;
    path.iter()
        .filter_map(|seg| match seg {
            Segment::Seq { index } => Some(PathSeg::Index(*index)),
            Segment::Map { key } => Some(PathSeg::Key(key.clone())),
            Segment::Enum { variant } => Some(PathSeg::Key(variant.clone())),
            Segment::Unknown => None,
        })
        .collect()
}

/// Renders a path as `pools[1].scaleDown.cooldownAfterScaleUp`. Keys that are
/// not plain identifiers are quoted: `labels["nvidia.com/gpu"]`. The root is "".
pub fn display_path(path: &[PathSeg]) -> String {
    let mut out = String::new();
    for seg in path {
        match seg {
            PathSeg::Index(i) => out.push_str(&format!("[{i}]")),
            PathSeg::Key(k) if is_plain_key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            PathSeg::Key(k) => out.push_str(&format!("[{k:?}]")),
        }
    }
    out
}

fn is_plain_key(k: &str) -> bool {
    !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

enum MapState {
    /// Next node is a key.
    Key,
    /// Next node is the value for this scalar key.
    Value(String, Location),
    /// Next node is the value of a non-scalar key; not recorded.
    SkipValue,
}

enum Frame {
    Map {
        path: Vec<PathSeg>,
        state: MapState,
        first: bool,
    },
    Seq {
        path: Vec<PathSeg>,
        next: usize,
    },
    /// A collection that is not recorded, with its nesting depth.
    Skip {
        depth: usize,
    },
}

enum Role {
    Record(Vec<PathSeg>, Option<Location>),
    Key,
    Ignore,
}

#[derive(Default)]
struct Builder {
    entries: HashMap<Vec<PathSeg>, Entry>,
    stack: Vec<Frame>,
    root_seen: bool,
}

enum NodeKind {
    Scalar { text: String, empty_plain: bool },
    Alias,
    Map,
    Seq,
}

impl Builder {
    fn on_event(&mut self, event: Event, span: Span) {
        let mark = span.start;
        let kind = match event {
            Event::Scalar(text, style, ..) => {
                // An implicit null has no text: its span is empty.
                let empty_plain = span.is_empty() && style == ScalarStyle::Plain;
                NodeKind::Scalar {
                    text: text.into_owned(),
                    empty_plain,
                }
            }
            Event::Alias(_) => NodeKind::Alias,
            Event::MappingStart(..) => NodeKind::Map,
            Event::SequenceStart(..) => NodeKind::Seq,
            Event::MappingEnd | Event::SequenceEnd => {
                match self.stack.last_mut() {
                    Some(Frame::Skip { depth }) if *depth > 0 => *depth -= 1,
                    _ => {
                        self.stack.pop();
                    }
                }
                return;
            }
            _ => return,
        };
        self.node(kind, mark);
    }

    fn node(&mut self, kind: NodeKind, mark: Marker) {
        let loc = Location::from(mark);
        let is_collection = matches!(kind, NodeKind::Map | NodeKind::Seq);
        let role = match self.stack.last_mut() {
            None if self.root_seen => Role::Ignore,
            None => {
                self.root_seen = true;
                Role::Record(Vec::new(), None)
            }
            Some(Frame::Skip { .. }) => Role::Ignore,
            Some(Frame::Seq { path, next }) => {
                let mut p = path.clone();
                p.push(PathSeg::Index(*next));
                *next += 1;
                Role::Record(p, None)
            }
            Some(Frame::Map { path, state, first }) => {
                if std::mem::take(first) {
                    // A block mapping's start marker lies after its first key;
                    // the mapping starts at that key.
                    if let Some(e) = self.entries.get_mut(path.as_slice()) {
                        if mark.index() < e.value_index {
                            e.value = loc;
                            e.value_index = mark.index();
                        }
                    }
                }
                match std::mem::replace(state, MapState::Key) {
                    MapState::Key => match &kind {
                        NodeKind::Scalar { text, .. } => {
                            *state = MapState::Value(text.clone(), loc);
                            Role::Key
                        }
                        _ => {
                            *state = MapState::SkipValue;
                            Role::Ignore
                        }
                    },
                    MapState::Value(key, key_loc) => {
                        let mut p = path.clone();
                        p.push(PathSeg::Key(key));
                        Role::Record(p, Some(key_loc))
                    }
                    MapState::SkipValue => Role::Ignore,
                }
            }
        };

        match role {
            Role::Key => {}
            Role::Ignore => {
                if is_collection {
                    match self.stack.last_mut() {
                        Some(Frame::Skip { depth }) => *depth += 1,
                        _ => self.stack.push(Frame::Skip { depth: 0 }),
                    }
                }
            }
            Role::Record(path, key) => {
                // An implicit null has no text; point at its key instead.
                let value = match (&kind, key) {
                    (
                        NodeKind::Scalar {
                            empty_plain: true, ..
                        },
                        Some(k),
                    ) => k,
                    _ => loc,
                };
                self.entries.entry(path.clone()).or_insert(Entry {
                    key,
                    value,
                    value_index: mark.index(),
                });
                match kind {
                    NodeKind::Map => self.stack.push(Frame::Map {
                        path,
                        state: MapState::Key,
                        first: true,
                    }),
                    NodeKind::Seq => self.stack.push(Frame::Seq { path, next: 0 }),
                    _ => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic pseudo-random strings over `alphabet`.
    fn random_strings(alphabet: &[&str], count: usize, max_len: u64) -> Vec<String> {
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        (0..count)
            .map(|_| {
                let len = next() % (max_len + 1);
                (0..len)
                    .map(|_| alphabet[(next() % alphabet.len() as u64) as usize])
                    .collect()
            })
            .collect()
    }

    fn loc(line: usize, col: usize) -> Location {
        Location { line, col }
    }

    fn p(segs: &[&str]) -> Vec<PathSeg> {
        segs.iter()
            .map(|s| match s.parse::<usize>() {
                Ok(i) => PathSeg::Index(i),
                Err(_) => PathSeg::Key(s.to_string()),
            })
            .collect()
    }

    const POLICY: &str = "\
# GPU pools
apiVersion: v1
pools:
  - name: a100
    nodeSelector: {gpu: a100, zone: \"us-east1\"}
    min: 0
    max: 4
    scaleDown:
      cooldownAfterScaleUp: 10m
  - name: h100
    taints: [gpu, \"dedicated\"]
    scaleDown:
      cooldownAfterScaleUp: 5m
      utilizationBelow: 0.2
    extra:
defaults: &d
  max: 8
other: *d
";

    fn policy() -> SourceMap {
        SourceMap::parse(POLICY).expect("valid yaml")
    }

    #[test]
    fn mapping_keys_and_values() {
        let m = policy();
        assert_eq!(m.locate(&p(&["apiVersion"])), Some(loc(2, 1)));
        assert_eq!(m.locate_value(&p(&["apiVersion"])), Some(loc(2, 13)));
        assert_eq!(m.locate(&p(&["pools"])), Some(loc(3, 1)));
        assert_eq!(m.locate_value(&p(&["pools"])), Some(loc(4, 3)));
        assert_eq!(m.locate(&p(&["pools", "0", "max"])), Some(loc(7, 5)));
        assert_eq!(m.locate_value(&p(&["pools", "0", "max"])), Some(loc(7, 10)));
        assert_eq!(
            m.locate(&p(&["pools", "0", "scaleDown", "cooldownAfterScaleUp"])),
            Some(loc(9, 7))
        );
        assert_eq!(
            m.locate_value(&p(&["pools", "1", "scaleDown", "utilizationBelow"])),
            Some(loc(14, 25))
        );
        // Block mapping value starts at its first key.
        assert_eq!(
            m.locate_value(&p(&["pools", "1", "scaleDown"])),
            Some(loc(13, 7))
        );
    }

    #[test]
    fn sequence_items() {
        let m = policy();
        assert_eq!(m.locate(&p(&["pools", "0"])), Some(loc(4, 5)));
        assert_eq!(m.locate(&p(&["pools", "1"])), Some(loc(10, 5)));
        assert_eq!(m.locate(&p(&["pools", "2"])), None);
        assert_eq!(m.locate(&p(&["pools", "1", "taints"])), Some(loc(11, 5)));
        assert_eq!(
            m.locate_value(&p(&["pools", "1", "taints"])),
            Some(loc(11, 13))
        );
        assert_eq!(
            m.locate(&p(&["pools", "1", "taints", "0"])),
            Some(loc(11, 14))
        );
        assert_eq!(
            m.locate(&p(&["pools", "1", "taints", "1"])),
            Some(loc(11, 19))
        );
    }

    #[test]
    fn flow_mapping() {
        let m = policy();
        let sel = p(&["pools", "0", "nodeSelector"]);
        assert_eq!(m.locate(&sel), Some(loc(5, 5)));
        assert_eq!(m.locate_value(&sel), Some(loc(5, 19)));
        assert_eq!(
            m.locate(&p(&["pools", "0", "nodeSelector", "zone"])),
            Some(loc(5, 31))
        );
        assert_eq!(
            m.locate_value(&p(&["pools", "0", "nodeSelector", "zone"])),
            Some(loc(5, 37))
        );
    }

    #[test]
    fn null_values_anchors_and_aliases() {
        let m = policy();
        // `extra:` has no value text: its value position is the key.
        assert_eq!(m.locate(&p(&["pools", "1", "extra"])), Some(loc(15, 5)));
        assert_eq!(
            m.locate_value(&p(&["pools", "1", "extra"])),
            Some(loc(15, 5))
        );
        assert_eq!(m.locate(&p(&["defaults", "max"])), Some(loc(17, 3)));
        // An alias is located where it appears; its content is not expanded.
        assert_eq!(m.locate(&p(&["other"])), Some(loc(18, 1)));
        assert_eq!(m.locate_value(&p(&["other"])), Some(loc(18, 8)));
        assert_eq!(m.locate(&p(&["other", "max"])), None);
    }

    #[test]
    fn nearest_falls_back_to_existing_prefix() {
        let m = policy();
        assert_eq!(
            m.locate_nearest(&p(&["pools", "1", "scaleDown", "missing"])),
            loc(12, 5)
        );
        assert_eq!(m.locate_nearest(&p(&["pools", "7", "name"])), loc(3, 1));
        assert_eq!(m.locate_nearest(&p(&["nope"])), loc(1, 1));
        assert_eq!(m.locate_nearest(&[]), loc(1, 1));
        assert_eq!(m.locate_nearest(&p(&["pools", "0", "min"])), loc(6, 5));
        // The root node itself is at its first key.
        assert_eq!(m.locate(&[]), Some(loc(2, 1)));
    }

    #[test]
    fn non_scalar_keys_are_ignored() {
        let m = SourceMap::parse("? [a, b]\n: {x: 1}\nc: 2\n").unwrap();
        assert_eq!(m.locate(&p(&["c"])), Some(loc(3, 1)));
        assert_eq!(m.locate(&p(&["x"])), None);
        assert_eq!(m.locate(&p(&["a"])), None);
    }

    #[test]
    fn root_sequence_and_scalars() {
        let m = SourceMap::parse("- a\n- [b, {c: d}]\n").unwrap();
        assert_eq!(m.locate(&p(&["0"])), Some(loc(1, 3)));
        assert_eq!(m.locate(&p(&["1", "1", "c"])), Some(loc(2, 8)));
        let empty = SourceMap::parse("").unwrap();
        assert_eq!(empty.locate(&p(&["a"])), None);
        assert_eq!(empty.locate_nearest(&p(&["a"])), loc(1, 1));
    }

    #[test]
    fn columns_count_characters() {
        let m = SourceMap::parse("ключ: \"é\"\nb: 1\n").unwrap();
        assert_eq!(m.locate_value(&p(&["ключ"])), Some(loc(1, 7)));
        assert_eq!(m.locate(&p(&["b"])), Some(loc(2, 1)));
    }

    #[test]
    fn only_first_document() {
        let m = SourceMap::parse("a: 1\n---\nb: 2\n---\n[\n").unwrap();
        assert_eq!(m.locate(&p(&["a"])), Some(loc(1, 1)));
        assert_eq!(m.locate(&p(&["b"])), None);
    }

    #[test]
    fn syntax_errors() {
        // An unclosed flow sequence: where it opens.
        let e = SourceMap::parse("a: [1, 2").unwrap_err();
        assert_eq!((e.line, e.col), (1, 4));
        assert!(e.message.contains("unclosed bracket"), "{e}");
        let e = SourceMap::parse("a:\n\tb: 1\n").unwrap_err();
        assert_eq!((e.line, e.col), (2, 2));
        assert!(e.message.contains("tabs"), "{e}");
        assert_eq!(
            e.to_string(),
            "2:2: tabs disallowed within this context (block indentation)"
        );
        // A key without its `:`: where it starts.
        let e = SourceMap::parse("a: 1\nb\n").unwrap_err();
        assert_eq!((e.line, e.col), (2, 1));
        assert!(SourceMap::parse("a: \"unterminated\n").is_err());
    }

    #[test]
    fn no_panic_on_random_inputs() {
        let alphabet = [
            "a", "b", ":", " ", "  ", "- ", "\n", "[", "]", "{", "}", ",", "&x ", "*x", "!t ",
            "? ", "'", "\"", "#", "\t", "|", ">", "---\n", "é",
        ];
        for s in random_strings(&alphabet, 20_000, 16) {
            if let Ok(m) = SourceMap::parse(&s) {
                let _ = m.locate_nearest(&[PathSeg::from("a"), PathSeg::from(0)]);
            }
        }
    }

    #[test]
    fn deep_nesting_does_not_overflow() {
        let text = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        if let Ok(m) = SourceMap::parse(&text) {
            assert!(m.locate(&[]).is_some());
        }
    }

    #[test]
    fn display_paths() {
        assert_eq!(
            display_path(&p(&["pools", "1", "scaleDown", "cooldownAfterScaleUp"])),
            "pools[1].scaleDown.cooldownAfterScaleUp"
        );
        assert_eq!(display_path(&p(&["0", "name"])), "[0].name");
        assert_eq!(
            display_path(&[PathSeg::from("limits"), PathSeg::from("nvidia.com/gpu")]),
            "limits[\"nvidia.com/gpu\"]"
        );
        assert_eq!(display_path(&[]), "");
    }

    mod serde_integration {
        use super::*;
        use serde::Deserialize;

        #[derive(Debug, Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "camelCase")]
        #[allow(dead_code)]
        struct Policy {
            pools: Vec<Pool>,
        }

        #[derive(Debug, Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "camelCase")]
        #[allow(dead_code)]
        struct Pool {
            name: String,
            max: u32,
            #[serde(default)]
            scale_down: Option<ScaleDown>,
        }

        #[derive(Debug, Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "camelCase")]
        #[allow(dead_code)]
        struct ScaleDown {
            cooldown_after_scale_up: String,
        }

        fn error_path(text: &str) -> (Vec<PathSeg>, String) {
            let doc = crate::yaml::parse(text).expect("valid YAML");
            match serde_path_to_error::deserialize::<_, Policy>(doc) {
                Ok(v) => panic!("expected an error, got {v:?}"),
                Err(e) => (path_from_serde(e.path()), e.inner().to_string()),
            }
        }

        const TEXT: &str = "\
pools:
  - name: a
    max: 1
  - name: b
    max: 2
    scaleDown:
      cooldownAfterScaleUp: 5m
      cooldwn: 1m
";

        #[test]
        fn unknown_field_path_points_at_the_unknown_key() {
            let (path, msg) = error_path(TEXT);
            // serde_path_to_error includes the unknown key itself as the last segment.
            assert_eq!(path, p(&["pools", "1", "scaleDown", "cooldwn"]));
            assert_eq!(display_path(&path), "pools[1].scaleDown.cooldwn");
            assert!(msg.contains("unknown field `cooldwn`"), "{msg}");
            let m = SourceMap::parse(TEXT).unwrap();
            assert_eq!(m.locate(&path), Some(loc(8, 7)));
        }

        #[test]
        fn missing_field_path_points_at_the_parent() {
            let text = "pools:\n  - name: a\n  - name: b\n    max: 3\n";
            let (path, msg) = error_path(text);
            assert!(msg.contains("missing field `max`"), "{msg}");
            // The path ends at the mapping that lacks the field.
            assert_eq!(path, p(&["pools", "0"]));
            let m = SourceMap::parse(text).unwrap();
            assert_eq!(m.locate_nearest(&path), loc(2, 5));
            let mut with_field = path.clone();
            with_field.push(PathSeg::from("max"));
            assert_eq!(m.locate(&with_field), None);
            assert_eq!(m.locate_nearest(&with_field), loc(2, 5));
        }

        #[test]
        fn type_error_path_points_at_the_field() {
            let text = "pools:\n  - name: a\n    max: lots\n";
            let (path, _) = error_path(text);
            assert_eq!(path, p(&["pools", "0", "max"]));
            let m = SourceMap::parse(text).unwrap();
            assert_eq!(m.locate(&path), Some(loc(3, 5)));
            assert_eq!(m.locate_value(&path), Some(loc(3, 10)));
        }
    }
}
