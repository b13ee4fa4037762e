"""Codec: exact round trips, zero-copy arrays, sender errors that name paths, hostile frames."""

import dataclasses
import math
import struct
import subprocess
import sys
import time
from collections import OrderedDict
from typing import NamedTuple

import ml_dtypes
import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from jaxdist.courier import codec
from jaxdist.courier.codec import CodecError, decode, encode, encode_parts, frame_size, register


class Point(NamedTuple):
    x: object
    y: object


@dataclasses.dataclass(frozen=True)
class Box:
    a: object
    b: object = dataclasses.field(default=None, kw_only=True)
    derived: int = dataclasses.field(default=0, init=False)


@dataclasses.dataclass
class Picky:
    value: int

    def __post_init__(self):
        if self.value < 0:
            raise ValueError("negative")


register(Point, "tests.courier.Point")
register(Box, "tests.courier.Box")
register(Picky, "tests.courier.Picky")


class Foo:
    pass


class Unregistered(NamedTuple):
    x: int


@dataclasses.dataclass
class UnregisteredData:
    x: int


DTYPES = [np.dtype(t) for t in (
    np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
    np.float16, np.float32, np.float64, np.complex64, np.complex128,
    ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2)]


def assert_same(got, want, path="value"):
    """Equal values of exactly the same types: tuples stay tuples, dtypes and bytes match."""
    assert type(got) is type(want), f"{path}: {type(got)} is not {type(want)}"
    if isinstance(want, (np.ndarray, np.generic)):
        assert got.dtype == want.dtype and got.shape == want.shape, path
        assert got.tobytes() == want.tobytes(), path  # bitwise, so NaNs compare equal
    elif isinstance(want, float):
        assert struct.pack("<d", got) == struct.pack("<d", want), path
    elif isinstance(want, (list, tuple)) and not hasattr(want, "_fields"):
        assert len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{path}[{i}]")
    elif isinstance(want, dict):
        assert len(got) == len(want), path
        for (gk, gv), (wk, wv) in zip(got.items(), want.items()):
            assert_same(gk, wk, f"{path} key {wk!r}")
            assert_same(gv, wv, f"{path}[{wk!r}]")
    elif hasattr(want, "_fields"):
        for name in want._fields:
            assert_same(getattr(got, name), getattr(want, name), f"{path}.{name}")
    elif dataclasses.is_dataclass(want):
        for field in dataclasses.fields(want):
            assert_same(getattr(got, field.name), getattr(want, field.name), f"{path}.{field.name}")
    else:
        assert got == want, path


@st.composite
def arrays(draw):
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))
    size = math.prod(shape) * dtype.itemsize
    raw = draw(st.binary(min_size=size, max_size=size))  # any bit pattern: NaNs, infs, ...
    if dtype == np.bool_:
        raw = bytes(b & 1 for b in raw)
    return np.frombuffer(raw, dtype).reshape(shape)


@st.composite
def scalars(draw):
    dtype = draw(st.sampled_from(DTYPES))
    raw = draw(st.binary(min_size=dtype.itemsize, max_size=dtype.itemsize))
    if dtype == np.bool_:
        raw = bytes(b & 1 for b in raw)
    return np.frombuffer(raw, dtype)[0]


ints = st.integers(-(2**63), 2**64 - 1)
leaves = st.one_of(
    st.none(), st.booleans(), ints, st.floats(), st.text(max_size=8), st.binary(max_size=8),
    arrays(), scalars(),
)
keys = st.one_of(st.text(max_size=4), st.binary(max_size=4), ints, st.floats(), st.booleans(), st.none())
values = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=4).map(tuple),
        st.dictionaries(keys, children, max_size=4),
        st.builds(Point, children, children),
        st.builds(Box, children, b=children),
    ),
    max_leaves=12,
)
wire_leaf_types = (type(None), bool, int, float, str, bytes, np.ndarray, np.generic)


def assert_wire_types(value):
    """Everything decode built is a whitelisted type (or a registered one)."""
    if type(value) in (list, tuple, Point):
        for item in value:
            assert_wire_types(item)
    elif type(value) is dict:
        for item in (*value.keys(), *value.values()):
            assert_wire_types(item)
    elif type(value) in (Box, Picky):
        assert_wire_types(list(vars(value).values()))
    else:
        assert isinstance(value, wire_leaf_types), type(value)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values)
def test_round_trip_preserves_values_and_exact_types(value):
    parts = encode_parts(value)
    frame = encode(value)
    assert frame_size(parts) == len(frame) == len(b"".join(parts))
    assert_same(decode(frame), value)
    assert_same(decode(bytearray(frame)), value)


def test_numpy_scalars_keep_their_dtype():
    for scalar in (np.float32(1.5), np.bool_(True), np.int64(-3), np.uint8(7),
                   np.complex64(1 - 2j), ml_dtypes.bfloat16(0.5)):
        got = decode(encode(scalar))
        assert type(got) is type(scalar) and got.dtype == scalar.dtype and got == scalar


def test_strided_and_big_endian_arrays_arrive_contiguous_little_endian():
    base = np.arange(24, dtype=np.int32).reshape(4, 6)
    for arr in (base[::2, ::3], base.T, base.astype(">i4"), np.arange(5.0, dtype=">f8")[::-1]):
        got = decode(encode(arr))
        assert got.dtype == arr.dtype.newbyteorder("<") and got.flags.c_contiguous
        np.testing.assert_array_equal(got, arr)


def test_decoded_arrays_are_aligned_views_into_the_frame():
    arrays_in = [np.arange(10, dtype=np.float32), np.ones((3, 5), ml_dtypes.bfloat16), np.int8(1)]
    frame = encode([arrays_in, "x"])
    whole = np.frombuffer(frame, np.uint8)
    got = decode(frame)[0]
    for arr in got[:2]:
        assert np.shares_memory(arr, whole)
        assert not arr.flags.writeable
        offset = arr.__array_interface__["data"][0] - whole.__array_interface__["data"][0]
        assert offset % 64 == 0

    writable = decode(bytearray(frame))[0][0]
    writable[0] = 42.0
    assert writable.flags.writeable and writable[0] == 42.0


def test_encode_parts_hand_over_contiguous_arrays_without_copying():
    arr = np.arange(1000, dtype=np.float64)
    parts = encode_parts({"w": arr})
    views = [np.frombuffer(p, np.uint8) for p in parts if isinstance(p, memoryview)]
    assert any(np.shares_memory(view, arr) for view in views)


def test_small_values_need_no_padding_or_data_section():
    frame = encode([(1, "x"), {}])
    assert len(frame) < 20
    assert decode(frame) == [(1, "x"), {}]


def test_importing_the_codec_does_not_import_jax():
    code = (  # the module alone: the courier package imports grpc and more
        "import importlib.util, sys; "
        f"spec = importlib.util.spec_from_file_location('codec', {codec.__file__!r}); "
        "module = sys.modules['codec'] = importlib.util.module_from_spec(spec); "
        "spec.loader.exec_module(module); "
        "assert 'jax' not in sys.modules, 'codec imported jax'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_jax_arrays_travel_as_host_numpy_arrays():
    import jax.numpy as jnp

    x = jnp.arange(6.0, dtype=jnp.float32).reshape(2, 3)
    got = decode(encode({"x": x, "h": jnp.ones(3, jnp.bfloat16), "s": x[1, 2]}))
    assert type(got["x"]) is np.ndarray and got["x"].dtype == np.float32
    np.testing.assert_array_equal(got["x"], np.asarray(x))
    assert got["h"].dtype == ml_dtypes.bfloat16
    assert type(got["s"]) is np.ndarray and got["s"].shape == () and got["s"] == 5.0


def test_flax_params_and_optax_states_round_trip_and_stay_usable():
    import chex
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import optax

    codec.register_optax_states()
    params = nn.Dense(3).init(jax.random.key(0), jnp.ones((1, 2)))
    got_params = decode(encode(params))
    chex.assert_trees_all_equal_structs(got_params, params)
    grads = jax.tree_util.tree_map(jnp.ones_like, params)
    chained = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))
    for optimizer in (optax.adam(1e-3), chained):
        state = optimizer.init(params)
        got = decode(encode(state))
        chex.assert_trees_all_equal_structs(got, state)
        want_updates, want_state = optimizer.update(grads, state, params)
        updates, new_state = optimizer.update(grads, got, got_params)
        chex.assert_trees_all_equal_structs(new_state, want_state)
        chex.assert_trees_all_close(updates, want_updates, rtol=1e-7)


def test_flax_struct_dataclasses_round_trip_once_registered():
    import flax.struct

    @flax.struct.dataclass
    class TrainState:
        step: int
        params: dict
        name: str = flax.struct.field(pytree_node=False, default="learner")

    register(TrainState, "tests.courier.TrainState")
    state = TrainState(step=3, params={"w": np.ones(2, np.float32)}, name="a")
    assert_same(decode(encode(state)), state)


def test_unsendable_value_names_its_path():
    args, kwargs = (1, {"opt": [Foo()]}), {}
    with pytest.raises(TypeError) as error:
        encode([args, kwargs])
    assert f"[0][1]['opt'][0]: cannot send {Foo!r}" in str(error.value)

    with pytest.raises(TypeError) as error:
        encode_parts((list(args), kwargs), root=("args", "kwargs"))
    assert str(error.value) == f"args[1]['opt'][0]: cannot send {Foo!r}"

    with pytest.raises(TypeError, match=r"^kwargs\['x'\]: cannot send <class 'set'>$"):
        encode_parts(([], {"x": {1, 2}}), root=("args", "kwargs"))
    with pytest.raises(TypeError, match=r"^result\[2\]: cannot send <class 'object'>$"):
        encode_parts([1, 2, object()], root="result")
    with pytest.raises(TypeError, match=r"^value: cannot send"):
        encode(Foo())


def test_registered_types_with_unsendable_fields_report_the_full_path():
    with pytest.raises(TypeError, match=r"^args\[0\]\.y\['w'\]: cannot send <class 'set'>"):
        encode_parts(([Point(1, {"w": {3}})], {}), root=("args", "kwargs"))
    with pytest.raises(TypeError, match=r"^\[0\]\.b\[1\]: cannot send"):
        encode([Box(1, b=(2, Foo()))])


@pytest.mark.parametrize("value, message", [
    (2**64, "<class 'int'> 18446744073709551616 (beyond 64 bits)"),
    (-(2**63) - 1, "(beyond 64 bits)"),
    (np.array([object()]), "<class 'numpy.ndarray'> of dtype object"),
    (np.array(["a"]), "of dtype <U1"),
    (np.datetime64("2020-01-01"), "<class 'numpy.datetime64'> of dtype"),
    (Unregistered(1), "call jaxdist.courier.codec.register(Unregistered) on both peers"),
    (UnregisteredData(1), "call jaxdist.courier.codec.register(UnregisteredData)"),
    ({1, 2}, "<class 'set'>"),
    (frozenset(), "<class 'frozenset'>"),
    (OrderedDict(a=1), "<class 'collections.OrderedDict'>"),
    (lambda: None, "<class 'function'>"),
    (object(), "<class 'object'>"),
])
def test_unsendable_types_fail_at_the_sender(value, message):
    with pytest.raises(TypeError) as error:
        encode({"k": [1, value]})
    assert str(error.value).startswith("['k'][1]: cannot send ")
    assert message in str(error.value)


def test_unsendable_dict_keys_and_jax_key_arrays_are_named():
    import jax

    with pytest.raises(TypeError, match=r"^\[frozenset\(\)\]: cannot send <class 'frozenset'>"):
        encode({frozenset(): 1})
    with pytest.raises(TypeError, match=r"^\['rng'\]: cannot send .* of dtype key<fry>"):
        encode({"rng": jax.random.key(0)})


def test_nesting_beyond_msgpack_limit_fails_at_the_sender():
    value = []
    for _ in range(2000):
        value = (value,)
    with pytest.raises(ValueError, match="recursion limit"):
        encode(value)


def test_register_rules():
    assert register(Point, "tests.courier.Point") is Point  # again: a no-op

    class Other(NamedTuple):
        z: int

    with pytest.raises(ValueError, match="'tests.courier.Point' is taken"):
        register(Other, "tests.courier.Point")
    with pytest.raises(ValueError, match="already registered as 'tests.courier.Point'"):
        register(Point, "tests.courier.Elsewhere")
    with pytest.raises(TypeError, match="NamedTuple class or a dataclass"):
        register(Foo)

    @register
    class Decorated(NamedTuple):
        z: int

    assert decode(encode(Decorated(4))) == Decorated(4)


T, A, S, R = (msgpack.ExtType(code, b"") for code in (1, 2, 3, 4))


def frame(header, data=b""):
    """A hand-made frame: header is a value to pack, or raw msgpack bytes."""
    raw = header if isinstance(header, bytes) else msgpack.packb(header)
    return struct.pack("<I", len(raw)) + raw + bytes(-(4 + len(raw)) % 64) + data


@pytest.mark.parametrize("data, message", [
    (b"", "shorter than its length prefix"),
    (b"\x01\x00", "shorter than its length prefix"),
    (struct.pack("<I", 100) + b"\x90", "runs past the 5-byte frame"),
    (frame(b""), "malformed frame"),
    (frame(b"\x90\x90"), "ExtraData"),
    (frame(b"\xc1"), "malformed frame"),
    (frame(b"\xa2\xff\xfe"), "UnicodeDecodeError"),
    (frame(b"\x81\x91\x01\x02"), "a dict key of <class 'list'>"),
    (frame(b"\x91" * 5000 + b"\xc0"), "malformed frame"),
    (frame(msgpack.ExtType(9, b"")), "unknown msgpack ext type 9"),
    (frame(msgpack.ExtType(1, b"x")), "unknown msgpack ext type 1"),
    (frame([T, T]), "not at the head"),
    (frame({T: 1}), "a dict key of <class 'msgpack.ext.ExtType'>"),
    (frame(T), "not at the head"),
    (frame([A, "float128", [1], 0, 16], bytes(16)), "dtype 'float128' is not sendable"),
    (frame([A, "object", [1], 0, 8], bytes(8)), "dtype 'object' is not sendable"),
    (frame([A, ["float32"], [1], 0, 4], bytes(4)), "is not sendable"),
    (frame([A, "float32", [4], 0, 16], bytes(8)), "runs past the end"),
    (frame([A, "float32", [4], 64, 16], bytes(16)), "runs past the end"),
    (frame([A, "float32", [4], 0, 12], bytes(16)), "does not match shape"),
    (frame([A, "float32", [-1], 0, 0]), "bad array shape"),
    (frame([A, "float32", [True], 0, 4], bytes(4)), "bad array shape"),
    (frame([A, "float32", [1] * 65, 0, 4], bytes(64)), "bad array shape"),
    (frame([A, "float32", [2**62, 2**62], 0, 0]), "does not match shape"),
    (frame([A, "float32", [4], -64, 16], bytes(16)), "bad array offset"),
    (frame([A, "float32", [4], 0]), "malformed array"),
    (frame([S, "float32", b"\0"]), "needs 4 bytes"),
    (frame([S, "float32", "abcd"]), "needs 4 bytes"),
    (frame([R, "nobody.Nothing", 1]), "call jaxdist.courier.codec.register(<the class>)"),
    (frame([R]), "is not registered here"),
    (frame([R, "tests.courier.Point", 1]), "takes fields ('x', 'y')"),
    (frame([R, "tests.courier.Picky", -1]), "could not rebuild tests.courier.Picky"),
])
def test_malformed_frames_raise_codec_error(data, message):
    with pytest.raises(CodecError) as error:
        decode(data)
    assert message in str(error.value)


def test_deeply_nested_tags_raise_codec_error():
    nested = b"\x92\xc7\x00\x01" * 3000 + b"\xc0"  # [T, [T, [T, ... None]]]
    with pytest.raises(CodecError):
        decode(frame(nested))


def test_msgpack_timestamps_decode_as_plain_ints():
    assert decode(frame(b"\xd6\xff\x00\x00\x00\x01")) == 10**9


@settings(max_examples=1000, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_decode_to_wire_types_or_codec_error(data):
    for candidate in (data, struct.pack("<I", max(len(data) - 4, 0)) + data[4:]):
        try:
            assert_wire_types(decode(candidate))
        except CodecError:
            pass


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values, st.data())
def test_corrupted_frames_decode_to_wire_types_or_codec_error(value, data):
    corrupt = bytearray(encode(value))
    for _ in range(data.draw(st.integers(1, 4))):
        corrupt[data.draw(st.integers(0, len(corrupt) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(corrupt)))
    for candidate in (bytes(corrupt), bytes(corrupt[:cut])):
        try:
            assert_wire_types(decode(candidate))
        except CodecError:
            pass


# --- Bounds on what a frame may make the receiver build ---------------------------------------

def test_colliding_pairs_do_collide(colliding_pairs):
    pairs = colliding_pairs(50)
    assert len(set(pairs)) == 50 and len({hash(pair) for pair in pairs}) == 1


def test_twenty_thousand_colliding_tuple_keys_are_refused_fast(colliding_keys_frame):
    data = colliding_keys_frame(20_000)
    began = time.thread_time()  # this thread's CPU time: what the decoding cost, however loaded the machine
    with pytest.raises(CodecError, match="a dict key of <class 'tuple'>"):
        decode(data)
    assert time.thread_time() - began < 1.0  # quadratic dict building took ~5 s here


def test_a_16_mib_frame_of_empty_lists_is_refused_fast(empty_lists_frame):
    data = empty_lists_frame(16 << 20)
    began = time.thread_time()
    with pytest.raises(CodecError, match="exceeds max_array_len"):
        decode(data)
    assert time.thread_time() - began < 1.0  # 16.7M Python lists took seconds and +1.2 GB


@pytest.mark.parametrize("header", [
    b"\x92\x92" + (b"\xdc\x80\x00" + b"\x90" * 0x8000) * 2 + b"\x80",  # nothing large, but many
    b"\x92\x91" + b"\xdd\x00\x10\x00\x00" + b"\xc0" * (1 << 20) + b"\x80",  # one list of 2**20 items
    b"\x92\x91\xdf\x00\x08\x00\x00" + b"".join(b"\xce" + struct.pack(">I", i) + b"\xc0" for i in range(1 << 19)) + b"\x80",
], ids=["lists", "items", "map"])
def test_a_message_holds_at_most_max_objects(header, monkeypatch):
    monkeypatch.setattr(codec, "MAX_OBJECTS", 1 << 16)
    with pytest.raises(CodecError, match="at most 65536 objects|exceeds max_"):
        decode(frame(header))


def test_a_message_of_max_objects_decodes():
    value = [[[None] * 1000 for _ in range(1000)], {}]  # 1002003 objects, counting containers
    assert decode(encode(value)) == value
    with pytest.raises(CodecError, match="at most"):
        decode(encode([[[None] * 1000 for _ in range(1100)], {}]))


@pytest.mark.parametrize("key", [(1, 2), Point(1, 2), np.int64(3), np.float32(1.5), Box(1)])
def test_dict_keys_outside_key_types_fail_at_the_sender_and_the_receiver(key):
    with pytest.raises(TypeError, match=r"^args\[0\]\['outer'\]\[.*\]: cannot send <class .*> as a dict key"):
        encode_parts(([{"outer": {key: 1}}], {}), root=("args", "kwargs"))
    packed = msgpack.packb({"outer": [{0: 1}]})  # the same frame with a hostile key, packed by hand
    hostile = frame(packed.replace(b"\x81\x00\x01", b"\x81" + _raw_header(key) + b"\x01"))
    with pytest.raises(CodecError, match="a dict key of"):
        decode(hostile)


def _raw_header(value) -> bytes:
    """The msgpack bytes of `value` in a codec header (without the frame around it)."""
    raw = encode(value)
    (length,) = struct.unpack_from("<I", raw)
    return raw[4:4 + length]


def test_allowed_dict_keys_round_trip_with_their_types():
    value = {"s": 1, b"b": 2, -3: 3, 2**64 - 1: 4, 1.5: 5, True: 6, None: 7, "nested": [{0.25: {None: b"x"}}]}
    assert_same(decode(encode(value)), value)
