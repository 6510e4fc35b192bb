"""A Beam FileSystem for TensorFlow's in-memory `ram://` scheme, delegating to tf.io.gfile, so that
Beam IO (ExampleGen's reads and writes) works on the same in-process filesystem as TensorFlow.

Beam finds file systems by subclass and `scheme()` (apache_beam.io.filesystems.FileSystems
.get_filesystem); importing this module is the registration, as with Beam's own gcsfilesystem.
"""
from __future__ import annotations

import io
import posixpath

import tensorflow as tf
from apache_beam.io.filesystem import (BeamIOError, CompressedFile, CompressionTypes, FileMetadata,
                                       FileSystem)

SCHEME = "ram"


class _RamAsObjectStore:
    """Two quirks of TensorFlow's RamFileSystem that local disks and object stores do not have,
    fixed for `ram://` paths only (everything else goes to TensorFlow's file_io bindings as is):
    - it lists a folder by string prefix, so `model/assets` also lists `model/assets.extra` as a
      child named `.extra` (which then fails to stat or copy): only children that exist are kept;
    - opening an existing file for writing appends instead of replacing it (`w` then `w` leaves
      both contents): the old file is deleted first, as a new object replaces an old one."""

    def __init__(self, bindings):
        self._bindings = bindings

    def __getattr__(self, name):
        return getattr(self._bindings, name)

    def GetChildren(self, path: bytes):  # noqa: N802 (the binding's name)
        children = self._bindings.GetChildren(path)
        if not path.startswith(f"{SCHEME}://".encode()):
            return children
        parent = path.decode().rstrip("/")
        return [c for c in children if self._exists(f"{parent}/{c}")]

    def WritableFile(self, path: bytes, mode: bytes):  # noqa: N802 (the binding's name)
        if path.startswith(f"{SCHEME}://".encode()) and b"a" not in mode and self._exists(path.decode()):
            self._bindings.DeleteFile(path)
        return self._bindings.WritableFile(path, mode)

    def _exists(self, path: str) -> bool:
        try:
            self._bindings.FileExists(path.encode())
        except tf.errors.NotFoundError:
            return False
        return True


def _fix_ram_listing() -> None:
    from tensorflow.python.lib.io import file_io

    if not isinstance(file_io._pywrap_file_io, _RamAsObjectStore):
        file_io._pywrap_file_io = _RamAsObjectStore(file_io._pywrap_file_io)


_fix_ram_listing()


class _CountingWriter(io.RawIOBase):
    """A gfile writer that counts its bytes: `ram://` files cannot tell() (Beam's sinks ask)."""

    mode = "wb"  # Beam's CompressedFile asks

    def __init__(self, path: str):
        self._file = tf.io.gfile.GFile(path, "wb")
        self._written = 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self._file.write(bytes(data))
        self._written += len(data)
        return len(data)

    def tell(self) -> int:
        return self._written

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        if not self.closed:
            if not self._written:
                self._file.write(b"")  # GFile creates the file on its first write; an empty one too
            self._file.close()
        super().close()


class RamFileSystem(FileSystem):
    @classmethod
    def scheme(cls) -> str:
        return SCHEME

    def join(self, basepath: str, *paths: str) -> str:
        return posixpath.join(basepath, *paths)

    def split(self, path: str) -> tuple[str, str]:
        return posixpath.split(path)

    def mkdirs(self, path: str) -> None:
        tf.io.gfile.makedirs(path)

    def has_dirs(self) -> bool:
        return True

    def _list(self, dir_or_prefix: str):
        if not tf.io.gfile.exists(dir_or_prefix):
            return
        try:
            for folder, _, files in tf.io.gfile.walk(dir_or_prefix):
                for name in files:
                    path = posixpath.join(folder, name)
                    stat = tf.io.gfile.stat(path)
                    yield FileMetadata(path, stat.length, stat.mtime_nsec / 1e9)
        except Exception as exc:  # pylint: disable=broad-except
            raise BeamIOError("List operation failed", {dir_or_prefix: exc})

    def _wrap(self, raw, path, compression_type):
        compression_type = FileSystem._get_compression_type(path, compression_type)
        if compression_type == CompressionTypes.UNCOMPRESSED:
            return raw
        return CompressedFile(raw, compression_type=compression_type)

    def create(self, path, mime_type="application/octet-stream", compression_type=CompressionTypes.AUTO):
        tf.io.gfile.makedirs(posixpath.dirname(path))
        return self._wrap(_CountingWriter(path), path, compression_type)

    def open(self, path, mime_type="application/octet-stream", compression_type=CompressionTypes.AUTO):
        with tf.io.gfile.GFile(path, "rb") as f:
            data = f.read()
        reader = io.BytesIO(data)
        reader.mode = "rb"  # Beam's CompressedFile asks
        return self._wrap(reader, path, compression_type)

    def _each(self, operation: str, pairs, action) -> None:
        errors = {}
        for pair in pairs:
            try:
                action(*pair) if isinstance(pair, tuple) else action(pair)
            except Exception as exc:  # pylint: disable=broad-except
                errors[pair] = exc
        if errors:
            raise BeamIOError(f"{operation} operation failed", errors)

    def copy(self, source_file_names, destination_file_names):
        self._each("Copy", list(zip(source_file_names, destination_file_names)),
                   lambda s, d: tf.io.gfile.copy(s, d, overwrite=True))

    def rename(self, source_file_names, destination_file_names):
        self._each("Rename", list(zip(source_file_names, destination_file_names)),
                   lambda s, d: tf.io.gfile.rename(s, d, overwrite=True))

    def exists(self, path: str) -> bool:
        return tf.io.gfile.exists(path)

    def size(self, path: str) -> int:
        return tf.io.gfile.stat(path).length

    def last_updated(self, path: str) -> float:
        return tf.io.gfile.stat(path).mtime_nsec / 1e9

    def checksum(self, path: str) -> str:
        return str(self.size(path))

    def metadata(self, path: str) -> FileMetadata:
        stat = tf.io.gfile.stat(path)
        return FileMetadata(path, stat.length, stat.mtime_nsec / 1e9)

    def delete(self, paths):
        def remove(path):
            if tf.io.gfile.isdir(path):
                tf.io.gfile.rmtree(path)
            else:
                tf.io.gfile.remove(path)

        self._each("Delete", list(paths), remove)
