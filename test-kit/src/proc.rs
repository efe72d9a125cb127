//! A process's memory as `/proc/<pid>/status` reports it.

/// The value in KiB of `field` (`VmRSS`, `VmHWM`, `RssAnon`, …) in the text of a `/proc/<pid>/status`; `None`
/// when the text has no such line.
pub fn status_kib(status: &str, field: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.split(':').next() == Some(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_is_read_from_its_own_line_only() {
        let status = "Name:\tisthmus-operator\nVmHWM:\t   40960 kB\nVmRSS:\t   30720 kB\nRssAnon:\t 20000 kB\n";
        assert_eq!((status_kib(status, "VmRSS"), status_kib(status, "VmHWM")), (Some(30720), Some(40960)));
        assert_eq!(status_kib(status, "RssAnon"), Some(20000));
        assert_eq!(status_kib(status, "Vm"), None);
        assert_eq!(status_kib(status, "Name"), None);
    }
}
