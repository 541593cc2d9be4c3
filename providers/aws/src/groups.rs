//! Pools backed by Auto Scaling groups, the pure part: what a group offers (its template for
//! scale from zero, read as the Cluster Autoscaler reads it), which groups a launch grows and by
//! how much, and when an instance may be taken out of its group. No SDK types: the client reads
//! groups into [`Group`]s and acts on what these functions decide.

use std::collections::{BTreeMap, BTreeSet};

use gpu_node_autoscaler_provider::{CapacityType, GroupTemplate, OfferingKey};

use crate::settings::TagMatch;

/// Tags `<prefix><label key>` = label value: the labels a group's Nodes register with.
pub const TEMPLATE_LABEL: &str = "k8s.io/cluster-autoscaler/node-template/label/";
/// Tags `<prefix><taint key>` = `value:Effect`: the taints a group's Nodes register with.
pub const TEMPLATE_TAINT: &str = "k8s.io/cluster-autoscaler/node-template/taint/";
/// Tags `<prefix><resource>` = quantity: resources a group's Nodes advertise besides the
/// instance type's (e.g. `nvidia.com/gpu`, `ephemeral-storage`).
pub const TEMPLATE_RESOURCES: &str = "k8s.io/cluster-autoscaler/node-template/resources/";
/// The tag on a group naming the last launch that grew it and by how much (`<launch id>=<n>`),
/// so that a launch repeated after a restart does not grow the group twice.
pub const TAG_LAST_LAUNCH: &str = "gpu-node-autoscaler.io/last-launch";

/// The label EKS managed node groups carry with their capacity type (`ON_DEMAND`, `SPOT`).
pub const EKS_CAPACITY_TYPE: &str = "eks.amazonaws.com/capacityType";

/// The tag EKS puts on the Auto Scaling group of a managed node group: the node group's name.
pub const EKS_NODEGROUP_NAME: &str = "eks:nodegroup-name";
/// The tag EKS puts on the Auto Scaling group of a managed node group: its cluster's name.
pub const EKS_CLUSTER_NAME: &str = "eks:cluster-name";

/// The EKS managed node group behind a group, from its `eks:cluster-name` and
/// `eks:nodegroup-name` tags: `(cluster, node group)`.
pub fn managed_node_group(tags: &BTreeMap<String, String>) -> Option<(&str, &str)> {
    let cluster = tags.get(EKS_CLUSTER_NAME).filter(|v| !v.is_empty())?;
    let group = tags.get(EKS_NODEGROUP_NAME).filter(|v| !v.is_empty())?;
    Some((cluster, group))
}

/// What `DescribeNodegroup` says of a managed node group's Nodes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ManagedNodeGroup {
    pub labels: BTreeMap<String, String>,
    /// `(key, value, effect)`, the effect as Kubernetes spells it (`NoSchedule`).
    pub taints: Vec<(String, String, String)>,
}

/// A taint effect as EKS spells it (`NO_SCHEDULE`) as Kubernetes does (`NoSchedule`).
pub fn eks_taint_effect(effect: &str) -> Option<&'static str> {
    match effect {
        "NO_SCHEDULE" => Some("NoSchedule"),
        "PREFER_NO_SCHEDULE" => Some("PreferNoSchedule"),
        "NO_EXECUTE" => Some("NoExecute"),
        _ => None,
    }
}

/// One Auto Scaling group as the provider read it.
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    pub name: String,
    pub min: u32,
    pub max: u32,
    pub desired: u32,
    /// The instance types it launches (its `MixedInstancesPolicy` overrides, else its launch
    /// template's or launch configuration's type), in its order.
    pub instance_types: Vec<String>,
    /// The zones of its subnets.
    pub zones: Vec<String>,
    pub capacity_type: CapacityType,
    pub tags: BTreeMap<String, String>,
    pub instances: Vec<GroupInstance>,
    /// Where its instance types come from, for people (`launch template gpu-nodes`).
    pub source: String,
}

/// An instance of a group.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupInstance {
    pub id: String,
    pub zone: String,
    pub instance_type: String,
    /// The group's lifecycle state (`Pending`, `InService`, `Terminating`, ...).
    pub lifecycle: String,
    pub protected_from_scale_in: bool,
}

impl GroupInstance {
    /// Whether it is on its way out of the group.
    pub fn leaving(&self) -> bool {
        let l = self.lifecycle.as_str();
        l.starts_with("Terminat") || l.starts_with("Detach") || l == "Standby"
    }
}

/// A group's Nodes as its tags describe them, for scale from zero.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeTemplate {
    pub labels: BTreeMap<String, String>,
    /// `(key, value, effect)`.
    pub taints: Vec<(String, String, String)>,
    pub resources: BTreeMap<String, String>,
    /// Tags under the template prefixes that could not be read, one message each.
    pub problems: Vec<String>,
}

const TAINT_EFFECTS: [&str; 3] = ["NoSchedule", "PreferNoSchedule", "NoExecute"];

/// The template of a group's Nodes from its `k8s.io/cluster-autoscaler/node-template/...` tags.
pub fn node_template(tags: &BTreeMap<String, String>) -> NodeTemplate {
    let mut t = NodeTemplate::default();
    for (k, v) in tags {
        if let Some(label) = k.strip_prefix(TEMPLATE_LABEL) {
            t.labels.insert(label.to_string(), v.clone());
        } else if let Some(key) = k.strip_prefix(TEMPLATE_TAINT) {
            match v.rsplit_once(':') {
                Some((value, effect)) if TAINT_EFFECTS.contains(&effect) => {
                    t.taints
                        .push((key.to_string(), value.to_string(), effect.to_string()))
                }
                _ => t.problems.push(format!(
                    "tag {k}={v}: a taint is `value:Effect` (Effect one of {})",
                    TAINT_EFFECTS.join(", ")
                )),
            }
        } else if let Some(name) = k.strip_prefix(TEMPLATE_RESOURCES) {
            t.resources.insert(name.to_string(), v.clone());
        }
    }
    t
}

/// How a group buys its instances: spot when its `MixedInstancesPolicy` puts no on-demand
/// capacity above a base of zero (`spot_distribution`), or when its template labels say so
/// (`eks.amazonaws.com/capacityType: SPOT`, `karpenter.sh/capacity-type: spot`); on-demand
/// otherwise.
pub fn capacity_type_of(tags: &BTreeMap<String, String>, spot_distribution: bool) -> CapacityType {
    let label = |k: &str| {
        tags.get(&format!("{TEMPLATE_LABEL}{k}"))
            .map(String::as_str)
    };
    let spot_label = label(EKS_CAPACITY_TYPE).is_some_and(|v| v.eq_ignore_ascii_case("spot"))
        || label("karpenter.sh/capacity-type") == Some("spot")
        || label("node.kubernetes.io/capacity-type") == Some("spot");
    if spot_distribution || spot_label {
        CapacityType::Spot
    } else {
        CapacityType::OnDemand
    }
}

/// A group as the planner sees it: its instance types (only those in `pool_types` when the pool
/// lists some), its zones and capacity type, and its `node-template` tags' labels, taints and
/// resources (unreadable tags left out; `check-policy --provider aws` reports them).
///
/// For the group of an EKS managed node group, `managed` is what `DescribeNodegroup` says, as
/// the Cluster Autoscaler merges it: its labels win over the `node-template/label` tags per key,
/// its taints are added to the `node-template/taint` tags' (a tag taint of the same key and
/// effect is replaced). The policy's `labels` and `taints` still win over both (in the core).
pub fn group_template(
    g: &Group,
    pool_types: &[String],
    managed: Option<&ManagedNodeGroup>,
) -> GroupTemplate {
    let mut t = node_template(&g.tags);
    if let Some(m) = managed {
        t.labels
            .extend(m.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
        for taint in &m.taints {
            t.taints
                .retain(|(k, _, e)| !(k == &taint.0 && e == &taint.2));
            t.taints.push(taint.clone());
        }
    }
    GroupTemplate {
        group: g.name.clone(),
        instance_types: g
            .instance_types
            .iter()
            .filter(|i| pool_types.is_empty() || pool_types.contains(i))
            .cloned()
            .collect(),
        zones: g.zones.clone(),
        capacity_type: Some(g.capacity_type),
        labels: t.labels,
        taints: t.taints,
        resources: t.resources,
    }
}

/// Whether a group's tags carry every wanted tag (with its value where one is given).
pub fn matches(tags: &BTreeMap<String, String>, wanted: &[TagMatch]) -> bool {
    wanted.iter().all(|w| match (&w.value, tags.get(&w.key)) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some(v), Some(have)) => v == have,
    })
}

/// The pool's groups in its order of preference: the order of `names` when it names them; else
/// (discovered) spot groups first, then by name.
pub fn order(groups: &mut [Group], named: Option<&[String]>) {
    match named {
        Some(names) => groups.sort_by_key(|g| names.iter().position(|n| *n == g.name)),
        None => groups.sort_by(|a, b| {
            (a.capacity_type != CapacityType::Spot, &a.name)
                .cmp(&(b.capacity_type != CapacityType::Spot, &b.name))
        }),
    }
}

/// Whether a group can launch `offering`: its instance type, one of its zones, its capacity type.
pub fn serves(g: &Group, offering: &OfferingKey) -> bool {
    g.capacity_type == offering.capacity_type
        && g.instance_types.contains(&offering.instance_type)
        && g.zones.contains(&offering.zone)
}

/// How many more instances a group may be grown by: up to its maximum size.
pub fn headroom(g: &Group) -> u32 {
    g.max.saturating_sub(g.desired)
}

/// One step of a launch: grow `groups[group]` by `count` for `offering`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Growth {
    pub group: usize,
    pub offering: OfferingKey,
    pub count: u32,
}

/// How `count` instances are spread over the groups: offerings in the request's order, for each
/// the groups that serve it in the pool's order, each grown up to its headroom; groups in
/// `skip` (their launches failed lately) are left out. What cannot be placed is left over
/// (the second value).
pub fn allocate(
    groups: &[Group],
    offerings: &[OfferingKey],
    count: u32,
    skip: &BTreeSet<String>,
) -> (Vec<Growth>, u32) {
    let mut room: Vec<u32> = groups.iter().map(headroom).collect();
    let mut left = count;
    let mut out: Vec<Growth> = Vec::new();
    for o in offerings {
        for (i, g) in groups.iter().enumerate() {
            if left == 0 {
                return (out, 0);
            }
            if skip.contains(&g.name) || !serves(g, o) || room[i] == 0 {
                continue;
            }
            let n = room[i].min(left);
            room[i] -= n;
            left -= n;
            match out.iter_mut().find(|s| s.group == i && s.offering == *o) {
                Some(s) => s.count += n,
                None => out.push(Growth {
                    group: i,
                    offering: o.clone(),
                    count: n,
                }),
            }
        }
    }
    (out, left)
}

/// The launch id and count a group's [`TAG_LAST_LAUNCH`] tag records.
pub fn last_launch(value: &str) -> Option<(&str, u32)> {
    let (id, n) = value.rsplit_once('=')?;
    Some((id, n.parse().ok()?))
}

/// The value of [`TAG_LAST_LAUNCH`] for a launch that grew a group by `count`.
pub fn last_launch_value(launch_id: &str, count: u32) -> String {
    format!("{launch_id}={count}")
}

/// Why an instance may not be taken out of its group now (terminated with the group's desired
/// capacity decremented): protected from scale-in, or the group at its minimum size. `None`: it
/// may.
pub fn refuse_termination(g: &Group, instance: &GroupInstance) -> Option<String> {
    if instance.protected_from_scale_in {
        return Some(format!(
            "instance {} is protected from scale-in in Auto Scaling group {}: not terminated",
            instance.id, g.name
        ));
    }
    if g.desired <= g.min {
        return Some(format!(
            "Auto Scaling group {} is at its minimum size ({}): instance {} not terminated",
            g.name, g.min, instance.id
        ));
    }
    None
}

/// The desired capacity to give a group back to after its launch failed: the instances it has
/// (never fewer, so that the group removes none it chose itself) and at least its minimum;
/// `None` when its desired capacity is already there.
pub fn give_back(g: &Group) -> Option<u32> {
    let have = g.instances.iter().filter(|i| !i.leaving()).count() as u32;
    let to = have.max(g.min);
    (g.desired > to).then_some(to)
}

/// The desired capacity to lower a group to when `never` instances of a raise never came (a
/// launch slower than the group wait, after the pool's maximum provisioning time), as the
/// Cluster Autoscaler's `DecreaseTargetSize` does for a failed scale-up: its desired capacity
/// less those only, never below the instances it has (so that it removes none of its own
/// choosing) nor its minimum size; `None` when that lowers nothing.
pub fn give_back_unfulfilled(g: &Group, never: u32) -> Option<u32> {
    let have = g.instances.iter().filter(|i| !i.leaving()).count() as u32;
    let to = g.desired.saturating_sub(never).max(have).max(g.min);
    (to < g.desired).then_some(to)
}

/// A group described for people: its types, zones, capacity type, sizes and template.
/// One line on a group for `check-policy --provider aws`: what it launches, where, its sizes, and
/// the labels, taints and resources its Nodes are planned with (for the group of an EKS managed
/// node group, with what `DescribeNodegroup` says merged in, as [`group_template`] merges it).
pub fn describe(g: &Group, managed: Option<&ManagedNodeGroup>) -> String {
    let t = group_template(g, &[], managed);
    let mut s = format!(
        "group {}: {} [{}] in {} ({}), size {}..{} (desired {})",
        g.name,
        g.source,
        g.instance_types.join(","),
        g.zones.join(","),
        g.capacity_type,
        g.min,
        g.max,
        g.desired
    );
    if !t.labels.is_empty() {
        let l: Vec<String> = t.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        s.push_str(&format!(", labels {}", l.join(",")));
    }
    if !t.taints.is_empty() {
        let l: Vec<String> = t
            .taints
            .iter()
            .map(|(k, v, e)| format!("{k}={v}:{e}"))
            .collect();
        s.push_str(&format!(", taints {}", l.join(",")));
    }
    if !t.resources.is_empty() {
        let l: Vec<String> = t
            .resources
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        s.push_str(&format!(", resources {}", l.join(",")));
    }
    if let Some((cluster, name)) = managed_node_group(&g.tags).filter(|_| managed.is_some()) {
        s.push_str(&format!(
            "; EKS managed node group {cluster}/{name} (its labels and taints merged in)"
        ));
    }
    s
}

/// What a pool needs that its groups lack, one message each: instance types of the pool no group
/// launches, zones of the pool no group has, capacity types no group buys, and unreadable
/// template tags.
pub fn missing(
    groups: &[Group],
    types: &[String],
    zones: &[String],
    capacity_types: &[CapacityType],
) -> Vec<String> {
    let mut out = Vec::new();
    for t in types {
        if !groups.iter().any(|g| g.instance_types.contains(t)) {
            out.push(format!(
                "instance type {t} is launched by none of its groups"
            ));
        }
    }
    for z in zones {
        if !groups.iter().any(|g| g.zones.contains(z)) {
            out.push(format!("zone {z} has none of its groups"));
        }
    }
    for ct in capacity_types {
        if *ct != CapacityType::Reserved && !groups.iter().any(|g| g.capacity_type == *ct) {
            out.push(format!(
                "capacity type {ct} is bought by none of its groups"
            ));
        }
    }
    for g in groups {
        if g.instance_types.is_empty() {
            out.push(format!(
                "group {}: no instance type found ({})",
                g.name, g.source
            ));
        }
        if g.max == 0 {
            out.push(format!("group {}: its maximum size is 0", g.name));
        }
        for p in node_template(&g.tags).problems {
            out.push(format!("group {}: {p}", g.name));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use CapacityType::{OnDemand, Spot};

    fn group(name: &str, ct: CapacityType, zones: &[&str], desired: u32, max: u32) -> Group {
        Group {
            name: name.into(),
            min: 0,
            max,
            desired,
            instance_types: vec!["g5.xlarge".into()],
            zones: zones.iter().map(|z| z.to_string()).collect(),
            capacity_type: ct,
            tags: BTreeMap::new(),
            instances: Vec::new(),
            source: "launch template lt".into(),
        }
    }

    fn o(zone: &str, ct: CapacityType) -> OfferingKey {
        OfferingKey {
            instance_type: "g5.xlarge".into(),
            zone: zone.into(),
            capacity_type: ct,
        }
    }

    #[test]
    fn asg_template_tags_give_labels_taints_and_resources() {
        let tags: BTreeMap<String, String> = [
            (
                format!("{TEMPLATE_LABEL}nvidia.com/gpu.product"),
                "A10G".into(),
            ),
            (
                format!("{TEMPLATE_TAINT}nvidia.com/gpu"),
                "present:NoSchedule".into(),
            ),
            (format!("{TEMPLATE_TAINT}bad"), "x".into()),
            (format!("{TEMPLATE_RESOURCES}nvidia.com/gpu"), "1".into()),
            ("Name".to_string(), "gpu".to_string()),
        ]
        .into_iter()
        .collect();
        let t = node_template(&tags);
        assert_eq!(t.labels["nvidia.com/gpu.product"], "A10G");
        assert_eq!(
            t.taints,
            vec![(
                "nvidia.com/gpu".to_string(),
                "present".to_string(),
                "NoSchedule".to_string()
            )]
        );
        assert_eq!(t.resources["nvidia.com/gpu"], "1");
        assert_eq!(t.problems.len(), 1, "{:?}", t.problems);
        assert!(t.problems[0].contains("bad"), "{:?}", t.problems);
    }

    #[test]
    fn asg_capacity_type_from_distribution_or_labels() {
        let none = BTreeMap::new();
        assert_eq!(capacity_type_of(&none, false), OnDemand);
        assert_eq!(capacity_type_of(&none, true), Spot);
        let eks: BTreeMap<String, String> = [(
            format!("{TEMPLATE_LABEL}{EKS_CAPACITY_TYPE}"),
            "SPOT".to_string(),
        )]
        .into_iter()
        .collect();
        assert_eq!(capacity_type_of(&eks, false), Spot);
    }

    #[test]
    fn asg_discovery_matches_keys_and_values() {
        let tags: BTreeMap<String, String> = [
            (
                "k8s.io/cluster-autoscaler/enabled".to_string(),
                "true".to_string(),
            ),
            ("team".to_string(), "ml".to_string()),
        ]
        .into_iter()
        .collect();
        assert!(matches(
            &tags,
            &[TagMatch::parse("k8s.io/cluster-autoscaler/enabled")]
        ));
        assert!(matches(&tags, &[TagMatch::parse("team=ml")]));
        assert!(!matches(&tags, &[TagMatch::parse("team=web")]));
        assert!(!matches(
            &tags,
            &[
                TagMatch::parse("team"),
                TagMatch::parse("k8s.io/cluster-autoscaler/c")
            ]
        ));
    }

    #[test]
    fn asg_order_is_the_named_order_else_spot_first() {
        let mut gs = vec![
            group("b-od", OnDemand, &["a"], 0, 1),
            group("c-spot", Spot, &["a"], 0, 1),
            group("a-od", OnDemand, &["a"], 0, 1),
        ];
        order(&mut gs, None);
        let names: Vec<&str> = gs.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(names, ["c-spot", "a-od", "b-od"]);
        order(
            &mut gs,
            Some(&["b-od".into(), "a-od".into(), "c-spot".into()]),
        );
        let names: Vec<&str> = gs.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(names, ["b-od", "a-od", "c-spot"]);
    }

    #[test]
    fn asg_allocation_fills_groups_in_order_up_to_their_maximum() {
        let gs = vec![
            group("spot-a", Spot, &["a"], 1, 2),
            group("spot-a2", Spot, &["a"], 0, 2),
            group("od-a", OnDemand, &["a"], 0, 10),
        ];
        // A gang of 3 in zone a: the first spot group's one free place, then the second's.
        let (steps, left) = allocate(&gs, &[o("a", Spot)], 3, &BTreeSet::new());
        assert_eq!(left, 0);
        assert_eq!(
            steps.iter().map(|s| (s.group, s.count)).collect::<Vec<_>>(),
            vec![(0, 1), (1, 2)]
        );
        // More than spot holds: on-demand next, as the request orders it.
        let (steps, left) = allocate(&gs, &[o("a", Spot), o("a", OnDemand)], 5, &BTreeSet::new());
        assert_eq!(left, 0);
        assert_eq!(steps.last().map(|s| (s.group, s.count)), Some((2, 2)));
        // A group whose launch failed is skipped; a zone no group has is left over.
        let skip = BTreeSet::from(["spot-a".to_string()]);
        let (steps, left) = allocate(&gs, &[o("a", Spot), o("b", Spot)], 3, &skip);
        assert_eq!(steps.iter().map(|s| s.group).collect::<Vec<_>>(), vec![1]);
        assert_eq!(left, 1);
    }

    #[test]
    fn asg_termination_is_refused_when_protected_or_at_minimum() {
        let mut g = group("g", OnDemand, &["a"], 2, 4);
        g.min = 1;
        let mut i = GroupInstance {
            id: "i-1".into(),
            zone: "a".into(),
            instance_type: "g5.xlarge".into(),
            lifecycle: "InService".into(),
            protected_from_scale_in: false,
        };
        assert_eq!(refuse_termination(&g, &i), None);
        i.protected_from_scale_in = true;
        assert!(refuse_termination(&g, &i).unwrap().contains("protected"));
        i.protected_from_scale_in = false;
        g.desired = 1;
        assert!(refuse_termination(&g, &i)
            .unwrap()
            .contains("minimum size (1)"));
    }

    #[test]
    fn asg_give_back_never_goes_below_the_instances_there() {
        let mut g = group("g", Spot, &["a"], 3, 4);
        g.instances.push(GroupInstance {
            id: "i-1".into(),
            zone: "a".into(),
            instance_type: "g5.xlarge".into(),
            lifecycle: "InService".into(),
            protected_from_scale_in: false,
        });
        assert_eq!(give_back(&g), Some(1));
        g.desired = 1;
        assert_eq!(give_back(&g), None);
    }

    #[test]
    fn asg_group_template_keeps_the_pools_types_and_readable_tags() {
        let mut g = group("g", Spot, &["a", "b"], 0, 4);
        g.instance_types = vec!["g5.xlarge".into(), "g5.2xlarge".into()];
        g.tags = [
            (format!("{TEMPLATE_LABEL}gpu-type"), "a10g".to_string()),
            (
                format!("{TEMPLATE_TAINT}gpu"),
                "present:NoSchedule".to_string(),
            ),
            (format!("{TEMPLATE_TAINT}bad"), "x".to_string()),
            (
                format!("{TEMPLATE_RESOURCES}example.com/fpga"),
                "2".to_string(),
            ),
        ]
        .into_iter()
        .collect();
        let all = group_template(&g, &[], None);
        assert_eq!(all.instance_types, ["g5.xlarge", "g5.2xlarge"]);
        assert_eq!(all.zones, ["a", "b"]);
        assert_eq!(all.capacity_type, Some(Spot));
        assert_eq!(all.labels["gpu-type"], "a10g");
        assert_eq!(
            all.taints,
            [(
                "gpu".to_string(),
                "present".to_string(),
                "NoSchedule".to_string()
            )]
        );
        assert_eq!(all.resources["example.com/fpga"], "2");
        // A pool that lists types keeps only those of the group.
        let listed = group_template(
            &g,
            &["g5.2xlarge".to_string(), "p4d.24xlarge".to_string()],
            None,
        );
        assert_eq!(listed.instance_types, ["g5.2xlarge"]);
    }

    #[test]
    fn asg_last_launch_round_trips() {
        let v = last_launch_value("su-abc=1", 3);
        assert_eq!(last_launch(&v), Some(("su-abc=1", 3)));
        assert_eq!(last_launch("junk"), None);
    }
}
