//! What the pipeline lets people see: the totals a progress report is
//! computed from. The metrics themselves are read through
//! [`MetricsHub`](crate::MetricsHub).

mod progress;

pub use progress::{CommittedTotals, ProgressTotals};
