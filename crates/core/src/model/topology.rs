//! What kube-scheduler checks across nodes before it binds a pod, with its semantics:
//! host ports (its `NodePorts` plugin), required inter-pod affinity and anti-affinity in both
//! directions (`InterPodAffinity`), topology spread with `whenUnsatisfiable: DoNotSchedule`
//! (`PodTopologySpread`) and the CSI drivers' per-node attach limits (`NodeVolumeLimits`).
//!
//! Preferences (`preferredDuringScheduling…` pod affinity and anti-affinity and node affinity,
//! `whenUnsatisfiable: ScheduleAnyway` spreads) never make a site unfit: they are scored as
//! kube-scheduler scores them ([`TopologyIndex::preference_scores`]) and break ties between
//! sites that admit a pod.
//!
//! These rules need more than one node's labels, so they are checked against a
//! [`TopologyIndex`]: the pods placed so far (running ones, and those a pass has placed), counted
//! per topology domain. Every placement builds one per pass and checks a pod with
//! [`TopologyIndex::admits`] at a [`Site`] (a node, or a node not launched yet), then records
//! it with [`TopologyIndex::add`].

use crate::hash::HashMap;
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::constraints::{Constraints, Operator, Requirement, Taint};
use super::pod::Pod;

/// The node label every node carries with its own name.
pub const HOSTNAME: &str = "kubernetes.io/hostname";

/// A container port bound on the node (`hostPort`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostPort {
    pub port: i32,
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
    /// `hostIP`; empty for any address (`0.0.0.0` or unset).
    pub ip: String,
}

impl HostPort {
    /// Two pods with these ports cannot share a node: same port and protocol, and one of them
    /// binds every address or both the same one.
    pub fn conflicts(&self, other: &HostPort) -> bool {
        self.port == other.port
            && self.protocol == other.protocol
            && (self.ip.is_empty() || other.ip.is_empty() || self.ip == other.ip)
    }
}

/// A volume a pod attaches on its node, by a CSI driver whose attach count the node limits
/// (see [`crate::model::volumes::AttachLimits`]). Pods that share the volume attach it once.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Attachment {
    pub driver: String,
    /// The PersistentVolume's name, or `namespace/claim` for a claim not bound yet.
    pub volume: String,
}

/// The pods a term looks at: a label selector over some namespaces.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodSelector {
    /// `None` (no `labelSelector`) selects no pod; an empty list selects every pod.
    pub labels: Option<Vec<Requirement>>,
    /// `None`: every namespace (`namespaceSelector: {}`); else these.
    pub namespaces: Option<Vec<String>>,
    /// A term's non-empty `namespaceSelector`: `namespaces` are its listed ones and those whose
    /// labels it selects once the cluster's Namespaces are known ([`resolve_namespaces`]);
    /// before, the listed ones and the pod's own.
    pub namespace_selector: Option<NamespaceSelector>,
}

/// A non-empty `namespaceSelector` and the namespaces its term lists.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NamespaceSelector {
    pub labels: Vec<Requirement>,
    pub listed: Vec<String>,
}

impl NamespaceSelector {
    /// The listed namespaces and those of `namespaces` (name → labels) it selects, sorted.
    pub fn resolve(&self, namespaces: &BTreeMap<String, BTreeMap<String, String>>) -> Vec<String> {
        let mut out: BTreeSet<String> = self.listed.iter().cloned().collect();
        out.extend(
            namespaces
                .iter()
                .filter(|(_, l)| self.labels.iter().all(|r| r.matches(l)))
                .map(|(n, _)| n.clone()),
        );
        out.into_iter().collect()
    }
}

/// Resolves the `namespaceSelector`s of the pods' pod (anti-)affinity terms against the
/// cluster's Namespaces (name → labels), as kube-scheduler does: each term then looks at its
/// listed namespaces and those its selector selects. Pods sharing rules keep sharing them.
pub fn resolve_namespaces(
    pods: &mut [Pod],
    namespaces: &BTreeMap<String, BTreeMap<String, String>>,
) {
    let mut done: HashMap<*const Constraints, Arc<Constraints>> = HashMap::default();
    for p in pods {
        let Some(t) = &p.constraints.topology else {
            continue;
        };
        let selects = |s: &PodSelector| s.namespace_selector.is_some();
        if !(t
            .affinity
            .iter()
            .chain(&t.anti_affinity)
            .any(|a| selects(&a.selector))
            || t.preferences.pods.iter().any(|x| selects(&x.term.selector)))
        {
            continue;
        }
        let key = Arc::as_ptr(&p.constraints);
        let resolved = done.entry(key).or_insert_with(|| {
            let mut t = (**t).clone();
            let fix = |a: &mut AffinityTerm| {
                if let Some(ns) = &a.selector.namespace_selector {
                    a.selector.namespaces = Some(ns.resolve(namespaces));
                }
            };
            t.affinity.iter_mut().for_each(fix);
            t.anti_affinity.iter_mut().for_each(fix);
            t.preferences.pods.iter_mut().for_each(|x| fix(&mut x.term));
            let mut c = (*p.constraints).clone();
            c.topology = Some(Arc::new(t));
            Arc::new(c)
        });
        p.constraints = resolved.clone();
    }
}

impl PodSelector {
    pub fn selects(&self, namespace: &str, labels: &BTreeMap<String, String>) -> bool {
        self.namespaces
            .as_ref()
            .is_none_or(|ns| ns.iter().any(|n| n == namespace))
            && self
                .labels
                .as_ref()
                .is_some_and(|reqs| reqs.iter().all(|r| r.matches(labels)))
    }
}

/// One required pod (anti-)affinity term, its namespaces resolved against the pod's own.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AffinityTerm {
    pub selector: PodSelector,
    pub topology_key: String,
}

/// One `topologySpreadConstraints` entry with `whenUnsatisfiable: DoNotSchedule`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Spread {
    pub max_skew: i32,
    pub topology_key: String,
    /// Its `labelSelector` (with `matchLabelKeys` folded in), over the pod's own namespace.
    pub selector: PodSelector,
    /// `minDomains` (1 when unset).
    pub min_domains: i32,
    /// Which nodes it counts pods on and takes domains from: `nodeAffinityPolicy: Honor` (the
    /// default: only nodes the pod's node selector and required node affinity admit) and
    /// `nodeTaintsPolicy: Honor` (only nodes whose taints it tolerates; default `Ignore`).
    pub honor_node_affinity: bool,
    pub honor_taints: bool,
}

/// The nodes a spread counts pods on and takes its domains from (its node inclusion policies
/// applied to the pod's node selector, required node affinity and tolerations); `None` in an
/// index's counter for every node.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Inclusion {
    /// The pod's `nodeSelector` and required node affinity (its other constraints emptied)
    /// when honoured.
    nodes: Option<Constraints>,
    /// Its tolerations, when taints are honoured.
    tolerations: Option<Constraints>,
}

impl Inclusion {
    /// For a spread of a pod with these constraints; `None` when every node is included.
    fn of(spread: &Spread, c: &Constraints) -> Option<Inclusion> {
        let nodes = (spread.honor_node_affinity
            && !(c.node_selector.is_empty() && c.affinity.is_none()))
        .then(|| Constraints {
            node_selector: c.node_selector.clone(),
            affinity: c.affinity.clone(),
            ..Constraints::default()
        });
        let tolerations = spread.honor_taints.then(|| Constraints {
            tolerations: c.tolerations.clone(),
            ..Constraints::default()
        });
        (nodes.is_some() || tolerations.is_some()).then_some(Inclusion { nodes, tolerations })
    }

    /// Whether a node with these labels, name (`None`: not launched yet) and taints is
    /// included.
    fn includes(
        &self,
        labels: &BTreeMap<String, String>,
        node: Option<&str>,
        taints: &[Taint],
    ) -> bool {
        self.nodes
            .as_ref()
            .is_none_or(|c| c.matches_node(labels, node))
            && self
                .tolerations
                .as_ref()
                .is_none_or(|c| c.tolerates(taints))
    }
}

/// One preferred pod affinity (`weight` > 0) or anti-affinity (`weight` < 0) term.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PreferredTerm {
    pub weight: i32,
    pub term: AffinityTerm,
}

/// One preferred node affinity term: its weight and the labels it asks for.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PreferredNodes {
    pub weight: i32,
    pub requirements: Vec<Requirement>,
}

/// A pod's preferences across nodes: never a reason to refuse a site or to launch, they break
/// ties between the sites that admit it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Preferences {
    /// `preferredDuringSchedulingIgnoredDuringExecution` of its pod affinity (positive weights)
    /// and anti-affinity (negative).
    pub pods: Vec<PreferredTerm>,
    /// Its `whenUnsatisfiable: ScheduleAnyway` spread constraints.
    pub spread: Vec<Spread>,
    /// `preferredDuringSchedulingIgnoredDuringExecution` of its node affinity.
    pub nodes: Vec<PreferredNodes>,
}

impl Preferences {
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty() && self.spread.is_empty() && self.nodes.is_empty()
    }
}

/// A pod's rules across nodes; shared by the pods of one template.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodTopology {
    pub host_ports: Vec<HostPort>,
    pub affinity: Vec<AffinityTerm>,
    pub anti_affinity: Vec<AffinityTerm>,
    pub spread: Vec<Spread>,
    /// Its volumes of CSI drivers some node limits, sorted.
    pub attachments: Vec<Attachment>,
    pub preferences: Preferences,
}

impl PodTopology {
    pub fn is_empty(&self) -> bool {
        self.host_ports.is_empty()
            && self.attachments.is_empty()
            && self.affinity.is_empty()
            && self.anti_affinity.is_empty()
            && self.spread.is_empty()
            && self.preferences.is_empty()
    }

    /// The topology keys of its terms.
    fn keys(&self) -> impl Iterator<Item = &str> {
        self.affinity
            .iter()
            .chain(&self.anti_affinity)
            .map(|t| t.topology_key.as_str())
            .chain(self.spread.iter().map(|s| s.topology_key.as_str()))
    }
}

/// Where a pod is or would be: its node's labels and the node's identity (its name, or a
/// stand-in unique to a node not launched yet, which is then its own `kubernetes.io/hostname`
/// domain).
#[derive(Clone, Copy, Debug)]
pub struct Site<'a> {
    pub labels: &'a BTreeMap<String, String>,
    pub node: &'a str,
}

impl<'a> Site<'a> {
    /// The node's domain of `key`; a node without the hostname label is its own domain.
    pub fn domain(&self, key: &str) -> Option<&'a str> {
        match self.labels.get(key) {
            Some(v) => Some(v.as_str()),
            None if key == HOSTNAME => Some(self.node),
            None => None,
        }
    }
}

/// Why a pod may not go to a site.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    HostPort,
    VolumeLimit,
    AntiAffinity,
    Affinity,
    Spread,
}

impl Refusal {
    pub fn describe(self) -> &'static str {
        match self {
            Refusal::HostPort => "its host ports are taken there",
            Refusal::VolumeLimit => "its volumes would exceed the node's CSI attach limit",
            Refusal::AntiAffinity => "pod anti-affinity (its own or a running pod's)",
            Refusal::Affinity => "required pod affinity",
            Refusal::Spread => "topology spread (DoNotSchedule)",
        }
    }
}

/// A spread check of one pod shape.
#[derive(Clone, Debug)]
struct SpreadCheck {
    counted: usize,
    max_skew: i64,
    min_domains: usize,
    self_match: i64,
    /// Domains the pod may be placed in: those of the nodes its node selector and affinity
    /// admit (and that carry every key of its spread), and of the offerings they admit.
    domains: Vec<String>,
    /// A new node is its own domain with no pod (hostname spread where nodes can be launched).
    fresh: bool,
}

/// What the index knows of one pod shape (namespace, labels, rules), computed once per shape.
#[derive(Clone, Debug, Default)]
pub struct Profile {
    /// Counted selectors this pod is selected by (updated when it is placed).
    matched: Vec<usize>,
    /// Anti-affinity terms of other pods that select it (checked).
    repelled_by: Vec<usize>,
    /// Its own anti-affinity terms, as repelling terms (updated when it is placed).
    own_repel: Vec<usize>,
    /// Its affinity terms (counted), and whether it matches all of them itself.
    affinity: Vec<usize>,
    self_affine: bool,
    /// Its anti-affinity terms (counted).
    anti: Vec<usize>,
    spread: Vec<SpreadCheck>,
    ports: Vec<HostPort>,
    attach: Vec<Attachment>,
    /// Preference counters that select it (updated when it is placed).
    pref_matched: Vec<usize>,
    /// Its own pod affinity terms, preferred and required, as terms other pods are scored by
    /// (updated when it is placed).
    own_held: Vec<usize>,
    /// Terms of other pods that select it (scored): kube-scheduler's `InterPodAffinity` scores a
    /// node by the placed pods' terms too, not only by the pod's own.
    held_by: Vec<usize>,
    /// Its preferences: pod terms (preference counter, weight), `ScheduleAnyway` spreads
    /// (preference counter, `maxSkew`), node terms.
    prefer_pods: Vec<(usize, i64)>,
    prefer_spread: Vec<(usize, i64)>,
    prefer_nodes: Vec<PreferredNodes>,
}

impl Profile {
    /// Neither has rules or preferences of its own nor is looked at by another pod's: the
    /// index never refuses or scores it and need not record it.
    pub fn is_free(&self) -> bool {
        !self.has_rules()
            && self.pref_matched.is_empty()
            && self.own_held.is_empty()
            && !self.has_preferences()
    }

    /// Has rules of its own or is looked at by other pods' rules (not their preferences): the
    /// index may refuse it a site.
    pub fn has_rules(&self) -> bool {
        !(self.ports.is_empty() && self.attach.is_empty() && !self.is_bound_to_domains())
    }

    /// Has preferences of its own, or placed pods' terms select it: sites that admit it are
    /// scored.
    pub fn has_preferences(&self) -> bool {
        !(self.prefer_pods.is_empty()
            && self.held_by.is_empty()
            && self.prefer_spread.is_empty()
            && self.prefer_nodes.is_empty())
    }

    /// Has rules of its own or is looked at by other pods' rules: its new nodes must each be
    /// in one domain of every topology key.
    pub fn is_bound_to_domains(&self) -> bool {
        !(self.matched.is_empty()
            && self.repelled_by.is_empty()
            && self.own_repel.is_empty()
            && self.affinity.is_empty()
            && self.anti.is_empty()
            && self.spread.is_empty())
    }
}

/// Counts per domain of the pods that all of some selectors select (on the nodes a spread's
/// inclusion policies include).
#[derive(Clone, Debug, Default)]
struct Counter {
    key: String,
    selectors: Vec<PodSelector>,
    include: Option<Inclusion>,
    by_domain: fnv::FnvHashMap<String, i64>,
    total: i64,
}

/// A counter's identity: topology key, selectors and the nodes it counts on.
type CounterKey = (String, Vec<PodSelector>, Option<Inclusion>);

impl Counter {
    fn selects(&self, namespace: &str, labels: &BTreeMap<String, String>) -> bool {
        self.selectors.iter().all(|s| s.selects(namespace, labels))
    }

    fn add(&mut self, site: &Site, k: i64, taints: &HashMap<String, Vec<Taint>>) {
        if let Some(inc) = &self.include {
            let t = taints.get(site.node).map_or(&[][..], Vec::as_slice);
            if !inc.includes(site.labels, Some(site.node), t) {
                return;
            }
        }
        if let Some(v) = site.domain(&self.key) {
            match self.by_domain.get_mut(v) {
                Some(n) => *n += k,
                None => {
                    self.by_domain.insert(v.to_string(), k);
                }
            }
            self.total += k;
        }
    }

    fn at(&self, site: &Site) -> Option<i64> {
        site.domain(&self.key)
            .map(|v| self.by_domain.get(v).copied().unwrap_or(0))
    }
}

/// A node that may be launched: its labels and the taints it will carry (its pool's; those of
/// effect `PreferNoSchedule` never exclude it).
pub type Offering = (Arc<BTreeMap<String, String>>, Arc<[Taint]>);

/// The pods placed so far, counted per topology domain for every selector some pod's rules
/// use; and the host ports taken per node. Built per pass from the pods (whose rules it
/// learns), the sites that exist (nodes) and those that may be launched (offerings' labels).
#[derive(Clone, Debug, Default)]
pub struct TopologyIndex {
    counted: Vec<Counter>,
    counted_ix: HashMap<CounterKey, usize>,
    repel: Vec<Counter>,
    repel_ix: HashMap<CounterKey, usize>,
    /// Counts for preferences only: kept apart so that a pod only preferences look at is not
    /// bound to domains.
    preferred: Vec<Counter>,
    preferred_ix: HashMap<CounterKey, usize>,
    /// The pods that hold a pod affinity term, per term and weight (a preferred term's weight,
    /// negative for anti-affinity; kube-scheduler's `hardPodAffinityWeight`, 1, for a required
    /// affinity term): counted where those pods are, they score the pods their terms select.
    held: Vec<Counter>,
    held_weight: Vec<i64>,
    held_ix: HashMap<HeldKey, usize>,
    ports: HashMap<String, Vec<HostPort>>,
    /// Per node, the volumes its pods attach (once per pod: a volume two pods share is in it
    /// twice).
    attached: HashMap<String, Vec<Attachment>>,
    /// The CSI drivers' attach limits per node, and per instance type for nodes not launched
    /// yet.
    limits: HashMap<String, BTreeMap<String, u32>>,
    type_limits: HashMap<String, BTreeMap<String, u32>>,
    /// Sites that exist: labels and node name.
    nodes: Vec<(Arc<BTreeMap<String, String>>, String)>,
    /// The `NoSchedule` and `NoExecute` taints of the nodes that have some, by name (for the
    /// spreads that honour taints).
    taints: HashMap<String, Vec<Taint>>,
    /// Labels of nodes that may be launched.
    offerings: Vec<Offering>,
    /// Every topology key of a term, but the hostname.
    keys: BTreeSet<String>,
    /// The counters a pod may be selected by, from the label keys it has.
    counted_by_key: Prefilter,
    repel_by_key: Prefilter,
    preferred_by_key: Prefilter,
    held_by_key: Prefilter,
    /// Eligible domains per spread inclusion, topology key and the keys of the pod's spread,
    /// as [`TopologyIndex::profile`] found them: pods of one template share them, and so do
    /// pods whose templates differ only in their rules across nodes.
    domains: RefCell<HashMap<DomainsKey, Domains>>,
}

/// The domains of a key a pod may be placed in, and whether a new node is a fresh one.
type Domains = (Vec<String>, bool);

/// What the domains depend on: the spread's inclusion, its key and the pod's spread keys.
type DomainsKey = (Option<Inclusion>, String, Vec<String>);

/// Counters by a label every pod they select has (a requirement `In` on its key: under each of
/// its values), by a label key every pod they select has (`Exists`), and those without one.
#[derive(Clone, Debug, Default)]
struct Prefilter {
    by_value: HashMap<String, HashMap<String, Vec<usize>>>,
    by_key: HashMap<String, Vec<usize>>,
    rest: Vec<usize>,
}

impl Prefilter {
    fn new(counters: &[Counter]) -> Prefilter {
        let mut p = Prefilter::default();
        for (i, c) in counters.iter().enumerate() {
            let anchor = c
                .selectors
                .iter()
                .filter_map(|s| s.labels.as_ref())
                .flatten()
                .find(|r| matches!(r.operator, Operator::In | Operator::Exists));
            match anchor {
                Some(r) if r.operator == Operator::In => {
                    let by_value = p.by_value.entry(r.key.clone()).or_default();
                    for v in &r.values {
                        let list = by_value.entry(v.clone()).or_default();
                        // A value listed twice lists the counter once.
                        if list.last() != Some(&i) {
                            list.push(i);
                        }
                    }
                }
                Some(r) => p.by_key.entry(r.key.clone()).or_default().push(i),
                None => p.rest.push(i),
            }
        }
        p
    }

    /// Indices of the counters that select a pod with these labels, in order.
    fn select(
        &self,
        counters: &[Counter],
        namespace: &str,
        labels: &BTreeMap<String, String>,
    ) -> Vec<usize> {
        let mut out: Vec<usize> = self
            .rest
            .iter()
            .chain(labels.keys().filter_map(|k| self.by_key.get(k)).flatten())
            .chain(
                labels
                    .iter()
                    .filter_map(|(k, v)| self.by_value.get(k)?.get(v))
                    .flatten(),
            )
            .copied()
            .filter(|&i| counters[i].selects(namespace, labels))
            .collect();
        out.sort_unstable();
        out
    }
}

impl TopologyIndex {
    /// An index knowing the rules of `pods` (those with rules), with no pod placed yet.
    pub fn new<'a>(
        pods: impl IntoIterator<Item = &'a Pod>,
        nodes: Vec<(Arc<BTreeMap<String, String>>, String)>,
        offerings: Vec<Offering>,
    ) -> TopologyIndex {
        let mut ix = TopologyIndex {
            nodes,
            offerings,
            ..TopologyIndex::default()
        };
        let mut seen: BTreeSet<(*const PodTopology, *const Constraints)> = BTreeSet::new();
        for p in pods {
            let Some(t) = &p.constraints.topology else {
                continue;
            };
            if !seen.insert((Arc::as_ptr(t), Arc::as_ptr(&p.constraints))) {
                continue;
            }
            // kube-scheduler counts for a pod's affinity the pods that match all its terms.
            let all = affinity_selectors(t);
            for a in &t.affinity {
                ix.counter(&a.topology_key, &all, None);
            }
            for a in &t.anti_affinity {
                let key = (a.topology_key.clone(), vec![a.selector.clone()], None);
                intern(&mut ix.counted, &mut ix.counted_ix, key.clone());
                intern(&mut ix.repel, &mut ix.repel_ix, key);
            }
            for s in &t.spread {
                let include = Inclusion::of(s, &p.constraints);
                ix.counter(&s.topology_key, std::slice::from_ref(&s.selector), include);
            }
            // A `ScheduleAnyway` spread counts the pods on the nodes its node inclusion policies
            // include, as a `DoNotSchedule` one does.
            let prefs = &t.preferences;
            for (key, selector, include) in prefs
                .pods
                .iter()
                .map(|p| (&p.term.topology_key, &p.term.selector, None))
                .chain(prefs.spread.iter().map(|s| {
                    (
                        &s.topology_key,
                        &s.selector,
                        Inclusion::of(s, &p.constraints),
                    )
                }))
            {
                intern(
                    &mut ix.preferred,
                    &mut ix.preferred_ix,
                    (key.clone(), vec![selector.clone()], include),
                );
            }
            for (term, weight) in held_terms(t) {
                ix.held_term(term, weight);
            }
            ix.keys
                .extend(t.keys().filter(|k| *k != HOSTNAME).map(str::to_string));
        }
        ix.counted_by_key = Prefilter::new(&ix.counted);
        ix.repel_by_key = Prefilter::new(&ix.repel);
        ix.preferred_by_key = Prefilter::new(&ix.preferred);
        ix.held_by_key = Prefilter::new(&ix.held);
        ix
    }

    /// The index of the counter of the pods holding `term` with `weight`, added when new.
    fn held_term(&mut self, term: &AffinityTerm, weight: i64) -> usize {
        let key = held_key(term, weight);
        if let Some(&i) = self.held_ix.get(&key) {
            return i;
        }
        self.held.push(Counter {
            key: term.topology_key.clone(),
            selectors: vec![term.selector.clone()],
            ..Counter::default()
        });
        self.held_weight.push(weight);
        let i = self.held.len() - 1;
        self.held_ix.insert(key, i);
        i
    }

    /// The topology keys some rule uses, but the hostname: a new node of a pod bound to
    /// domains is one value of each.
    pub fn keys(&self) -> &BTreeSet<String> {
        &self.keys
    }

    fn counter(
        &mut self,
        key: &str,
        selectors: &[PodSelector],
        include: Option<Inclusion>,
    ) -> usize {
        let k = (key.to_string(), selectors.to_vec(), include);
        intern(&mut self.counted, &mut self.counted_ix, k)
    }

    /// Which counted selectors select a pod, which anti-affinity terms of other pods repel it
    /// and which affinity terms of other pods score it: pods alike in these and in their
    /// constraints are alike to the index.
    pub fn selected(&self, pod: &Pod) -> (Vec<usize>, Vec<usize>, Vec<usize>) {
        let ns = pod.id.namespace.as_str();
        let labels = &pod.labels;
        (
            self.counted_by_key.select(&self.counted, ns, labels),
            self.repel_by_key.select(&self.repel, ns, labels),
            self.held_by_key.select(&self.held, ns, labels),
        )
    }

    /// What recording a pod changes: the selectors that select it, its own anti-affinity terms
    /// and its host ports (not its checks: see [`TopologyIndex::profile`]).
    pub fn footprint(&self, pod: &Pod) -> Profile {
        let matched =
            self.counted_by_key
                .select(&self.counted, pod.id.namespace.as_str(), &pod.labels);
        let mut p = Profile {
            matched,
            pref_matched: self.preferred_by_key.select(
                &self.preferred,
                pod.id.namespace.as_str(),
                &pod.labels,
            ),
            ..Profile::default()
        };
        if let Some(t) = &pod.constraints.topology {
            p.own_repel = t
                .anti_affinity
                .iter()
                .map(|a| self.repel_ix[&(a.topology_key.clone(), vec![a.selector.clone()], None)])
                .collect();
            p.ports = t.host_ports.clone();
            p.attach = t.attachments.clone();
            p.own_held = held_terms(t)
                .map(|(term, weight)| self.held_ix[&held_key(term, weight)])
                .collect();
        }
        p
    }

    /// What the index needs of a pod to check and record it: [`TopologyIndex::selected`], its
    /// own rules, and the domains its spread ranges over.
    pub fn profile(&self, pod: &Pod) -> Profile {
        let ns = pod.id.namespace.as_str();
        let labels = &pod.labels;
        let mut p = self.footprint(pod);
        let (_, repelled_by, held_by) = self.selected(pod);
        p.repelled_by = repelled_by;
        p.held_by = held_by;
        let Some(t) = &pod.constraints.topology else {
            return p;
        };
        let id = |key: &str, selectors: Vec<PodSelector>, include: Option<Inclusion>| {
            self.counted_ix[&(key.to_string(), selectors, include)]
        };
        let all = affinity_selectors(t);
        p.affinity = t
            .affinity
            .iter()
            .map(|a| id(&a.topology_key, all.clone(), None))
            .collect();
        p.self_affine = t.affinity.iter().all(|a| a.selector.selects(ns, labels));
        p.anti = t
            .anti_affinity
            .iter()
            .map(|a| id(&a.topology_key, vec![a.selector.clone()], None))
            .collect();
        let prefs = &t.preferences;
        let pref = |key: &str, selector: &PodSelector, include: Option<Inclusion>| {
            self.preferred_ix[&(key.to_string(), vec![selector.clone()], include)]
        };
        p.prefer_pods = prefs
            .pods
            .iter()
            .map(|x| {
                (
                    pref(&x.term.topology_key, &x.term.selector, None),
                    x.weight as i64,
                )
            })
            .collect();
        p.prefer_spread = prefs
            .spread
            .iter()
            .map(|s| {
                let include = Inclusion::of(s, &pod.constraints);
                (
                    pref(&s.topology_key, &s.selector, include),
                    s.max_skew as i64,
                )
            })
            .collect();
        p.prefer_nodes = prefs.nodes.clone();
        let spread_keys: Vec<&str> = t.spread.iter().map(|s| s.topology_key.as_str()).collect();
        for s in &t.spread {
            let include = Inclusion::of(s, &pod.constraints);
            let (domains, fresh) = self.eligible_domains(&include, &s.topology_key, &spread_keys);
            p.spread.push(SpreadCheck {
                counted: id(&s.topology_key, vec![s.selector.clone()], include),
                max_skew: s.max_skew as i64,
                min_domains: s.min_domains.max(1) as usize,
                self_match: s.selector.selects(ns, labels) as i64,
                domains,
                fresh,
            });
        }
        p
    }

    /// The domains of `key` a spread ranges over (kube-scheduler's node inclusion policies:
    /// by default the nodes the pod's node selector and required node affinity admit, taints
    /// ignored): of the included nodes that carry every key of the pod's spreads, and of the
    /// included offerings (a node not launched yet with its pool's taints). A hostname domain
    /// of a node that may be launched is a fresh one.
    fn eligible_domains(
        &self,
        include: &Option<Inclusion>,
        key: &str,
        spread_keys: &[&str],
    ) -> (Vec<String>, bool) {
        let memo = (
            include.clone(),
            key.to_string(),
            spread_keys.iter().map(|k| k.to_string()).collect(),
        );
        if let Some(d) = self.domains.borrow().get(&memo) {
            return d.clone();
        }
        let included = |labels: &BTreeMap<String, String>, node: Option<&str>, taints: &[Taint]| {
            include
                .as_ref()
                .is_none_or(|inc| inc.includes(labels, node, taints))
        };
        let node_taints = |n: &str| self.taints.get(n).map_or(&[][..], Vec::as_slice);
        let mut out: BTreeSet<String> = BTreeSet::new();
        for (labels, name) in &self.nodes {
            let site = Site { labels, node: name };
            if spread_keys.iter().all(|k| site.domain(k).is_some())
                && included(labels, Some(name), node_taints(name))
            {
                if let Some(v) = site.domain(key) {
                    out.insert(v.to_string());
                }
            }
        }
        let mut fresh = false;
        for (labels, taints) in &self.offerings {
            if !included(labels, None, taints) {
                continue;
            }
            if key == HOSTNAME && !labels.contains_key(HOSTNAME) {
                fresh = true;
            } else if let Some(v) = labels.get(key) {
                if spread_keys
                    .iter()
                    .all(|k| *k == HOSTNAME || labels.contains_key(*k))
                {
                    out.insert(v.clone());
                }
            }
        }
        let found = (out.into_iter().collect::<Vec<_>>(), fresh);
        self.domains.borrow_mut().insert(memo, found.clone());
        found
    }

    /// Whether kube-scheduler would let a pod of profile `p` onto `site`, with the pods placed
    /// so far: no host port taken; no anti-affinity of a placed pod in the site's domain that
    /// selects it, nor a pod its own anti-affinity selects; a pod its affinity selects in the
    /// site's domain of every term (or, for the first of a group whose affinity selects itself,
    /// no such pod anywhere); and every spread's skew within its `maxSkew` once it is there.
    pub fn admits(&self, p: &Profile, site: &Site) -> Result<(), Refusal> {
        if !p.ports.is_empty() {
            if let Some(taken) = self.ports.get(site.node) {
                if p.ports.iter().any(|a| taken.iter().any(|b| a.conflicts(b))) {
                    return Err(Refusal::HostPort);
                }
            }
        }
        if !p.attach.is_empty() && !self.attach_fits(&p.attach, site) {
            return Err(Refusal::VolumeLimit);
        }
        let present = |c: &Counter| c.at(site).is_some_and(|n| n > 0);
        if p.repelled_by.iter().any(|&r| present(&self.repel[r]))
            || p.anti.iter().any(|&a| present(&self.counted[a]))
        {
            return Err(Refusal::AntiAffinity);
        }
        if !p.affinity.is_empty() && !p.affinity.iter().all(|&a| present(&self.counted[a])) {
            let first_of_group = p.self_affine
                && p.affinity.iter().all(|&a| self.counted[a].total == 0)
                && p.affinity
                    .iter()
                    .all(|&a| site.domain(&self.counted[a].key).is_some());
            if !first_of_group {
                return Err(Refusal::Affinity);
            }
        }
        for s in &p.spread {
            let c = &self.counted[s.counted];
            let Some(here) = c.at(site) else {
                return Err(Refusal::Spread);
            };
            let min = if s.fresh || s.domains.len() < s.min_domains {
                0
            } else {
                s.domains
                    .iter()
                    .map(|d| c.by_domain.get(d).copied().unwrap_or(0))
                    .min()
                    .unwrap_or(0)
            };
            if here + s.self_match - min > s.max_skew {
                return Err(Refusal::Spread);
            }
        }
        Ok(())
    }

    /// The topology keys of a pod's preferences but the hostname (and the label keys of its
    /// preferred node terms): its new nodes, when it is bound to domains, are one value of each,
    /// so that its preferences can choose between them.
    pub fn preference_keys(&self, p: &Profile) -> BTreeSet<String> {
        p.prefer_pods
            .iter()
            .chain(&p.prefer_spread)
            .map(|&(c, _)| self.preferred[c].key.clone())
            .chain(p.held_by.iter().map(|&c| self.held[c].key.clone()))
            .chain(
                p.prefer_nodes
                    .iter()
                    .flat_map(|t| t.requirements.iter().map(|r| r.key.clone())),
            )
            .filter(|k| k != HOSTNAME)
            .collect()
    }

    /// kube-scheduler's scores for a pod of profile `p` at each of `sites` (the sites that admit
    /// it, all scored together): the scores of its `InterPodAffinity` (the pod's preferred terms:
    /// each matching pod in the site's domain adds or takes the term's weight),
    /// `PodTopologySpread` (its `ScheduleAnyway` constraints: fewer matching pods in the site's
    /// domain score higher) and `NodeAffinity` (the weights of its preferred node terms the
    /// site's labels match) plugins, each normalised to 0–100 over the sites as the plugin does
    /// and weighed 2, as the scheduler's default configuration weighs them. All 0 for a pod
    /// without preferences.
    pub fn preference_scores(&self, p: &Profile, sites: &[Site]) -> Vec<i64> {
        const MAX: i64 = 100;
        let mut out = vec![0; sites.len()];
        if !p.has_preferences() || sites.is_empty() {
            return out;
        }
        let count = |c: usize, site: &Site| self.preferred[c].at(site).unwrap_or(0);
        if !(p.prefer_pods.is_empty() && p.held_by.is_empty()) {
            // Its own terms by the pods they select there, and the terms of the pods there that
            // select it, by those pods.
            let held = |c: usize, site: &Site| self.held[c].at(site).unwrap_or(0);
            let raw: Vec<i64> = sites
                .iter()
                .map(|site| {
                    p.prefer_pods
                        .iter()
                        .map(|&(c, w)| w * count(c, site))
                        .chain(
                            p.held_by
                                .iter()
                                .map(|&c| self.held_weight[c] * held(c, site)),
                        )
                        .sum()
                })
                .collect();
            let (min, max) = (raw.iter().min().unwrap(), raw.iter().max().unwrap());
            if max > min {
                for (o, r) in out.iter_mut().zip(&raw) {
                    *o += 2 * MAX * (r - min) / (max - min);
                }
            }
        }
        if !p.prefer_spread.is_empty() {
            // A site lacking a constraint's key scores 0 there; the others
            // `count × ln(domains + 2) + maxSkew − 1` per constraint, fewer scoring higher.
            let weights: Vec<f64> = p
                .prefer_spread
                .iter()
                .map(|&(c, _)| {
                    let key = &self.preferred[c].key;
                    let domains: BTreeSet<&str> =
                        sites.iter().filter_map(|s| s.domain(key)).collect();
                    ((domains.len() + 2) as f64).ln()
                })
                .collect();
            let raw: Vec<Option<f64>> = sites
                .iter()
                .map(|site| {
                    p.prefer_spread.iter().zip(&weights).try_fold(
                        0.0,
                        |acc, (&(c, skew), weight)| {
                            site.domain(&self.preferred[c].key)?;
                            Some(acc + count(c, site) as f64 * weight + (skew - 1) as f64)
                        },
                    )
                })
                .collect();
            let scored = raw.iter().flatten();
            let max = scored.clone().fold(f64::MIN, |a, &b| a.max(b));
            let min = scored.fold(f64::MAX, |a, &b| a.min(b));
            for (o, r) in out.iter_mut().zip(&raw) {
                *o += match r {
                    None => 0,
                    Some(_) if max <= 0.0 => 2 * MAX,
                    Some(r) => 2 * (MAX as f64 * (max + min - r) / max) as i64,
                };
            }
        }
        if !p.prefer_nodes.is_empty() {
            let raw: Vec<i64> = sites
                .iter()
                .map(|site| {
                    p.prefer_nodes
                        .iter()
                        .filter(|t| t.requirements.iter().all(|r| r.matches(site.labels)))
                        .map(|t| t.weight as i64)
                        .sum()
                })
                .collect();
            let max = *raw.iter().max().unwrap();
            if max > 0 {
                for (o, r) in out.iter_mut().zip(&raw) {
                    *o += 2 * MAX * r / max;
                }
            }
        }
        out
    }

    /// Sets the nodes' taints (those of effect `NoSchedule` or `NoExecute` count), for the
    /// spreads that honour taints. Before any pod is recorded.
    pub fn set_node_taints<'a>(&mut self, nodes: impl IntoIterator<Item = (&'a str, &'a [Taint])>) {
        self.taints = nodes
            .into_iter()
            .filter(|(_, t)| {
                t.iter()
                    .any(|t| t.effect != super::constraints::Effect::PreferNoSchedule)
            })
            .map(|(n, t)| (n.to_string(), t.to_vec()))
            .collect();
    }

    /// Sets the CSI drivers' attach limits: per node, and per instance type for the nodes not
    /// launched yet (their `node.kubernetes.io/instance-type` label).
    pub fn set_attach_limits(
        &mut self,
        by_node: HashMap<String, BTreeMap<String, u32>>,
        by_type: HashMap<String, BTreeMap<String, u32>>,
    ) {
        self.limits = by_node;
        self.type_limits = by_type;
    }

    /// Whether a pod's volumes fit the site's attach limits with those attached there: the
    /// distinct volumes of each limited driver, its own not yet attached counted once more.
    fn attach_fits(&self, attach: &[Attachment], site: &Site) -> bool {
        let limits = self.limits.get(site.node).or_else(|| {
            site.labels
                .get(super::labels::INSTANCE_TYPE)
                .and_then(|t| self.type_limits.get(t))
        });
        let Some(limits) = limits else {
            return true;
        };
        let here = self.attached.get(site.node);
        for (driver, &limit) in limits {
            let new: Vec<&Attachment> = attach
                .iter()
                .filter(|a| &a.driver == driver)
                .filter(|a| here.is_none_or(|h| !h.contains(a)))
                .collect();
            if new.is_empty() {
                continue;
            }
            let mut distinct: Vec<&str> = here
                .into_iter()
                .flatten()
                .filter(|a| &a.driver == driver)
                .map(|a| a.volume.as_str())
                .collect();
            distinct.sort_unstable();
            distinct.dedup();
            if distinct.len() + new.len() > limit as usize {
                return false;
            }
        }
        true
    }

    /// What, besides the counts at a site, decides whether a pod of profile `p` is admitted
    /// there: the global minimum of each spread and whether any pod counts for its affinity.
    /// While it stays the same, a site that refused the pod still refuses it once more pods of
    /// the profile are added elsewhere.
    pub fn floor(&self, p: &Profile) -> Vec<i64> {
        let mut out: Vec<i64> = p
            .spread
            .iter()
            .map(|s| {
                let c = &self.counted[s.counted];
                s.domains
                    .iter()
                    .map(|d| c.by_domain.get(d).copied().unwrap_or(0))
                    .min()
                    .unwrap_or(0)
            })
            .collect();
        out.extend(
            p.affinity
                .iter()
                .map(|&a| (self.counted[a].total > 0) as i64),
        );
        out
    }

    /// Records a pod of profile `p` at `site`.
    pub fn add(&mut self, p: &Profile, site: &Site) {
        self.apply(p, site, 1);
    }

    /// Takes back a pod of profile `p` recorded at `site` (it moves, or a trial is undone).
    pub fn remove(&mut self, p: &Profile, site: &Site) {
        self.apply(p, site, -1);
    }

    fn apply(&mut self, p: &Profile, site: &Site, k: i64) {
        for &m in &p.matched {
            self.counted[m].add(site, k, &self.taints);
        }
        for &r in &p.own_repel {
            self.repel[r].add(site, k, &self.taints);
        }
        for &m in &p.pref_matched {
            self.preferred[m].add(site, k, &self.taints);
        }
        for &h in &p.own_held {
            self.held[h].add(site, k, &self.taints);
        }
        record(&mut self.ports, site.node, &p.ports, k);
        record(&mut self.attached, site.node, &p.attach, k);
    }

    /// Every pod of `pods` that holds a node records at its node.
    pub fn add_bound<'a>(
        &mut self,
        pods: impl IntoIterator<Item = &'a Pod>,
        nodes: &[super::Node],
    ) {
        let by_name: HashMap<&str, &super::Node> =
            nodes.iter().map(|n| (n.name.as_str(), n)).collect();
        for pod in pods {
            let (true, Some(name)) = (pod.is_bound_active(), &pod.node_name) else {
                continue;
            };
            let Some(n) = by_name.get(name.as_str()) else {
                continue;
            };
            let p = self.footprint(pod);
            if !p.is_free() {
                self.add(
                    &p,
                    &Site {
                        labels: &n.labels,
                        node: &n.name,
                    },
                );
            }
        }
    }
}

/// A pod's terms that score other pods where it is, with their weights: its preferred pod
/// affinity (positive) and anti-affinity (negative) terms, and its required affinity terms at
/// kube-scheduler's default `hardPodAffinityWeight` (1).
fn held_terms(t: &PodTopology) -> impl Iterator<Item = (&AffinityTerm, i64)> {
    t.preferences
        .pods
        .iter()
        .map(|x| (&x.term, x.weight as i64))
        .chain(t.affinity.iter().map(|a| (a, 1)))
}

/// A held term's identity: topology key, selector and weight.
type HeldKey = (String, PodSelector, i64);

fn held_key(term: &AffinityTerm, weight: i64) -> HeldKey {
    (term.topology_key.clone(), term.selector.clone(), weight)
}

/// The index in `counters` of the counter `key` names, added (no pod counted yet) when new.
fn intern(
    counters: &mut Vec<Counter>,
    ix: &mut HashMap<CounterKey, usize>,
    key: CounterKey,
) -> usize {
    if let Some(&i) = ix.get(&key) {
        return i;
    }
    counters.push(Counter {
        key: key.0.clone(),
        selectors: key.1.clone(),
        include: key.2.clone(),
        ..Counter::default()
    });
    ix.insert(key, counters.len() - 1);
    counters.len() - 1
}

/// Adds `items` to `node`'s list in `by_node` (`k > 0`), or takes one of each back.
fn record<T: Clone + PartialEq>(
    by_node: &mut HashMap<String, Vec<T>>,
    node: &str,
    items: &[T],
    k: i64,
) {
    if items.is_empty() {
        return;
    }
    let here = by_node.entry(node.to_string()).or_default();
    if k > 0 {
        here.extend(items.iter().cloned());
    } else {
        for item in items {
            if let Some(i) = here.iter().position(|x| x == item) {
                here.swap_remove(i);
            }
        }
    }
}

/// The selectors of a pod's affinity terms: a pod counts for each of them when it matches all.
fn affinity_selectors(t: &PodTopology) -> Vec<PodSelector> {
    t.affinity.iter().map(|a| a.selector.clone()).collect()
}

/// An index of `pods`' rules over `nodes` (and the `offerings` that may be launched) with the
/// pods bound to them recorded; `None` when no pod has rules across nodes.
pub fn index_of(
    pods: &[Pod],
    nodes: &[super::Node],
    offerings: Vec<Offering>,
    limits: &super::volumes::AttachLimits,
) -> Option<TopologyIndex> {
    if !pods.iter().any(|p| p.constraints.topology.is_some()) {
        return None;
    }
    let sites = nodes
        .iter()
        .filter(|n| !n.deleting)
        .map(|n| (n.labels.clone(), n.name.clone()))
        .collect();
    let mut ix = TopologyIndex::new(pods, sites, offerings);
    ix.set_node_taints(
        nodes
            .iter()
            .filter(|n| !n.deleting)
            .map(|n| (n.name.as_str(), n.taints.as_slice())),
    );
    if !limits.by_node.is_empty() {
        ix.set_attach_limits(
            limits
                .by_node
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            limits.by_instance_type(nodes),
        );
    }
    ix.add_bound(pods, nodes);
    Some(ix)
}

#[cfg(test)]
mod tests;
