//! Resource vectors: CPU, memory, pods, whole GPUs, MIG slices and any other extended resource,
//! plus shared-GPU shares that must fit on one physical GPU.

use std::fmt;

pub const CPU: &str = "cpu";
pub const MEMORY: &str = "memory";
pub const PODS: &str = "pods";
pub const NVIDIA_GPU: &str = "nvidia.com/gpu";
pub const AMD_GPU: &str = "amd.com/gpu";
pub const MIG_PREFIX: &str = "nvidia.com/mig-";
pub const ALIYUN_GPU_MEM: &str = "aliyun.com/gpu-mem";
pub const ALIYUN_GPU_CORE: &str = "aliyun.com/gpu-core.percentage";
pub const ALIYUN_GPU_COUNT: &str = "aliyun.com/gpu-count";

/// Countable resources. Extended resources other than whole GPUs (MIG slices, RDMA devices, ...)
/// live in `extended`, sorted by name, without zero entries.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Resources {
    pub cpu_milli: i64,
    pub memory: i64,
    pub pods: i64,
    /// Whole `nvidia.com/gpu` devices.
    pub gpu: i64,
    /// Whole `amd.com/gpu` devices.
    pub amd_gpu: i64,
    pub extended: Vec<(String, i64)>,
}

impl Resources {
    pub fn is_zero(&self) -> bool {
        self.cpu_milli == 0
            && self.memory == 0
            && self.pods == 0
            && self.gpu == 0
            && self.amd_gpu == 0
            && self.extended.is_empty()
    }

    /// Amount of a named resource (`cpu` in milli, `memory` in bytes, the rest in units).
    pub fn get(&self, name: &str) -> i64 {
        match name {
            CPU => self.cpu_milli,
            MEMORY => self.memory,
            PODS => self.pods,
            NVIDIA_GPU => self.gpu,
            AMD_GPU => self.amd_gpu,
            _ => self
                .extended
                .binary_search_by(|(n, _)| n.as_str().cmp(name))
                .map(|i| self.extended[i].1)
                .unwrap_or(0),
        }
    }

    /// Sets a named resource (see [`Resources::get`] for units).
    pub fn set(&mut self, name: &str, value: i64) {
        match name {
            CPU => self.cpu_milli = value,
            MEMORY => self.memory = value,
            PODS => self.pods = value,
            NVIDIA_GPU => self.gpu = value,
            AMD_GPU => self.amd_gpu = value,
            _ => match self
                .extended
                .binary_search_by(|(n, _)| n.as_str().cmp(name))
            {
                Ok(i) if value == 0 => {
                    self.extended.remove(i);
                }
                Ok(i) => self.extended[i].1 = value,
                Err(_) if value == 0 => {}
                Err(i) => self.extended.insert(i, (name.to_string(), value)),
            },
        }
    }

    /// Whole GPUs of either vendor.
    pub fn whole_gpus(&self) -> i64 {
        self.gpu + self.amd_gpu
    }

    /// MIG slices requested or offered, as `(profile, count)`, e.g. `("1g.5gb", 2)`.
    pub fn mig_slices(&self) -> impl Iterator<Item = (&str, i64)> {
        self.extended
            .iter()
            .filter_map(|(n, v)| n.strip_prefix(MIG_PREFIX).map(|p| (p, *v)))
    }

    pub fn add(&mut self, other: &Resources) {
        self.add_scaled(other, 1);
    }

    pub fn sub(&mut self, other: &Resources) {
        self.add_scaled(other, -1);
    }

    /// `self += k * other`.
    pub fn add_scaled(&mut self, other: &Resources, k: i64) {
        self.cpu_milli = self
            .cpu_milli
            .saturating_add(other.cpu_milli.saturating_mul(k));
        self.memory = self.memory.saturating_add(other.memory.saturating_mul(k));
        self.pods = self.pods.saturating_add(other.pods.saturating_mul(k));
        self.gpu = self.gpu.saturating_add(other.gpu.saturating_mul(k));
        self.amd_gpu = self.amd_gpu.saturating_add(other.amd_gpu.saturating_mul(k));
        for (name, v) in &other.extended {
            let cur = self.get(name);
            self.set(name, cur.saturating_add(v.saturating_mul(k)));
        }
    }

    /// Whether `self` (a request) fits into `free`.
    pub fn fits_in(&self, free: &Resources) -> bool {
        self.cpu_milli <= free.cpu_milli
            && self.memory <= free.memory
            && self.pods <= free.pods
            && self.gpu <= free.gpu
            && self.amd_gpu <= free.amd_gpu
            && self.extended.iter().all(|(n, v)| *v <= free.get(n))
    }

    /// How many copies of `self` fit into `free` (`i64::MAX` for an all-zero request).
    pub fn copies_in(&self, free: &Resources) -> i64 {
        fn dim(req: i64, free: i64) -> i64 {
            if req <= 0 {
                i64::MAX
            } else if free <= 0 {
                0
            } else {
                free / req
            }
        }
        let mut n = dim(self.cpu_milli, free.cpu_milli)
            .min(dim(self.memory, free.memory))
            .min(dim(self.pods, free.pods))
            .min(dim(self.gpu, free.gpu))
            .min(dim(self.amd_gpu, free.amd_gpu));
        for (name, v) in &self.extended {
            if n == 0 {
                break;
            }
            n = n.min(dim(*v, free.get(name)));
        }
        n
    }

    /// Every dimension that is non-zero in `self`, by name, with its value.
    pub fn dimensions(&self) -> Vec<(&str, i64)> {
        let mut out = Vec::new();
        for (n, v) in [
            (CPU, self.cpu_milli),
            (MEMORY, self.memory),
            (PODS, self.pods),
            (NVIDIA_GPU, self.gpu),
            (AMD_GPU, self.amd_gpu),
        ] {
            if v != 0 {
                out.push((n, v));
            }
        }
        for (n, v) in &self.extended {
            out.push((n.as_str(), *v));
        }
        out
    }

    /// The largest share of `cap` that any resource of these takes: `max(self[r] / cap[r])`
    /// over the resources `cap` has (0 when none). What [`Resources::dimensions`] and
    /// [`Resources::get`] would give, without building the list or matching names.
    pub fn largest_share_of(&self, cap: &Resources) -> f64 {
        let mut s: f64 = 0.0;
        let mut one = |v: i64, c: i64| {
            if v != 0 && c > 0 {
                s = s.max(v as f64 / c as f64);
            }
        };
        one(self.cpu_milli, cap.cpu_milli);
        one(self.memory, cap.memory);
        one(self.pods, cap.pods);
        one(self.gpu, cap.gpu);
        one(self.amd_gpu, cap.amd_gpu);
        for (n, v) in &self.extended {
            one(*v, cap.get(n));
        }
        s
    }

    pub fn has_negative(&self) -> bool {
        self.cpu_milli < 0
            || self.memory < 0
            || self.pods < 0
            || self.gpu < 0
            || self.amd_gpu < 0
            || self.extended.iter().any(|(_, v)| *v < 0)
    }
}

impl fmt::Display for Resources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (n, v) in self.dimensions() {
            if n == PODS {
                continue;
            }
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            match n {
                CPU => write!(f, "cpu={}", format_milli(v))?,
                MEMORY => write!(f, "memory={}", format_bytes(v))?,
                _ => write!(f, "{n}={v}")?,
            }
        }
        if first {
            f.write_str("nothing")?;
        }
        Ok(())
    }
}

fn format_milli(v: i64) -> String {
    if v % 1000 == 0 {
        (v / 1000).to_string()
    } else {
        format!("{v}m")
    }
}

fn format_bytes(v: i64) -> String {
    const GI: i64 = 1 << 30;
    const MI: i64 = 1 << 20;
    if v % GI == 0 {
        format!("{}Gi", v / GI)
    } else if v % MI == 0 {
        format!("{}Mi", v / MI)
    } else {
        v.to_string()
    }
}

/// A shared-GPU request (`aliyun.com/gpu-mem` in GiB, `aliyun.com/gpu-core.percentage` of one
/// GPU): the whole share must come from ONE physical GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GpuShare {
    pub mem_gib: i64,
    pub core_pct: i64,
}

impl GpuShare {
    /// Fraction of one GPU of `gpu_mem_gib` this share takes (the larger of memory and cores).
    pub fn fraction_of(&self, gpu_mem_gib: i64) -> f64 {
        let mem = if gpu_mem_gib > 0 {
            self.mem_gib as f64 / gpu_mem_gib as f64
        } else {
            0.0
        };
        mem.max(self.core_pct as f64 / 100.0)
    }
}

/// What is left of one physical GPU on a shared-GPU node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SharedGpu {
    pub mem_gib: i64,
    pub core_pct: i64,
}

impl SharedGpu {
    pub fn full(mem_gib: i64) -> SharedGpu {
        SharedGpu {
            mem_gib,
            core_pct: 100,
        }
    }

    fn copies(&self, share: &GpuShare) -> i64 {
        let by_mem = if share.mem_gib > 0 {
            self.mem_gib / share.mem_gib
        } else {
            i64::MAX
        };
        let by_core = if share.core_pct > 0 {
            self.core_pct / share.core_pct
        } else {
            i64::MAX
        };
        by_mem.min(by_core).max(0)
    }
}

/// How many copies of `share` fit on these GPUs, each copy on a single GPU.
pub fn share_copies(gpus: &[SharedGpu], share: &GpuShare) -> i64 {
    gpus.iter()
        .map(|g| g.copies(share))
        .fold(0i64, |a, b| a.saturating_add(b))
}

/// Places one share on the GPU it fits most tightly (least memory left after), to keep whole
/// GPUs free for larger shares. Returns the GPU index, or `None` when it fits nowhere.
pub fn place_share(gpus: &mut [SharedGpu], share: &GpuShare) -> Option<usize> {
    let idx = gpus
        .iter()
        .enumerate()
        .filter(|(_, g)| g.copies(share) > 0)
        .min_by_key(|(i, g)| (g.mem_gib - share.mem_gib, g.core_pct - share.core_pct, *i))
        .map(|(i, _)| i)?;
    gpus[idx].mem_gib -= share.mem_gib;
    gpus[idx].core_pct -= share.core_pct;
    Some(idx)
}

/// Places `k` copies of one share, GPU by GPU. Returns how many were placed.
pub fn place_shares(gpus: &mut [SharedGpu], share: &GpuShare, k: i64) -> i64 {
    // Fill the fullest GPUs first (fewest copies) so emptier GPUs stay whole.
    let mut order: Vec<usize> = (0..gpus.len()).collect();
    order.sort_by_key(|&i| (gpus[i].copies(share), i));
    let mut left = k;
    for i in order {
        if left == 0 {
            break;
        }
        let n = gpus[i].copies(share).min(left);
        gpus[i].mem_gib -= n * share.mem_gib;
        gpus[i].core_pct -= n * share.core_pct;
        left -= n;
    }
    k - left
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(cpu: i64, mem_gib: i64, gpu: i64) -> Resources {
        Resources {
            cpu_milli: cpu,
            memory: mem_gib << 30,
            pods: 1,
            gpu,
            ..Default::default()
        }
    }

    #[test]
    fn the_largest_share_is_the_largest_ratio_over_the_resources_the_capacity_has() {
        let mut cap = r(8000, 32, 1);
        cap.pods = 110;
        cap.set("nvidia.com/mig-1g.5gb", 7);
        let mut req = r(2000, 30, 0);
        assert_eq!(req.largest_share_of(&cap), 30.0 / 32.0);
        req.set("nvidia.com/mig-1g.5gb", 7);
        assert_eq!(req.largest_share_of(&cap), 1.0);
        // What the capacity does not have counts for nothing (the packer checks fits apart).
        let mut odd = Resources::default();
        odd.set("example.com/fpga", 2);
        odd.amd_gpu = 1;
        assert_eq!(odd.largest_share_of(&cap), 0.0);
        // The same as the ratio over the listed dimensions.
        for (a, b) in [
            (&req, &cap),
            (&cap, &req),
            (&odd, &cap),
            (&r(1, 1, 1), &r(3, 5, 8)),
        ] {
            let listed = a
                .dimensions()
                .into_iter()
                .filter(|(n, _)| b.get(n) > 0)
                .map(|(n, v)| v as f64 / b.get(n) as f64)
                .fold(0.0, f64::max);
            assert_eq!(a.largest_share_of(b), listed);
        }
    }

    #[test]
    fn extended_resources_stay_sorted_and_drop_zeros() {
        let mut a = Resources::default();
        a.set("nvidia.com/mig-2g.10gb", 3);
        a.set("nvidia.com/mig-1g.5gb", 1);
        assert_eq!(
            a.extended,
            vec![
                ("nvidia.com/mig-1g.5gb".to_string(), 1),
                ("nvidia.com/mig-2g.10gb".to_string(), 3)
            ]
        );
        let b = a.clone();
        a.sub(&b);
        assert!(a.is_zero());
    }

    #[test]
    fn copies_is_the_tightest_dimension() {
        let mut free = r(8000, 64, 4);
        free.pods = 110;
        assert_eq!(r(1000, 8, 1).copies_in(&free), 4);
        assert_eq!(r(3000, 8, 1).copies_in(&free), 2);
        assert_eq!(r(0, 0, 0).copies_in(&free), 110);
        let mut mig = Resources::default();
        mig.set("nvidia.com/mig-1g.5gb", 1);
        assert_eq!(mig.copies_in(&free), 0);
        assert!(!mig.fits_in(&free));
    }

    #[test]
    fn shares_never_span_two_gpus() {
        // Two T4s with 15 GiB each: three 7 GiB shares fit (two on one GPU, one on the other),
        // an 8 GiB share fits twice, a 16 GiB share never.
        let gpus = vec![SharedGpu::full(15), SharedGpu::full(15)];
        let s7 = GpuShare {
            mem_gib: 7,
            core_pct: 0,
        };
        assert_eq!(share_copies(&gpus, &s7), 4);
        let s16 = GpuShare {
            mem_gib: 16,
            core_pct: 0,
        };
        assert_eq!(share_copies(&gpus, &s16), 0);
        let mut g = gpus.clone();
        assert_eq!(place_shares(&mut g, &s7, 3), 3);
        let s8 = GpuShare {
            mem_gib: 8,
            core_pct: 30,
        };
        // 1 GiB left on one GPU and 8 GiB on the other.
        assert_eq!(share_copies(&g, &s8), 1);
        assert_eq!(place_share(&mut g, &s8), Some(1));
        assert_eq!(g[1].mem_gib, 0);
    }

    #[test]
    fn display_is_readable() {
        let mut a = r(1500, 16, 2);
        a.set("nvidia.com/mig-1g.5gb", 2);
        assert_eq!(
            a.to_string(),
            "cpu=1500m, memory=16Gi, nvidia.com/gpu=2, nvidia.com/mig-1g.5gb=2"
        );
    }
}
