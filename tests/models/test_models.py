"""Whole models through `cuvil.compile` (native code) against torch eager.

Tolerance (the issue's bar): max |cuvil - torch| <= 1e-4 * max |torch|, fp32.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import cuvil
from examples.models import bert, mlp, mobilenet_v2, randomize_norm_stats_, resnet
from tests.models_zoo import ZOO

REL_TOL = 1e-4


def _compare(model, inputs, rel_tol=REL_TOL):
    model = model.eval()
    compiled = cuvil.compile(model, inputs)
    with torch.no_grad():
        ref = model(*inputs)
    refs = ref if isinstance(ref, (tuple, list)) else (ref,)
    got = compiled(*[x.numpy() for x in inputs])
    assert len(got) == len(refs)
    for g, r in zip(got, refs):
        r = r.numpy()
        assert g.shape == r.shape and g.dtype == r.dtype
        scale = float(np.abs(r).max())
        err = float(np.abs(g - r).max())
        assert scale > 0, "reference output is all zeros: the test would prove nothing"
        assert err <= rel_tol * scale, f"max abs error {err:.3g} > {rel_tol:g} * {scale:.3g}"
    return compiled, got


def test_resnet50_random_weights_seed0():
    torch.manual_seed(0)
    model = randomize_norm_stats_(resnet.resnet50(), 0)
    compiled, _ = _compare(model, resnet.example_inputs(seed=0))
    assert compiled.arena_size > 0


def test_mobilenet_v2_random_weights():
    torch.manual_seed(0)
    model = randomize_norm_stats_(mobilenet_v2.mobilenet_v2(), 0)
    _compare(model, mobilenet_v2.example_inputs(seed=0))


def test_mobilenet_v2_pretrained_on_a_real_photo():
    skimage = pytest.importorskip("skimage", reason="scikit-image ships the cat photo")
    from skimage.transform import resize
    img = skimage.data.chelsea().astype(np.float32) / 255.0  # 300x451 RGB
    img = resize(img, (224, 224), anti_aliasing=True).astype(np.float32)
    mean, std = np.array([0.485, 0.456, 0.406], np.float32), np.array([0.229, 0.224, 0.225], np.float32)
    x = torch.from_numpy(((img - mean) / std).transpose(2, 0, 1)[None].copy())
    model = mobilenet_v2.pretrained_mobilenet_v2()
    _, (logits,) = _compare(model, (x,))
    with torch.no_grad():
        ref = model(x).numpy()
    assert list(np.argsort(-logits[0])[:5]) == list(np.argsort(-ref[0])[:5])
    assert int(np.argmax(logits)) in (281, 282, 285)  # tabby, tiger cat, Egyptian cat


@pytest.mark.parametrize("batch", [1, 2])
def test_small_bert_encoder(batch):
    torch.manual_seed(0)
    model = bert.BertEncoder(bert.BertConfig(hidden=256, layers=4, heads=4, intermediate=1024))
    _compare(model, bert.example_inputs(seed=0, batch=batch, seq=64))


@pytest.mark.parametrize("batch", [1, 4])
def test_mlp(batch):
    torch.manual_seed(0)
    _compare(mlp.mlp(), mlp.example_inputs(seed=0, batch=batch))


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", sorted(ZOO))
def test_unseen_family_models(name, seed):
    model, inputs = ZOO[name](seed)
    _compare(model, inputs)


def test_wrong_input_shape_is_a_clear_error():
    torch.manual_seed(0)
    compiled = cuvil.compile(mlp.mlp().eval(), mlp.example_inputs())
    with pytest.raises(cuvil.CuvilError, match=r"expected shape \[1, 784\]"):
        compiled(np.zeros((2, 784), np.float32))
    with pytest.raises(cuvil.CuvilError, match="takes 1 inputs"):
        compiled()


@pytest.mark.parametrize("name", ["se_cnn", "vit"])
def test_jit_path_matches_the_linked_library_bit_for_bit(name):
    model, inputs = ZOO[name](0)
    linked = cuvil.compile(model, inputs)
    jitted = cuvil.compile(model, inputs, jit=True)
    xs = [x.numpy() for x in inputs]
    for a, b in zip(linked(*xs), jitted(*xs)):
        np.testing.assert_array_equal(a, b)


def test_unfused_pipeline_lowers_every_bare_op():
    """With the fusion passes off, bare elementwise ops reach the backend and still match."""
    from cuvil.backend.llvm.codegen import generate
    from cuvil.backend.llvm.jit import JitEngine
    from cuvil.api import _JitModel, _to_ir
    from cuvil.backend.llvm.select import KernelTarget, kernel_passes
    from cuvil.backend.llvm.target import host_target
    from cuvil.passes.pipeline import default_pipeline, run_pipeline
    model, inputs = ZOO["se_cnn"](0)
    module = _to_ir(model, inputs)
    run_pipeline(module, default_pipeline(fuse_epilogues=False, fuse_elementwise=False,
                                          **kernel_passes(KernelTarget.of(host_target()))))
    names = {op.name for op in module.main.body.ops}
    assert "cuvil.fused" not in names and {"cuvil.add", "cuvil.sigmoid"} & names
    gen = generate(module)
    got = _JitModel(JitEngine(gen), gen, module)(*[x.numpy() for x in inputs])[0]
    with torch.no_grad():
        ref = model(*inputs).numpy()
    assert np.abs(got - ref).max() <= REL_TOL * np.abs(ref).max()


def test_threads_give_the_same_numbers():
    torch.manual_seed(0)
    model = randomize_norm_stats_(mobilenet_v2.mobilenet_v2(), 0).eval()
    (x,) = mobilenet_v2.example_inputs(seed=1, size=96)
    compiled = cuvil.compile(model, (x,), threads=2)
    assert compiled.threads == 2
    two = compiled(x.numpy())[0]
    compiled.set_threads(1)
    one = compiled(x.numpy())[0]
    with torch.no_grad():
        ref = model(x).numpy()
    np.testing.assert_array_equal(one, two)  # work is split by rows: each value is computed alike
    assert np.abs(two - ref).max() <= REL_TOL * np.abs(ref).max()
    with pytest.raises(cuvil.CuvilError, match="positive integer"):
        compiled.set_threads(0)
