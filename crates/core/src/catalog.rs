//! Instance catalogs from CSV files (`instance_type,gpu_model,gpu_count,gpu_memory_mib,vcpu,
//! memory_mib,on_demand_usd_per_hour`, optionally `gpu_vendor`) and the offerings a policy
//! derives from them when no cloud is asked.

use gpu_node_autoscaler_provider::{
    CapacityType, Catalog, GpuInfo, GpuVendor, InstanceType, Offering, OfferingKey,
};
use serde::Deserialize;

use crate::model::gpu::vendor_of;
use crate::policy::Policy;

/// The built-in catalog: AWS NVIDIA GPU instance types in us-east-1 with approximate on-demand
/// list prices.
pub const BUILTIN_AWS: &str = include_str!("../../../data/aws-gpu-us-east-1.csv");
pub const BUILTIN_AWS_NAME: &str = "<built-in aws-gpu-us-east-1.csv>";

#[derive(Debug, thiserror::Error)]
#[error("{file}:{line}: {message}")]
pub struct CatalogError {
    pub file: String,
    pub line: u64,
    pub message: String,
}

#[derive(Deserialize)]
struct Row {
    instance_type: String,
    gpu_model: String,
    gpu_count: u32,
    gpu_memory_mib: u64,
    vcpu: u32,
    memory_mib: u64,
    on_demand_usd_per_hour: f64,
    #[serde(default)]
    gpu_vendor: Option<String>,
}

/// Reads instance types from CSV text. Errors name the file, line and column.
pub fn parse_csv(text: &str, file: &str) -> Result<Vec<InstanceType>, CatalogError> {
    let err = |line: u64, message: String| CatalogError {
        file: file.to_string(),
        line,
        message,
    };
    let mut rdr = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .from_reader(text.as_bytes());
    let headers = rdr
        .headers()
        .map_err(|e| err(1, format!("cannot read the header: {e}")))?
        .clone();
    for want in [
        "instance_type",
        "gpu_model",
        "gpu_count",
        "gpu_memory_mib",
        "vcpu",
        "memory_mib",
        "on_demand_usd_per_hour",
    ] {
        if !headers.iter().any(|h| h == want) {
            return Err(err(1, format!("missing column `{want}`")));
        }
    }
    let mut out: Vec<InstanceType> = Vec::new();
    for rec in rdr.records() {
        let rec = rec.map_err(|e| {
            let line = e.position().map_or(0, |p| p.line());
            err(line, e.to_string())
        })?;
        let line = rec.position().map_or(0, |p| p.line());
        let row: Row = rec
            .deserialize(Some(&headers))
            .map_err(|e| match e.kind() {
                csv::ErrorKind::Deserialize { err: de, .. } => {
                    let field = de
                        .field()
                        .and_then(|i| headers.get(i as usize))
                        .map(|h| format!("field `{h}`: "))
                        .unwrap_or_default();
                    err(line, format!("{field}{}", de.kind()))
                }
                _ => err(line, e.to_string()),
            })?;
        if row.instance_type.is_empty() {
            return Err(err(line, "field `instance_type`: must not be empty".into()));
        }
        if out.iter().any(|t| t.name == row.instance_type) {
            return Err(err(
                line,
                format!("duplicate instance type {:?}", row.instance_type),
            ));
        }
        if !(row.on_demand_usd_per_hour.is_finite() && row.on_demand_usd_per_hour > 0.0) {
            return Err(err(
                line,
                format!(
                    "field `on_demand_usd_per_hour`: must be a positive price, got {}",
                    row.on_demand_usd_per_hour
                ),
            ));
        }
        if row.vcpu == 0 || row.memory_mib == 0 {
            return Err(err(
                line,
                "fields `vcpu` and `memory_mib` must be positive".into(),
            ));
        }
        let vendor = match row.gpu_vendor.as_deref() {
            None | Some("") => vendor_of(&row.gpu_model),
            Some("nvidia") => GpuVendor::Nvidia,
            Some("amd") => GpuVendor::Amd,
            Some(v) => {
                return Err(err(
                    line,
                    format!("field `gpu_vendor`: unknown vendor {v:?} (nvidia or amd)"),
                ))
            }
        };
        let gpu = (row.gpu_count > 0).then(|| GpuInfo {
            model: row.gpu_model.clone(),
            vendor,
            count: row.gpu_count,
            memory_mib: row.gpu_memory_mib,
        });
        out.push(InstanceType {
            name: row.instance_type,
            vcpu: row.vcpu,
            memory_mib: row.memory_mib,
            gpu,
            on_demand_price: Some(row.on_demand_usd_per_hour),
        });
    }
    if out.is_empty() {
        return Err(err(1, "the catalog lists no instance types".into()));
    }
    Ok(out)
}

/// Offerings for every instance type × every zone any pool names × both capacity types, priced
/// from the list price (spot at the policy's spot price ratio), all available.
pub fn offerings_from_list_prices(policy: &Policy, types: Vec<InstanceType>) -> Catalog {
    let mut zones: Vec<&String> = policy.pools.iter().flat_map(|p| &p.zones).collect();
    zones.sort();
    zones.dedup();
    let mut offerings = Vec::new();
    for t in &types {
        let Some(od) = t.on_demand_price else {
            continue;
        };
        for z in &zones {
            for ct in CapacityType::ALL {
                let price = match ct {
                    CapacityType::OnDemand => od,
                    CapacityType::Spot => od * policy.spot_price_ratio,
                };
                offerings.push(Offering {
                    key: OfferingKey {
                        instance_type: t.name.clone(),
                        zone: (*z).clone(),
                        capacity_type: ct,
                    },
                    price_per_hour: price,
                    available: true,
                });
            }
        }
    }
    Catalog {
        instance_types: types,
        offerings,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_catalog_parses() {
        let types = parse_csv(BUILTIN_AWS, BUILTIN_AWS_NAME).unwrap();
        assert!(types.len() >= 30);
        let p4d = types.iter().find(|t| t.name == "p4d.24xlarge").unwrap();
        let g = p4d.gpu.as_ref().unwrap();
        assert_eq!(
            (g.model.as_str(), g.count, g.memory_mib),
            ("A100", 8, 40960)
        );
        assert_eq!(g.vendor, GpuVendor::Nvidia);
    }

    #[test]
    fn errors_name_file_line_and_field() {
        let text = "instance_type,gpu_model,gpu_count,gpu_memory_mib,vcpu,memory_mib,on_demand_usd_per_hour\n\
                    g5.xlarge,A10G,1,23028,4,16384,1.006\n\
                    g5.2xlarge,A10G,one,23028,8,32768,1.212\n";
        let e = parse_csv(text, "cat.csv").unwrap_err().to_string();
        assert!(e.starts_with("cat.csv:3: field `gpu_count`"), "{e}");

        let e = parse_csv("instance_type,gpu_model\n", "x.csv")
            .unwrap_err()
            .to_string();
        assert_eq!(e, "x.csv:1: missing column `gpu_count`");

        let text = "instance_type,gpu_model,gpu_count,gpu_memory_mib,vcpu,memory_mib,on_demand_usd_per_hour\n\
                    g5.xlarge,A10G,1,23028,4,16384,-1\n";
        let e = parse_csv(text, "p.csv").unwrap_err().to_string();
        assert!(e.contains("p.csv:2: field `on_demand_usd_per_hour`"), "{e}");
    }
}
