//! The binary payloads the scenarios ask for, built here rather than pasted as opaque base64:
//! a valid 1×1 PNG (image content, the binary resource) and a short silent WAV (audio content).

use base64::{Engine, engine::general_purpose::STANDARD};

/// Base64 of a 1×1 opaque red RGBA PNG.
pub fn png_base64() -> String {
    STANDARD.encode(png(&[0xff, 0x00, 0x00, 0xff]))
}

/// Base64 of 8 samples of 8-bit mono silence at 8 kHz.
pub fn wav_base64() -> String {
    STANDARD.encode(wav(&[0x80; 8]))
}

fn png(rgba: &[u8; 4]) -> Vec<u8> {
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&1u32.to_be_bytes()); // width
    ihdr.extend_from_slice(&1u32.to_be_bytes()); // height
    // Bit depth 8, colour type 6 (RGBA), deflate, adaptive filtering, no interlace.
    ihdr.extend_from_slice(&[8, 6, 0, 0, 0]);
    // One scanline: filter type 0 (none), then the pixel.
    let mut scanline = vec![0u8];
    scanline.extend_from_slice(rgba);
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    chunk(&mut out, b"IHDR", &ihdr);
    chunk(&mut out, b"IDAT", &zlib_stored(&scanline));
    chunk(&mut out, b"IEND", &[]);
    out
}

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    let length = u32::try_from(data.len()).expect("a PNG chunk under 4 GiB");
    out.extend_from_slice(&length.to_be_bytes());
    let start = out.len();
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    let crc = crc32(&out[start..]);
    out.extend_from_slice(&crc.to_be_bytes());
}

/// A zlib stream holding `data` in one stored (uncompressed) deflate block.
fn zlib_stored(data: &[u8]) -> Vec<u8> {
    let length = u16::try_from(data.len()).expect("a stored block under 64 KiB");
    // CMF 0x78 (deflate, 32 KiB window), FLG 0x01 (makes the header a multiple of 31).
    let mut out = vec![0x78, 0x01, 0x01];
    out.extend_from_slice(&length.to_le_bytes());
    out.extend_from_slice(&(!length).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&adler32(data).to_be_bytes());
    out
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = 0xffff_ffffu32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn adler32(bytes: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for &byte in bytes {
        a = (a + u32::from(byte)) % 65521;
        b = (b + a) % 65521;
    }
    (b << 16) | a
}

fn wav(samples: &[u8]) -> Vec<u8> {
    const RATE: u32 = 8000;
    let data_len = u32::try_from(samples.len()).expect("a short sound");
    let mut out = b"RIFF".to_vec();
    out.extend_from_slice(&(36 + data_len).to_le_bytes());
    out.extend_from_slice(b"WAVEfmt ");
    out.extend_from_slice(&16u32.to_le_bytes()); // fmt chunk size
    out.extend_from_slice(&1u16.to_le_bytes()); // PCM
    out.extend_from_slice(&1u16.to_le_bytes()); // mono
    out.extend_from_slice(&RATE.to_le_bytes());
    out.extend_from_slice(&RATE.to_le_bytes()); // byte rate: 1 byte per sample
    out.extend_from_slice(&1u16.to_le_bytes()); // block align
    out.extend_from_slice(&8u16.to_le_bytes()); // bits per sample
    out.extend_from_slice(b"data");
    out.extend_from_slice(&data_len.to_le_bytes());
    out.extend_from_slice(samples);
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn checksums_match_their_definitions() {
        // The check values both standards publish for "123456789".
        assert_eq!(super::crc32(b"123456789"), 0xcbf4_3926);
        assert_eq!(super::adler32(b"Wikipedia"), 0x11e6_0398);
    }
}
