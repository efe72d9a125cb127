//! Counters from a dumped qdisc or class: `TCA_STATS2` (basic + queue, with `TCA_STATS_PKT64` when the packet
//! count outgrew 32 bits), else the legacy `TCA_STATS`.

use isthmus_agent_api::Counters;
use netlink_packet_core::Nla;
use netlink_packet_route::tc::{TcAttribute, TcStats2};

use super::attrs;

const TCA_STATS_PKT64: u16 = 8;

pub(super) fn counters(attributes: &[TcAttribute]) -> Counters {
    let mut counters = Counters::default();
    let mut have_stats2 = false;
    for attribute in attributes {
        if let TcAttribute::Stats2(stats) = attribute {
            have_stats2 = true;
            let mut packets64 = None;
            for stat in stats {
                match stat {
                    TcStats2::Basic(basic) => {
                        counters.bytes = basic.bytes;
                        counters.packets = u64::from(basic.packets);
                    }
                    TcStats2::Queue(queue) => {
                        counters.drops = u64::from(queue.drops);
                        counters.overlimits = u64::from(queue.overlimits);
                        counters.backlog_packets = u64::from(queue.qlen);
                        counters.backlog_bytes = u64::from(queue.backlog);
                    }
                    TcStats2::Other(nla) if nla.kind() == TCA_STATS_PKT64 => {
                        let value = attrs::default_nla_value(nla);
                        packets64 = value.get(..8).and_then(|b| b.try_into().ok()).map(u64::from_ne_bytes);
                    }
                    _ => {}
                }
            }
            if let Some(packets) = packets64 {
                counters.packets = packets;
            }
        }
    }
    if !have_stats2 {
        for attribute in attributes {
            if let TcAttribute::Stats(stats) = attribute {
                counters.bytes = stats.bytes;
                counters.packets = u64::from(stats.packets);
                counters.drops = u64::from(stats.drops);
                counters.overlimits = u64::from(stats.overlimits);
                counters.backlog_packets = u64::from(stats.qlen);
                counters.backlog_bytes = u64::from(stats.backlog);
            }
        }
    }
    counters
}
