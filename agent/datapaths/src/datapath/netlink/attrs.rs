//! Raw netlink attributes (`struct nlattr`), for the TCA_OPTIONS payloads netlink-packet-route does not model.

use netlink_packet_core::{DefaultNla, Nla};

use super::DecodeError;

const NLA_HEADER_LEN: usize = 4;
/// The kernel may set NLA_F_NESTED / NLA_F_NET_BYTEORDER on the type; they are not part of it.
const NLA_TYPE_MASK: u16 = 0x3fff;

const fn align4(len: usize) -> usize {
    (len + 3) & !3
}

/// Appends one attribute (header, payload, padding to 4 bytes), like iproute2's `addattr_l`.
pub(super) fn push(buf: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    let len = NLA_HEADER_LEN + payload.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(payload);
    buf.resize(buf.len() + align4(len) - len, 0);
}

pub(super) fn push_u32(buf: &mut Vec<u8>, kind: u16, value: u32) {
    push(buf, kind, &value.to_ne_bytes());
}

pub(super) fn push_u64(buf: &mut Vec<u8>, kind: u16, value: u64) {
    push(buf, kind, &value.to_ne_bytes());
}

/// Splits a run of attributes into (type, payload) pairs.
pub(super) fn parse<'a>(object: &'static str, mut buf: &'a [u8]) -> Result<Vec<(u16, &'a [u8])>, DecodeError> {
    let mut out = Vec::new();
    while buf.len() >= NLA_HEADER_LEN {
        let len = usize::from(u16::from_ne_bytes([buf[0], buf[1]]));
        let kind = u16::from_ne_bytes([buf[2], buf[3]]) & NLA_TYPE_MASK;
        if len < NLA_HEADER_LEN || len > buf.len() {
            return Err(DecodeError::Malformed {
                object,
                detail: format!("attribute {kind} claims {len} bytes, {} left", buf.len()),
            });
        }
        out.push((kind, &buf[NLA_HEADER_LEN..len]));
        buf = &buf[align4(len).min(buf.len())..];
    }
    Ok(out)
}

pub(super) fn find<'a>(attrs: &[(u16, &'a [u8])], kind: u16) -> Option<&'a [u8]> {
    attrs.iter().rev().find(|(k, _)| *k == kind).map(|(_, v)| *v)
}

/// The payload of a fixed-size attribute: at least `N` bytes (the kernel's own policy lets longer ones pass and
/// reads the prefix; a shorter one is malformed).
pub(super) fn fixed<const N: usize>(
    object: &'static str,
    field: &'static str,
    payload: &[u8],
) -> Result<[u8; N], DecodeError> {
    payload.get(..N).and_then(|p| p.try_into().ok()).ok_or(DecodeError::Length {
        object,
        field,
        expected: N,
        got: payload.len(),
    })
}

pub(super) fn u32_at(bytes: &[u8], offset: usize) -> u32 {
    u32::from_ne_bytes(bytes[offset..offset + 4].try_into().expect("4 bytes"))
}

pub(super) fn u32_attr(object: &'static str, field: &'static str, payload: &[u8]) -> Result<u32, DecodeError> {
    fixed::<4>(object, field, payload).map(u32::from_ne_bytes)
}

pub(super) fn u64_attr(object: &'static str, field: &'static str, payload: &[u8]) -> Result<u64, DecodeError> {
    fixed::<8>(object, field, payload).map(u64::from_ne_bytes)
}

/// The value bytes of a `DefaultNla` (netlink-packet-core keeps them private).
pub(super) fn default_nla_value(nla: &DefaultNla) -> Vec<u8> {
    let mut value = vec![0; nla.value_len()];
    nla.emit_value(&mut value);
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_pads_and_parse_reads_back() {
        let mut buf = Vec::new();
        push(&mut buf, 1, b"htb\0");
        push(&mut buf, 7, &[1, 2, 3]);
        push_u32(&mut buf, 2, 0xdead_beef);
        assert_eq!(buf.len(), 8 + 8 + 8);
        let attrs = parse("test", &buf).unwrap();
        assert_eq!(attrs, vec![(1, &b"htb\0"[..]), (7, &[1u8, 2, 3][..]), (2, &0xdead_beefu32.to_ne_bytes()[..])]);
    }

    #[test]
    fn parse_rejects_overlong_attribute() {
        let buf = [20u8, 0, 1, 0, 0, 0, 0, 0];
        assert!(matches!(parse("test", &buf), Err(DecodeError::Malformed { .. })));
    }

    #[test]
    fn parse_masks_nested_flag() {
        let mut buf = Vec::new();
        push_u32(&mut buf, 5 | 0x8000, 1);
        assert_eq!(parse("test", &buf).unwrap()[0].0, 5);
    }
}
