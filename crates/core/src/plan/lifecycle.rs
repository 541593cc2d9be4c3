//! Node lifecycle: whether a node of a pool is drifted (launched differently from what its pool
//! would launch today) or expired (older than the pool's `disruption.expireAfter`).
//!
//! What a launch used is recorded as a fingerprint: one short hash per part of the pool that
//! shapes a node (the provider's section with its launch template and image, the labels, the
//! taints, the startup taints, the GPU layout, and what a moving launch template version
//! (`$Latest`, `$Default`) resolves to, as the provider reported it and the caller passes in),
//! `part=hash` pairs joined by spaces (characters every cloud's tags accept). It is put on
//! the instance as a tag and on the Node as an annotation at registration
//! ([`crate::model::labels::LAUNCH_FINGERPRINT`]). Comparing part by part names what drifted;
//! a part missing on either side (a fingerprint of an older release) is not compared, and a node
//! without a fingerprint is never drifted by it. The instance type, capacity type and zone are
//! not hashed: a node is drifted when the pool no longer admits its own (adding an instance
//! type to a pool does not replace its nodes).

use crate::hash::HashMap;
use std::collections::BTreeMap;
use std::hash::Hasher;
use std::sync::Arc;

use crate::model::{labels, Node, Time};
use crate::policy::{GpuMode, Policy, Pool};
use gpu_node_autoscaler_provider::Catalog;

/// Feeds `parts` (each followed by a separator) into FNV-1a: stable across releases, unlike
/// std's hasher.
fn hash(parts: &[&str]) -> String {
    let mut h = fnv::FnvHasher::default();
    for p in parts {
        h.write(p.as_bytes());
        h.write(&[0]);
    }
    format!("{:08x}", h.finish() & 0xffff_ffff)
}

/// The parts of a pool that shape the nodes it launches, each as text to hash, in a fixed order
/// (`version`, the launch template version a moving one resolves to, only when known).
fn parts(pool: &Pool, launch_version: Option<&str>) -> Vec<(&'static str, Vec<String>)> {
    let taints = |ts: &[crate::model::constraints::Taint]| {
        let mut v: Vec<String> = ts
            .iter()
            .map(|t| format!("{}={}:{}", t.key, t.value, t.effect.as_str()))
            .collect();
        v.sort();
        v
    };
    let gpu = match &pool.gpu_mode {
        GpuMode::Whole => vec!["whole".to_string()],
        GpuMode::Mig(layout) => {
            let mut v = vec!["mig".to_string()];
            v.extend(layout.iter().map(|(p, n)| format!("{p}={n}")));
            v
        }
        GpuMode::Shared { core_percentage } => vec![format!("shared={core_percentage}")],
    };
    let mut gpu = gpu;
    if let Some(d) = &pool.dra {
        gpu.push(format!("dra={}", d.driver));
        gpu.extend(d.attributes.iter().map(|(k, v)| format!("{k}={v:?}")));
        gpu.extend(d.capacity.iter().map(|(k, v)| format!("{k}={v:?}")));
    }
    let mut parts = vec![
        (
            "provider",
            vec![
                pool.provider.clone(),
                pool.settings
                    .as_ref()
                    .map(|s| s.to_string())
                    .unwrap_or_default(),
            ],
        ),
        (
            "labels",
            pool.labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect(),
        ),
        ("taints", taints(&pool.taints)),
        ("startupTaints", taints(&pool.startup_taints)),
        ("gpu", gpu),
    ];
    if let Some(v) = launch_version {
        parts.push(("version", vec![v.to_string()]));
    }
    parts
}

/// What `pool` launches today, as the fingerprint recorded on its instances and Nodes.
/// `launch_version`: what the pool's moving launch template version (`$Latest`, `$Default`)
/// resolves to now, as the provider reported it
/// ([`crate::model::Snapshot::launch_versions`]); `None` where the pool names a fixed version
/// or the provider did not answer (the part is then left out, and not compared).
pub fn fingerprint(pool: &Pool, launch_version: Option<&str>) -> String {
    parts(pool, launch_version)
        .iter()
        .map(|(name, text)| {
            let refs: Vec<&str> = text.iter().map(String::as_str).collect();
            format!("{name}={}", hash(&refs))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// [`fingerprint`] of the pools of one policy, worked out once per pool and launch template
/// version and kept until the policy changes (a pass asks for every pool's, a launch for its
/// pool's).
#[derive(Default)]
pub struct Fingerprints {
    /// The policy they are of (held, so that a new policy is never taken for it).
    policy: Option<Arc<Policy>>,
    /// Per pool: per launch template version, the fingerprint.
    of: HashMap<String, Vec<(Option<String>, String)>>,
}

impl Fingerprints {
    /// [`fingerprint`]`(pool, launch_version)` for `pool` of `policy`.
    pub fn get(&mut self, policy: &Arc<Policy>, pool: &Pool, launch_version: Option<&str>) -> &str {
        if !self.policy.as_ref().is_some_and(|p| Arc::ptr_eq(p, policy)) {
            self.policy = Some(policy.clone());
            self.of.clear();
        }
        if !self.of.contains_key(&pool.name) {
            self.of.insert(pool.name.clone(), Vec::new());
        }
        let versions = self.of.get_mut(&pool.name).expect("inserted above");
        let i = match versions
            .iter()
            .position(|(v, _)| v.as_deref() == launch_version)
        {
            Some(i) => i,
            None => {
                versions.push((
                    launch_version.map(str::to_string),
                    fingerprint(pool, launch_version),
                ));
                versions.len() - 1
            }
        };
        &versions[i].1
    }

    /// What [`Fingerprints::get`] gave for `pool` and `launch_version` under the policy it was
    /// last asked about, if it was asked.
    pub fn known(&self, pool: &str, launch_version: Option<&str>) -> Option<&str> {
        self.of
            .get(pool)?
            .iter()
            .find(|(v, _)| v.as_deref() == launch_version)
            .map(|(_, fp)| fp.as_str())
    }
}

fn parse(fp: &str) -> BTreeMap<&str, &str> {
    fp.split(' ').filter_map(|kv| kv.split_once('=')).collect()
}

/// Shown in messages for each part.
fn describe(part: &str) -> &str {
    match part {
        "provider" => "its provider settings (launch template, image)",
        "labels" => "its labels",
        "taints" => "its taints",
        "startupTaints" => "its startup taints",
        "gpu" => "its GPU layout (MIG, shared GPUs, DRA)",
        "version" => "the launch template version its $Latest or $Default resolves to",
        other => other,
    }
}

/// Why node `n` of `pool` is drifted, if it is: the parts whose fingerprint differs from what
/// the pool launches today (`today`: [`fingerprint`] of the pool), or an instance type,
/// capacity type or zone the pool no longer admits.
pub fn drifted(n: &Node, pool: &Pool, today: &str, catalog: &Catalog) -> Option<String> {
    let mut what: Vec<String> = Vec::new();
    // The same text has the same parts: nothing to compare.
    if let Some(recorded) = n
        .annotations
        .get(labels::LAUNCH_FINGERPRINT)
        .filter(|r| r.as_str() != today)
    {
        let (was, now) = (parse(recorded), parse(today));
        for (part, h) in &now {
            if was.get(part).is_some_and(|w| w != h) {
                what.push(describe(part).to_string());
            }
        }
    }
    if let Some(t) = n.instance_type() {
        let admitted = match (&pool.instance_types, &pool.requirements) {
            (Some(list), _) => list.iter().any(|x| x == t),
            (None, Some(r)) => catalog.instance_type(t).is_none_or(|it| r.admits(it)),
            (None, None) => true,
        };
        if !admitted {
            what.push(format!(
                "instance type {t} is no longer one of its instance types"
            ));
        }
    }
    if let Some(c) = n.capacity_type_label() {
        let admitted = pool.capacity_types.iter().any(|x| x.as_str() == c);
        if !admitted && !pool.capacity_types.is_empty() {
            what.push(format!(
                "capacity type {c} is no longer one of its capacity types"
            ));
        }
    }
    if let Some(z) = n.zone() {
        if !pool.zones.is_empty() && !pool.zones.iter().any(|x| x == z) {
            what.push(format!("zone {z} is no longer one of its zones"));
        }
    }
    (!what.is_empty()).then(|| format!("the pool changed {}", what.join(", ")))
}

/// Why node `n` of `pool` is expired at `now`, if it is (`disruption.expireAfter` since the
/// Node was created).
pub fn expired(n: &Node, pool: &Pool, now: Time) -> Option<String> {
    let after = pool.disruption.expire_after?;
    (now >= n.created + after).then(|| {
        format!(
            "it is older than the pool's expireAfter ({})",
            crate::policy::duration::format_duration(after)
        )
    })
}

/// When node `n` of `pool` expires, if it does.
pub fn expires_at(n: &Node, pool: &Pool) -> Option<Time> {
    pool.disruption.expire_after.map(|d| n.created + d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::NodeBuilder;
    use crate::policy::parse_policy;

    fn pool(extra: &str) -> Pool {
        let text = format!(
            "zones: [z1, z2]\npools:\n  - name: a\n    instanceTypes: [g5.xlarge, g5.2xlarge]\n    \
             maxNodes: 3\n    aws: {{launchTemplate: {{name: gpu, version: \"3\"}}, subnets: \
             {{z1: subnet-1, z2: subnet-2}}}}\n{extra}"
        );
        parse_policy(&text, "p.yaml")
            .unwrap_or_else(|e| panic!("{e}"))
            .pools
            .remove(0)
    }

    fn launched_under(p: &Pool) -> Node {
        NodeBuilder::new("n")
            .pool("a", "g5.xlarge", "z1")
            .annotation(labels::LAUNCH_FINGERPRINT, &fingerprint(p, None))
            .build()
    }

    #[test]
    fn drift_names_what_changed_in_the_pool() {
        let catalog = Catalog::default();
        let old = pool("");
        let n = launched_under(&old);
        assert_eq!(drifted(&n, &old, &fingerprint(&old, None), &catalog), None);
        let cases = [
            ("    labels: {team: ml}\n".to_string(), "its labels"),
            (
                "    taints: [{key: gpu, effect: NoSchedule}]\n".to_string(),
                "its taints",
            ),
            (
                "    startupTaints: [{key: boot, effect: NoSchedule}]\n".to_string(),
                "its startup taints",
            ),
            (
                "    gpuMode: mig\n    migLayout: {1g.5gb: 7}\n".to_string(),
                "its GPU layout",
            ),
        ];
        for (extra, what) in &cases {
            let new = pool(extra);
            let why = drifted(&n, &new, &fingerprint(&new, None), &catalog).expect(what);
            assert!(why.contains(what), "{extra}: {why}");
        }
        // A new launch template version: the provider's settings.
        let text = "zones: [z1, z2]\npools:\n  - name: a\n    instanceTypes: [g5.xlarge, \
                    g5.2xlarge]\n    maxNodes: 3\n    aws: {launchTemplate: {name: gpu, version: \
                    \"4\"}, subnets: {z1: subnet-1, z2: subnet-2}}\n";
        let v4 = parse_policy(text, "p.yaml").unwrap().pools.remove(0);
        let why = drifted(&n, &v4, &fingerprint(&v4, None), &catalog).unwrap();
        assert!(why.contains("provider settings"), "{why}");
        // An instance type added drifts nothing; the node's own removed, or its zone, does.
        let more = pool("").instance_types.map(|mut t| {
            t.push("g5.4xlarge".into());
            t
        });
        let mut wider = old.clone();
        wider.instance_types = more;
        assert_eq!(
            drifted(&n, &wider, &fingerprint(&wider, None), &catalog),
            None
        );
        let mut narrower = old.clone();
        narrower.instance_types = Some(vec!["g5.2xlarge".into()]);
        assert!(
            drifted(&n, &narrower, &fingerprint(&narrower, None), &catalog)
                .unwrap()
                .contains("instance type g5.xlarge")
        );
        let mut zones = old.clone();
        zones.zones = vec!["z2".into()];
        assert!(drifted(&n, &zones, &fingerprint(&zones, None), &catalog)
            .unwrap()
            .contains("zone z1"));
        // Budgets and expiry are not what a node is launched with.
        let budgets = pool("    disruption: {expireAfter: 1h, budgets: [{nodes: 1}]}\n");
        assert_eq!(fingerprint(&budgets, None), fingerprint(&old, None));
    }

    #[test]
    fn budget_percentages_round_up_and_the_tightest_active_budget_wins() {
        use crate::plan::disrupt::budget_left;
        use crate::policy::Reason;
        let at = Time::parse_rfc3339("2027-01-15T08:30:00Z").unwrap();
        let p = pool(
            "    disruption:\n      budgets:\n        - {nodes: \"10%\"}\n        - {nodes: 0, \
             reasons: [Drifted], schedule: \"0 8 * * *\", duration: 1h}\n        - {nodes: 3, \
             reasons: [Empty]}\n",
        );
        // 10% of 5 nodes is 1 (rounded up), of 25 is 3; minus what is being disrupted.
        assert_eq!(budget_left(&p, Reason::Underutilized, 5, 0, at), Some(1));
        assert_eq!(budget_left(&p, Reason::Underutilized, 25, 1, at), Some(2));
        assert_eq!(budget_left(&p, Reason::Empty, 100, 0, at), Some(3));
        // The window of 0 for drift is open at 08:30, closed at 09:00.
        assert_eq!(budget_left(&p, Reason::Drifted, 5, 0, at), Some(0));
        let nine = Time::parse_rfc3339("2027-01-15T09:00:00Z").unwrap();
        assert_eq!(budget_left(&p, Reason::Drifted, 5, 0, nine), Some(1));
        // No budget written: drift and expiry get 10%, the others none.
        let none = pool("");
        assert_eq!(budget_left(&none, Reason::Expired, 30, 1, at), Some(2));
        assert_eq!(budget_left(&none, Reason::Empty, 30, 1, at), None);
    }
}
