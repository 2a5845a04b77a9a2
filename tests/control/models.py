"""Models with control flow that the tests compile: torch.cond with both branches,
while_loop with a data-dependent trip count, and a greedy decoder over a small
transformer with a KV cache that runs to an end token inside one while_loop."""
from __future__ import annotations

import math

import torch
from torch import nn
from torch._higher_order_ops.while_loop import while_loop


class Branchy(nn.Module):
    """A linear + ReLU when the input's sum is positive, else a shift and a tanh."""

    def __init__(self, n: int = 8):
        super().__init__()
        self.lin = nn.Linear(n, n)

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: torch.relu(self.lin(x)), lambda x: torch.tanh(x - 1), (x,))


class Halving(nn.Module):
    """Repeat y <- W y (W a contraction) until max|y| <= 1: the trip count depends on the
    data. Returns the number of steps and the result; each step chooses (torch.cond in
    the body) between scaling and a fixed shrink by the sign of the sum."""

    def __init__(self, n: int = 8):
        super().__init__()
        self.lin = nn.Linear(n, n, bias=False)
        with torch.no_grad():
            self.lin.weight.copy_(torch.eye(n) * 0.6 + torch.randn(n, n) * 0.02)

    def forward(self, x):
        def go(i, y):
            return y.abs().amax() > 1.0

        def step(i, y):
            y = torch.cond(y.sum() > 0, lambda y: self.lin(y), lambda y: y * 0.5, (y,))
            return i + 1, y
        return while_loop(go, step, (torch.zeros((), dtype=torch.int64), x))


class TinyDecoder(nn.Module):
    """A two-layer pre-norm transformer language model that decodes greedily with a KV
    cache: positions below the prompt's length read the prompt (prefill), later ones feed
    back the previous token, until the end token or `limit` new tokens. Everything has a
    fixed shape, [max_len] for the cache: the cache row of position p is written with a
    `where` on p, attention masks out positions after p."""

    def __init__(self, vocab: int = 24, dim: int = 32, heads: int = 4, layers: int = 2, max_len: int = 24,
                 end: int = 1):
        super().__init__()
        self.vocab, self.dim, self.heads, self.max_len, self.end = vocab, dim, heads, max_len, end
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_len, dim)
        self.norm1 = nn.ModuleList(nn.LayerNorm(dim) for _ in range(layers))
        self.qkv = nn.ModuleList(nn.Linear(dim, 3 * dim) for _ in range(layers))
        self.proj = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))
        self.norm2 = nn.ModuleList(nn.LayerNorm(dim) for _ in range(layers))
        self.mlp = nn.ModuleList(nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
                                 for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)
        self.register_buffer("slots", torch.arange(max_len), persistent=False)

    def empty_cache(self) -> list[torch.Tensor]:
        hd = self.dim // self.heads
        return [torch.zeros(self.heads, self.max_len, hd) for _ in range(2 * len(self.qkv))]

    def step(self, token, p, cache):
        """One position: token () int64 at position p () int64 -> (logits [vocab], cache)."""
        h, hd = self.heads, self.dim // self.heads
        x = self.tok(token.reshape(1)) + self.pos(p.reshape(1))  # [1, dim]
        here = (self.slots == p).reshape(1, self.max_len, 1)
        seen = (self.slots <= p).reshape(1, 1, self.max_len)
        new_cache = []
        for i in range(len(self.qkv)):
            q, k, v = self.qkv[i](self.norm1[i](x)).reshape(3, h, 1, hd).unbind(0)
            kc = torch.where(here, k, cache[2 * i])  # [h, max_len, hd]
            vc = torch.where(here, v, cache[2 * i + 1])
            new_cache += [kc, vc]
            scores = (q @ kc.transpose(1, 2)) / math.sqrt(hd)  # [h, 1, max_len]
            scores = torch.where(seen, scores, torch.full_like(scores, -1e9))
            att = torch.softmax(scores, -1) @ vc  # [h, 1, hd]
            x = x + self.proj[i](att.reshape(1, self.dim))
            x = x + self.mlp[i](self.norm2[i](x))
        return self.head(self.norm(x)).reshape(self.vocab), new_cache

    def forward(self, prompt, length, limit):
        """prompt [max_len] int64 (the first `length` entries used), limit () int64 ->
        (tokens [max_len], n): the generated tokens, end token included, and their count."""
        def go(p, token, n, out, *cache):
            return (p < self.max_len - 1) & (n < limit) & ((p < length) | (token != self.end))

        def step(p, token, n, out, *cache):
            logits, cache = self.step(token, p, list(cache))
            nxt = torch.argmax(logits, 0)
            generating = p + 1 >= length
            feed = torch.where(generating, nxt, (prompt * (self.slots == p + 1)).sum())
            out = torch.where((self.slots == n) & generating, nxt, out)
            return (p + 1, feed, n + generating.to(torch.int64), out, *cache)

        zero = torch.zeros((), dtype=torch.int64)
        out = torch.full((self.max_len,), -1, dtype=torch.int64)
        p, token, n, out, *_ = while_loop(go, step, (zero, prompt[0].clone(), zero, out, *self.empty_cache()))
        return out, n

    @torch.no_grad()
    def generate(self, prompt: list[int], limit: int) -> list[int]:
        """The same decoding as a Python loop (the reference)."""
        cache = self.empty_cache()
        token, p, new = prompt[0], 0, []
        while p < self.max_len - 1 and len(new) < limit and (p < len(prompt) or token != self.end):
            logits, cache = self.step(torch.tensor(token), torch.tensor(p), cache)
            nxt = int(torch.argmax(logits))
            if p + 1 >= len(prompt):
                new.append(nxt)
                token = nxt
            else:
                token = prompt[p + 1]
            p += 1
        return new


def decoder(seed: int = 0) -> TinyDecoder:
    torch.manual_seed(seed)
    model = TinyDecoder().eval()
    with torch.no_grad():  # a head biased toward the end token, so some runs end on it early
        model.head.bias[model.end] += 0.3
    return model


def decoder_inputs(model: TinyDecoder, prompt: list[int], limit: int):
    padded = torch.zeros(model.max_len, dtype=torch.int64)
    padded[:len(prompt)] = torch.tensor(prompt)
    return padded, torch.tensor(len(prompt)), torch.tensor(limit)
