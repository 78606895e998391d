"""Framing and the value codec spoken between the host, the trusted test runner and the program under test.

Standard library only: this module is also loaded inside the sandbox (see `harness.py`), where
nothing of the project is on disk.

Why a codec of our own rather than pickle: the test runner must never run code chosen by the program
under test. Unpickling runs arbitrary constructors; decoding here only ever builds exact built-in
values (None, bool, int, float, complex, str, bytes, bytearray, list, tuple, dict, set, frozenset,
range, Fraction, Decimal, and those types themselves, looked up by name in a fixed table). So a value
that came back from the solution compares, hashes and prints with the interpreter's own code, and an
object whose `__eq__` always answers True cannot survive the trip. Anything else crosses as an opaque handle (`{"$h": id}`) that the runner may call methods on
but never compare.

Frames are a 4-byte big-endian length and a JSON body, so a reader knows how much to read and can
refuse an oversized frame before allocating it.
"""

from __future__ import annotations

import base64
import json
import os
import select
import struct
import time
from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction
from typing import Any

MAX_FRAME = 16 << 20  # 16 MiB: larger than any sane test value, small enough to refuse before allocating
MAX_DEPTH = 64  # nesting of values; deeper (or cyclic) values are refused
_HEADER = struct.Struct(">I")


class WireError(Exception):
    """A frame or value broke the protocol: too large, malformed, too deep, or of an unknown tag."""


class FrameTimeout(Exception):
    """The peer did not complete a frame before the deadline."""


# ---- framing -------------------------------------------------------------------------------------


def pack(obj: Any) -> bytes:
    body = json.dumps(obj, separators=(",", ":"), allow_nan=True).encode()
    if len(body) > MAX_FRAME:
        raise WireError(f"frame of {len(body)} bytes exceeds the {MAX_FRAME}-byte limit")
    return _HEADER.pack(len(body)) + body


def write_all(fd: int, data: bytes, deadline: float | None = None) -> None:
    """Write every byte, waiting at most until `deadline` (time.monotonic()) when one is given.

    With a deadline the fd must be non-blocking; otherwise a peer that stops reading would pin us.
    """
    view = memoryview(data)
    while view:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise FrameTimeout("peer stopped reading")
            _, writable, _ = select.select([], [fd], [], remaining)
            if not writable:
                continue
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            continue
        view = view[n:]


def send_frame(fd: int, obj: Any, deadline: float | None = None) -> None:
    write_all(fd, pack(obj), deadline)


def read_exact(fd: int, n: int, deadline: float | None = None) -> bytes | None:
    """Exactly n bytes, or None on end of file before the first byte.

    Reads exactly what was asked, never more, so two frames queued on one pipe stay separate: the
    sandbox relies on this to keep the tests out of the memory of the process that runs the solution.
    """
    chunks: list[bytes] = []
    got = 0
    while got < n:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise FrameTimeout(f"read {got} of {n} bytes before the deadline")
            readable, _, _ = select.select([fd], [], [], remaining)
            if not readable:
                continue
        try:
            chunk = os.read(fd, n - got)
        except BlockingIOError:
            continue
        if not chunk:
            if got == 0:
                return None
            raise WireError(f"end of file after {got} of {n} bytes")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_frame(fd: int, deadline: float | None = None, limit: int = MAX_FRAME) -> Any:
    """The next frame's JSON value; None at a clean end of file."""
    header = read_exact(fd, _HEADER.size, deadline)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    if size > limit:
        raise WireError(f"frame of {size} bytes exceeds the {limit}-byte limit")
    body = read_exact(fd, size, deadline)
    if body is None:
        raise WireError("end of file inside a frame")
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as e:
        raise WireError(f"malformed frame: {e}") from None


# ---- values --------------------------------------------------------------------------------------

_TAGS = ("$t", "$s", "$fs", "$d", "$b", "$ba", "$c", "$r", "$fr", "$dec", "$ty", "$h")
# Built-in types as values (MBPP's `remove_datatype(xs, int)`): sent by name, decoded from this table only.
_TYPES = {
    t.__name__: t
    for t in (
        int,
        float,
        complex,
        bool,
        str,
        bytes,
        bytearray,
        list,
        tuple,
        dict,
        set,
        frozenset,
        range,
        type(None),
    )
}
_TYPES.update({"Fraction": Fraction, "Decimal": Decimal})
_SCALARS = (type(None), bool, int, float, str)


def _all_scalars(items: list | tuple) -> bool:
    """Every item exactly a JSON scalar: the common case (a list of numbers), encoded without recursion."""
    return all(type(v) in _SCALARS for v in items)


def encode(value: Any, to_handle: Callable[[Any], Any] | None = None, _depth: int = 0) -> Any:
    """A JSON-able form of `value`; objects outside the codec go through `to_handle` (or are refused).

    Subclasses of the built-ins (namedtuple, Counter, OrderedDict, bool-like ints) are flattened to
    their base type here, on the sending side, so what arrives is always a plain value.
    """
    if _depth > MAX_DEPTH:
        raise WireError(f"value nested deeper than {MAX_DEPTH} levels (or cyclic)")
    d = _depth + 1
    if value is None or type(value) is bool or type(value) is str:
        return value
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, list):
        items = list(list.__iter__(value))
        return items if _all_scalars(items) else [encode(v, to_handle, d) for v in items]
    if isinstance(value, tuple):
        items = list(tuple.__iter__(value))
        return {"$t": items if _all_scalars(items) else [encode(v, to_handle, d) for v in items]}
    if isinstance(value, dict):
        return {"$d": [[encode(k, to_handle, d), encode(v, to_handle, d)] for k, v in dict.items(value)]}
    if isinstance(value, frozenset):
        return {"$fs": [encode(v, to_handle, d) for v in frozenset.__iter__(value)]}
    if isinstance(value, set):
        return {"$s": [encode(v, to_handle, d) for v in set.__iter__(value)]}
    if isinstance(value, bytes):
        return {"$b": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, bytearray):
        return {"$ba": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, complex):
        return {"$c": [value.real, value.imag]}
    if isinstance(value, range):
        return {"$r": [value.start, value.stop, value.step]}
    if isinstance(value, Fraction):
        return {"$fr": [int(value.numerator), int(value.denominator)]}
    if isinstance(value, Decimal):
        return {"$dec": str(value)}
    if isinstance(value, type) and _TYPES.get(value.__name__) is value:
        return {"$ty": value.__name__}
    if to_handle is None:
        raise WireError(f"a value of type {type(value).__name__} cannot be sent; send plain data")
    return to_handle(value)


def decode(data: Any, from_handle: Callable[[Any], Any] | None = None, _depth: int = 0) -> Any:
    """The plain value `data` stands for; handles go through `from_handle` (or are refused).

    Builds only exact built-in types, whatever the sender claimed, and refuses anything unexpected.
    """
    if _depth > MAX_DEPTH:
        raise WireError(f"value nested deeper than {MAX_DEPTH} levels")
    d = _depth + 1
    kind = type(data)
    if data is None or kind in (bool, int, float, str):
        return data
    if kind is list:
        return list(data) if _all_scalars(data) else [decode(v, from_handle, d) for v in data]
    if kind is not dict or len(data) != 1:
        raise WireError(f"malformed value of JSON type {kind.__name__}")
    ((tag, body),) = data.items()
    try:
        if tag == "$t":
            items = _as_list(body)
            return tuple(items) if _all_scalars(items) else tuple(decode(v, from_handle, d) for v in items)
        if tag == "$d":
            return {decode(k, from_handle, d): decode(v, from_handle, d) for k, v in _pairs(body)}
        if tag == "$s":
            return {decode(v, from_handle, d) for v in _as_list(body)}
        if tag == "$fs":
            return frozenset(decode(v, from_handle, d) for v in _as_list(body))
        if tag == "$b":
            return base64.b64decode(_as_str(body), validate=True)
        if tag == "$ba":
            return bytearray(base64.b64decode(_as_str(body), validate=True))
        if tag == "$c":
            re_, im = _numbers(body, 2)
            return complex(re_, im)
        if tag == "$r":
            start, stop, step = _ints(body, 3)
            return range(start, stop, step)
        if tag == "$fr":
            num, den = _ints(body, 2)
            return Fraction(num, den)
        if tag == "$dec":
            return Decimal(_as_str(body))
        if tag == "$ty":
            if _as_str(body) not in _TYPES:
                raise WireError(f"no built-in type named {body[:40]!r}")
            return _TYPES[body]
        if tag == "$h":
            if from_handle is None:
                raise WireError("an object handle arrived where only plain values are accepted")
            return from_handle(body)
    except WireError:
        raise
    except (TypeError, ValueError, ArithmeticError) as e:  # unhashable key, bad base64, zero denominator
        raise WireError(f"malformed {tag} value: {e}") from None
    raise WireError(f"unknown value tag {tag!r}; expected one of {_TAGS}")


def _as_list(body: Any) -> list:
    if type(body) is not list:
        raise WireError("expected a list")
    return body


def _as_str(body: Any) -> str:
    if type(body) is not str:
        raise WireError("expected a string")
    return body


def _pairs(body: Any) -> list:
    pairs = _as_list(body)
    if any(type(p) is not list or len(p) != 2 for p in pairs):
        raise WireError("expected [key, value] pairs")
    return pairs


def _ints(body: Any, n: int) -> list[int]:
    items = _as_list(body)
    if len(items) != n or any(type(v) is not int for v in items):
        raise WireError(f"expected {n} integers")
    return items


def _numbers(body: Any, n: int) -> list[float]:
    items = _as_list(body)
    if len(items) != n or any(type(v) not in (int, float) for v in items):
        raise WireError(f"expected {n} numbers")
    return items
