//! ProvisioningRequests (`autoscaling.x-k8s.io/v1`, what Kueue's provisioning admission check
//! creates) on the real control plane, with the CRD the Cluster Autoscaler's `apis` module ships
//! at the version Kueue v0.17.0 pins (copied out of the Go module cache by `scripts/kueue.sh`).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::cluster::free_port;
use crate::kwok::kwok_env;
use crate::MIN;

const POLICY: &str = "clusterName: e2e\nzones: [us-east-1a, us-east-1b]\n\
batching: {idle: 1s, max: 3s}\nmaxNodeProvisionTime: 2m\n\
pools:\n- name: kwok-a10g\n  provider: kwok\n  instanceTypes: [g5.12xlarge]\n\
\x20 capacityTypes: [on-demand]\n  maxNodes: 4\n\
\x20 taints:\n  - {key: nvidia.com/gpu, value: \"true\", effect: NoSchedule}\n\
\x20 scaleDown: {cooldownAfterScaleUp: 5s, unneededTime: 5s}\n";

/// Where `scripts/kueue.sh` put Kueue and the CRDs: `$GNA_KUEUE_DIR`, else its cache directory.
/// A missing build fails with the command that makes it.
pub fn kueue_dir() -> PathBuf {
    let dir =
        gpu_node_autoscaler_test_support::tool_path("GNA_KUEUE_DIR", "kueue.sh", "--print-dir");
    assert!(
        dir.join(".complete").is_file(),
        "{} is not a complete Kueue build: run `bash scripts/kueue.sh` (scripts/test.sh does)",
        dir.display()
    );
    dir
}

fn pod_template(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: PodTemplate\nmetadata:\n  name: {name}\n  namespace: team\n\
         template:\n  spec:\n    tolerations:\n    - {{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}}\n\
         \x20   containers:\n    - name: main\n      image: cuda:12\n      resources:\n\
         \x20       requests: {{cpu: \"4\", memory: 16Gi, nvidia.com/gpu: \"4\"}}\n\
         \x20       limits: {{nvidia.com/gpu: \"4\"}}\n"
    )
}

fn request(name: &str, template: &str, count: u32) -> String {
    format!(
        "apiVersion: autoscaling.x-k8s.io/v1\nkind: ProvisioningRequest\nmetadata:\n  name: {name}\n  namespace: team\n\
         spec:\n  provisioningClassName: best-effort-atomic-scale-up.autoscaling.x-k8s.io\n\
         \x20 podSets:\n  - podTemplateRef: {{name: {template}}}\n    count: {count}\n"
    )
}

/// A pod that consumes a request's capacity, as Kueue's pods do.
fn consumer(name: &str, request: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: team\n  annotations:\n\
         \x20   autoscaling.x-k8s.io/consume-provisioning-request: {request}\n\
         \x20   autoscaling.x-k8s.io/provisioning-class-name: best-effort-atomic-scale-up.autoscaling.x-k8s.io\n\
         spec:\n  tolerations:\n  - {{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}}\n\
         \x20 containers:\n  - name: main\n    image: cuda:12\n    resources:\n\
         \x20     requests: {{cpu: \"4\", memory: 16Gi, nvidia.com/gpu: \"4\"}}\n\
         \x20     limits: {{nvidia.com/gpu: \"4\"}}\n"
    )
}

fn condition(r: &Value, kind: &str) -> Option<Value> {
    r["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
        .cloned()
}

#[test]
fn provisioning_request_gets_its_nodes_in_one_zone_at_once_and_one_too_big_fails() {
    let mut env = kwok_env("provisioning-request");
    let crd = kueue_dir().join("crds/provisioningrequests.autoscaling.x-k8s.io.yaml");
    env.kubectl_ok(&["create", "-f", &crd.to_string_lossy()]);
    env.kubectl_ok(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/provisioningrequests.autoscaling.x-k8s.io",
    ]);
    env.create(&env.policy_configmap(POLICY));
    env.create("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: team\n");
    env.start_controller("r1", &["--resync", "5s"]);
    env.wait_for("the controller to become ready", MIN, || {
        env.http_get("r1", "/readyz").filter(|(c, _)| *c == 200)
    });

    // Two 4-GPU pods: two g5.12xlarge, launched together, in one zone; then Provisioned.
    env.create(&pod_template("worker"));
    env.create(&request("job", "worker", 2));
    let provisioned = env.wait_for("the request to be Provisioned", 3 * MIN, || {
        let r = env.get_json(&["get", "provisioningrequest", "-n", "team", "job"]);
        condition(&r, "Provisioned").filter(|c| c["status"] == "True")
    });
    assert_eq!(
        provisioned["reason"], "CapacityIsProvisioned",
        "{provisioned}"
    );
    let r = env.get_json(&["get", "provisioningrequest", "-n", "team", "job"]);
    assert_eq!(
        condition(&r, "Accepted").map(|c| c["status"].clone()),
        Some("True".into()),
        "{r}"
    );
    let nodes = env.wait_for("the two nodes to be registered into the pool", MIN, || {
        Some(env.pool_nodes()).filter(|n| n.len() >= 2)
    });
    assert_eq!(nodes.len(), 2, "two nodes for two pods: {nodes:?}");
    let zones: std::collections::BTreeSet<String> = nodes
        .iter()
        .map(|n| {
            n["metadata"]["labels"]["topology.kubernetes.io/zone"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    assert_eq!(zones.len(), 1, "one zone: {zones:?}");
    let names: std::collections::BTreeSet<String> = nodes
        .iter()
        .map(|n| {
            n["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();

    // The job's pods arrive and run on those nodes; nothing more is launched.
    env.create(&consumer("job-0", "job"));
    env.create(&consumer("job-1", "job"));
    for p in ["job-0", "job-1"] {
        let node = env.wait_for("the job's pod to run", 2 * MIN, || {
            let pod = env.get_json(&["get", "pod", "-n", "team", p]);
            (pod["status"]["phase"] == "Running")
                .then(|| pod["spec"]["nodeName"].as_str().map(str::to_string))
                .flatten()
        });
        assert!(
            names.contains(&node),
            "{p} runs on {node}, not on {names:?}"
        );
    }

    // Three more 4-GPU pods need three nodes; the pool has room for two while the job's nodes
    // are there: not provisioned now (tried again while capacity may free up), none launched.
    env.create(&request("short", "worker", 3));
    let waiting = env.wait_for("the request to be not Provisioned", 2 * MIN, || {
        let r = env.get_json(&["get", "provisioningrequest", "-n", "team", "short"]);
        condition(&r, "Provisioned").filter(|c| c["status"] == "False")
    });
    assert_eq!(waiting["reason"], "CapacityIsNotFound", "{waiting}");
    assert!(
        waiting["message"]
            .as_str()
            .unwrap_or_default()
            .contains("cannot be given nodes all at once now"),
        "{waiting}"
    );
    // Five need more nodes than the pool may ever have (4): Failed, none launched.
    env.create(&request("too-big", "worker", 5));
    let failed = env.wait_for("the request to be Failed", 2 * MIN, || {
        let r = env.get_json(&["get", "provisioningrequest", "-n", "team", "too-big"]);
        condition(&r, "Failed").filter(|c| c["status"] == "True")
    });
    assert_eq!(failed["reason"], "CapacityIsNotFound", "{failed}");
    assert!(
        failed["message"]
            .as_str()
            .unwrap_or_default()
            .contains("even in an empty cluster"),
        "{failed}"
    );
    // Two passes later still nothing launched for either, and the short one is not failed.
    std::thread::sleep(Duration::from_secs(12));
    assert_eq!(
        env.pool_nodes().len(),
        2,
        "nothing launched for the requests without room"
    );
    let r = env.get_json(&["get", "provisioningrequest", "-n", "team", "short"]);
    assert!(condition(&r, "Failed").is_none(), "{r}");
}

/// The real Kueue manager (`scripts/kueue.sh`'s build) as a process of this machine, against the
/// test's API server as its own ServiceAccount. Its webhooks are not registered with the API
/// server (it has no Service network to reach them by; Kueue's Configuration turns its internal
/// certificate management off and its webhook server gets a self-signed pair it serves on a free
/// loopback port, unused), so jobs are created suspended, as Kueue's documentation allows when
/// its mutating webhook is absent. With its certificate management off, Kueue reads its metrics
/// server's pair from the fixed path `/etc/kueue/metrics/certs`: it runs in its own user and mount
/// namespaces (`unshare`) where that directory is the test's, so nothing on the machine is written.
struct Kueue {
    child: std::process::Child,
    dir: PathBuf,
}

impl Kueue {
    fn start(dir: &std::path::Path, kubeconfig: &std::path::Path) -> Kueue {
        let dir = dir.join("kueue");
        let certs = dir.join("etc/kueue/metrics/certs");
        std::fs::create_dir_all(&certs).unwrap();
        let out = Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
            ])
            .args(["-nodes", "-days", "2", "-subj", "/CN=localhost"])
            .args(["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"])
            .arg("-keyout")
            .arg(certs.join("tls.key"))
            .arg("-out")
            .arg(certs.join("tls.crt"))
            .output()
            .expect("openssl");
        assert!(
            out.status.success(),
            "openssl: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let config = format!(
            "apiVersion: config.kueue.x-k8s.io/v1beta2\nkind: Configuration\n\
             namespace: kueue-system\n\
             health:\n  healthProbeBindAddress: 127.0.0.1:{health}\n\
             metrics:\n  bindAddress: 127.0.0.1:{metrics}\n\
             webhook:\n  port: {webhook}\n  host: 127.0.0.1\n  certDir: {certs}\n\
             leaderElection:\n  leaderElect: false\n\
             internalCertManagement:\n  enable: false\n\
             manageJobsWithoutQueueName: false\n\
             featureGates:\n  VisibilityOnDemand: false\n\
             integrations:\n  frameworks: [batch/job]\n",
            health = free_port(),
            metrics = free_port(),
            webhook = free_port(),
            certs = certs.display(),
        );
        let config_file = dir.join("config.yaml");
        std::fs::write(&config_file, config).unwrap();
        let log = std::fs::File::create(dir.join("kueue.log")).unwrap();
        let bin = kueue_dir().join("bin/kueue");
        // `exec`: the process we keep (and end) is Kueue itself.
        let child = Command::new("unshare")
            .args([
                "--user",
                "--map-root-user",
                "--mount",
                "--propagation",
                "private",
            ])
            .args([
                "sh",
                "-c",
                "mount --bind \"$1\" /etc && exec \"$2\" --config=\"$3\" --zap-log-level=3",
                "sh",
            ])
            .arg(dir.join("etc"))
            .arg(bin)
            .arg(&config_file)
            .env("KUBECONFIG", kubeconfig)
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting kueue: {e}"));
        Kueue { child, dir }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("kueue.log")).unwrap_or_default()
    }

    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

impl Drop for Kueue {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = self.log();
            let lines: Vec<&str> = log.lines().collect();
            eprintln!(
                "--- kueue\n{}",
                lines[lines.len().saturating_sub(60)..].join("\n")
            );
        }
    }
}

fn job(name: &str, pods: u32) -> String {
    format!(
        "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: {name}\n  namespace: team\n\
         \x20 labels:\n    kueue.x-k8s.io/queue-name: team-queue\n\
         spec:\n  suspend: true\n  parallelism: {pods}\n  completions: {pods}\n  template:\n    spec:\n\
         \x20     restartPolicy: Never\n\
         \x20     tolerations:\n      - {{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}}\n\
         \x20     containers:\n      - name: main\n        image: cuda:12\n        resources:\n\
         \x20         requests: {{cpu: \"4\", memory: 16Gi, nvidia.com/gpu: \"4\"}}\n\
         \x20         limits: {{nvidia.com/gpu: \"4\"}}\n"
    )
}

const KUEUE_OBJECTS: &str = "apiVersion: kueue.x-k8s.io/v1beta2\nkind: ResourceFlavor\nmetadata:\n  name: gpu\n\
---\napiVersion: kueue.x-k8s.io/v1beta2\nkind: ProvisioningRequestConfig\nmetadata:\n  name: atomic\n\
spec:\n  provisioningClassName: best-effort-atomic-scale-up.autoscaling.x-k8s.io\n\
---\napiVersion: kueue.x-k8s.io/v1beta2\nkind: AdmissionCheck\nmetadata:\n  name: gpu-capacity\n\
spec:\n  controllerName: kueue.x-k8s.io/provisioning-request\n\
\x20 parameters: {apiGroup: kueue.x-k8s.io, kind: ProvisioningRequestConfig, name: atomic}\n\
---\napiVersion: kueue.x-k8s.io/v1beta2\nkind: ClusterQueue\nmetadata:\n  name: gpu\n\
spec:\n  namespaceSelector: {}\n  resourceGroups:\n\
\x20 - coveredResources: [cpu, memory, nvidia.com/gpu]\n    flavors:\n    - name: gpu\n      resources:\n\
\x20     - {name: cpu, nominalQuota: 128}\n      - {name: memory, nominalQuota: 512Gi}\n\
\x20     - {name: nvidia.com/gpu, nominalQuota: 32}\n\
\x20 admissionChecksStrategy:\n    admissionChecks:\n    - name: gpu-capacity\n\
---\napiVersion: kueue.x-k8s.io/v1beta2\nkind: LocalQueue\nmetadata:\n  name: team-queue\n  namespace: team\n\
spec:\n  clusterQueue: gpu\n";

#[test]
fn kueue_admits_a_two_gpu_node_job_once_its_nodes_are_up_in_one_zone_and_not_one_too_big() {
    let mut env = kwok_env("kueue");
    let crds = kueue_dir().join("crds");
    for f in std::fs::read_dir(&crds).unwrap() {
        let f = f.unwrap().path();
        if f.extension().is_some_and(|e| e == "yaml") {
            env.kubectl_ok(&["create", "-f", &f.to_string_lossy()]);
        }
    }
    env.kubectl_ok(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd",
        "--all",
    ]);
    env.create("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: team\n");
    env.create("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: kueue-system\n");
    env.create(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: kueue-controller-manager\n  namespace: kueue-system\n",
    );
    // Kueue's own ClusterRole is several hundred lines of its kustomize output; the test grants
    // its ServiceAccount cluster-admin instead (it is not what is under test here).
    env.kubectl_ok(&[
        "create",
        "clusterrolebinding",
        "kueue-manager",
        "--clusterrole=cluster-admin",
        "--serviceaccount=kueue-system:kueue-controller-manager",
    ]);
    let token = env.kubectl_ok(&[
        "create",
        "token",
        "kueue-controller-manager",
        "-n",
        "kueue-system",
        "--duration=24h",
    ]);
    let kubeconfig = env.cluster.kubeconfig_with_token("kueue", token.trim());
    let mut kueue = Kueue::start(&env.dir, &kubeconfig);
    env.create(&env.policy_configmap(POLICY));
    env.start_controller("r1", &["--resync", "5s"]);
    env.wait_for("the controller to become ready", MIN, || {
        env.http_get("r1", "/readyz").filter(|(c, _)| *c == 200)
    });
    env.create(KUEUE_OBJECTS);
    env.wait_for("Kueue to make the ClusterQueue active", 3 * MIN, || {
        if let Some(s) = kueue.exited() {
            panic!("kueue exited ({s}): {}", kueue.log());
        }
        let cq = env.get_json(&["get", "clusterqueue", "gpu"]);
        condition(&cq, "Active").filter(|c| c["status"] == "True")
    });

    // The job waits, suspended, for its ProvisioningRequest, which Kueue writes and we serve.
    env.create(&job("train", 2));
    let request = env.wait_for(
        "Kueue's ProvisioningRequest to be Provisioned",
        4 * MIN,
        || {
            let list = env.get_json(&["get", "provisioningrequest", "-n", "team"]);
            list["items"].as_array()?.iter().find_map(|r| {
                condition(r, "Provisioned")
                    .filter(|c| c["status"] == "True")
                    .map(|_| r.clone())
            })
        },
    );
    assert_eq!(
        request["spec"]["provisioningClassName"],
        "best-effort-atomic-scale-up.autoscaling.x-k8s.io",
        "{request}"
    );
    assert_eq!(request["spec"]["podSets"][0]["count"], 2, "{request}");
    let nodes = env.pool_nodes();
    assert_eq!(
        nodes.len(),
        2,
        "two nodes for the job's two pods: {nodes:?}"
    );
    let zones: std::collections::BTreeSet<String> = nodes
        .iter()
        .map(|n| {
            n["metadata"]["labels"]["topology.kubernetes.io/zone"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    assert_eq!(zones.len(), 1, "one zone: {zones:?}");
    let names: std::collections::BTreeSet<String> = nodes
        .iter()
        .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_string))
        .collect();

    // Kueue admits the job (unsuspends it); its two pods run on those two nodes.
    env.wait_for("Kueue to admit (unsuspend) the job", 3 * MIN, || {
        let j = env.get_json(&["get", "job", "-n", "team", "train"]);
        (j["spec"]["suspend"] == false).then_some(())
    });
    let ran = env.wait_for("the job's two pods to run", 3 * MIN, || {
        let pods = env.get_json(&["get", "pods", "-n", "team", "-l", "job-name=train"]);
        let running: Vec<(String, String)> = pods["items"]
            .as_array()?
            .iter()
            .filter(|p| p["status"]["phase"] == "Running")
            .filter_map(|p| {
                Some((
                    p["metadata"]["annotations"]
                        ["autoscaling.x-k8s.io/consume-provisioning-request"]
                        .as_str()?
                        .to_string(),
                    p["spec"]["nodeName"].as_str()?.to_string(),
                ))
            })
            .collect();
        (running.len() == 2).then_some(running)
    });
    for (consumes, node) in &ran {
        assert_eq!(consumes, request["metadata"]["name"].as_str().unwrap());
        assert!(
            names.contains(node),
            "a pod runs on {node}, not on {names:?}"
        );
    }
    let distinct: std::collections::BTreeSet<&String> = ran.iter().map(|(_, n)| n).collect();
    assert_eq!(distinct.len(), 2, "one pod per node: {ran:?}");
    assert_eq!(env.pool_nodes().len(), 2, "nothing more launched");

    // A job of three more 4-GPU pods: the pool (4 nodes at most) has room for two while the
    // first job's nodes are there. Kueue's request for it is not Provisioned (tried again while
    // capacity may free up), nothing is launched, and the job is not admitted.
    env.create(&job("too-big", 3));
    let waiting = env.wait_for(
        "Kueue's request for the big job to be not Provisioned",
        4 * MIN,
        || {
            let list = env.get_json(&["get", "provisioningrequest", "-n", "team"]);
            list["items"].as_array()?.iter().find_map(|r| {
                r["metadata"]["name"]
                    .as_str()?
                    .contains("too-big")
                    .then(|| condition(r, "Provisioned"))
                    .flatten()
                    .filter(|c| c["status"] == "False" && c["reason"] == "CapacityIsNotFound")
            })
        },
    );
    assert!(
        waiting["message"]
            .as_str()
            .unwrap_or_default()
            .contains("tried again"),
        "{waiting}"
    );
    // Two passes later still nothing launched, and the job still suspended.
    std::thread::sleep(Duration::from_secs(12));
    assert_eq!(
        env.pool_nodes().len(),
        2,
        "nothing launched for the big job"
    );
    let j = env.get_json(&["get", "job", "-n", "team", "too-big"]);
    assert_eq!(
        j["spec"]["suspend"], true,
        "the big job is not admitted: {j}"
    );
    assert!(kueue.exited().is_none(), "kueue still runs");
}

/// The ProvisioningRequest CRD installed after the controller started (Kueue installed later):
/// the controller finds it in discovery, watches the requests and provisions them, without a
/// restart.
#[test]
fn provisioning_request_crd_installed_after_start_is_watched_and_served() {
    let mut env = kwok_env("provisioning-request-late-crd");
    env.create(&env.policy_configmap(POLICY));
    env.create("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: team\n");
    env.start_controller("r1", &["--resync", "5s"]);
    env.wait_for("the controller to become ready", MIN, || {
        env.http_get("r1", "/readyz").filter(|(c, _)| *c == 200)
    });
    // A pass or two without the API.
    std::thread::sleep(Duration::from_secs(8));

    let crd = kueue_dir().join("crds/provisioningrequests.autoscaling.x-k8s.io.yaml");
    env.kubectl_ok(&["create", "-f", &crd.to_string_lossy()]);
    env.kubectl_ok(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/provisioningrequests.autoscaling.x-k8s.io",
    ]);
    env.create(&pod_template("worker"));
    env.create(&request("late", "worker", 2));
    let provisioned = env.wait_for("the request to be Provisioned", 4 * MIN, || {
        let r = env.get_json(&["get", "provisioningrequest", "-n", "team", "late"]);
        condition(&r, "Provisioned").filter(|c| c["status"] == "True")
    });
    assert_eq!(
        provisioned["reason"], "CapacityIsProvisioned",
        "{provisioned}"
    );
    let nodes = env.wait_for("the two nodes to be registered into the pool", MIN, || {
        Some(env.pool_nodes()).filter(|n| n.len() >= 2)
    });
    assert_eq!(nodes.len(), 2, "two nodes for two pods: {nodes:?}");
    // The controller says so in its log.
    let log = env.log("r1");
    assert!(
        log.contains("serves ProvisioningRequests (autoscaling.x-k8s.io/v1) now"),
        "{log}"
    );
}
