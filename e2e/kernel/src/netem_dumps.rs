//! The kernel's own netem dumps, for the datapaths' golden test (`kernel_netem_dumps_decode_to_the_model` in
//! agent/datapaths/src/datapath/netlink/golden.rs reads them from `golden/netem_dumps.txt`): our machines'
//! kernels have no netem, so `rig capture-netem-dumps` boots the stock kernels and the guest binary, run with
//! `--capture-netem-dumps` (src/capture.rs), adds each case's netem with iproute2's `tc`, dumps the qdiscs over
//! rtnetlink and prints each netem's RTM_NEWQDISC message on the console; the host writes the file.
//!
//! Here are the pure parts of both sides: the cases, the dump request, finding the netem messages in a
//! datagram of the kernel's reply, the console lines, and the file.

use std::fmt::Write as _;

/// Each case's name (the golden test's, after the kernel's prefix) and the arguments after
/// `tc qdisc add dev v0 root handle 20: netem`.
pub const CASES: [(&str, &str); 4] = [
    (
        "netem_dump_all",
        "delay 50ms 5ms 25% loss 1% 30% duplicate 2% 10% corrupt 0.5% 5% reorder 25% 50% gap 5 limit 1000",
    ),
    ("netem_dump_gemodel", "loss gemodel 1% 10% 70% 0.1% limit 1000"),
    ("netem_dump_limit", "limit 5000"),
    ("netem_dump_rate", "rate 10mbit limit 1000"),
];

/// `ISTHMUS-NETEM-DUMP <case> <hex of one RTM_NEWQDISC message>`
pub const DUMP_PREFIX: &str = "ISTHMUS-NETEM-DUMP ";
/// `ISTHMUS-NETEM-TC <what tc -V says>`
pub const TC_PREFIX: &str = "ISTHMUS-NETEM-TC ";
/// `ISTHMUS-NETEM-FAILED <case> <why>`
pub const FAILED_PREFIX: &str = "ISTHMUS-NETEM-FAILED ";

const NLMSG_HDRLEN: usize = 16;
const TCMSG_LEN: usize = 20;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const RTM_NEWQDISC: u16 = 36;
const RTM_GETQDISC: u16 = 38;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
const TCA_KIND: u16 = 1;

/// What `tc qdisc show dev <ifindex>` asks: an RTM_GETQDISC dump request whose tcmsg names the interface.
pub fn dump_request(seq: u32, ifindex: i32) -> Vec<u8> {
    let mut m = Vec::with_capacity(NLMSG_HDRLEN + TCMSG_LEN);
    m.extend(((NLMSG_HDRLEN + TCMSG_LEN) as u32).to_le_bytes());
    m.extend(RTM_GETQDISC.to_le_bytes());
    m.extend((NLM_F_REQUEST | NLM_F_DUMP).to_le_bytes());
    m.extend(seq.to_le_bytes());
    m.extend(0u32.to_le_bytes()); // the kernel's port
    m.extend([0u8; 4]); // tcm_family AF_UNSPEC and padding
    m.extend(ifindex.to_le_bytes());
    m.extend([0u8; 12]); // tcm_handle, tcm_parent, tcm_info
    m
}

/// One datagram of the kernel's reply to a dump: its netem RTM_NEWQDISC messages, whole, and whether the dump
/// ended in it.
#[derive(Debug, PartialEq, Eq)]
pub struct Datagram<'a> {
    pub netem: Vec<&'a [u8]>,
    pub done: bool,
}

/// Reads one datagram of a dump's reply; an NLMSG_ERROR or a message that runs past the datagram is an error.
pub fn read_datagram(datagram: &[u8]) -> Result<Datagram<'_>, String> {
    let mut reply = Datagram { netem: Vec::new(), done: false };
    let mut at = 0;
    while datagram.len() - at >= NLMSG_HDRLEN {
        let len = u32::from_le_bytes(datagram[at..at + 4].try_into().expect("4 bytes")) as usize;
        let kind = u16::from_le_bytes([datagram[at + 4], datagram[at + 5]]);
        if len < NLMSG_HDRLEN || len > datagram.len() - at {
            return Err(format!("a message of {len} bytes at offset {at} of a {}-byte datagram", datagram.len()));
        }
        let message = &datagram[at..at + len];
        match kind {
            NLMSG_DONE => reply.done = true,
            NLMSG_ERROR => {
                let errno = message.get(16..20).map(|e| i32::from_le_bytes(e.try_into().expect("4 bytes")));
                return Err(format!("the kernel answered the dump with an error (errno {errno:?})"));
            }
            RTM_NEWQDISC if kind_of(message) == Some(&b"netem"[..]) => reply.netem.push(message),
            _ => {}
        }
        at += len.next_multiple_of(4);
    }
    Ok(reply)
}

/// An RTM_NEWQDISC message's TCA_KIND, without its NUL.
fn kind_of(message: &[u8]) -> Option<&[u8]> {
    let mut attrs = message.get(NLMSG_HDRLEN + TCMSG_LEN..)?;
    while attrs.len() >= 4 {
        let len = u16::from_le_bytes([attrs[0], attrs[1]]) as usize;
        let kind = u16::from_le_bytes([attrs[2], attrs[3]]);
        if len < 4 || len > attrs.len() {
            return None;
        }
        if kind == TCA_KIND {
            let value = &attrs[4..len];
            return Some(value.strip_suffix(b"\0").unwrap_or(value));
        }
        attrs = attrs.get(len.next_multiple_of(4)..).unwrap_or_default();
    }
    None
}

/// The console line carrying one case's message.
pub fn dump_line(case: &str, message: &[u8]) -> String {
    format!("{DUMP_PREFIX}{case} {}\n", hex(message))
}

/// What one guest's console says.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Captured {
    /// `tc -V` in the guest.
    pub tc_version: Option<String>,
    /// Case name and message, in the console's order.
    pub dumps: Vec<(String, Vec<u8>)>,
    /// Cases the guest could not capture and lines that did not read.
    pub problems: Vec<String>,
}

/// Reads the capture's lines off a guest's console. A kernel message can land in front of a line, so the
/// prefixes are searched for, not anchored (as in `protocol::parse_line`).
pub fn parse_console(console: &str) -> Captured {
    let mut captured = Captured::default();
    for line in console.lines() {
        let line = line.trim_end();
        if let Some(at) = line.find(TC_PREFIX) {
            captured.tc_version = Some(line[at + TC_PREFIX.len()..].trim().to_owned());
        } else if let Some(at) = line.find(FAILED_PREFIX) {
            captured.problems.push(line[at + FAILED_PREFIX.len()..].to_owned());
        } else if let Some(at) = line.find(DUMP_PREFIX) {
            let rest = &line[at + DUMP_PREFIX.len()..];
            let parsed = rest.split_once(' ').ok_or("no message").and_then(|(case, hex)| {
                let bytes = unhex(hex).ok_or("not hex")?;
                match read_datagram(&bytes) {
                    Ok(d) if d.netem.len() == 1 && d.netem[0].len() == bytes.len() => Ok((case.to_owned(), bytes)),
                    _ => Err("not one netem RTM_NEWQDISC message"),
                }
            });
            match parsed {
                Ok(dump) => captured.dumps.push(dump),
                Err(why) => captured.problems.push(format!("{why}: {}", shorten(rest))),
            }
        }
    }
    captured
}

/// One kernel's part of the file.
pub struct KernelDumps {
    /// The golden test's prefix of the case names: `bookworm`, `uml`.
    pub prefix: &'static str,
    /// Its release and how it ran, for the header.
    pub kernel: String,
    pub captured: Captured,
}

/// `netem_dumps.txt`, or why not: every kernel must have given every case exactly once, and nothing else.
pub fn render(kernels: &[KernelDumps]) -> Result<String, String> {
    let mut problems = Vec::new();
    let mut body = String::new();
    if kernels.is_empty() {
        problems.push("no kernel".to_owned());
    }
    for k in kernels {
        let c = &k.captured;
        problems.extend(c.problems.iter().map(|p| format!("{}: {p}", k.prefix)));
        for (case, _) in &c.dumps {
            if !CASES.iter().any(|(name, _)| name == case) {
                problems.push(format!("{}: unknown case {case}", k.prefix));
            }
        }
        let tc = c.tc_version.as_deref().unwrap_or_else(|| {
            problems.push(format!("{}: no `tc -V`", k.prefix));
            "?"
        });
        let _ = writeln!(body, "# kernel {}; the guest's `tc -V`: {tc}; prefix {}_", k.kernel, k.prefix);
        for (name, _) in CASES {
            let found: Vec<&[u8]> = c.dumps.iter().filter(|(case, _)| case == name).map(|(_, m)| &m[..]).collect();
            match found[..] {
                [message] => {
                    let _ = writeln!(body, "{}_{name} {}", k.prefix, hex(message));
                }
                [] => problems.push(format!("{}: no dump of {name}", k.prefix)),
                _ => problems.push(format!("{}: {} dumps of {name}", k.prefix, found.len())),
            }
        }
    }
    if !problems.is_empty() {
        return Err(problems.join("; "));
    }
    Ok(format!(
        "# RTM_NEWQDISC messages of the kernel's qdisc dump for netem qdiscs, captured by `e2e/kernel/rig \
         capture-netem-dumps`\n# (e2e/kernel/src/netem_dumps.rs): in each guest a veth v0 (up, its peer down) and \
         per case\n# `tc qdisc add dev v0 root handle 20: netem …`, then an RTM_GETQDISC dump as `tc qdisc show dev \
         v0` asks\n{body}"
    ))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.is_empty() || !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok()).collect()
}

fn shorten(text: &str) -> String {
    text.chars().take(60).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A message: header, tcmsg, the attributes given as (type, payload).
    fn message(kind: u16, attrs: &[(u16, &[u8])]) -> Vec<u8> {
        let mut m = vec![0u8; NLMSG_HDRLEN + TCMSG_LEN];
        for (t, payload) in attrs {
            m.extend((4 + payload.len() as u16).to_le_bytes());
            m.extend(t.to_le_bytes());
            m.extend(*payload);
            m.resize(m.len().next_multiple_of(4), 0);
        }
        let len = m.len() as u32;
        m[0..4].copy_from_slice(&len.to_le_bytes());
        m[4..6].copy_from_slice(&kind.to_le_bytes());
        m[6..8].copy_from_slice(&2u16.to_le_bytes()); // NLM_F_MULTI
        m
    }

    fn qdisc(kind: &[u8]) -> Vec<u8> {
        // TCA_OPTIONS first, so that the kind is not the first attribute
        message(RTM_NEWQDISC, &[(2, &[1, 2, 3, 4, 5]), (TCA_KIND, kind), (7, &[0; 8])])
    }

    #[test]
    fn the_request_is_tc_qdisc_shows() {
        let r = dump_request(7, 3);
        assert_eq!(r.len(), 36);
        assert_eq!(&r[0..4], &36u32.to_le_bytes());
        assert_eq!(&r[4..6], &RTM_GETQDISC.to_le_bytes());
        assert_eq!(&r[6..8], &0x301u16.to_le_bytes());
        assert_eq!(&r[8..12], &7u32.to_le_bytes());
        assert_eq!(&r[20..24], &3i32.to_le_bytes());
        assert!(r[12..20].iter().chain(&r[24..]).all(|b| *b == 0));
    }

    #[test]
    fn only_netem_qdiscs_are_kept_and_done_ends_the_dump() {
        let netem = qdisc(b"netem\0");
        let mut datagram = qdisc(b"noqueue\0");
        datagram.extend(qdisc(b"netemx\0"));
        datagram.extend(&netem);
        datagram.extend(message(RTM_NEWQDISC + 4, &[(TCA_KIND, b"netem\0")])); // RTM_NEWTCLASS
        let partial = read_datagram(&datagram).unwrap();
        assert_eq!(partial, Datagram { netem: vec![&netem[..]], done: false });

        datagram.extend(message(NLMSG_DONE, &[]));
        assert_eq!(read_datagram(&datagram).unwrap(), Datagram { netem: vec![&netem[..]], done: true });
    }

    /// The kernels' own messages, as the golden test reads them: each is one netem message, whole.
    #[test]
    fn the_golden_files_kernel_messages_read_as_one_netem_each() {
        let golden = include_str!("../../../agent/datapaths/src/datapath/netlink/golden/netem_dumps.txt");
        let mut names = Vec::new();
        for line in golden.lines().filter(|l| !l.starts_with('#')) {
            let (name, hex) = line.split_once(' ').unwrap();
            let bytes = unhex(hex).unwrap();
            let datagram = read_datagram(&bytes).unwrap();
            assert_eq!(datagram, Datagram { netem: vec![&bytes[..]], done: false }, "{name}");
            names.push(name);
        }
        let expected: Vec<String> =
            ["bookworm", "uml"].iter().flat_map(|k| CASES.iter().map(move |(c, _)| format!("{k}_{c}"))).collect();
        assert_eq!(names, expected);
    }

    #[test]
    fn errors_and_truncation_are_refused() {
        let mut error = message(NLMSG_ERROR, &[]);
        error[16..20].copy_from_slice(&(-22i32).to_le_bytes());
        assert!(read_datagram(&error).unwrap_err().contains("-22"), "{:?}", read_datagram(&error));
        let netem = qdisc(b"netem\0");
        assert!(read_datagram(&netem[..netem.len() - 4]).is_err());
        let mut short = netem.clone();
        short[0..4].copy_from_slice(&8u32.to_le_bytes());
        assert!(read_datagram(&short).is_err());
        // a broken attribute makes a message no netem, not a panic
        let mut broken = netem.clone();
        broken[36..38].copy_from_slice(&200u16.to_le_bytes());
        assert_eq!(read_datagram(&broken).unwrap().netem.len(), 0);
    }

    fn console(cases: &[&str], tc: bool) -> String {
        let netem = qdisc(b"netem\0");
        let mut text = String::from("[    0.000000] Linux version 7.2\n");
        if tc {
            text.push_str("ISTHMUS-NETEM-TC tc utility, iproute2-6.1.0, libbpf 1.1.2\r\n");
        }
        for case in cases {
            text.push_str("[    3.1] veth: link up");
            text.push_str(&dump_line(case, &netem));
        }
        text
    }

    fn all_cases() -> Vec<&'static str> {
        CASES.iter().map(|(name, _)| *name).collect()
    }

    #[test]
    fn the_console_reads_back_behind_kernel_messages() {
        let c = parse_console(&console(&all_cases(), true));
        assert_eq!(c.tc_version.as_deref(), Some("tc utility, iproute2-6.1.0, libbpf 1.1.2"));
        assert_eq!(c.dumps.len(), 4);
        assert_eq!(c.dumps[1], ("netem_dump_gemodel".to_owned(), qdisc(b"netem\0")));
        assert!(c.problems.is_empty());

        let bad = parse_console(
            "ISTHMUS-NETEM-DUMP netem_dump_limit 0g\nISTHMUS-NETEM-DUMP netem_dump_rate\n\
             ISTHMUS-NETEM-FAILED netem_dump_all tc: exit status 2\n",
        );
        assert!(bad.dumps.is_empty());
        assert_eq!(bad.problems.len(), 3, "{:?}", bad.problems);
        let pfifo = format!("ISTHMUS-NETEM-DUMP netem_dump_limit {}", hex(&qdisc(b"pfifo\0")));
        assert_eq!(parse_console(&pfifo).problems.len(), 1);
    }

    fn kernels(sid_cases: &[&str], sid_tc: bool) -> Vec<KernelDumps> {
        vec![
            KernelDumps {
                prefix: "bookworm",
                kernel: "6.1.0-57-amd64 (Debian bookworm, QEMU TCG)".into(),
                captured: parse_console(&console(&all_cases(), true)),
            },
            KernelDumps {
                prefix: "uml",
                kernel: "7.2.7 (Debian sid, User-Mode Linux)".into(),
                captured: parse_console(&console(sid_cases, sid_tc)),
            },
        ]
    }

    #[test]
    fn the_file_has_every_case_of_every_kernel_in_order_as_the_golden_test_reads_it() {
        let mut reversed = all_cases();
        reversed.reverse();
        let file = render(&kernels(&reversed, true)).unwrap();
        let lines: Vec<&str> = file.lines().filter(|l| !l.starts_with('#')).collect();
        let names: Vec<&str> = lines.iter().map(|l| l.split_once(' ').unwrap().0).collect();
        assert_eq!(
            names,
            [
                "bookworm_netem_dump_all",
                "bookworm_netem_dump_gemodel",
                "bookworm_netem_dump_limit",
                "bookworm_netem_dump_rate",
                "uml_netem_dump_all",
                "uml_netem_dump_gemodel",
                "uml_netem_dump_limit",
                "uml_netem_dump_rate",
            ]
        );
        assert!(lines.iter().all(|l| l.ends_with(&hex(&qdisc(b"netem\0")))));
        assert!(file.contains(
            "# kernel 7.2.7 (Debian sid, User-Mode Linux); the guest's `tc -V`: tc utility, iproute2-6.1.0, libbpf \
             1.1.2; prefix uml_\n"
        ));
        assert!(file.starts_with("# RTM_NEWQDISC messages"));
    }

    #[test]
    fn the_file_is_refused_unless_every_dump_came_back() {
        let all = all_cases();
        let err = render(&kernels(&all[..3], true)).unwrap_err();
        assert_eq!(err, "uml: no dump of netem_dump_rate");
        let twice = [all.clone(), vec!["netem_dump_limit"]].concat();
        assert_eq!(render(&kernels(&twice, true)).unwrap_err(), "uml: 2 dumps of netem_dump_limit");
        let unknown = [all.clone(), vec!["netem_dump_other"]].concat();
        assert_eq!(render(&kernels(&unknown, true)).unwrap_err(), "uml: unknown case netem_dump_other");
        assert_eq!(render(&kernels(&all, false)).unwrap_err(), "uml: no `tc -V`");
        assert_eq!(render(&[]).unwrap_err(), "no kernel");
        let mut failed = kernels(&all, true);
        failed[0].captured.problems.push("netem_dump_all tc: exit status 2".into());
        assert_eq!(render(&failed).unwrap_err(), "bookworm: netem_dump_all tc: exit status 2");
    }
}
