//! Kernel errors with their extended-ack text (`NLMSGERR_ATTR_MSG`).
//!
//! An `NLMSG_ERROR` payload is `struct nlmsgerr { int error; struct nlmsghdr msg; }`, then — when the request
//! was not echoed in full (`NLM_F_CAPPED`) right after the header, otherwise after the echoed request — the
//! extack TLVs (`NLM_F_ACK_TLVS`). netlink-packet-core 0.9's `ErrorMessage` keeps everything after `error` in
//! `header` without looking at it, and `ErrorMessage` alone does not say whether the echo was capped.
//! `crate::netns::socket::enable_extended_ack` sets `NETLINK_CAP_ACK` with `NETLINK_EXT_ACK`, so on such a socket
//! the TLVs always start right after the 16-byte echoed header: parse rtnetlink's `Error::NetlinkError(e)` with
//! `KernelError::from_error_message(&e, true)`. With the whole message at hand,
//! [`KernelError::from_netlink_message`] reads `NLM_F_CAPPED` from its header, and [`KernelError::parse`] takes
//! the raw bytes of a received `NLMSG_ERROR`.

use std::fmt;

use netlink_packet_core::{ErrorMessage, NLM_F_CAPPED, NLMSG_ERROR, NetlinkMessage, NetlinkPayload};

use super::DecodeError;
use super::attrs;

const NLMSGERR_ATTR_MSG: u16 = 1;
const NLMSGERR_ATTR_OFFS: u16 = 2;
const NLMSG_HDRLEN: usize = 16;

/// A request the kernel refused: errno and, when the kernel explained itself, the extack message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct KernelError {
    /// Positive errno (EINVAL = 22, …).
    pub code: i32,
    /// `NLMSGERR_ATTR_MSG`, e.g. "netem: cannot mix duplicating netems with other netems in tree".
    pub message: Option<String>,
    /// `NLMSGERR_ATTR_OFFS`: byte offset of the offending attribute in the request.
    pub offset: Option<u32>,
}

impl fmt::Display for KernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let errno = std::io::Error::from_raw_os_error(self.code);
        match &self.message {
            Some(message) => write!(f, "{message} ({errno})"),
            None => write!(f, "{errno}"),
        }
    }
}

impl KernelError {
    /// The error carried by an `NLMSG_ERROR` as netlink-packet-core parsed it; `None` for an ACK (code 0).
    /// `capped`: whether the kernel echoed only the request's header (always true on a socket set up by
    /// `crate::netns::socket::enable_extended_ack`).
    pub fn from_error_message(error: &ErrorMessage, capped: bool) -> Option<KernelError> {
        let code = error.code?.get();
        let echoed = &error.header;
        let tlv_start = if capped {
            NLMSG_HDRLEN
        } else {
            echoed
                .get(..4)
                .map(|len| (u32::from_ne_bytes(len.try_into().expect("4 bytes")) as usize + 3) & !3)
                .unwrap_or(NLMSG_HDRLEN)
        };
        let mut kernel_error = KernelError { code: -code, message: None, offset: None };
        // A malformed or absent TLV area leaves just the errno: the error itself is never lost.
        if let Some(Ok(tlvs)) = echoed.get(tlv_start..).map(|tlvs| attrs::parse("extack", tlvs)) {
            kernel_error.message = attrs::find(&tlvs, NLMSGERR_ATTR_MSG).map(|raw| {
                let text = raw.split(|b| *b == 0).next().unwrap_or_default();
                String::from_utf8_lossy(text).into_owned()
            });
            kernel_error.offset =
                attrs::find(&tlvs, NLMSGERR_ATTR_OFFS).and_then(|raw| attrs::u32_attr("extack", "OFFS", raw).ok());
        }
        Some(kernel_error)
    }

    /// The error in a received message; `None` for anything but a non-zero `NLMSG_ERROR`.
    pub fn from_netlink_message<I>(message: &NetlinkMessage<I>) -> Option<KernelError> {
        match &message.payload {
            NetlinkPayload::Error(error) => Self::from_error_message(error, message.header.flags & NLM_F_CAPPED != 0),
            _ => None,
        }
    }

    /// The error in the raw bytes of one received netlink message (header included); `Ok(None)` for an ACK.
    pub fn parse(raw: &[u8]) -> Result<Option<KernelError>, DecodeError> {
        let header = attrs::fixed::<NLMSG_HDRLEN>("netlink error", "nlmsghdr", raw)?;
        let message_type = u16::from_ne_bytes([header[4], header[5]]);
        if message_type != NLMSG_ERROR {
            return Err(DecodeError::Malformed {
                object: "netlink error",
                detail: format!("message type {message_type} is not NLMSG_ERROR"),
            });
        }
        let flags = u16::from_ne_bytes([header[6], header[7]]);
        let length =
            (u32::from_ne_bytes(header[0..4].try_into().expect("4 bytes")) as usize).clamp(NLMSG_HDRLEN, raw.len());
        let code = attrs::fixed::<4>("netlink error", "error", &raw[NLMSG_HDRLEN..length])?;
        let mut error = ErrorMessage::default();
        error.code = std::num::NonZeroI32::new(i32::from_ne_bytes(code));
        error.header = raw[NLMSG_HDRLEN + 4..length].to_vec();
        Ok(Self::from_error_message(&error, flags & NLM_F_CAPPED != 0))
    }
}
