//! A pod's phase as the plan reads it. A pod is planned from the moment its sandbox has an IP, whatever its phase
//! says of its containers: its init containers and its first containers send while the pod is still `Pending`,
//! and that traffic must already cross its links (docs/networklink.md, "Impaired from the first packet").

/// `status.phase`, with the two phases after which a pod's IP may belong to another pod folded into one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PodPhase {
    /// Scheduled or starting: once the sandbox has an IP, its init containers and first containers may send.
    Pending,
    /// Every container started.
    Running,
    /// `Succeeded` or `Failed`: nothing of it runs any more, and its IP may already be another pod's.
    Ended,
    /// `Unknown` (its node stopped reporting), or a phase this version does not know: nothing can be said of it.
    Unknown,
}

impl PodPhase {
    /// The phase `status.phase` names; an absent phase is the API server's default for a new pod, `Pending`.
    pub fn of(phase: Option<&str>) -> Self {
        match phase {
            None | Some("Pending") => Self::Pending,
            Some("Running") => Self::Running,
            Some("Succeeded" | "Failed") => Self::Ended,
            Some(_) => Self::Unknown,
        }
    }

    /// Whether the pod's own containers may be sending: the phases in which its links must be in force.
    pub fn may_send(self) -> bool {
        matches!(self, Self::Pending | Self::Running)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_phase_the_api_defines_is_read_and_only_pending_and_running_may_send() {
        let read: Vec<(Option<&str>, PodPhase, bool)> = [
            None,
            Some("Pending"),
            Some("Running"),
            Some("Succeeded"),
            Some("Failed"),
            Some("Unknown"),
            Some("Evicted"),
        ]
        .into_iter()
        .map(|p| (p, PodPhase::of(p), PodPhase::of(p).may_send()))
        .collect();
        assert_eq!(
            read,
            [
                (None, PodPhase::Pending, true),
                (Some("Pending"), PodPhase::Pending, true),
                (Some("Running"), PodPhase::Running, true),
                (Some("Succeeded"), PodPhase::Ended, false),
                (Some("Failed"), PodPhase::Ended, false),
                (Some("Unknown"), PodPhase::Unknown, false),
                (Some("Evicted"), PodPhase::Unknown, false),
            ]
        );
    }
}
