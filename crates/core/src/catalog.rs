//! Instance catalogs from CSV files (`instance_type,gpu_model,gpu_count,gpu_memory_mib,vcpu,
//! memory_mib,on_demand_usd_per_hour`, optionally `gpu_vendor`, `source` and `as_of`; format in
//! docs/catalog.md) and the offerings a policy derives from them when no cloud is asked.

use gpu_node_autoscaler_provider::{
    CapacityType, Catalog, GpuInfo, GpuVendor, InstanceType, Offering, OfferingKey,
};
use serde::Deserialize;

use crate::model::gpu::vendor_of;
use crate::policy::Policy;

/// The built-in catalog: AWS NVIDIA GPU instance types in us-east-1 with their on-demand list
/// prices, each row naming where its price was read and as of when.
pub const BUILTIN_AWS: &str = include_str!("../../../data/aws-gpu-us-east-1.csv");
pub const BUILTIN_AWS_NAME: &str = "<built-in aws-gpu-us-east-1.csv>";

/// A built-in catalog: one cloud region's instance types and list prices.
#[derive(Debug, PartialEq, Eq)]
pub struct Builtin {
    pub cloud: &'static str,
    pub region: &'static str,
    /// The name its errors carry.
    pub name: &'static str,
    pub text: &'static str,
}

/// The built-in catalogs, one per region whose list prices are known (the regions the docs and
/// `deploy/` use); the first is the fallback for any other region.
pub const BUILTINS: &[Builtin] = &[Builtin {
    cloud: "aws",
    region: "us-east-1",
    name: BUILTIN_AWS_NAME,
    text: BUILTIN_AWS,
}];

/// The built-in catalog for `region` (the policy's; none: the fallback), and a warning naming
/// the fallback when the region has no built-in catalog of its own.
pub fn builtin_for(region: Option<&str>) -> (&'static Builtin, Option<String>) {
    let fallback = &BUILTINS[0];
    let Some(region) = region else {
        return (fallback, None);
    };
    match BUILTINS.iter().find(|b| b.region == region) {
        Some(b) => (b, None),
        None => (
            fallback,
            Some(format!(
                "no built-in catalog for region {region}: the built-in {} {} list prices are used \
                 instead ({}); set prices.<type>.onDemand in the pools, or pass --catalog with \
                 {region}'s prices",
                fallback.cloud, fallback.region, fallback.name
            )),
        ),
    }
}

/// The instance types of `file` (name, text) when one is given, else of the built-in catalog for
/// `region`; with the warning of [`builtin_for`] when that is a fallback.
pub fn load(
    file: Option<(&str, &str)>,
    region: Option<&str>,
) -> Result<(Vec<InstanceType>, Option<String>), CatalogError> {
    match file {
        Some((name, text)) => Ok((parse_csv(text, name)?, None)),
        None => {
            let (b, warning) = builtin_for(region);
            Ok((parse_csv(b.text, b.name)?, warning))
        }
    }
}

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
    // `source` (where the price was read: a URL or a document) is free text, not read here.
    /// The day the price was read, `YYYY-MM-DD`.
    #[serde(default)]
    as_of: Option<String>,
}

/// Whether `s` is a calendar date `YYYY-MM-DD`.
fn is_date(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return false;
    }
    let num = |r: std::ops::Range<usize>| {
        b[r.clone()]
            .iter()
            .all(u8::is_ascii_digit)
            .then(|| s[r].parse::<u32>().ok())
            .flatten()
    };
    let (Some(y), Some(m), Some(d)) = (num(0..4), num(5..7), num(8..10)) else {
        return false;
    };
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let days = match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return false,
    };
    (1..=days).contains(&d)
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
            match e.kind() {
                csv::ErrorKind::UnequalLengths { len, .. } => {
                    let len = *len as usize;
                    let message = match headers.get(len) {
                        Some(h) => format!(
                            "field `{h}`: missing (the header has {} columns, this row {len})",
                            headers.len()
                        ),
                        None => format!(
                            "{len} fields, but the header has only {} columns",
                            headers.len()
                        ),
                    };
                    err(line, message)
                }
                _ => err(line, e.to_string()),
            }
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
                format!(
                    "field `instance_type`: duplicate instance type {:?}",
                    row.instance_type
                ),
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
        for (field, value) in [
            ("vcpu", u64::from(row.vcpu)),
            ("memory_mib", row.memory_mib),
        ] {
            if value == 0 {
                return Err(err(line, format!("field `{field}`: must be positive")));
            }
        }
        if let Some(d) = row.as_of.as_deref().filter(|d| !d.is_empty()) {
            if !is_date(d) {
                return Err(err(
                    line,
                    format!("field `as_of`: expected a date YYYY-MM-DD, got {d:?}"),
                ));
            }
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
                    // Not in ALL: reserved offerings come from the cloud's reservations.
                    CapacityType::Reserved => 0.0,
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
    fn the_builtin_catalog_is_chosen_by_region_with_a_warning_for_a_fallback() {
        let (b, w) = builtin_for(Some("us-east-1"));
        assert_eq!((b.cloud, b.region, w), ("aws", "us-east-1", None));
        let (b, w) = builtin_for(None);
        assert_eq!((b.region, w), ("us-east-1", None));
        let (b, w) = builtin_for(Some("cn-hangzhou"));
        assert_eq!(b.region, "us-east-1");
        assert_eq!(
            w.as_deref(),
            Some(
                "no built-in catalog for region cn-hangzhou: the built-in aws us-east-1 list \
                 prices are used instead (<built-in aws-gpu-us-east-1.csv>); set \
                 prices.<type>.onDemand in the pools, or pass --catalog with cn-hangzhou's prices"
            )
        );
        // A file given is read as it is, whatever the region.
        let text = "instance_type,gpu_model,gpu_count,gpu_memory_mib,vcpu,memory_mib,on_demand_usd_per_hour\n\
                    g5.xlarge,A10G,1,23028,4,16384,1.006\n";
        let (types, w) = load(Some(("mine.csv", text)), Some("eu-west-1")).unwrap();
        assert_eq!((types.len(), w), (1, None));
        for b in BUILTINS {
            assert!(parse_csv(b.text, b.name).is_ok(), "{}", b.name);
        }
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

        let text = "instance_type,gpu_model,gpu_count,gpu_memory_mib,vcpu,memory_mib,on_demand_usd_per_hour\n\
                    g5.xlarge,A10G,1,23028,0,16384,1.006\n";
        let e = parse_csv(text, "v.csv").unwrap_err().to_string();
        assert_eq!(e, "v.csv:2: field `vcpu`: must be positive");
    }

    const WITH_SOURCE: &str = "instance_type,gpu_model,gpu_count,gpu_memory_mib,vcpu,memory_mib,on_demand_usd_per_hour,source,as_of\n";

    #[test]
    fn source_and_as_of_are_optional_columns() {
        let text = format!(
            "{WITH_SOURCE}g5.xlarge,A10G,1,23028,4,16384,1.006,https://example.com/prices,2026-07-20\n\
             g5.2xlarge,A10G,1,23028,8,32768,1.212,,\n"
        );
        let types = parse_csv(&text, "s.csv").unwrap();
        assert_eq!(types.len(), 2);
        assert_eq!(types[1].on_demand_price, Some(1.212));
        // Without them, as before.
        let text = "instance_type,gpu_model,gpu_count,gpu_memory_mib,vcpu,memory_mib,on_demand_usd_per_hour\n\
                    g5.xlarge,A10G,1,23028,4,16384,1.006\n";
        assert_eq!(parse_csv(text, "old.csv").unwrap().len(), 1);
    }

    #[test]
    fn a_malformed_as_of_or_a_short_row_names_file_line_and_field() {
        for bad in ["2026-13-01", "2026-02-30", "20260720", "yesterday"] {
            let text = format!(
                "{WITH_SOURCE}g5.xlarge,A10G,1,23028,4,16384,1.006,https://example.com,{bad}\n"
            );
            let e = parse_csv(&text, "d.csv").unwrap_err().to_string();
            assert_eq!(
                e,
                format!("d.csv:2: field `as_of`: expected a date YYYY-MM-DD, got {bad:?}")
            );
        }
        assert!(is_date("2024-02-29"));
        assert!(!is_date("2025-02-29"));

        let text = format!(
            "{WITH_SOURCE}g5.xlarge,A10G,1,23028,4,16384,1.006,https://example.com,2026-07-20\n\
             g5.2xlarge,A10G,1,23028,8,32768,1.212,https://example.com\n"
        );
        let e = parse_csv(&text, "short.csv").unwrap_err().to_string();
        assert_eq!(
            e,
            "short.csv:3: field `as_of`: missing (the header has 9 columns, this row 8)"
        );
    }

    #[test]
    fn the_benchmarks_catalog_is_the_builtin_one_and_three_synthetic_types() {
        let csv = format!("{BUILTIN_AWS}{}", crate::fixtures::SYNTHETIC_TYPES_CSV);
        let types = parse_csv(&csv, "bench-catalog").unwrap();
        let builtin = parse_csv(BUILTIN_AWS, "builtin").unwrap();
        assert_eq!(types.len(), builtin.len() + 3);
    }

    #[test]
    fn every_builtin_row_names_its_source_and_date() {
        let mut rdr = csv::Reader::from_reader(BUILTIN_AWS.as_bytes());
        let headers = rdr.headers().unwrap().clone();
        let col = |name: &str| headers.iter().position(|h| h == name).unwrap();
        let (source, as_of) = (col("source"), col("as_of"));
        for rec in rdr.records() {
            let rec = rec.unwrap();
            assert!(rec[source].starts_with("https://"), "{rec:?}");
            assert!(is_date(&rec[as_of]), "{rec:?}");
        }
    }
}
