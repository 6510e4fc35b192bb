"""What loopline takes for an encoded image: a PNG, JPEG, GIF or BMP file's bytes (TFDV's image
formats), told by the format's signature. GIF's and BMP's signatures are text ("GIF89a", "BM"), so a
string value that starts like one ("BMW", "BM-0042") is an image only when its bytes are not text:
they hold a NUL or are not UTF-8, as every real GIF or BMP file's header does."""

BINARY_SIGNATURES = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff")  # PNG, JPEG: no UTF-8 text starts so
TEXT_SIGNATURES = (b"GIF87a", b"GIF89a", b"BM")  # GIF, BMP: text may start so


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
