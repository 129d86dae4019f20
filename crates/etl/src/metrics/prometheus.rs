//! Writing metrics in the Prometheus text exposition format (0.0.4).

use std::fmt::Write;

/// Builds a Prometheus text page: each metric family once, with its
/// `# HELP` and `# TYPE` lines, then its samples.
#[derive(Debug, Default)]
pub struct PromText {
    out: String,
    current: Option<&'static str>,
}

/// The kind of a metric family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PromKind {
    /// Only goes up (resets on restart).
    Counter,
    /// Goes up and down.
    Gauge,
}

impl PromText {
    /// An empty page.
    #[must_use]
    pub fn new() -> Self {
        PromText::default()
    }

    /// Add one sample. Samples of one family must be added together.
    pub fn sample(
        &mut self,
        name: &'static str,
        kind: PromKind,
        help: &str,
        labels: &[(&str, &str)],
        value: f64,
    ) {
        if self.current != Some(name) {
            let kind = match kind {
                PromKind::Counter => "counter",
                PromKind::Gauge => "gauge",
            };
            let _ = writeln!(self.out, "# HELP {name} {help}");
            let _ = writeln!(self.out, "# TYPE {name} {kind}");
            self.current = Some(name);
        }
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
    }

    /// The page.
    #[must_use]
    pub fn finish(self) -> String {
        self.out
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_have_help_and_type_once_and_labels_are_escaped() {
        let mut p = PromText::new();
        p.sample(
            "etl_x",
            PromKind::Gauge,
            "An x.",
            &[("partition", "0")],
            1.0,
        );
        p.sample(
            "etl_x",
            PromKind::Gauge,
            "An x.",
            &[("partition", "a\"b")],
            2.5,
        );
        p.sample("etl_y_total", PromKind::Counter, "Ys.", &[], 3.0);
        assert_eq!(
            p.finish(),
            "# HELP etl_x An x.\n# TYPE etl_x gauge\netl_x{partition=\"0\"} 1\n\
             etl_x{partition=\"a\\\"b\"} 2.5\n# HELP etl_y_total Ys.\n# TYPE etl_y_total counter\n\
             etl_y_total 3\n"
        );
    }
}
