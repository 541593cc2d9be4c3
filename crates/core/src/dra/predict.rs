//! The devices a new node will publish in its ResourceSlices, predicted from the catalog (GPU
//! model, count, memory) and the pool's GPU mode (whole GPUs or a MIG layout), with the
//! attribute and capacity names of NVIDIA's DRA driver (`gpu.nvidia.com`): `type` (`gpu` or
//! `mig`), `productName`, `brand`, `architecture`, `cudaComputeCapability` (a version), and
//! for MIG devices `profile`; capacity `memory` (as NVML reports it, see [`nvidia_memory_mib`],
//! and for a MIG device its GPU's table, [`crate::model::mig`]) and for MIG devices
//! `multiprocessors`, `copyEngines`, `decoders`, `encoders`, `jpegEngines` and `ofaEngines`
//! where the table has them. What only the booted node knows (`uuid`, `parentUUID`,
//! `pcieBusID`, driver versions unless the pool's `dra.attributes` names them) is left out, so
//! a selector on it cannot match a node that does not exist yet, and says so.
use std::collections::BTreeMap;

use gpu_node_autoscaler_provider::{GpuVendor, InstanceType};

use crate::model::dra::{AttrValue, Device};
use crate::model::gpu::{nvidia_product_name, parse_mig_profile};
use crate::model::mig::{mig_gpu, Units};
use crate::model::quantity::parse_quantity;
use crate::policy::{DraPool, GpuMode, Pool};

/// Architecture name and CUDA compute capability of a catalog GPU model, where known.
pub fn nvidia_architecture(model: &str) -> Option<(&'static str, &'static str)> {
    Some(match model {
        "K80" => ("Kepler", "3.7.0"),
        "M60" => ("Maxwell", "5.2.0"),
        "V100" => ("Volta", "7.0.0"),
        "T4" => ("Turing", "7.5.0"),
        "A100" | "A30" => ("Ampere", "8.0.0"),
        "A10G" | "A10" | "A40" | "A6000" => ("Ampere", "8.6.0"),
        "L4" | "L40" | "L40S" => ("Ada Lovelace", "8.9.0"),
        "H100" | "H200" | "GH200" => ("Hopper", "9.0.0"),
        "B200" | "GB200" => ("Blackwell", "10.0.0"),
        _ => return None,
    })
}

/// The memory NVML reports for a GPU (what NVIDIA's driver publishes as capacity `memory`) where
/// it differs from the catalog's nominal size: an H100 80GB HBM3 has 81559 MiB, less than 80 GiB.
pub fn nvidia_memory_mib(model: &str, catalog_mib: u64) -> u64 {
    match model {
        "H100" if catalog_mib == 81920 => 81559,
        "H200" if catalog_mib >= 141 * 1024 => 143771,
        _ => catalog_mib,
    }
}

/// Predicted devices of a node of `pool` and instance type `t` (empty for pools without `dra`
/// or instance types without NVIDIA GPUs).
pub fn predicted_devices(pool: &Pool, t: &InstanceType) -> Vec<Device> {
    let (Some(dra), Some(g)) = (&pool.dra, &t.gpu) else {
        return Vec::new();
    };
    if g.vendor != GpuVendor::Nvidia {
        return Vec::new();
    }
    let mut common: BTreeMap<String, AttrValue> = BTreeMap::new();
    common.insert(
        "productName".into(),
        AttrValue::String(nvidia_product_name(&g.model, g.memory_mib)),
    );
    common.insert("brand".into(), AttrValue::String("Nvidia".into()));
    if let Some((arch, cc)) = nvidia_architecture(&g.model) {
        common.insert("architecture".into(), AttrValue::String(arch.into()));
        common.insert(
            "cudaComputeCapability".into(),
            AttrValue::Version(cc.into()),
        );
    }
    let mut out = Vec::new();
    let device = |name: String,
                  mut attrs: BTreeMap<String, AttrValue>,
                  memory: String,
                  units: Option<&Units>,
                  dra: &DraPool|
     -> Device {
        for (k, v) in &dra.attributes {
            attrs.insert(k.clone(), v.clone());
        }
        let mut caps = BTreeMap::new();
        if let Ok(q) = parse_quantity(&memory) {
            caps.insert("memory".to_string(), q);
        }
        if let Some(u) = units {
            for (k, n) in [
                ("multiprocessors", u.multiprocessors),
                ("copyEngines", u.copy_engines),
                ("decoders", u.decoders),
                ("encoders", u.encoders),
                ("jpegEngines", u.jpeg_engines),
                ("ofaEngines", u.ofa_engines),
            ] {
                if let Ok(q) = parse_quantity(&n.to_string()) {
                    caps.insert(k.to_string(), q);
                }
            }
        }
        for (k, q) in &dra.capacity {
            caps.insert(k.clone(), q.clone());
        }
        Device {
            driver: dra.driver.clone(),
            name,
            attributes: BTreeMap::from([(dra.driver.clone(), attrs)]),
            capacity: BTreeMap::from([(dra.driver.clone(), caps)]),
        }
    };
    for i in 0..g.count {
        match &pool.gpu_mode {
            GpuMode::Mig(layout) => {
                for (profile, n) in layout {
                    let Some(p) = parse_mig_profile(profile) else {
                        continue;
                    };
                    // The GPU's table where there is one: memory as NVML reports it, and the
                    // multiprocessors and engines; else the gigabytes of the profile's name.
                    let spec = mig_gpu(&g.model, g.memory_mib).and_then(|t| t.profile(profile));
                    let memory = match spec.and_then(|s| s.memory_mib) {
                        Some(mib) => format!("{mib}Mi"),
                        None => format!("{}G", p.memory_gb),
                    };
                    let units = spec.and_then(|s| s.units.as_ref());
                    for j in 0..*n {
                        let mut attrs = common.clone();
                        attrs.insert("type".into(), AttrValue::String("mig".into()));
                        attrs.insert("profile".into(), AttrValue::String(profile.clone()));
                        out.push(device(
                            format!("gpu-{i}-mig-{profile}-{j}"),
                            attrs,
                            memory.clone(),
                            units,
                            dra,
                        ));
                    }
                }
            }
            _ => {
                let mut attrs = common.clone();
                attrs.insert("type".into(), AttrValue::String("gpu".into()));
                out.push(device(
                    format!("gpu-{i}"),
                    attrs,
                    format!("{}Mi", nvidia_memory_mib(&g.model, g.memory_mib)),
                    None,
                    dra,
                ));
            }
        }
    }
    out
}
