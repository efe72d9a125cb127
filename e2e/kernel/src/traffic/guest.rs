//! The guest kernel's own counters, read around a stream to say where its losses went.

use anyhow::Context;

/// The guest's CPU time, all CPUs together (`/proc/stat`'s first line, in clock ticks).
#[derive(Debug, Clone, Copy)]
pub struct CpuTimes {
    busy: u64,
    total: u64,
}

impl CpuTimes {
    pub fn now() -> anyhow::Result<CpuTimes> {
        let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
        CpuTimes::parse(stat.lines().next().context("an empty /proc/stat")?)
    }

    /// From `/proc/stat`'s `cpu` line.
    fn parse(line: &str) -> anyhow::Result<CpuTimes> {
        let ticks = line
            .split_whitespace()
            .skip(1)
            .map(|t| t.parse::<u64>().with_context(|| format!("/proc/stat's cpu line {line:?}")))
            .collect::<anyhow::Result<Vec<u64>>>()?;
        // user nice system idle iowait …: idle and iowait are the CPU's own waiting
        let waiting = ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
        let total = ticks.iter().sum::<u64>();
        Ok(CpuTimes { busy: total - waiting, total })
    }

    /// The busy share (0–1) of the CPU time since `earlier`.
    pub fn busy_since(&self, earlier: CpuTimes) -> f64 {
        let total = self.total.saturating_sub(earlier.total);
        if total == 0 { 0.0 } else { self.busy.saturating_sub(earlier.busy) as f64 / total as f64 }
    }
}

/// Packets the kernel dropped from its per-CPU input backlogs (`/proc/net/softnet_stat`, second column, all
/// CPUs): what a veth hands on faster than the receiving side takes it. The whole guest's, not one namespace's.
pub fn backlog_drops() -> anyhow::Result<u64> {
    let table = std::fs::read_to_string("/proc/net/softnet_stat").context("reading /proc/net/softnet_stat")?;
    table
        .lines()
        .map(|line| {
            let column = line.split_whitespace().nth(1).context("softnet_stat line without a drop column")?;
            u64::from_str_radix(column, 16).with_context(|| format!("softnet_stat drop column {column:?}"))
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_busy_share_leaves_out_idle_and_iowait() {
        let before = CpuTimes::parse("cpu  100 0 50 800 50 0 0 0 0 0").expect("a cpu line");
        let after = CpuTimes::parse("cpu  160 0 70 900 70 0 0 0 0 0").expect("a cpu line");
        // 80 busy ticks (user 60, system 20) of 200
        assert!((after.busy_since(before) - 0.4).abs() < 1e-9);
        assert_eq!(before.busy_since(before), 0.0);
        assert!(CpuTimes::parse("cpu  1 x 3").is_err());
    }
}
