//! A pool's `aws:` section of the scaling policy: its serde type and its validation, for the
//! core's policy parser (through [`POLICY`]) and the controller's provider factory.

use std::collections::BTreeMap;

use gpu_node_autoscaler_provider::policy::{
    decode_section, is_resource_id, FieldError, PathKey, PoolFacts, ProviderPolicy, Value,
};
use gpu_node_autoscaler_provider::CapacityType;
use serde::Deserialize;

/// The provider's name in policies (`provider: aws`) and the key of its pool section.
pub const NAME: &str = "aws";

/// The AWS provider's part of the policy: `provider: aws` and the `aws:` section.
pub static POLICY: AwsPolicy = AwsPolicy;

/// A pool's `aws:` section: where and from what its instances launch.
#[derive(Clone, Debug, PartialEq)]
pub struct AwsPoolSettings {
    /// The launch template of a `CreateFleet` pool (empty for a pool backed by Auto Scaling
    /// groups, which launch from their own).
    pub launch_template: LaunchTemplate,
    /// Zone → subnet id; every zone of a `CreateFleet` pool has one (none for a pool backed by
    /// Auto Scaling groups: their subnets are theirs).
    pub subnets: BTreeMap<String, String>,
    /// The Auto Scaling groups the pool scales, when it is backed by groups rather than
    /// launched with `CreateFleet`.
    pub auto_scaling_groups: Option<AutoScalingGroups>,
}

/// How a pool names the Auto Scaling groups behind it.
#[derive(Clone, Debug, PartialEq)]
pub enum AutoScalingGroups {
    /// These groups, in the pool's order of preference.
    Named(Vec<String>),
    /// Every group carrying all these tags (the Cluster Autoscaler's
    /// `--node-group-auto-discovery=asg:tag=...`); empty: the Cluster Autoscaler's own,
    /// [`CA_ENABLED_TAG`] and `k8s.io/cluster-autoscaler/<clusterName>`.
    Discovered(Vec<TagMatch>),
}

/// A tag a discovered group must carry: its key, and its value when one is given (`key=value`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct TagMatch {
    pub key: String,
    pub value: Option<String>,
}

impl TagMatch {
    /// `key` or `key=value`.
    pub fn parse(s: &str) -> TagMatch {
        match s.split_once('=') {
            Some((k, v)) => TagMatch {
                key: k.to_string(),
                value: Some(v.to_string()),
            },
            None => TagMatch {
                key: s.to_string(),
                value: None,
            },
        }
    }
}

/// The tag the Cluster Autoscaler's auto-discovery looks for on every group.
pub const CA_ENABLED_TAG: &str = "k8s.io/cluster-autoscaler/enabled";

/// The tags the Cluster Autoscaler discovers a cluster's groups by:
/// `k8s.io/cluster-autoscaler/enabled` and `k8s.io/cluster-autoscaler/<cluster>`.
pub fn cluster_autoscaler_tags(cluster: &str) -> Vec<TagMatch> {
    vec![
        TagMatch::parse(CA_ENABLED_TAG),
        TagMatch::parse(&format!("k8s.io/cluster-autoscaler/{cluster}")),
    ]
}

/// The EC2 launch template of a pool.
#[derive(Clone, Debug, PartialEq)]
pub struct LaunchTemplate {
    pub by: LaunchTemplateBy,
    /// A version number, `$Default` (the default) or `$Latest`.
    pub version: String,
}

#[derive(Clone, Debug, PartialEq)]
pub enum LaunchTemplateBy {
    Name(String),
    Id(String),
}

/// The default `aws.launchTemplate.version`.
pub const DEFAULT_LAUNCH_TEMPLATE_VERSION: &str = "$Default";

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawAwsPool {
    launch_template: Option<RawLaunchTemplate>,
    subnets: Option<BTreeMap<String, String>>,
    auto_scaling_groups: Option<RawGroups>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawGroups {
    names: Option<Vec<String>>,
    auto_discovery: Option<RawDiscovery>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDiscovery {
    tags: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLaunchTemplate {
    name: Option<String>,
    id: Option<String>,
    version: Option<String>,
}

impl AwsPoolSettings {
    /// The settings of a pool's `aws:` section that the policy parser accepted.
    pub fn from_section(section: &Value) -> Result<AwsPoolSettings, FieldError> {
        let raw: RawAwsPool = decode_section(section).map_err(in_section)?;
        let mut errors = Vec::new();
        let settings = check(raw, None, &mut errors);
        match errors.into_iter().next() {
            None => Ok(settings),
            Some(e) => Err(e),
        }
    }
}

/// The path of an error inside the section, as a path inside the pool.
fn in_section(mut e: FieldError) -> FieldError {
    e.path.insert(0, NAME.into());
    e
}

/// The AWS provider's part of the policy.
#[derive(Clone, Copy, Debug)]
pub struct AwsPolicy;

impl ProviderPolicy for AwsPolicy {
    fn name(&self) -> &'static str {
        NAME
    }

    fn section(&self) -> Option<&'static str> {
        Some(NAME)
    }

    fn decode(&self, section: &Value) -> Result<(), FieldError> {
        decode_section::<RawAwsPool>(section).map(|_| ())
    }

    /// A pool backed by Auto Scaling groups plans from their templates.
    fn templates_from_cloud(&self, section: &Value) -> bool {
        section
            .get("autoScalingGroups")
            .is_some_and(|g| !g.is_null())
    }

    /// A launch template by name or id, a `subnet-...` for every zone.
    fn validate_pool(&self, section: Option<&Value>, pool: &PoolFacts<'_>) -> Vec<FieldError> {
        let mut errors = Vec::new();
        let Some(section) = section else {
            return errors;
        };
        match decode_section::<RawAwsPool>(section) {
            Ok(raw) => {
                check(raw, Some(pool), &mut errors);
            }
            Err(e) => errors.push(in_section(e)),
        }
        errors
    }
}

/// The settings, with every error found (paths inside the pool); `pool` is `None` when only the
/// section itself is checked.
fn check(
    a: RawAwsPool,
    pool: Option<&PoolFacts<'_>>,
    errors: &mut Vec<FieldError>,
) -> AwsPoolSettings {
    let mut at = |rest: &[&str], message: String| {
        let mut p = vec![NAME];
        p.extend_from_slice(rest);
        errors.push(FieldError::at(&p, message));
    };
    if let Some(pool) = pool {
        if pool.provider != NAME {
            at(
                &[],
                format!(
                    "`aws` settings need `provider: aws` (the pool's provider is {})",
                    pool.provider
                ),
            );
        }
    }
    let (groups, group_errors) = match a.auto_scaling_groups {
        Some(g) => {
            let (g, e) = check_groups(g);
            (Some(g), e)
        }
        None => (None, Vec::new()),
    };
    let launch_template = match (a.launch_template, &groups) {
        (None, Some(_)) => LaunchTemplate {
            by: LaunchTemplateBy::Name(String::new()),
            version: DEFAULT_LAUNCH_TEMPLATE_VERSION.to_string(),
        },
        (Some(_), Some(_)) => {
            at(
                &["launchTemplate"],
                "a pool backed by Auto Scaling groups launches from the groups' own launch \
                 templates: remove `launchTemplate`"
                    .to_string(),
            );
            LaunchTemplate {
                by: LaunchTemplateBy::Name(String::new()),
                version: DEFAULT_LAUNCH_TEMPLATE_VERSION.to_string(),
            }
        }
        (None, None) => {
            at(
                &[],
                "missing `launchTemplate` (give its `name` or `id`), or `autoScalingGroups`"
                    .to_string(),
            );
            LaunchTemplate {
                by: LaunchTemplateBy::Name(String::new()),
                version: DEFAULT_LAUNCH_TEMPLATE_VERSION.to_string(),
            }
        }
        (Some(lt), None) => {
            let by = match (lt.name, lt.id) {
                (Some(_), Some(_)) => {
                    at(
                        &["launchTemplate"],
                        "give the launch template's `name` or its `id`, not both".to_string(),
                    );
                    LaunchTemplateBy::Name(String::new())
                }
                (None, None) => {
                    at(
                        &["launchTemplate"],
                        "needs the launch template's `name` or `id`".to_string(),
                    );
                    LaunchTemplateBy::Name(String::new())
                }
                (Some(name), None) => {
                    if name.trim().is_empty() {
                        at(
                            &["launchTemplate", "name"],
                            "launch template name must not be empty".to_string(),
                        );
                    }
                    LaunchTemplateBy::Name(name)
                }
                (None, Some(id)) => {
                    if !is_resource_id(&id, "lt-") {
                        at(
                            &["launchTemplate", "id"],
                            format!("{id:?} is not a launch template id (lt-...)"),
                        );
                    }
                    LaunchTemplateBy::Id(id)
                }
            };
            let version = lt
                .version
                .unwrap_or_else(|| DEFAULT_LAUNCH_TEMPLATE_VERSION.to_string());
            let numeric = !version.is_empty() && version.bytes().all(|b| b.is_ascii_digit());
            if !(numeric || version == "$Default" || version == "$Latest") {
                at(
                    &["launchTemplate", "version"],
                    format!(
                        "launch template version {version:?} must be a number, $Default or $Latest"
                    ),
                );
            }
            LaunchTemplate { by, version }
        }
    };
    if groups.is_some() && a.subnets.is_some() {
        at(
            &["subnets"],
            "a pool backed by Auto Scaling groups launches into the groups' own subnets: \
             remove `subnets`"
                .to_string(),
        );
    }
    let subnets = a.subnets.unwrap_or_default();
    for (zone, subnet) in &subnets {
        if !is_resource_id(subnet, "subnet-") {
            at(
                &["subnets", zone],
                format!("{subnet:?} is not a subnet id (subnet-...)"),
            );
        }
    }
    if let Some(pool) = pool.filter(|p| p.provider == NAME && groups.is_none()) {
        for zone in pool.zones {
            if !subnets.contains_key(zone) {
                at(
                    &["subnets"],
                    format!("zone {zone} has no subnet in aws.subnets"),
                );
            }
        }
    }
    if let Some(pool) =
        pool.filter(|p| groups.is_some() && p.capacity_types.contains(&CapacityType::Reserved))
    {
        errors.push(FieldError::at(
            &["capacityTypes"],
            format!(
                "a pool backed by Auto Scaling groups cannot list `reserved` (pool {}): a group \
                 launches what its own launch template says, so a launch cannot be targeted at \
                 the reservations the pool selects nor held to their count; give the reserved \
                 capacity its own pool with `aws.launchTemplate` and `aws.subnets`",
                pool.name
            ),
        ));
    }
    errors.extend(group_errors);
    AwsPoolSettings {
        launch_template,
        subnets,
        auto_scaling_groups: groups,
    }
}

/// The groups of `autoScalingGroups`: `names` or `autoDiscovery`, not both.
fn check_groups(g: RawGroups) -> (AutoScalingGroups, Vec<FieldError>) {
    const HERE: &str = "autoScalingGroups";
    let mut errors = Vec::new();
    let mut at = |path: &[&str], index: Option<usize>, message: String| {
        let mut p = vec![PathKey::from(NAME)];
        p.extend(path.iter().map(|k| PathKey::from(*k)));
        p.extend(index.map(PathKey::Index));
        errors.push(FieldError { path: p, message });
    };
    let groups = match (g.names, g.auto_discovery) {
        (Some(_), Some(_)) => {
            at(
                &[HERE],
                None,
                "give the groups' `names` or `autoDiscovery`, not both".to_string(),
            );
            AutoScalingGroups::Named(Vec::new())
        }
        (None, None) => {
            at(
                &[HERE],
                None,
                "needs the groups' `names`, or `autoDiscovery` (`autoDiscovery: {}` finds them \
                 by the Cluster Autoscaler's tags)"
                    .to_string(),
            );
            AutoScalingGroups::Named(Vec::new())
        }
        (Some(names), None) => {
            if names.is_empty() {
                at(
                    &[HERE, "names"],
                    None,
                    "names no group (give at least one Auto Scaling group)".to_string(),
                );
            }
            for (i, n) in names.iter().enumerate() {
                let path = [HERE, "names"];
                if n.trim().is_empty() {
                    at(
                        &path,
                        Some(i),
                        "an Auto Scaling group name must not be empty".to_string(),
                    );
                } else if n.len() > 255 {
                    at(
                        &path,
                        Some(i),
                        format!("{n:?} is longer than an Auto Scaling group name (255)"),
                    );
                } else if names[..i].contains(n) {
                    at(&path, Some(i), format!("group {n} is named twice"));
                }
            }
            AutoScalingGroups::Named(names)
        }
        (None, Some(d)) => {
            let tags = d.tags.unwrap_or_default();
            let mut out = Vec::new();
            for (i, t) in tags.iter().enumerate() {
                let path = [HERE, "autoDiscovery", "tags"];
                let m = TagMatch::parse(t);
                if m.key.trim().is_empty() {
                    at(
                        &path,
                        Some(i),
                        format!("{t:?} has no tag key (write `key` or `key=value`)"),
                    );
                } else if out.contains(&m) {
                    at(&path, Some(i), format!("tag {t} is given twice"));
                }
                out.push(m);
            }
            AutoScalingGroups::Discovered(out)
        }
    };
    (groups, errors)
}
