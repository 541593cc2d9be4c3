//! A stand-in for NVIDIA's DRA driver (`gpu.nvidia.com`) on kwok Nodes, which run no kubelet
//! plugin: the DeviceClasses its Helm chart installs, and the ResourceSlice its kubelet plugin
//! publishes for a Node once it runs, after `cmd/gpu-kubelet-plugin/deviceinfo.go` in
//! NVIDIA/k8s-dra-driver-gpu (attribute names in the driver's domain, memory as NVML reports
//! it). Written from the driver, not from our own prediction of it (`dra::predicted_devices`),
//! so that a test of the prediction can fail. Used by the end-to-end tests and by the `anchors`
//! harness, for every autoscaler alike.

use serde_json::{json, Value};

/// The driver's name, and the domain of its attributes.
pub const DRIVER: &str = "gpu.nvidia.com";

/// NVIDIA's DeviceClasses, as its Helm chart installs them.
pub const DEVICE_CLASSES: &str = "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\n\
metadata: {name: gpu.nvidia.com}\nspec:\n  selectors:\n  - cel: {expression: \"device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'\"}\n\
---\napiVersion: resource.k8s.io/v1\nkind: DeviceClass\n\
metadata: {name: mig.nvidia.com}\nspec:\n  selectors:\n  - cel: {expression: \"device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'\"}\n";

/// The GPUs of an instance type as NVML names them: product name, architecture, CUDA compute
/// capability, memory, count.
fn gpus_of(
    instance_type: &str,
) -> Option<(
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    usize,
)> {
    Some(match instance_type {
        "p5.48xlarge" => ("NVIDIA H100 80GB HBM3", "Hopper", "9.0.0", "81559Mi", 8),
        "p4de.24xlarge" => ("NVIDIA A100-SXM4-80GB", "Ampere", "8.0.0", "81920Mi", 8),
        "p4d.24xlarge" => ("NVIDIA A100-SXM4-40GB", "Ampere", "8.0.0", "40960Mi", 8),
        "g5.xlarge" => ("NVIDIA A10G", "Ampere", "8.6.0", "23028Mi", 1),
        "g5.12xlarge" => ("NVIDIA A10G", "Ampere", "8.6.0", "23028Mi", 4),
        "g6e.xlarge" => ("NVIDIA L40S", "Ada Lovelace", "8.9.0", "46068Mi", 1),
        "g6e.12xlarge" => ("NVIDIA L40S", "Ada Lovelace", "8.9.0", "46068Mi", 4),
        _ => return None,
    })
}

/// A MIG profile of an A100-SXM4-40GB as NVML reports it: profile ID, memory, multiprocessors.
fn mig_profile(profile: &str) -> Option<(u32, &'static str, u32)> {
    Some(match profile {
        "1g.5gb" => (19, "4864Mi", 14),
        _ => return None,
    })
}

/// The devices the driver publishes on `node` of `instance_type`: its whole GPUs, or with a
/// `mig` layout (profile → instances per GPU, as the node's GPUs were partitioned) the MIG
/// devices of every GPU. An error names what the stand-in does not know.
pub fn devices(
    node: &str,
    instance_type: &str,
    mig: Option<&[(String, u32)]>,
) -> Result<Vec<Value>, String> {
    let (product, arch, cc, memory, count) = gpus_of(instance_type).ok_or_else(|| {
        format!("the DRA driver stand-in knows no GPUs of instance type {instance_type:?}")
    })?;
    let common = |v: &mut Value| {
        for (k, x) in [
            ("productName", json!({"string": product})),
            ("brand", json!({"string": "Nvidia"})),
            ("architecture", json!({"string": arch})),
            ("cudaComputeCapability", json!({"version": cc})),
            ("driverVersion", json!({"version": "580.82.7"})),
            ("cudaDriverVersion", json!({"version": "13.0.0"})),
        ] {
            v["attributes"][k] = x;
        }
    };
    let Some(layout) = mig else {
        return Ok((0..count)
            .map(|i| {
                let mut d = json!({
                    "name": format!("gpu-{i}"),
                    "attributes": {
                        "type": {"string": "gpu"},
                        "uuid": {"string": format!("GPU-{node}-{i}")},
                        "index": {"int": i},
                        "minor": {"int": i},
                        "pcieBusID": {"string": format!("0000:{:02x}:00.0", 0x10 + i)},
                    },
                    "capacity": {"memory": {"value": memory}},
                });
                common(&mut d);
                d
            })
            .collect());
    };
    if !product.starts_with("NVIDIA A100-SXM4-40GB") {
        return Err(format!(
            "the DRA driver stand-in knows MIG devices of A100-SXM4-40GB GPUs only, not of {instance_type:?}"
        ));
    }
    let mut out = Vec::new();
    for g in 0..count {
        let mut s = 0;
        for (profile, n) in layout {
            let (id, mem, sms) = mig_profile(profile).ok_or_else(|| {
                format!("the DRA driver stand-in knows no MIG profile {profile:?}")
            })?;
            for _ in 0..*n {
                let mut d = json!({
                    "name": format!("gpu-{g}-mig-{id}-{s}-1"),
                    "attributes": {
                        "type": {"string": "mig"},
                        "uuid": {"string": format!("MIG-{node}-{g}-{s}")},
                        "parentUUID": {"string": format!("GPU-{node}-{g}")},
                        "index": {"int": s},
                        "parentIndex": {"int": g},
                        "profile": {"string": profile},
                    },
                    "capacity": {
                        "memory": {"value": mem},
                        "multiprocessors": {"value": sms.to_string()},
                    },
                });
                common(&mut d);
                out.push(d);
                s += 1;
            }
        }
    }
    Ok(out)
}

/// The ResourceSlice of `node` (its UID makes the Node its owner, as the kubelet plugin sets it,
/// so that it goes with the Node).
pub fn resource_slice(node: &str, node_uid: &str, devices: Vec<Value>) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "name": format!("{node}-{DRIVER}"),
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}],
        },
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    })
}
