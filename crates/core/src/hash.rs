//! The decision core's hash maps and sets: std's, with foldhash's fast hasher instead of SipHash.
//! Keys are mostly short names (pods, nodes, launch ids, zones), hashed many times a pass; the
//! hasher is seeded per process, as std's is, so that no order of iteration is relied on and
//! keys from the cluster cannot be chosen to collide for every process.

/// A `std::collections::HashMap` with foldhash's seeded fast hasher (`HashMap::default()`).
pub type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// A `std::collections::HashSet` with foldhash's seeded fast hasher (`HashSet::default()`).
pub type HashSet<T> = std::collections::HashSet<T, foldhash::fast::RandomState>;
