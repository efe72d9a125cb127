//! Mutations sent as batches: many rtnetlink requests packed into one `sendmsg` buffer, as `tc -batch` does,
//! over a plain netlink socket of their own (no per-request channel, future or reply stream).
//!
//! The kernel handles a route socket's `sendmsg` synchronously: when the call returns, every message of the
//! buffer has been processed in order and every reply is queued on the socket. Only the last message of a
//! batch asks for an ACK (`NLM_F_ACK`); a refused message always gets an `NLMSG_ERROR` (errno + extended-ack
//! text), ACK or not. So the replies to a batch are its refusals, in order, followed by the last message's
//! reply, and each names the refused request by its sequence number. The kernel goes on with the rest of the
//! buffer after a refusal (messages after it may fail as its consequence, or succeed): the error reported is
//! the first refusal, no further batch is sent, and the caller treats the kernel's state as unknown (the
//! reconcile shell drops its record, so the next call dumps).

use netlink_packet_core::{NLM_F_ACK, NLMSG_ERROR};
use netlink_sys::Socket;

use super::error::{DatapathError, Place};
use super::model::Operation;
use super::netlink::{self, KernelError};

/// Upper bound of one batch's bytes: well below the socket's default send buffer (`wmem_default`, 208 KiB;
/// `sendmsg` refuses a message larger than the send buffer), large enough that 1,000 destinations take a few
/// calls.
const BATCH_BYTES: usize = 64 << 10;
/// Upper bound of one batch's messages, so the refusals of a whole batch always fit the receive buffer.
const BATCH_MESSAGES: usize = 1024;
/// Big enough for any reply the kernel sends on this socket (errors echo only the request's header).
const RECEIVE_BYTES: usize = 64 << 10;

/// Consecutive requests in one buffer: sequence numbers `first_seq .. first_seq + operations.len()`,
/// `operations` indexing into the caller's list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Batch {
    pub bytes: Vec<u8>,
    pub first_seq: u32,
    /// Index of the batch's first operation in the list given to [`encode`].
    pub first_operation: usize,
    pub len: usize,
}

impl Batch {
    fn last_seq(&self) -> u32 {
        self.first_seq.wrapping_add(self.len as u32 - 1)
    }

    /// The operation index that sequence number `seq` belongs to, if it is one of this batch's.
    fn operation_of(&self, seq: u32) -> Option<usize> {
        let offset = seq.wrapping_sub(self.first_seq) as usize;
        (offset < self.len).then_some(self.first_operation + offset)
    }
}

/// The requests for `operations` on interface `ifindex`, in order, split into batches; sequence numbers start
/// at `first_seq`. Each message is [`netlink::encode`]'s, with `NLM_F_ACK` kept only on a batch's last.
pub(crate) fn encode(
    operations: &[Operation],
    ifindex: u32,
    first_seq: u32,
) -> Result<Vec<Batch>, (usize, netlink::EncodeError)> {
    let mut batches = Vec::new();
    let mut current = Batch { bytes: Vec::with_capacity(BATCH_BYTES), first_seq, first_operation: 0, len: 0 };
    // Where the current batch's last message's flags are, to set NLM_F_ACK on it when the batch closes.
    let mut last_flags_at = 0;
    let close = |batch: &mut Batch, last_flags_at: usize| {
        let flags = u16::from_ne_bytes([batch.bytes[last_flags_at], batch.bytes[last_flags_at + 1]]) | NLM_F_ACK;
        batch.bytes[last_flags_at..last_flags_at + 2].copy_from_slice(&flags.to_ne_bytes());
    };
    for (index, operation) in operations.iter().enumerate() {
        let mut message = netlink::encode(operation, ifindex).map_err(|e| (index, e))?;
        message.header.sequence_number = first_seq.wrapping_add(index as u32);
        message.header.flags &= !NLM_F_ACK;
        let length = message.buffer_len();
        if current.len > 0 && (current.len == BATCH_MESSAGES || current.bytes.len() + length > BATCH_BYTES) {
            close(&mut current, last_flags_at);
            let next = Batch {
                bytes: Vec::with_capacity(BATCH_BYTES),
                first_seq: message.header.sequence_number,
                first_operation: index,
                len: 0,
            };
            batches.push(std::mem::replace(&mut current, next));
        }
        let start = current.bytes.len();
        current.bytes.resize(start + length, 0);
        message.serialize(&mut current.bytes[start..]);
        // nlmsghdr: length (4), type (2), flags (2), …
        last_flags_at = start + 6;
        current.len += 1;
    }
    if current.len > 0 {
        close(&mut current, last_flags_at);
        batches.push(current);
    }
    Ok(batches)
}

/// What the replies to one batch said.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Replies {
    /// The first refusal: the operation's index (into the list given to [`encode`]) and the kernel's error.
    pub first_refusal: Option<(usize, KernelError)>,
    /// Whether the reply to the batch's last message has arrived (every reply of the batch is then in).
    pub complete: bool,
}

impl Replies {
    /// Takes in the netlink messages of one received datagram; messages of other batches are ignored.
    pub fn absorb(&mut self, batch: &Batch, mut datagram: &[u8]) -> Result<(), String> {
        while datagram.len() >= 16 {
            let length = u32::from_ne_bytes(datagram[0..4].try_into().expect("4 bytes")) as usize;
            if length < 16 || length > datagram.len() {
                return Err(format!("reply of {length} bytes in a datagram of {}", datagram.len()));
            }
            let message_type = u16::from_ne_bytes([datagram[4], datagram[5]]);
            let seq = u32::from_ne_bytes(datagram[8..12].try_into().expect("4 bytes"));
            if message_type == NLMSG_ERROR
                && let Some(operation) = batch.operation_of(seq)
            {
                let error = KernelError::parse(&datagram[..length]).map_err(|e| e.to_string())?;
                if let Some(error) = error
                    && self.first_refusal.as_ref().is_none_or(|(first, _)| operation < *first)
                {
                    self.first_refusal = Some((operation, error));
                }
                if seq == batch.last_seq() {
                    self.complete = true;
                }
            }
            datagram = &datagram[((length + 3) & !3).min(datagram.len())..];
        }
        Ok(())
    }
}

/// A plain route socket for mutation batches, opened in the same namespace as the [`Datapath`]'s connection.
///
/// [`Datapath`]: super::Datapath
pub(crate) struct BatchSocket {
    socket: Socket,
    next_seq: u32,
}

impl BatchSocket {
    pub fn new(socket: Socket) -> BatchSocket {
        BatchSocket { socket, next_seq: 1 }
    }

    /// Sends `operations` in order and stops at the first batch with a refusal, reporting the first refused
    /// operation with the kernel's errno and extended-ack text.
    pub fn send(&mut self, place: &Place, ifindex: u32, operations: &[Operation]) -> Result<(), DatapathError> {
        if operations.is_empty() {
            return Ok(());
        }
        let first_seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(operations.len() as u32).max(1);
        let batches = encode(operations, ifindex, first_seq).map_err(|(index, e)| DatapathError::Protocol {
            place: place.clone(),
            message: format!("{}: {e}", operations[index]),
        })?;
        let transport = |index: usize, what: String| DatapathError::Protocol {
            place: place.clone(),
            message: format!("{}: {what}", operations[index]),
        };
        // Allocated per call, not kept: the agent holds one socket per pod, and idle pods should cost no buffer.
        let mut receive = Vec::with_capacity(RECEIVE_BYTES);
        for batch in &batches {
            let sent =
                self.socket.send(&batch.bytes, 0).map_err(|e| transport(batch.first_operation, e.to_string()))?;
            if sent != batch.bytes.len() {
                return Err(transport(batch.first_operation, format!("sent {sent} of {} bytes", batch.bytes.len())));
            }
            let mut replies = Replies::default();
            while !replies.complete {
                receive.clear();
                // Blocks at most for the socket's receive timeout: the replies are queued before `send` returns.
                self.socket
                    .recv(&mut receive, 0)
                    .map_err(|e| transport(batch.first_operation, format!("reading the kernel's replies: {e}")))?;
                replies.absorb(batch, &receive).map_err(|e| transport(batch.first_operation, e))?;
            }
            if let Some((index, error)) = replies.first_refusal {
                let operation = &operations[index];
                return Err(DatapathError::from_kernel(
                    place.clone(),
                    operation.to_string(),
                    Some(operation.object().kind_name()),
                    error.code,
                    error.message.unwrap_or_default(),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use ipnet::IpNet;
    use isthmus_agent_api::test_util::rate;
    use netlink_packet_core::NLM_F_CAPPED;

    use super::*;
    use crate::datapath::desired::DesiredState;
    use crate::datapath::handles::Slot;
    use crate::datapath::model::TcObject;
    use crate::datapath::tree;

    fn install(destinations: u32) -> Vec<Operation> {
        let desired = DesiredState::new(
            (0..destinations)
                .map(|i| (IpNet::from(IpAddr::from(Ipv4Addr::from(0x0a10_0000 + i))), rate(1_000_000 + u64::from(i)))),
        )
        .unwrap();
        let slots = desired.destinations().enumerate().map(|(i, (d, _))| (*d, Slot::new(i).unwrap())).collect();
        tree::build(&desired, &slots).into_iter().map(Operation::Add).collect()
    }

    /// The netlink messages of a buffer: (sequence number, flags, bytes).
    fn messages(mut bytes: &[u8]) -> Vec<(u32, u16, Vec<u8>)> {
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let length = u32::from_ne_bytes(bytes[0..4].try_into().unwrap()) as usize;
            let flags = u16::from_ne_bytes([bytes[6], bytes[7]]);
            let seq = u32::from_ne_bytes(bytes[8..12].try_into().unwrap());
            out.push((seq, flags, bytes[..length].to_vec()));
            bytes = &bytes[(length + 3) & !3..];
        }
        out
    }

    #[test]
    fn a_batch_is_the_codecs_messages_back_to_back_with_one_ack_request_at_the_end() {
        let operations = install(2);
        let batches = encode(&operations, 7, 100).unwrap();
        assert_eq!(batches.len(), 1);
        assert_eq!((batches[0].first_seq, batches[0].first_operation, batches[0].len), (100, 0, operations.len()));
        let got = messages(&batches[0].bytes);
        assert_eq!(got.len(), operations.len());
        for (i, ((seq, flags, bytes), operation)) in got.iter().zip(&operations).enumerate() {
            // Byte for byte the codec's request (golden-tested against iproute2), except the sequence number
            // and, on all but the last, the ACK request.
            let mut expected = netlink::encode(operation, 7).unwrap();
            expected.header.sequence_number = 100 + i as u32;
            let last = i == operations.len() - 1;
            if !last {
                expected.header.flags &= !NLM_F_ACK;
            }
            let mut expected_bytes = vec![0; expected.buffer_len()];
            expected.serialize(&mut expected_bytes);
            assert_eq!(bytes, &expected_bytes, "message {i}");
            assert_eq!((*seq, flags & NLM_F_ACK != 0), (100 + i as u32, last), "message {i}");
        }
    }

    #[test]
    fn a_large_install_splits_into_batches_that_cover_every_operation_once_in_order() {
        let operations = install(1000);
        let batches = encode(&operations, 3, u32::MAX - 10).unwrap();
        assert!(batches.len() > 1, "{} batches", batches.len());
        let mut next = 0;
        for batch in &batches {
            assert!(batch.bytes.len() <= BATCH_BYTES && batch.len <= BATCH_MESSAGES);
            assert_eq!(batch.first_operation, next);
            let got = messages(&batch.bytes);
            assert_eq!(got.len(), batch.len);
            for (j, (seq, flags, _)) in got.iter().enumerate() {
                // Sequence numbers wrap around u32::MAX.
                assert_eq!(*seq, (u32::MAX - 10).wrapping_add((next + j) as u32));
                assert_eq!(flags & NLM_F_ACK != 0, j == batch.len - 1);
            }
            next += batch.len;
        }
        assert_eq!(next, operations.len());
    }

    #[test]
    fn an_operation_the_codec_refuses_is_named_by_its_index() {
        let mut operations = install(1);
        operations.insert(
            2,
            Operation::Add(TcObject::Qdisc(crate::datapath::model::Qdisc {
                handle: crate::datapath::model::Handle(0x5000_0000),
                parent: crate::datapath::model::Handle::ROOT,
                kind: crate::datapath::model::QdiscKind::Foreign("fq".into()),
            })),
        );
        let (index, error) = encode(&operations, 3, 1).unwrap_err();
        assert_eq!(index, 2);
        assert!(error.to_string().contains("fq"), "{error}");
    }

    /// An NLMSG_ERROR as a socket with NETLINK_CAP_ACK and NETLINK_EXT_ACK receives it: header, errno, the
    /// request's header, then the extended-ack message.
    fn error_reply(seq: u32, errno: i32, text: &str) -> Vec<u8> {
        let mut tlvs = Vec::new();
        if !text.is_empty() {
            let mut value = text.as_bytes().to_vec();
            value.push(0);
            tlvs.extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
            tlvs.extend_from_slice(&1u16.to_ne_bytes());
            tlvs.extend_from_slice(&value);
            tlvs.resize((tlvs.len() + 3) & !3, 0);
        }
        let length = 16 + 4 + 16 + tlvs.len();
        let mut reply = Vec::new();
        reply.extend_from_slice(&(length as u32).to_ne_bytes());
        reply.extend_from_slice(&NLMSG_ERROR.to_ne_bytes());
        let flags = NLM_F_CAPPED
            | if text.is_empty() {
                0
            } else {
                0x200 /* NLM_F_ACK_TLVS */
            };
        reply.extend_from_slice(&flags.to_ne_bytes());
        reply.extend_from_slice(&seq.to_ne_bytes());
        reply.extend_from_slice(&0u32.to_ne_bytes());
        reply.extend_from_slice(&(-errno).to_ne_bytes());
        let mut echoed = [0u8; 16];
        echoed[8..12].copy_from_slice(&seq.to_ne_bytes());
        reply.extend_from_slice(&echoed);
        reply.extend_from_slice(&tlvs);
        reply
    }

    #[test]
    fn refusals_are_attributed_by_sequence_number_and_the_first_one_wins() {
        let batch = Batch { bytes: Vec::new(), first_seq: 500, first_operation: 40, len: 10 };
        let mut replies = Replies::default();
        // Another batch's late reply, then two refusals in one datagram (a later one first), then the ACK of
        // the batch's last message.
        replies.absorb(&batch, &error_reply(499, libc::EINVAL, "not ours")).unwrap();
        let mut datagram = error_reply(507, libc::ENOENT, "second refusal");
        datagram.extend(error_reply(503, libc::EEXIST, "Exclusivity flag on, cannot modify"));
        replies.absorb(&batch, &datagram).unwrap();
        assert!(!replies.complete);
        replies.absorb(&batch, &error_reply(509, 0, "")).unwrap();
        assert!(replies.complete);
        let (index, error) = replies.first_refusal.unwrap();
        assert_eq!(index, 43);
        assert_eq!((error.code, error.message.as_deref()), (libc::EEXIST, Some("Exclusivity flag on, cannot modify")));
    }

    #[test]
    fn a_refused_last_message_completes_the_batch_and_a_truncated_reply_is_an_error() {
        let batch = Batch { bytes: Vec::new(), first_seq: 1, first_operation: 0, len: 1 };
        let mut replies = Replies::default();
        replies.absorb(&batch, &error_reply(1, libc::EBUSY, "")).unwrap();
        assert!(replies.complete);
        assert_eq!(replies.first_refusal.map(|(i, e)| (i, e.code, e.message)), Some((0, libc::EBUSY, None)));
        let reply = error_reply(1, libc::EBUSY, "");
        assert!(Replies::default().absorb(&batch, &reply[..reply.len() - 4]).is_err());
    }

    /// Against this host's kernel, in a scratch namespace that disappears with the socket: a refusal in the
    /// middle of a batch names that operation, with the kernel's errno and extended-ack text and the place.
    #[tokio::test]
    #[ignore = "needs root: make unit runs it"]
    async fn a_kernel_refusal_mid_batch_names_the_refused_operation_and_carries_the_kernels_text() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "needs root for a scratch network namespace (make unit runs as root)"
        );
        let datapath = crate::datapath::Datapath::open_scratch().await.unwrap();
        let place = Place { netns: datapath.netns(), interface: "lo".into() };
        let ifindex = datapath.ifindex("lo").await.unwrap();
        let mut operations = install(2);
        let orphan = Operation::Add(TcObject::Qdisc(crate::datapath::model::Qdisc {
            handle: crate::datapath::model::Handle(0x2ff0_0000),
            parent: crate::datapath::model::Handle(0x1570_9999),
            kind: match &operations[3] {
                Operation::Add(TcObject::Qdisc(q)) => q.kind.clone(),
                other => panic!("operation 3 is {other:?}, expected the first destination's tbf"),
            },
        }));
        operations.insert(4, orphan);
        let error = datapath.send(&place, ifindex, operations.clone()).await.unwrap_err();
        let DatapathError::Kernel { place: at, operation, errno, message } = &error else {
            panic!("expected a kernel refusal, got {error:?}");
        };
        assert_eq!(at, &place);
        assert_eq!(operation, "add qdisc tbf 2ff0:0 parent 1570:9999");
        assert_eq!(*errno, libc::ENOENT, "{error}");
        // The kernel's own words (extended ack), not just strerror.
        let strerror = std::io::Error::from_raw_os_error(libc::ENOENT).to_string();
        assert!(!message.is_empty() && *message != strerror, "{error}");
        let text = error.to_string();
        assert!(text.contains(&place.netns.to_string()) && text.contains("interface lo"), "{text}");
        // The kernel went on with the rest of the buffer: the second destination's objects are installed, so
        // adding them again is refused as existing (the reconcile shell treats the state as unknown after a
        // refusal and dumps).
        let again = datapath.send(&place, ifindex, operations[5..].to_vec()).await.unwrap_err();
        assert!(matches!(again, DatapathError::Kernel { errno, .. } if errno == libc::EEXIST), "{again}");
    }

    /// Compiles only while the futures of `Datapath`'s methods are `Send` (so callers may `tokio::spawn` them).
    #[allow(dead_code)]
    fn datapath_futures_are_send(datapath: &crate::datapath::Datapath, desired: &DesiredState) {
        fn send<T: Send>(_: T) {}
        send(datapath.reconcile("eth0", desired));
        send(datapath.update("eth0", desired));
        send(datapath.observe("eth0"));
        send(datapath.installed("eth0", crate::datapath::QueueBudget::DEFAULT));
    }
}
