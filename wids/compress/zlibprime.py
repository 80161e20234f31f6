"""Raw inflate from a bit offset: zlib's ``inflatePrime``, which Python's ``zlib`` lacks.

A gzip seek point sits at a deflate block boundary, usually inside a byte. Shifting the input
so the point starts a byte is not enough: a stored block realigns to the *input's* byte
boundaries, which a shift moves. zlib's public ``inflatePrime`` feeds the point's leading
bits and then the input from the next byte, so alignment stays right; it is called here
through ``ctypes`` on the zlib library Python's own ``zlib`` module is built on (loaded once
per process, on first use, and used only if its ``zlibVersion`` is the version Python's
``zlib`` runs on: another zlib's ``z_stream`` may differ). A point that starts a byte needs
no priming and is inflated by Python's ``zlib`` (so that path runs in every test, with or
without ctypes). Without a usable zlib library, :func:`available` is false, a
``RuntimeWarning`` says so once per process, and the gzip codec decodes from the nearest
byte-aligned seek point instead (correct, slower).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
import warnings
import zlib
from typing import Any

__all__ = ["available", "inflate_from"]

_Z_OK, _Z_STREAM_END, _Z_BUF_ERROR, _Z_NO_FLUSH = 0, 1, -5, 0
_STEP = 8 << 20


class _ZStream(ctypes.Structure):
    _fields_ = [  # noqa: RUF012 - ctypes' declared layout of zlib's z_stream
        ("next_in", ctypes.c_void_p),
        ("avail_in", ctypes.c_uint),
        ("total_in", ctypes.c_ulong),
        ("next_out", ctypes.c_void_p),
        ("avail_out", ctypes.c_uint),
        ("total_out", ctypes.c_ulong),
        ("msg", ctypes.c_char_p),
        ("state", ctypes.c_void_p),
        ("zalloc", ctypes.c_void_p),
        ("zfree", ctypes.c_void_p),
        ("opaque", ctypes.c_void_p),
        ("data_type", ctypes.c_int),
        ("adler", ctypes.c_ulong),
        ("reserved", ctypes.c_ulong),
    ]


_loaded: list[Any] = []  # [library or None], filled once
_lock = threading.Lock()


def _lib() -> Any:
    if not _loaded:
        with _lock:
            if not _loaded:
                _loaded.append(_load())
    return _loaded[0]


def _load() -> Any:
    lib = _open_zlib()
    if lib is None:
        warnings.warn(
            "zlib's inflatePrime cannot be called here (no zlib library of Python's zlib "
            f"version {zlib.ZLIB_RUNTIME_VERSION} loadable through ctypes): .tar.gz reads "
            "decode from the nearest byte-aligned seek point, which can be several seek "
            "points further back (slower, still correct)",
            RuntimeWarning,
            stacklevel=4,
        )
    return lib


def _open_zlib() -> Any:
    name = ctypes.util.find_library("z")
    if name is None:
        return None
    try:
        lib = ctypes.CDLL(name)
        lib.zlibVersion.restype = ctypes.c_char_p
        lib.inflateInit2_.argtypes = [
            ctypes.POINTER(_ZStream),
            ctypes.c_int,
            ctypes.c_char_p,
            ctypes.c_int,
        ]
        lib.inflatePrime.argtypes = [ctypes.POINTER(_ZStream), ctypes.c_int, ctypes.c_int]
        lib.inflateSetDictionary.argtypes = [
            ctypes.POINTER(_ZStream),
            ctypes.c_char_p,
            ctypes.c_uint,
        ]
        lib.inflate.argtypes = [ctypes.POINTER(_ZStream), ctypes.c_int]
        lib.inflateEnd.argtypes = [ctypes.POINTER(_ZStream)]
        version = lib.zlibVersion()
    except (OSError, AttributeError):
        return None
    # the z_stream layout declared above is zlib 1.x's; a library of another version than
    # the one Python's zlib runs on (zlib-ng's native API, an old libz found first) is not used
    if not isinstance(version, bytes) or version.decode("ascii", "replace") != (
        zlib.ZLIB_RUNTIME_VERSION
    ):
        return None
    return lib


def available() -> bool:
    """Whether zlib's ``inflatePrime`` can be called in this process."""
    return _lib() is not None


def inflate_from(
    data: bytes, nbits: int, window: bytes, need: int
) -> tuple[bytes, int, bool, str | None]:
    """Inflate a raw deflate stream that starts ``nbits`` bits before ``data[1]``.

    Args:
        data: The compressed bytes; with ``nbits``, ``data[0]`` holds the stream's first
            ``nbits`` bits in its top bits, else the stream starts at ``data[0]``.
        nbits: 0-7.
        window: The 32 KiB of output before the point (``b""``: none).
        need: Bytes of output wanted (at most this many are made).

    Returns:
        ``(output, consumed, ended, error)``: the output, how many bytes of ``data`` were
        consumed, whether the deflate stream ended, and zlib's message if the data is bad.
    """
    if not nbits:
        return _inflate_aligned(data, window, need)
    lib = _lib()
    if lib is None:
        raise RuntimeError("zlib's inflatePrime is not available")
    strm = _ZStream()
    version = lib.zlibVersion()
    if lib.inflateInit2_(ctypes.byref(strm), -15, version, ctypes.sizeof(_ZStream)) != _Z_OK:
        raise MemoryError("zlib: inflateInit2 failed")
    try:
        src = data[1:] if nbits else data
        if nbits and lib.inflatePrime(ctypes.byref(strm), nbits, data[0] >> (8 - nbits)) != _Z_OK:
            return b"", 0, False, "inflatePrime refused the point's bits"
        if window and lib.inflateSetDictionary(ctypes.byref(strm), window, len(window)) != _Z_OK:
            return b"", 0, False, "the window was refused"
        keep = ctypes.c_char_p(src)  # the bytes' own buffer, not a copy; kept alive here
        strm.next_in = ctypes.cast(keep, ctypes.c_void_p).value
        strm.avail_in = len(src)
        parts: list[bytes] = []
        made, ret = 0, _Z_OK
        # output in steps: memory grows with what the data decodes to, not with ``need``
        # (an index's claim)
        while made < need and ret == _Z_OK:
            step = min(need - made, _STEP)
            out = bytearray(step)
            view = (ctypes.c_char * step).from_buffer(out)
            strm.next_out = ctypes.addressof(view)
            strm.avail_out = step
            ret = lib.inflate(ctypes.byref(strm), _Z_NO_FLUSH)
            got = step - strm.avail_out
            del view  # the bytearray may be resized once no export of it is left
            del out[got:]
            parts.append(bytes(out))
            made += got
            if got == 0:
                break
        consumed = len(src) - strm.avail_in + (1 if nbits else 0)
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        if ret not in (_Z_OK, _Z_STREAM_END, _Z_BUF_ERROR):
            msg = strm.msg.decode("ascii", "replace") if strm.msg else f"error {ret}"
            return data, consumed, False, msg
        return data, consumed, ret == _Z_STREAM_END, None
    finally:
        lib.inflateEnd(ctypes.byref(strm))


_STEP_IN = 1 << 16


def _inflate_aligned(data: bytes, window: bytes, need: int) -> tuple[bytes, int, bool, str | None]:
    """:func:`inflate_from` for a stream that starts a byte: Python's ``zlib``, no priming."""
    d = zlib.decompressobj(-15, zdict=window) if window else zlib.decompressobj(-15)
    parts: list[bytes] = []
    made = fed = 0
    # input in steps, so a failure is placed within a step; output in steps, so memory
    # grows with what the data decodes to, not with ``need``
    while made < need and not d.eof:
        chunk = d.unconsumed_tail
        if not chunk and fed < len(data):
            chunk = data[fed : fed + _STEP_IN]
            fed += len(chunk)
        try:
            out = d.decompress(chunk, min(need - made, _STEP))
        except zlib.error as e:
            return b"".join(parts), fed - len(chunk), False, str(e)
        parts.append(out)
        made += len(out)
        if not out and len(d.unconsumed_tail) == len(chunk):  # no progress (or no input)
            break
    consumed = fed - len(d.unconsumed_tail) - len(d.unused_data)
    return b"".join(parts), consumed, d.eof, None
