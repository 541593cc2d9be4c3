//! A pool's `aws:` section of the scaling policy: its serde type and its validation, for the
//! core's policy parser (through [`POLICY`]) and the controller's provider factory.

use std::collections::BTreeMap;

use gpu_node_autoscaler_provider::policy::{
    decode_section, is_resource_id, FieldError, PoolFacts, ProviderPolicy, Value,
};
use serde::Deserialize;

/// The provider's name in policies (`provider: aws`) and the key of its pool section.
pub const NAME: &str = "aws";

/// The AWS provider's part of the policy: `provider: aws` and the `aws:` section.
pub static POLICY: AwsPolicy = AwsPolicy;

/// A pool's `aws:` section: where and from what its instances launch.
#[derive(Clone, Debug, PartialEq)]
pub struct AwsPoolSettings {
    pub launch_template: LaunchTemplate,
    /// Zone → subnet id; every zone of the pool has one.
    pub subnets: BTreeMap<String, String>,
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
    #[serde(default)]
    subnets: BTreeMap<String, String>,
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
    let launch_template = match a.launch_template {
        None => {
            at(
                &[],
                "missing `launchTemplate` (give its `name` or `id`)".to_string(),
            );
            LaunchTemplate {
                by: LaunchTemplateBy::Name(String::new()),
                version: DEFAULT_LAUNCH_TEMPLATE_VERSION.to_string(),
            }
        }
        Some(lt) => {
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
    for (zone, subnet) in &a.subnets {
        if !is_resource_id(subnet, "subnet-") {
            at(
                &["subnets", zone],
                format!("{subnet:?} is not a subnet id (subnet-...)"),
            );
        }
    }
    if let Some(pool) = pool.filter(|p| p.provider == NAME) {
        for zone in pool.zones {
            if !a.subnets.contains_key(zone) {
                at(
                    &["subnets"],
                    format!("zone {zone} has no subnet in aws.subnets"),
                );
            }
        }
    }
    AwsPoolSettings {
        launch_template,
        subnets: a.subnets,
    }
}
