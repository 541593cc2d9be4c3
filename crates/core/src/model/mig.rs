//! MIG as the hardware has it: the GPU-instance profiles each MIG-capable GPU offers (what
//! `nvidia-smi mig -lgip` lists), how many of each fit, the compute and memory slices each takes,
//! its memory as NVML reports it, its multiprocessors and engines, and where on the GPU it may be
//! placed (`nvidia-smi mig -lgipp`). A layout is valid on a GPU when every profile is one the GPU
//! offers, no profile is over its maximum, and the instances can all be placed at once: each
//! takes its memory slices at one of its placements without overlapping another, and their
//! compute slices add up to at most the GPU's.
//!
//! Each table names its source; see docs/mig.md for the tables in full.

use std::collections::BTreeMap;
use std::fmt;

/// One GPU-instance profile of a GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MigProfileSpec {
    /// As `nvidia-smi` prints it and the device plugin advertises it (`nvidia.com/mig-<name>`).
    pub name: &'static str,
    /// Most instances of it on one GPU.
    pub max_per_gpu: u32,
    pub compute_slices: u32,
    pub memory_slices: u32,
    /// Its memory as NVML reports it (`nvidia-smi mig -lgip`'s column, in MiB), where a
    /// reading was found: it changes a little with the driver (the newest reading found).
    pub memory_mib: Option<u64>,
    /// Its multiprocessors and engines, where a reading was found.
    pub units: Option<Units>,
    /// The memory slices an instance may start at; it takes `memory_slices` from there.
    pub placements: &'static [u32],
}

/// What a GPU instance holds besides memory, as NVML's `GpuInstanceProfileInfo` counts it (and
/// NVIDIA's DRA driver publishes it: `multiprocessors`, `copyEngines`, `decoders`, `encoders`,
/// `jpegEngines`, `ofaEngines`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Units {
    pub multiprocessors: u32,
    pub copy_engines: u32,
    pub decoders: u32,
    pub encoders: u32,
    pub jpeg_engines: u32,
    pub ofa_engines: u32,
}

/// A MIG-capable GPU and the profiles it offers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MigGpu {
    /// The product name NVML reports.
    pub product: &'static str,
    pub compute_slices: u32,
    pub memory_slices: u32,
    pub profiles: &'static [MigProfileSpec],
    /// Where the table comes from.
    pub source: &'static str,
}

impl MigGpu {
    pub fn profile(&self, name: &str) -> Option<&'static MigProfileSpec> {
        self.profiles.iter().find(|p| p.name == name)
    }

    /// The names of its profiles, for messages: `1g.10gb, 1g.10gb+me, ...`.
    pub fn profile_names(&self) -> String {
        self.profiles
            .iter()
            .map(|p| p.name)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Checks `layout` (profile → instances per GPU) on this GPU.
    pub fn check(&self, layout: &BTreeMap<String, u32>) -> Result<(), LayoutError> {
        let mut instances: Vec<&MigProfileSpec> = Vec::new();
        for (name, n) in layout {
            let Some(p) = self.profile(name) else {
                return Err(LayoutError::UnknownProfile {
                    profile: name.clone(),
                });
            };
            if *n > p.max_per_gpu {
                return Err(LayoutError::TooMany {
                    profile: name.clone(),
                    count: *n,
                    max: p.max_per_gpu,
                });
            }
            instances.extend(std::iter::repeat_n(p, *n as usize));
        }
        let compute: u32 = instances.iter().map(|p| p.compute_slices).sum();
        if compute > self.compute_slices {
            return Err(LayoutError::Compute {
                used: compute,
                has: self.compute_slices,
            });
        }
        let memory: u32 = instances.iter().map(|p| p.memory_slices).sum();
        if memory > self.memory_slices {
            return Err(LayoutError::Memory {
                used: memory,
                has: self.memory_slices,
            });
        }
        // The largest first: they have the fewest placements.
        instances.sort_by_key(|p| std::cmp::Reverse((p.memory_slices, p.compute_slices)));
        if place(&instances, 0u32) {
            Ok(())
        } else {
            Err(LayoutError::NoPlacement)
        }
    }
}

/// Whether `instances` can take memory slices at their placements without overlap, `used` the
/// slices taken so far (a bit each).
fn place(instances: &[&MigProfileSpec], used: u32) -> bool {
    let Some((p, rest)) = instances.split_first() else {
        return true;
    };
    let mask = (1u32 << p.memory_slices) - 1;
    p.placements.iter().any(|&start| {
        let m = mask << start;
        used & m == 0 && place(rest, used | m)
    })
}

/// Why a layout does not fit a GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LayoutError {
    UnknownProfile {
        profile: String,
    },
    TooMany {
        profile: String,
        count: u32,
        max: u32,
    },
    Compute {
        used: u32,
        has: u32,
    },
    Memory {
        used: u32,
        has: u32,
    },
    NoPlacement,
}

impl fmt::Display for LayoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LayoutError::UnknownProfile { profile } => write!(f, "no MIG profile {profile}"),
            LayoutError::TooMany {
                profile,
                count,
                max,
            } => write!(f, "{count} × {profile}, at most {max} fit on one GPU"),
            LayoutError::Compute { used, has } => {
                write!(
                    f,
                    "the layout takes {used} compute slices, the GPU has {has}"
                )
            }
            LayoutError::Memory { used, has } => {
                write!(
                    f,
                    "the layout takes {used} memory slices, the GPU has {has}"
                )
            }
            LayoutError::NoPlacement => write!(
                f,
                "the instances cannot be placed on one GPU together (their memory slices overlap \
                 at every placement)"
            ),
        }
    }
}

/// The MIG table of a catalog GPU model with `memory_mib` per GPU, where known.
pub fn mig_gpu(model: &str, memory_mib: u64) -> Option<&'static MigGpu> {
    let gib = memory_mib.div_ceil(1024);
    Some(match model {
        "A100" if gib > 40 => &A100_80GB,
        "A100" => &A100_40GB,
        "A30" => &A30,
        "H100" if gib > 80 => &H100_94GB,
        "H100" => &H100_80GB,
        "H200" => &H200,
        "GH200" if gib <= 96 => &GH200,
        "B200" => &B200,
        _ => return None,
    })
}

/// Every table, for tests and docs.
pub static ALL: &[&MigGpu] = &[
    &A100_40GB, &A100_80GB, &A30, &H100_80GB, &H100_94GB, &H200, &GH200, &B200,
];

pub static A100_40GB: MigGpu = MigGpu {
    product: "NVIDIA A100-SXM4-40GB",
    compute_slices: 7,
    memory_slices: 8,
    profiles: &[
        MigProfileSpec { name: "1g.5gb", max_per_gpu: 7, compute_slices: 1, memory_slices: 1, memory_mib: Some(4864), units: Some(Units { multiprocessors: 14, copy_engines: 1, decoders: 0, encoders: 0, jpeg_engines: 0, ofa_engines: 0 }), placements: &[0, 1, 2, 3, 4, 5, 6] },
        MigProfileSpec { name: "1g.5gb+me", max_per_gpu: 1, compute_slices: 1, memory_slices: 1, memory_mib: Some(4864), units: Some(Units { multiprocessors: 14, copy_engines: 1, decoders: 1, encoders: 0, jpeg_engines: 1, ofa_engines: 1 }), placements: &[0, 1, 2, 3, 4, 5, 6] },
        MigProfileSpec { name: "1g.10gb", max_per_gpu: 4, compute_slices: 1, memory_slices: 2, memory_mib: Some(9984), units: Some(Units { multiprocessors: 14, copy_engines: 1, decoders: 1, encoders: 0, jpeg_engines: 0, ofa_engines: 0 }), placements: &[0, 2, 4, 6] },
        MigProfileSpec { name: "2g.10gb", max_per_gpu: 3, compute_slices: 2, memory_slices: 2, memory_mib: Some(9984), units: Some(Units { multiprocessors: 28, copy_engines: 2, decoders: 1, encoders: 0, jpeg_engines: 0, ofa_engines: 0 }), placements: &[0, 2, 4] },
        MigProfileSpec { name: "3g.20gb", max_per_gpu: 2, compute_slices: 3, memory_slices: 4, memory_mib: Some(20096), units: Some(Units { multiprocessors: 42, copy_engines: 3, decoders: 2, encoders: 0, jpeg_engines: 0, ofa_engines: 0 }), placements: &[0, 4] },
        MigProfileSpec { name: "4g.20gb", max_per_gpu: 1, compute_slices: 4, memory_slices: 4, memory_mib: Some(20096), units: Some(Units { multiprocessors: 56, copy_engines: 4, decoders: 2, encoders: 0, jpeg_engines: 0, ofa_engines: 0 }), placements: &[0] },
        MigProfileSpec { name: "7g.40gb", max_per_gpu: 1, compute_slices: 7, memory_slices: 8, memory_mib: Some(40448), units: Some(Units { multiprocessors: 98, copy_engines: 7, decoders: 5, encoders: 0, jpeg_engines: 1, ofa_engines: 1 }), placements: &[0] },
    ],
    source: "NVIDIA MIG User Guide, Supported MIG Profiles (docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html); nvidia-smi mig -lgip/-lgipp of A100 40GB (R525+ drivers)",
};

pub static A100_80GB: MigGpu = MigGpu {
    product: "NVIDIA A100-SXM4-80GB",
    compute_slices: 7,
    memory_slices: 8,
    profiles: &[
        MigProfileSpec { name: "1g.10gb", max_per_gpu: 7, compute_slices: 1, memory_slices: 1, memory_mib: Some(9728), units: Some(Units { multiprocessors: 14, copy_engines: 1, decoders: 0, encoders: 0, jpeg_engines: 0, ofa_engines: 0 }), placements: &[0, 1, 2, 3, 4, 5, 6] },
        MigProfileSpec { name: "1g.10gb+me", max_per_gpu: 1, compute_slices: 1, memory_slices: 1, memory_mib: Some(9728), units: Some(Units { multiprocessors: 14, copy_engines: 1, decoders: 1, encoders: 0, jpeg_engines: 1, ofa_engines: 1 }), placements: &[0, 1, 2, 3, 4, 5, 6] },
        MigProfileSpec { name: "1g.20gb", max_per_gpu: 4, compute_slices: 1, memory_slices: 2, memory_mib: None, units: None, placements: &[0, 2, 4, 6] },
        MigProfileSpec { name: "2g.20gb", max_per_gpu: 3, compute_slices: 2, memory_slices: 2, memory_mib: Some(19968), units: Some(Units { multiprocessors: 28, copy_engines: 2, decoders: 1, encoders: 0, jpeg_engines: 0, ofa_engines: 0 }), placements: &[0, 2, 4] },
        MigProfileSpec { name: "3g.40gb", max_per_gpu: 2, compute_slices: 3, memory_slices: 4, memory_mib: Some(40192), units: Some(Units { multiprocessors: 42, copy_engines: 3, decoders: 2, encoders: 0, jpeg_engines: 0, ofa_engines: 0 }), placements: &[0, 4] },
        MigProfileSpec { name: "4g.40gb", max_per_gpu: 1, compute_slices: 4, memory_slices: 4, memory_mib: Some(40192), units: Some(Units { multiprocessors: 56, copy_engines: 4, decoders: 2, encoders: 0, jpeg_engines: 0, ofa_engines: 0 }), placements: &[0] },
        MigProfileSpec { name: "7g.80gb", max_per_gpu: 1, compute_slices: 7, memory_slices: 8, memory_mib: Some(80640), units: Some(Units { multiprocessors: 98, copy_engines: 7, decoders: 5, encoders: 0, jpeg_engines: 1, ofa_engines: 1 }), placements: &[0] },
    ],
    source: "NVIDIA MIG User Guide, Supported MIG Profiles (docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html) (names and fractions); nvidia-smi mig -lgip of A100 80GB (github.com/NVIDIA/mig-parted/issues/97); placements as the A100 40GB's; 1g.20gb's memory and units: no reading found",
};

pub static A30: MigGpu = MigGpu {
    product: "NVIDIA A30",
    compute_slices: 4,
    memory_slices: 4,
    profiles: &[
        MigProfileSpec { name: "1g.6gb", max_per_gpu: 4, compute_slices: 1, memory_slices: 1, memory_mib: Some(5952), units: Some(Units { multiprocessors: 14, copy_engines: 1, decoders: 1, encoders: 0, jpeg_engines: 0, ofa_engines: 0 }), placements: &[0, 1, 2, 3] },
        MigProfileSpec { name: "1g.6gb+me", max_per_gpu: 1, compute_slices: 1, memory_slices: 1, memory_mib: Some(5952), units: Some(Units { multiprocessors: 14, copy_engines: 1, decoders: 1, encoders: 0, jpeg_engines: 1, ofa_engines: 1 }), placements: &[0, 1, 2, 3] },
        MigProfileSpec { name: "2g.12gb", max_per_gpu: 2, compute_slices: 2, memory_slices: 2, memory_mib: Some(11968), units: Some(Units { multiprocessors: 28, copy_engines: 2, decoders: 2, encoders: 0, jpeg_engines: 0, ofa_engines: 0 }), placements: &[0, 2] },
        MigProfileSpec { name: "2g.12gb+me", max_per_gpu: 1, compute_slices: 2, memory_slices: 2, memory_mib: Some(11968), units: Some(Units { multiprocessors: 28, copy_engines: 2, decoders: 2, encoders: 0, jpeg_engines: 1, ofa_engines: 1 }), placements: &[0, 2] },
        MigProfileSpec { name: "4g.24gb", max_per_gpu: 1, compute_slices: 4, memory_slices: 4, memory_mib: Some(24000), units: Some(Units { multiprocessors: 56, copy_engines: 4, decoders: 4, encoders: 0, jpeg_engines: 1, ofa_engines: 1 }), placements: &[0] },
    ],
    source: "NVIDIA MIG User Guide, Supported MIG Profiles (docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html); nvidia-smi mig -lgip/-lgipp of A30 (decoders as the real readings show)",
};

pub static H100_80GB: MigGpu = MigGpu {
    product: "NVIDIA H100 80GB HBM3",
    compute_slices: 7,
    memory_slices: 8,
    profiles: &[
        MigProfileSpec { name: "1g.10gb", max_per_gpu: 7, compute_slices: 1, memory_slices: 1, memory_mib: Some(9984), units: Some(Units { multiprocessors: 16, copy_engines: 1, decoders: 1, encoders: 0, jpeg_engines: 1, ofa_engines: 0 }), placements: &[0, 1, 2, 3, 4, 5, 6] },
        MigProfileSpec { name: "1g.10gb+me", max_per_gpu: 1, compute_slices: 1, memory_slices: 1, memory_mib: Some(9984), units: Some(Units { multiprocessors: 16, copy_engines: 1, decoders: 1, encoders: 0, jpeg_engines: 1, ofa_engines: 1 }), placements: &[0, 1, 2, 3, 4, 5, 6] },
        MigProfileSpec { name: "1g.20gb", max_per_gpu: 4, compute_slices: 1, memory_slices: 2, memory_mib: Some(20096), units: Some(Units { multiprocessors: 26, copy_engines: 1, decoders: 1, encoders: 0, jpeg_engines: 1, ofa_engines: 0 }), placements: &[0, 2, 4, 6] },
        MigProfileSpec { name: "2g.20gb", max_per_gpu: 3, compute_slices: 2, memory_slices: 2, memory_mib: Some(20096), units: Some(Units { multiprocessors: 32, copy_engines: 2, decoders: 2, encoders: 0, jpeg_engines: 2, ofa_engines: 0 }), placements: &[0, 2, 4] },
        MigProfileSpec { name: "3g.40gb", max_per_gpu: 2, compute_slices: 3, memory_slices: 4, memory_mib: Some(40448), units: Some(Units { multiprocessors: 60, copy_engines: 3, decoders: 3, encoders: 0, jpeg_engines: 3, ofa_engines: 0 }), placements: &[0, 4] },
        MigProfileSpec { name: "4g.40gb", max_per_gpu: 1, compute_slices: 4, memory_slices: 4, memory_mib: Some(40448), units: Some(Units { multiprocessors: 64, copy_engines: 4, decoders: 4, encoders: 0, jpeg_engines: 4, ofa_engines: 0 }), placements: &[0] },
        MigProfileSpec { name: "7g.80gb", max_per_gpu: 1, compute_slices: 7, memory_slices: 8, memory_mib: Some(81152), units: Some(Units { multiprocessors: 132, copy_engines: 8, decoders: 7, encoders: 0, jpeg_engines: 7, ofa_engines: 1 }), placements: &[0] },
    ],
    source: "NVML and nvidia-smi mig -lgip/-lgipp on an H100 80GB HBM3 (SXM, driver 580.159.04); engines: NVIDIA MIG User Guide, Supported MIG Profiles (docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html)",
};

pub static H100_94GB: MigGpu = MigGpu {
    product: "NVIDIA H100 NVL",
    compute_slices: 7,
    memory_slices: 8,
    profiles: &[
        MigProfileSpec { name: "1g.12gb", max_per_gpu: 7, compute_slices: 1, memory_slices: 1, memory_mib: Some(11008), units: Some(Units { multiprocessors: 16, copy_engines: 1, decoders: 1, encoders: 0, jpeg_engines: 1, ofa_engines: 0 }), placements: &[0, 1, 2, 3, 4, 5, 6] },
        MigProfileSpec { name: "1g.12gb+me", max_per_gpu: 1, compute_slices: 1, memory_slices: 1, memory_mib: Some(11008), units: Some(Units { multiprocessors: 16, copy_engines: 1, decoders: 1, encoders: 0, jpeg_engines: 1, ofa_engines: 1 }), placements: &[0, 1, 2, 3, 4, 5, 6] },
        MigProfileSpec { name: "1g.24gb", max_per_gpu: 4, compute_slices: 1, memory_slices: 2, memory_mib: Some(22144), units: Some(Units { multiprocessors: 26, copy_engines: 1, decoders: 1, encoders: 0, jpeg_engines: 1, ofa_engines: 0 }), placements: &[0, 2, 4, 6] },
        MigProfileSpec { name: "2g.24gb", max_per_gpu: 3, compute_slices: 2, memory_slices: 2, memory_mib: Some(22144), units: Some(Units { multiprocessors: 32, copy_engines: 2, decoders: 2, encoders: 0, jpeg_engines: 2, ofa_engines: 0 }), placements: &[0, 2, 4] },
        MigProfileSpec { name: "3g.47gb", max_per_gpu: 2, compute_slices: 3, memory_slices: 4, memory_mib: Some(47488), units: Some(Units { multiprocessors: 60, copy_engines: 3, decoders: 3, encoders: 0, jpeg_engines: 3, ofa_engines: 0 }), placements: &[0, 4] },
        MigProfileSpec { name: "4g.47gb", max_per_gpu: 1, compute_slices: 4, memory_slices: 4, memory_mib: Some(47488), units: Some(Units { multiprocessors: 64, copy_engines: 4, decoders: 4, encoders: 0, jpeg_engines: 4, ofa_engines: 0 }), placements: &[0] },
        MigProfileSpec { name: "7g.94gb", max_per_gpu: 1, compute_slices: 7, memory_slices: 8, memory_mib: Some(95360), units: Some(Units { multiprocessors: 132, copy_engines: 8, decoders: 7, encoders: 0, jpeg_engines: 7, ofa_engines: 1 }), placements: &[0] },
    ],
    source: "NVIDIA MIG User Guide, Supported MIG Profiles (docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html); nvidia-smi mig -lgip/-lgipp of H100 NVL (driver 560.35.03)",
};

pub static H200: MigGpu = MigGpu {
    product: "NVIDIA H200",
    compute_slices: 7,
    memory_slices: 8,
    profiles: &[
        MigProfileSpec { name: "1g.18gb", max_per_gpu: 7, compute_slices: 1, memory_slices: 1, memory_mib: Some(16384), units: Some(Units { multiprocessors: 16, copy_engines: 1, decoders: 1, encoders: 0, jpeg_engines: 1, ofa_engines: 0 }), placements: &[0, 1, 2, 3, 4, 5, 6] },
        MigProfileSpec { name: "1g.18gb+me", max_per_gpu: 1, compute_slices: 1, memory_slices: 1, memory_mib: Some(16384), units: Some(Units { multiprocessors: 16, copy_engines: 1, decoders: 1, encoders: 0, jpeg_engines: 1, ofa_engines: 1 }), placements: &[0, 1, 2, 3, 4, 5, 6] },
        MigProfileSpec { name: "1g.35gb", max_per_gpu: 4, compute_slices: 1, memory_slices: 2, memory_mib: Some(33024), units: Some(Units { multiprocessors: 26, copy_engines: 1, decoders: 1, encoders: 0, jpeg_engines: 1, ofa_engines: 0 }), placements: &[0, 2, 4, 6] },
        MigProfileSpec { name: "2g.35gb", max_per_gpu: 3, compute_slices: 2, memory_slices: 2, memory_mib: Some(33024), units: Some(Units { multiprocessors: 32, copy_engines: 2, decoders: 2, encoders: 0, jpeg_engines: 2, ofa_engines: 0 }), placements: &[0, 2, 4] },
        MigProfileSpec { name: "3g.71gb", max_per_gpu: 2, compute_slices: 3, memory_slices: 4, memory_mib: Some(71168), units: Some(Units { multiprocessors: 60, copy_engines: 3, decoders: 3, encoders: 0, jpeg_engines: 3, ofa_engines: 0 }), placements: &[0, 4] },
        MigProfileSpec { name: "4g.71gb", max_per_gpu: 1, compute_slices: 4, memory_slices: 4, memory_mib: Some(71168), units: Some(Units { multiprocessors: 64, copy_engines: 4, decoders: 4, encoders: 0, jpeg_engines: 4, ofa_engines: 0 }), placements: &[0] },
        MigProfileSpec { name: "7g.141gb", max_per_gpu: 1, compute_slices: 7, memory_slices: 8, memory_mib: Some(143104), units: Some(Units { multiprocessors: 132, copy_engines: 8, decoders: 7, encoders: 0, jpeg_engines: 7, ofa_engines: 1 }), placements: &[0] },
    ],
    source: "NVIDIA MIG User Guide, Supported MIG Profiles (docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html); nvidia-smi mig -lgip of H200 (github.com/NVIDIA/mig-parted/issues/120); placements as the H100's (no -lgipp reading found)",
};

pub static GH200: MigGpu = MigGpu {
    product: "NVIDIA GH200 480GB",
    compute_slices: 7,
    memory_slices: 8,
    profiles: &[
        MigProfileSpec { name: "1g.12gb", max_per_gpu: 7, compute_slices: 1, memory_slices: 1, memory_mib: Some(11264), units: Some(Units { multiprocessors: 16, copy_engines: 1, decoders: 1, encoders: 0, jpeg_engines: 1, ofa_engines: 0 }), placements: &[0, 1, 2, 3, 4, 5, 6] },
        MigProfileSpec { name: "1g.12gb+me", max_per_gpu: 1, compute_slices: 1, memory_slices: 1, memory_mib: Some(11264), units: Some(Units { multiprocessors: 16, copy_engines: 1, decoders: 1, encoders: 0, jpeg_engines: 1, ofa_engines: 1 }), placements: &[0, 1, 2, 3, 4, 5, 6] },
        MigProfileSpec { name: "1g.24gb", max_per_gpu: 4, compute_slices: 1, memory_slices: 2, memory_mib: Some(23552), units: Some(Units { multiprocessors: 26, copy_engines: 1, decoders: 1, encoders: 0, jpeg_engines: 1, ofa_engines: 0 }), placements: &[0, 2, 4, 6] },
        MigProfileSpec { name: "2g.24gb", max_per_gpu: 3, compute_slices: 2, memory_slices: 2, memory_mib: Some(23552), units: Some(Units { multiprocessors: 32, copy_engines: 2, decoders: 2, encoders: 0, jpeg_engines: 2, ofa_engines: 0 }), placements: &[0, 2, 4] },
        MigProfileSpec { name: "3g.48gb", max_per_gpu: 2, compute_slices: 3, memory_slices: 4, memory_mib: Some(47616), units: Some(Units { multiprocessors: 60, copy_engines: 3, decoders: 3, encoders: 0, jpeg_engines: 3, ofa_engines: 0 }), placements: &[0, 4] },
        MigProfileSpec { name: "4g.48gb", max_per_gpu: 1, compute_slices: 4, memory_slices: 4, memory_mib: Some(47616), units: Some(Units { multiprocessors: 64, copy_engines: 4, decoders: 4, encoders: 0, jpeg_engines: 4, ofa_engines: 0 }), placements: &[0] },
        MigProfileSpec { name: "7g.96gb", max_per_gpu: 1, compute_slices: 7, memory_slices: 8, memory_mib: Some(95232), units: Some(Units { multiprocessors: 132, copy_engines: 8, decoders: 7, encoders: 0, jpeg_engines: 7, ofa_engines: 1 }), placements: &[0] },
    ],
    source: "NVIDIA MIG User Guide, Supported MIG Profiles (docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html) (H100 96GB on GH200); nvidia-smi mig -lgip of GH200; placements as the H100's (no -lgipp reading found)",
};

pub static B200: MigGpu = MigGpu {
    product: "NVIDIA B200",
    compute_slices: 7,
    memory_slices: 8,
    profiles: &[
        MigProfileSpec { name: "1g.23gb", max_per_gpu: 7, compute_slices: 1, memory_slices: 1, memory_mib: Some(20992), units: Some(Units { multiprocessors: 18, copy_engines: 2, decoders: 1, encoders: 0, jpeg_engines: 1, ofa_engines: 0 }), placements: &[0, 1, 2, 3, 4, 5, 6] },
        MigProfileSpec { name: "1g.23gb+me", max_per_gpu: 1, compute_slices: 1, memory_slices: 1, memory_mib: Some(20992), units: Some(Units { multiprocessors: 18, copy_engines: 2, decoders: 1, encoders: 0, jpeg_engines: 1, ofa_engines: 1 }), placements: &[0, 1, 2, 3, 4, 5, 6] },
        MigProfileSpec { name: "1g.45gb", max_per_gpu: 4, compute_slices: 1, memory_slices: 2, memory_mib: Some(45312), units: Some(Units { multiprocessors: 30, copy_engines: 2, decoders: 1, encoders: 0, jpeg_engines: 1, ofa_engines: 0 }), placements: &[0, 2, 4, 6] },
        MigProfileSpec { name: "2g.45gb", max_per_gpu: 3, compute_slices: 2, memory_slices: 2, memory_mib: Some(45312), units: Some(Units { multiprocessors: 36, copy_engines: 4, decoders: 2, encoders: 0, jpeg_engines: 2, ofa_engines: 0 }), placements: &[0, 2, 4] },
        MigProfileSpec { name: "3g.90gb", max_per_gpu: 2, compute_slices: 3, memory_slices: 4, memory_mib: None, units: None, placements: &[0, 4] },
        MigProfileSpec { name: "4g.90gb", max_per_gpu: 1, compute_slices: 4, memory_slices: 4, memory_mib: None, units: None, placements: &[0] },
        MigProfileSpec { name: "7g.180gb", max_per_gpu: 1, compute_slices: 7, memory_slices: 8, memory_mib: None, units: None, placements: &[0] },
    ],
    source: "NVIDIA MIG User Guide, Supported MIG Profiles (docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html) (names, counts, fractions); nvidia-smi mig -lgip of B200 (github.com/NVIDIA/mig-parted/pull/187); placements as the H100's; 3g.90gb, 4g.90gb and 7g.180gb: no reading of memory or units found",
};

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(pairs: &[(&str, u32)]) -> BTreeMap<String, u32> {
        pairs.iter().map(|(p, n)| (p.to_string(), *n)).collect()
    }

    #[test]
    fn every_row_fits_its_gpu_alone_and_at_its_maximum() {
        for g in ALL {
            let mut names = std::collections::BTreeSet::new();
            for p in g.profiles {
                assert!(names.insert(p.name), "{}: {} twice", g.product, p.name);
                assert!(
                    p.compute_slices >= 1 && p.compute_slices <= g.compute_slices,
                    "{} {}",
                    g.product,
                    p.name
                );
                assert!(p.memory_slices >= 1 && p.memory_slices <= g.memory_slices);
                assert!(p.max_per_gpu >= 1);
                // The name's compute slices are the row's.
                assert!(p.name.starts_with(&format!("{}g.", p.compute_slices)));
                for &start in p.placements {
                    assert!(
                        start + p.memory_slices <= g.memory_slices,
                        "{} {}: placement {start} runs past the GPU",
                        g.product,
                        p.name
                    );
                }
                assert_eq!(g.check(&layout(&[(p.name, p.max_per_gpu)])), Ok(()));
                assert_eq!(
                    g.check(&layout(&[(p.name, p.max_per_gpu + 1)])),
                    Err(LayoutError::TooMany {
                        profile: p.name.into(),
                        count: p.max_per_gpu + 1,
                        max: p.max_per_gpu
                    })
                );
                // Memory grows with the slices taken; the whole GPU's profile has the most.
                if let (Some(m), Some(whole)) = (
                    p.memory_mib,
                    g.profiles
                        .iter()
                        .find(|w| w.memory_slices == g.memory_slices)
                        .and_then(|w| w.memory_mib),
                ) {
                    assert!(m <= whole, "{} {}", g.product, p.name);
                }
            }
            assert!(
                g.profiles
                    .iter()
                    .any(|p| p.compute_slices == g.compute_slices),
                "{}: no profile of the whole GPU",
                g.product
            );
        }
    }

    #[test]
    fn the_documented_combinations_of_an_h100_fit_and_others_do_not() {
        let g = mig_gpu("H100", 81920).unwrap();
        assert_eq!(g.product, "NVIDIA H100 80GB HBM3");
        for ok in [
            &[("1g.10gb", 7)][..],
            &[("7g.80gb", 1)],
            &[("4g.40gb", 1), ("3g.40gb", 1)],
            &[("4g.40gb", 1), ("2g.20gb", 1), ("1g.10gb", 1)],
            &[("4g.40gb", 1), ("1g.10gb", 3)],
            &[("3g.40gb", 2)],
            &[("3g.40gb", 1), ("2g.20gb", 2)],
            &[("3g.40gb", 1), ("2g.20gb", 1), ("1g.10gb", 2)],
            &[("3g.40gb", 1), ("1g.10gb", 4)],
            &[("2g.20gb", 3), ("1g.10gb", 1)],
            &[("2g.20gb", 2), ("1g.10gb", 3)],
            &[("1g.20gb", 4)],
            &[("1g.20gb", 3), ("1g.10gb", 1)],
            &[("1g.10gb+me", 1), ("1g.10gb", 6)],
        ] {
            assert_eq!(g.check(&layout(ok)), Ok(()), "{ok:?}");
        }
        // Eight memory slices: two 3g.40gb take them all.
        assert_eq!(
            g.check(&layout(&[("3g.40gb", 2), ("1g.10gb", 1)])),
            Err(LayoutError::Memory { used: 9, has: 8 })
        );
        assert_eq!(
            g.check(&layout(&[("4g.40gb", 1), ("2g.20gb", 2)])),
            Err(LayoutError::Compute { used: 8, has: 7 })
        );
        // 1g.20gb takes two slices at an even start: after 4g.40gb, slices 6 and 7.
        assert_eq!(
            g.check(&layout(&[("4g.40gb", 1), ("1g.20gb", 1), ("1g.10gb", 2)])),
            Ok(())
        );
        assert_eq!(
            g.check(&layout(&[("1g.5gb", 7)])),
            Err(LayoutError::UnknownProfile {
                profile: "1g.5gb".into()
            })
        );
    }

    #[test]
    fn slices_to_spare_are_not_enough_without_a_placement() {
        const fn spec(name: &'static str, placements: &'static [u32]) -> MigProfileSpec {
            MigProfileSpec {
                name,
                max_per_gpu: 4,
                compute_slices: 1,
                memory_slices: 2,
                memory_mib: None,
                units: None,
                placements,
            }
        }
        static G: MigGpu = MigGpu {
            product: "test",
            compute_slices: 7,
            memory_slices: 8,
            profiles: &[spec("1g.a", &[1]), spec("1g.b", &[0, 2])],
            source: "a test",
        };
        // 1g.a at slice 1 leaves 1g.b no start: 0 and 2 both overlap it.
        assert_eq!(
            G.check(&layout(&[("1g.a", 1), ("1g.b", 1)])),
            Err(LayoutError::NoPlacement)
        );
        assert_eq!(G.check(&layout(&[("1g.b", 2)])), Ok(()));
    }

    /// The tables as docs/mig.md shows them.
    fn markdown() -> String {
        let mut out = String::new();
        for g in ALL {
            out.push_str(&format!(
                "### {}\n\n{} compute slices, {} memory slices. Source: {}.\n\n",
                g.product, g.compute_slices, g.memory_slices, g.source
            ));
            out.push_str(
                "| profile | max per GPU | compute slices | memory slices | memory (MiB) | SMs | \
                 copy engines | decoders | encoders | JPEG | OFA | placements (start slices) |\n",
            );
            out.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
            for p in g.profiles {
                let memory = p.memory_mib.map_or("not found".into(), |m| m.to_string());
                let units = p.units.map_or(vec!["not found".to_string(); 6], |u| {
                    [
                        u.multiprocessors,
                        u.copy_engines,
                        u.decoders,
                        u.encoders,
                        u.jpeg_engines,
                        u.ofa_engines,
                    ]
                    .iter()
                    .map(|n| n.to_string())
                    .collect()
                });
                let placements = p
                    .placements
                    .iter()
                    .map(|n| n.to_string())
                    .collect::<Vec<_>>()
                    .join(", ");
                out.push_str(&format!(
                    "| `{}` | {} | {} | {} | {memory} | {} | {{{placements}}} |\n",
                    p.name,
                    p.max_per_gpu,
                    p.compute_slices,
                    p.memory_slices,
                    units.join(" | ")
                ));
            }
            out.push('\n');
        }
        out
    }

    /// docs/mig.md shows these tables as they are here (`GNA_BLESS=1` writes them there).
    #[test]
    fn docs_mig_shows_the_tables() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/mig.md");
        let doc = std::fs::read_to_string(path).unwrap();
        const MARK: &str = "<!-- tables: generated from crates/core/src/model/mig.rs -->\n";
        let start = doc.find(MARK).expect("docs/mig.md: the tables' mark") + MARK.len();
        let want = markdown();
        if std::env::var_os("GNA_BLESS").is_some() {
            std::fs::write(path, format!("{}{want}", &doc[..start])).unwrap();
            return;
        }
        assert_eq!(
            &doc[start..],
            want,
            "docs/mig.md differs from the tables (GNA_BLESS=1 rewrites it)"
        );
    }

    #[test]
    fn catalog_models_find_their_tables_by_memory() {
        let product = |m: &str, mib: u64| mig_gpu(m, mib).map(|g| g.product);
        assert_eq!(product("A100", 40960), Some("NVIDIA A100-SXM4-40GB"));
        assert_eq!(product("A100", 81920), Some("NVIDIA A100-SXM4-80GB"));
        assert_eq!(product("H100", 81920), Some("NVIDIA H100 80GB HBM3"));
        assert_eq!(product("H100", 96256), Some("NVIDIA H100 NVL"));
        assert_eq!(product("T4", 16384), None);
        assert_eq!(
            product("GH200", 147456),
            None,
            "no table for the 144GB part"
        );
    }
}
