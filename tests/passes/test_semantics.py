"""Every pass, applied alone to a captured model, keeps the IR valid and its meaning:
the interpreter gives the same outputs before and after on random inputs."""
from __future__ import annotations

import pytest

from cuvil.ir import run, verify
from cuvil.passes import check_plan, default_pipeline
from tests.passes.helpers import MODELS, assert_close, captured, random_inputs, reference, run_in_arena

PASSES = {p.name: p for p in default_pipeline()}


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("pass_name", list(PASSES))
def test_pass_alone_keeps_meaning(pass_name, model):
    module = captured(model)
    PASSES[pass_name].apply(module)
    verify(module)
    if pass_name == "memory-plan":  # the arena run is what the plan means
        check_plan(module.main)
        assert_close(run_in_arena(module, random_inputs(model, 0)), reference(model, 0), f"{model} in its arena")
    else:
        assert_close(run(module, random_inputs(model, 0)), reference(model, 0), f"{model} after {pass_name}")
