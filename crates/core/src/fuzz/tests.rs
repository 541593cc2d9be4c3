//! Every parser of user input, fed mutated valid inputs: none panics, and each error says where
//! (docs/testing.md, "Fuzzing").

use super::{positioned, run};
use crate::catalog::parse_csv;
use crate::convert::{load_cluster_file, load_reservations};
use crate::dra::cel::Selectors;
use crate::model::gpu::parse_mig_profile;
use crate::model::quantity::parse_quantity;
use crate::model::Time;
use crate::policy::cron::Cron;
use crate::policy::duration::parse_duration;
use crate::policy::{parse_policy_with, NameOnly, ProviderPolicy};
use crate::yaml;

static PROVIDERS: &[&dyn ProviderPolicy] = &[
    &gpu_node_autoscaler_aws::settings::POLICY,
    &gpu_node_autoscaler_alibaba::settings::POLICY,
    &NameOnly::new("kwok"),
    &NameOnly::new("memory"),
];

const POLICIES: &[&str] = &[
    include_str!("../../../../docs/examples/policy.yaml"),
    include_str!("../../../../deploy/base/policy.yaml"),
    include_str!("../../../../deploy/overlays/alibaba/policy.yaml"),
    // The fields the examples leave out: disruption budgets, reservations, MIG and shares.
    "apiVersion: gpu-node-autoscaler.io/v1alpha1
kind: ScalingPolicy
clusterName: c
orphans: drain
pools:
  - name: h100
    provider: aws
    instanceTypes: [p5.48xlarge]
    capacityTypes: [reserved, on-demand]
    zones: [us-east-1a]
    maxNodes: 4
    maxGpus: 32
    capacityReservations:
      - id: cr-0123456789abcdef0
      - tags: {team: llm}
    keepReservedWarm: true
    capacityBlockDrainLead: 45m
    expectedRunTime: 6h
    labels: {team: llm}
    taints:
      - {key: nvidia.com/gpu, value: present, effect: NoSchedule}
    gpuMode: mig
    migLayout: {1g.10gb: 7}
    disruption:
      expireAfter: 720h
      terminationGracePeriod: 2h
      budgets:
        - {nodes: \"10%\", reasons: [Drifted, Expired]}
        - {nodes: 0, schedule: \"0 9 * * mon-fri\", duration: 8h}
    aws:
      launchTemplate: {name: gpu, version: \"3\"}
      subnets: {us-east-1a: subnet-0abc}
  - name: t4-shared
    instanceTypes: [g4dn.xlarge, g4dn.12xlarge]
    zones: [us-east-1a, us-east-1b]
    capacityTypes: [spot, on-demand]
    maxNodes: 20
    gpuMode: shared
    sharedGpu: {corePercentage: 50}
    scaleDown: {unneededTime: 3m, cooldownAfterScaleUp: 3m}
",
];

fn policy_ok(text: &str) -> Result<(), crate::policy::PolicyErrors> {
    parse_policy_with(text, "policy.yaml", PROVIDERS).map(|_| ())
}

#[test]
fn fuzz_the_seed_policies_are_valid() {
    // Mutations of an invalid seed would test little.
    for (i, p) in POLICIES.iter().enumerate() {
        policy_ok(p).unwrap_or_else(|e| panic!("seed {i}: {e}"));
    }
}

#[test]
fn fuzz_policy_never_panics_and_every_error_names_file_line_and_column() {
    let (ok, refused) = run("policy", POLICIES, policy_ok, |text, e| {
        positioned(&e.to_string(), "policy.yaml", text, true)
    });
    // Mutations must reach both sides, or they test one path only.
    assert!(ok > 0 && refused > 0, "ok {ok}, refused {refused}");
}

#[test]
fn fuzz_yaml_never_panics_and_errors_point_inside_the_text() {
    let seeds = [
        POLICIES[0],
        include_str!("../../../../docs/examples/cluster.yaml"),
    ];
    run(
        "yaml",
        &seeds,
        |t| yaml::parse(t).map(|_| ()),
        |text, e| positioned(&format!("f:{e}"), "f", text, true),
    );
}

#[test]
fn fuzz_catalog_csv_never_panics_and_every_error_names_file_and_line() {
    let seed = include_str!("../../../../data/aws-gpu-us-east-1.csv");
    let (ok, refused) = run(
        "catalog",
        &[seed],
        |t| parse_csv(t, "catalog.csv").map(|_| ()),
        |text, e| positioned(&e.to_string(), "catalog.csv", text, false),
    );
    assert!(ok > 0 && refused > 0, "ok {ok}, refused {refused}");
}

#[test]
fn fuzz_cluster_file_never_panics_and_every_error_names_the_file_and_where() {
    let seed = include_str!("../../../../docs/examples/cluster.yaml");
    run(
        "cluster file",
        &[seed],
        |t| {
            let loaded = load_cluster_file(t, "cluster.yaml")?;
            // What it could not use is a warning naming the object, never a silent loss.
            for w in &loaded.warnings {
                if !w.starts_with("cluster.yaml") {
                    return Err(format!("warning without the file: {w}"));
                }
            }
            Ok(())
        },
        |text, e| {
            // YAML errors have a line and column; an object's, its index in `items`.
            if e.contains("items[") || e.contains("expected a Kubernetes List") {
                e.starts_with("cluster.yaml: ")
                    .then_some(())
                    .ok_or_else(|| format!("error without the file: {e}"))
            } else {
                positioned(e, "cluster.yaml", text, true)
            }
        },
    );
}

#[test]
fn fuzz_reservations_never_panic_and_errors_name_the_file() {
    let seed = "- id: cr-0123456789abcdef0
  kind: capacity-block
  instanceType: p5.48xlarge
  zone: us-east-1a
  total: 2
  available: 1
  startMs: 1700000000000
  endMs: 1700086400000
  tags: {team: llm}
  pricePerHour: 31.46
";
    assert!(load_reservations(seed, "r.yaml").is_ok());
    run(
        "reservations",
        &[seed],
        |t| load_reservations(t, "r.yaml").map(|_| ()),
        |_, e| {
            e.starts_with("r.yaml:")
                .then_some(())
                .ok_or_else(|| format!("error without the file: {e}"))
        },
    );
}

/// Parsers of one value: the caller names the field, so the property is that they return.
fn values<T, E>(what: &str, seeds: &[&str], parse: impl Fn(&str) -> Result<T, E>) {
    for s in seeds {
        assert!(parse(s).is_ok(), "{what}: seed {s:?} must parse");
    }
    run(what, seeds, |t| parse(t).map(|_| ()), |_, _| Ok(()));
}

#[test]
fn fuzz_quantities_durations_cron_times_and_mig_profiles_never_panic() {
    values(
        "quantity",
        &[
            "1", "500m", "16Gi", "1.5", "1e3", "2Ki", "0.1", "80Gi", "-1", "1E", "100n",
        ],
        parse_quantity,
    );
    values(
        "duration",
        &["90s", "1h30m", "10m", "720h", "1.5h", "250ms"],
        parse_duration,
    );
    values(
        "cron",
        &[
            "0 9 * * 1-5",
            "@daily",
            "*/15 0-6 1,15 jan-mar mon",
            "30 2 * * sun",
        ],
        Cron::parse,
    );
    values(
        "time",
        &["2026-11-27T19:43:42Z", "2026-01-01T00:00:00.123+02:00"],
        Time::parse_rfc3339,
    );
    values(
        "mig profile",
        &["1g.10gb", "3g.40gb", "1g.20gb+me", "7g.80gb"],
        |s| parse_mig_profile(s).ok_or(()),
    );
}

#[test]
fn fuzz_cel_selectors_never_panic() {
    let device = crate::fixtures::h100_device();
    let seeds = [
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
        "device.attributes['gpu.nvidia.com'].productName.lowerAscii().contains('h100')",
        "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0",
        "device.attributes['gpu.nvidia.com'].cudaComputeCapability.isGreaterThan(semver('8.9.0'))",
        "device.attributes['gpu.nvidia.com'].index in [1, 2, 3] || size(device.name) > 2",
    ];
    let mut selectors = Selectors::new();
    for s in seeds {
        assert_eq!(
            selectors.all_match(&[s.to_string()], &device),
            Ok(true),
            "{s}"
        );
    }
    run(
        "cel",
        &seeds,
        |t| {
            let mut s = Selectors::new();
            s.check(t)?;
            s.all_match(&[t.to_string()], &device).map(|_| ())
        },
        |_, e: &String| (!e.is_empty()).then_some(()).ok_or("an empty error".into()),
    );
}

#[test]
fn fuzz_harness_fails_on_a_panic_and_names_the_input() {
    let caught = std::panic::catch_unwind(|| {
        run(
            "p",
            &["a: 1\n"],
            |t| -> Result<(), ()> {
                assert!(!t.contains('\n') || t.len() < 3);
                Ok(())
            },
            |_, _| Ok(()),
        );
    });
    let msg = *caught
        .expect_err("a panicking parser fails the run")
        .downcast::<String>()
        .unwrap();
    assert!(
        msg.starts_with("p: case ") && msg.contains("panicked") && msg.contains("--- input ---"),
        "{msg}"
    );
}

#[test]
fn fuzz_harness_refuses_errors_without_a_position() {
    let text = "a: 1\nb: 2\n";
    assert_eq!(positioned("f.yaml:2:3: bad", "f.yaml", text, true), Ok(()));
    assert_eq!(positioned("f.yaml:2: bad", "f.yaml", text, false), Ok(()));
    for bad in [
        "bad",
        "f.yaml: bad",
        "f.yaml:x:1: bad",
        "f.yaml:9:1: bad",
        "f.yaml:0:1: bad",
        "f.yaml:2: bad",
        "",
    ] {
        assert!(positioned(bad, "f.yaml", text, true).is_err(), "{bad:?}");
    }
}
