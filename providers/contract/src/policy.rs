//! A provider's part of the scaling policy: the name pools give in `provider:`, the section of a
//! pool it owns (`aws:`, `alibaba:`) and that section's validation. The core reads every other
//! field of a pool and keeps a provider's section as an opaque [`Value`] until the provider has
//! checked it; errors come back as paths inside the pool, which the core turns into
//! `FILE:LINE:COL` positions.

use std::fmt;

use serde::de::DeserializeOwned;
pub use serde_json::Value;

use crate::CapacityType;

/// One step of a path inside a pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathKey {
    Key(String),
    Index(usize),
}

impl From<&str> for PathKey {
    fn from(k: &str) -> PathKey {
        PathKey::Key(k.to_string())
    }
}

/// An error in a pool: where inside the pool (`["aws", "subnets"]`; empty for the pool itself)
/// and what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    pub path: Vec<PathKey>,
    pub message: String,
}

impl FieldError {
    /// An error at the keys `path` inside the pool.
    pub fn at(path: &[&str], message: impl Into<String>) -> FieldError {
        FieldError {
            path: path.iter().map(|k| PathKey::from(*k)).collect(),
            message: message.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, k) in self.path.iter().enumerate() {
            match k {
                PathKey::Key(k) if i == 0 => write!(f, "{k}")?,
                PathKey::Key(k) => write!(f, ".{k}")?,
                PathKey::Index(n) => write!(f, "[{n}]")?,
            }
        }
        if !self.path.is_empty() {
            f.write_str(": ")?;
        }
        f.write_str(&self.message)
    }
}

/// What a provider's validation may know of the pool its section is in, as the core read it.
#[derive(Clone, Copy, Debug)]
pub struct PoolFacts<'a> {
    pub name: &'a str,
    /// The pool's `provider` (the default filled in).
    pub provider: &'a str,
    /// The pool's zones (its own, else the policy's).
    pub zones: &'a [String],
    /// The pool's capacity types, in preference order.
    pub capacity_types: &'a [CapacityType],
}

/// A pool's section as one provider checked it, for the checks across pools.
#[derive(Clone, Copy, Debug)]
pub struct PoolSection<'a> {
    /// The pool's position in the policy's `pools` list.
    pub index: usize,
    pub name: &'a str,
    pub section: &'a Value,
}

/// A provider's part of the policy. One value per provider, in the registry of the program that
/// parses policies (the controller's, the CLI's); the core asks it about every pool that names
/// the provider or carries its section.
pub trait ProviderPolicy: Send + Sync {
    /// What pools write in `provider:` (`aws`).
    fn name(&self) -> &'static str;
    /// The key of the pool's section this provider owns (`aws`), if it has one.
    fn section(&self) -> Option<&'static str> {
        None
    }
    /// Decodes the section (its field names and types): the first error, with its path inside the
    /// section. A pool whose section does not decode is reported with this error alone, as any
    /// other field of the pool that does not decode.
    fn decode(&self, _section: &Value) -> Result<(), FieldError> {
        Ok(())
    }
    /// Whether a pool with this section takes what its Nodes look like (instance types, zones,
    /// labels, taints) from the cloud ([`crate::CloudProvider::templates`]), so that the policy
    /// need not list its `instanceTypes` or `requirements`.
    fn templates_from_cloud(&self, _section: &Value) -> bool {
        false
    }
    /// Checks a pool that names this provider or carries its section (`section` is `None` when
    /// it has none): errors with paths inside the pool.
    fn validate_pool(&self, section: Option<&Value>, pool: &PoolFacts<'_>) -> Vec<FieldError>;
    /// Checks across the valid pools that carry this provider's section: each error with the
    /// position in `pools` of the pool it is about.
    fn validate_pools(&self, _pools: &[PoolSection<'_>]) -> Vec<(usize, FieldError)> {
        Vec::new()
    }
}

/// Decodes `value` as `T`; the error with the path of the field that did not decode.
pub fn decode_section<T: DeserializeOwned>(value: &Value) -> Result<T, FieldError> {
    serde_path_to_error::deserialize::<_, T>(value.clone()).map_err(|e| {
        use serde_path_to_error::Segment;
        FieldError {
            path: e
                .path()
                .iter()
                .filter_map(|s| match s {
                    Segment::Seq { index } => Some(PathKey::Index(*index)),
                    Segment::Map { key } => Some(PathKey::Key(key.clone())),
                    Segment::Enum { variant } => Some(PathKey::Key(variant.clone())),
                    Segment::Unknown => None,
                })
                .collect(),
            message: e.inner().to_string(),
        }
    })
}

/// `prefix` followed by one or more lower-case letters or digits, e.g. `subnet-0abc12`: the
/// shape of the cloud resource ids pools name.
pub fn is_resource_id(s: &str, prefix: &str) -> bool {
    s.strip_prefix(prefix).is_some_and(|rest| {
        !rest.is_empty()
            && rest
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    })
}

/// A provider known by its name only: its pools' section (if it has one) is accepted as written.
/// For providers without a section of their own (`kwok`, `memory`) that is all there is to
/// check; for the others it is what a build without the provider's crate (the simulator) can
/// say of their pools.
#[derive(Clone, Copy, Debug)]
pub struct NameOnly {
    pub name: &'static str,
    pub section: Option<&'static str>,
}

impl NameOnly {
    /// A provider whose pools have no section of their own.
    pub const fn new(name: &'static str) -> NameOnly {
        NameOnly {
            name,
            section: None,
        }
    }

    /// A provider whose pools' `section` is accepted unchecked.
    pub const fn with_section(name: &'static str, section: &'static str) -> NameOnly {
        NameOnly {
            name,
            section: Some(section),
        }
    }
}

impl ProviderPolicy for NameOnly {
    fn name(&self) -> &'static str {
        self.name
    }
    fn section(&self) -> Option<&'static str> {
        self.section
    }
    fn validate_pool(&self, _: Option<&Value>, _: &PoolFacts<'_>) -> Vec<FieldError> {
        Vec::new()
    }
}
