//! A minimal PNG writer (8-bit RGB, zlib with stored deflate blocks, so no compression crate)
//! and a canvas to draw the plot on: lines, rectangles and digits in a 3×5 bitmap font.

/// An RGB colour.
pub type Rgb = [u8; 3];

/// A picture being drawn, white at first.
pub struct Canvas {
    width: usize,
    height: usize,
    pixels: Vec<u8>,
}

/// 3×5 glyphs of 0-9, one row per 3 bits, top row first.
const DIGITS: [[u8; 5]; 10] = [
    [7, 5, 5, 5, 7],
    [2, 6, 2, 2, 7],
    [7, 1, 7, 4, 7],
    [7, 1, 7, 1, 7],
    [5, 5, 7, 1, 1],
    [7, 4, 7, 1, 7],
    [7, 4, 7, 5, 7],
    [7, 1, 1, 1, 1],
    [7, 5, 7, 5, 7],
    [7, 5, 7, 1, 7],
];

impl Canvas {
    /// A white canvas.
    pub fn new(width: usize, height: usize) -> Canvas {
        Canvas {
            width,
            height,
            pixels: vec![255; width * height * 3],
        }
    }

    /// Colours one pixel; outside the canvas, nothing.
    pub fn set(&mut self, x: i64, y: i64, colour: Rgb) {
        let (Ok(x), Ok(y)) = (usize::try_from(x), usize::try_from(y)) else {
            return;
        };
        if x < self.width && y < self.height {
            let at = (y * self.width + x) * 3;
            self.pixels[at..at + 3].copy_from_slice(&colour);
        }
    }

    /// A straight line from one point to another (Bresenham).
    pub fn line(&mut self, (x0, y0): (i64, i64), (x1, y1): (i64, i64), colour: Rgb) {
        let (dx, dy) = ((x1 - x0).abs(), -(y1 - y0).abs());
        let (sx, sy) = (if x0 < x1 { 1 } else { -1 }, if y0 < y1 { 1 } else { -1 });
        let (mut x, mut y, mut err) = (x0, y0, dx + dy);
        loop {
            self.set(x, y, colour);
            if x == x1 && y == y1 {
                break;
            }
            let e2 = 2 * err;
            if e2 >= dy {
                err += dy;
                x += sx;
            }
            if e2 <= dx {
                err += dx;
                y += sy;
            }
        }
    }

    /// `number` in digits of `scale`-pixel dots, its top left corner at the point.
    pub fn number(&mut self, (x, y): (i64, i64), number: u64, scale: i64, colour: Rgb) {
        for (i, digit) in number.to_string().bytes().enumerate() {
            let glyph = DIGITS[usize::from(digit - b'0')];
            let left = x + i64::try_from(i).unwrap_or(0) * 4 * scale;
            for (row, bits) in glyph.iter().enumerate() {
                for column in 0..3 {
                    if bits & (4 >> column) != 0 {
                        for d in 0..scale * scale {
                            let row = i64::try_from(row).unwrap_or(0);
                            self.set(
                                left + column * scale + d % scale,
                                y + row * scale + d / scale,
                                colour,
                            );
                        }
                    }
                }
            }
        }
    }

    /// The PNG file.
    pub fn encode(&self) -> Vec<u8> {
        let mut raw = Vec::with_capacity((self.width * 3 + 1) * self.height);
        for row in self.pixels.chunks(self.width * 3) {
            raw.push(0); // filter: none
            raw.extend_from_slice(row);
        }
        let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
        let mut header = Vec::new();
        header.extend_from_slice(&u32::try_from(self.width).unwrap_or(0).to_be_bytes());
        header.extend_from_slice(&u32::try_from(self.height).unwrap_or(0).to_be_bytes());
        header.extend_from_slice(&[8, 2, 0, 0, 0]); // 8-bit RGB, no interlace
        chunk(&mut png, b"IHDR", &header);
        chunk(&mut png, b"IDAT", &zlib_stored(&raw));
        chunk(&mut png, b"IEND", &[]);
        png
    }
}

fn chunk(png: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    png.extend_from_slice(&u32::try_from(data.len()).unwrap_or(0).to_be_bytes());
    let start = png.len();
    png.extend_from_slice(kind);
    png.extend_from_slice(data);
    let crc = crc32(&png[start..]);
    png.extend_from_slice(&crc.to_be_bytes());
}

/// A zlib stream of stored (uncompressed) deflate blocks of at most 65,535 bytes.
fn zlib_stored(data: &[u8]) -> Vec<u8> {
    let mut out = vec![0x78, 0x01];
    let blocks: Vec<&[u8]> = data.chunks(65_535).collect();
    for (i, block) in blocks.iter().enumerate() {
        out.push(u8::from(i + 1 == blocks.len()));
        let len = u16::try_from(block.len()).unwrap_or(u16::MAX);
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(!len).to_le_bytes());
        out.extend_from_slice(block);
    }
    if blocks.is_empty() {
        out.extend_from_slice(&[1, 0, 0, 0xff, 0xff]);
    }
    out.extend_from_slice(&adler32(data).to_be_bytes());
    out
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
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
        a = (a + u32::from(byte)) % 65_521;
        b = (b + a) % 65_521;
    }
    (b << 16) | a
}
