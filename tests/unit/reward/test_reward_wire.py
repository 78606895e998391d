"""The codec between the test runner and the solution: what crosses is always a plain built-in value."""

import math
import os
from collections import Counter, OrderedDict, namedtuple
from decimal import Decimal
from fractions import Fraction

import pytest

from megatron_rl.reward import wire

PLAIN = [
    None,
    True,
    0,
    -(10**30),
    1.5,
    "héllo",
    [1, [2, "x"], []],
    (1, (2, 3), ()),
    {"a": 1, 2: [3], (4, 5): None},
    {1, 2, 3},
    frozenset({"a"}),
    b"\x00\xff",
    bytearray(b"ab"),
    complex(1, -2),
    range(2, 10, 3),
    Fraction(1, 3),
    Decimal("1.10"),
]


@pytest.mark.parametrize("value", PLAIN, ids=[type(v).__name__ for v in PLAIN])
def test_round_trip_keeps_value_and_exact_type(value):
    back = wire.decode(wire.encode(value))
    assert back == value
    assert type(back) is type(value)


def test_nan_and_infinities_survive_framing():
    r, w = os.pipe()
    wire.send_frame(w, wire.encode([math.inf, -math.inf, math.nan]))
    back = wire.decode(wire.read_frame(r))
    assert back[:2] == [math.inf, -math.inf] and math.isnan(back[2])


def test_builtin_subclasses_arrive_as_their_base_type():
    Point = namedtuple("Point", "x y")
    assert type(wire.decode(wire.encode(Point(1, 2)))) is tuple
    assert type(wire.decode(wire.encode(Counter("aab")))) is dict
    assert wire.decode(wire.encode(OrderedDict(a=1))) == {"a": 1}

    class Sneaky(int):
        def __eq__(self, other):
            return True

        __hash__ = int.__hash__

    back = wire.decode(wire.encode(Sneaky(3)))
    assert type(back) is int and back != 4


def test_builtin_types_cross_as_themselves_and_no_other_type_does():
    """MBPP passes types (`remove_datatype(xs, int)`); on main they could not be sent at all."""
    values = [int, str, float, type(None), [bool, tuple]]
    assert wire.decode(wire.encode(values)) == values
    assert wire.decode(wire.encode(values))[0] is int

    class int_:  # named like one, is not one
        pass

    int_.__name__ = "int"
    with pytest.raises(wire.WireError, match="cannot be sent"):
        wire.encode(int_)


def test_objects_need_a_handle_and_handles_need_a_resolver():
    class Thing:
        pass

    with pytest.raises(wire.WireError, match="Thing"):
        wire.encode(Thing())
    encoded = wire.encode([Thing()], lambda obj: {"$h": {"id": 7, "type": type(obj).__name__}})
    with pytest.raises(wire.WireError, match="handle"):
        wire.decode(encoded)
    assert wire.decode(encoded, lambda body: ("handle", body["id"])) == [("handle", 7)]


@pytest.mark.parametrize(
    "data",
    [
        {"$zz": 1},
        {"$t": 1},
        {"a": 1, "b": 2},
        {"$d": [[[1], 2]]},
        {"$r": [1, 2]},
        {"$b": "!!"},
        {"$fr": [1, 0]},
        {"$ty": "object"},  # only the table's built-in types
        {"$ty": 3},
    ],
)
def test_decode_refuses_malformed_values(data):
    with pytest.raises(wire.WireError):
        wire.decode(data)


def test_depth_limit_stops_deep_and_cyclic_values():
    cyclic: list = []
    cyclic.append(cyclic)
    with pytest.raises(wire.WireError, match="deeper"):
        wire.encode(cyclic)
    deep: list = []
    for _ in range(wire.MAX_DEPTH + 5):
        deep = [deep, {"$t": []}]
    with pytest.raises(wire.WireError, match="deeper"):
        wire.decode(deep)


def test_frames_are_read_one_at_a_time():
    """Two frames queued on one pipe: reading the first must not consume any of the second."""
    r, w = os.pipe()
    wire.send_frame(w, {"code": "x"})
    wire.send_frame(w, {"tests": "secret"})
    assert wire.read_frame(r) == {"code": "x"}
    assert wire.read_exact(r, 4) is not None  # the second frame's header is still there, untouched
    os.close(w)


def test_oversized_frame_is_refused_before_reading_its_body():
    r, w = os.pipe()
    os.write(w, (wire.MAX_FRAME + 1).to_bytes(4, "big"))
    with pytest.raises(wire.WireError, match="exceeds"):
        wire.read_frame(r)


def test_read_frame_returns_none_at_clean_eof_and_times_out_when_stalled():
    r, w = os.pipe()
    os.write(w, b"\x00\x00")
    with pytest.raises(wire.FrameTimeout):
        wire.read_frame(r, deadline=__import__("time").monotonic() + 0.05)
    r2, w2 = os.pipe()
    os.close(w2)
    assert wire.read_frame(r2) is None
