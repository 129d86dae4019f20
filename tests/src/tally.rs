//! The tally of a crash loop: what went in, what came out, how often it
//! was killed, and whether that is within the delivery contract.

use std::fmt;
use std::time::Duration;

/// What a crash loop did and found.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    /// The loop's name.
    pub name: String,
    /// Records in the input.
    pub records: u64,
    /// Records that pass the filter, so must be in the output.
    pub expected: u64,
    /// Kills asked for.
    pub kills_wanted: u32,
    /// SIGKILLs delivered to a running process.
    pub kills: u32,
    /// Processes started.
    pub runs: u32,
    /// Batches that failed and replayed their partition (logged by the
    /// runs).
    pub replays: u64,
    /// Output lines.
    pub lines: u64,
    /// Distinct ids in the output.
    pub distinct: u64,
    /// Expected ids found neither in the output nor in the dead letters.
    pub missing: u64,
    /// Ids in the output that should not be there (filtered or unknown).
    pub unexpected: u64,
    /// Records in the dead-letter file.
    pub dead_lettered: u64,
    /// Output lines beyond the first of each id.
    pub duplicates: u64,
    /// Duplicates one kill or one replay may cause (twice the in-flight
    /// bound).
    pub bound_per_event: u64,
    /// Whether the sink is exactly-once (no duplicates allowed).
    pub exactly_once: bool,
    /// Kills after which the output ended in a partial line, found or
    /// left there by the loop (the restart must cut it).
    pub torn_tails: u32,
    /// Times the offset store was loaded between a kill and the restart.
    pub store_loads: u32,
    /// Wall-clock time of the loop.
    pub elapsed: Duration,
}

impl Tally {
    /// The most duplicates allowed: the per-event bound times kills and
    /// replays (zero for an exactly-once sink).
    #[must_use]
    pub fn duplicate_bound(&self) -> u64 {
        if self.exactly_once {
            0
        } else {
            self.bound_per_event * (u64::from(self.kills) + self.replays)
        }
    }

    /// Check the delivery contract: nothing lost, nothing foreign,
    /// duplicates within the bound, enough kills.
    ///
    /// # Errors
    ///
    /// The tally, with what broke the contract.
    pub fn check(&self) -> Result<(), String> {
        let mut broken = Vec::new();
        if self.missing > 0 {
            broken.push(format!("{} expected records lost", self.missing));
        }
        if self.unexpected > 0 {
            broken.push(format!(
                "{} records that should not be there",
                self.unexpected
            ));
        }
        if self.duplicates > self.duplicate_bound() {
            broken.push(format!(
                "{} duplicates above the bound of {}",
                self.duplicates,
                self.duplicate_bound()
            ));
        }
        if self.kills < self.kills_wanted {
            broken.push(format!(
                "only {} of {} kills landed before the pipeline finished",
                self.kills, self.kills_wanted
            ));
        }
        if broken.is_empty() {
            Ok(())
        } else {
            Err(format!("{self}\n  broken: {}", broken.join("; ")))
        }
    }

    /// Add another loop's counts to this one (for a soak's total).
    pub fn add(&mut self, other: &Tally) {
        self.records += other.records;
        self.expected += other.expected;
        self.kills_wanted += other.kills_wanted;
        self.kills += other.kills;
        self.runs += other.runs;
        self.replays += other.replays;
        self.lines += other.lines;
        self.distinct += other.distinct;
        self.missing += other.missing;
        self.unexpected += other.unexpected;
        self.dead_lettered += other.dead_lettered;
        self.duplicates += other.duplicates;
        self.torn_tails += other.torn_tails;
        self.store_loads += other.store_loads;
        self.elapsed += other.elapsed;
    }
}

impl fmt::Display for Tally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} records in, {} expected out; {} kills, {} runs, {} replays; \
             {} lines, {} distinct, {} missing, {} unexpected, {} dead-lettered; \
             {} duplicates (bound {}{}); {} torn tails cut, {} store loads; {:.1?}",
            self.name,
            self.records,
            self.expected,
            self.kills,
            self.runs,
            self.replays,
            self.lines,
            self.distinct,
            self.missing,
            self.unexpected,
            self.dead_lettered,
            self.duplicates,
            self.duplicate_bound(),
            if self.exactly_once {
                ": exactly once".to_owned()
            } else {
                format!(
                    " = {} x ({} kills + {} replays)",
                    self.bound_per_event, self.kills, self.replays
                )
            },
            self.torn_tails,
            self.store_loads,
            self.elapsed,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_scales_with_kills_and_replays_and_is_zero_for_exactly_once() {
        let mut t = Tally {
            kills: 3,
            kills_wanted: 3,
            replays: 1,
            bound_per_event: 10,
            duplicates: 40,
            ..Tally::default()
        };
        assert_eq!(t.duplicate_bound(), 40);
        assert!(t.check().is_ok());
        t.duplicates = 41;
        assert!(t.check().unwrap_err().contains("above the bound"));
        t.exactly_once = true;
        t.duplicates = 1;
        assert_eq!(t.duplicate_bound(), 0);
        assert!(t.check().is_err());
    }
}
