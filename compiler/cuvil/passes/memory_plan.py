"""memory-plan: place every intermediate tensor at a fixed offset in one arena.

Contract with the backend (codegen reads these attributes):
- every op result that is neither a constant nor returned gets `attrs["arena_offset"]`
  (bytes, a multiple of ALIGN); returned values go straight to the caller's buffers;
- a `cuvil.reshape` of an arena value whose result is not returned is an alias:
  `attrs["alias"] = True` and its operand's offset; the operand lives as long as it;
- a `cuvil.fused` op may write over an operand of its own shape and dtype that dies at
  it (no later use, not aliased): it then has that operand's offset; so may a
  `cuvil.conv2d` over an epilogue operand (2 on) where its kernel plan (`attrs["kernel_plan"]`,
  from the backend's kernel selection for the target) says `in_place`: its kernel reads
  each such value before writing it;
- a kernel plan's `scratch` bytes are reserved live only during op:
  `attrs["scratch_offset"]` (and `attrs["scratch_bytes"]`); a plan's `reads_producer`
  keeps the operands of the op that defines op's input alive until op (its kernel may
  run that op inside itself);
- a control-flow op (`op.regions`) gets `attrs["arena_offsets"]`, one arena buffer per
  result, and its scratch holds its regions' arena (each region is planned on its own,
  first) then, for a loop, its predicate and next carried values at
  `attrs["loop_offsets"]` (ir.ops.control.scratch_layout);
- symbolic dims are planned at their upper bounds (`fn.attrs["dim_bounds"]`, name ->
  [lo, hi]): the offsets are fixed, every shape within the bounds fits;
- `fn.attrs["arena_size"]` is the arena's size (a multiple of ALIGN) and
  `fn.attrs["intermediate_bytes"]` the sum of the sizes of all tensors placed in it
  (what one buffer per tensor would need), for reports.

Tensors are placed greedily, largest first, each at the lowest offset of the smallest
gap between the tensors already placed whose lifetimes overlap its own (best fit).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..errors import CuvilError
from ..ir import Function, Module, Op, Value
from ..ir.ops.control import scratch_layout

ALIGN = 64


# Ops without arena memory: weights (constants, and quantized weights, which the
# conv2d/matmul kernels that use them read in place) and the terminator.
UNPLANNED = ("cuvil.constant", "cuvil.dequantize", "cuvil.return")


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass(eq=False)
class Buffer:
    """A block of arena memory: one tensor, its aliases and in-place successors, or one
    op's scratch; live from op index `start` to `end` inclusive."""
    start: int
    end: int
    size: int
    values: list[Value] = field(default_factory=list)
    has_alias: bool = False
    offset: int = -1

    def overlaps(self, other: "Buffer") -> bool:
        return self.start <= other.end and other.start <= self.end


def _nbytes(v: Value, op: Op, bounds: dict) -> int:
    """Bytes of a value; a symbolic shape is sized for the symbols' upper bounds."""
    if not v.type.is_static:
        missing = sorted(v.type.symbols - set(bounds))
        if missing:
            raise CuvilError(f"memory planning needs bounds for the symbolic dim(s) {', '.join(missing)}: "
                             f"{op.name}{' (' + op.loc + ')' if op.loc else ''} yields {v.type}")
        return v.type.bound(bounds).nbytes
    return v.type.nbytes


def _place(buffers: list[Buffer]) -> int:
    """Give each buffer an offset (greedy by size, best fit); returns the arena size."""
    placed: list[Buffer] = []
    for buf in sorted(buffers, key=lambda b: (-b.size, b.start, b.end)):
        best, prev_end = None, 0
        for other in sorted((p for p in placed if p.overlaps(buf)), key=lambda p: p.offset):
            gap = other.offset - prev_end
            if gap >= buf.size and (best is None or gap < best[0]):
                best = (gap, prev_end)
            prev_end = max(prev_end, other.offset + other.size)
        buf.offset = best[1] if best else prev_end
        placed.append(buf)
    return max((b.offset + b.size for b in placed), default=0)


def _plan(op: Op) -> dict:
    """op's kernel plan (the backend's kernel selection), empty where it has none."""
    return op.attrs.get("kernel_plan") or {}


def _extra_reads(op: Op) -> tuple:
    """Values op's kernel reads beyond its operands (its plan's `reads_producer`)."""
    if not _plan(op).get("reads_producer"):
        return ()
    return tuple(op.operands[0].defining_op.operands)


@dataclass(frozen=True)
class MemoryPlan:
    name = "memory-plan"
    in_place: bool = True

    def apply(self, module: Module) -> None:
        for fn in module.all_functions():
            self.plan(fn)

    def plan(self, fn: Function) -> None:
        ops = fn.body.ops
        bounds = fn.attrs.get("dim_bounds") or {}
        last_use = {}
        for i, op in enumerate(ops):
            for v in [*op.operands, *_extra_reads(op)]:
                last_use[id(v)] = i
        returned = {id(v) for v in fn.outputs}
        home: dict[int, Buffer] = {}  # value id -> its buffer
        buffers: list[Buffer] = []
        scratch: list[tuple[Op, Buffer]] = []
        for i, op in enumerate(ops):
            for key in ("arena_offset", "arena_offsets", "alias", "scratch_offset", "scratch_bytes", "loop_offsets"):
                op.attrs.pop(key, None)
            if op.name in UNPLANNED:
                continue
            if op.regions:
                buffers += self._control(op, i, bounds, last_use, scratch)
                continue
            if len(op.results) != 1:
                raise CuvilError(f"memory planning supports single-result ops, not {op.name}")
            r = op.result
            extra = _plan(op).get("scratch", 0)
            if extra > 0:
                scratch.append((op, Buffer(i, i, _align(extra))))
            if id(r) in returned:
                continue
            buf = self._reuse(op, i, home, last_use)
            if buf is None:
                buf = Buffer(i, i, _align(_nbytes(r, op, bounds)))
                buffers.append(buf)
            elif op.name == "cuvil.reshape":
                op.attrs["alias"] = True
                buf.has_alias = True
            buf.values.append(r)
            buf.end = max(buf.end, last_use.get(id(r), i))
            home[id(r)] = buf
        size = _place(buffers + [b for _, b in scratch])
        for buf in buffers:
            for v in buf.values:
                if v.defining_op.regions:
                    v.defining_op.attrs.setdefault("arena_offsets", [0] * len(v.defining_op.results))[v.index] = \
                        buf.offset
                else:
                    v.defining_op.attrs["arena_offset"] = buf.offset
        for op, buf in scratch:
            op.attrs["scratch_offset"], op.attrs["scratch_bytes"] = buf.offset, buf.size
        fn.attrs["arena_size"] = _align(size)
        fn.attrs["intermediate_bytes"] = sum(_nbytes(v, v.defining_op, bounds) for buf in buffers for v in buf.values
                                             if not v.defining_op.attrs.get("alias"))

    @staticmethod
    def _control(op: Op, i: int, bounds: dict, last_use: dict, scratch: list) -> list[Buffer]:
        """A control-flow op's buffers: one per result (returned ones too: the loop
        works in them), live from op on; its regions' arena (planned before it, as
        Module.all_functions orders them) and loop temporaries in its scratch."""
        _, loop, total = scratch_layout(op, lambda v: _nbytes(v, op, bounds), _align)
        if loop:
            op.attrs["loop_offsets"] = loop
        if total:
            scratch.append((op, Buffer(i, i, total)))
        out = []
        for r in op.results:
            buf = Buffer(i, max(i, last_use.get(id(r), i)), _align(_nbytes(r, op, bounds)), [r])
            out.append(buf)
        return out

    def _reuse(self, op: Op, i: int, home: dict, last_use: dict) -> Buffer | None:
        """The buffer op's result shares: its operand's for a reshape alias, a dying
        operand's for an in-place fused op or residual conv; else None."""
        if op.name == "cuvil.reshape":
            return home.get(id(op.operands[0]))
        if not self.in_place:
            return None
        if op.name == "cuvil.fused":
            candidates = op.operands
        elif op.name == "cuvil.conv2d" and _plan(op).get("in_place"):
            # not a residual that is also the conv's input (read at other positions)
            candidates = [v for v in op.operands[2:] if all(v is not w for w in op.operands[:2])]
        else:
            return None
        r = op.result
        for v in candidates:
            buf = home.get(id(v))
            if buf is None or buf.has_alias or (v.shape, v.dtype) != (r.shape, r.dtype):
                continue
            if buf.end == i and all(home.get(id(w)) is not buf for w in op.operands if w is not v):
                return buf
        return None


@dataclass(eq=False)
class _Span:
    """For check_plan: bytes [lo, hi) owned by `owner` (None: scratch), live over op
    indices [start, end]; `at` is the index of the op that writes them."""
    start: int
    end: int
    lo: int
    hi: int
    owner: Optional[Value]
    at: int

    def clashes(self, other: "_Span") -> bool:
        return self.lo < other.hi and other.lo < self.hi and self.start <= other.end and other.start <= self.end


def check_plan(fn: Function) -> None:
    """Assert that no two tensors (or scratch areas) that are live at the same time
    share arena bytes, except a reshape alias and its operand, and a fused op's (or an
    in-place conv's) result and the same-shaped operand it overwrites as that operand
    dies."""
    ops = fn.body.ops
    returned = {id(v) for v in fn.outputs}
    size = fn.attrs.get("arena_size", 0)
    bounds = fn.attrs.get("dim_bounds") or {}
    assert size % ALIGN == 0, f"arena_size {size} is not a multiple of {ALIGN}"
    root: dict[int, Value] = {}  # arena value -> the value owning its bytes (itself, or an alias's source)
    spans: dict[int, _Span] = {}  # owner value -> its span
    scratch: list[_Span] = []
    for i, op in enumerate(ops):
        if "scratch_offset" in op.attrs:
            lo = op.attrs["scratch_offset"]
            scratch.append(_Span(i, i, lo, lo + op.attrs["scratch_bytes"], None, i))
        for v in op.operands:  # a use of an alias keeps its source alive
            if id(v) in root:
                spans[id(root[id(v)])].end = i
        if op.name in UNPLANNED:
            continue
        if op.regions:  # a control-flow op: every result in a buffer of its own
            for r, off in zip(op.results, op.attrs["arena_offsets"]):
                root[id(r)] = r
                spans[id(r)] = _Span(i, i, off, off + r.type.bound(bounds).nbytes, r, i)
            continue
        r, where = op.result, f"op {i} ({op.name})"
        if id(r) in returned:
            assert "arena_offset" not in op.attrs, f"{where}: returned value placed in the arena"
            continue
        assert "arena_offset" in op.attrs, f"{where}: intermediate without an arena_offset"
        off = op.attrs["arena_offset"]
        nbytes = r.type.bound(bounds).nbytes
        assert off % ALIGN == 0 and off + nbytes <= size, f"{where}: bad offset {off}"
        if op.attrs.get("alias"):
            src = op.operands[0]
            assert op.name == "cuvil.reshape" and id(src) in root and \
                src.defining_op.attrs["arena_offset"] == off, f"{where}: alias does not share its operand's offset"
            root[id(r)] = root[id(src)]
            continue
        root[id(r)] = r
        spans[id(r)] = _Span(i, i, off, off + nbytes, r, i)
    every = list(spans.values()) + scratch
    for n, a in enumerate(every):
        for b in every[n + 1:]:
            if a.clashes(b):
                assert _overwrites(ops, root, a, b) or _overwrites(ops, root, b, a), \
                    f"ops {a.at} ({ops[a.at].name}) and {b.at} ({ops[b.at].name}) overlap in the arena while both live"


def _overwrites(ops, root, old: _Span, new: _Span) -> bool:
    """`new` is a fused op's result (or a conv's, over an epilogue operand) written over
    the bytes of an operand dying there, read element for element (same shape)."""
    op = ops[new.at]
    if new.owner is None or old.owner is None or op.name not in ("cuvil.fused", "cuvil.conv2d") \
            or old.end != new.start:
        return False
    if (old.lo, old.hi) != (new.lo, new.hi):
        return False
    operands = op.operands if op.name == "cuvil.fused" else op.operands[2:]
    mine = [v for v in operands if root.get(id(v)) is old.owner]
    return bool(mine) and all(v.shape == new.owner.shape for v in mine)
