//! What the tests and benchmarks of every crate share, in one place: [`moto`] (a `moto_server`
//! EC2 emulator per test, network set-up through the SDK, and a fault-injecting relay in front
//! of it), [`ess`] (a local fake of Alibaba Cloud's ESS, ECS, VPC and STS endpoints that checks
//! every signature), [`counting_alloc`] (a global allocator counting live heap bytes and their
//! peak, for memory figures), [`cluster`] (the real Kubernetes control plane with kwok),
//! [`dra_driver`] (NVIDIA's DRA driver's DeviceClasses and ResourceSlices for kwok Nodes), [`hpa`]
//! (the GPU HPA chain: a dcgm-exporter stand-in and the real prometheus-adapter). Test
//! code only: no product crate depends on it.

#[cfg(feature = "cluster")]
pub mod cluster;
pub mod counting_alloc;
#[cfg(feature = "cluster")]
pub mod dra_driver;
#[cfg(feature = "ess")]
pub mod ess;
#[cfg(feature = "cluster")]
pub mod hpa;
#[cfg(feature = "moto")]
pub mod moto;
