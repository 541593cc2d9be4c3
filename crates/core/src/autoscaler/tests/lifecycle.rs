//! Node lifecycle on the virtual clock: drift and expiry replace nodes (the replacement first),
//! disruption budgets and do-not-disrupt hold them.

use super::*;
use crate::plan::lifecycle::fingerprint;

/// The a10g pool with `extra` lines in it.
fn policy_with(extra: &[&str]) -> String {
    let mut s = String::from(
        "zones: [us-east-1a, us-east-1b]\nmaxNodeProvisionTime: 10m\npools:\n  - name: a10g\n    \
         instanceTypes: [g5.xlarge, g5.12xlarge]\n    capacityTypes: [spot, on-demand]\n    \
         maxNodes: 20\n    scaleDown: {unneededTime: 3m, cooldownAfterScaleUp: 3m}\n",
    );
    for l in extra {
        s.push_str(l);
        s.push('\n');
    }
    s
}

/// The policy in force changes to `text` (as a reload does), and a pass at `at` registers the
/// nodes under it (a pass that changes their labels or taints ends there).
fn change_policy(run: &mut Run, text: &str, at: Time) {
    let policy = parse_policy(text, "policy.yaml").unwrap_or_else(|e| panic!("{e}"));
    let types = catalog::parse_csv(catalog::BUILTIN_AWS, "builtin").unwrap();
    let mut catalog = catalog::offerings_from_list_prices(&policy, types);
    for o in &mut catalog.offerings {
        o.available = true;
    }
    run.core.set_policy(Arc::new(policy), catalog);
    run.pass(at);
}

/// `n` nodes of ours (`node-0`..), launched four hours ago under `policy` (its fingerprint on
/// them), each running one GPU pod (`p-0`..) if `busy`.
fn nodes_of(policy: &str, n: usize, busy: bool) -> Run {
    let mut run = Run::with_policy(Config::default(), policy);
    let parsed = parse_policy(policy, "policy.yaml").unwrap();
    let fp = fingerprint(parsed.pool("a10g").unwrap(), None);
    for i in 0..n {
        let name = format!("node-{i}");
        run.nodes.push(
            NodeBuilder::new(&name)
                .pool("a10g", "g5.xlarge", "us-east-1a")
                .label(labels::CAPACITY_TYPE, "on-demand")
                .annotation(labels::GPUS_ADVERTISED, "true")
                .annotation(labels::LAUNCH_FINGERPRINT, &fp)
                .cpu_milli(3_800)
                .memory_gib(15)
                .gpus(1)
                .created(T0 - secs(4 * 3600))
                .build(),
        );
        run.with_our_instance();
        if busy {
            let mut p = PodBuilder::new("serve", &format!("p-{i}"))
                .gpus(1)
                .cpu_milli(3_000)
                .memory_gib(8)
                .created(T0 - secs(3 * 3600))
                .on(&name)
                .build();
            p.phase = crate::model::PodPhase::Running;
            run.pods.push(p);
        }
    }
    run
}

/// The last instance launched comes up as a Ready node with its GPU (`ready`: or still
/// starting), and a pass at `at` registers it in its pool; returns its name.
fn come_up(run: &mut Run, at: Time, ready: bool) -> String {
    let id = run.cloud.instances.last().unwrap().id.clone();
    run.register(&id, 1, at);
    let n = run.nodes.last_mut().unwrap();
    n.ready = ready;
    let name = n.name.clone();
    run.pass(at);
    name
}

/// The drain of `node` finished: the node is gone and its pods run on `to`.
fn drained(run: &mut Run, node: &str, to: &str, at: Time) -> Vec<Action> {
    let out = run.core.drain_finished(node, DrainOutcome::Removed, at);
    run.nodes.retain(|n| n.name != node);
    for p in &mut run.pods {
        if p.node_name.as_deref() == Some(node) {
            p.node_name = Some(to.to_string());
        }
    }
    out
}

fn replaced(pool: &str, cause: &'static str) -> Vec<Action> {
    vec![Action::Count(Count::Replaced {
        pool: pool.into(),
        cause,
    })]
}

#[test]
fn a_drifted_node_is_replaced_first_and_drained_once_its_replacement_is_ready_with_gpus() {
    let old = policy_with(&[]);
    let mut run = Run::with_policy(Config::default(), &old);
    run.pods.push(gpu_pod("p", 1));
    run.pass(T0);
    run.register("i-1", 1, T0);
    run.pods[0].node_name = Some("node-i-1".into());
    run.pods[0].phase = crate::model::PodPhase::Running;
    // Registration records what the launch used.
    run.pass(T0 + secs(5));
    let fp = fingerprint(parse_policy(&old, "p").unwrap().pool("a10g").unwrap(), None);
    assert_eq!(
        run.nodes[0].annotations.get(labels::LAUNCH_FINGERPRINT),
        Some(&fp)
    );
    assert!(tainted_replacing(&run.pass(T0 + secs(10))).is_empty());

    // The pool's nodes get a new label (a new image, say): the node is drifted.
    change_policy(
        &mut run,
        &policy_with(&["    labels: {example.com/image: v2}"]),
        T0 + secs(55),
    );
    let a = run.pass(T0 + secs(60));
    let ev = events(&a, "Drifted");
    assert_eq!(ev.len(), 1, "{a:?}");
    assert!(ev[0].message.contains("its labels"), "{}", ev[0].message);
    assert_eq!(tainted_replacing(&a), ["node-i-1"]);
    assert_eq!(events(&a, "ReplacingDriftedNode").len(), 1);
    assert_eq!(launches(&a).len(), 1, "its pod's new node first: {a:?}");
    assert!(drains(&a).is_empty());
    let st = status(&a).expect("a status");
    assert!(
        st.drifted_nodes["node-i-1"].starts_with("drifted: the pool changed its labels"),
        "{st:?}"
    );
    // The replacement registers but is not Ready yet: the old node stays.
    let new = come_up(&mut run, T0 + secs(100), false);
    let a = run.pass(T0 + secs(110));
    assert!(drains(&a).is_empty(), "{a:?}");
    assert!(launches(&a).is_empty(), "its booting node is counted");
    // Ready with its GPU: the old node is drained, by choice.
    run.nodes.last_mut().unwrap().ready = true;
    let a = run.pass(T0 + secs(120));
    let d = drains(&a);
    assert_eq!(d.len(), 1, "{a:?}");
    assert_eq!(
        (d[0].node.as_str(), d[0].kind),
        ("node-i-1", DrainKind::Voluntary)
    );
    assert_eq!(
        drained(&mut run, "node-i-1", &new, T0 + secs(150)),
        replaced("a10g", "drifted")
    );
    // The new node was launched with what the pool launches now: nothing more moves.
    let a = run.pass(T0 + secs(160));
    assert!(
        tainted_replacing(&a).is_empty() && launches(&a).is_empty(),
        "{a:?}"
    );
    assert!(status(&a).is_none_or(|s| s.drifted_nodes.is_empty()));
}

#[test]
fn drift_replaces_one_node_at_a_time_within_a_budget_of_one() {
    let budget = ["    disruption:", "      budgets: [{nodes: 1}]"];
    let mut run = nodes_of(&policy_with(&budget), 3, true);
    run.pass(T0 - secs(10));
    let mut with_image = budget.to_vec();
    with_image.push("    labels: {example.com/image: v2}");
    change_policy(&mut run, &policy_with(&with_image), T0 - secs(5));
    let mut t = T0;
    let mut order = Vec::new();
    for _ in 0..3 {
        let a = run.pass(t);
        let tainted = tainted_replacing(&a);
        assert_eq!(tainted.len(), 1, "one at a time: {a:?}");
        let old = tainted[0].to_string();
        order.push(old.clone());
        assert_eq!(launches(&a).len(), 1);
        // Until its replacement is up, nothing else starts, and nothing is drained.
        let a = run.pass(t + secs(30));
        assert!(
            tainted_replacing(&a).is_empty() && drains(&a).is_empty(),
            "{a:?}"
        );
        let new = come_up(&mut run, t + secs(60), true);
        let a = run.pass(t + secs(70));
        assert_eq!(drains(&a).len(), 1, "{a:?}");
        assert!(
            tainted_replacing(&a).is_empty(),
            "the drain still counts: {a:?}"
        );
        // Never fewer Ready nodes with GPUs than the pods need.
        let up = run.nodes.iter().filter(|n| n.ready).count();
        assert!(
            up >= run.pods.len(),
            "{up} nodes for {} pods",
            run.pods.len()
        );
        assert_eq!(
            drained(&mut run, &old, &new, t + secs(100)),
            replaced("a10g", "drifted")
        );
        t = t + secs(120);
    }
    order.sort();
    assert_eq!(order, ["node-0", "node-1", "node-2"], "each replaced once");
    let a = run.pass(t);
    assert!(
        tainted_replacing(&a).is_empty() && launches(&a).is_empty(),
        "{a:?}"
    );
}

#[test]
fn a_budget_of_zero_in_its_window_holds_drift_and_scale_down_until_it_ends() {
    // T0 is 08:00 UTC: the window is open from T0 for two hours.
    let budget = [
        "    disruption:",
        "      budgets:",
        "        - {nodes: 0, schedule: \"0 8 * * *\", duration: 2h}",
        "        - {nodes: 1}",
    ];
    let mut run = nodes_of(&policy_with(&budget), 2, true);
    // node-1 is empty: unneeded, removed after 3m but for the window.
    run.pods.pop();
    run.pass(T0 - secs(10));
    let mut with_image = budget.to_vec();
    with_image.push("    labels: {example.com/image: v2}");
    change_policy(&mut run, &policy_with(&with_image), T0);
    for m in [0, 5, 30, 119] {
        let a = run.pass(T0 + secs(m * 60));
        assert!(
            tainted_replacing(&a).is_empty() && drains(&a).is_empty() && launches(&a).is_empty(),
            "at {m}m: {a:?}"
        );
    }
    assert_eq!(events(&run.actions, "Drifted").len(), 2);
    // The core asks to be woken when the window ends.
    assert!(run
        .core
        .next_change(T0 + secs(119 * 60))
        .is_some_and(|t| t <= T0 + secs(2 * 3600)));
    let st = status(&run.pass(T0 + secs(119 * 60 + 30)))
        .cloned()
        .unwrap_or_default();
    assert!(
        st.drifted_nodes.is_empty()
            || st.drifted_nodes["node-0"].contains("disruption budget for Drifted"),
        "{st:?}"
    );
    // The window ends: one node at a time again (node-0's pod fits the empty node-1, so it
    // is drained at once; node-1 waits for the budget).
    let a = run.pass(T0 + secs(2 * 3600));
    let mut moved: Vec<&str> = tainted_replacing(&a);
    moved.extend(drains(&a).iter().map(|d| d.node.as_str()));
    moved.dedup();
    assert_eq!(moved, ["node-0"], "{a:?}");
}

#[test]
fn an_expired_node_is_replaced_after_expire_after() {
    let policy = policy_with(&["    disruption: {expireAfter: 3h}"]);
    let mut run = nodes_of(&policy, 1, true);
    // A younger node expires later: the core is woken then.
    run.nodes.push(
        NodeBuilder::new("young")
            .pool("a10g", "g5.xlarge", "us-east-1a")
            .label(labels::CAPACITY_TYPE, "on-demand")
            .annotation(labels::GPUS_ADVERTISED, "true")
            .gpus(1)
            .created(T0 - secs(3600))
            .build(),
    );
    run.with_our_instance();
    let mut p = PodBuilder::new("serve", "young-pod")
        .gpus(1)
        .on("young")
        .build();
    p.phase = crate::model::PodPhase::Running;
    run.pods.push(p);
    run.pass(T0 - secs(10));
    let a = run.pass(T0);
    let ev = events(&a, "Expired");
    assert_eq!(ev.len(), 1, "{a:?}");
    assert!(ev[0]
        .message
        .contains("older than the pool's expireAfter (3h)"));
    assert_eq!(tainted_replacing(&a), ["node-0"]);
    let taint = a.iter().find_map(|x| match x {
        Action::Taint { taint, .. } if taint.key == labels::REPLACING_TAINT => Some(taint),
        _ => None,
    });
    assert_eq!(taint.unwrap().value, "expired");
    assert_eq!(launches(&a).len(), 1);
    assert!(run
        .core
        .next_change(T0 + secs(1))
        .is_some_and(|t| t <= T0 + secs(2 * 3600)));
    let before = run.actions.len();
    let new = come_up(&mut run, T0 + secs(60), true);
    run.pass(T0 + secs(70));
    let d = drains(&run.actions[before..]);
    assert_eq!(d.len(), 1, "{:?}", &run.actions[before..]);
    assert_eq!(
        (d[0].node.as_str(), d[0].kind),
        ("node-0", DrainKind::Voluntary)
    );
    assert_eq!(
        drained(&mut run, "node-0", &new, T0 + secs(100)),
        replaced("a10g", "expired")
    );
    // Two hours on, the young one expires.
    let a = run.pass(T0 + secs(2 * 3600));
    assert_eq!(tainted_replacing(&a), ["young"]);
}

#[test]
fn do_not_disrupt_holds_a_drifted_node_until_its_termination_grace_period_then_drift_drains_it() {
    let old = policy_with(&["    disruption: {terminationGracePeriod: 30m}"]);
    let mut run = nodes_of(&old, 1, true);
    Arc::make_mut(&mut run.pods[0].annotations)
        .insert(labels::KARPENTER_DO_NOT_DISRUPT.into(), "true".into());
    run.pass(T0 - secs(10));
    change_policy(
        &mut run,
        &policy_with(&[
            "    disruption: {terminationGracePeriod: 30m}",
            "    startupTaints: [{key: example.com/booting, effect: NoSchedule}]",
        ]),
        T0,
    );
    let a = run.pass(T0 + secs(1));
    assert_eq!(events(&run.actions, "Drifted").len(), 1);
    let held = events(&run.actions, "DisruptionBlocked");
    assert_eq!(held.len(), 1, "{:?}", run.actions);
    assert!(
        held[0].message.contains("karpenter.sh/do-not-disrupt")
            && held[0].message.contains(&(T0 + secs(1800)).to_rfc3339()),
        "{}",
        held[0].message
    );
    assert!(tainted_replacing(&run.actions).is_empty() && launches(&a).is_empty());
    let st = run
        .actions
        .iter()
        .rev()
        .find_map(|x| match x {
            Action::Status(s) => Some(s),
            _ => None,
        })
        .expect("a status");
    assert!(
        st.drifted_nodes["node-0"].contains("its startup taints; kept: pod serve/p-0"),
        "{st:?}"
    );
    assert!(run
        .core
        .next_change(T0 + secs(60))
        .is_some_and(|t| t <= T0 + secs(1800)));
    let a = run.pass(T0 + secs(1799));
    assert!(tainted_replacing(&a).is_empty(), "{a:?}");
    // The grace period is over: replaced all the same, its drain evicting every pod.
    let a = run.pass(T0 + secs(1800));
    assert_eq!(events(&a, "DisruptionGracePeriodOver").len(), 1, "{a:?}");
    assert_eq!(tainted_replacing(&a), ["node-0"]);
    let before = run.actions.len();
    come_up(&mut run, T0 + secs(1900), true);
    run.pass(T0 + secs(1910));
    let d = drains(&run.actions[before..]);
    assert_eq!(d.len(), 1, "{:?}", &run.actions[before..]);
    assert_eq!(d[0].kind, DrainKind::Forced);
}

#[test]
fn without_a_termination_grace_period_do_not_disrupt_keeps_a_drifted_node() {
    let mut run = nodes_of(&policy_with(&[]), 1, true);
    Arc::make_mut(&mut run.nodes[0].annotations)
        .insert(labels::KARPENTER_DO_NOT_DISRUPT.into(), "true".into());
    run.pass(T0 - secs(10));
    change_policy(
        &mut run,
        &policy_with(&["    labels: {example.com/image: v2}"]),
        T0 - secs(5),
    );
    for h in [0, 10, 100] {
        let a = run.pass(T0 + secs(h * 3600));
        assert!(
            tainted_replacing(&a).is_empty() && drains(&a).is_empty(),
            "{a:?}"
        );
    }
}

#[test]
fn nodes_without_a_launch_fingerprint_are_not_drifted_by_a_changed_pool() {
    let mut run = nodes_of(&policy_with(&[]), 1, true);
    Arc::make_mut(&mut run.nodes[0].annotations).remove(labels::LAUNCH_FINGERPRINT);
    run.pass(T0 - secs(10));
    change_policy(
        &mut run,
        &policy_with(&["    labels: {example.com/image: v2}"]),
        T0 - secs(5),
    );
    let a = run.pass(T0);
    assert!(events(&a, "Drifted").is_empty() && tainted_replacing(&a).is_empty());
    // But one whose instance type the pool no longer has is.
    change_policy(
        &mut run,
        &policy_with(&[]).replace("g5.xlarge, ", ""),
        T0 + secs(5),
    );
    run.pass(T0 + secs(10));
    let ev = events(&run.actions, "Drifted");
    assert_eq!(ev.len(), 1, "{:?}", run.actions);
    assert!(ev[0]
        .message
        .contains("instance type g5.xlarge is no longer"));
}

/// The fingerprint the last launch request carried.
fn launched_fingerprint(actions: &[Action]) -> String {
    launches(actions)
        .last()
        .and_then(|r| r.tags.get(labels::LAUNCH_FINGERPRINT))
        .cloned()
        .expect("a launch with its fingerprint")
}

#[test]
fn a_new_latest_launch_template_version_drifts_the_nodes_launched_under_the_old_one() {
    let text = policy_with(&[]);
    let mut run = Run::with_policy(Config::default(), &text);
    // The pool's `$Latest` resolves to version 1.
    let v1 = "lt-0abc version 1 (ami-0one)";
    run.launch_versions.insert("a10g".into(), v1.into());
    run.pods.push(gpu_pod("p", 1));
    let a = run.pass(T0);
    let pool = parse_policy(&text, "p").unwrap().pools.remove(0);
    let fp = launched_fingerprint(&a);
    assert_eq!(fp, fingerprint(&pool, Some(v1)));
    assert_ne!(fp, fingerprint(&pool, None), "the version is recorded");
    run.register("i-1", 1, T0);
    run.pods[0].node_name = Some("node-i-1".into());
    run.pods[0].phase = crate::model::PodPhase::Running;
    run.pass(T0 + secs(5));
    assert_eq!(
        run.nodes[0].annotations.get(labels::LAUNCH_FINGERPRINT),
        Some(&fp)
    );
    assert!(events(&run.pass(T0 + secs(10)), "Drifted").is_empty());
    // The cloud does not answer for a pass: nothing is judged on the version.
    run.launch_versions.clear();
    let a = run.pass(T0 + secs(20));
    assert!(
        events(&a, "Drifted").is_empty() && tainted_replacing(&a).is_empty(),
        "{a:?}"
    );
    // A new version is published: `$Latest` resolves to it, and the node is drifted.
    run.launch_versions
        .insert("a10g".into(), "lt-0abc version 2 (ami-0two)".into());
    let a = run.pass(T0 + secs(30));
    let ev = events(&a, "Drifted");
    assert_eq!(ev.len(), 1, "{a:?}");
    assert!(
        ev[0].message.contains("launch template version"),
        "{}",
        ev[0].message
    );
    assert_eq!(tainted_replacing(&a), ["node-i-1"]);
    // Its replacement records the new version.
    assert_eq!(
        launched_fingerprint(&a),
        fingerprint(&pool, Some("lt-0abc version 2 (ami-0two)"))
    );
}

#[test]
fn a_node_registered_after_a_restart_gets_its_launch_fingerprint_from_its_instance_tags() {
    let text = policy_with(&[]);
    let mut run = Run::with_policy(Config::default(), &text);
    run.pods.push(gpu_pod("p", 1));
    let fp = launched_fingerprint(&run.pass(T0));
    // The controller restarts before the instance becomes a Node: the new process did not
    // launch it, the cloud kept the launch's tags.
    let policy = parse_policy(&text, "policy.yaml").unwrap();
    let catalog = run.core.catalog().clone();
    run.core = Autoscaler::new(Config::default());
    run.core.set_policy(Arc::new(policy), catalog);
    run.core.restore(None);
    run.pass(T0 + secs(30));
    run.register("i-1", 1, T0 + secs(60));
    assert!(!run.nodes[0]
        .annotations
        .contains_key(labels::LAUNCH_FINGERPRINT));
    run.pass(T0 + secs(65));
    assert_eq!(
        run.nodes[0].annotations.get(labels::LAUNCH_FINGERPRINT),
        Some(&fp)
    );
    // And so it is drifted when the pool changes.
    change_policy(
        &mut run,
        &policy_with(&["    labels: {example.com/image: v2}"]),
        T0 + secs(70),
    );
    let a = run.pass(T0 + secs(80));
    assert_eq!(events(&a, "Drifted").len(), 1, "{a:?}");
}

#[test]
fn dry_run_reports_drifted_and_expired_nodes_without_replacing_them() {
    let old = policy_with(&["    disruption: {expireAfter: 6h}"]);
    let mut run = nodes_of(&old, 2, true);
    run.core.config.dry_run = true;
    run.pass(T0 - secs(10));
    change_policy(
        &mut run,
        &policy_with(&[
            "    disruption: {expireAfter: 6h}",
            "    labels: {example.com/image: v2}",
        ]),
        T0 - secs(5),
    );
    // In dry-run registration changes nothing, and the pass goes on to find them drifted.
    let a = run.actions.clone();
    for x in &a {
        assert!(
            matches!(
                x,
                Action::Event(_) | Action::Log { .. } | Action::Count(_) | Action::Status(_)
            ),
            "dry-run acted: {x:?}"
        );
    }
    assert_eq!(events(&a, "Drifted").len(), 2, "{a:?}");
    // The budget (10 % of 2 nodes, rounded up) lets one go: that one would be replaced.
    let would = events(&a, "DryRunReplaceNode");
    assert_eq!(would.len(), 1, "{a:?}");
    assert!(
        would[0]
            .message
            .contains("would replace node-0 (pool a10g)"),
        "{}",
        would[0].message
    );
    assert!(a.contains(&Action::Count(Count::NodesDrifted(2))), "{a:?}");
    let st = status(&a).expect("a status");
    assert!(
        st.drifted_nodes["node-0"].ends_with("; would be replaced (dry run)")
            && st.drifted_nodes["node-1"].ends_with(
                "kept: the pool's disruption budget for Drifted allows no more nodes now"
            ),
        "{st:?}"
    );
    // Said once; an expired node is reported as such.
    let a = run.pass(T0);
    assert!(
        events(&a, "Drifted").is_empty() && events(&a, "DryRunReplaceNode").is_empty(),
        "{a:?}"
    );
    let a = run.pass(T0 + secs(3 * 3600));
    assert!(
        events(&a, "DryRunReplaceNode").len() == 1 && events(&a, "Expired").len() == 2,
        "{a:?}"
    );
    let a = run.pass(T0 + secs(3 * 3600 + 10));
    assert!(events(&a, "DryRunReplaceNode").is_empty(), "{a:?}");
    assert!(tainted_replacing(&run.actions).is_empty());
}
