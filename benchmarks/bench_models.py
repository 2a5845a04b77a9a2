"""The models `compare.py` benchmarks, full size and `--quick` (tiny) size.

`build(key, quick)` returns a freshly built, seeded model in eval mode, its example
inputs (a tuple of torch tensors) and their names. Everything is seeded, so the parent
benchmark process and the fresh processes of the cold-start measurement build the same
weights. torch is imported lazily: `compare.py` reads the specs without it.
"""
from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

BERT_BASE = dict(vocab_size=30522, hidden=768, layers=12, heads=12, intermediate=3072, max_positions=512)
MINILM = dict(vocab_size=30522, hidden=384, layers=6, heads=12, intermediate=1536, max_positions=512)
BERT_QUICK = dict(vocab_size=100, hidden=64, layers=2, heads=4, intermediate=128, max_positions=32)
MINILM_QUICK = dict(vocab_size=100, hidden=32, layers=1, heads=2, intermediate=64, max_positions=32)


@dataclass(frozen=True)
class ModelSpec:
    key: str
    title: str
    source: str                     # examples/models/<source>.py defines the model
    full: dict = field(default_factory=dict)
    quick: dict = field(default_factory=dict)

    def describe(self, quick: bool) -> str:
        if not quick:
            return self.title
        return f"{self.title} [quick: {', '.join(f'{k}={v}' for k, v in self.quick.items())}]"

    def cache_key(self, quick: bool, *extra: str) -> str:
        """A short hash of what the exported model depends on: the model source, the
        sizes and `extra` (torch version, opset)."""
        h = hashlib.sha256()
        h.update((ROOT / "examples" / "models" / f"{self.source}.py").read_bytes())
        h.update(repr(sorted((self.quick if quick else self.full).items())).encode())
        for e in extra:
            h.update(e.encode())
        return h.hexdigest()[:12]


MODELS: dict[str, ModelSpec] = {
    "resnet50": ModelSpec("resnet50", "ResNet-50 224x224 b1", "resnet",
                          full=dict(layers=(3, 4, 6, 3), size=224, classes=1000),
                          quick=dict(layers=(1, 1, 1, 1), size=32, classes=10)),
    "mobilenetv2": ModelSpec("mobilenetv2", "MobileNetV2 224x224 b1", "mobilenet_v2",
                             full=dict(size=224, classes=1000, width=1.0),
                             quick=dict(size=32, classes=10, width=0.25)),
    "bert-base": ModelSpec("bert-base", "BERT-base seq 128 b1", "bert",
                           full=dict(seq=128, **BERT_BASE), quick=dict(seq=16, **BERT_QUICK)),
    "minilm": ModelSpec("minilm", "all-MiniLM-L6-v2-shaped seq 128 b1", "bert",
                        full=dict(seq=128, **MINILM), quick=dict(seq=16, **MINILM_QUICK)),
    "mlp": ModelSpec("mlp", "MLP 784-512-512-10 b1", "mlp",
                     full=dict(inp=784, hidden=512, classes=10), quick=dict(inp=64, hidden=32, classes=10)),
}


def build(key: str, quick: bool = False):
    """(module in eval mode, example inputs tuple, input names) for MODELS[key]."""
    import torch
    spec = MODELS[key]
    p = spec.quick if quick else spec.full
    torch.manual_seed(0)
    if spec.source == "resnet":
        from examples.models import randomize_norm_stats_, resnet
        model = resnet.ResNet(resnet.Bottleneck, list(p["layers"]), p["classes"])
        randomize_norm_stats_(model)
        return model.eval(), resnet.example_inputs(size=p["size"]), ["x"]
    if spec.source == "mobilenet_v2":
        from examples.models import mobilenet_v2, randomize_norm_stats_
        model = mobilenet_v2.mobilenet_v2(num_classes=p["classes"], width_mult=p["width"])
        randomize_norm_stats_(model)
        return model.eval(), mobilenet_v2.example_inputs(size=p["size"]), ["x"]
    if spec.source == "bert":
        from examples.models import bert
        cfg = bert.BertConfig(**{k: v for k, v in p.items() if k != "seq"})
        model = bert.BertEncoder(cfg)
        return model.eval(), bert.example_inputs(seq=p["seq"], cfg=cfg), ["input_ids", "attention_mask"]
    if spec.source == "mlp":
        from examples.models import mlp
        model = mlp.mlp(p["inp"], p["hidden"], p["classes"])
        return model.eval(), mlp.example_inputs(in_features=p["inp"]), ["x"]
    raise KeyError(key)
