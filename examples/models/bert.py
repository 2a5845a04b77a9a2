"""A small BERT-style encoder written from scratch.

Embeddings (word + position + token type, then LayerNorm), post-LN transformer
layers with ``scaled_dot_product_attention`` under an additive padding mask, and
an erf-GELU feed-forward. ``forward(input_ids, attention_mask)`` returns the last
hidden state ``[batch, seq, hidden]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

# Added to the attention scores of padded key positions.
MASK_VALUE = -1e4


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int = 1000
    hidden: int = 256
    layers: int = 4
    heads: int = 4
    intermediate: int = 1024
    max_positions: int = 128
    type_vocab: int = 2
    dropout: float = 0.1
    layer_norm_eps: float = 1e-12


class Embeddings(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.position_embeddings = nn.Embedding(cfg.max_positions, cfg.hidden)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab, cfg.hidden)
        self.LayerNorm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)
        self.register_buffer("position_ids", torch.arange(cfg.max_positions)[None, :],
                             persistent=False)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        seq_len = input_ids.shape[1]
        x = (self.word_embeddings(input_ids)
             + self.position_embeddings(self.position_ids[:, :seq_len])
             + self.token_type_embeddings(token_type_ids))
        return self.dropout(self.LayerNorm(x))


class SelfAttention(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        if cfg.hidden % cfg.heads:
            raise ValueError(f"hidden ({cfg.hidden}) must be a multiple of heads ({cfg.heads})")
        self.heads = cfg.heads
        self.head_dim = cfg.hidden // cfg.heads
        self.dropout_p = cfg.dropout
        self.query = nn.Linear(cfg.hidden, cfg.hidden)
        self.key = nn.Linear(cfg.hidden, cfg.hidden)
        self.value = nn.Linear(cfg.hidden, cfg.hidden)

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        return x.view(b, s, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q = self._split_heads(self.query(x))
        k = self._split_heads(self.key(x))
        v = self._split_heads(self.value(x))
        ctx = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout_p if self.training else 0.0)
        return ctx.transpose(1, 2).reshape(b, s, h)


class Layer(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.attention = SelfAttention(cfg)
        self.attention_output = nn.Linear(cfg.hidden, cfg.hidden)
        self.attention_dropout = nn.Dropout(cfg.dropout)
        self.attention_norm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
        self.intermediate = nn.Linear(cfg.hidden, cfg.intermediate)
        self.activation = nn.GELU()  # exact (erf) form
        self.output = nn.Linear(cfg.intermediate, cfg.hidden)
        self.output_dropout = nn.Dropout(cfg.dropout)
        self.output_norm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        attn = self.attention_dropout(self.attention_output(self.attention(x, mask)))
        x = self.attention_norm(x + attn)
        ff = self.output_dropout(self.output(self.activation(self.intermediate(x))))
        return self.output_norm(x + ff)


class BertEncoder(nn.Module):
    def __init__(self, cfg: BertConfig | None = None):
        super().__init__()
        self.config = cfg = cfg or BertConfig()
        self.embeddings = Embeddings(cfg)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.layers))
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = self.embeddings(input_ids, token_type_ids)
        # [B, S] of 1 (attend) / 0 (padding) -> additive [B, 1, 1, S] float mask.
        mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * MASK_VALUE
        for layer in self.layers:
            x = layer(x, mask)
        return x


def bert_encoder(cfg: BertConfig | None = None) -> BertEncoder:
    return BertEncoder(cfg or BertConfig())


def example_inputs(seed: int = 0, batch: int = 1, seq: int = 64,
                   cfg: BertConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded ``(input_ids, attention_mask)``, both int64 ``[batch, seq]``.

    Row ``i`` has its last ``8 * (i + 1)`` positions padded (mask 0, id 0), so
    every batch contains masked-out keys.
    """
    cfg = cfg or BertConfig()
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, cfg.vocab_size, (batch, seq), generator=gen)
    attention_mask = torch.ones(batch, seq, dtype=torch.int64)
    for i in range(batch):
        pad = min(8 * (i + 1), seq - 1)
        attention_mask[i, seq - pad:] = 0
        input_ids[i, seq - pad:] = 0
    return input_ids, attention_mask


def cuvil_entry() -> tuple[BertEncoder, tuple[torch.Tensor, torch.Tensor]]:
    """Entry point for `cuvil build` configs: the small encoder, random weights (seed 0),
    batch 1, sequence 64."""
    torch.manual_seed(0)
    return bert_encoder().eval(), example_inputs()


def dynamic_entry() -> tuple[BertEncoder, tuple[torch.Tensor, torch.Tensor]]:
    """Entry point for examples/bert_dynamic.yaml: the small encoder with 512 positions
    (random weights, seed 0) and an example of batch 2, sequence 16; the config makes
    batch and sequence length symbolic (torch.export needs examples of size >= 2 there)."""
    torch.manual_seed(0)
    cfg = BertConfig(max_positions=512)
    return bert_encoder(cfg).eval(), example_inputs(batch=2, seq=16, cfg=cfg)
