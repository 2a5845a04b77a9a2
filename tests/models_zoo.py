"""Small models of the families the compiler must handle beyond the named examples.

Each builder takes ``seed`` and returns ``(model.eval(), example_inputs)``; weights,
batch-norm statistics and inputs are all derived from that seed. Every model is a
few MFLOP so that numeric tests against torch stay quick.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F

from examples.models import randomize_norm_stats_

Inputs = tuple[torch.Tensor, ...]


def _finish(model: nn.Module, seed: int, *inputs: torch.Tensor) -> tuple[nn.Module, Inputs]:
    randomize_norm_stats_(model, seed)
    return model.eval(), tuple(inputs)


def _images(seed: int, batch: int, channels: int, h: int, w: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed + 1)
    return torch.randn(batch, channels, h, w, generator=gen)


def _conv_bn(cin: int, cout: int, k: int = 3, stride: int = 1, groups: int = 1,
             act: nn.Module | None = None) -> nn.Sequential:
    layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
              nn.BatchNorm2d(cout)]
    if act is not None:
        layers.append(act)
    return nn.Sequential(*layers)


# --- squeeze-excite CNN --------------------------------------------------------------

class SqueezeExciteConv(nn.Module):
    """Squeeze-excite with 1x1 convolutions and a hard-sigmoid gate (MobileNetV3 style)."""

    def __init__(self, channels: int, squeeze: int):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.fc2(F.relu(self.fc1(self.pool(x))))
        return x * F.hardsigmoid(s)


class SqueezeExciteLinear(nn.Module):
    """Squeeze-excite with linear layers on the pooled vector and a sigmoid gate."""

    def __init__(self, channels: int, squeeze: int):
        super().__init__()
        self.fc1 = nn.Linear(channels, squeeze)
        self.fc2 = nn.Linear(squeeze, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.mean(dim=(2, 3))
        s = torch.sigmoid(self.fc2(F.silu(self.fc1(s))))
        return x * s[:, :, None, None]


class SEBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, se: nn.Module):
        super().__init__()
        hidden = cin * 4
        self.expand = _conv_bn(cin, hidden, 1, act=nn.Hardswish())
        self.depthwise = _conv_bn(hidden, hidden, 3, stride, groups=hidden, act=nn.Hardswish())
        self.se = se if se is not None else nn.Identity()
        self.project = _conv_bn(hidden, cout, 1)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.project(self.se(self.depthwise(self.expand(x))))
        return x + y if self.residual else y


def se_cnn(seed: int = 0) -> tuple[nn.Module, Inputs]:
    torch.manual_seed(seed)
    model = nn.Sequential(
        _conv_bn(3, 16, 3, 2, act=nn.Hardswish()),
        SEBlock(16, 16, 1, SqueezeExciteConv(64, 16)),
        SEBlock(16, 24, 2, SqueezeExciteLinear(64, 16)),
        SEBlock(24, 24, 1, SqueezeExciteConv(96, 24)),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(24, 10),
    )
    return _finish(model, seed, _images(seed, 1, 3, 64, 64))


# --- depthwise-separable net with grouped convolutions ------------------------------

class SeparableNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = _conv_bn(3, 32, 3, 2, act=nn.ReLU())
        self.dw1 = _conv_bn(32, 32, 3, groups=32, act=nn.ReLU6())
        self.pw1 = _conv_bn(32, 64, 1, act=nn.ReLU6())
        self.grouped = _conv_bn(64, 64, 3, 2, groups=4, act=nn.ReLU())      # not depthwise
        self.dilated = nn.Conv2d(64, 64, 3, padding=2, dilation=2, groups=64)  # depthwise, dilated
        self.multiplier = nn.Conv2d(64, 128, 3, padding=1, groups=64)        # depth multiplier 2
        self.grouped_pw = nn.Conv2d(128, 64, 1, groups=8)
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pw1(self.dw1(self.stem(x)))
        x = self.grouped(x)
        x = F.leaky_relu(self.dilated(x), 0.1) + x
        x = self.grouped_pw(F.elu(self.multiplier(x)))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def separable_net(seed: int = 0) -> tuple[nn.Module, Inputs]:
    torch.manual_seed(seed)
    return _finish(SeparableNet(), seed, _images(seed, 1, 3, 64, 64))


# --- small U-Net --------------------------------------------------------------------

class TinyUNet(nn.Module):
    def __init__(self, cin: int = 3, base: int = 8, classes: int = 2):
        super().__init__()
        self.enc1 = _conv_bn(cin, base, act=nn.ReLU())
        self.enc2 = _conv_bn(base, base * 2, act=nn.ReLU())
        self.enc3 = _conv_bn(base * 2, base * 4, act=nn.ReLU())
        self.pool = nn.MaxPool2d(2)
        self.bottleneck = _conv_bn(base * 4, base * 4, act=nn.ReLU())
        self.up_nearest = nn.Upsample(scale_factor=2, mode="nearest")
        self.up_bilinear = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.dec3 = _conv_bn(base * 8, base * 2, act=nn.ReLU())
        self.dec2 = _conv_bn(base * 4, base, act=nn.ReLU())
        self.dec1 = _conv_bn(base * 2, base, act=nn.ReLU())
        # Constant padding (non-zero value) in front of an unpadded convolution.
        self.out = nn.Conv2d(base, classes, 3, padding=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = self.enc1(x)                       # H
        e2 = self.enc2(self.pool(e1))           # H/2
        e3 = self.enc3(self.pool(e2))           # H/4
        b = self.bottleneck(self.pool(e3))      # H/8
        d3 = self.dec3(torch.cat([self.up_nearest(b), e3], dim=1))
        d2 = self.dec2(torch.cat([self.up_bilinear(d3), e2], dim=1))
        up1 = F.interpolate(d2, size=e1.shape[-2:], mode="bilinear", align_corners=True)
        d1 = self.dec1(torch.cat([up1, e1], dim=1))
        return self.out(F.pad(d1, (1, 1, 1, 1), mode="constant", value=0.5))


def unet(seed: int = 0) -> tuple[nn.Module, Inputs]:
    torch.manual_seed(seed)
    return _finish(TinyUNet(), seed, _images(seed, 1, 3, 32, 32))


# --- small vision transformer -------------------------------------------------------

class MLPBlock(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class SDPAttention(nn.Module):
    """Fused-qkv self-attention through ``scaled_dot_product_attention``."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(b, n, d))


class EncoderBlock(nn.Module):
    def __init__(self, dim: int, heads: int, use_mha: bool):
        super().__init__()
        self.use_mha = use_mha
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        if use_mha:
            self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        else:
            self.attn = SDPAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = MLPBlock(dim, dim * 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        if self.use_mha:
            h = self.attn(h, h, h, need_weights=False)[0]
        else:
            h = self.attn(h)
        x = x + h
        return x + self.mlp(self.norm2(x))


class TinyViT(nn.Module):
    def __init__(self, image: int = 32, patch: int = 8, dim: int = 64, heads: int = 4,
                 classes: int = 10):
        super().__init__()
        tokens = (image // patch) ** 2 + 1
        self.patch_embed = nn.Conv2d(3, dim, patch, stride=patch)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, tokens, dim) * 0.02)
        self.blocks = nn.ModuleList([EncoderBlock(dim, heads, use_mha=True),
                                     EncoderBlock(dim, heads, use_mha=False)])
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)       # [B, N, D]
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        x = torch.cat([cls, x], dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).mean(dim=1))


def vit(seed: int = 0) -> tuple[nn.Module, Inputs]:
    torch.manual_seed(seed)
    return _finish(TinyViT(), seed, _images(seed, 1, 3, 32, 32))


# --- MLP-mixer ----------------------------------------------------------------------

class MixerBlock(nn.Module):
    def __init__(self, tokens: int, dim: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.token_mlp = nn.Sequential(nn.Linear(tokens, tokens * 2), nn.GELU(),
                                       nn.Linear(tokens * 2, tokens))
        self.norm2 = nn.LayerNorm(dim)
        self.channel_mlp = nn.Sequential(nn.Linear(dim, dim * 2), nn.GELU(),
                                         nn.Linear(dim * 2, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:      # [B, N, D]
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))


class TinyMixer(nn.Module):
    def __init__(self, image: int = 32, patch: int = 4, dim: int = 32, depth: int = 2,
                 classes: int = 10):
        super().__init__()
        tokens = (image // patch) ** 2
        self.stem = nn.Conv2d(3, dim, patch, stride=patch)
        self.blocks = nn.Sequential(*[MixerBlock(tokens, dim) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)                                  # [B, D, H, W]
        b, d, h, w = x.shape
        x = x.permute(0, 2, 3, 1).reshape(b, h * w, d)    # [B, N, D]
        x = self.norm(self.blocks(x))
        return self.head(x.mean(dim=1))


def mixer(seed: int = 0) -> tuple[nn.Module, Inputs]:
    torch.manual_seed(seed)
    return _finish(TinyMixer(), seed, _images(seed, 2, 3, 32, 32))


# --- decoder with transposed convs and group/instance norm -----------------------------------
class Decoder(nn.Module):
    """Encoder-decoder using what U-Nets and GAN generators use besides plain upsampling:
    ConvTranspose2d (stride 2, output padding, groups), GroupNorm, InstanceNorm, PReLU, Mish."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.GroupNorm(4, 16), nn.PReLU(16))
        self.down = nn.Conv2d(16, 32, 3, 2, 1)
        self.up1 = nn.ConvTranspose2d(32, 16, 3, stride=2, padding=1, output_padding=1)
        self.norm = nn.InstanceNorm2d(16, affine=True)
        self.up2 = nn.ConvTranspose2d(32, 8, 4, stride=2, padding=1, groups=2)
        self.head = nn.Conv2d(8, 3, 1)
        self.act = nn.PReLU()

    def forward(self, x):
        e = self.enc(x)
        d = F.mish(self.norm(self.up1(F.relu(self.down(e)))))
        d = self.act(self.up2(torch.cat([d, e], dim=1)))
        return torch.tanh(self.head(d))


def decoder(seed: int = 0) -> tuple[nn.Module, Inputs]:
    torch.manual_seed(seed)
    model = Decoder()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.GroupNorm, nn.InstanceNorm2d)):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    return _finish(model, seed, _images(seed, 1, 3, 32, 32))


# --- CBAM-style attention, normalised embeddings, token repeat and indexing ------------------
class AttentionCNN(nn.Module):
    def __init__(self, c: int = 24):
        super().__init__()
        self.stem = _conv_bn(3, c, 3, 2, act=nn.SiLU())
        self.mlp = nn.Sequential(nn.Conv2d(c, c // 4, 1), nn.ReLU(), nn.Conv2d(c // 4, c, 1))
        self.spatial = nn.Conv2d(2, 1, 7, padding=3)
        self.tokens = nn.Parameter(torch.randn(1, 2, c))
        self.register_buffer("order", torch.tensor([1, 0, 1]))
        self.head = nn.Linear(c, 8)

    def forward(self, x):
        x = self.stem(x)
        gate = torch.sigmoid(self.mlp(F.adaptive_avg_pool2d(x, 1)) + self.mlp(F.adaptive_max_pool2d(x, 1)))
        x = x * gate
        s = torch.cat([x.mean(dim=1, keepdim=True), x.amax(dim=1, keepdim=True)], dim=1)
        x = x * torch.sigmoid(self.spatial(s))
        feats = F.softplus(x, beta=2.0).flatten(2).mean(-1)              # [B, C]
        toks = self.tokens.repeat(x.shape[0], 1, 1)[:, self.order]        # [B, 3, C]
        out = self.head(toks + feats[:, None, :])
        return F.normalize(out, dim=-1)


def attention_cnn(seed: int = 0) -> tuple[nn.Module, Inputs]:
    torch.manual_seed(seed)
    return _finish(AttentionCNN(), seed, _images(seed, 2, 3, 32, 32))


ZOO: dict[str, Callable[..., tuple[nn.Module, Inputs]]] = {
    "se_cnn": se_cnn,
    "separable_net": separable_net,
    "unet": unet,
    "vit": vit,
    "mixer": mixer,
    "decoder": decoder,
    "attention_cnn": attention_cnn,
}
