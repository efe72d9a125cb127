//! The two things the rig needs to know or change in an ELF64 executable: whether it asks for an
//! interpreter (a static test binary must not), and rewriting that interpreter's path in place.

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ElfError {
    #[error("not an ELF64 little-endian file")]
    NotElf64,
    #[error("the program headers lie outside the file")]
    Truncated,
    #[error("no PT_INTERP: the file is static")]
    NoInterpreter,
    #[error("interpreter {0:?} is longer than the {1} bytes PT_INTERP holds")]
    TooLong(String, usize),
}

const PT_INTERP: u32 = 3;

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], at: usize) -> Option<usize> {
    usize::try_from(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?)).ok()
}

/// (offset, size) of the PT_INTERP segment's contents, if there is one.
fn interp_segment(elf: &[u8]) -> Result<Option<(usize, usize)>, ElfError> {
    if elf.get(..4) != Some(b"\x7fELF") || elf.get(4) != Some(&2) || elf.get(5) != Some(&1) {
        return Err(ElfError::NotElf64);
    }
    let phoff = u64_at(elf, 0x20).ok_or(ElfError::Truncated)?;
    let phentsize = usize::from(u16_at(elf, 0x36).ok_or(ElfError::Truncated)?);
    let phnum = usize::from(u16_at(elf, 0x38).ok_or(ElfError::Truncated)?);
    for i in 0..phnum {
        let base = phoff + i * phentsize;
        if u32_at(elf, base).ok_or(ElfError::Truncated)? == PT_INTERP {
            let offset = u64_at(elf, base + 8).ok_or(ElfError::Truncated)?;
            let size = u64_at(elf, base + 32).ok_or(ElfError::Truncated)?;
            if offset + size > elf.len() {
                return Err(ElfError::Truncated);
            }
            return Ok(Some((offset, size)));
        }
    }
    Ok(None)
}

/// Static (also static-pie): no interpreter to request.
pub fn is_static(elf: &[u8]) -> Result<bool, ElfError> {
    Ok(interp_segment(elf)?.is_none())
}

/// Rewrites the interpreter path in place (same segment, zero-padded), e.g. to a relative `./ld.so`.
pub fn set_interpreter(elf: &mut [u8], interp: &str) -> Result<(), ElfError> {
    let (offset, size) = interp_segment(elf)?.ok_or(ElfError::NoInterpreter)?;
    let new = interp.as_bytes();
    if new.len() + 1 > size {
        return Err(ElfError::TooLong(interp.to_owned(), size - 1));
    }
    let segment = &mut elf[offset..offset + size];
    segment.fill(0);
    segment[..new.len()].copy_from_slice(new);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ELF64 header with one program header, PT_INTERP or PT_LOAD.
    fn elf(p_type: u32, interp: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; 0x40 + 0x38];
        b[..6].copy_from_slice(b"\x7fELF\x02\x01");
        b[0x20..0x28].copy_from_slice(&0x40u64.to_le_bytes());
        b[0x36..0x38].copy_from_slice(&0x38u16.to_le_bytes());
        b[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
        b[0x40..0x44].copy_from_slice(&p_type.to_le_bytes());
        let offset = b.len() as u64;
        b[0x48..0x50].copy_from_slice(&offset.to_le_bytes());
        b[0x60..0x68].copy_from_slice(&(interp.len() as u64).to_le_bytes());
        b.extend_from_slice(interp);
        b
    }

    #[test]
    fn the_interpreter_is_found_and_rewritten_in_place() {
        let mut dynamic = elf(PT_INTERP, b"/lib64/ld-linux-x86-64.so.2\0");
        assert_eq!(is_static(&dynamic), Ok(false));
        let len = dynamic.len();
        set_interpreter(&mut dynamic, "./ld.so").unwrap();
        assert_eq!(dynamic.len(), len);
        assert!(dynamic.ends_with(b"./ld.so\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0"));
        assert_eq!(set_interpreter(&mut dynamic, &"x".repeat(28)), Err(ElfError::TooLong("x".repeat(28), 27)));
        assert_eq!(is_static(&elf(1, b"")), Ok(true));
        assert_eq!(set_interpreter(&mut elf(1, b""), "./ld.so"), Err(ElfError::NoInterpreter));
        assert_eq!(is_static(b"#!/bin/sh\n"), Err(ElfError::NotElf64));
        assert_eq!(is_static(&dynamic[..0x50]), Err(ElfError::Truncated));
    }
}
