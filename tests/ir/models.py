"""Models the IR tests capture once per session: ResNet-18 at 64x64, the BERT encoder
and the test zoo, each with seeded weights and inputs."""
from __future__ import annotations

from functools import lru_cache

import torch

import cuvil.ir as cir
from cuvil.frontends.torch import capture_torch
from examples.models import bert, randomize_norm_stats_, resnet
from tests.models_zoo import ZOO


def _resnet18(seed: int = 0):
    torch.manual_seed(seed)
    return randomize_norm_stats_(resnet.resnet18(), seed).eval(), resnet.example_inputs(seed, size=64)


def _bert(seed: int = 0):
    torch.manual_seed(seed)
    return bert.bert_encoder().eval(), bert.example_inputs(seed, batch=2, seq=32)


BUILDERS = {"resnet18": _resnet18, "bert": _bert, **ZOO}
NAMES = sorted(BUILDERS)


@lru_cache(maxsize=None)
def captured(name: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], cir.Module]:
    """(model, example inputs, captured IR); shared by every test, so never mutate it."""
    model, inputs = BUILDERS[name]()
    return model, inputs, capture_torch(model, inputs)
