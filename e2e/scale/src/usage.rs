//! The operator process's CPU time and memory, read from /proc.

use std::time::Duration;

use isthmus_test_kit::proc::status_kib;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// User and system time since the process started.
    pub cpu: Duration,
    pub rss_kib: u64,
    /// The highest resident size since the process started (`VmHWM`).
    pub peak_kib: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    #[error("reading /proc/{pid}: {source}")]
    Read { pid: u32, source: std::io::Error },
    #[error("/proc/{pid}/{file}: no {field}")]
    Field { pid: u32, file: &'static str, field: &'static str },
}

impl Usage {
    pub fn of(pid: u32) -> Result<Usage, UsageError> {
        let read = |file| {
            std::fs::read_to_string(format!("/proc/{pid}/{file}")).map_err(|source| UsageError::Read { pid, source })
        };
        // SAFETY: sysconf only reads a constant of the system.
        let ticks = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).unwrap_or(100).max(1);
        let missing = |file, field| UsageError::Field { pid, file, field };
        let cpu_ticks = cpu_ticks(&read("stat")?).ok_or(missing("stat", "utime and stime"))?;
        let status = read("status")?;
        Ok(Usage {
            cpu: Duration::from_secs_f64(cpu_ticks as f64 / ticks as f64),
            rss_kib: status_kib(&status, "VmRSS").ok_or(missing("status", "VmRSS"))?,
            peak_kib: status_kib(&status, "VmHWM").ok_or(missing("status", "VmHWM"))?,
        })
    }
}

/// utime + stime of a /proc/<pid>/stat line: fields 14 and 15, counted after the command's closing parenthesis
/// (the command itself may hold spaces and parentheses).
fn cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    Some(fields.next()?.parse::<u64>().ok()? + fields.next()?.parse::<u64>().ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_read_after_a_command_that_holds_spaces_and_parentheses() {
        let stat = "4242 (isthmus (op) x) S 1 4242 4242 0 -1 4194560 1000 0 0 0 170 35 0 0 20 0 6 0 100 1 2";
        assert_eq!(cpu_ticks(stat), Some(205));
        assert_eq!(cpu_ticks("4242 (cut"), None);
    }

    #[test]
    fn this_process_has_a_usage() {
        let u = Usage::of(std::process::id()).unwrap();
        assert!(u.rss_kib > 0 && u.peak_kib >= u.rss_kib, "{u:?}");
    }
}
