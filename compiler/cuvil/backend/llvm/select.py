"""Kernel selection: which kernel each op runs on a target, decided once, kept on the op.

`SelectKernels` runs for one target right before the memory plan. For every op the code
generator emits a kernel for, it records the op's *kernel plan* in `op.attrs["kernel_plan"]`,
a dict the IR printer shows (and so `cuvil inspect`):

- `form`: the kernel's form, e.g. a conv2d's "gemm" (column panels), "transposed",
  "winograd", "depthwise", "depthwise_masked", "direct", "fused_depthwise" (it runs
  the 1x1 conv before it band by band), "in_depthwise" (that 1x1 conv itself),
  "gemm_int8", "gemm_int4", "gemm_bf16", "gemm_bf16_widened", "transposed_bf16"; a
  matmul's "gemm", "batched", "packed", "packed_int8", "packed_int4", "packed_bf16",
  "packed_bf16_widened"; "default" for the ops with one kernel;
- `k_blocked`: a column-panel GEMM conv's schedule is K-blocked (narrow vectors);
  `band_form`: the form a 1x1 conv running inside a depthwise conv has for its bands;
- `lanes`: the f32 vector lanes of the target it was chosen for;
- `weights`: how operand 1 is stored where not as it is: "panels" (gemm.pack_b),
  "winograd" (transformed), "conv_panels" (W^T in panels); a `cuvil.dequantize` op's
  `layout` says how its quantized bytes are laid out (`quantized.quantized_blob`);
- `scratch`: bytes the kernel needs while it runs (a bound for every target, so the
  arena does not depend on the target's width);
- `in_place`: it may write its result over a residual it reads (the memory plan then
  may give it that residual's bytes);
- `reads_producer`: the 1x1 conv before it may run inside it, so that conv's operands
  stay alive until it (the memory plan's liveness);
- `out_pairs`, `in_pairs`, `pairs_extras`: its result, input or epilogue operands are
  stored as bf16 plane pairs. These are set by `SelectStorage`, which runs right after
  the memory plan: a conv written over its residual must store pairs exactly when the
  residual is pairs, and which convs are written over their residual is the memory
  plan's decision.

The memory plan and the code generator only read the plan.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...errors import BackendError
from ...ir.interpreter import PLAN_ATTRS
from ...ir.ops import ANCHORS, ELEMENTWISE
from .gemm import blocked_gemm, panel_width
from .kernel_args import KernelArgs
from .kernels.bf16 import bf16_transposable, bf16_transposed, pair_planes, stored_pairs
from .kernels.conv_shapes import conv_geometry, conv_scratch, thin_panels
from .kernels.depthwise import depthwise
from .kernels.epilogue import op_epilogue
from .kernels.fuse_pw_dw import fusable, fused_scratch_bytes, pointwise_producer
from .kernels.schemes import ACT_SCHEMES, CONSUMERS, int8_scratch_bytes, quantized_weight
from .kernels.winograd import winograd_scratch, winograd_shape
from .target import GENERIC_BF16, GENERIC_INT8, DotIsa, bf16_dot_isa, int8_dot_isa, lanes_of, masked_lanes


@dataclass(frozen=True)
class KernelTarget:
    """What kernel selection needs of a target: its f32 vector lanes and its int8 and
    bf16 dot products (target.DotIsa), as a target.Target gives them (`of`)."""
    lanes: int
    int8: DotIsa = GENERIC_INT8
    bf16: DotIsa = GENERIC_BF16

    @property
    def masked(self) -> bool:
        """Masked vector loads and stores (target.masked_lanes)."""
        return masked_lanes(self.lanes)

    @classmethod
    def of(cls, target=None, vector_bits: int | None = None, int8: DotIsa | None = None,
           bf16: DotIsa | None = None) -> "KernelTarget":
        """For a target.Target (or `vector_bits` alone: the generic dot products);
        `int8` / `bf16` override the target's dot products (tests)."""
        bits = vector_bits if vector_bits is not None else target.vector_bits if target is not None else 128
        lanes = lanes_of(bits)
        return cls(lanes, int8 or int8_dot_isa(target, lanes), bf16 or bf16_dot_isa(target, lanes))

    def record(self, fn) -> None:
        """Note on fn that its kernel plans are for this target."""
        fn.attrs["kernel_target"] = {"lanes": self.lanes, "int8": [self.int8.group, self.int8.dot],
                                     "bf16": [self.bf16.group, self.bf16.dot]}

    @classmethod
    def recorded(cls, fn) -> "KernelTarget":
        """The target fn's kernel plans were made for."""
        t = fn.attrs.get("kernel_target")
        if t is None:
            raise BackendError("the module has no kernel plans: run kernel selection for the target "
                               "(select.SelectKernels, passes.pipeline with a target) before code generation")
        return cls(t["lanes"], DotIsa(*t["int8"]), DotIsa(*t["bf16"]))


# -- operands ------------------------------------------------------------------------------------
def is_scalar_const(v) -> bool:
    op = v.defining_op
    return op is not None and op.name == "cuvil.constant" and op.value.size == 1


def inlinable(op, i: int) -> bool:
    """Operands that kernels take as immediates: scalars of fused programs / epilogues."""
    if op.name == "cuvil.fused" or op.name in ELEMENTWISE:
        return is_scalar_const(op.operands[i])
    if op.name in ANCHORS and i >= 2:
        return is_scalar_const(op.operands[i])
    return False


def inlined_consts(op) -> dict:
    """Operand index -> the scalar constant a kernel takes as an immediate."""
    return {i: op.operands[i].defining_op.value.reshape(()).item()
            for i in range(len(op.operands)) if inlinable(op, i)}


def kernel_attrs(op) -> dict:
    """op's attributes as its kernel sees them: without the memory plan's and this
    module's."""
    return {k: v for k, v in op.attrs.items() if k not in PLAN_ATTRS}


def static_args(op, lanes: int) -> KernelArgs:
    """op's KernelArgs as far as its types, attributes and constants go (no pointers)."""
    return KernelArgs(out=None, out_type=op.result.type, ins=[None] * len(op.operands),
                      in_types=[v.type for v in op.operands], attrs=kernel_attrs(op), consts=inlined_consts(op),
                      vw=lanes)


# -- target-independent facts ----------------------------------------------------------------------
def scratch_bytes(op) -> int:
    """Scratch memory a kernel needs while it runs (the memory planner reserves it): the
    GEMM convolutions pack their B operand (im2col or the input planes) in panels; an
    int8 matmul keeps its quantized A (schemes.int8_scratch_bytes); a depthwise conv
    fused with the 1x1 conv it reads holds its bands (fuse_pw_dw). A bound for every
    target: a conv that runs transposed on some vector width reserves the larger of the
    two forms' scratch."""
    if op.name == "cuvil.matmul":
        return int8_scratch_bytes(op)
    if op.name != "cuvil.conv2d":
        return 0
    x, w = (v.type for v in op.operands[:2])
    _, gemm = conv_geometry(x, w, op.result.type, op.attrs)
    if not gemm:  # a depthwise conv that may run fused with the 1x1 conv before it
        return fused_scratch_bytes(op)
    need = max(conv_scratch(x, w, op.result.type, op.attrs, t)[1] for t in {False, transposable(op)})
    if bf16_transposable(op):
        need = max(need, conv_scratch(x, w, op.result.type, op.attrs, True, codes=True)[1])
    if transposable(op) and winograd_shape(x, w, op.result.type, op.attrs, 16):
        need = max(need, winograd_scratch(w, op.result.type))
    return need


def transposable(op) -> bool:
    """Whether conv_transposed may choose the transposed form for some vector width: an
    f32 GEMM conv of static shapes, one group, with a constant weight."""
    if op.name != "cuvil.conv2d" or len(op.operands) < 2:
        return False
    x, w, out = op.operands[0].type, op.operands[1].type, op.result.type
    d = op.operands[1].defining_op
    if d is None or d.name != "cuvil.constant" or not (x.dtype == w.dtype == out.dtype == "f32"):
        return False
    if not all(isinstance(v, int) for v in (*x.shape, *w.shape, *out.shape)) or op.attrs["groups"] != 1:
        return False
    return conv_geometry(x, w, out, op.attrs)[1]


# -- per-target choices ------------------------------------------------------------------------------
def conv_transposed(op, vw: int) -> bool:
    """Whether a conv runs transposed, C^T[P, OC] = im2col^T @ W^T with W^T packed in
    panels at compile time (gemm.pack_b): for f32 GEMM convs with a constant weight whose
    output planes (P = OH*OW values) would fill the target's column panels poorly (P = 49
    uses 49 of 64 lanes in 16-wide panels), the output channels take the vector lanes
    instead."""
    return transposable(op) and thin_panels(op.result.type, vw)


def conv_winograd(op, vw: int) -> bool:
    """Whether an f32 conv with a constant weight runs k_conv2d_winograd (its weight
    stored transformed, winograd_weights): 3x3, stride and dilation 1, one group, at
    least WINO_MIN_CHANNELS channels in and out and WINO_MIN_TILES output tiles, and
    256- or 512-bit vectors (x86: the transforms use masked loads and stores)."""
    return transposable(op) and winograd_shape(op.operands[0].type, op.operands[1].type, op.result.type,
                                                 op.attrs, vw)


def residual_in_place(op, vw: int) -> bool:
    """Whether op's kernel on a target of vw f32 lanes may write its result over an
    epilogue operand of the result's shape (a residual; it spares the result its own
    memory and the caches a stream of fresh lines): a column-panel GEMM conv, f32 or
    bf16, whose tiles apply the whole epilogue in registers to each vector before storing
    it, every panel whole (no ragged columns stored first and finished after), not
    transposed, Winograd or K-blocked."""
    if op.name != "cuvil.conv2d" or len(op.operands) < 3 or not op.attrs.get("post"):
        return False
    x, w, out = op.operands[0].type, op.operands[1].type, op.result.type
    if not all(isinstance(d, int) for d in (*x.shape, *w.shape, *out.shape)) or out.dtype != "f32":
        return False
    scheme = quantized_weight(op)
    if scheme not in (None, "bf16") or not conv_geometry(x, w, out, op.attrs)[1]:
        return False
    p, g = out.shape[2] * out.shape[3], op.attrs["groups"]
    if p % panel_width(vw) or blocked_gemm(out.shape[1] // g, p, vw):
        return False
    if scheme is None and (conv_transposed(op, vw) or conv_winograd(op, vw)):
        return False
    if scheme == "bf16" and bf16_transposed(x, w, out, op.attrs, vw, DotIsa(2, "dpbf16ps")):
        return False
    epi = op_epilogue(op)
    return epi is not None and epi.supports_cols and epi.apply is not None


def dot_isa(op, kt: KernelTarget) -> DotIsa:
    """The dot product of op's integer / bf16 GEMM."""
    aq = op.attrs.get("act_quant")
    return kt.bf16 if aq and aq["dtype"] == "bf16" else kt.int8


_QUANTIZED_CONV = {"int8_channel": "gemm_int8", "bf16": "gemm_bf16"}
_QUANTIZED_MATMUL = {"int8_channel": "packed_int8", "bf16": "packed_bf16"}


def conv_form(op, kt: KernelTarget) -> str:
    x, w, out = op.operands[0].type, op.operands[1].type, op.result.type
    scheme = quantized_weight(op)
    if scheme is not None:
        if scheme == "bf16" and dot_isa(op, kt).dot == "bf16":
            return "gemm_bf16_widened"
        if op.attrs.get("act_quant") and bf16_transposed(x, w, out, op.attrs, kt.lanes, dot_isa(op, kt)):
            return "transposed_bf16"
        return _QUANTIZED_CONV.get(scheme, "gemm_int4")
    _, gemm = conv_geometry(x, w, out, op.attrs)
    if not gemm or out.dtype != "f32":
        if depthwise(x, w, out, op.attrs):
            return "depthwise_masked" if kt.masked else "depthwise"
        return "direct"
    if conv_winograd(op, kt.lanes):
        return "winograd"
    if conv_transposed(op, kt.lanes):
        return "transposed"
    return "gemm"


def k_blocked(op, lanes: int) -> bool:
    """Whether a column-panel GEMM conv's schedule is K-blocked (gemm.blocked_gemm: narrow
    vectors, several panels, enough rows); the GEMM picks it from its own shapes (a fused
    1x1 conv's bands too), the plan shows it."""
    out = op.result.type
    if not all(isinstance(d, int) for d in out.shape):
        return False
    return blocked_gemm(out.shape[1] // op.attrs["groups"], out.shape[2] * out.shape[3], lanes)


def matmul_form(op, kt: KernelTarget) -> str:
    scheme = quantized_weight(op)
    if scheme is not None:
        if scheme == "bf16" and dot_isa(op, kt).dot == "bf16":
            return "packed_bf16_widened"
        return _QUANTIZED_MATMUL.get(scheme, "packed_int4")
    if packs_matmul_b(op):
        return "packed"
    return "gemm" if op.operands[1].type.rank == 2 else "batched"


def packs_matmul_b(op) -> bool:
    """A matmul whose B is a constant 2-D f32 matrix, stored packed in panels."""
    b_val = op.operands[1]
    d = b_val.defining_op
    return (d is not None and d.name == "cuvil.constant" and b_val.type.rank == 2
            and b_val.dtype == "f32" and op.result.dtype == "f32")


_WEIGHTS = {"packed": "panels", "transposed": "conv_panels", "winograd": "winograd"}


def op_plan(op, kt: KernelTarget) -> dict:
    """op's kernel plan on kt, before fusion and storage are decided."""
    plan = {"lanes": kt.lanes}
    if op.name == "cuvil.conv2d":
        plan["form"] = conv_form(op, kt)
        if plan["form"] == "gemm" and k_blocked(op, kt.lanes):
            plan["k_blocked"] = True
        if residual_in_place(op, kt.lanes):
            plan["in_place"] = True
        if pointwise_producer(op) is not None:
            plan["reads_producer"] = True
    elif op.name == "cuvil.matmul":
        plan["form"] = matmul_form(op, kt)
    else:
        plan["form"] = "default"
    if plan["form"] in _WEIGHTS:
        plan["weights"] = _WEIGHTS[plan["form"]]
    scratch = scratch_bytes(op)
    if scratch:
        plan["scratch"] = scratch
    return plan


def fuse_pointwise(ops, kt: KernelTarget) -> None:
    """Mark the 1x1 -> depthwise pairs that run as one kernel on kt (fuse_pw_dw)."""
    for op in ops:
        if op.name != "cuvil.conv2d":
            continue
        a = pointwise_producer(op)
        if a is None or not fusable(a, op, kt.lanes, "weights" in a.attrs["kernel_plan"], static_args(op, kt.lanes)):
            continue
        op.attrs["kernel_plan"]["form"] = "fused_depthwise"
        a.attrs["kernel_plan"]["band_form"] = a.attrs["kernel_plan"]["form"]
        a.attrs["kernel_plan"]["form"] = "in_depthwise"


def weight_layout(dq, kt: KernelTarget) -> str:
    """How a `cuvil.dequantize` op's quantized weight is stored for the kernels that read
    it (kernels.quantized.quantized_blob)."""
    users = dq.result.uses
    for u in users:
        i = u.operands.index(dq.result)
        if u.name not in CONSUMERS or i != 1 or CONSUMERS[u.name] != dq.attrs["out_axis"] \
                or u.result.dtype != "f32" or u.operands[0].dtype != "f32":
            raise BackendError(f"a quantized weight used by {u.name} (operand {i}) has no kernel"
                               + (f" ({u.loc})" if u.loc else ""))
        aq = u.attrs.get("act_quant")
        if (dq.attrs["scheme"] in ACT_SCHEMES) != bool(aq) or \
                (dq.attrs["scheme"] == "bf16") != (bool(aq) and aq["dtype"] == "bf16"):
            raise BackendError(f"{u.name}: int8 weights need an int8 act_quant, bf16 ones a bf16 one, "
                               f"int4 ones none" + (f" ({u.loc})" if u.loc else ""))
        if u.name == "cuvil.conv2d" and not conv_geometry(u.operands[0].type, u.operands[1].type,
                                                          u.result.type, u.attrs)[1]:
            raise BackendError(f"a quantized conv2d weight of shape {list(u.operands[1].shape)} needs a GEMM-shaped "
                               "conv" + (f" ({u.loc})" if u.loc else ""))
    matmuls = all(u.name == "cuvil.matmul" for u in users) and bool(users)
    scheme = dq.attrs["scheme"]
    if scheme == "int8_channel":
        return "int8_panels" if matmuls else "int8_rows"
    if scheme != "bf16":
        return "int4_panels" if matmuls else "int4_rows"
    if kt.bf16.dot == "bf16":
        return "bf16_panels_widened" if matmuls else "bf16_rows_widened"
    transposed = [u.name == "cuvil.matmul" or u.attrs["kernel_plan"]["form"] == "transposed_bf16" for u in users]
    pairs = {u.name == "cuvil.conv2d" and pair_planes(u.operands[0].type, u.operands[1].type, u.result.type,
                                                       u.attrs, kt.bf16, kt.lanes) for u in users}
    if len(pairs) > 1:
        raise BackendError("a bf16 conv weight shared by convs with and without a padded input copy (a dilated "
                           "one) has no kernel")
    if any(transposed) and not all(transposed):
        raise BackendError("a bf16 weight shared by a transposed conv (or a matmul) and a plain conv (a "
                           "grouped one, or one of another output size) has no kernel")
    return ("bf16_panels" if all(transposed) else "bf16_rows") + ("_pair_order" if pairs == {True} else "")


@dataclass(frozen=True)
class SelectKernels:
    """Record every op's kernel plan for `target` (a KernelTarget) in its attributes, and
    the target in the function's (`kernel_target`). Without a target it does nothing."""
    name = "select-kernels"
    target: KernelTarget | None = None

    def apply(self, module) -> None:
        if self.target is None:  # no target: nothing to select (the module can be interpreted)
            return
        for fn in module.all_functions():
            self.target.record(fn)
            ops = fn.body.ops
            for op in ops:
                op.attrs.pop("kernel_plan", None)
                if op.name not in ("cuvil.constant", "cuvil.dequantize", "cuvil.return"):
                    op.attrs["kernel_plan"] = op_plan(op, self.target)
            fuse_pointwise(ops, self.target)
            for op in ops:
                if op.name == "cuvil.dequantize":
                    op.attrs["kernel_plan"] = {"layout": weight_layout(op, self.target), "lanes": self.target.lanes}


@dataclass(frozen=True)
class SelectStorage:
    """Record which results are stored as bf16 plane pairs (kernels.bf16.stored_pairs),
    once the memory plan has placed every value: `out_pairs` on the producer, `in_pairs`
    on a conv reading them as its input, `pairs_extras` (operand indices) on one reading
    them in its epilogue."""
    name = "select-storage"
    target: KernelTarget | None = None

    def apply(self, module) -> None:
        if self.target is None:
            return
        for fn in module.all_functions():
            ops = fn.body.ops
            fused = {id(op) for op in ops if plan_of(op).get("form") in ("fused_depthwise", "in_depthwise")}
            pairs = stored_pairs(ops, {id(v) for v in fn.outputs}, self.target.bf16, self.target.lanes, fused)
            for op in ops:
                plan = op.attrs.get("kernel_plan")
                if plan is None:
                    continue
                for key in ("out_pairs", "in_pairs", "pairs_extras"):
                    plan.pop(key, None)
                if id(op) in pairs:
                    plan["out_pairs"] = True
                paired = [i for i, v in enumerate(op.operands)
                          if v.defining_op is not None and id(v.defining_op) in pairs]
                if 0 in paired:
                    plan["in_pairs"] = True
                if any(i >= 2 for i in paired):
                    plan["pairs_extras"] = [i for i in paired if i >= 2]


def plan_of(op) -> dict:
    """op's kernel plan (empty for ops that have none)."""
    return op.attrs.get("kernel_plan") or {}


def kernel_passes(target: KernelTarget) -> dict:
    """The pipeline options of the two selection passes for target (passes/pipeline.py)."""
    return {"select_kernels": {"target": target}, "select_storage": {"target": target}}
