use super::*;
use crate::fixtures::PodBuilder;
use crate::model::labels::ZONE;

fn labels(kv: &[(&str, &str)]) -> Arc<BTreeMap<String, String>> {
    Arc::new(
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

fn app(v: &str) -> PodSelector {
    crate::fixtures::app_selector("default", v)
}

fn site<'a>(l: &'a Arc<BTreeMap<String, String>>, node: &'a str) -> Site<'a> {
    Site { labels: l, node }
}

#[test]
fn host_ports_conflict_on_port_protocol_and_overlapping_addresses() {
    let p = |port, protocol: &str, ip: &str| HostPort {
        port,
        protocol: protocol.into(),
        ip: ip.into(),
    };
    assert!(p(80, "TCP", "").conflicts(&p(80, "TCP", "10.0.0.1")));
    assert!(p(80, "TCP", "10.0.0.1").conflicts(&p(80, "TCP", "10.0.0.1")));
    assert!(!p(80, "TCP", "10.0.0.1").conflicts(&p(80, "TCP", "10.0.0.2")));
    assert!(!p(80, "TCP", "").conflicts(&p(80, "UDP", "")));
    assert!(!p(80, "TCP", "").conflicts(&p(81, "TCP", "")));
}

#[test]
fn an_anti_affinity_term_repels_both_ways_and_leaves_with_its_pod() {
    let guard = PodBuilder::new("default", "guard")
        .label("app", "guard")
        .topology(PodTopology {
            anti_affinity: vec![AffinityTerm {
                selector: app("noisy"),
                topology_key: ZONE.into(),
            }],
            ..Default::default()
        })
        .build();
    let noisy = PodBuilder::new("default", "noisy")
        .label("app", "noisy")
        .build();
    let a = labels(&[(ZONE, "a")]);
    let b = labels(&[(ZONE, "b")]);
    let mut ix = TopologyIndex::new([&guard, &noisy], Vec::new(), Vec::new());
    let (g, n) = (ix.profile(&guard), ix.profile(&noisy));
    assert!(!n.is_free(), "the guard's term looks at it");
    ix.add(&g, &site(&a, "n1"));
    // Another node of the guard's zone refuses the noisy pod; another zone does not.
    assert_eq!(ix.admits(&n, &site(&a, "n2")), Err(Refusal::AntiAffinity));
    assert_eq!(ix.admits(&n, &site(&b, "n3")), Ok(()));
    // And the other way: the guard refuses the zone of a noisy pod.
    ix.add(&n, &site(&b, "n3"));
    assert_eq!(ix.admits(&g, &site(&b, "n4")), Err(Refusal::AntiAffinity));
    ix.remove(&g, &site(&a, "n1"));
    assert_eq!(ix.admits(&n, &site(&a, "n2")), Ok(()));
}

#[test]
fn spread_counts_domains_of_nodes_and_offerings_and_honours_min_domains() {
    let pod = |name: &str, min_domains| {
        PodBuilder::new("default", name)
            .label("app", "llm")
            .topology(PodTopology {
                spread: vec![Spread {
                    max_skew: 1,
                    topology_key: ZONE.into(),
                    selector: app("llm"),
                    min_domains,
                    honor_node_affinity: true,
                    honor_taints: false,
                }],
                ..Default::default()
            })
            .build()
    };
    let (a, b, c) = (
        labels(&[(ZONE, "a")]),
        labels(&[(ZONE, "b")]),
        labels(&[(ZONE, "c")]),
    );
    let nodes = vec![(a.clone(), "n1".to_string()), (b.clone(), "n2".to_string())];
    let p = pod("llm-0", 1);
    // Zones a and b have nodes; c only offerings.
    let mut ix = TopologyIndex::new([&p], nodes.clone(), vec![(c.clone(), Arc::from([]))]);
    let prof = ix.profile(&p);
    ix.add(&prof, &site(&a, "n1"));
    ix.add(&prof, &site(&b, "n2"));
    // a=1, b=1, c=0: another in a would make the skew 2.
    assert_eq!(ix.admits(&prof, &site(&a, "n1")), Err(Refusal::Spread));
    assert_eq!(ix.admits(&prof, &site(&c, "new")), Ok(()));
    // A node without the key is refused.
    assert_eq!(
        ix.admits(&prof, &site(&labels(&[]), "bare")),
        Err(Refusal::Spread)
    );
    // Without the offerings of zone c, two domains with one pod each: a third is admitted.
    let mut ix = TopologyIndex::new([&p], nodes.clone(), Vec::new());
    let prof = ix.profile(&p);
    ix.add(&prof, &site(&a, "n1"));
    ix.add(&prof, &site(&b, "n2"));
    assert_eq!(ix.admits(&prof, &site(&a, "n1")), Ok(()));
    // minDomains 3 with two domains: the global minimum is taken as 0.
    let p3 = pod("llm-1", 3);
    let mut ix = TopologyIndex::new([&p3], nodes, Vec::new());
    let prof = ix.profile(&p3);
    ix.add(&prof, &site(&a, "n1"));
    ix.add(&prof, &site(&b, "n2"));
    assert_eq!(ix.admits(&prof, &site(&a, "n1")), Err(Refusal::Spread));
}

#[test]
fn a_node_without_the_hostname_label_is_its_own_hostname_domain() {
    let l = labels(&[(ZONE, "a")]);
    assert_eq!(site(&l, "n1").domain(HOSTNAME), Some("n1"));
    assert_eq!(site(&l, "n1").domain("rack"), None);
}
