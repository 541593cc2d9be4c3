//! The Helm chart `deploy/helm/gpu-node-autoscaler`, with the real `helm` (built pinned by
//! scripts/helm.sh). `deploy/` has one source of truth for what is installed: for each kustomize
//! target, the chart with the matching values renders the same objects (Helm's own labels aside),
//! so every check of tests/it/deploy.rs (schemas, security settings, least-privilege RBAC, the
//! example policy, the alerts) holds for the chart too. Besides: `helm lint --strict` with every
//! values file of `ci/`, those renders against the Kubernetes schemas, the values schema refusing
//! what it should, `helm package`, and the chart's version being the crate's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use gpu_node_autoscaler::yaml;
use serde_json::Value;

use crate::deploy::{
    deploy_dir, kind_of, kubernetes_validate, kustomize, major_minor, name_of, K8S_VERSIONS,
    NO_SCHEMA, TARGETS,
};
use crate::root;

/// The labels the chart adds to deploy/'s (Helm's and the release's).
const HELM_LABELS: [&str; 4] = [
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "helm.sh/chart",
];

/// For each kustomize target, the chart values that render the same objects.
fn values_of(target: &str) -> Vec<String> {
    let aws = ["--set", "aws.roleArn=FILL-IN-IAM-ROLE-ARN"];
    let args: Vec<&str> = match target {
        "base" => vec![],
        "overlays/aws" => aws.to_vec(),
        "overlays/dry-run" => [&aws[..], &["--set", "dryRun=true"]].concat(),
        "overlays/monitoring" => [
            &aws[..],
            &[
                "--set",
                "metrics.serviceMonitor.enabled=true",
                "--set",
                "metrics.prometheusRule.enabled=true",
                "--set",
                "metrics.dashboard.enabled=true",
            ],
        ]
        .concat(),
        "overlays/kwok" => vec!["--set", "kwok.enabled=true"],
        "overlays/alibaba" => vec![
            "--set",
            "alibaba.rrsaRoleName=FILL-IN-RAM-ROLE-NAME",
            "--set-file",
            "policy.content=deploy/overlays/alibaba/policy.yaml",
        ],
        other => panic!("no chart values for the target {other}: add them here"),
    };
    args.into_iter().map(str::to_string).collect()
}

/// The `helm` the tests run: `GNA_HELM_BIN`, else where scripts/helm.sh builds it.
pub(crate) fn helm() -> PathBuf {
    gpu_node_autoscaler_test_support::cluster::helm_bin()
}

pub(crate) fn chart_dir() -> PathBuf {
    deploy_dir().join("helm/gpu-node-autoscaler")
}

fn run_helm(args: &[&str]) -> Output {
    Command::new(helm())
        .current_dir(root())
        .args(args)
        // No user configuration or repositories: the chart alone.
        .env(
            "HELM_CONFIG_HOME",
            std::env::temp_dir().join("gna-it-helm/config"),
        )
        .env(
            "HELM_CACHE_HOME",
            std::env::temp_dir().join("gna-it-helm/cache"),
        )
        .env(
            "HELM_DATA_HOME",
            std::env::temp_dir().join("gna-it-helm/data"),
        )
        .env("KUBECONFIG", "/dev/null")
        .output()
        .expect("run helm")
}

/// `helm template` of `chart` in kube-system with `args`: its objects, or its error.
pub(crate) fn helm_template(chart: &Path, args: &[String]) -> Result<Vec<Value>, String> {
    let chart = chart.to_string_lossy();
    let mut all = vec![
        "template",
        "gpu-node-autoscaler",
        &chart,
        "-n",
        "kube-system",
    ];
    all.extend(args.iter().map(String::as_str));
    let out = run_helm(&all);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    if !out.status.success() {
        return Err(stderr);
    }
    let text = String::from_utf8(out.stdout).expect("UTF-8 from helm template");
    let objects = yaml::parse_all(&text).map_err(|e| format!("helm printed no YAML: {e}"))?;
    Ok(objects.into_iter().filter(|o| !o.is_null()).collect())
}

fn render(args: &[String]) -> Vec<Value> {
    helm_template(&chart_dir(), args).unwrap_or_else(|e| panic!("helm template {args:?}: {e}"))
}

/// The objects by kind and name, without Helm's labels.
fn by_key(objects: Vec<Value>) -> BTreeMap<(String, String), Value> {
    objects
        .into_iter()
        .map(|mut o| {
            if let Some(labels) = o["metadata"]["labels"].as_object_mut() {
                for l in HELM_LABELS {
                    labels.remove(l);
                }
            }
            ((kind_of(&o).to_string(), name_of(&o).to_string()), o)
        })
        .collect()
}

/// Where two values first differ, as JSON paths with both sides.
fn differences(path: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for k in x.keys().chain(y.keys().filter(|k| !x.contains_key(*k))) {
                differences(
                    &format!("{path}.{k}"),
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                    out,
                );
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                differences(&format!("{path}[{i}]"), p, q, out);
            }
        }
        _ if a != b => out.push(format!("{path}: chart {a} / kustomize {b}")),
        _ => {}
    }
}

#[test]
fn helm_chart_renders_what_each_kustomize_target_renders() {
    for target in TARGETS {
        let chart = by_key(render(&values_of(target)));
        let kustomized = by_key(kustomize(&deploy_dir().join(target)));
        assert_eq!(
            chart.keys().collect::<Vec<_>>(),
            kustomized.keys().collect::<Vec<_>>(),
            "{target}: the chart and kustomize render different objects"
        );
        for (key, k) in &kustomized {
            let mut diff = Vec::new();
            differences("", &chart[key], k, &mut diff);
            assert!(
                diff.is_empty(),
                "{target}: {} {} differs:\n{}",
                key.0,
                key.1,
                diff.join("\n")
            );
        }
        // Helm's labels are there (the release can be found by them).
        for o in render(&values_of(target)) {
            assert_eq!(
                o["metadata"]["labels"]["app.kubernetes.io/managed-by"],
                "Helm",
                "{target}: {} {}",
                kind_of(&o),
                name_of(&o)
            );
        }
    }
}

/// The values files of ci/, each a realistic installation.
fn ci_values() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(chart_dir().join("ci"))
        .expect("the chart's ci/ folder")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 3, "{files:?}");
    files
}

#[test]
fn helm_lint_passes_and_every_ci_values_file_validates_against_the_kubernetes_schemas() {
    let chart = chart_dir().to_string_lossy().to_string();
    let mut sets: Vec<Option<PathBuf>> = vec![None];
    sets.extend(ci_values().into_iter().map(Some));
    for values in sets {
        let label = values.as_ref().map_or("default".to_string(), |p| {
            p.file_stem().unwrap().to_string_lossy().to_string()
        });
        let mut args = vec!["lint".to_string(), "--strict".into(), chart.clone()];
        let mut template_args = Vec::new();
        if let Some(v) = &values {
            for a in [&mut args, &mut template_args] {
                a.push("-f".into());
                a.push(v.to_string_lossy().to_string());
            }
        }
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = run_helm(&refs);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("0 chart(s) failed"),
            "helm lint ({label}):\n{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );

        let objects = render(&template_args);
        let checked: Vec<&Value> = objects
            .iter()
            .filter(|o| !NO_SCHEMA.contains(&kind_of(o)))
            .collect();
        let (out, file) = kubernetes_validate(&format!("helm-{label}"), &checked);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && !stdout.contains("WARN") && !stdout.contains("ERROR"),
            "{label}: kubernetes-validate:\n{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for o in &checked {
            for v in K8S_VERSIONS {
                let line = format!(
                    "INFO {} passed for resource {}/{} against version {}",
                    file.display(),
                    kind_of(o).to_lowercase(),
                    name_of(o),
                    major_minor(v)
                );
                assert!(stdout.contains(&line), "{label}: no `{line}` in:\n{stdout}");
            }
        }
    }
}

#[test]
fn helm_values_a_user_sets_reach_the_objects() {
    let f = |name: &str| {
        chart_dir()
            .join("ci")
            .join(name)
            .to_string_lossy()
            .to_string()
    };
    // A ConfigMap of one's own: none rendered, the arguments and the RBAC name it.
    let objects = render(&["-f".into(), f("alibaba-values.yaml")]);
    assert!(
        !objects
            .iter()
            .any(|o| kind_of(o) == "ConfigMap" && name_of(o) == "gpu-node-autoscaler-policy"),
        "an existing policy ConfigMap is not rendered again"
    );
    let deployment = objects.iter().find(|o| kind_of(o) == "Deployment").unwrap();
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        args.contains(&"--policy-configmap=kube-system/gpu-pools"),
        "{args:?}"
    );
    assert!(args.contains(&"--log-format=text"), "{args:?}");
    let role = objects.iter().find(|o| kind_of(o) == "Role").unwrap();
    let names: Vec<&Value> = role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["verbs"].as_array().unwrap().iter().any(|v| v == "watch"))
        .map(|r| &r["resourceNames"])
        .collect();
    assert_eq!(names, [&serde_json::json!(["gpu-pools"])], "{role}");
    assert_eq!(
        deployment["spec"]["template"]["metadata"]["labels"]
            ["pod-identity.alibabacloud.com/injection"],
        "on"
    );

    // One replica in dry run: no PodDisruptionBudget, and the rest as set.
    let objects = render(&["-f".into(), f("single-dry-run-values.yaml")]);
    assert!(!objects.iter().any(|o| kind_of(o) == "PodDisruptionBudget"));
    let deployment = objects.iter().find(|o| kind_of(o) == "Deployment").unwrap();
    let spec = &deployment["spec"]["template"]["spec"];
    assert_eq!(deployment["spec"]["replicas"], 1);
    let args = &spec["containers"][0]["args"];
    assert!(
        args.as_array().unwrap().iter().any(|a| a == "--dry-run")
            && args.as_array().unwrap().iter().any(|a| a == "--resync=30s"),
        "{args}"
    );
    assert_eq!(spec["imagePullSecrets"][0]["name"], "registry-credentials");
    assert_eq!(spec["nodeSelector"]["node-role.example.com/system"], "true");
    assert_eq!(
        spec["containers"][0]["resources"]["limits"]["memory"],
        "2Gi"
    );
    let env = &spec["containers"][0]["env"];
    assert!(
        env.as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "HTTPS_PROXY"),
        "{env}"
    );

    // Monitoring labels for a Prometheus that selects by label; the image of one's registry.
    let objects = render(&["-f".into(), f("aws-values.yaml")]);
    for kind in ["ServiceMonitor", "PrometheusRule"] {
        let o = objects.iter().find(|o| kind_of(o) == kind).unwrap();
        assert_eq!(
            o["metadata"]["labels"]["release"], "kube-prometheus-stack",
            "{o}"
        );
    }
    let deployment = objects.iter().find(|o| kind_of(o) == "Deployment").unwrap();
    assert_eq!(
        deployment["spec"]["template"]["spec"]["containers"][0]["image"],
        format!(
            "111122223333.dkr.ecr.us-east-1.amazonaws.com/gpu-node-autoscaler:{}",
            env!("CARGO_PKG_VERSION")
        )
    );
}

#[test]
fn helm_values_schema_refuses_a_misspelt_value_and_a_wrong_type() {
    for (set, says) in [
        (
            "replicass=2",
            "additional properties 'replicass' not allowed",
        ),
        ("replicas=two", "/replicas"),
        ("replicas=0", "/replicas"),
        ("metrics.serviceMonitor.enable=true", "'enable' not allowed"),
        ("logFormat=xml", "/logFormat"),
        (
            "policy.existingConfigMap=Not_A_Name",
            "/policy/existingConfigMap",
        ),
    ] {
        let err = helm_template(&chart_dir(), &["--set".into(), set.into()])
            .err()
            .unwrap_or_else(|| panic!("--set {set} rendered"));
        assert!(
            err.contains("values don't meet the specifications of the schema")
                && err.contains(says),
            "--set {set}: {err}"
        );
    }
}

#[test]
fn helm_package_carries_the_shared_files_and_renders_the_same() {
    let dir = std::env::temp_dir().join(format!("gna-it-helm-package-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let out = run_helm(&[
        "package",
        &chart_dir().to_string_lossy(),
        "-d",
        &dir.to_string_lossy(),
    ]);
    assert!(
        out.status.success(),
        "helm package: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let archive = dir.join(format!(
        "gpu-node-autoscaler-{}.tgz",
        env!("CARGO_PKG_VERSION")
    ));
    assert!(archive.is_file(), "{}", archive.display());
    // The archive holds the policy, alerts and dashboard (links in the repository), not ci/.
    let list = Command::new("tar")
        .arg("-tzf")
        .arg(&archive)
        .output()
        .expect("tar");
    let list = String::from_utf8_lossy(&list.stdout);
    for f in ["policy.yaml", "prometheusrule.yaml", "dashboard.json"] {
        assert!(
            list.contains(&format!("gpu-node-autoscaler/files/{f}")),
            "{f} not in:\n{list}"
        );
    }
    assert!(!list.contains("/ci/"), "{list}");
    let monitoring = values_of("overlays/monitoring");
    assert_eq!(
        by_key(helm_template(&archive, &monitoring).unwrap()),
        by_key(render(&monitoring)),
        "the packaged chart renders what the folder renders"
    );
}

/// The one version: the crate's (Cargo.toml), which `--version` prints; the chart, its default
/// image tag and deploy/base's image tag must say the same.
#[test]
fn helm_chart_version_and_image_tags_are_the_crate_version() {
    let version = env!("CARGO_PKG_VERSION");
    let chart: Value =
        yaml::parse(&std::fs::read_to_string(chart_dir().join("Chart.yaml")).unwrap())
            .expect("Chart.yaml");
    assert_eq!(chart["version"], version, "Chart.yaml version");
    assert_eq!(chart["appVersion"], version, "Chart.yaml appVersion");
    let kustomization: Value = yaml::parse(
        &std::fs::read_to_string(deploy_dir().join("base/kustomization.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        kustomization["images"][0]["newTag"], version,
        "deploy/base/kustomization.yaml"
    );
    let out = crate::run(&["--version"]);
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        printed.starts_with(&format!("gpu-node-autoscaler {version}")),
        "{printed}"
    );
}

/// scripts/set-version.sh writes a new version into every place that carries it, and the checks
/// above would hold after it.
#[test]
fn helm_set_version_writes_the_one_version_everywhere() {
    let dir = std::env::temp_dir().join(format!("gna-it-set-version-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for f in [
        "Cargo.toml",
        "deploy/helm/gpu-node-autoscaler/Chart.yaml",
        "deploy/base/kustomization.yaml",
    ] {
        let to = dir.join(f);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(root().join(f), &to).unwrap();
    }
    let run = |v: &str| {
        Command::new("bash")
            .arg(root().join("scripts/set-version.sh"))
            .arg(v)
            .env("GNA_SET_VERSION_ROOT", &dir)
            .output()
            .unwrap()
    };
    let out = run("not-a-version");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a semantic version"));
    let out = run("1.2.3-rc.1");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cargo = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
    assert!(cargo.contains("\nversion = \"1.2.3-rc.1\"\n"), "{cargo}");
    // The package's own `rust-version` and the dependencies' versions are left alone.
    assert_eq!(
        cargo.matches("1.2.3-rc.1").count(),
        1,
        "only the workspace version changes"
    );
    let chart: Value = yaml::parse(
        &std::fs::read_to_string(dir.join("deploy/helm/gpu-node-autoscaler/Chart.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(chart["version"], "1.2.3-rc.1");
    assert_eq!(chart["appVersion"], "1.2.3-rc.1");
    let k: Value =
        yaml::parse(&std::fs::read_to_string(dir.join("deploy/base/kustomization.yaml")).unwrap())
            .unwrap();
    assert_eq!(k["images"][0]["newTag"], "1.2.3-rc.1");
}
