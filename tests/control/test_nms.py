"""Non-maximum suppression in the graph: torch.ops.cuvil.nms / batched_nms (cuvil/vision.py)
and ONNX NonMaxSuppression, lowered to cuvil.nms (a data-dependent size).

The expected results come from NumPy references written here: torchvision's CPU kernel
(a float32 IoU compared in double, boxes in decreasing score, ties by index) and its
per-class form (`_batched_nms_vanilla`: NMS within each class, merged by score), and
ONNX Runtime for NonMaxSuppression. Results are indices and copies of boxes, so every
comparison is exact, shapes included."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import cuvil
import cuvil.ir as cir
import cuvil.vision as vision
from cuvil.errors import ParseError, VerifyError
from cuvil.frontends.onnx import capture_onnx
from cuvil.frontends.torch import capture_torch
from tests.ops.checks import Fn
from tests.targets.helpers import ALL, build_project, run


# -- the NumPy references ---------------------------------------------------------------------
def ref_nms(boxes: np.ndarray, scores: np.ndarray, iou_threshold: float) -> np.ndarray:
    """torchvision's nms_kernel_impl (CPU), line by line."""
    boxes = boxes.astype(np.float32)
    x1, y1, x2, y2 = boxes[:, 0], boxes[:, 1], boxes[:, 2], boxes[:, 3]
    areas = (x2 - x1) * (y2 - y1)
    order = np.argsort(-scores, kind="stable")
    suppressed = np.zeros(len(scores), bool)
    keep = []
    zero = np.float32(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        for at, i in enumerate(order):
            if suppressed[i]:
                continue
            keep.append(i)
            for j in order[at + 1:]:
                if suppressed[j]:
                    continue
                xx1, yy1 = max(x1[i], x1[j]), max(y1[i], y1[j])
                xx2, yy2 = min(x2[i], x2[j]), min(y2[i], y2[j])
                inter = max(zero, xx2 - xx1) * max(zero, yy2 - yy1)
                ovr = inter / (areas[i] + areas[j] - inter)
                if float(ovr) > iou_threshold:  # torchvision compares in double
                    suppressed[j] = True
    return np.asarray(keep, np.int64)


def ref_batched_nms(boxes, scores, idxs, iou_threshold) -> np.ndarray:
    """NMS within each class, the kept indices in decreasing score (ties by index)."""
    kept = np.zeros(len(scores), bool)
    for c in np.unique(idxs):
        members = np.flatnonzero(idxs == c)
        kept[members[ref_nms(boxes[members], scores[members], iou_threshold)]] = True
    keep = np.flatnonzero(kept)
    return keep[np.argsort(-scores[keep], kind="stable")].astype(np.int64)


# -- box sets ---------------------------------------------------------------------------------
def box_set(seed: int, n: int, kind: str = "random"):
    """(boxes [n, 4] f32, scores [n] f32, classes [n] i64) of one kind: overlapping
    random boxes; integer corners and few score values (exact IoUs at thresholds, tied
    scores); copies of a few boxes (all but one suppressed per copy set); one box n
    times (all but one suppressed); far apart
    (none suppressed); with zero-area boxes."""
    rng = np.random.default_rng(seed)
    if kind == "far":
        xy = np.stack([np.arange(n) * 40.0, rng.uniform(0, 5, n)], 1)
        wh = rng.uniform(1, 30, (n, 2))
    else:
        xy = rng.uniform(0, 40, (n, 2))
        wh = rng.uniform(2, 30, (n, 2))
    if kind == "grid":
        xy, wh = np.round(xy / 4) * 4, np.round(wh / 4) * 4 + 4
    boxes = np.concatenate([xy, xy + wh], 1).astype(np.float32)
    scores = rng.random(n).astype(np.float32)
    if kind in ("grid", "ties"):
        scores = (rng.integers(0, 4, n) / 4).astype(np.float32)
    if kind == "copies":
        boxes = boxes[rng.integers(0, min(3, n), n)]
    if kind == "same":
        boxes = np.repeat(boxes[:1], n, 0)
    if kind == "degenerate":
        flat = rng.random(n) < 0.4
        boxes[flat, 2] = boxes[flat, 0]
    classes = rng.integers(0, 3, n).astype(np.int64)
    return boxes, scores, classes


KINDS = ["random", "grid", "ties", "copies", "far", "degenerate", "same"]
CASES = [box_set(seed, n, kind) for seed, (n, kind) in enumerate(
    [(n, kind) for kind in KINDS for n in (1, 7, 24, 40)])]


def check(fn, reference, cases):
    """Compile once at the first case; on every case the model in torch, the
    interpreter and the native code give the reference's arrays exactly."""
    model = Fn(fn).eval()
    module = capture_torch(model, [torch.from_numpy(x) for x in cases[0]])
    text = cir.print_module(module)
    assert cir.print_module(cir.parse_module(text, module.weights())) == text
    assert [op.name for op in module.main.body.ops].count("cuvil.nms") >= 1
    compiled = cuvil.compile(model, [torch.from_numpy(x) for x in cases[0]])
    for inputs in cases:
        want = reference(*inputs)
        with torch.no_grad():
            eager = model(*[torch.from_numpy(x) for x in inputs])
        eager = [eager] if isinstance(eager, torch.Tensor) else list(eager)
        for label, got in (("torch", [t.numpy() for t in eager]), ("interpreter", cir.run(module, list(inputs))),
                           ("native", compiled(*inputs))):
            got = [got] if isinstance(got, np.ndarray) else list(got)
            assert len(got) == len(want), label
            for g, w in zip(got, want):
                assert np.asarray(g).dtype == w.dtype and np.shape(g) == w.shape, (label, np.shape(g), w.shape)
                np.testing.assert_array_equal(g, w, err_msg=label)
    return module


# -- PyTorch ----------------------------------------------------------------------------------
@pytest.mark.parametrize("iou", [0.0, 0.3, 0.5, 0.7, 1.0])
def test_nms_matches_torchvision_semantics(iou):
    """The same boxes at each threshold: 0 suppresses every overlapping box (and keeps
    disjoint ones), 1 none; boxes sized 1 to 40, with ties, copies and zero areas."""
    cases = [(b, s) for b, s, _ in CASES if len(s) == 24] + [(b[:24], s[:24]) for b, s, _ in CASES if len(s) == 40]
    check(lambda b, s: vision.nms(b, s, iou), lambda b, s: [ref_nms(b, s, iou)], cases)


def test_nms_every_set_size_from_all_kept_to_one():
    """One model per box count; far-apart boxes all stay, one box n times keeps one."""
    for n in (1, 7, 40):
        cases = [(b, s) for b, s, _ in CASES if len(s) == n]
        check(lambda b, s: torch.ops.cuvil.nms(b, s, 0.45), lambda b, s: [ref_nms(b, s, 0.45)], cases)
        counts = {kind: len(ref_nms(b, s, 0.45)) for kind, (b, s) in zip(KINDS, cases)}
        assert counts["far"] == n and counts["same"] == 1 and (n < 40 or 1 < counts["random"] < n)


def test_iou_equal_to_the_threshold_is_kept():
    """IoU exactly 0.5 (1/2 in float32) is not > 0.5; at 0.49 the box goes."""
    boxes = np.array([[0, 0, 2, 1], [0, 0, 1, 1], [5, 5, 9, 9], [5, 5, 9, 7]], np.float32)
    scores = np.array([0.9, 0.8, 0.7, 0.7], np.float32)
    for iou, want in ((0.5, [0, 1, 2, 3]), (0.49, [0, 2])):
        assert list(ref_nms(boxes, scores, iou)) == want
        check(lambda b, s: vision.nms(b, s, iou), lambda b, s: [ref_nms(b, s, iou)], [(boxes, scores)])


def test_batched_nms_suppresses_within_each_class_only():
    cases = [x for x in CASES if len(x[1]) == 40]
    cases.append((np.tile(cases[0][0][:1], (40, 1)), cases[0][1], np.arange(40) % 2))  # one box, two classes
    module = check(lambda b, s, c: vision.batched_nms(b, s, c, 0.5), lambda b, s, c: [ref_batched_nms(b, s, c, 0.5)],
                   cases)
    (op,) = [op for op in module.main.body.ops if op.name == "cuvil.nms"]
    assert len(op.operands) == 3
    s = cases[-1][1]
    assert sorted(ref_batched_nms(*cases[-1], 0.5)) == [int(np.argmax(s[0::2])) * 2, int(np.argmax(s[1::2])) * 2 + 1]


def test_score_filter_then_nms_including_nothing_left():
    """Boxes over a score threshold (a produced size) into NMS, the kept boxes gathered
    back: the sizes after it follow the run, down to no box at all."""
    def fn(b, s):
        m = s > 0.6
        keep = vision.nms(b[m], s[m], 0.4)
        return torch.nonzero(m)[:, 0][keep], b[m][keep]

    def reference(b, s):
        idx = np.flatnonzero(s > 0.6)
        keep = ref_nms(b[idx], s[idx], 0.4)
        return [idx[keep].astype(np.int64), b[idx][keep]]
    cases = [(b, s) for b, s, _ in CASES if len(s) == 40]
    cases.append((cases[0][0], cases[0][1] * np.float32(0.5)))  # every score under the threshold
    assert any(len(reference(*c)[0]) == 0 for c in cases) and all(len(reference(*c)[0]) for c in cases[:-1])
    check(fn, reference, cases)


def test_nms_text_form_and_verifier():
    text = '''\
func @main(%0: tensor<[5, 4], f32> "boxes", %1: tensor<[5], f32> "scores", %2: tensor<[5], i64> "idxs") -> ("keep") attributes {dim_bounds = {nms = [0, 5]}} {
  %3 = cuvil.nms(%0, %1, %2) {by_class = true, iou_threshold = 0.5, max_per_class = 1, score_threshold = 0.25, size = "nms"} : tensor<[nms], i64>
  cuvil.return(%3)
}
'''
    module = cir.parse_module(text, {})
    assert cir.print_module(module) == text
    boxes = np.array([[0, 0, 4, 4], [0, 0, 4, 4], [1, 1, 5, 5], [10, 10, 12, 12], [0, 0, 4, 4]], np.float32)
    scores = np.array([0.3, 0.9, 0.8, 0.2, 0.5], np.float32)
    idxs = np.array([1, 0, 0, 1, 1], np.int64)
    # class 0 first: box 1 (0.9), box 2 over the limit; class 1: box 4 (0.5), box 0 over the
    # limit, box 3 under the score threshold
    want = np.array([1, 4], np.int64)
    np.testing.assert_array_equal(cir.run(module, [boxes, scores, idxs])[0], want)
    np.testing.assert_array_equal(cuvil.compile(module)(boxes, scores, idxs)[0], want)
    for bad, message in (("{iou_threshold = 0.5}", "size"), ('{size = "nms"}', "iou_threshold"),
                         ('{iou_threshold = 0.5, max_per_class = -1, size = "nms"}', "max_per_class")):
        edited = text.replace(text[text.index("{by_class"):text.index("} : tensor<[nms]") + 1], bad)
        assert edited != text
        with pytest.raises((VerifyError, ParseError), match=message):
            cir.verify(cir.parse_module(edited, {}))


NMS_PY = '''\
import torch

import cuvil.vision


class Detect(torch.nn.Module):
    def forward(self, boxes, scores, classes):
        keep = cuvil.vision.batched_nms(boxes, scores, classes, 0.5)
        return keep, boxes[keep]


def cuvil_entry():
    return Detect().eval(), (torch.zeros(24, 4), torch.rand(24), torch.zeros(24, dtype=torch.int64))
'''
NMS_YAML = '''\
model:
  framework: pytorch
  name: detect
  source: model.py
  entry: cuvil_entry
inputs:
  - {name: boxes, shape: [24, 4], dtype: f32}
  - {name: scores, shape: [24], dtype: f32}
  - {name: classes, shape: [24], dtype: i64}
outputs:
  - name: keep
  - name: kept_boxes
'''


@pytest.mark.parametrize("target", ALL)
def test_batched_nms_executable_writes_the_produced_size(target, tmp_path):
    exe = build_project(tmp_path, NMS_PY, NMS_YAML, target, "detect")
    sizes = []
    for k, (boxes, scores, classes) in enumerate(x for x in CASES if len(x[1]) == 24):
        names = []
        for name, x in (("b", boxes), ("s", scores), ("c", classes)):
            np.save(tmp_path / f"{name}{k}.npy", x)
            names += ["--input", tmp_path / f"{name}{k}.npy"]
        run(exe, *names, "--output", tmp_path / f"y{k}.json")
        want = ref_batched_nms(boxes, scores, classes, 0.5)
        sizes.append(len(want))
        keep, kept = json.loads((tmp_path / f"y{k}.json").read_text())["outputs"]
        assert keep["shape"] == [len(want)] and kept["shape"] == [len(want), 4]
        np.testing.assert_array_equal(np.asarray(keep["data"], np.int64), want)
        np.testing.assert_array_equal(np.asarray(kept["data"], np.float32).reshape(-1, 4), boxes[want])
    assert len(set(sizes)) > 2


# -- ONNX -------------------------------------------------------------------------------------
def nms_model(batches, classes, n, center, max_out, iou, score):
    from onnx import TensorProto, helper, numpy_helper
    inits = [numpy_helper.from_array(np.array([max_out], np.int64), "max_out"),
             numpy_helper.from_array(np.array([iou], np.float32), "iou")]
    ins = ["boxes", "scores", "max_out", "iou"]
    if score is not None:
        inits.append(numpy_helper.from_array(np.array([score], np.float32), "score"))
        ins.append("score")
    node = helper.make_node("NonMaxSuppression", ins, ["selected"], center_point_box=int(center))
    g = helper.make_graph([node], "nms", [
        helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [batches, n, 4]),
        helper.make_tensor_value_info("scores", TensorProto.FLOAT, [batches, classes, n])],
        [helper.make_tensor_value_info("selected", TensorProto.INT64, ["num", 3])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("center, max_out, iou, score", [
    (False, 100, 0.5, None), (False, 3, 0.3, 0.4), (True, 100, 0.6, 0.2), (True, 2, 0.0, None),
    (False, 100, -0.5, 0.5)], ids=["corners", "limit-and-score", "centers", "centers-limit", "negative-iou"])
def test_onnx_non_max_suppression_matches_onnxruntime(center, max_out, iou, score):
    ort = pytest.importorskip("onnxruntime")
    batches, classes, n = 2, 3, 16
    m = nms_model(batches, classes, n, center, max_out, iou, score)
    # ONNX Runtime refuses an iou_threshold < 0; the ONNX reference implementation (a
    # pair without overlap is never suppressed) acts as at 0, which it is checked against
    ref = nms_model(batches, classes, n, center, max_out, max(iou, 0.0), score)
    sess = ort.InferenceSession(ref.SerializeToString(), providers=["CPUExecutionProvider"])
    cases = []
    for seed in range(6):
        rng = np.random.default_rng(100 + seed)
        boxes = np.stack([box_set(seed * 7 + b, n, KINDS[(seed + b) % len(KINDS)])[0] for b in range(batches)])
        if center:  # (x, y, w, h)
            boxes = np.concatenate([(boxes[..., :2] + boxes[..., 2:]) / 2, boxes[..., 2:] - boxes[..., :2]], -1)
        else:  # [y1, x1, y2, x2] with any diagonal pair of corners
            boxes = boxes[..., [1, 0, 3, 2]]
            flip = rng.random((batches, n)) < 0.5
            boxes[flip] = boxes[flip][:, [2, 3, 0, 1]]
        scores = rng.random((batches, classes, n)).astype(np.float32)
        if seed % 2:
            scores = np.round(scores * 3) / 3  # ties
        cases.append((boxes.astype(np.float32), scores.astype(np.float32)))
    cases.append((cases[0][0], np.zeros_like(cases[0][1])))  # under any positive score threshold
    compiled = cuvil.compile(m, cases[0])
    module = capture_onnx(m, cases[0])
    sizes = []
    for inputs in cases:
        (want,) = sess.run(None, {"boxes": inputs[0], "scores": inputs[1]})
        if iou < 0:
            from onnx.reference import ReferenceEvaluator
            (spec,) = ReferenceEvaluator(m).run(None, {"boxes": inputs[0], "scores": inputs[1]})
            np.testing.assert_array_equal(spec, want)
        sizes.append(len(want))
        for label, got in (("native", compiled(*inputs)), ("interpreter", cir.run(module, list(inputs)))):
            got = got[0] if isinstance(got, (list, tuple)) else got
            assert got.dtype == want.dtype and got.shape == want.shape, (label, got.shape, want.shape)
            np.testing.assert_array_equal(got, want, err_msg=label)
    if max_out < n:  # the limit binds
        assert max(sizes) == batches * classes * max_out
    else:
        assert len(set(sizes)) > 2
