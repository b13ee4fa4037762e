"""Msgpack frames for courier RPC: a whitelist of types, arrays out of band, no pickle.

Frame layout (integers little-endian)::

    [u32 header length H][msgpack header, H bytes][zero padding to a 64-byte boundary][data section]

The header is msgpack of the value. A type msgpack lacks travels as a msgpack array headed by an
empty ExtType tag naming the type: ``[TUPLE, *items]``, ``[ARRAY, dtype name, shape, offset,
nbytes]``, ``[SCALAR, dtype name, raw bytes]``, ``[REGISTERED, name, *field values]``. The whole
header is one msgpack pass each way (no nested msgpack per tuple), so nesting costs no recursion
beyond msgpack's own depth limits. Array bytes stay out of the header: each array's buffer sits in
the data section at an offset that is a multiple of 64 bytes from the frame start, which buys
two things:

* ``encode_parts`` returns the header followed by the arrays' own buffers (memoryviews; no copy
  when an array is already C-contiguous little-endian), so the transport can stream hundreds of
  MB in chunks without first joining them into one bytes object.
* ``decode`` builds every array with ``np.frombuffer`` over the frame: no copy, and 64-byte
  aligned whenever the receive buffer is.
  Arrays decoded from a ``bytes`` frame are read-only views; from a ``bytearray`` frame they are
  writable views. Either way each keeps the whole frame alive: copy (``np.array(x)``) an array
  you keep long after dropping the rest.

A frame without arrays ends right after the header, so small calls cost a few microseconds.
Hosts are assumed little-endian, as JAX's are; big-endian arrays are converted when sent.

Safety: ``decode`` builds only None, bool, int, float, str, bytes, list, tuple, dict, numpy arrays
and scalars of whitelisted dtypes (looked up by name, never ``np.dtype(<wire string>)``), and
classes registered on the receiver with ``register`` (looked up in a registry, never imported
by name). Any other input raises ``CodecError``. ``encode`` refuses anything outside the
whitelist with a ``TypeError`` naming where the value sits, e.g.
``args[1]['opt'][0]: cannot send <class 'Foo'>``.

Decoding never amplifies: a message holds at most ``MAX_OBJECTS`` lists, dicts and items (one
byte of ``0x90`` would otherwise become a 56-byte list), and dict keys are only str, bytes, int,
float, bool or None (``KEY_TYPES``), whose hashes a peer cannot make collide by the thousand as it
can a tuple's (20,000 such keys make building a dict quadratic: seconds of a server thread).
Large collections belong in numpy arrays, which cost no objects.
"""

from __future__ import annotations

import dataclasses
import math
import struct
import sys
import threading
import types
from typing import Any

import ml_dtypes
import msgpack
import numpy as np

__all__ = ["KEY_TYPES", "MAX_OBJECTS", "CodecError", "decode", "encode", "encode_parts", "frame_size",
           "register", "register_optax_states"]

_ALIGN = 64
_MAX_NDIM = 64  # numpy's own limit
_TUPLE, _ARRAY, _SCALAR, _REGISTERED = 1, 2, 3, 4  # msgpack ext type codes of the tags
_TAGS = {code: msgpack.ExtType(code, b"") for code in (_TUPLE, _ARRAY, _SCALAR, _REGISTERED)}
_PREFIX = struct.Struct("<I")
_ZEROS = bytes(_ALIGN)
_INT_RANGE = range(-(2**63), 2**64)  # what msgpack's int encodings hold
_MAX_EXT_BYTES = 12  # our tags carry no payload; msgpack's timestamps carry 4, 8 or 12 bytes

MAX_OBJECTS = 1 << 20
KEY_TYPES = frozenset({str, bytes, int, float, bool, type(None)})


def _wire_dtypes() -> dict[str, np.dtype]:
    numpy_types = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                   np.uint32, np.uint64, np.float16, np.float32, np.float64, np.complex64,
                   np.complex128]
    ml_names = ["bfloat16", "float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz", "float8_e4m3fn",
                "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu"]
    ml_types = [getattr(ml_dtypes, name) for name in ml_names if hasattr(ml_dtypes, name)]
    dtypes = [np.dtype(t).newbyteorder("<") for t in numpy_types + ml_types]
    return {dtype.name: dtype for dtype in dtypes}


_DTYPES = _wire_dtypes()  # wire name -> little-endian dtype
_NAMES = {dtype: name for name, dtype in _DTYPES.items()}  # dtype.name is slow (Python code)


def _wire_name(dtype: Any) -> str | None:
    name = _NAMES.get(dtype)
    if name is None and isinstance(dtype, np.dtype) and dtype.byteorder == ">":
        name = _NAMES.get(dtype.newbyteorder("<"))
    return name


class CodecError(ValueError):
    """A frame that is not a valid encoding of whitelisted types (truncated, corrupt, hostile)."""


@dataclasses.dataclass(frozen=True)
class _Registered:
    cls: type
    name: str
    fields: tuple[str, ...]  # positional for NamedTuples, keyword (init fields) for dataclasses
    is_namedtuple: bool


_BY_CLASS: dict[type, _Registered] = {}
_BY_NAME: dict[str, _Registered] = {}


def register(cls: type, name: str | None = None) -> type:
    """Allow a NamedTuple class or dataclass (flax.struct too) on the wire, in both directions.

    Sender and receiver must both register it under the same name, which defaults to
    ``module.qualname``. Returns ``cls``, so it works as a decorator. Registering a class again
    under its name is a no-op; a name already taken by another class is a ValueError.
    """
    if isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields"):
        entry_fields, is_namedtuple = tuple(cls._fields), True
    elif isinstance(cls, type) and dataclasses.is_dataclass(cls):
        entry_fields = tuple(f.name for f in dataclasses.fields(cls) if f.init)
        is_namedtuple = False
    else:
        raise TypeError(f"register() takes a NamedTuple class or a dataclass, got {cls!r}")
    name = name or f"{cls.__module__}.{cls.__qualname__}"
    known = _BY_CLASS.get(cls)
    if known is not None:
        if known.name == name:
            return cls
        raise ValueError(f"{cls!r} is already registered as {known.name!r}")
    if name in _BY_NAME:
        raise ValueError(f"codec name {name!r} is taken by {_BY_NAME[name].cls!r}; "
                         f"pass register({cls.__qualname__}, name=...) a unique name")
    _BY_CLASS[cls] = _BY_NAME[name] = _Registered(cls, name, entry_fields, is_namedtuple)
    return cls


def register_optax_states() -> None:
    """Register every public NamedTuple class in ``optax`` and its public submodules.

    Optimizer states are trees of such NamedTuples; call this on both peers before sending one.
    """
    import optax

    seen: set[int] = set()

    def walk(module: types.ModuleType) -> None:
        seen.add(id(module))
        for attr, value in vars(module).items():
            if attr.startswith("_"):
                continue
            if isinstance(value, types.ModuleType):
                in_optax = value.__name__.partition(".")[0] == "optax"
                if in_optax and id(value) not in seen:
                    walk(value)
            elif (isinstance(value, type) and issubclass(value, tuple)
                  and hasattr(value, "_fields") and value not in _BY_CLASS):
                register(value)

    walk(optax)


class _Encoder:
    """State of one encode call: msgpack's ``default`` hook and the data section it lays out."""

    __slots__ = ("buffers", "size", "hashables")

    def __init__(self) -> None:
        self.buffers: list[tuple[int, memoryview]] = []  # (offset in data section, bytes)
        self.size = 0
        # Whether `default` saw a hashable value (tuple, registered, numpy scalar): only such a
        # value can be a dict key outside KEY_TYPES, so only then are the keys checked.
        self.hashables = False

    def pack(self, value: Any) -> bytes:
        # strict_types: tuple subclasses, float subclasses (np.float64), ... reach `default`.
        # A small first buffer: packb's 1 MiB one costs an mmap per call (a few us).
        packer = msgpack.Packer(default=self.default, strict_types=True, buf_size=_ALIGN * 16)
        return packer.pack(value)

    def default(self, obj: Any) -> list:
        cls = type(obj)
        if cls is tuple:
            self.hashables = True
            return [_TAGS[_TUPLE], *obj]
        if cls is np.ndarray or cls is np.memmap:
            return self.array(obj)
        entry = _BY_CLASS.get(cls)
        if entry is not None:
            self.hashables = True
            values = obj if entry.is_namedtuple else [getattr(obj, f) for f in entry.fields]
            return [_TAGS[_REGISTERED], entry.name, *values]
        if isinstance(obj, np.generic) and obj.dtype in _NAMES:  # native = little-endian
            self.hashables = True
            return [_TAGS[_SCALAR], _NAMES[obj.dtype], obj.tobytes()]
        jax = sys.modules.get("jax")
        if jax is not None and isinstance(obj, jax.Array) and isinstance(obj.dtype, np.dtype):
            return self.array(np.asarray(obj))
        raise _Unsendable

    def array(self, arr: np.ndarray) -> list:
        name = _wire_name(arr.dtype)
        if name is None:
            raise _Unsendable
        arr = arr.astype(_DTYPES[name], order="C", copy=False)  # no-op unless strided/big-endian
        offset = 0
        if arr.nbytes:
            offset = _align(self.size)
            self.buffers.append((offset, memoryview(arr.reshape(-1).view(np.uint8))))
            self.size = offset + arr.nbytes
        return [_TAGS[_ARRAY], name, list(arr.shape), offset, arr.nbytes]


class _Unsendable(Exception):
    """Raised inside msgpack's hook; encode_parts then re-walks the value to name the path."""


def _align(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def encode_parts(value: Any, root: str | tuple[str, ...] = "") -> list[bytes | memoryview]:
    """Encode ``value`` as frame parts: the header, then array buffers (and their padding).

    Raises TypeError naming the path of an unsendable part; msgpack's ValueError for nesting
    deeper than its limit (1024 levels in msgpack 1.1; the receiver allows as many).

    ``root`` only names paths in errors. A str prefixes every path (``root="result"`` gives
    ``result[2]: cannot send ...``); a tuple of names labels the elements of a top-level
    list/tuple, so a client encoding ``[args, kwargs]`` with ``root=("args", "kwargs")`` reports
    ``args[1]['opt'][0]: cannot send <class 'Foo'>``.
    """
    header = _pack_plain(value)
    if header is not None:
        return [_PREFIX.pack(len(header)) + header]
    encoder = _Encoder()
    try:
        header = encoder.pack(value)
    except _Unsendable:
        raise TypeError(_first_unsendable(value, root) or f"cannot send {type(value)!r}") from None
    if encoder.hashables and _has_bad_key(value):
        raise TypeError(_first_unsendable(value, root))
    prefix = _PREFIX.pack(len(header))
    if not encoder.buffers:
        return [prefix + header]
    parts: list[bytes | memoryview] = [b"".join((prefix, header, _padding(4 + len(header))))]
    end = 0
    for offset, buffer in encoder.buffers:
        if offset > end:
            parts.append(_ZEROS[: offset - end])
        parts.append(buffer)
        end = offset + len(buffer)
    return parts


_plain_packers = threading.local()


def _pack_plain(value: Any) -> bytes | None:
    """The header of a value of plain msgpack types alone (no arrays, tuples or registered
    types: the common small call), by a packer kept per thread; None for anything else, which
    the full encoder takes (and names, if it cannot be sent)."""
    packer = getattr(_plain_packers, "packer", None)
    if packer is None:
        packer = _plain_packers.packer = msgpack.Packer(strict_types=True, buf_size=_ALIGN * 16)
    try:
        return packer.pack(value)
    except (TypeError, ValueError, OverflowError):  # not plain, too deep, or an int beyond 64 bits
        packer.reset()
        return None


def _padding(n: int) -> bytes:
    return _ZEROS[: _align(n) - n]


def encode(value: Any, root: str | tuple[str, ...] = "") -> bytes:
    """The frame as one bytes object (copies the arrays; prefer encode_parts for big payloads)."""
    return b"".join(encode_parts(value, root))


def frame_size(parts: list[bytes | memoryview]) -> int:
    """Total bytes of a parts list (memoryviews from encode_parts are flat bytes)."""
    return sum(len(part) for part in parts)


def _has_bad_key(value: Any) -> bool:
    """Whether a dict in ``value`` has a key outside KEY_TYPES (msgpack packs any key it can)."""
    stack = [value]
    while stack:
        item = stack.pop()
        cls = type(item)
        if cls is dict:
            if not KEY_TYPES.issuperset(map(type, item)):
                return True
            stack.extend(item.values())
        elif cls is list or cls is tuple:
            stack.extend(item)
        elif cls in _BY_CLASS:
            stack.extend(getattr(item, name) for name in _BY_CLASS[cls].fields)
    return False


def _first_unsendable(value: Any, root: str | tuple[str, ...]) -> str | None:
    if isinstance(root, tuple) and type(value) in (list, tuple):
        paths = [root[i] if i < len(root) else f"[{i}]" for i in range(len(value))]
        return next(filter(None, map(_find_unsendable, value, paths)), None)
    return _find_unsendable(value, root if isinstance(root, str) else "")


def _find_unsendable(value: Any, path: str) -> str | None:
    """Walk ``value`` by the encoder's rules; describe the first part it refuses, or None."""
    cls = type(value)
    if value is None or cls in (bool, float, str, bytes, bytearray, memoryview):
        return None
    where = f"{path or 'value'}: cannot send {cls!r}"
    entry = _BY_CLASS.get(cls)
    jax = sys.modules.get("jax")
    if cls is list or cls is tuple:
        children = [(f"{path}[{i}]", v) for i, v in enumerate(value)]
    elif cls is dict:
        bad_key = next((k for k in value if type(k) not in KEY_TYPES), None)
        if bad_key is not None:
            return (f"{path}[{bad_key!r}]: cannot send {type(bad_key)!r} as a dict key "
                    f"(keys are str, bytes, int, float, bool or None)")
        children = [(f"{path}[{k!r}]", x) for k, v in value.items() for x in (k, v)]
    elif entry is not None:
        children = [(f"{path}.{f}", getattr(value, f)) for f in entry.fields]
    elif cls is int:
        return None if value in _INT_RANGE else f"{where} {value} (beyond 64 bits)"
    elif cls is np.ndarray or cls is np.memmap or isinstance(value, np.generic) or (
            jax is not None and isinstance(value, jax.Array)):
        ok = _wire_name(value.dtype) is not None
        return None if ok else f"{where} of dtype {value.dtype} (numeric and bool dtypes only)"
    elif (issubclass(cls, tuple) and hasattr(cls, "_fields")) or dataclasses.is_dataclass(cls):
        return f"{where}: call jaxdist.courier.codec.register({cls.__qualname__}) on both peers"
    else:
        return where
    for child_path, child in children:
        found = _find_unsendable(child, child_path)
        if found:
            return found
    return None


class _Decoder:
    """State of one decode call: the frame (arrays view into it), tags not yet consumed and the
    objects the message may still hold."""

    __slots__ = ("frame", "data_start", "open_tags", "objects_left")

    def __init__(self, frame: memoryview, data_start: int) -> None:
        self.frame = frame
        self.data_start = data_start
        self.open_tags = 0
        self.objects_left = MAX_OBJECTS

    def ext_hook(self, code: int, payload: bytes) -> msgpack.ExtType:
        tag = _TAGS.get(code)
        if tag is None or payload:
            raise CodecError(f"unknown msgpack ext type {code} (payload {bytes(payload)!r:.50})")
        self.open_tags += 1
        return tag

    def count(self, objects: int) -> None:
        """A container counts itself and its items once it is complete (so an empty list costs
        one): msgpack bounds each container's length, so what is built before a refusal is bounded."""
        self.objects_left -= objects
        if self.objects_left < 0:
            raise CodecError(f"a message holds at most {MAX_OBJECTS} objects (lists, dicts and their items); "
                             f"send large collections as numpy arrays")

    def map_hook(self, pairs: list[tuple[Any, Any]]) -> dict:
        self.count(1 + 2 * len(pairs))
        for key, _ in pairs:
            if type(key) not in KEY_TYPES:
                raise CodecError(f"a dict key of {type(key)!r:.100}: keys are str, bytes, int, float, bool or None")
        return dict(pairs)

    def list_hook(self, items: list) -> Any:
        self.count(1 + len(items))
        if not items or type(items[0]) is not msgpack.ExtType:
            return items
        self.open_tags -= 1
        kind = items[0].code
        if kind == _TUPLE:
            return tuple(items[1:])
        if kind == _ARRAY:
            return self.array(*_fields(items, 5, "array"))
        if kind == _SCALAR:
            return _scalar(*_fields(items, 3, "numpy scalar"))
        return _build(items[1] if len(items) > 1 else None, items[2:])

    def array(self, name: Any, shape: Any, offset: Any, nbytes: Any) -> np.ndarray:
        dtype = _wire_dtype(name)
        if (type(shape) is not list or len(shape) > _MAX_NDIM
                or not all(type(d) is int and d >= 0 for d in shape)):
            raise CodecError(f"bad array shape {shape!r:.200}")
        if type(offset) is not int or type(nbytes) is not int or offset < 0:
            raise CodecError(f"bad array offset {offset!r:.50} or size {nbytes!r:.50}")
        count = math.prod(shape)
        if nbytes != count * dtype.itemsize:
            raise CodecError(f"array of {nbytes} bytes does not match shape {shape} of {name}")
        if nbytes == 0:  # holds no bytes, so may point past a frame without a data section
            return np.empty(shape, dtype)
        start = self.data_start + offset
        if start + nbytes > len(self.frame):
            raise CodecError(f"array data [{start}, {start + nbytes}) runs past the end of the "
                             f"{len(self.frame)}-byte frame (truncated?)")
        return np.frombuffer(self.frame, dtype, count, start).reshape(shape)


class _Tagged(Exception):
    """A header holds tags (arrays, tuples, registered types), or is malformed: it needs the
    full decoder."""


def _refuse_ext(code: int, payload: bytes) -> None:
    raise _Tagged


def _decode_plain(header: memoryview, header_len: int) -> Any:
    """The header decoded without hooks, when it holds no ext type: no tags, so no arrays or
    tuples to rebuild and no key outside KEY_TYPES (msgpack has no other hashable type). Its
    object count needs no check either: each object takes a byte, and a container is counted
    once itself and once as an item, so a header of at most MAX_OBJECTS / 2 bytes holds fewer
    than MAX_OBJECTS. Calls and answers of plain values -- most calls -- skip the hooks' cost.
    A malformed header goes to the full decoder too, which says what is wrong with it."""
    try:
        return msgpack.unpackb(header, ext_hook=_refuse_ext, strict_map_key=False, timestamp=2,
                               max_str_len=header_len, max_bin_len=header_len, max_ext_len=_MAX_EXT_BYTES,
                               max_array_len=MAX_OBJECTS, max_map_len=MAX_OBJECTS // 2)
    except (msgpack.UnpackException, ValueError, TypeError, OverflowError, RecursionError):
        raise _Tagged from None


def _fields(items: list, count: int, what: str) -> list:
    if len(items) != count:
        raise CodecError(f"malformed {what} entry {items[1:]!r:.200}")
    return items[1:]


def _wire_dtype(name: Any) -> np.dtype:
    dtype = _DTYPES.get(name) if type(name) is str else None
    if dtype is None:
        raise CodecError(f"dtype {name!r:.100} is not sendable; known: {', '.join(_DTYPES)}")
    return dtype


def _scalar(name: Any, raw: Any) -> np.generic:
    dtype = _wire_dtype(name)
    if type(raw) is not bytes or len(raw) != dtype.itemsize:
        raise CodecError(f"numpy scalar of {name} needs {dtype.itemsize} bytes, got {raw!r:.100}")
    return np.frombuffer(raw, dtype)[0]


def _build(name: Any, values: list) -> Any:
    entry = _BY_NAME.get(name) if type(name) is str else None
    if entry is None:
        raise CodecError(f"type {name!r:.200} is not registered here: call "
                         f"jaxdist.courier.codec.register(<the class>) on the receiver too")
    if len(values) != len(entry.fields):
        raise CodecError(f"{name} takes fields {entry.fields}, got {values!r:.200}")
    try:
        if entry.is_namedtuple:
            return entry.cls(*values)
        return entry.cls(**dict(zip(entry.fields, values)))
    except Exception as e:  # a registered class's own checks (__post_init__, __new__)
        raise CodecError(f"could not rebuild {name}: {e!r}") from e


def decode(frame: bytes | bytearray | memoryview) -> Any:
    """Rebuild a value from a frame; any malformed or hostile input raises CodecError.

    Arrays are views into ``frame`` (read-only for bytes, writable for bytearray).
    """
    view = memoryview(frame).cast("B")
    if len(view) < _PREFIX.size:
        raise CodecError(f"frame of {len(view)} bytes is shorter than its length prefix")
    (header_len,) = _PREFIX.unpack_from(view)
    end = _PREFIX.size + header_len
    if end > len(view):
        raise CodecError(f"header of {header_len} bytes runs past the {len(view)}-byte frame")
    if header_len <= MAX_OBJECTS // 2:
        try:
            return _decode_plain(view[_PREFIX.size:end], header_len)
        except _Tagged:
            pass
    decoder = _Decoder(view, _align(end))
    try:
        # timestamp=2: msgpack decodes ext type -1 itself, before ext_hook; this makes it a
        # plain int (nanoseconds) rather than a msgpack.Timestamp. Strings and bytes copy at
        # most the header (no amplification); container lengths are refused before allocation.
        value = msgpack.unpackb(view[_PREFIX.size:end], ext_hook=decoder.ext_hook, list_hook=decoder.list_hook,
                                object_pairs_hook=decoder.map_hook, strict_map_key=False, timestamp=2,
                                max_str_len=header_len, max_bin_len=header_len, max_ext_len=_MAX_EXT_BYTES,
                                max_array_len=MAX_OBJECTS, max_map_len=MAX_OBJECTS // 2)
    except CodecError:
        raise
    except (msgpack.UnpackException, ValueError, TypeError, OverflowError, RecursionError) as e:
        # msgpack's own errors (truncated, extra data, bad utf-8, too deep) and unhashable keys.
        raise CodecError(f"malformed frame: {type(e).__name__}: {e}") from e
    if decoder.open_tags:
        raise CodecError("malformed frame: a type tag is not at the head of an array")
    return value
