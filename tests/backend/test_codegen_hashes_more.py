"""The pinned generated code of the other benchmark models (test_codegen_hashes.py)."""
from __future__ import annotations

import pytest

from tests.backend.test_codegen_hashes import HERE, MODELS, check_model

OTHERS = tuple(m for m in MODELS if m not in HERE)


@pytest.mark.parametrize("model_key", OTHERS)
def test_generated_code_is_unchanged(model_key, tmp_path):
    check_model(model_key, tmp_path)


def test_every_model_is_checked():
    assert set(HERE) | set(OTHERS) == set(MODELS) and len(OTHERS) == 2
