"""tf.io.gfile files as pyarrow's streams, so Arrow files go to any file system TensorFlow reaches
(local, gs://, s3://, ram://) like every other artifact."""
from __future__ import annotations

import io

import tensorflow as tf


class GFileStream(io.RawIOBase):
    """A GFile opened "rb" or "wb" as a Python file pyarrow takes (`pa.PythonFile`, or a writer's
    sink). Written, it counts its own position: ram:// files cannot tell()."""

    def __init__(self, path: str, mode: str):
        if mode not in ("rb", "wb"):
            raise ValueError(f"mode must be 'rb' or 'wb', got {mode!r}")
        self._file, self._mode, self._written = tf.io.gfile.GFile(path, mode), mode, 0

    def readable(self) -> bool:
        return self._mode == "rb"

    def writable(self) -> bool:
        return self._mode == "wb"

    def read(self, size: int = -1) -> bytes:
        return self._file.read(size)

    def write(self, data) -> int:
        self._file.write(bytes(data))
        self._written += len(data)
        return len(data)

    def tell(self) -> int:
        return self._written if self._mode == "wb" else self._file.tell()

    def close(self) -> None:
        if not self.closed:
            self._file.close()
        super().close()
