//! Where a pod may run: `nodeSelector`, required node affinity, and tolerations against taints;
//! its rules across nodes are in [`super::topology`].

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Operator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
    Gt,
    Lt,
}

impl Operator {
    pub fn parse(s: &str) -> Option<Operator> {
        Some(match s {
            "In" => Operator::In,
            "NotIn" => Operator::NotIn,
            "Exists" => Operator::Exists,
            "DoesNotExist" => Operator::DoesNotExist,
            "Gt" => Operator::Gt,
            "Lt" => Operator::Lt,
            _ => return None,
        })
    }
}

/// One `matchExpressions` entry of a node selector term.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Requirement {
    pub key: String,
    pub operator: Operator,
    pub values: Vec<String>,
}

impl Requirement {
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let v = labels.get(&self.key);
        match self.operator {
            Operator::In => v.is_some_and(|v| self.values.iter().any(|x| x == v)),
            Operator::NotIn => v.is_none_or(|v| !self.values.iter().any(|x| x == v)),
            Operator::Exists => v.is_some(),
            Operator::DoesNotExist => v.is_none(),
            Operator::Gt | Operator::Lt => {
                let (Some(v), Some(bound)) = (v, self.values.first()) else {
                    return false;
                };
                match (v.parse::<i64>(), bound.parse::<i64>()) {
                    (Ok(v), Ok(b)) if self.operator == Operator::Gt => v > b,
                    (Ok(v), Ok(b)) => v < b,
                    _ => false,
                }
            }
        }
    }
}

/// A node selector term: all requirements must hold. `match_fields` on `metadata.name` pins a pod
/// to named nodes (DaemonSet pods do this), which a new node can never satisfy.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Term {
    pub requirements: Vec<Requirement>,
    pub node_names: Option<Vec<String>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Effect {
    NoSchedule,
    PreferNoSchedule,
    NoExecute,
}

impl Effect {
    pub fn parse(s: &str) -> Option<Effect> {
        Some(match s {
            "NoSchedule" => Effect::NoSchedule,
            "PreferNoSchedule" => Effect::PreferNoSchedule,
            "NoExecute" => Effect::NoExecute,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Effect::NoSchedule => "NoSchedule",
            Effect::PreferNoSchedule => "PreferNoSchedule",
            Effect::NoExecute => "NoExecute",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Taint {
    pub key: String,
    pub value: String,
    pub effect: Effect,
}

impl fmt::Display for Taint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.value.is_empty() {
            write!(f, "{}:{}", self.key, self.effect.as_str())
        } else {
            write!(f, "{}={}:{}", self.key, self.value, self.effect.as_str())
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Toleration {
    /// `None` with `exists` tolerates every taint.
    pub key: Option<String>,
    /// `Exists` when true, else `Equal`.
    pub exists: bool,
    pub value: String,
    /// `None` matches every effect.
    pub effect: Option<Effect>,
}

impl Toleration {
    pub fn tolerates(&self, t: &Taint) -> bool {
        if self.effect.is_some_and(|e| e != t.effect) {
            return false;
        }
        match &self.key {
            None => self.exists,
            Some(k) if k != &t.key => false,
            Some(_) => self.exists || self.value == t.value,
        }
    }
}

/// Everything that limits where a pod may be placed, shared between pods of one template.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Constraints {
    pub node_selector: BTreeMap<String, String>,
    /// Required node affinity: any one term must hold. `None` means no affinity.
    pub affinity: Option<Vec<Term>>,
    pub tolerations: Vec<Toleration>,
    /// Host ports, required pod (anti-)affinity and topology spread: rules across nodes,
    /// checked against a [`super::topology::TopologyIndex`]. `None` for most pods.
    pub topology: Option<Arc<super::topology::PodTopology>>,
    /// Its PersistentVolumeClaims' node terms, one list per claim: each must hold (any one term
    /// of a list). Set when the pod is joined with the cluster's storage ([`super::volumes`]).
    pub volumes: Vec<Vec<Term>>,
    /// Nodes kube-scheduler refused the pod on although it fits them on this model (a rule the
    /// model does not know): never planned onto again while the pod waits. Empty for most pods.
    pub refused_nodes: Vec<String>,
}

impl Constraints {
    /// Labels and node name against `nodeSelector` and required node affinity.
    pub fn matches_node(&self, labels: &BTreeMap<String, String>, node_name: Option<&str>) -> bool {
        if !self
            .node_selector
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
        {
            return false;
        }
        let any_term = |terms: &[Term]| {
            terms.iter().any(|t| {
                t.requirements.iter().all(|r| r.matches(labels))
                    && match (&t.node_names, node_name) {
                        (None, _) => true,
                        (Some(names), Some(n)) => names.iter().any(|x| x == n),
                        (Some(_), None) => false,
                    }
            })
        };
        self.affinity.as_deref().is_none_or(any_term)
            && self.volumes.iter().all(|terms| any_term(terms))
            && node_name.is_none_or(|n| !self.refused_nodes.iter().any(|r| r == n))
    }

    /// Every `NoSchedule`/`NoExecute` taint is tolerated.
    pub fn tolerates(&self, taints: &[Taint]) -> bool {
        taints
            .iter()
            .filter(|t| t.effect != Effect::PreferNoSchedule)
            .all(|t| self.tolerations.iter().any(|tol| tol.tolerates(t)))
    }

    /// The first taint that is not tolerated, for reasons.
    pub fn untolerated<'a>(&self, taints: &'a [Taint]) -> Option<&'a Taint> {
        taints
            .iter()
            .filter(|t| t.effect != Effect::PreferNoSchedule)
            .find(|t| !self.tolerations.iter().any(|tol| tol.tolerates(t)))
    }

    pub fn admits(
        &self,
        labels: &BTreeMap<String, String>,
        taints: &[Taint],
        node_name: Option<&str>,
    ) -> bool {
        self.matches_node(labels, node_name) && self.tolerates(taints)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn req(key: &str, op: Operator, values: &[&str]) -> Requirement {
        Requirement {
            key: key.into(),
            operator: op,
            values: values.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn operators() {
        let l = labels(&[("gpu", "A100"), ("count", "8")]);
        let cases = [
            (req("gpu", Operator::In, &["A100", "H100"]), true),
            (req("gpu", Operator::In, &["T4"]), false),
            (req("gpu", Operator::NotIn, &["T4"]), true),
            (req("absent", Operator::NotIn, &["T4"]), true),
            (req("gpu", Operator::Exists, &[]), true),
            (req("gpu", Operator::DoesNotExist, &[]), false),
            (req("count", Operator::Gt, &["4"]), true),
            (req("count", Operator::Lt, &["4"]), false),
            (req("gpu", Operator::Gt, &["4"]), false),
            (req("absent", Operator::Lt, &["4"]), false),
        ];
        for (r, want) in cases {
            assert_eq!(r.matches(&l), want, "{r:?}");
        }
    }

    #[test]
    fn affinity_terms_are_ored_requirements_anded() {
        let c = Constraints {
            affinity: Some(vec![
                Term {
                    requirements: vec![
                        req("gpu", Operator::In, &["A100"]),
                        req("zone", Operator::In, &["a"]),
                    ],
                    node_names: None,
                },
                Term {
                    requirements: vec![req("gpu", Operator::In, &["H100"])],
                    node_names: None,
                },
            ]),
            ..Default::default()
        };
        assert!(c.matches_node(&labels(&[("gpu", "A100"), ("zone", "a")]), None));
        assert!(!c.matches_node(&labels(&[("gpu", "A100"), ("zone", "b")]), None));
        assert!(c.matches_node(&labels(&[("gpu", "H100"), ("zone", "b")]), None));
    }

    #[test]
    fn match_fields_never_match_a_new_node() {
        let c = Constraints {
            affinity: Some(vec![Term {
                requirements: vec![],
                node_names: Some(vec!["node-1".into()]),
            }]),
            ..Default::default()
        };
        assert!(c.matches_node(&labels(&[]), Some("node-1")));
        assert!(!c.matches_node(&labels(&[]), None));
    }

    #[test]
    fn tolerations() {
        let gpu_taint = Taint {
            key: "nvidia.com/gpu".into(),
            value: "true".into(),
            effect: Effect::NoSchedule,
        };
        let soft = Taint {
            key: "soft".into(),
            value: String::new(),
            effect: Effect::PreferNoSchedule,
        };
        let none = Constraints::default();
        assert!(!none.tolerates(std::slice::from_ref(&gpu_taint)));
        assert!(none.tolerates(std::slice::from_ref(&soft)));
        let exists = Constraints {
            tolerations: vec![Toleration {
                key: Some("nvidia.com/gpu".into()),
                exists: true,
                value: String::new(),
                effect: None,
            }],
            ..Default::default()
        };
        assert!(exists.tolerates(std::slice::from_ref(&gpu_taint)));
        let wrong_value = Constraints {
            tolerations: vec![Toleration {
                key: Some("nvidia.com/gpu".into()),
                exists: false,
                value: "false".into(),
                effect: Some(Effect::NoSchedule),
            }],
            ..Default::default()
        };
        assert!(!wrong_value.tolerates(std::slice::from_ref(&gpu_taint)));
        let everything = Constraints {
            tolerations: vec![Toleration {
                key: None,
                exists: true,
                value: String::new(),
                effect: None,
            }],
            ..Default::default()
        };
        assert!(everything.tolerates(&[gpu_taint, soft]));
    }
}
