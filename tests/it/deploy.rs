//! `deploy/` as users install it. For the base and every overlay: it renders with
//! `kubectl kustomize`; every object validates against the Kubernetes schemas
//! (`kubernetes-validate`, strict, installed by scripts/test.sh); the policy ConfigMap holds a
//! valid policy; the security settings, scheduling rules and least-privilege RBAC it promises
//! hold; kube-sim accepts the objects through the real `kubectl create -f`; and (with the
//! `controller` feature) the controller runs with the dry-run overlay's arguments and policy
//! against kube-sim, and exports every metric the alerts and the dashboard read.
//!
//! Left out, on purpose:
//! - Schema validation of `ServiceMonitor` and `PrometheusRule` (Prometheus Operator custom
//!   resources: kubernetes-validate ships the built-in kinds' schemas only). Their selectors,
//!   ports, alerts and the metrics they query are checked here instead.
//! - In kube-sim, the kinds it does not serve ([`KUBE_SIM_LEFT_OUT`], with why). The kinds it
//!   serves are read from its discovery, so a kind it learns to serve is created from then on.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Output};

use gpu_node_autoscaler::catalog;
use gpu_node_autoscaler::plan::Templates;
use gpu_node_autoscaler::policy::{self, GpuMode};
use gpu_node_autoscaler::provider::CapacityType;
use gpu_node_autoscaler::yaml;
use serde_json::{json, Value};

use crate::root;

/// What users render: the base and each overlay, relative to `deploy/`.
pub(crate) const TARGETS: [&str; 6] = [
    "base",
    "overlays/aws",
    "overlays/dry-run",
    "overlays/monitoring",
    "overlays/kwok",
    "overlays/alibaba",
];

/// Kubernetes versions the objects are validated against: kubectl's (v1.32) and the API the
/// controller is built for (k8s-openapi `v1_33`).
pub(crate) const K8S_VERSIONS: [&str; 2] = ["1.32.0", "1.33.0"];

/// Custom resources kubernetes-validate has no schema for.
pub(crate) const NO_SCHEMA: [&str; 2] = ["ServiceMonitor", "PrometheusRule"];

/// Rendered kinds kube-sim does not serve, and what stands in for creating them there.
const KUBE_SIM_LEFT_OUT: [(&str, &str); 9] = [
    (
        "ServiceAccount",
        "no ServiceAccounts (no token controller); referenced by name from the Deployment and the bindings, checked here",
    ),
    ("ClusterRole", "no RBAC API; rules checked here against an exact list"),
    ("ClusterRoleBinding", "no RBAC API; subjects and roleRef checked here"),
    ("Role", "no RBAC API; rules checked here against an exact list"),
    ("RoleBinding", "no RBAC API; subjects and roleRef checked here"),
    (
        "Deployment",
        "no apps/v1 Deployments; the two pods it would create are created instead",
    ),
    (
        "Service",
        "no Services; its selector and target port are checked here against the pod template",
    ),
    (
        "ServiceMonitor",
        "no custom resources; its selector and port are checked here against the Service",
    ),
    (
        "PrometheusRule",
        "no custom resources; its alerts and the metrics they query are checked here",
    ),
];

const NAME: &str = "gpu-node-autoscaler";
const NAMESPACE: &str = "kube-system";

struct Rendered {
    target: &'static str,
    objects: Vec<Value>,
}

impl Rendered {
    fn one(&self, kind: &str, name: &str) -> &Value {
        self.objects
            .iter()
            .find(|o| kind_of(o) == kind && name_of(o) == name)
            .unwrap_or_else(|| panic!("{}: no {kind} {name} rendered", self.target))
    }

    fn all(&self, kind: &str) -> Vec<&Value> {
        self.objects.iter().filter(|o| kind_of(o) == kind).collect()
    }

    fn pod_labels(&self) -> &Value {
        &self.one("Deployment", NAME)["spec"]["template"]["metadata"]["labels"]
    }
}

pub(crate) fn kind_of(o: &Value) -> &str {
    o["kind"].as_str().unwrap_or_default()
}

pub(crate) fn name_of(o: &Value) -> &str {
    o["metadata"]["name"].as_str().unwrap_or_default()
}

pub(crate) fn deploy_dir() -> PathBuf {
    root().join("deploy")
}

/// `kubectl kustomize DIR`, parsed.
pub(crate) fn kustomize(dir: &Path) -> Vec<Value> {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .env("KUBECONFIG", "/dev/null")
        .output()
        .expect("kubectl (v1.32) must be on PATH");
    assert!(
        out.status.success(),
        "kubectl kustomize {} failed: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("UTF-8 from kubectl kustomize");
    let objects = yaml::parse_all(&text).expect("kubectl kustomize printed YAML");
    assert!(!objects.is_empty(), "{} renders nothing", dir.display());
    objects
}

fn render_all() -> Vec<Rendered> {
    TARGETS
        .iter()
        .map(|&target| Rendered {
            target,
            objects: kustomize(&deploy_dir().join(target)),
        })
        .collect()
}

/// The objects as a YAML stream, with the strings YAML 1.1 readers (kubernetes-validate's PyYAML,
/// kubectl) would take for other types quoted.
fn yaml_stream(objects: &[&Value]) -> String {
    objects
        .iter()
        .map(|o| yaml::to_string(o).expect("an object as YAML"))
        .collect::<Vec<_>>()
        .join("---\n")
}

fn file_name(label: &str) -> String {
    label.replace('/', "-")
}

/// Runs `python3 -m kubernetes_validate --strict` on the objects, for every version.
pub(crate) fn kubernetes_validate(label: &str, objects: &[&Value]) -> (Output, PathBuf) {
    let file = crate::temp_file(
        &format!("validate-{}.yaml", file_name(label)),
        &yaml_stream(objects),
    );
    let mut cmd = Command::new("python3");
    cmd.args(["-m", "kubernetes_validate", "--strict"]);
    for v in K8S_VERSIONS {
        cmd.args(["-k", v]);
    }
    let out = cmd.arg(&file).output().expect("python3 must be on PATH");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("No module named kubernetes_validate"),
        "kubernetes-validate is not installed: bash scripts/test.sh installs it"
    );
    (out, file)
}

pub(crate) fn major_minor(version: &str) -> &str {
    version.rsplit_once('.').map_or(version, |(mm, _)| mm)
}

#[test]
fn every_target_renders_and_validates_against_the_kubernetes_schemas() {
    for r in render_all() {
        let (checked, skipped): (Vec<&Value>, Vec<&Value>) = r
            .objects
            .iter()
            .partition(|o| !NO_SCHEMA.contains(&kind_of(o)));
        // Only the custom resources are skipped, and only in the monitoring overlay.
        let skipped_kinds: BTreeSet<&str> = skipped.iter().map(|o| kind_of(o)).collect();
        for o in &skipped {
            eprintln!(
                "{}: no schema validation for {} {} (a Prometheus Operator custom resource)",
                r.target,
                kind_of(o),
                name_of(o)
            );
        }
        if r.target == "overlays/monitoring" {
            assert_eq!(skipped_kinds, NO_SCHEMA.into_iter().collect());
        } else {
            assert!(skipped_kinds.is_empty(), "{}: {skipped_kinds:?}", r.target);
        }

        let (out, file) = kubernetes_validate(r.target, &checked);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}: kubernetes-validate failed:\n{stdout}{}",
            r.target,
            String::from_utf8_lossy(&out.stderr)
        );
        // A kind without a schema is only a warning (exit 0): every object must have passed.
        assert!(
            !stdout.contains("WARN") && !stdout.contains("ERROR"),
            "{}:\n{stdout}",
            r.target
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
                assert!(
                    stdout.contains(&line),
                    "{}: missing `{line}` in:\n{stdout}",
                    r.target
                );
            }
        }
    }
}

#[test]
fn the_schema_check_rejects_a_misspelt_field() {
    let mut objects = kustomize(&deploy_dir().join("base"));
    let d = objects
        .iter_mut()
        .find(|o| kind_of(o) == "Deployment")
        .expect("a Deployment");
    d["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFS"] =
        json!(true);
    let refs: Vec<&Value> = objects.iter().collect();
    let (out, _) = kubernetes_validate("misspelt", &refs);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert!(
        stdout.contains("ERROR") && stdout.contains("deployment/gpu-node-autoscaler"),
        "{stdout}"
    );
    assert!(stdout.contains("readOnlyRootFS"), "{stdout}");
}

/// The GPU models of the instance types a pool may use.
fn gpu_models(
    pool: &policy::Pool,
    catalog: &gpu_node_autoscaler::provider::Catalog,
) -> BTreeSet<String> {
    catalog
        .instance_types
        .iter()
        .filter(|t| {
            pool.instance_types
                .as_ref()
                .is_none_or(|names| names.contains(&t.name))
                && pool.requirements.as_ref().is_none_or(|r| r.admits(t))
        })
        .filter_map(|t| t.gpu.as_ref().map(|g| g.model.clone()))
        .collect()
}

/// The policy file a target's ConfigMap carries: the Alibaba overlay's own, else the base's.
fn policy_file_of(target: &str) -> &'static str {
    match target {
        "overlays/alibaba" => "deploy/overlays/alibaba/policy.yaml",
        _ => "deploy/base/policy.yaml",
    }
}

#[test]
fn every_target_carries_the_example_policy_and_it_is_valid() {
    let path = "deploy/base/policy.yaml";
    let text = std::fs::read_to_string(root().join(path)).unwrap();
    for r in render_all() {
        let file = policy_file_of(r.target);
        let cm = r.one("ConfigMap", "gpu-node-autoscaler-policy");
        assert_eq!(cm["metadata"]["namespace"], NAMESPACE, "{}", r.target);
        assert_eq!(
            cm["data"]["policy.yaml"].as_str(),
            Some(std::fs::read_to_string(root().join(file)).unwrap().as_str()),
            "{}: the ConfigMap's policy.yaml is not {file}",
            r.target
        );
    }

    let policy = policy::parse_policy(&text, path).unwrap_or_else(|e| panic!("{e}"));
    let types = catalog::parse_csv(catalog::BUILTIN_AWS, catalog::BUILTIN_AWS_NAME).unwrap();
    let catalog = catalog::offerings_from_list_prices(&policy, types);
    let errors = Templates::new(&policy, &catalog).errors;
    assert!(errors.is_empty(), "{path} against the catalog: {errors:?}");

    let has = |model: &str, caps: &[CapacityType], mode: fn(&GpuMode) -> bool| {
        policy.pools.iter().any(|p| {
            gpu_models(p, &catalog) == BTreeSet::from([model.to_string()])
                && p.capacity_types == caps
                && mode(&p.gpu_mode)
        })
    };
    use CapacityType::{OnDemand, Spot};
    assert!(
        has("A10G", &[Spot, OnDemand], |m| *m == GpuMode::Whole),
        "no spot A10G pool with on-demand fallback"
    );
    assert!(
        has(
            "A100",
            &[OnDemand],
            |m| matches!(m, GpuMode::Mig(l) if !l.is_empty())
        ),
        "no on-demand A100 pool with a MIG layout"
    );
    assert!(
        has("T4", &[OnDemand], |m| matches!(m, GpuMode::Shared { .. })),
        "no shared-GPU T4 pool"
    );

    // What the comment in the file tells users to run.
    let o = crate::run(&["check-policy", path]);
    assert!(o.status.success(), "{}", crate::stderr(&o));
    assert_eq!(crate::stdout(&o).lines().count(), policy.pools.len());
}

/// Whether every `key: value` of `selector` (a label map) is among `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    let Some(sel) = selector.as_object().filter(|s| !s.is_empty()) else {
        return false;
    };
    sel.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The port number a probe or a Service names (by number or by container port name).
fn resolve_port(port: &Value, container: &Value) -> Option<i64> {
    match port {
        Value::Number(n) => n.as_i64(),
        Value::String(name) => container["ports"]
            .as_array()?
            .iter()
            .find(|p| p["name"] == name.as_str())?["containerPort"]
            .as_i64(),
        _ => None,
    }
}

fn check_container(target: &str, c: &Value) {
    let name = c["name"].as_str().unwrap_or_default();
    let at = format!("{target}: container {name}");
    let sc = &c["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"], true, "{at}");
    assert_eq!(sc["allowPrivilegeEscalation"], false, "{at}");
    assert_ne!(sc["privileged"], true, "{at}");
    assert_ne!(sc["runAsNonRoot"], false, "{at}");
    assert_ne!(sc["runAsUser"], 0, "{at}");
    assert_eq!(strings(&sc["capabilities"]["drop"]), ["ALL"], "{at}");
    assert!(strings(&sc["capabilities"]["add"]).is_empty(), "{at}");
    let seccomp = &sc["seccompProfile"]["type"];
    assert!(seccomp.is_null() || *seccomp == "RuntimeDefault", "{at}");
    for bound in ["requests", "limits"] {
        for resource in ["cpu", "memory"] {
            assert!(
                c["resources"][bound][resource].is_string(),
                "{at}: no {bound}.{resource}"
            );
        }
    }
}

#[test]
fn the_deployment_keeps_its_security_and_scheduling_settings() {
    for r in render_all() {
        let t = r.target;
        let d = r.one("Deployment", NAME);
        let labels = r.pod_labels();
        assert_eq!(d["spec"]["replicas"], 2, "{t}");
        assert!(
            selects(&d["spec"]["selector"]["matchLabels"], labels),
            "{t}"
        );
        let pod = &d["spec"]["template"]["spec"];

        // Security.
        let psc = &pod["securityContext"];
        assert_eq!(psc["runAsNonRoot"], true, "{t}");
        assert!(psc["runAsUser"].as_i64().is_some_and(|u| u > 0), "{t}");
        assert_eq!(psc["seccompProfile"]["type"], "RuntimeDefault", "{t}");
        for host in ["hostNetwork", "hostPID", "hostIPC"] {
            assert_ne!(pod[host], true, "{t}: {host}");
        }
        assert!(pod["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .all(|v| v["hostPath"].is_null()));
        let containers: Vec<&Value> = ["initContainers", "containers"]
            .iter()
            .flat_map(|k| pod[*k].as_array().into_iter().flatten())
            .collect();
        assert!(!containers.is_empty(), "{t}");
        for c in &containers {
            check_container(t, c);
        }

        // Scheduling: critical, spread across nodes, never on a GPU node, tolerating only the
        // system nodes' CriticalAddonsOnly taint (no GPU pool's taint).
        assert_eq!(pod["priorityClassName"], "system-cluster-critical", "{t}");
        assert_eq!(
            pod["tolerations"],
            json!([{"key": "CriticalAddonsOnly", "operator": "Exists"}]),
            "{t}"
        );
        let spread = pod["topologySpreadConstraints"].as_array().expect("spread");
        assert!(
            spread
                .iter()
                .any(|s| s["topologyKey"] == "kubernetes.io/hostname"
                    && s["whenUnsatisfiable"] == "DoNotSchedule"
                    && s["maxSkew"] == 1
                    && selects(&s["labelSelector"]["matchLabels"], labels)),
            "{t}: replicas not spread across nodes"
        );
        let terms = pod["affinity"]["nodeAffinity"]
            ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            .as_array()
            .expect("required node affinity");
        assert!(!terms.is_empty(), "{t}");
        // Terms are alternatives: each must keep GPU nodes out.
        for term in terms {
            for key in ["gpu-node-autoscaler.io/pool", "nvidia.com/gpu.present"] {
                assert!(
                    term["matchExpressions"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|e| e["key"] == key && e["operator"] == "DoesNotExist"),
                    "{t}: a node selector term admits nodes with {key}"
                );
            }
        }

        // The container: the controller's flags, identity, probes and port.
        assert_eq!(pod["serviceAccountName"], NAME, "{t}");
        r.one("ServiceAccount", NAME);
        let c = containers
            .iter()
            .find(|c| c["name"] == NAME)
            .expect("the gpu-node-autoscaler container");
        assert_eq!(
            c["image"],
            format!("gpu-node-autoscaler:{}", env!("CARGO_PKG_VERSION")),
            "{t}"
        );
        let args = strings(&c["args"]);
        assert_eq!(args.first(), Some(&"run"), "{t}");
        for flag in [
            "--policy-configmap=kube-system/gpu-node-autoscaler-policy",
            "--status-configmap=kube-system/gpu-node-autoscaler-status",
            "--lease=kube-system/gpu-node-autoscaler",
            "--listen=0.0.0.0:8080",
        ] {
            assert!(args.contains(&flag), "{t}: {flag} missing from {args:?}");
        }
        assert_eq!(
            args.contains(&"--dry-run"),
            t == "overlays/dry-run",
            "{t}: {args:?}"
        );
        let pod_name = c["env"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["name"] == "POD_NAME")
            .expect("env POD_NAME");
        assert_eq!(
            pod_name["valueFrom"]["fieldRef"]["fieldPath"], "metadata.name",
            "{t}"
        );
        for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
            let get = &c[probe]["httpGet"];
            assert_eq!(get["path"], path, "{t}: {probe}");
            assert_eq!(resolve_port(&get["port"], c), Some(8080), "{t}: {probe}");
        }

        // The PodDisruptionBudget covers these pods; the Service reaches their metrics port.
        let pdb = r.one("PodDisruptionBudget", NAME);
        assert_eq!(pdb["spec"]["minAvailable"], 1, "{t}");
        assert!(
            selects(&pdb["spec"]["selector"]["matchLabels"], labels),
            "{t}"
        );
        let svc = r.one("Service", NAME);
        assert!(selects(&svc["spec"]["selector"], labels), "{t}");
        let port = &svc["spec"]["ports"][0];
        assert_eq!(port["name"], "metrics", "{t}");
        assert_eq!(resolve_port(&port["targetPort"], c), Some(8080), "{t}");

        // Everything namespaced lives in kube-system, which is not created.
        assert!(r.all("Namespace").is_empty(), "{t}");
        for o in &r.objects {
            if !["ClusterRole", "ClusterRoleBinding"].contains(&kind_of(o)) {
                assert_eq!(
                    o["metadata"]["namespace"],
                    NAMESPACE,
                    "{t}: {} {}",
                    kind_of(o),
                    name_of(o)
                );
            }
        }
    }
}

/// Mebibytes of a Kubernetes memory quantity in `Mi` or `Gi`.
fn mebibytes(q: &Value) -> f64 {
    let q = q.as_str().expect("a memory quantity");
    if let Some(n) = q.strip_suffix("Gi") {
        n.parse::<f64>().unwrap() * 1024.0
    } else {
        q.strip_suffix("Mi")
            .unwrap_or_else(|| panic!("{q}: in Mi or Gi"))
            .parse()
            .unwrap()
    }
}

/// The memory request covers the controller's measured peak (docs/benchmarks.md, 5,000 nodes
/// and 100,000 pods) with at least a quarter to spare: a request below the peak lets the node
/// run short while the scheduler counts the pod as fitting.
#[test]
fn the_memory_request_covers_the_measured_peak_with_headroom() {
    let benchmarks = std::fs::read_to_string(root().join("docs/benchmarks.md")).unwrap();
    let row = benchmarks
        .lines()
        .find(|l| l.starts_with("| controller RSS, 5,000 nodes / 100,000 pods |"))
        .expect("the controller's memory in docs/benchmarks.md");
    let peak: f64 = row
        .split("peak **")
        .nth(1)
        .and_then(|r| r.split(" MiB").next())
        .expect("peak **N MiB**")
        .parse()
        .unwrap();
    let operations = std::fs::read_to_string(root().join("docs/operations.md")).unwrap();
    for r in render_all() {
        let resources =
            &r.one("Deployment", NAME)["spec"]["template"]["spec"]["containers"][0]["resources"];
        let request = mebibytes(&resources["requests"]["memory"]);
        let limit = mebibytes(&resources["limits"]["memory"]);
        assert!(
            request >= peak * 1.25,
            "{}: a request of {request} MiB leaves less than 25 % over the measured peak of \
             {peak} MiB",
            r.target
        );
        assert!(limit >= request * 2.0, "{}: limit {limit} MiB", r.target);
        let said = format!(
            "{} memory",
            resources["requests"]["memory"].as_str().unwrap()
        );
        assert!(
            operations.contains(&said),
            "docs/operations.md does not say {said}"
        );
    }
}

/// A role's rules as `group resource verb [name]` lines.
fn rule_lines(target: &str, role: &Value) -> BTreeSet<String> {
    let mut lines = BTreeSet::new();
    assert!(role["aggregationRule"].is_null(), "{target}");
    for rule in role["rules"].as_array().expect("rules") {
        assert!(rule["nonResourceURLs"].is_null(), "{target}: {rule}");
        for field in ["apiGroups", "resources", "verbs", "resourceNames"] {
            assert!(
                !strings(&rule[field]).iter().any(|s| s.contains('*')),
                "{target}: wildcard in {rule}"
            );
        }
        let names = strings(&rule["resourceNames"]);
        let names = if names.is_empty() { vec![""] } else { names };
        for g in strings(&rule["apiGroups"]) {
            for res in strings(&rule["resources"]) {
                for v in strings(&rule["verbs"]) {
                    for n in &names {
                        let g = if g.is_empty() { "core" } else { g };
                        lines.insert(format!("{g} {res} {v} {n}").trim_end().to_string());
                    }
                }
            }
        }
    }
    lines
}

fn expand(spec: &[(&str, &str, &str, &str)]) -> BTreeSet<String> {
    let mut lines = BTreeSet::new();
    for (group, resource, verbs, name) in spec {
        for v in verbs.split(' ') {
            lines.insert(
                format!("{group} {resource} {v} {name}")
                    .trim_end()
                    .to_string(),
            );
        }
    }
    lines
}

#[test]
fn rbac_is_least_privilege() {
    // Exactly what the controller uses (cluster-wide, then kube-system); nothing more.
    let cluster = expand(&[
        ("core", "pods", "get list watch", ""),
        ("core", "pods/eviction", "create", ""),
        ("core", "pods/status", "patch", ""),
        ("core", "nodes", "get list watch patch update delete", ""),
        ("policy", "poddisruptionbudgets", "get list watch", ""),
        ("resource.k8s.io", "resourceclaims", "list watch", ""),
        (
            "resource.k8s.io",
            "resourceclaimtemplates",
            "list watch",
            "",
        ),
        ("resource.k8s.io", "deviceclasses", "list watch", ""),
        ("resource.k8s.io", "resourceslices", "list watch", ""),
        ("core", "persistentvolumeclaims", "list watch", ""),
        ("core", "persistentvolumes", "list watch", ""),
        ("storage.k8s.io", "storageclasses", "list watch", ""),
        ("storage.k8s.io", "csinodes", "list watch", ""),
        ("core", "namespaces", "list watch", ""),
        (
            "autoscaling.x-k8s.io",
            "provisioningrequests",
            "list watch",
            "",
        ),
        (
            "autoscaling.x-k8s.io",
            "provisioningrequests/status",
            "patch",
            "",
        ),
        ("core", "podtemplates", "list watch", ""),
        ("autoscaling.x-k8s.io", "capacitybuffers", "list watch", ""),
        (
            "autoscaling.x-k8s.io",
            "capacitybuffers/status",
            "patch",
            "",
        ),
        ("apps", "deployments", "list watch", ""),
        ("apps", "statefulsets", "list watch", ""),
        ("core", "podtemplates", "create update", ""),
        ("events.k8s.io", "events", "create patch", ""),
        ("core", "namespaces", "get", "kube-system"),
    ]);
    let namespaced = expand(&[
        (
            "core",
            "configmaps",
            "get list watch",
            "gpu-node-autoscaler-policy",
        ),
        (
            "core",
            "configmaps",
            "get update patch",
            "gpu-node-autoscaler-status",
        ),
        ("coordination.k8s.io", "leases", "get update patch", NAME),
    ]);
    // The kwok provider launches by creating Nodes.
    let mut kwok_cluster = cluster.clone();
    kwok_cluster.extend(expand(&[("core", "nodes", "create", "")]));
    for r in render_all() {
        let t = r.target;
        // No `create` in kube-system (it cannot be limited to a name): the Lease and the status
        // ConfigMap the Role names are shipped, empty, so that applying deploy/ again keeps what
        // the autoscaler wrote in them.
        let lease = r.one("Lease", NAME);
        assert_eq!(
            lease["spec"],
            json!({}),
            "{t}: the Lease ships with no holder"
        );
        let status = r.one("ConfigMap", "gpu-node-autoscaler-status");
        assert!(
            status["data"].is_null(),
            "{t}: the status ships with no data"
        );
        let cluster = if t == "overlays/kwok" {
            &kwok_cluster
        } else {
            &cluster
        };
        for (kind, expected) in [("ClusterRole", cluster), ("Role", &namespaced)] {
            let roles = r.all(kind);
            assert_eq!(roles.len(), 1, "{t}: one {kind}");
            assert_eq!(&rule_lines(t, roles[0]), expected, "{t}: {kind} rules");
        }
        for (kind, role_kind) in [
            ("ClusterRoleBinding", "ClusterRole"),
            ("RoleBinding", "Role"),
        ] {
            let bindings = r.all(kind);
            assert_eq!(bindings.len(), 1, "{t}: one {kind}");
            let b = bindings[0];
            assert_eq!(
                b["roleRef"],
                json!({"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": NAME}),
                "{t}: {kind} must bind our own {role_kind}, never cluster-admin"
            );
            assert_eq!(
                b["subjects"],
                json!([{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]),
                "{t}: {kind} subjects"
            );
        }
    }
}

#[test]
fn the_aws_overlays_carry_the_irsa_role_and_the_base_and_kwok_do_not() {
    for r in render_all() {
        let role =
            &r.one("ServiceAccount", NAME)["metadata"]["annotations"]["eks.amazonaws.com/role-arn"];
        if matches!(r.target, "base" | "overlays/kwok" | "overlays/alibaba") {
            assert!(role.is_null(), "{}: {role}", r.target);
        } else {
            assert!(
                role.as_str().is_some_and(|s| !s.is_empty()),
                "{}: no IRSA role annotation",
                r.target
            );
        }
    }
}

/// The Alibaba overlay: the RAM role through ACK's RRSA (the role name on the ServiceAccount,
/// injection asked for by the pod), and a policy whose every pool is an Alibaba one, valid as
/// its comment tells users to check it. No other target asks for RRSA.
#[test]
fn the_alibaba_overlay_carries_the_rrsa_role_and_a_policy_of_alibaba_pools() {
    const ROLE: &str = "pod-identity.alibabacloud.com/role-name";
    const INJECTION: &str = "pod-identity.alibabacloud.com/injection";
    for r in render_all() {
        let role = &r.one("ServiceAccount", NAME)["metadata"]["annotations"][ROLE];
        let injection = &r.pod_labels()[INJECTION];
        if r.target != "overlays/alibaba" {
            assert!(role.is_null() && injection.is_null(), "{}", r.target);
            continue;
        }
        assert!(role.as_str().is_some_and(|s| !s.is_empty()), "{role}");
        assert_eq!(injection, "on");
        // The selectors stay the base's: the label is on the pods only.
        let d = r.one("Deployment", NAME);
        assert!(d["spec"]["selector"]["matchLabels"][INJECTION].is_null());
    }

    let path = policy_file_of("overlays/alibaba");
    let text = std::fs::read_to_string(root().join(path)).unwrap();
    let policy = policy::parse_policy(&text, path).unwrap_or_else(|e| panic!("{e}"));
    assert!(!policy.pools.is_empty());
    for p in &policy.pools {
        assert_eq!(p.provider, "alibaba", "pool {}", p.name);
    }
    assert_ne!(
        policy.cluster_name,
        policy::parse_policy(
            &std::fs::read_to_string(root().join("deploy/base/policy.yaml")).unwrap(),
            "base"
        )
        .unwrap()
        .cluster_name,
        "one clusterName per cluster"
    );
    let o = crate::run(&["check-policy", path]);
    assert!(o.status.success(), "{}", crate::stderr(&o));
    assert_eq!(crate::stdout(&o).lines().count(), policy.pools.len());
    // The one warning expected: there is no built-in Alibaba catalog (docs/catalog.md), so
    // check-policy says which prices it falls back to; nothing else (clusterName, fields).
    let err = crate::stderr(&o);
    let others: Vec<&str> = err
        .lines()
        .filter(|l| !l.starts_with("warning: no built-in catalog for region cn-hangzhou:"))
        .collect();
    assert!(others.is_empty(), "{err}");
}

/// The metric names an expression reads (histogram series folded onto their histogram).
fn metrics_in(expr: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for prefix in ["gpu_node_autoscaler_", "process_"] {
        found.extend(metrics_with_prefix(expr, prefix));
    }
    found
}

/// The metric names in `expr` that start with `prefix` (ours, or the process' own we export).
fn metrics_with_prefix(expr: &str, prefix: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = expr;
    while let Some(i) = rest.find(prefix) {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        let base = ["_bucket", "_count", "_sum"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|b| b.ends_with("_seconds")))
            .unwrap_or(name);
        found.insert(base.to_string());
        rest = &tail[end..];
    }
    found
}

fn balanced(expr: &str) -> bool {
    let mut stack = Vec::new();
    for c in expr.chars() {
        match c {
            '(' | '{' | '[' => stack.push(c),
            ')' | '}' | ']' => {
                let open = match c {
                    ')' => '(',
                    '}' => '{',
                    _ => '[',
                };
                if stack.pop() != Some(open) {
                    return false;
                }
            }
            _ => {}
        }
    }
    stack.is_empty()
}

#[test]
fn the_monitoring_overlay_scrapes_alerts_and_charts_what_the_runbook_documents() {
    let operations = std::fs::read_to_string(root().join("docs/operations.md")).unwrap();
    for r in render_all() {
        if r.target != "overlays/monitoring" {
            for kind in NO_SCHEMA {
                assert!(r.all(kind).is_empty(), "{}: {kind}", r.target);
            }
            continue;
        }
        let svc = r.one("Service", NAME);
        let sm = r.one("ServiceMonitor", NAME);
        assert!(selects(
            &sm["spec"]["selector"]["matchLabels"],
            &svc["metadata"]["labels"]
        ));
        assert!(strings(&sm["spec"]["namespaceSelector"]["matchNames"]).contains(&NAMESPACE));
        let endpoints = sm["spec"]["endpoints"].as_array().expect("endpoints");
        for e in endpoints {
            assert_eq!(e["port"], svc["spec"]["ports"][0]["name"]);
            assert_eq!(e["path"], "/metrics");
        }

        let mut exprs = Vec::new();
        let rules = r.one("PrometheusRule", NAME);
        promtool_checks_rules(&rules["spec"]);
        let mut alerts = BTreeSet::new();
        for group in rules["spec"]["groups"].as_array().expect("groups") {
            for rule in group["rules"].as_array().expect("rules") {
                let alert = rule["alert"].as_str().expect("alert rules only");
                alerts.insert(alert);
                assert!(rule["labels"]["severity"].is_string(), "{alert}");
                assert!(rule["annotations"]["summary"].is_string(), "{alert}");
                assert!(
                    operations.contains(alert),
                    "{alert} is not in the runbook docs/operations.md"
                );
                exprs.push(rule["expr"].as_str().expect("expr").to_string());
            }
        }
        for wanted in [
            "GpuNodeAutoscalerNoLeader",
            "GpuNodeAutoscalerLaunchesFailing",
            "GpuNodeAutoscalerGpuPodsPendingTooLong",
            "GpuNodeAutoscalerPolicyInvalid",
            "GpuNodeAutoscalerDrainsBlocked",
            "GpuNodeAutoscalerPoolAtMaximum",
            "GpuNodeAutoscalerRestarting",
        ] {
            assert!(alerts.contains(wanted), "no alert {wanted}: {alerts:?}");
        }
        let no_leader = rules["spec"]["groups"][0]["rules"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["alert"] == "GpuNodeAutoscalerNoLeader")
            .unwrap();
        assert_eq!(no_leader["for"], "5m");

        let cm = r.one("ConfigMap", "gpu-node-autoscaler-dashboard");
        assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
        let data = cm["data"].as_object().expect("data");
        assert_eq!(data.len(), 1);
        let dashboard: Value =
            serde_json::from_str(data.values().next().unwrap().as_str().unwrap())
                .expect("the dashboard is JSON");
        assert!(dashboard["uid"].is_string() && dashboard["title"].is_string());
        let panels = dashboard["panels"].as_array().expect("panels");
        assert!(!panels.is_empty());
        for p in panels {
            assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
            let targets = p["targets"].as_array().expect("targets");
            assert!(!targets.is_empty(), "{}", p["title"]);
            exprs.extend(
                targets
                    .iter()
                    .map(|t| t["expr"].as_str().unwrap().to_string()),
            );
        }

        let mut used = BTreeSet::new();
        for e in &exprs {
            assert!(balanced(e), "unbalanced brackets in {e}");
            let m = metrics_in(e);
            assert!(!m.is_empty(), "reads no metric of ours: {e}");
            used.extend(m);
        }
        for m in &used {
            assert!(
                operations.contains(&format!("`{m}")),
                "{m} is not documented in docs/operations.md"
            );
        }
    }
}

/// promtool, which comes with the tests' Prometheus (`scripts/prometheus.sh`).
fn promtool() -> PathBuf {
    let prometheus = gpu_node_autoscaler_test_support::tool_path(
        "GNA_PROMETHEUS_BIN",
        "prometheus.sh",
        "--print-bin",
    );
    let promtool = prometheus.with_file_name("promtool");
    assert!(
        promtool.is_file(),
        "{} is missing: install it with `bash scripts/prometheus.sh` (scripts/test.sh does)",
        promtool.display()
    );
    promtool
}

/// Prometheus' own `promtool check rules` on the PrometheusRule's groups (PromQL syntax, label
/// and annotation templates, durations).
fn promtool_checks_rules(spec: &Value) {
    let f = crate::temp_file("rules.json", &spec.to_string());
    let out = Command::new(promtool())
        .args(["check", "rules"])
        .arg(&f)
        .output()
        .expect("running promtool");
    assert!(
        out.status.success(),
        "promtool check rules: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The alerts evaluated by Prometheus' rule engine (`promtool test rules`) on the series of
/// `tests/it/testdata/alerts.test.yaml`: each fires when the runbook says and stays silent where
/// it must, among them `GpuNodeAutoscalerPolicyInvalid` while replicas start (their
/// `policy_valid` is 0 until the policy is read) and while another replica crash-loops.
#[test]
fn promtool_fires_each_alert_when_the_runbook_says_and_not_while_replicas_start() {
    let monitoring = kustomize(&deploy_dir().join("overlays/monitoring"));
    let mut spec = monitoring
        .iter()
        .find(|o| kind_of(o) == "PrometheusRule")
        .expect("a PrometheusRule")["spec"]
        .clone();
    let mut alerts = BTreeSet::new();
    for group in spec["groups"].as_array_mut().expect("groups") {
        for rule in group["rules"].as_array_mut().expect("rules") {
            alerts.insert(rule["alert"].as_str().expect("alert").to_string());
            // promtool compares every annotation; their templates are checked by `check rules`.
            rule.as_object_mut().unwrap().remove("annotations");
        }
    }
    let tests_path = root().join("tests/it/testdata/alerts.test.yaml");
    let tests_text = std::fs::read_to_string(&tests_path).unwrap();
    let tests = yaml::parse(&tests_text).expect("alerts.test.yaml is YAML");
    assert_eq!(tests["rule_files"], json!(["rules.json"]));
    // Every alert has a case where it fires.
    let firing: BTreeSet<String> = tests["tests"]
        .as_array()
        .expect("tests")
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().into_iter().flatten())
        .filter(|a| a["exp_alerts"].as_array().is_some_and(|e| !e.is_empty()))
        .map(|a| a["alertname"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        firing, alerts,
        "alerts without a firing case, or cases of no alert"
    );

    let test_file = crate::temp_file("alerts.test.yaml", &tests_text);
    let dir = test_file.parent().unwrap();
    std::fs::write(dir.join("rules.json"), spec.to_string()).unwrap();
    let out = Command::new(promtool())
        .args(["test", "rules", "alerts.test.yaml"])
        .current_dir(dir)
        .output()
        .expect("running promtool");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("SUCCESS"),
        "promtool test rules: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The path of `to` relative to the directory `from` (kustomize refuses absolute paths).
fn relative(from: &Path, to: &Path) -> PathBuf {
    let from = from.canonicalize().unwrap();
    let to = to.canonicalize().unwrap();
    let depth = from
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .count();
    let mut p = PathBuf::new();
    for _ in 0..depth {
        p.push("..");
    }
    p.join(to.strip_prefix("/").unwrap())
}

/// The YAML block of docs/operations.md that starts with `first_line`, indented as it is there.
fn doc_yaml_block(doc: &str, first_line: &str) -> String {
    let mut lines = doc.lines().skip_while(|l| l.trim() != first_line);
    let head = lines.next().expect("the block in docs/operations.md");
    let indent = head.len() - head.trim_start().len();
    let mut text = format!("{}\n", head.trim_start());
    for l in lines.take_while(|l| l.trim() != "```") {
        text.push_str(l.get(indent..).unwrap_or(""));
        text.push('\n');
    }
    text
}

#[test]
fn the_overlay_of_ones_own_in_the_runbook_renders_as_it_says() {
    let doc = std::fs::read_to_string(root().join("docs/operations.md")).unwrap();
    let block = doc_yaml_block(&doc, "# my-cluster/kustomization.yaml");
    // The runbook's layout: my-cluster/ beside a checkout named gpu-node-autoscaler.
    let file = crate::temp_file("kustomization.yaml", "");
    let dir = file.parent().unwrap();
    let checkout = format!("{}/", relative(dir, &root()).display());
    std::fs::write(&file, block.replace("../gpu-node-autoscaler/", &checkout)).unwrap();
    let base_policy = std::fs::read_to_string(root().join("deploy/base/policy.yaml")).unwrap();
    let own_policy = base_policy.replace("clusterName: ml-prod", "clusterName: my-cluster");
    assert_ne!(own_policy, base_policy);
    std::fs::write(dir.join("policy.yaml"), &own_policy).unwrap();

    let r = Rendered {
        target: "my-cluster",
        objects: kustomize(dir),
    };
    let container = &r.one("Deployment", NAME)["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        container["image"],
        "registry.example.com/gpu-node-autoscaler:0.1.0"
    );
    let args = strings(&container["args"]);
    assert_eq!(args.iter().filter(|a| **a == "--dry-run").count(), 1);
    assert_eq!(
        r.one("ServiceAccount", NAME)["metadata"]["annotations"]["eks.amazonaws.com/role-arn"],
        "arn:aws:iam::111122223333:role/gpu-node-autoscaler"
    );
    let cm = r.one("ConfigMap", "gpu-node-autoscaler-policy");
    assert_eq!(cm["metadata"]["namespace"], NAMESPACE);
    assert_eq!(
        cm["data"]["policy.yaml"].as_str(),
        Some(own_policy.as_str())
    );
    assert_eq!(
        r.all("ConfigMap").len(),
        3,
        "the policy, the status and the dashboard"
    );
    r.one("ConfigMap", "gpu-node-autoscaler-status");
    r.one("ServiceMonitor", NAME);
    r.one("PrometheusRule", NAME);
}

/// The machine's kubectl against one kube-sim.
struct Kubectl {
    server: String,
    cache: PathBuf,
}

impl Kubectl {
    fn new(addr: SocketAddr) -> Kubectl {
        Kubectl {
            server: format!("http://{addr}"),
            cache: std::env::temp_dir().join(format!(
                "gna-it-kubectl-cache-{}-{}",
                std::process::id(),
                addr.port()
            )),
        }
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new("kubectl")
            .arg("--server")
            .arg(&self.server)
            .arg("--cache-dir")
            .arg(&self.cache)
            .args(["--request-timeout", "20s"])
            .args(args)
            .env("KUBECONFIG", "/dev/null")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .output()
            .expect("kubectl (v1.32) must be on PATH")
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `(apiVersion, kind)` of every resource the server's discovery lists.
    fn served(&self) -> BTreeSet<(String, String)> {
        self.ok(&["api-resources", "--no-headers"])
            .lines()
            .filter_map(|l| {
                // NAME [SHORTNAMES] APIVERSION NAMESPACED KIND
                let cols: Vec<&str> = l.split_whitespace().collect();
                let n = cols.len();
                (n >= 4).then(|| (cols[n - 3].to_string(), cols[n - 1].to_string()))
            })
            .collect()
    }
}

fn api_version(o: &Value) -> String {
    o["apiVersion"].as_str().unwrap_or_default().to_string()
}

/// What kubectl prints for a created object: `configmap/x`, `poddisruptionbudget.policy/x`.
fn printed_name(o: &Value) -> String {
    let kind = kind_of(o).to_lowercase();
    match api_version(o).split_once('/') {
        Some((group, _)) => format!("{kind}.{group}/{}", name_of(o)),
        None => format!("{kind}/{}", name_of(o)),
    }
}

#[test]
fn kube_sim_accepts_every_object_it_serves() {
    for r in render_all() {
        let t = r.target;
        // The API only: the pods below keep the status this test gives them (no simulated
        // scheduler or kubelet racing the eviction checks).
        let addr = kube_sim::spawn_background(kube_sim::Config::api_only()).expect("kube-sim");
        let k = Kubectl::new(addr);
        let served = k.served();
        assert!(!served.is_empty(), "kube-sim discovery lists nothing");
        let (create, left_out): (Vec<&Value>, Vec<&Value>) = r
            .objects
            .iter()
            .partition(|o| served.contains(&(api_version(o), kind_of(o).to_string())));
        for o in &left_out {
            let why = KUBE_SIM_LEFT_OUT
                .iter()
                .find(|(k, _)| *k == kind_of(o))
                .map(|(_, why)| why)
                .unwrap_or_else(|| {
                    panic!(
                        "{t}: kube-sim does not serve {}; say why in KUBE_SIM_LEFT_OUT",
                        kind_of(o)
                    )
                });
            eprintln!(
                "{t}: not created in kube-sim: {} {} ({why})",
                kind_of(o),
                name_of(o)
            );
        }

        // The two pods the Deployment would create, as its ReplicaSet would.
        let d = r.one("Deployment", NAME);
        let pods: Vec<Value> = ["a", "b"]
            .iter()
            .map(|s| {
                json!({
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": format!("{NAME}-{s}"),
                        "namespace": NAMESPACE,
                        "labels": r.pod_labels(),
                    },
                    "spec": d["spec"]["template"]["spec"],
                })
            })
            .collect();
        let mut all: Vec<&Value> = create.clone();
        all.extend(&pods);
        let file = crate::temp_file(
            &format!("kube-sim-{}.yaml", file_name(t)),
            &yaml_stream(&all),
        );
        let out = k.ok(&["create", "-f", file.to_str().unwrap()]);
        for o in &all {
            assert!(
                out.contains(&format!("{} created", printed_name(o))),
                "{t}: {} not created:\n{out}",
                printed_name(o)
            );
        }
        let kinds: BTreeSet<&str> = create.iter().map(|o| kind_of(o)).collect();
        assert!(
            kinds.contains("ConfigMap") && kinds.contains("PodDisruptionBudget"),
            "{t}: {kinds:?}"
        );

        // Stored as rendered.
        let stored: Value = serde_json::from_str(&k.ok(&[
            "get",
            "configmap",
            "gpu-node-autoscaler-policy",
            "-n",
            NAMESPACE,
            "-o",
            "json",
        ]))
        .unwrap();
        assert_eq!(
            stored["data"],
            r.one("ConfigMap", "gpu-node-autoscaler-policy")["data"],
            "{t}"
        );

        // The PodDisruptionBudget protects these pods: with both Ready one may be evicted, the
        // last one may not.
        for p in &pods {
            k.ok(&[
                "patch",
                "pod",
                name_of(p),
                "-n",
                NAMESPACE,
                "--subresource=status",
                "--type=merge",
                "-p",
                r#"{"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True"}]}}"#,
            ]);
        }
        let evict = |pod: &str| {
            let body = json!({"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": pod, "namespace": NAMESPACE}});
            let f = crate::temp_file(
                &format!("eviction-{}-{pod}.json", file_name(t)),
                &body.to_string(),
            );
            k.run(&[
                "create",
                "--raw",
                &format!("/api/v1/namespaces/{NAMESPACE}/pods/{pod}/eviction"),
                "-f",
                f.to_str().unwrap(),
            ])
        };
        let first = evict(name_of(&pods[0]));
        assert!(
            first.status.success(),
            "{t}: {}",
            String::from_utf8_lossy(&first.stderr)
        );
        let second = evict(name_of(&pods[1]));
        let err = String::from_utf8_lossy(&second.stderr);
        assert!(
            !second.status.success() && err.contains("disruption budget"),
            "{t}: the last replica was evicted: {err}"
        );
    }
}

/// The image's build (the Dockerfile's features) links neither the simulator's charts nor its
/// progress bars.
#[test]
fn the_controller_build_links_no_plotting_or_progress_bars() {
    let tree = crate::cargo(&[
        "tree",
        "--locked",
        "--offline",
        "-p",
        "gpu-node-autoscaler",
        "--no-default-features",
        "--features",
        "controller,alibaba",
        "-e",
        "normal",
        "--prefix",
        "none",
    ]);
    let names: BTreeSet<&str> = tree
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(
        names.contains("kube") && names.contains("aws-sdk-ec2"),
        "{tree}"
    );
    for absent in ["plotters", "indicatif", "gpu-node-autoscaler-sim"] {
        assert!(
            !names.contains(absent),
            "the controller's build links {absent}"
        );
    }
}

#[test]
fn the_dockerfile_builds_what_the_deployment_runs() {
    let docker = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    let froms: Vec<&str> = docker
        .lines()
        .filter_map(|l| l.strip_prefix("FROM "))
        .collect();
    assert_eq!(froms.len(), 2, "a build stage and a runtime stage");
    // The builder uses the workspace's toolchain.
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let rust_version = manifest
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = "))
        .expect("rust-version")
        .trim_matches('"');
    assert!(
        froms[0].starts_with(&format!("rust:{rust_version}-")),
        "{}",
        froms[0]
    );
    // The image is the controller's: `run` with both clouds, without the simulator (the default
    // build is `simulate` only).
    assert!(docker.contains(
        "cargo build --release --locked --bin gpu-node-autoscaler \\\n        --no-default-features --features controller,alibaba"
    ));
    assert!(froms[1].starts_with("gcr.io/distroless/") && froms[1].contains(":nonroot"));
    // The image's user is the one the pod runs as (runAsNonRoot needs a numeric, non-zero uid).
    let user = docker
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("USER");
    let uid: i64 = user
        .split(':')
        .next()
        .unwrap()
        .parse()
        .expect("numeric USER");
    let base = kustomize(&deploy_dir().join("base"));
    let d = base.iter().find(|o| kind_of(o) == "Deployment").unwrap();
    assert_eq!(
        d["spec"]["template"]["spec"]["securityContext"]["runAsUser"],
        uid
    );
    assert!(uid > 0);
    // Multi-arch: no architecture is named outside comments, no stage is pinned to a platform,
    // and each target platform builds in a target directory of its own.
    let code: Vec<&str> = docker.lines().filter(|l| !l.starts_with('#')).collect();
    for l in &code {
        for arch in ["amd64", "arm64", "x86_64", "aarch64", "--platform"] {
            assert!(!l.contains(arch), "the Dockerfile names {arch}: {l}");
        }
    }
    assert!(code.contains(&"ARG TARGETPLATFORM"), "{docker}");
    let target_cache = code
        .iter()
        .find(|l| l.contains("--mount=type=cache,target=/src/target"))
        .expect("a cached target directory");
    assert!(target_cache.contains(",id=") && target_cache.contains("$TARGETPLATFORM"));
    let build = "docker buildx build --platform linux/amd64,linux/arm64 ";
    assert!(
        docker.contains(build),
        "the Dockerfile does not say how to build both"
    );
    let operations = std::fs::read_to_string(root().join("docs/operations.md")).unwrap();
    assert!(operations.contains(build), "docs/operations.md: no {build}");
    let ignore = std::fs::read_to_string(root().join(".dockerignore")).unwrap();
    assert!(
        ignore.lines().any(|l| l == "target"),
        ".dockerignore must leave out target"
    );
}

/// Ends the controller process this test started, also when the test fails.
#[cfg(feature = "controller")]
struct Started(std::process::Child);

#[cfg(feature = "controller")]
impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `GET path` on the controller's HTTP port: (status, body).
#[cfg(feature = "controller")]
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .ok()?;
    write!(s, "GET {path} HTTP/1.0\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let status = text.split(' ').nth(1)?.parse().ok()?;
    Some((status, text.split_once("\r\n\r\n")?.1.to_string()))
}

/// The series names `/metrics` declares (`# TYPE name kind`): counters as `name_total`,
/// histograms under their own name.
#[cfg(feature = "controller")]
fn exported_metrics(body: &str) -> BTreeSet<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(name, kind)| match kind {
            "counter" => format!("{}_total", name.trim_end_matches("_total")),
            _ => name.to_string(),
        })
        .collect()
}

#[cfg(feature = "controller")]
#[test]
fn the_controller_runs_with_the_dry_run_overlays_arguments_and_policy() {
    let r = Rendered {
        target: "overlays/dry-run",
        objects: kustomize(&deploy_dir().join("overlays/dry-run")),
    };
    let addr = kube_sim::spawn_background(kube_sim::Config::api_only()).expect("kube-sim");
    let k = Kubectl::new(addr);
    // The objects the controller reads and writes, as deploy/ ships them.
    let shipped = [
        r.one("ConfigMap", "gpu-node-autoscaler-policy"),
        r.one("ConfigMap", "gpu-node-autoscaler-status"),
        r.one("Lease", NAME),
    ];
    let file = crate::temp_file("controller-policy.yaml", &yaml_stream(&shipped));
    k.ok(&["create", "-f", file.to_str().unwrap()]);
    let kubeconfig = crate::temp_file(
        "controller-kubeconfig",
        &format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: sim, cluster: {{server: \"http://{addr}\"}}}}]\n\
             users: [{{name: sim, user: {{}}}}]\ncontexts: [{{name: sim, context: {{cluster: sim, user: sim}}}}]\n\
             current-context: sim\n"
        ),
    );

    // The container's arguments and environment as the Deployment gives them; only the listen
    // address moves to a free loopback port.
    let c = &r.one("Deployment", NAME)["spec"]["template"]["spec"]["containers"][0];
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("--listen=127.0.0.1:{port}");
    let args: Vec<&str> = strings(&c["args"])
        .into_iter()
        .map(|a| {
            if a.starts_with("--listen=") {
                listen.as_str()
            } else {
                a
            }
        })
        .collect();
    let identity = "gpu-node-autoscaler-7d9f8-x2k4q";
    let log = kubeconfig.with_file_name("controller.log");
    let mut cmd = crate::bin();
    cmd.args(&args)
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    for e in c["env"].as_array().expect("env") {
        let name = e["name"].as_str().unwrap();
        match (e["value"].as_str(), name) {
            (Some(v), _) => cmd.env(name, v),
            (None, "POD_NAME") => cmd.env(name, identity),
            _ => panic!("unexpected env {e}"),
        };
    }
    let mut controller = Started(cmd.spawn().expect("gpu-node-autoscaler"));

    // Ready, leading, and running the policy of the ConfigMap (polled; nothing is timed).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let body = get(port, "/readyz")
            .filter(|(s, _)| *s == 200)
            .and_then(|_| get(port, "/metrics"))
            .map(|(_, b)| b)
            .unwrap_or_default();
        if ["leader", "policy_valid"].iter().all(|m| {
            body.lines()
                .any(|l| l == format!("gpu_node_autoscaler_{m} 1"))
        }) {
            break;
        }
        let log = || std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(exit) = controller.0.try_wait().unwrap() {
            panic!("the controller exited ({exit}):\n{}", log());
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the controller did not become ready, leader and policy-valid:\n{body}\n{}",
            log()
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert_eq!(get(port, "/healthz").map(|(s, _)| s), Some(200));

    // The Lease and the status ConfigMap it writes are the ones the Role names.
    let holder = k.ok(&[
        "get",
        "lease",
        NAME,
        "-n",
        NAMESPACE,
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ]);
    assert_eq!(holder, identity);
    let role = r.one("Role", NAME);
    let names: BTreeSet<&str> = role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|rule| strings(&rule["resourceNames"]))
        .collect();
    assert!(names.contains(NAME));
    let status_cm = "gpu-node-autoscaler-status";
    assert!(names.contains(status_cm));
    let status = loop {
        let out = k.run(&[
            "get",
            "configmap",
            status_cm,
            "-n",
            NAMESPACE,
            "-o",
            "jsonpath={.data.status}",
        ]);
        // Shipped empty: polled until the controller wrote it.
        if out.status.success() && !out.stdout.is_empty() {
            break String::from_utf8_lossy(&out.stdout).into_owned();
        }
        assert!(std::time::Instant::now() < deadline, "no status written");
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert!(status.contains("DRY RUN"), "{status}");
}

#[cfg(feature = "controller")]
#[test]
fn the_alerts_and_the_dashboard_read_metrics_the_controller_exports() {
    use gpu_node_autoscaler::controller::metrics::{
        EvictionResult, FailedLaunch, Metrics, PoolCapacity, PoolLabel, ReadResult, Replaced,
    };
    let m = Metrics::new();
    // A sample in every labelled family: an empty family is not written out.
    let pool = || PoolLabel {
        pool: "a10g".into(),
    };
    let capacity = || PoolCapacity {
        pool: "a10g".into(),
        capacity_type: "spot".into(),
    };
    m.nodes.get_or_create(&capacity()).set(1);
    m.gpus.get_or_create(&capacity()).set(4);
    m.scale_ups.get_or_create(&pool()).inc();
    m.scale_downs.get_or_create(&pool()).inc();
    m.give_up_terminations_failed.get_or_create(&pool()).inc();
    m.failed_launches
        .get_or_create(&FailedLaunch {
            pool: "a10g".into(),
            reason: "insufficient_capacity".into(),
        })
        .inc();
    m.evictions
        .get_or_create(&EvictionResult {
            result: "blocked".into(),
        })
        .inc();
    m.gpu_metrics_reads
        .get_or_create(&ReadResult {
            result: "error".into(),
        })
        .inc();
    m.pool_max_nodes.get_or_create(&pool()).set(6);
    m.nodes_unneeded.get_or_create(&pool()).set(1);
    m.nodes_replaced
        .get_or_create(&Replaced {
            pool: "a10g".into(),
            cause: "unhealthy".into(),
        })
        .inc();
    m.cloud_call("aws", "launch", std::time::Duration::from_millis(120), "ok");
    let exported = exported_metrics(&m.encode());

    let monitoring = kustomize(&deploy_dir().join("overlays/monitoring"));
    let rules = monitoring
        .iter()
        .find(|o| kind_of(o) == "PrometheusRule")
        .unwrap();
    let dashboard = monitoring
        .iter()
        .find(|o| name_of(o) == "gpu-node-autoscaler-dashboard")
        .unwrap();
    let used = metrics_in(&format!("{rules}{dashboard}"));
    assert!(used.len() >= 10, "{used:?}");
    for m in &used {
        assert!(exported.contains(m), "{m} is not exported: {exported:?}");
    }
}
