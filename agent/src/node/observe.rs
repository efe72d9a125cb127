//! Observing: what is installed per pod and destination, with the kernel's counters, attributed to the links
//! that asked for it; the same read refreshes the per-link metrics.

use std::sync::Arc;

use futures::StreamExt;
use isthmus_agent_api::{AdoptedTree, ObservedDestination, ObservedPod, ObservedState};

use super::Node;
use super::state::InstalledPod;
use crate::metrics::LinkSample;

/// Pods whose counters are dumped at once by `observe`: each dump is held in full until it is read.
const OBSERVE_PARALLELISM: usize = 4;

impl Node {
    pub(super) async fn observe_inline(&self) -> ObservedState {
        let snapshot = self.snapshot.read().unwrap_or_else(|p| p.into_inner()).clone();
        let pods: Vec<(ObservedPod, Vec<LinkSample>)> = futures::stream::iter(snapshot.pods.iter())
            .map(|(uid, pod)| self.observe_pod(uid, pod))
            .buffered(OBSERVE_PARALLELISM.min(self.config.parallelism.max(1)))
            .collect()
            .await;
        let mut adopted = Vec::new();
        for entry in &snapshot.adopted {
            let counters = self.datapath.counters(None, &entry.netns, &entry.interface).await;
            adopted.push(AdoptedTree {
                netns_inode: entry.netns.id().inode,
                interface: entry.interface.clone(),
                destinations: counters
                    .into_iter()
                    .map(|(destination, counters)| ObservedDestination { destination, link: None, counters })
                    .collect(),
            });
        }
        let mut all_samples = Vec::with_capacity(pods.iter().map(|(_, l)| l.len()).sum());
        let mut observed_pods = Vec::with_capacity(pods.len());
        for (pod, samples) in pods {
            observed_pods.push(pod);
            all_samples.extend(samples);
        }
        self.metrics.set_link_counters(all_samples);
        ObservedState {
            node: self.config.name.clone(),
            version: snapshot.version,
            pods: observed_pods,
            capabilities: self.capabilities.clone(),
            adopted,
        }
    }

    /// One pod's destinations with their counters, and the samples of those a link asked for.
    async fn observe_pod(&self, uid: &str, pod: &Arc<InstalledPod>) -> (ObservedPod, Vec<LinkSample>) {
        let counters = self.datapath.counters(Some(&pod.datapath), &pod.netns, &pod.interface).await;
        let mut destinations = Vec::with_capacity(counters.len());
        let mut samples = Vec::with_capacity(counters.len());
        for (destination, counters) in counters {
            let link = pod.link(&destination);
            if let Some(link) = link {
                samples.push(LinkSample { pod: pod.pod.clone(), destination, link: link.clone(), counters });
            }
            destinations.push(ObservedDestination { destination, link: link.map(|l| l.as_ref().clone()), counters });
        }
        let observed = ObservedPod {
            uid: uid.to_owned(),
            namespace: pod.pod.namespace.clone(),
            name: pod.pod.name.clone(),
            destinations,
        };
        (observed, samples)
    }
}
