"""What loopline takes for an encoded image: a PNG, JPEG, GIF or BMP file's bytes (TFDV's image
formats), told by the format's signature. GIF's and BMP's signatures are text ("GIF89a", "BM"), so a
string value that starts like one ("BMW", "BM-0042") is an image only when its bytes are not text:
they hold a NUL or are not UTF-8, as every real GIF or BMP file's header does.

`declared_size` reads the width and height an image's header declares, without decoding it: a
file of a few kilobytes may declare a size whose pixels take gigabytes (a decompression bomb), which
is refused before anything decodes it."""
from __future__ import annotations

import struct

BINARY_SIGNATURES = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff")  # PNG, JPEG: no UTF-8 text starts so
TEXT_SIGNATURES = (b"GIF87a", b"GIF89a", b"BM")  # GIF, BMP: text may start so
# The most pixels an image may declare: 8192 x 8192, 256 MiB as RGBA bytes (Pillow's bomb limit is
# about 89M pixels).
MAX_IMAGE_PIXELS = 1 << 26
# JPEG's start-of-frame markers (they carry the size); C4, C8 and CC are other segments.
_JPEG_FRAMES = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def is_text(value: bytes) -> bool:
    if b"\x00" in value:
        return False
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def looks_like_image(value: bytes) -> bool:
    return value.startswith(BINARY_SIGNATURES) or (value.startswith(TEXT_SIGNATURES) and not is_text(value))


def _jpeg_size(value: bytes) -> tuple[int, int] | None:
    at = 2  # after the start-of-image marker
    while at + 4 <= len(value):
        if value[at] != 0xFF:
            return None
        marker = value[at + 1]
        if marker == 0xFF:  # a fill byte before a marker
            at += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD8)):  # markers without a segment
            at += 2
            continue
        (length,) = struct.unpack_from(">H", value, at + 2)
        if marker in _JPEG_FRAMES:
            if at + 9 > len(value):
                return None
            height, width = struct.unpack_from(">HH", value, at + 5)
            return width, height
        at += 2 + length
    return None


def declared_size(value: bytes) -> tuple[int, int] | None:
    """(width, height) from the header of an image `looks_like_image` takes; None when the header
    is cut or damaged."""
    if value.startswith(b"\x89PNG"):
        if len(value) < 24 or value[12:16] != b"IHDR":
            return None
        return struct.unpack_from(">II", value, 16)
    if value.startswith(b"\xff\xd8"):
        return _jpeg_size(value)
    if value.startswith(b"GIF"):
        return struct.unpack_from("<HH", value, 6) if len(value) >= 10 else None
    if len(value) < 26:  # BMP: the file header (14 bytes), then the DIB header's size and dimensions
        return None
    if struct.unpack_from("<I", value, 14)[0] == 12:  # OS/2's header: 16-bit sizes
        return struct.unpack_from("<HH", value, 18)
    width, height = struct.unpack_from("<ii", value, 18)
    return abs(width), abs(height)  # a negative height: rows stored top-down


def size_problem(value: bytes) -> str | None:
    """Why an image's declared size is refused (a cut header, no pixels, a decompression bomb);
    None when it may be decoded."""
    size = declared_size(value)
    if size is None:
        return "its header is cut or damaged"
    width, height = size
    if not width or not height:
        return f"it declares {width}x{height} pixels"
    if width * height > MAX_IMAGE_PIXELS:
        return (f"it declares {width}x{height} pixels, more than the {MAX_IMAGE_PIXELS:,} loopline decodes "
                "(a decompression bomb, or an image to scale down first)")
    return None
