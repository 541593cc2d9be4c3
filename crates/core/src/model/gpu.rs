//! Facts about GPU models: the labels their nodes carry, which vendor makes them, MIG profiles.

use gpu_node_autoscaler_provider::GpuVendor;

/// Guesses the vendor from a catalog model name: AMD Instinct (`MI...`) and Radeon parts are AMD,
/// everything else NVIDIA.
pub fn vendor_of(model: &str) -> GpuVendor {
    let m = model.to_ascii_uppercase();
    if m.starts_with("MI") || m.contains("RADEON") || m.starts_with("V520") {
        GpuVendor::Amd
    } else {
        GpuVendor::Nvidia
    }
}

/// The product name NVIDIA's driver reports for a catalog model (what `nvidia-smi` prints, and
/// the `productName` its DRA driver publishes), from the model name and per-GPU memory.
pub fn nvidia_product_name(model: &str, memory_mib: u64) -> String {
    let gib = memory_mib.div_ceil(1024);
    match model {
        "T4" => "Tesla T4".into(),
        "V100" if gib > 16 => "Tesla V100-SXM2-32GB".into(),
        "V100" => "Tesla V100-SXM2-16GB".into(),
        "K80" => "Tesla K80".into(),
        "M60" => "Tesla M60".into(),
        "A100" if gib > 40 => "NVIDIA A100-SXM4-80GB".into(),
        "A100" => "NVIDIA A100-SXM4-40GB".into(),
        "H100" => "NVIDIA H100 80GB HBM3".into(),
        other => format!("NVIDIA {other}"),
    }
}

/// The `nvidia.com/gpu.product` value GPU feature discovery puts on a node of this model: the
/// product name with spaces as dashes, so pods that select on it match new nodes.
pub fn nvidia_product_label(model: &str, memory_mib: u64) -> String {
    nvidia_product_name(model, memory_mib).replace(' ', "-")
}

/// The `k8s.amazonaws.com/accelerator` value EKS puts on a node of this model.
pub fn aws_accelerator_label(model: &str) -> String {
    let m = model.to_ascii_lowercase();
    match m.as_str() {
        "t4" | "v100" | "k80" | "m60" => format!("nvidia-tesla-{m}"),
        _ => format!("nvidia-{m}"),
    }
}

/// Models whose GPUs can be partitioned with MIG.
pub fn supports_mig(model: &str) -> bool {
    matches!(model, "A100" | "A30" | "H100" | "H200" | "B200" | "GH200")
}

/// A MIG profile such as `1g.5gb`: compute slices and memory in GB.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MigProfile {
    pub compute: u32,
    pub memory_gb: u32,
}

impl MigProfile {
    /// The part of its GPU this profile stands for: its compute slices of the GPU's seven.
    pub fn gpu_share(&self) -> f64 {
        f64::from(self.compute) / f64::from(MIG_COMPUTE_SLICES)
    }
}

/// Parses `<g>g.<m>gb` (the part after `nvidia.com/mig-`), or `<g>g.<m>gb+me` (the profile with
/// the GPU's media extensions, see [`media_extensions`]).
pub fn parse_mig_profile(s: &str) -> Option<MigProfile> {
    let s = s.strip_suffix("+me").unwrap_or(s);
    let (g, rest) = s.split_once("g.")?;
    let m = rest.strip_suffix("gb")?;
    let compute: u32 = g.parse().ok()?;
    let memory_gb: u32 = m.parse().ok()?;
    if compute == 0 || compute > 7 || memory_gb == 0 {
        return None;
    }
    Some(MigProfile { compute, memory_gb })
}

/// Whether a profile is one with the GPU's media extensions (`1g.10gb+me`: the decoders, JPEG
/// and OFA engines of the whole GPU). `+` is not allowed in a Kubernetes resource name, so such
/// an instance is not an extended resource: only a DRA driver publishes it (attribute `profile`).
pub fn media_extensions(profile: &str) -> bool {
    profile.ends_with("+me")
}

/// MIG compute slices on one GPU.
pub const MIG_COMPUTE_SLICES: u32 = 7;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_for_catalog_models() {
        assert_eq!(nvidia_product_label("T4", 15360), "Tesla-T4");
        assert_eq!(nvidia_product_label("A100", 40960), "NVIDIA-A100-SXM4-40GB");
        assert_eq!(nvidia_product_label("A100", 81920), "NVIDIA-A100-SXM4-80GB");
        assert_eq!(nvidia_product_label("A10G", 23028), "NVIDIA-A10G");
        assert_eq!(aws_accelerator_label("T4"), "nvidia-tesla-t4");
        assert_eq!(aws_accelerator_label("A10G"), "nvidia-a10g");
        assert_eq!(vendor_of("MI300X"), GpuVendor::Amd);
        assert_eq!(vendor_of("L40S"), GpuVendor::Nvidia);
    }

    #[test]
    fn mig_profiles() {
        assert_eq!(
            parse_mig_profile("1g.5gb"),
            Some(MigProfile {
                compute: 1,
                memory_gb: 5
            })
        );
        assert_eq!(parse_mig_profile("3g.40gb").unwrap().compute, 3);
        assert_eq!(
            parse_mig_profile("1g.10gb+me"),
            Some(MigProfile {
                compute: 1,
                memory_gb: 10
            })
        );
        assert!(media_extensions("1g.10gb+me") && !media_extensions("1g.10gb"));
        for bad in [
            "1g",
            "g.5gb",
            "8g.80gb",
            "1g.5",
            "0g.5gb",
            "1g.gb",
            "1g.5gb+x",
            "1g.5gb+me+me",
        ] {
            assert_eq!(parse_mig_profile(bad), None, "{bad}");
        }
    }
}
