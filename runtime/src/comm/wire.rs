//! The byte framing the TCP store and the TCP communicator share: fixed-size
//! little-endian integers and length-prefixed byte strings, and f32 payloads
//! sent as their bytes in place.

use std::io::{self, Read, Write};

/// The longest key or value the store accepts (a guard against a stray
/// connection's bytes read as a length).
pub const MAX_FRAME: usize = 64 << 20;

pub fn write_u8(w: &mut impl Write, v: u8) -> io::Result<()> {
    w.write_all(&[v])
}

pub fn read_u8(r: &mut impl Read) -> io::Result<u8> {
    let mut b = [0; 1];
    r.read_exact(&mut b)?;
    Ok(b[0])
}

pub fn write_u64(w: &mut impl Write, v: u64) -> io::Result<()> {
    w.write_all(&v.to_le_bytes())
}

pub fn read_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

/// `bytes` preceded by their length.
pub fn write_bytes(w: &mut impl Write, bytes: &[u8]) -> io::Result<()> {
    write_u64(w, bytes.len() as u64)?;
    w.write_all(bytes)
}

/// A length-prefixed byte string of at most [`MAX_FRAME`] bytes.
pub fn read_bytes(r: &mut impl Read) -> io::Result<Vec<u8>> {
    let len = read_u64(r)?;
    if len > MAX_FRAME as u64 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("a frame of {len} bytes: not this protocol")));
    }
    let mut v = vec![0; len as usize];
    r.read_exact(&mut v)?;
    Ok(v)
}

#[cfg(not(target_endian = "little"))]
compile_error!("comm's TCP transport sends f32 payloads as their little-endian bytes in place");

/// `x`'s bytes, as they travel.
pub fn f32_bytes(x: &[f32]) -> &[u8] {
    // SAFETY: any initialised f32 is 4 initialised bytes; u8 has alignment 1.
    unsafe { std::slice::from_raw_parts(x.as_ptr().cast(), std::mem::size_of_val(x)) }
}

/// `x`'s bytes, to be overwritten by a payload.
pub fn f32_bytes_mut(x: &mut [f32]) -> &mut [u8] {
    // SAFETY: as in `f32_bytes`; every bit pattern is a valid f32.
    unsafe { std::slice::from_raw_parts_mut(x.as_mut_ptr().cast(), std::mem::size_of_val(x)) }
}
