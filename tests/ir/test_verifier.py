"""The verifier rejects bad IR with VerifyError naming the function and the op."""
from __future__ import annotations

import numpy as np
import pytest

import cuvil.ir as cir
from cuvil.errors import VerifyError
from cuvil.ir import OP_REGISTRY, Function, Module, TensorType
from cuvil.ir.builder import Builder

T23 = TensorType((2, 3))


def make(body, input_types=(T23, T23), outputs=1) -> Module:
    """main(x, y) whose body `body(builder, x, y)` returns the values to return."""
    fn = Function("main", [f"in{i}" for i in range(len(input_types))], list(input_types),
                  [f"out{i}" for i in range(outputs)])
    b = Builder(fn.body)
    outs = body(b, *fn.args)
    b.op_multi("cuvil.return", *(outs if isinstance(outs, list) else [outs]))
    m = Module()
    m.add(fn)
    return m


def raw(b, name, operands, result_types, **attrs):
    """An op built with explicit result types, so its constructor does not check it."""
    return b.insert(OP_REGISTRY[name](list(operands), attrs, list(result_types))).results[0]


def test_valid_module_verifies():
    cir.verify(make(lambda b, x, y: b.op("cuvil.relu", b.op("cuvil.add", x, y))))


@pytest.mark.parametrize("body, message", [
    (lambda b, x, y: raw(b, "cuvil.add", [x], [T23]), "takes 2 operands, got 1"),
    (lambda b, x, y: raw(b, "cuvil.relu", [x, y], [T23]), "takes 1 operands, got 2"),
    (lambda b, x, y: raw(b, "cuvil.add", [x, raw(b, "cuvil.reshape", [y], [TensorType((3, 2))], shape=[3, 2])],
                         [T23]), "do not broadcast"),
    (lambda b, x, y: raw(b, "cuvil.add", [x, y], [TensorType((3, 2))]), "do not match inferred"),
    (lambda b, x, y: raw(b, "cuvil.add", [x, y], [TensorType((2, 3), "f64")]), "do not match inferred"),
    (lambda b, x, y: raw(b, "cuvil.add", [x, raw(b, "cuvil.cast", [y], [TensorType((2, 3), "i64")], dtype="i64")],
                         [T23]), "dtypes differ"),
    (lambda b, x, y: raw(b, "cuvil.matmul", [x, y], [TensorType((2, 3))]), "contraction"),
    (lambda b, x, y: raw(b, "cuvil.transpose", [x], [T23]), "perm"),                 # missing attribute
    (lambda b, x, y: raw(b, "cuvil.transpose", [x], [T23], perm=[0, 0]), "not a permutation"),
    (lambda b, x, y: raw(b, "cuvil.reshape", [x], [TensorType((7,))], shape=[7]), "has 6 elements"),
    (lambda b, x, y: raw(b, "cuvil.reduce_sum", [x], [TensorType((2,))], axes=[1, 1], keepdims=False), "axes"),
    (lambda b, x, y: raw(b, "cuvil.slice", [x], [TensorType((2, 2))], starts=[0, 2], ends=[2, 4], steps=[1, 1]),
     "bad range"),
    (lambda b, x, y: raw(b, "cuvil.where", [x, x, y], [T23]), "condition must be bool"),
    (lambda b, x, y: raw(b, "cuvil.gather", [x, y], [TensorType((2, 2, 3))], axis=0), "integer indices"),
    (lambda b, x, y: raw(b, "cuvil.concat", [x, raw(b, "cuvil.reshape", [y], [TensorType((3, 2))], shape=[3, 2])],
                         [TensorType((5, 3))], axis=0), "does not match"),
    (lambda b, x, y: raw(b, "cuvil.fused", [x, y], [T23], program=[["add", [0, 5], {}]]), "out of range"),
    (lambda b, x, y: raw(b, "cuvil.fused", [x, y], [T23], program=[["matmul", [0, 1], {}]]), "not an elementwise"),
    (lambda b, x, y: raw(b, "cuvil.softmax", [x], [T23], axis=2), "out of range"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_bad_op_is_rejected(body, message):
    with pytest.raises(VerifyError, match=message) as info:
        cir.verify(make(body))
    assert "function main, op" in str(info.value)


def test_conv_groups_must_divide_channels():
    x, w = TensorType((1, 4, 5, 5)), TensorType((6, 2, 3, 3))
    ok = dict(stride=[1, 1], dilation=[1, 1], pads=[0, 0, 0, 0])
    cir.verify(make(lambda b, x, w: b.op("cuvil.conv2d", x, w, groups=2, **ok), [x, w]))
    with pytest.raises(VerifyError, match="groups=3"):
        cir.verify(make(lambda b, x, w: raw(b, "cuvil.conv2d", [x, w], [TensorType((1, 6, 3, 3))], groups=3, **ok),
                        [x, w]))


def test_use_before_def_is_rejected():
    m = make(lambda b, x, y: b.op("cuvil.neg", b.op("cuvil.relu", x)))
    ops = m.main.body.ops
    ops[0], ops[1] = ops[1], ops[0]  # neg now reads relu's result before relu runs
    with pytest.raises(VerifyError, match="op 0 .*used before it is defined"):
        cir.verify(m)


def test_value_from_another_function_is_rejected():
    other = make(lambda b, x, y: b.op("cuvil.relu", x))
    foreign = other.main.body.ops[0].result
    m = make(lambda b, x, y: b.op("cuvil.add", x, foreign))
    with pytest.raises(VerifyError, match="used before it is defined"):
        cir.verify(m)


def test_stale_use_list_is_rejected():
    m = make(lambda b, x, y: b.op("cuvil.add", x, y))
    add = m.main.body.ops[0]
    add.operands[1] = add.operands[0]  # bypasses set_operand: x.uses not updated for the new use
    add.operands[0].uses.remove(add)
    with pytest.raises(VerifyError, match="use list"):
        cir.verify(m)


def test_return_must_be_last():
    m = make(lambda b, x, y: x)
    Builder(m.main.body).op("cuvil.relu", m.main.args[0])  # appended after the return
    with pytest.raises(VerifyError, match="must be last"):
        cir.verify(m)


def test_missing_return_is_rejected():
    m = make(lambda b, x, y: b.op("cuvil.relu", x))
    m.main.body.ops.pop()
    with pytest.raises(VerifyError, match="no cuvil.return"):
        cir.verify(m)


def test_output_names_must_match_returned_values():
    with pytest.raises(VerifyError, match="returns 2 values but names 1"):
        cir.verify(make(lambda b, x, y: [x, y], outputs=1))


def test_module_needs_main():
    m = make(lambda b, x, y: x)
    m.functions["other"] = m.functions.pop("main")
    with pytest.raises(VerifyError, match="no main"):
        cir.verify(m)


def test_input_names_must_match_inputs():
    m = make(lambda b, x, y: x)
    m.main.input_names.pop()
    with pytest.raises(VerifyError, match="names"):
        cir.verify(m)


def test_constant_value_must_match_its_type():
    m = make(lambda b, x, y: b.op("cuvil.add", x, b.constant(np.ones(3, np.float32), "c")))
    cir.verify(m)
    m.main.body.ops[0].value = np.ones(4, np.float32)
    with pytest.raises(VerifyError, match="constant c"):
        cir.verify(m)


def test_parsed_text_with_wrong_operand_count_fails_verification():
    text = '''func @main(%0: tensor<[2, 3], f32> "x") -> ("output") {
  %1 = cuvil.add(%0) {} : tensor<[2, 3], f32> loc("m.py:7 in forward")
  cuvil.return(%1)
}
'''
    m = cir.parse_module(text)  # the parser builds what the text says ...
    with pytest.raises(VerifyError, match="m.py:7 in forward.*takes 2 operands"):
        cir.verify(m)  # ... and the verifier rejects it, naming the source line
