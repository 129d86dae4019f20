//! `[source] type = "generator"`: deterministic synthetic records.

use etl_record::SourceId;
use etl_source::{GeneratorConfig, GeneratorSource};

use crate::config::GeneratorOptions;
use crate::registry::{BuiltSource, CheckReport, Registry, SourcePlugin};

pub(super) fn register(registry: Registry) -> Registry {
    registry.source_plugin(
        "generator",
        SourcePlugin::new(|g: GeneratorOptions, _context| {
            let source = GeneratorSource::new(GeneratorConfig {
                name: SourceId::new(g.name.as_deref().unwrap_or("generator")),
                partitions: g.partitions,
                records_per_partition: g.records_per_partition,
                max_batch_records: g.max_batch_records,
                rate: g.rate.map(|r| r as f64),
                seed: g.seed,
            })?;
            // The generator writes JSON documents.
            Ok(BuiltSource::new(source).values_are_json(true))
        })
        .check(check),
    )
}

fn check(g: &GeneratorOptions, report: &mut CheckReport<'_>) {
    report.at_least_one("partitions", u64::from(g.partitions));
    report.at_least_one("max_batch_records", g.max_batch_records as u64);
    if g.rate == Some(0) {
        report.problem("rate", "rate must be above zero (omit it for no limit)");
    }
}
