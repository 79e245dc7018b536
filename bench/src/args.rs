//! queen-bench's command line (clap): a run's options, each profiling knob also readable from the
//! environment variable it has always had, and the `report` subcommand.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

/// The broker over real HTTP against raw PostgreSQL baselines measured in the same run.
///
/// Needs DATABASE_URL pointing at a PostgreSQL it may create and drop a database in (`bash
/// .ci/bench` starts a throwaway one). Prints a markdown table and writes the same figures as JSON.
#[derive(Parser, Debug)]
#[command(name = "queen-bench", version)]
pub struct Args {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Writes docs/benchmarks.md's current table from a run's JSON (no database needed).
    Report(ReportArgs),
}

#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    /// The JSON a full run wrote.
    #[arg(long, default_value = "target/queen-bench.json")]
    pub json: PathBuf,
    /// The markdown file to rewrite: its table section is replaced, the rest is kept.
    #[arg(long, default_value = "docs/benchmarks.md")]
    pub out: PathBuf,
}

/// The scenarios, in the order a run measures them.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    Push,
    Consume,
    Steady,
    Parked,
    Scaling,
    #[value(alias = "fanout")]
    FanOut,
    Wake,
    Limiter,
    Retention,
    Restart,
    Auth,
    Consumers,
    Coordination,
    Reads,
    Durable,
    Streams,
    Ephemeral,
}

/// A consume shape: `<partitions>x<consumers>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConsumeShape {
    pub partitions: usize,
    pub consumers: usize,
}

impl std::str::FromStr for ConsumeShape {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        s.trim()
            .split_once('x')
            .and_then(|(p, c)| {
                Some(ConsumeShape {
                    partitions: p.parse().ok()?,
                    consumers: c.parse().ok()?,
                })
            })
            .ok_or_else(|| format!("{s:?} is not <partitions>x<consumers>"))
    }
}

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Smaller counts and windows, every row still printed: a smoke run under 2 minutes.
    #[arg(long)]
    pub quick: bool,
    /// Runs only these scenarios (comma-separated), each at its full length (`runs` says which).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<Scenario>,
    /// Where the run's JSON goes.
    #[arg(long, default_value = "target/queen-bench.json")]
    pub json: PathBuf,
    /// Push batch sizes (a profiler's window narrows them).
    #[arg(
        long,
        env = "BENCH_PUSH_BATCHES",
        value_delimiter = ',',
        default_value = "1,10,100,1000"
    )]
    pub push_batches: Vec<usize>,
    /// Consume shapes, `<partitions>x<consumers>`.
    #[arg(
        long,
        env = "BENCH_CONSUME_SHAPES",
        value_delimiter = ',',
        default_value = "10x4,10x16,1000x4,1000x16"
    )]
    pub consume_shapes: Vec<ConsumeShape>,
    /// The steady state's calm rate in msg/s (default: 10% of the measured maximum), so runs of
    /// two builds offer the same load.
    #[arg(long, env = "BENCH_OFFERED")]
    pub offered: Option<f64>,
    /// Parked long-poll counts (default: the plan's).
    #[arg(long, env = "BENCH_PARKED", value_delimiter = ',')]
    pub parked: Option<Vec<usize>>,
    /// Partition counts of the scaling scenario; the smallest is every size's baseline.
    #[arg(long, env = "BENCH_SCALING_SIZES", value_delimiter = ',')]
    pub scaling_sizes: Option<Vec<usize>>,
    /// Which pop paths the scaling scenario runs: hot, wild.
    #[arg(
        long,
        env = "BENCH_SCALING_PATHS",
        value_delimiter = ',',
        default_value = "wild,hot"
    )]
    pub scaling_paths: Vec<String>,
    /// Consumer-group counts of the fan-out scenario.
    #[arg(long, env = "BENCH_FANOUT_GROUPS", value_delimiter = ',')]
    pub fanout_groups: Option<Vec<usize>>,
    /// The retention soak's length in seconds (default: the plan's).
    #[arg(long, env = "BENCH_SOAK_SECS")]
    pub soak_secs: Option<u64>,
}

impl RunArgs {
    /// Whether this run measures `s`.
    pub fn runs(&self, s: Scenario) -> bool {
        self.only.is_empty() || self.only.contains(&s)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code
    use super::*;

    #[test]
    fn help_is_printed_before_anything_needs_a_database() {
        let e = Args::try_parse_from(["queen-bench", "--help"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::DisplayHelp);
        assert!(e.to_string().contains("--only"));
    }

    #[test]
    fn scenarios_and_shapes_parse_and_unknown_ones_are_refused() {
        let a = Args::try_parse_from([
            "queen-bench",
            "--quick",
            "--only",
            "push,fanout",
            "--consume-shapes",
            "10x4",
        ])
        .unwrap();
        assert!(a.run.quick && a.run.runs(Scenario::FanOut) && !a.run.runs(Scenario::Wake));
        assert_eq!(
            a.run.consume_shapes,
            vec![ConsumeShape {
                partitions: 10,
                consumers: 4
            }]
        );
        assert!(Args::try_parse_from(["queen-bench", "--only", "nosuch"]).is_err());
        assert!(Args::try_parse_from(["queen-bench", "--consume-shapes", "10by4"]).is_err());
    }
}
