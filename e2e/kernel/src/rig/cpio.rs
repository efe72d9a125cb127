//! The guests' initramfs: a `newc` cpio archive (the format the kernel unpacks into its rootfs), written
//! uncompressed: under QEMU's emulation the guest's own decompression costs more than reading the bytes.
//! The kernel unpacks archives laid end to end, so a cached base and a per-run part are simply concatenated.

use std::collections::HashSet;
use std::io::{self, Write};

const TRAILER: &str = "TRAILER!!!";

pub struct Cpio<W: Write> {
    out: W,
    written: u64,
    ino: u32,
    dirs: HashSet<String>,
}

impl<W: Write> Cpio<W> {
    pub fn new(out: W) -> Cpio<W> {
        Cpio { out, written: 0, ino: 1, dirs: HashSet::from([String::new()]) }
    }

    /// A directory (and its parents, which the kernel will not create by itself).
    pub fn dir(&mut self, path: &str) -> io::Result<()> {
        let path = path.trim_matches('/');
        if self.dirs.contains(path) {
            return Ok(());
        }
        if let Some((parent, _)) = path.rsplit_once('/') {
            self.dir(parent)?;
        }
        self.dirs.insert(path.to_owned());
        self.entry(path, 0o040_755, 0, &[])
    }

    pub fn file(&mut self, path: &str, executable: bool, data: &[u8]) -> io::Result<()> {
        self.parent_of(path)?;
        self.entry(path.trim_start_matches('/'), if executable { 0o100_755 } else { 0o100_644 }, 0, data)
    }

    pub fn symlink(&mut self, path: &str, target: &str) -> io::Result<()> {
        self.parent_of(path)?;
        self.entry(path.trim_start_matches('/'), 0o120_777, 0, target.as_bytes())
    }

    /// A character device node, e.g. /dev/console (5, 1), which the kernel opens before running /init.
    pub fn char_device(&mut self, path: &str, major: u32, minor: u32) -> io::Result<()> {
        self.parent_of(path)?;
        self.entry(path.trim_start_matches('/'), 0o020_600, (major << 20) | minor, &[])
    }

    pub fn finish(mut self) -> io::Result<W> {
        self.entry(TRAILER, 0, 0, &[])?;
        self.out.flush()?;
        Ok(self.out)
    }

    fn parent_of(&mut self, path: &str) -> io::Result<()> {
        match path.trim_start_matches('/').rsplit_once('/') {
            Some((parent, _)) => self.dir(parent),
            None => Ok(()),
        }
    }

    /// `rdev` packs major << 20 | minor.
    fn entry(&mut self, name: &str, mode: u32, rdev: u32, data: &[u8]) -> io::Result<()> {
        let ino = if name == TRAILER { 0 } else { self.ino };
        self.ino += 1;
        let nlink = if mode & 0o170_000 == 0o040_000 { 2 } else { 1 };
        let size = u32::try_from(data.len()).map_err(|_| io::Error::other(format!("{name}: over 4 GiB")))?;
        let header = format!(
            "070701{ino:08x}{mode:08x}{:08x}{:08x}{nlink:08x}{:08x}{size:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
            0,
            0,
            0,
            0,
            0,
            rdev >> 20,
            rdev & 0xfffff,
            name.len() + 1,
            0
        );
        self.put(header.as_bytes())?;
        self.put(name.as_bytes())?;
        self.put(&[0])?;
        self.pad()?;
        self.put(data)?;
        self.pad()
    }

    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    fn pad(&mut self) -> io::Result<()> {
        let pad = (4 - self.written % 4) % 4;
        self.put(&[0u8; 3][..pad as usize])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads entries back as (name, mode, data), the way the kernel's unpacker walks them.
    fn entries(mut b: &[u8]) -> Vec<(String, u32, Vec<u8>)> {
        let mut out = Vec::new();
        let mut offset = 0usize;
        loop {
            let field =
                |i: usize| u32::from_str_radix(std::str::from_utf8(&b[6 + 8 * i..14 + 8 * i]).unwrap(), 16).unwrap();
            assert_eq!(&b[..6], b"070701");
            let (mode, size, namesize) = (field(1), field(6) as usize, field(11) as usize);
            let name = String::from_utf8(b[110..110 + namesize - 1].to_vec()).unwrap();
            let data_at = (offset + 110 + namesize).next_multiple_of(4) - offset;
            let data = b[data_at..data_at + size].to_vec();
            let next = (offset + data_at + size).next_multiple_of(4) - offset;
            offset += next;
            b = &b[next..];
            if name == TRAILER {
                assert!(b.is_empty(), "nothing after the trailer");
                return out;
            }
            out.push((name, mode, data));
        }
    }

    #[test]
    fn parents_first_aligned_and_terminated() {
        let mut cpio = Cpio::new(Vec::new());
        cpio.file("/usr/sbin/tc", true, b"\x7fELF tc").unwrap();
        cpio.symlink("/bin/sh", "busybox").unwrap();
        cpio.char_device("/dev/console", 5, 1).unwrap();
        cpio.file("/modules/load.order", false, b"veth.ko\n").unwrap();
        let bytes = cpio.finish().unwrap();
        assert_eq!(bytes.len() % 4, 0, "the next archive starts aligned");
        let got: Vec<(String, u32)> = entries(&bytes).into_iter().map(|(n, m, _)| (n, m)).collect();
        assert_eq!(
            got,
            [
                ("usr".into(), 0o40755),
                ("usr/sbin".into(), 0o40755),
                ("usr/sbin/tc".into(), 0o100755),
                ("bin".into(), 0o40755),
                ("bin/sh".into(), 0o120777),
                ("dev".into(), 0o40755),
                ("dev/console".into(), 0o20600),
                ("modules".into(), 0o40755),
                ("modules/load.order".into(), 0o100644),
            ]
        );
        let all = entries(&bytes);
        assert_eq!(all[2].2, b"\x7fELF tc");
        assert_eq!(all[4].2, b"busybox");
        // rdevmajor and rdevminor of /dev/console
        let console = bytes.windows(11).position(|w| w == b"dev/console").unwrap() - 110;
        assert_eq!(&bytes[console + 6 + 8 * 9..console + 6 + 8 * 11], b"0000000500000001");
    }
}
