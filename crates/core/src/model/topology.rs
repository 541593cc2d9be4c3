//! What kube-scheduler checks across nodes before it binds a pod, with its semantics:
//! host ports (its `NodePorts` plugin), required inter-pod affinity and anti-affinity in both
//! directions (`InterPodAffinity`), topology spread with `whenUnsatisfiable: DoNotSchedule`
//! (`PodTopologySpread`) and the CSI drivers' per-node attach limits (`NodeVolumeLimits`).
//!
//! These rules need more than one node's labels, so they are checked against a
//! [`TopologyIndex`]: the pods placed so far (running ones, and those a pass has placed), counted
//! per topology domain. Every placement builds one per pass and checks a pod with
//! [`TopologyIndex::admits`] at a [`Site`] (a node, or a node not launched yet), then records
//! it with [`TopologyIndex::add`].

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use super::constraints::{Constraints, Operator, Requirement};
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
}

impl PodTopology {
    pub fn is_empty(&self) -> bool {
        self.host_ports.is_empty()
            && self.attachments.is_empty()
            && self.affinity.is_empty()
            && self.anti_affinity.is_empty()
            && self.spread.is_empty()
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
}

impl Profile {
    /// Neither has rules of its own nor is looked at by another pod's: the index never
    /// refuses it and need not record it.
    pub fn is_free(&self) -> bool {
        self.ports.is_empty() && self.attach.is_empty() && !self.is_bound_to_domains()
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

/// Counts per domain of the pods that all of some selectors select.
#[derive(Clone, Debug, Default)]
struct Counter {
    key: String,
    selectors: Vec<PodSelector>,
    by_domain: fnv::FnvHashMap<String, i64>,
    total: i64,
}

impl Counter {
    fn selects(&self, namespace: &str, labels: &BTreeMap<String, String>) -> bool {
        self.selectors.iter().all(|s| s.selects(namespace, labels))
    }

    fn add(&mut self, site: &Site, k: i64) {
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

/// The pods placed so far, counted per topology domain for every selector some pod's rules
/// use; and the host ports taken per node. Built per pass from the pods (whose rules it
/// learns), the sites that exist (nodes) and those that may be launched (offerings' labels).
#[derive(Clone, Debug, Default)]
pub struct TopologyIndex {
    counted: Vec<Counter>,
    counted_ix: HashMap<(String, Vec<PodSelector>), usize>,
    repel: Vec<Counter>,
    repel_ix: HashMap<(String, Vec<PodSelector>), usize>,
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
    /// Labels of nodes that may be launched.
    offerings: Vec<Arc<BTreeMap<String, String>>>,
    /// Every topology key of a term, but the hostname.
    keys: BTreeSet<String>,
    /// The counters a pod may be selected by, from the label keys it has.
    counted_by_key: Prefilter,
    repel_by_key: Prefilter,
    /// Eligible domains per constraints (but their rules across nodes, which the domains do
    /// not depend on), topology key and the keys of the pod's spread, as
    /// [`TopologyIndex::profile`] found them: pods of one template share them, and so do
    /// pods whose templates differ only in those rules.
    domains: RefCell<HashMap<DomainsKey, Domains>>,
}

/// The domains of a key a pod may be placed in, and whether a new node is a fresh one.
type Domains = (Vec<String>, bool);

/// Constraints without their rules across nodes, a topology key, the keys of a spread.
type DomainsKey = (Constraints, String, Vec<String>);

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
        offerings: Vec<Arc<BTreeMap<String, String>>>,
    ) -> TopologyIndex {
        let mut ix = TopologyIndex {
            nodes,
            offerings,
            ..TopologyIndex::default()
        };
        let mut seen: BTreeSet<*const PodTopology> = BTreeSet::new();
        for p in pods {
            let Some(t) = &p.constraints.topology else {
                continue;
            };
            if !seen.insert(Arc::as_ptr(t)) {
                continue;
            }
            // kube-scheduler counts for a pod's affinity the pods that match all its terms.
            let all = affinity_selectors(t);
            for a in &t.affinity {
                ix.counter(&a.topology_key, &all);
            }
            for a in &t.anti_affinity {
                let selectors = vec![a.selector.clone()];
                ix.counter(&a.topology_key, &selectors);
                let key = (a.topology_key.clone(), selectors);
                if !ix.repel_ix.contains_key(&key) {
                    ix.repel_ix.insert(key.clone(), ix.repel.len());
                    ix.repel.push(Counter {
                        key: key.0,
                        selectors: key.1,
                        ..Counter::default()
                    });
                }
            }
            for s in &t.spread {
                ix.counter(&s.topology_key, std::slice::from_ref(&s.selector));
            }
            ix.keys
                .extend(t.keys().filter(|k| *k != HOSTNAME).map(str::to_string));
        }
        ix.counted_by_key = Prefilter::new(&ix.counted);
        ix.repel_by_key = Prefilter::new(&ix.repel);
        ix
    }

    /// The topology keys some rule uses, but the hostname: a new node of a pod bound to
    /// domains is one value of each.
    pub fn keys(&self) -> &BTreeSet<String> {
        &self.keys
    }

    fn counter(&mut self, key: &str, selectors: &[PodSelector]) -> usize {
        let k = (key.to_string(), selectors.to_vec());
        if let Some(&i) = self.counted_ix.get(&k) {
            return i;
        }
        self.counted.push(Counter {
            key: key.to_string(),
            selectors: selectors.to_vec(),
            ..Counter::default()
        });
        self.counted_ix.insert(k, self.counted.len() - 1);
        self.counted.len() - 1
    }

    /// Which counted selectors select a pod, and which anti-affinity terms of other pods repel
    /// it: pods alike in these and in their constraints are alike to the index.
    pub fn selected(&self, pod: &Pod) -> (Vec<usize>, Vec<usize>) {
        let ns = pod.id.namespace.as_str();
        let labels = &pod.labels;
        (
            self.counted_by_key.select(&self.counted, ns, labels),
            self.repel_by_key.select(&self.repel, ns, labels),
        )
    }

    /// What recording a pod changes: the selectors that select it, its own anti-affinity terms
    /// and its host ports (not its checks: see [`TopologyIndex::profile`]).
    pub fn footprint(&self, pod: &Pod) -> Profile {
        let (matched, _) = self.selected(pod);
        let mut p = Profile {
            matched,
            ..Profile::default()
        };
        if let Some(t) = &pod.constraints.topology {
            p.own_repel = t
                .anti_affinity
                .iter()
                .map(|a| self.repel_ix[&(a.topology_key.clone(), vec![a.selector.clone()])])
                .collect();
            p.ports = t.host_ports.clone();
            p.attach = t.attachments.clone();
        }
        p
    }

    /// What the index needs of a pod to check and record it: [`TopologyIndex::selected`], its
    /// own rules, and the domains its spread ranges over.
    pub fn profile(&self, pod: &Pod) -> Profile {
        let ns = pod.id.namespace.as_str();
        let labels = &pod.labels;
        let mut p = self.footprint(pod);
        p.repelled_by = self.selected(pod).1;
        let Some(t) = &pod.constraints.topology else {
            return p;
        };
        let id =
            |key: &str, selectors: Vec<PodSelector>| self.counted_ix[&(key.to_string(), selectors)];
        let all = affinity_selectors(t);
        p.affinity = t
            .affinity
            .iter()
            .map(|a| id(&a.topology_key, all.clone()))
            .collect();
        p.self_affine = t.affinity.iter().all(|a| a.selector.selects(ns, labels));
        p.anti = t
            .anti_affinity
            .iter()
            .map(|a| id(&a.topology_key, vec![a.selector.clone()]))
            .collect();
        let spread_keys: Vec<&str> = t.spread.iter().map(|s| s.topology_key.as_str()).collect();
        for s in &t.spread {
            let (domains, fresh) =
                self.eligible_domains(&pod.constraints, &s.topology_key, &spread_keys);
            p.spread.push(SpreadCheck {
                counted: id(&s.topology_key, vec![s.selector.clone()]),
                max_skew: s.max_skew as i64,
                min_domains: s.min_domains.max(1) as usize,
                self_match: s.selector.selects(ns, labels) as i64,
                domains,
                fresh,
            });
        }
        p
    }

    /// The domains of `key` a pod with these constraints may be placed in (kube-scheduler's
    /// `nodeAffinityPolicy: Honor`; taints are ignored, its default): of the nodes that admit it
    /// and carry every key of its spread, and of the offerings that admit it. A hostname domain
    /// of a node that may be launched is a fresh one.
    fn eligible_domains(
        &self,
        c: &Constraints,
        key: &str,
        spread_keys: &[&str],
    ) -> (Vec<String>, bool) {
        let mut node_rules = c.clone();
        node_rules.topology = None;
        let memo = (
            node_rules,
            key.to_string(),
            spread_keys.iter().map(|k| k.to_string()).collect(),
        );
        if let Some(d) = self.domains.borrow().get(&memo) {
            return d.clone();
        }
        let mut out: BTreeSet<String> = BTreeSet::new();
        for (labels, name) in &self.nodes {
            let site = Site { labels, node: name };
            if spread_keys.iter().all(|k| site.domain(k).is_some())
                && c.matches_node(labels, Some(name))
            {
                if let Some(v) = site.domain(key) {
                    out.insert(v.to_string());
                }
            }
        }
        let mut fresh = false;
        for labels in &self.offerings {
            if !c.matches_node(labels, None) {
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
            self.counted[m].add(site, k);
        }
        for &r in &p.own_repel {
            self.repel[r].add(site, k);
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
    offerings: Vec<Arc<BTreeMap<String, String>>>,
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
