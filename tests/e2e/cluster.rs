//! The real control plane of the end-to-end tests is `gpu_node_autoscaler_test_support::cluster`;
//! here, the cloud bridge's Nodes on it.

use std::path::Path;

use serde_json::Value;

pub use gpu_node_autoscaler_test_support::cluster::*;

/// The cloud bridge's Nodes on the real API server (as the admin, the way a kubelet registers
/// its own Node).
pub struct KubeNodes {
    rt: tokio::runtime::Runtime,
    api: kube::Api<k8s_openapi::api::core::v1::Node>,
}

impl KubeNodes {
    pub fn new(admin_kubeconfig: &Path) -> KubeNodes {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let api = rt.block_on(async {
            let kc = kube::config::Kubeconfig::read_from(admin_kubeconfig).unwrap();
            let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .unwrap();
            kube::Api::all(kube::Client::try_from(config).unwrap())
        });
        KubeNodes { rt, api }
    }
}

impl kube_sim::nodes::NodeApi for KubeNodes {
    fn create_node(&mut self, node: Value) -> Result<(String, String), String> {
        let node = serde_json::from_value(node).map_err(|e| e.to_string())?;
        let n = self
            .rt
            .block_on(self.api.create(&Default::default(), &node))
            .map_err(|e| e.to_string())?;
        Ok((
            n.metadata.name.unwrap_or_default(),
            n.metadata.uid.unwrap_or_default(),
        ))
    }

    fn get_node(&mut self, name: &str) -> Result<Option<Value>, String> {
        let n = self
            .rt
            .block_on(self.api.get_opt(name))
            .map_err(|e| e.to_string())?;
        Ok(n.map(|n| serde_json::to_value(n).unwrap()))
    }

    fn update_node_status(&mut self, name: &str, node: Value) -> Result<(), String> {
        // Only what a device plugin changes: capacity and allocatable (a merge patch, so that
        // kwok's heartbeats in between cause no conflict).
        let patch = serde_json::json!({"status": {
            "capacity": node["status"]["capacity"],
            "allocatable": node["status"]["allocatable"],
        }});
        self.rt
            .block_on(self.api.patch_status(
                name,
                &Default::default(),
                &kube::api::Patch::Merge(patch),
            ))
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// The pod garbage collector of kube-controller-manager removes the Node's pods.
    fn delete_node(&mut self, name: &str, uid: &str) {
        let dp = kube::api::DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: Some(uid.to_string()),
                resource_version: None,
            }),
            ..Default::default()
        };
        if let Err(e) = self.rt.block_on(self.api.delete(name, &dp)) {
            eprintln!("e2e: ec2 bridge: deleting Node {name}: {e}");
        }
    }
}
