"""A parsed selector laid out for the C core (``rmq_sql_prog`` of native/rmq_core.h) and run over
the ``properties`` column of a batch: :func:`matches_mask` and :func:`filter_batch`, with no
Python per message. The C evaluation follows :mod:`.nodes` step by step; tests compare them."""
from __future__ import annotations

import functools

import numpy as np
import pyarrow as pa

from rmq_source.errors import RmqOptionError
from rmq_source.sql92.javavalues import BOOL, DOUBLE, INT, LONG, STR
from rmq_source.sql92.nodes import (And, BoolCast, Const, Equal, In, Less, Negate, Node, Not, Or,
                                    Prop, StringTest, chain)

MAX_PROPERTIES = 1024
MAX_DEPTH = 256      # of the laid-out tree: AND/OR chains are balanced first
_KINDS = {None: 0, INT: 1, LONG: 2, DOUBLE: 3, STR: 4, BOOL: 5}
_LESS = {">": 0, ">=": 1, "<": 2, "<=": 3}
_TESTS = {"CONTAINS": 0, "STARTSWITH": 1, "ENDSWITH": 2}


class Program:
    """The C program of a selector's expression (kept alive with its buffers)."""

    def __init__(self, root: Node, text: str = ""):
        from rmq_source.store.native import ffi, lib
        self._ffi, self._lib = ffi, lib
        self.nodes: list[dict] = []
        self.strings: list[bytes] = []
        self.props: list[str] = []
        self._depth = 0
        self.root = self._emit(root, 1, text)
        n = len(self.nodes)
        self._c_nodes = ffi.new("rmq_sql_node[]", n)
        for i, nd in enumerate(self.nodes):
            for k, v in nd.items():
                setattr(self._c_nodes[i], k, v)
        prop_str = [self._string(p.encode()) for p in self.props]
        pool = b"".join(self.strings)
        offs = np.zeros(len(self.strings) + 1, dtype=np.int64)
        np.cumsum([len(s) for s in self.strings], out=offs[1:])
        if offs[-1] > 1 << 30:
            raise RmqOptionError("option subExpression: the SQL92 selector's strings exceed 1 GiB")
        self._pool = ffi.new("uint8_t[]", pool or b"\0")
        self._offs = ffi.new("int32_t[]", offs.tolist())
        self._prop_str = ffi.new("int32_t[]", prop_str or [0])
        self.c = ffi.new("rmq_sql_prog *")
        self.c.nodes, self.c.nnodes, self.c.root = self._c_nodes, n, self.root
        self.c.strings, self.c.str_off = self._pool, self._offs
        self.c.nstrings = len(self.strings)
        self.c.prop_str, self.c.nprops = self._prop_str, len(self.props)

    def _string(self, data: bytes) -> int:
        self.strings.append(data)
        return len(self.strings) - 1

    def _add(self, **fields) -> int:
        self.nodes.append(fields)
        return len(self.nodes) - 1

    def _emit(self, node: Node, depth: int, text: str) -> int:
        if depth > MAX_DEPTH:
            raise RmqOptionError(f"option subExpression: the SQL92 selector nests deeper than {MAX_DEPTH} "
                                 f"levels: {text[:80]!r}")
        d = depth + 1
        if isinstance(node, Const):
            kind = node.value[0] if node.value is not None else None
            fields = {"op": 1, "a": -1, "b": -1, "kind": _KINDS[kind]}
            if kind in (INT, LONG):
                fields["ival"] = node.value[1]
            elif kind == BOOL:
                fields["ival"] = int(node.value[1])
            elif kind == DOUBLE:
                fields["dval"] = node.value[1]
            elif kind == STR:
                fields["str"] = self._string(node.value[1].encode("utf-8", "surrogatepass"))
            return self._add(**fields)
        if isinstance(node, Prop):
            if node.name not in self.props:
                if len(self.props) == MAX_PROPERTIES:
                    raise RmqOptionError(f"option subExpression: the SQL92 selector names more than "
                                         f"{MAX_PROPERTIES} properties")
                self.props.append(node.name)
            return self._add(op=2, a=-1, b=-1, str=self.props.index(node.name))
        if isinstance(node, (Negate, BoolCast, Not)):
            a = self._emit(node.operand, d, text)
            return self._add(op={Negate: 3, BoolCast: 4, Not: 7}[type(node)], a=a, b=-1)
        if isinstance(node, (And, Or)):
            return self._emit_chain(type(node), chain(node), d, text)
        if isinstance(node, (Less, Equal)):
            a = self._emit(node.left, d, text)
            b = self._emit(node.right, d, text)
            fields = {"op": {Less: 5, Equal: 6}[type(node)], "a": a, "b": b}
            if isinstance(node, Less):
                fields["kind"] = _LESS[node.op]
            return self._add(**fields)
        if isinstance(node, In):
            a = self._emit(node.operand, d, text)
            values = sorted(node.values)
            first = len(self.strings)
            for v in values:
                self._string(v.encode("utf-8", "surrogatepass"))
            return self._add(op=10, a=a, b=-1, str=first, nstr=len(values), negated=int(node.negated))
        if isinstance(node, StringTest):
            a = self._emit(node.operand, d, text)
            return self._add(op=11, a=a, b=-1, kind=_TESTS[node.kind], negated=int(node.negated),
                             str=self._string(node.search.encode("utf-8", "surrogatepass")))
        raise AssertionError(f"unknown node {node!r}")

    def _emit_chain(self, kind: type, operands: list, depth: int, text: str) -> int:
        """``a AND b AND c ...`` as a balanced tree: the same operands left to right, the same
        short cuts (the first FALSE, resp. TRUE, decides; a null or an error met before it
        counts), so the same answers as the parser's left-leaning chain, at log depth."""
        if len(operands) == 1:
            return self._emit(operands[0], depth, text)
        mid = len(operands) // 2
        a = self._emit_chain(kind, operands[:mid], depth + 1, text)
        b = self._emit_chain(kind, operands[mid:], depth + 1, text)
        return self._add(op=8 if kind is And else 9, a=a, b=b)

    def matches_mask(self, properties: pa.Array) -> np.ndarray:
        """uint8 per row of a map<string,string> array: 1 where the selector is TRUE."""
        ffi, lib = self._ffi, self._lib
        if isinstance(properties, pa.ChunkedArray):
            return np.concatenate([self.matches_mask(c) for c in properties.chunks] or
                                  [np.zeros(0, dtype=np.uint8)])
        t = properties.type
        if not (pa.types.is_map(t) and pa.types.is_string(t.key_type) and pa.types.is_string(t.item_type)):
            raise RmqOptionError(f"the properties column must be map<string,string>, not {t}")
        n = len(properties)
        out = np.zeros(n, dtype=np.uint8)
        if n == 0:
            return out
        keys, items = properties.keys, properties.items
        if keys.null_count or items.null_count:
            raise RmqOptionError("a properties map with null names or values cannot be filtered")
        bufs = properties.buffers()         # map validity, offsets, struct validity, keys..., items...
        valid = bufs[0]
        key_off = np.frombuffer(keys.buffers()[1], dtype=np.int32)[keys.offset:keys.offset + len(keys) + 1]
        val_off = np.frombuffer(items.buffers()[1], dtype=np.int32)[items.offset:items.offset + len(items) + 1]
        map_off = np.frombuffer(bufs[1], dtype=np.int32)
        # entries are indexed from the keys' slice: shift the map offsets by where keys start
        base = int(map_off[properties.offset])
        map_off = map_off[properties.offset:properties.offset + n + 1] - base
        key_data, val_data = keys.buffers()[2], items.buffers()[2]
        err = ffi.new("rmq_error *")
        keep = [np.ascontiguousarray(map_off, dtype=np.int32), np.ascontiguousarray(key_off[base:]),
                np.ascontiguousarray(val_off[base:])]
        valid_ptr = ffi.NULL
        if valid is not None and properties.null_count:
            bits = np.unpackbits(np.frombuffer(valid, dtype=np.uint8), bitorder="little")
            keep.append(np.packbits(bits[properties.offset:properties.offset + n], bitorder="little"))
            valid_ptr = ffi.from_buffer("uint8_t[]", keep[-1])
        rc = lib.rmq_sql_eval(
            self.c, n, 0, ffi.from_buffer("int32_t[]", keep[0]), valid_ptr,
            ffi.from_buffer("int32_t[]", keep[1]), _ptr(ffi, key_data),
            ffi.from_buffer("int32_t[]", keep[2]), _ptr(ffi, val_data),
            len(keys) - base, key_data.size if key_data is not None else 0,
            val_data.size if val_data is not None else 0, ffi.from_buffer("uint8_t[]", out), err)
        if rc:
            raise RmqOptionError(ffi.string(err.message).decode("utf-8", "replace"))
        return out


@functools.lru_cache(maxsize=64)
def selector_program(text: str) -> Program:
    """The program of a selector (parsed and laid out once per process)."""
    from rmq_source.sql92 import compile_selector
    return Program(compile_selector(text).root, text)


def _ptr(ffi, buf):
    return ffi.NULL if buf is None or buf.size == 0 else ffi.cast("const uint8_t *", buf.address)


def filter_batch(program: Program, batch: pa.RecordBatch) -> pa.RecordBatch:
    """The rows of ``batch`` whose ``properties`` the selector selects."""
    mask = program.matches_mask(batch.column(batch.schema.get_field_index("properties")))
    if mask.all():
        return batch
    return batch.filter(pa.array(mask.view(np.bool_)))
