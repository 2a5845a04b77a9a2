"""Hugging Face Transformers families built from small configs with random weights
(offline, no downloads), each captured and compiled with cuvil.compile and compared
with torch within 1e-4 of the output's largest magnitude: BERT, RoBERTa, DistilBERT,
GPT-2, T5 (encoder-decoder), Whisper (full forward), ViT, CLIP text and vision, and a
Llama-style decoder with rotary embeddings and grouped-query attention."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import cuvil

T = pytest.importorskip("transformers")
REL_TOL = 1e-4


class Hidden(torch.nn.Module):
    """The model's first output tensor (last_hidden_state / logits), keywords fixed."""

    def __init__(self, model, names):
        super().__init__()
        self.model, self.names = model.eval(), names

    def forward(self, *xs):
        out = self.model(**dict(zip(self.names, xs)))
        return out if isinstance(out, torch.Tensor) else out[0]


def _ids(seed, n=12):
    return torch.randint(0, 100, (1, n), generator=torch.Generator().manual_seed(seed))


def _families():
    small = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    return {
        "bert": (lambda: T.BertModel(T.BertConfig(vocab_size=100, **small)), ["input_ids"], [_ids(1)]),
        "roberta": (lambda: T.RobertaModel(T.RobertaConfig(vocab_size=100, **small)), ["input_ids"], [_ids(2)]),
        "distilbert": (lambda: T.DistilBertModel(T.DistilBertConfig(vocab_size=100, dim=32, n_layers=2, n_heads=4,
                                                                    hidden_dim=64)), ["input_ids"], [_ids(3)]),
        "gpt2": (lambda: T.GPT2Model(T.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64)),
                 ["input_ids"], [_ids(4)]),
        "t5": (lambda: T.T5Model(T.T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                             decoder_start_token_id=0)),
               ["input_ids", "decoder_input_ids"], [_ids(5), _ids(6, 5)]),
        "whisper": (lambda: T.WhisperModel(T.WhisperConfig(
            vocab_size=100, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, pad_token_id=1, bos_token_id=2,
            eos_token_id=3, decoder_start_token_id=2, num_mel_bins=16, max_source_positions=16,
            max_target_positions=32)),
            ["input_features", "decoder_input_ids"],
            [torch.randn(1, 16, 32, generator=torch.Generator().manual_seed(7)), _ids(8, 6)]),
        "vit": (lambda: T.ViTModel(T.ViTConfig(image_size=32, patch_size=8, **small)), ["pixel_values"],
                [torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(9))]),
        "clip_vision": (lambda: T.CLIPVisionModel(T.CLIPVisionConfig(image_size=32, patch_size=8, **small)),
                        ["pixel_values"], [torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(10))]),
        "clip_text": (lambda: T.CLIPTextModel(T.CLIPTextConfig(vocab_size=100, max_position_embeddings=32, **small)),
                      ["input_ids"], [_ids(11)]),
        "llama_gqa": (lambda: T.LlamaModel(T.LlamaConfig(vocab_size=100, num_key_value_heads=2,
                                                         max_position_embeddings=64, **small)),
                      ["input_ids"], [_ids(12)]),
    }


@pytest.mark.parametrize("family", list(_families()))
def test_family_matches_torch(family):
    build, names, inputs = _families()[family]
    torch.manual_seed(0)
    model = Hidden(build(), names)
    with torch.no_grad():
        want = model(*inputs).numpy()
    assert np.abs(want).max() > 0.1  # random weights, not a near-constant output
    got = cuvil.compile(model, inputs)(*[x.numpy() for x in inputs])[0]
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= REL_TOL * np.abs(want).max(), family
