//! u32 classifier (`net/sched/cls_u32.c`) through netlink-packet-route's typed options.
//!
//! - The crate converts key `mask`/`val` and selector `hmask` to network byte order itself (0.34), so the model's
//!   host-order values go in unchanged; `off`, `hoff` stay native as the kernel wants.
//! - Attribute order follows iproute2: CLASSID, LINK, DIVISOR, HASH, SEL.
//! - What `u32_dump` reports: a table node (key bits of the handle 0) only `DIVISOR` (divisor + 1 as stored, so
//!   the value sent); a key node `SEL`, `HASH` = its handle & 0xFFFFF000 (always — a node lives in some table,
//!   the priority's root table `800:` when none was named), `CLASSID` when set, `LINK` when set, `FLAGS`
//!   (kernel-set `not_in_hw`, ignored here) and, with CONFIG_CLS_U32_PERF, `PCNT` counters (ignored). The
//!   kernel also dumps one message per priority with handle 0 and no options; it decodes as a `U32Filter` with
//!   handle 0 and every option `None`.
//! - The kernel builds a key node's handle from `HASH` (table and bucket) and the node bits of `tcm_handle`:
//!   the model's `handle` must equal `hash_table | node`.
//! - In-place change ([`Operation::Change`](super::super::model::Operation)) replaces only CLASSID and LINK of
//!   a key node (u32_change copies the old selector) and is refused for a table: see
//!   [`super::changes_in_place`].

use netlink_packet_route::tc::{TcFilterU32Option, TcHandle, TcU32Key, TcU32Selector, TcU32SelectorFlags};

use super::DecodeError;
use crate::datapath::model::{Handle, U32Filter, U32Key, U32Selector};

pub(super) fn encode(filter: &U32Filter) -> Vec<TcFilterU32Option> {
    let mut options = Vec::new();
    if let Some(class_id) = filter.class_id {
        options.push(TcFilterU32Option::ClassId(TcHandle::from(class_id.0)));
    }
    if let Some(link) = filter.link {
        options.push(TcFilterU32Option::Link(link));
    }
    if let Some(divisor) = filter.divisor {
        options.push(TcFilterU32Option::Divisor(divisor));
    }
    if let Some(table) = filter.hash_table {
        options.push(TcFilterU32Option::Hash(table));
    }
    if let Some(selector) = &filter.selector {
        options.push(TcFilterU32Option::Selector(encode_selector(selector)));
    }
    options
}

fn encode_selector(selector: &U32Selector) -> TcU32Selector {
    let mut sel = TcU32Selector::default();
    if selector.terminal {
        sel.flags = TcU32SelectorFlags::Terminal;
    }
    sel.hmask = selector.hash_mask;
    sel.hoff = selector.hash_offset;
    sel.nkeys = selector.keys.len() as u8;
    sel.keys = selector
        .keys
        .iter()
        .map(|k| {
            let mut key = TcU32Key::default();
            key.mask = k.mask;
            key.val = k.value;
            key.off = k.offset;
            key
        })
        .collect();
    sel
}

pub(super) fn decode(handle: u32, options: &[TcFilterU32Option]) -> Result<U32Filter, DecodeError> {
    const OBJECT: &str = "u32 filter";
    let unsupported =
        |field: &'static str, detail: &str| DecodeError::Unsupported { object: OBJECT, field, detail: detail.into() };
    let mut filter = U32Filter { handle, divisor: None, link: None, hash_table: None, selector: None, class_id: None };
    for option in options {
        match option {
            TcFilterU32Option::ClassId(h) => filter.class_id = Some(Handle(u32::from(*h))),
            TcFilterU32Option::Hash(h) => filter.hash_table = Some(*h),
            TcFilterU32Option::Link(h) => filter.link = Some(*h),
            TcFilterU32Option::Divisor(d) => filter.divisor = Some(*d),
            TcFilterU32Option::Selector(sel) => filter.selector = Some(decode_selector(sel)?),
            // Kernel-maintained state, not configuration: hardware-offload status flags and hit counters.
            TcFilterU32Option::Flags(_) | TcFilterU32Option::Pnct(_) => {}
            TcFilterU32Option::Police(_) => return Err(unsupported("TCA_U32_POLICE", "policer")),
            TcFilterU32Option::Action(_) => return Err(unsupported("TCA_U32_ACT", "actions")),
            TcFilterU32Option::Indev(_) => {
                return Err(unsupported("TCA_U32_INDEV", "input device match"));
            }
            TcFilterU32Option::Mark(_) => return Err(unsupported("TCA_U32_MARK", "mark match")),
            _ => return Err(unsupported("TCA_OPTIONS", "unknown u32 attribute")),
        }
    }
    Ok(filter)
}

fn decode_selector(sel: &TcU32Selector) -> Result<U32Selector, DecodeError> {
    const OBJECT: &str = "u32 selector";
    let unsupported = |field: &'static str| DecodeError::Unsupported {
        object: OBJECT,
        field,
        detail: "variable header offsets are not part of the model".into(),
    };
    if !(sel.flags - TcU32SelectorFlags::Terminal).is_empty() {
        return Err(unsupported("flags"));
    }
    if sel.offshift != 0 || sel.offmask != 0 || sel.off != 0 || sel.offoff != 0 {
        return Err(unsupported("off"));
    }
    let keys = sel
        .keys
        .iter()
        .map(|k| {
            if k.offmask != 0 {
                return Err(unsupported("keys.offmask"));
            }
            Ok(U32Key { mask: k.mask, value: k.val, offset: k.off })
        })
        .collect::<Result<_, _>>()?;
    Ok(U32Selector {
        terminal: sel.flags.contains(TcU32SelectorFlags::Terminal),
        hash_mask: sel.hmask,
        hash_offset: sel.hoff,
        keys,
    })
}
