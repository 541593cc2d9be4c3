//! Kueue-queued jobs behind a ProvisioningRequest admission check, and CapacityBuffers, in the
//! simulated cluster: ours creates a job's pods only once its nodes are Ready, ca-like once its
//! node group is scaled up, karpenter-like (no ProvisioningRequest) at once; a buffer keeps a
//! chunk's node warm so a pod of its shape starts at once.

use crate::report::Metrics;
use crate::{engine, SimInput, StrategyKind};

/// One 4-GPU A10G pool (`maxNodes`) in two zones, one-minute boots, and a Kueue job of two
/// 4-GPU workers (a gang) submitted at 0 s for an hour.
fn kueue_input(max_nodes: u32) -> SimInput {
    crate::test_input(&format!(
        "name: t\n\
         timing: {{bootMin: 60s, bootMax: 60s, devicePluginDelay: 30s}}\n\
         policy:\n\
         \x20 clusterName: sim\n\
         \x20 zones: [us-east-1a, us-east-1b]\n\
         \x20 pools:\n\
         \x20   - {{name: x4, instanceTypes: [g5.12xlarge], capacityTypes: [on-demand], maxNodes: {max_nodes}}}\n\
         jobs:\n\
         \x20 - name: train\n\
         \x20   admission: provisioningRequest\n\
         \x20   gang: true\n\
         \x20   arrival: 0s\n\
         \x20   duration: 1h\n\
         \x20   pods:\n\
         \x20     - name: w\n\
         \x20       replicas: 2\n\
         \x20       requests: {{cpu: \"8\", memory: 32Gi, nvidia.com/gpu: 4}}\n"
    ))
}

fn run(input: &SimInput, k: StrategyKind) -> Metrics {
    let mut s = k.build(input);
    engine::run(input, s.as_mut())
}

fn most_pending(m: &Metrics) -> u32 {
    m.series.iter().map(|p| p.pending_pods).max().unwrap_or(0)
}

/// Ours provisions the request's two nodes, all at once, and Kueue admits the job once they are
/// Ready: its pods are created then and start at once, never Pending; they waited (from the
/// job's submission) the nodes' boot and device plugin.
#[test]
fn kueue_provisioning_request_of_ours_creates_the_pods_once_their_nodes_are_ready() {
    let m = run(&kueue_input(4), StrategyKind::Ours);
    assert_eq!((m.pods_never_placed, m.nodes_launched), (0, 2));
    assert_eq!(most_pending(&m), 0, "a pod was Pending: {:?}", m.series);
    assert_eq!(m.waits_s.len(), 2);
    assert!(m.waits_s.iter().all(|w| *w >= 90.0), "{:?}", m.waits_s);
    assert_eq!(m.waits_s[0], m.waits_s[1]);
}

/// ca-like is the Cluster Autoscaler's best-effort-atomic class: Provisioned once one node group
/// is scaled up by two nodes, so Kueue admits the job while the nodes boot and its pods wait
/// Pending for them.
#[test]
fn kueue_provisioning_request_of_ca_like_is_provisioned_when_its_group_scales_up() {
    let m = run(&kueue_input(4), StrategyKind::CaLike);
    assert_eq!(
        (m.pods_never_placed, m.nodes_launched, m.scale_ups),
        (0, 2, 1)
    );
    assert_eq!(most_pending(&m), 2, "{:?}", m.series);
}

/// Karpenter has no ProvisioningRequest: Kueue admits the job on quota when it is submitted,
/// its pods are Pending until Karpenter's nodes are up.
#[test]
fn kueue_without_provisioning_requests_admits_at_once_and_the_pods_wait_pending() {
    let m = run(&kueue_input(4), StrategyKind::KarpenterLike);
    assert_eq!(m.pods_never_placed, 0);
    assert_eq!(most_pending(&m), 2, "{:?}", m.series);
}

/// A request that can never be placed whole (one node allowed, two needed) is Failed each time;
/// Kueue makes a new one after its back-off three times, then gives the job up: nothing is
/// launched and its pods are never created.
#[test]
fn kueue_provisioning_request_that_never_fits_is_retried_then_the_job_given_up() {
    let m = run(&kueue_input(1), StrategyKind::Ours);
    assert_eq!((m.pods_never_placed, m.nodes_launched), (2, 0));
    // Four requests (60 s + 120 s + 240 s of back-off between them) before it is given up.
    assert!(m.span_s >= 420.0, "{} s", m.span_s);
}

/// The shipped scenario: every job runs with each strategy; ours never has a Pending pod (each
/// job's pods are created once its nodes are Ready), karpenter-like does.
#[test]
fn kueue_gangs_scenario_runs_every_job_and_ours_leaves_no_pod_pending() {
    let text = include_str!("../../../../simulations/scenarios/kueue-gangs.yaml");
    let input = crate::test_input(text);
    assert!(!input.kueue_jobs.is_empty());
    for k in StrategyKind::ALL {
        let m = run(&input, k);
        assert_eq!(m.pods_never_placed, 0, "{}", k.name());
        if k == StrategyKind::Ours {
            assert_eq!(most_pending(&m), 0, "{:?}", m.series);
        }
        if k == StrategyKind::KarpenterLike {
            assert!(most_pending(&m) > 0);
        }
    }
}

/// A one-GPU service of one replica, and a pod of the same shape arriving at 30 m; with a
/// buffer of `buffer` chunks of the service's replica.
fn buffer_input(buffer: u32) -> SimInput {
    let mut sc = crate::scenario::parse_scenario(
        "name: t\n\
         timing: {bootMin: 60s, bootMax: 60s, devicePluginDelay: 30s}\n\
         policy:\n\
         \x20 clusterName: sim\n\
         \x20 zones: [us-east-1a]\n\
         \x20 pools:\n\
         \x20   - {name: a10g, instanceTypes: [g5.xlarge], capacityTypes: [on-demand], maxNodes: 5}\n\
         services:\n\
         \x20 - name: chat\n\
         \x20   requests: {cpu: \"2\", memory: 8Gi, nvidia.com/gpu: 1}\n\
         \x20   hpa: {minReplicas: 1, maxReplicas: 1, targetUtilization: 0.5, gpusPerReplica: 1}\n\
         \x20   load: [{at: 0s, gpus: 0.5}]\n\
         \x20   until: 2h\n\
         jobs:\n\
         \x20 - name: burst\n\
         \x20   arrival: 30m\n\
         \x20   duration: 30m\n\
         \x20   pods:\n\
         \x20     - name: w\n\
         \x20       requests: {cpu: \"2\", memory: 8Gi, nvidia.com/gpu: 1}\n",
        "t.yaml",
    )
    .unwrap();
    if buffer > 0 {
        sc.add_buffer("chat", buffer).unwrap();
    }
    let types = gpu_node_autoscaler_core::catalog::parse_csv(
        gpu_node_autoscaler_core::catalog::BUILTIN_AWS,
        "builtin",
    )
    .unwrap();
    let catalog = gpu_node_autoscaler_core::catalog::offerings_from_list_prices(&sc.policy, types);
    sc.into_input(catalog, None)
}

/// With a buffer of one chunk, ours keeps a second node warm: the burst's pod starts at once
/// (without, it waits for a node), the buffer is replenished with a third node, and what the
/// buffer's room cost is reported (part of the total).
#[test]
fn buffer_keeps_a_warm_node_so_a_pod_of_its_shape_starts_at_once_and_reports_its_cost() {
    let cold = run(&buffer_input(0), StrategyKind::Ours);
    let warm = run(&buffer_input(1), StrategyKind::Ours);
    // The service's replica is placed first, the burst's pod last.
    let burst = |m: &Metrics| m.waits_s.last().copied().unwrap_or(f64::NAN);
    assert!(burst(&cold) >= 90.0, "{:?}", cold.waits_s);
    assert!(burst(&warm) < 1.0, "{:?}", warm.waits_s);
    assert_eq!(cold.buffer_cost_usd, 0.0);
    assert_eq!((cold.nodes_launched, warm.nodes_launched), (2, 3));
    // About one g5.xlarge ($1.006/h) held for the run's two hours.
    assert!(
        warm.buffer_cost_usd > 1.5 && warm.buffer_cost_usd < warm.cost_usd,
        "{} of {}",
        warm.buffer_cost_usd,
        warm.cost_usd
    );
    assert!(warm.cost_usd > cold.cost_usd);
}

/// A scenario's buffer names a service of the scenario; a job's admission is
/// `provisioningRequest`: errors name the file, line and field.
#[test]
fn buffer_and_kueue_admission_errors_name_file_line_and_field() {
    let text = "name: x\npolicy:\n  zones: [a]\n  pools:\n    - {name: p, instanceTypes: [g5.xlarge], maxNodes: 2}\njobs:\n  - name: j\n    admission: kueue\n    arrival: 0s\n    duration: 1h\n    pods:\n      - name: w\n        requests: {nvidia.com/gpu: 1}\nbuffers:\n  - {service: chat, replicas: 1}\n";
    let e = crate::scenario::parse_scenario(text, "b.yaml")
        .err()
        .unwrap();
    assert!(
        e.contains("b.yaml:8:5: jobs[0].admission: unknown admission \"kueue\""),
        "{e}"
    );
    assert!(
        e.contains("b.yaml:15:6: buffers[0].service: no service named \"chat\""),
        "{e}"
    );
}

/// The Cluster Autoscaler serves CapacityBuffers too (fake pods of lowest priority): ca-like
/// keeps the warm node as ours does; Karpenter has no CapacityBuffer, so karpenter-like keeps
/// none and the burst's pod waits for a node.
#[test]
fn buffer_of_ca_like_keeps_a_warm_node_and_karpenter_like_has_none() {
    let burst = |m: &Metrics| m.waits_s.last().copied().unwrap_or(f64::NAN);
    let ca = run(&buffer_input(1), StrategyKind::CaLike);
    assert!(burst(&ca) < 1.0, "{:?}", ca.waits_s);
    assert!(ca.buffer_cost_usd > 1.5, "{}", ca.buffer_cost_usd);
    let k = run(&buffer_input(1), StrategyKind::KarpenterLike);
    assert!(burst(&k) >= 60.0, "{:?}", k.waits_s);
    assert_eq!(k.buffer_cost_usd, 0.0);
}
