//! A real Kubernetes control plane per test: etcd, kube-apiserver (Node and RBAC authorization,
//! ServiceAccount tokens, the `resource.k8s.io` API), kube-controller-manager, kube-scheduler and
//! kwok playing the kubelets of the Nodes the cloud bridge registers — all on loopback ports, in
//! a temporary directory, stopped and removed when the [`Cluster`] is dropped (also when the test
//! fails).
//!
//! The binaries come from `scripts/control-plane.sh` (pinned, built from the Go module proxy into
//! a cache outside the repository): `$GNA_CONTROL_PLANE_BIN`, which `scripts/test.sh` sets, or the
//! script's cache directory. A missing binary fails the test with the command that builds it.
//!
//! Used by the end-to-end tests (`tests/e2e`) and by the side-by-side harness
//! (`simulations/anchors`), which runs each autoscaler on a fresh one.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use gpu_node_autoscaler_core::yaml;

/// The repository's root (this crate is `crates/test-support`).
pub const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
/// kwok's Stages for Nodes and pods (Ready at once; pods Running once bound, completing after
/// their run-duration annotation).
pub const KWOK_STAGES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/kwok-stages.yaml");

/// The admin's static bearer token (group `system:masters`), for the control plane's own
/// components and the tests' kubectl. The controller under test never gets it.
const ADMIN_TOKEN: &str = "gna-e2e-admin-token";
/// The namespace and name of the controller's ServiceAccount in `deploy/`.
pub const CONTROLLER_SA: (&str, &str) = ("kube-system", "gpu-node-autoscaler");
/// The control plane's Kubernetes version (scripts/control-plane.sh).
pub const KUBERNETES_VERSION: &str = "v1.37.2";

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The directory of the control plane's binaries.
fn bin_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = crate::tool_path("GNA_CONTROL_PLANE_BIN", "control-plane.sh", "--print-bin");
        for b in [
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kwok",
        ] {
            assert!(
                dir.join(b).is_file(),
                "{b} is not in {}: the end-to-end tests run against the real control plane; \
                 build it with `bash scripts/control-plane.sh` (scripts/test.sh does)",
                dir.display()
            );
        }
        dir
    })
    .clone()
}

/// The cluster's keys and certificates, in `dir`: a CA, the API server's serving certificate for
/// 127.0.0.1, the ServiceAccount token signing key, and the aggregation layer's front-proxy CA and
/// client certificate.
fn pki(dir: &Path) -> PathBuf {
    {
        let dir = dir.join("pki");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("server.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=critical,CA:FALSE\n\
             keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        // The aggregation layer's client certificate (kube-apiserver to an extension API server
        // such as prometheus-adapter), from a CA of its own, as kubeadm sets it up.
        std::fs::write(
            dir.join("client.ext"),
            "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n\
             extendedKeyUsage=clientAuth\n",
        )
        .unwrap();
        let script = "set -e
openssl ecparam -name prime256v1 -genkey -noout -out ca.key
openssl req -x509 -new -key ca.key -subj /CN=gna-e2e-ca -days 30 -out ca.crt \
  -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
openssl ecparam -name prime256v1 -genkey -noout -out server.key
openssl req -new -key server.key -subj /CN=kube-apiserver -out server.csr
openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 \
  -extfile server.ext -out server.crt 2>/dev/null
openssl ecparam -name prime256v1 -genkey -noout -out sa.key
openssl ec -in sa.key -pubout -out sa.pub 2>/dev/null
openssl ecparam -name prime256v1 -genkey -noout -out front-proxy-ca.key
openssl req -x509 -new -key front-proxy-ca.key -subj /CN=gna-e2e-front-proxy-ca -days 30 \
  -out front-proxy-ca.crt -addext basicConstraints=critical,CA:TRUE \
  -addext keyUsage=critical,keyCertSign,cRLSign
openssl ecparam -name prime256v1 -genkey -noout -out front-proxy-client.key
openssl req -new -key front-proxy-client.key -subj /CN=front-proxy-client -out front-proxy-client.csr
openssl x509 -req -in front-proxy-client.csr -CA front-proxy-ca.crt -CAkey front-proxy-ca.key \
  -CAcreateserial -days 30 -extfile client.ext -out front-proxy-client.crt 2>/dev/null
";
        let out = Command::new("bash")
            .args(["-c", script])
            .current_dir(&dir)
            .output()
            .expect("openssl (the e2e tests make their certificates with it)");
        assert!(
            out.status.success(),
            "making the test certificates with openssl failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        dir
    }
}

/// What a test changes in the cluster's set-up.
#[derive(Default, Clone)]
pub struct ClusterOptions {
    /// Takes the rule of the controller's ClusterRole (from `deploy/`) at this index out, with
    /// the resource it names, e.g. `("pods/eviction", "create")`.
    pub drop_rule: Option<(&'static str, &'static str)>,
    /// The kustomize target under `deploy/` whose RBAC the controller gets (default `base`).
    pub rbac_from: Option<&'static str>,
    /// Take the RBAC from the Helm chart (`deploy/helm/gpu-node-autoscaler`, rendered by
    /// `helm template` in kube-system with these arguments) instead of a kustomize target.
    pub helm_values: Option<Vec<String>>,
    /// kwok's Stages (default [`KWOK_STAGES`]).
    pub kwok_stages: Option<PathBuf>,
    /// No line on stderr when the control plane is up.
    pub quiet: bool,
    /// More flags for kube-controller-manager (e.g. `--node-monitor-period=1s`).
    pub controller_manager_args: Vec<String>,
    /// kube-scheduler's `podInitialBackoffSeconds` and `podMaxBackoffSeconds` (default 1 and 10):
    /// how long a pod that did not fit waits before its next try once the cluster changed.
    pub scheduler_backoff_s: Option<(u32, u32)>,
}

/// The `helm` of the tests: `GNA_HELM_BIN`, else where scripts/helm.sh builds it.
pub fn helm_bin() -> PathBuf {
    let bin = crate::tool_path("GNA_HELM_BIN", "helm.sh", "--print-bin");
    assert!(
        bin.is_file(),
        "{} is missing: build it with `bash scripts/helm.sh` (scripts/test.sh does)",
        bin.display()
    );
    bin
}

/// `helm template` of the chart in kube-system with `values` (arguments of helm): the YAML.
pub fn helm_template(values: &[String]) -> String {
    let out = Command::new(helm_bin())
        .current_dir(REPO)
        .args([
            "template",
            "gpu-node-autoscaler",
            "deploy/helm/gpu-node-autoscaler",
            "-n",
            "kube-system",
        ])
        .args(values)
        .env("KUBECONFIG", "/dev/null")
        .output()
        .expect("run helm");
    assert!(
        out.status.success(),
        "helm template {values:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 from helm template")
}

/// A running control plane.
pub struct Cluster {
    pub dir: PathBuf,
    pub server: String,
    /// kubeconfig of the admin (system:masters).
    pub admin: PathBuf,
    /// kubeconfig with the controller's ServiceAccount token (what `deploy/` grants, no more).
    pub controller: PathBuf,
    controller_token: String,
    pub ca: PathBuf,
    procs: Vec<(&'static str, Child)>,
}

fn kubeconfig(server: &str, ca: &Path, token: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster:\n    server: {server}\n    \
         certificate-authority: {ca}\ncontexts:\n- name: e2e\n  context: {{cluster: e2e, user: u}}\n\
         current-context: e2e\nusers:\n- name: u\n  user:\n    token: {token}\n",
        ca = ca.display()
    )
}

impl Cluster {
    pub fn start(dir: &Path, opts: &ClusterOptions) -> Cluster {
        let started = Instant::now();
        let bin = bin_dir();
        let dir = dir.join("cluster");
        std::fs::create_dir_all(&dir).unwrap();
        let pki = pki(&dir);
        let mut c = Cluster {
            server: String::new(),
            admin: dir.join("admin.kubeconfig"),
            controller: dir.join("controller.kubeconfig"),
            controller_token: String::new(),
            ca: pki.join("ca.crt"),
            dir,
            procs: Vec::new(),
        };

        // etcd, a throwaway single member.
        let (client, peer) = (free_port(), free_port());
        let etcd_url = format!("http://127.0.0.1:{client}");
        c.spawn(
            "etcd",
            Command::new(bin.join("etcd")).args([
                "--name=e2e",
                &format!("--data-dir={}", c.dir.join("etcd").display()),
                &format!("--listen-client-urls={etcd_url}"),
                &format!("--advertise-client-urls={etcd_url}"),
                &format!("--listen-peer-urls=http://127.0.0.1:{peer}"),
                &format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"),
                &format!("--initial-cluster=e2e=http://127.0.0.1:{peer}"),
                "--unsafe-no-fsync",
                "--log-level=warn",
            ]),
        );

        // kube-apiserver.
        let port = free_port();
        c.server = format!("https://127.0.0.1:{port}");
        std::fs::write(
            c.dir.join("tokens.csv"),
            format!("{ADMIN_TOKEN},e2e-admin,e2e-admin,system:masters\n"),
        )
        .unwrap();
        let p = |f: &str| pki.join(f).display().to_string();
        let issuer = "https://kubernetes.default.svc.cluster.local";
        c.spawn(
            "kube-apiserver",
            Command::new(bin.join("kube-apiserver")).args([
                &format!("--etcd-servers={etcd_url}"),
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                &format!("--secure-port={port}"),
                &format!("--tls-cert-file={}", p("server.crt")),
                &format!("--tls-private-key-file={}", p("server.key")),
                &format!("--client-ca-file={}", p("ca.crt")),
                &format!("--token-auth-file={}", c.dir.join("tokens.csv").display()),
                "--authorization-mode=Node,RBAC",
                &format!("--service-account-issuer={issuer}"),
                &format!("--api-audiences={issuer}"),
                &format!("--service-account-key-file={}", p("sa.pub")),
                &format!("--service-account-signing-key-file={}", p("sa.key")),
                "--service-cluster-ip-range=10.96.0.0/16",
                "--runtime-config=resource.k8s.io/v1=true",
                "--endpoint-reconciler-type=none",
                // The aggregation layer (APIServices such as custom.metrics.k8s.io): the
                // front-proxy client certificate and the request headers an extension API server
                // trusts, with kubeadm's names.
                &format!("--requestheader-client-ca-file={}", p("front-proxy-ca.crt")),
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                &format!("--proxy-client-cert-file={}", p("front-proxy-client.crt")),
                &format!("--proxy-client-key-file={}", p("front-proxy-client.key")),
                &format!("--cert-dir={}", c.dir.join("certs").display()),
                "--v=1",
            ]),
        );
        std::fs::write(
            &c.admin,
            kubeconfig(&c.server, &pki.join("ca.crt"), ADMIN_TOKEN),
        )
        .unwrap();
        c.wait("kube-apiserver to be ready", Duration::from_secs(90), |c| {
            c.kubectl(&["get", "--raw", "/readyz"])
                .is_ok_and(|s| s.trim() == "ok")
        });

        // kube-controller-manager: every default controller (disruption, node lifecycle, garbage
        // collector, pod GC, ServiceAccounts and their tokens, Jobs, ReplicaSets, Deployments).
        let admin = c.admin.display().to_string();
        c.spawn(
            "kube-controller-manager",
            Command::new(bin.join("kube-controller-manager"))
                .args([
                    &format!("--kubeconfig={admin}"),
                    "--leader-elect=false",
                    // No serving port of its own (nothing scrapes it here).
                    "--secure-port=0",
                    "--controllers=*",
                    &format!("--root-ca-file={}", p("ca.crt")),
                    "--use-service-account-credentials=false",
                    "--v=1",
                ])
                .args(&opts.controller_manager_args),
        );
        // kube-scheduler, from a KubeSchedulerConfiguration (its --kubeconfig and --leader-elect
        // flags are ignored once --config is given).
        let mut sched = format!(
            "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n\
             clientConnection:\n  kubeconfig: {admin}\nleaderElection:\n  leaderElect: false\n"
        );
        if let Some((initial, max)) = opts.scheduler_backoff_s {
            sched.push_str(&format!(
                "podInitialBackoffSeconds: {initial}\npodMaxBackoffSeconds: {max}\n"
            ));
        }
        let sched_config = c.dir.join("kube-scheduler.yaml");
        std::fs::write(&sched_config, sched).unwrap();
        c.spawn(
            "kube-scheduler",
            Command::new(bin.join("kube-scheduler")).args([
                &format!("--config={}", sched_config.display()),
                "--secure-port=0",
                "--v=1",
            ]),
        );
        // kwok: the kubelets of the Nodes carrying its annotation (what the cloud bridge
        // registers), with the stages in kwok-stages.yaml.
        c.spawn(
            "kwok",
            Command::new(bin.join("kwok"))
                // kwok reads ~/.kwok/kwok.yaml when it exists: a work directory of its own.
                .env("KWOK_WORKDIR", c.dir.join("kwok"))
                .args([
                    &format!("--kubeconfig={admin}"),
                    "--manage-all-nodes=false",
                    "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                    &format!(
                        "--config={}",
                        opts.kwok_stages
                            .clone()
                            .unwrap_or_else(|| PathBuf::from(KWOK_STAGES))
                            .display()
                    ),
                    &format!("--server-address=127.0.0.1:{}", free_port()),
                    // kwok renews each Node's Lease (kube-node-lease) as a kubelet does.
                    "--node-lease-duration-seconds=40",
                ]),
        );

        // Pods need their namespace's default ServiceAccount (the ServiceAccount admission).
        c.wait(
            "the default ServiceAccounts",
            Duration::from_secs(60),
            |c| {
                ["default", "kube-system"].iter().all(|ns| {
                    c.kubectl(&["get", "serviceaccount", "default", "-n", ns])
                        .is_ok()
                })
            },
        );

        c.install_rbac(opts);
        let token = c
            .kubectl(&[
                "create",
                "token",
                CONTROLLER_SA.1,
                "-n",
                CONTROLLER_SA.0,
                "--duration=24h",
            ])
            .unwrap_or_else(|e| panic!("a token for the controller's ServiceAccount: {e}"));
        c.controller_token = token.trim().to_string();
        std::fs::write(
            &c.controller,
            kubeconfig(&c.server, &c.ca, &c.controller_token),
        )
        .unwrap();
        if !opts.quiet {
            eprintln!(
                "e2e: control plane {KUBERNETES_VERSION} up in {:.1} s at {}",
                started.elapsed().as_secs_f64(),
                c.server
            );
        }
        c
    }

    /// The cluster's identity: the kube-system Namespace UID.
    pub fn identity(&self) -> String {
        self.kubectl(&[
            "get",
            "namespace",
            "kube-system",
            "-o",
            "jsonpath={.metadata.uid}",
        ])
        .expect("the kube-system Namespace")
    }

    /// The API server's address.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.server.trim_start_matches("https://").parse().unwrap()
    }

    /// A kubeconfig with the controller's token for another way to the API server (`server`,
    /// e.g. a fault proxy's `http://` address).
    pub fn controller_kubeconfig_via(&self, server: &str) -> PathBuf {
        let f = self.dir.join("controller-via.kubeconfig");
        std::fs::write(&f, kubeconfig(server, &self.ca, &self.controller_token)).unwrap();
        f
    }

    /// A kubeconfig for this cluster with `token` (e.g. another ServiceAccount's), written as
    /// `<name>.kubeconfig` in the cluster's directory.
    pub fn kubeconfig_with_token(&self, name: &str, token: &str) -> PathBuf {
        let f = self.dir.join(format!("{name}.kubeconfig"));
        std::fs::write(&f, kubeconfig(&self.server, &self.ca, token)).unwrap();
        f
    }

    /// The ServiceAccount, ClusterRole, Role and their bindings exactly as `deploy/base` (or
    /// `opts.rbac_from`) renders them (with `kubectl kustomize`), less `opts.drop_rule`, and the
    /// leader-election Lease and status ConfigMap it ships (the Role may not create them).
    fn install_rbac(&self, opts: &ClusterOptions) {
        let target = format!("{REPO}/deploy/{}", opts.rbac_from.unwrap_or("base"));
        let rendered = match &opts.helm_values {
            Some(values) => helm_template(values),
            None => self
                .kubectl(&["kustomize", &target])
                .unwrap_or_else(|e| panic!("kubectl kustomize {target}: {e}")),
        };
        let mut docs = Vec::new();
        for mut v in yaml::parse_all(&rendered).expect("rendered YAML") {
            let kind = v["kind"].as_str().unwrap_or("").to_string();
            let shipped = kind == "Lease"
                || (kind == "ConfigMap"
                    && v["metadata"]["name"].as_str() == Some("gpu-node-autoscaler-status"));
            if !shipped
                && !matches!(
                    kind.as_str(),
                    "ServiceAccount"
                        | "ClusterRole"
                        | "ClusterRoleBinding"
                        | "Role"
                        | "RoleBinding"
                )
            {
                continue;
            }
            if let (Some((resource, verb)), "ClusterRole" | "Role") =
                (opts.drop_rule, kind.as_str())
            {
                for rule in v["rules"].as_array_mut().into_iter().flatten() {
                    let names = |f: &str| -> Vec<String> {
                        rule[f]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(|x| x.as_str().map(str::to_string))
                            .collect()
                    };
                    if names("resources").iter().any(|r| r == resource) {
                        let verbs: Vec<String> =
                            names("verbs").into_iter().filter(|x| x != verb).collect();
                        rule["verbs"] = serde_json::json!(verbs);
                    }
                }
                if let Some(rules) = v["rules"].as_array_mut() {
                    rules.retain(|r| r["verbs"].as_array().is_some_and(|v| !v.is_empty()));
                }
            }
            docs.push(v);
        }
        assert!(
            docs.len() >= 7,
            "deploy/base renders the RBAC objects, the Lease and the status ConfigMap"
        );
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": docs});
        let f = self.dir.join("rbac.json");
        std::fs::write(&f, list.to_string()).unwrap();
        self.kubectl(&["apply", "-f", f.to_str().unwrap()])
            .unwrap_or_else(|e| panic!("applying deploy/'s RBAC, Lease and status ConfigMap: {e}"));
    }

    fn spawn(&mut self, name: &'static str, cmd: &mut Command) {
        let log = std::fs::File::create(self.dir.join(format!("{name}.log"))).unwrap();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        self.procs.push((name, child));
    }

    /// Polls `ok` until it holds; panics with the components' logs after `timeout`, or at once
    /// when a component has exited.
    fn wait(&self, what: &str, timeout: Duration, ok: impl Fn(&Cluster) -> bool) {
        let deadline = Instant::now() + timeout;
        loop {
            if ok(self) {
                return;
            }
            let exited = self.exited();
            if Instant::now() > deadline || exited.is_some() {
                panic!(
                    "waiting for {what}: {}\n{}",
                    exited.map_or("timed out".to_string(), |n| format!("{n} exited")),
                    self.logs(30)
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The first component that is no longer running.
    pub fn exited(&self) -> Option<&'static str> {
        self.procs
            .iter()
            .find(|(_, c)| {
                // Not reaped until the Cluster is dropped: gone, or a zombie, means exited.
                !Path::new(&format!("/proc/{}/status", c.id())).exists()
                    || std::fs::read_to_string(format!("/proc/{}/status", c.id()))
                        .is_ok_and(|s| s.contains("State:\tZ"))
            })
            .map(|(n, _)| *n)
    }

    /// The last `n` lines of every component's log.
    pub fn logs(&self, n: usize) -> String {
        self.procs
            .iter()
            .map(|(name, _)| {
                let text = std::fs::read_to_string(self.dir.join(format!("{name}.log")))
                    .unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                format!(
                    "--- {name}\n{}\n",
                    lines[lines.len().saturating_sub(n)..].join("\n")
                )
            })
            .collect()
    }

    /// kubectl as the admin; stdout, or stderr as the error.
    pub fn kubectl(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new("kubectl")
            .arg(format!("--kubeconfig={}", self.admin.display()))
            .arg(format!(
                "--cache-dir={}",
                self.dir.join("kubectl-cache").display()
            ))
            .args(args)
            .output()
            .map_err(|e| format!("kubectl (scripts/test.sh installs it): {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "kubectl {args:?}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // The components in reverse order of start, kwok and the controllers of the cluster first.
        for (_, c) in self.procs.iter_mut().rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            eprintln!("e2e: control plane logs:\n{}", self.logs(40));
        }
    }
}
