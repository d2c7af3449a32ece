"""MVDream (text-to-3D) as an SIR prior: the multi-view UNet, its loader, its cameras, and the prior.

The model (a diffusers-format folder, the layout of ``ashawkey/mvdream-sd2.1-diffusers``)::

    model_index.json   {"_class_name": "MVDreamPipeline", "unet": ["mv_unet", "MultiViewUNetModel"], ...}
    unet/              config.json (MultiViewUNetModel's arguments) + diffusion_pytorch_model.safetensors
                       (or .bin): the LDM-layout multi-view UNet (:class:`MultiViewUNet`)
    vae/               AutoencoderKL (Stable Diffusion's)
    text_encoder/      CLIPTextModel: OpenCLIP ViT-H/14's text tower up to its penultimate layer, then its
                       final layer norm (Stable Diffusion 2's text encoder)
    tokenizer/         CLIPTokenizer (77 tokens)
    scheduler/         (read by nobody here: the schedule is :class:`~microdreamer.priors.ddim.DDIMConfig`)

The UNet is Stable Diffusion 2.1-base's (320/640/1280/1280 channels, 64-channel heads, cross-attention
to 1024-wide text tokens) with two changes: every transformer block's self-attention runs over the
tokens of all F views of a group at once (the F views' token sequences concatenated; cross-attention
to the text stays per view), and a camera embedding ``MLP(flattened 4x4 camera matrix)`` is added to
the time embedding. ImageDream (:mod:`microdreamer.priors.imagedream`) is the same network with image
prompt layers (``ip_dim`` > 0: a resampler of CLIP image features and extra key/value projections in
every cross-attention).

Cameras (:func:`camera_matrices`): the camera-to-world matrix (OpenGL axes) of a view on our orbit
(MicroDreamer's: negative elevation = above, azimuth 0 = from +z), turned into Blender's world axes
(x, y, z) -> (x, -z, y) and with its position scaled onto the unit sphere, flattened row by row.
MVDream's azimuth 0 (its first view) is our azimuth 0; its "front" (the second view of its default
4-view set, where ImageDream's input image is seen from) is our azimuth 90 (:data:`FRONT_AZIMUTH_DEG`).

Loading never touches the network: a folder path, or a repo id looked up in the local Hugging Face
cache with ``local_files_only=True``. diffusers and transformers are imported on first use.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from microdreamer.cameras import look_at_opengl, orbit_positions
from microdreamer.config import DDIMConfig, MVDreamConfig
from microdreamer.errors import InputError
from microdreamer.priors.base import OrbitViews, Prior, Reference, even_orbit_views
from microdreamer.priors.ddim import DDIMRoundTrip
from microdreamer.priors.fused import fuse_ops, geglu, geglu_reference, group_norm, group_norm_reference
from microdreamer.priors.zero123 import LatentCodec, _GraphedCall, resolve_dtype, resolve_model_path

logger = logging.getLogger(__name__)

SUBFOLDERS = ("unet", "vae", "text_encoder", "tokenizer")
WEIGHTS = ("diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.bin")
#: our azimuth of MVDream's / ImageDream's front view (MicroDreamer: "the second view is the front view")
FRONT_AZIMUTH_DEG = 90.0
#: MicroDreamer's negative prompt for MVDream and ImageDream (configs/imagedream.yaml, configs/text_mv.yaml)
# ---------------------------------------------------------------------------------------------- cameras
# OpenGL world (y up) -> Blender world (z up): (x, y, z) -> (x, -z, y), applied on the left of c2w
_OPENGL_TO_BLENDER = torch.tensor(
    [[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, -1.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]]
)


def camera_matrices(views: OrbitViews) -> torch.Tensor:
    """[C, 16] float32 camera inputs of MVDream / ImageDream for ``views`` (CPU).

    Row by row, the 4x4 matrix ``B @ c2w`` with ``c2w`` the camera-to-world matrix (OpenGL camera
    axes: x right, y up, z away from the target) of the view on our orbit and ``B`` the change of world
    axes (x, y, z) -> (x, -z, y), its translation then divided by its norm (+ 1e-8): the camera position
    on the unit sphere. This is what MicroDreamer feeds the models (``orbit_camera`` poses, rows
    permuted and negated to Blender's convention, ``normalize_camera``); it equals MVDream's own
    ``get_camera(elevation=-e, azimuth=a)`` for our elevation e and azimuth a.
    """
    c2w = look_at_opengl(orbit_positions(views.elevation_deg, views.azimuth_deg, views.radius))
    m = _OPENGL_TO_BLENDER @ c2w
    t = m[:, :3, 3]
    m[:, :3, 3] = t / (t.norm(dim=-1, keepdim=True) + 1e-8)
    return m.reshape(-1, 16)


def multiview_orbit_views(
    count: int = 4,
    reference_elevation_deg: float = 0.0,
    elevation_range: tuple[float, float] = (-10.0, 10.0),
    radius: float = 2.5,
    generator: torch.Generator | None = None,
) -> OrbitViews:
    """MicroDreamer's views of one SIR iteration with MVDream / ImageDream: ``count`` (4) azimuths
    360 / count apart from a random start in [-180, -180 + 360 / count), elevations drawn in
    ``elevation_range`` around the reference's (:func:`~microdreamer.priors.base.even_orbit_views`'
    rule), on an orbit of ``radius`` (2.5). Upstream's text config draws elevations in (-10, 10),
    ImageDream's in (-5, 0) (integers there, floats here)."""
    return even_orbit_views(count, reference_elevation_deg, elevation_range, radius, generator)


# ------------------------------------------------------------------------------------------ UNet config
# keys of upstream's config.json that do not change the network (or only take their default here)
_IGNORED_KEYS = {"image_size", "use_checkpoint", "legacy", "use_linear_in_transformer", "use_spatial_transformer",
                 "with_ip", "ip_mode", "dropout"}  # fmt: skip
# keys whose only supported value is upstream's default
_FIXED_KEYS = {"num_heads": -1, "num_heads_upsample": -1, "use_scale_shift_norm": False, "resblock_updown": False,
               "conv_resample": True, "dims": 2, "num_classes": None, "n_embed": None,
               "num_attention_blocks": None, "adm_in_channels": None}  # fmt: skip


@dataclass
class MultiViewUNetConfig:
    """The arguments of the multi-view UNet (upstream's ``MultiViewUNetModel``; ``unet/config.json``).

    Attributes:
        in_channels, out_channels: latent channels in and out (4).
        model_channels: channels of the first level (320); the time embedding is 4x this.
        num_res_blocks: ResNet blocks per level (2).
        attention_resolutions: downsampling factors that get a transformer after each ResNet block.
        channel_mult: channels of each level, as multiples of ``model_channels``.
        num_head_channels: channels per attention head (64).
        context_dim: width of the cross-attention tokens (1024: OpenCLIP ViT-H/14's text width).
        transformer_depth: transformer blocks per spatial transformer (1).
        camera_dim: width of the camera input (16: a flattened 4x4 matrix); None: no camera embedding.
        ip_dim: image-prompt tokens appended to the text tokens (ImageDream: 16; MVDream: 0).
        ip_weight: weight of the image-prompt attention in every cross-attention (1).
        image_size: the latent side upstream records (unused).
        norm_num_groups: groups of every group norm (32; upstream hard-codes it; tiny test models set it).
        ip_embedding_dim, ip_depth, ip_heads, ip_dim_head: the image-prompt resampler's input width
            (1280: CLIP ViT-H/14's vision width), layers (4), heads (12) and head width (64), which
            upstream hard-codes.
    """

    in_channels: int = 4
    out_channels: int = 4
    model_channels: int = 320
    num_res_blocks: int = 2
    attention_resolutions: tuple[int, ...] = (4, 2, 1)
    channel_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_head_channels: int = 64
    context_dim: int = 1024
    transformer_depth: int = 1
    camera_dim: int | None = 16
    ip_dim: int = 0
    ip_weight: float = 1.0
    image_size: int = 32
    norm_num_groups: int = 32
    ip_embedding_dim: int = 1280
    ip_depth: int = 4
    ip_heads: int = 12
    ip_dim_head: int = 64

    def __post_init__(self) -> None:
        self.attention_resolutions = tuple(int(a) for a in self.attention_resolutions)
        self.channel_mult = tuple(int(m) for m in self.channel_mult)
        for m in self.channel_mult:
            if (m * self.model_channels) % self.num_head_channels:
                raise ValueError(
                    f"num_head_channels {self.num_head_channels} does not divide {m * self.model_channels} channels"
                )

    @classmethod
    def from_dict(cls, data: dict, where: str = "unet/config.json") -> MultiViewUNetConfig:
        """From upstream's ``config.json`` mapping; other keys (``_class_name``, ``use_checkpoint``, ...)
        are ignored where they do not change the network, refused (one-line :class:`InputError`) where
        they would."""
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {}
        for key, value in data.items():
            if key.startswith("_") or key in _IGNORED_KEYS and key not in names:
                continue
            if key in _FIXED_KEYS:
                if value != _FIXED_KEYS[key]:
                    raise InputError(f"{where}: {key}={value!r} is not supported (only {_FIXED_KEYS[key]!r})")
                continue
            if key not in names:
                raise InputError(f"{where}: unknown multi-view UNet setting {key!r}")
            kwargs[key] = value
        if isinstance(kwargs.get("transformer_depth"), list):
            depths = set(kwargs["transformer_depth"])
            if len(depths) != 1:
                raise InputError(
                    f"{where}: per-level transformer_depth {kwargs['transformer_depth']} is not supported"
                )
            kwargs["transformer_depth"] = depths.pop()
        try:
            return cls(**kwargs)
        except (TypeError, ValueError) as e:
            raise InputError(f"{where}: {e}") from None

    def to_dict(self) -> dict:
        """The ``config.json`` mapping: upstream's keys, plus ours only where they differ from the defaults
        (so a full-size model's file reads like the converted repositories')."""
        out = {"_class_name": "MultiViewUNetModel", "_diffusers_version": "0.25.0"}
        defaults = MultiViewUNetConfig()
        upstream = ("attention_resolutions", "camera_dim", "channel_mult", "context_dim", "image_size", "in_channels",
                    "model_channels", "num_head_channels", "num_res_blocks", "out_channels", "transformer_depth")  # fmt: skip
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            v = list(v) if isinstance(v, tuple) else v
            if f.name in upstream or (f.name == "ip_dim" and self.ip_dim > 0):
                out[f.name] = v
            elif v != getattr(defaults, f.name):
                out[f.name] = v
        return out


# ------------------------------------------------------------------------------------------ UNet blocks
def timestep_embedding(timesteps: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """[B, dim] float32 sinusoidal embedding of timesteps [B]: [cos(t f_k), sin(t f_k)] with
    f_k = max_period^(-k / (dim // 2)), k < dim // 2 (a zero column appended when dim is odd)."""
    half = dim // 2
    freqs = torch.exp(
        -math.log(max_period) * torch.arange(half, dtype=torch.float32, device=timesteps.device) / half
    )
    args = timesteps.float()[:, None] * freqs[None]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    if dim % 2:
        emb = torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1)
    return emb


class _Fusable(nn.Module):
    """A block whose group norms / GEGLU run on the Triton kernels of :mod:`.fused` when ``fused`` is set
    (those fall back to PyTorch's ops for CPU or non-channels-last tensors), else on PyTorch's ops."""

    fused: bool = False

    def gnorm(self, x, gn: nn.GroupNorm, channel_bias=None, activation=None) -> torch.Tensor:
        """act(gn(x + channel_bias)) with ``gn``'s parameters."""
        fn = group_norm if self.fused else group_norm_reference
        return fn(x, gn.num_groups, gn.weight, gn.bias, gn.eps, channel_bias, activation)


class MultiViewAttention(nn.Module):
    """Multi-head attention with PyTorch's SDPA (keys ``to_q``, ``to_k``, ``to_v``, ``to_out.0``).

    Self-attention when ``context`` is None; the multi-view grouping happens in the caller
    (:class:`TransformerBlock3D` hands it the F views' tokens as one sequence). With ``ip_dim`` > 0 the
    last ``ip_dim`` context tokens are the image prompt: attended with their own key/value projections
    (``to_k_ip``, ``to_v_ip``) in a separate softmax, the result added with weight ``ip_weight``.
    """

    def __init__(self, query_dim: int, context_dim: int | None = None, heads: int = 8, dim_head: int = 64,
                 ip_dim: int = 0, ip_weight: float = 1.0) -> None:  # fmt: skip
        super().__init__()
        inner = heads * dim_head
        context_dim = query_dim if context_dim is None else context_dim
        self.heads, self.dim_head = heads, dim_head
        self.ip_dim, self.ip_weight = ip_dim, ip_weight
        self.to_q = nn.Linear(query_dim, inner, bias=False)
        self.to_k = nn.Linear(context_dim, inner, bias=False)
        self.to_v = nn.Linear(context_dim, inner, bias=False)
        if ip_dim > 0:
            self.to_k_ip = nn.Linear(context_dim, inner, bias=False)
            self.to_v_ip = nn.Linear(context_dim, inner, bias=False)
        self.to_out = nn.Sequential(nn.Linear(inner, query_dim), nn.Dropout(0.0))

    def _split(self, t: torch.Tensor) -> torch.Tensor:
        return t.unflatten(-1, (self.heads, self.dim_head)).transpose(1, 2)  # [B, heads, L, d]

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, L, query_dim], context [B, M (+ ip_dim), context_dim] or None -> [B, L, query_dim]."""
        ctx = x if context is None else context
        ip = None
        if self.ip_dim > 0 and context is not None:
            ctx, ip = context[:, : -self.ip_dim], context[:, -self.ip_dim :]
        q = self._split(self.to_q(x))
        out = F.scaled_dot_product_attention(q, self._split(self.to_k(ctx)), self._split(self.to_v(ctx)))
        if ip is not None:
            out_ip = F.scaled_dot_product_attention(
                q, self._split(self.to_k_ip(ip)), self._split(self.to_v_ip(ip))
            )
            out = out + self.ip_weight * out_ip
        return self.to_out(out.transpose(1, 2).flatten(2))


class GEGLU(_Fusable):
    """``a * gelu(g)`` of the two halves [a, g] of one projection (key ``proj``)."""

    def __init__(self, dim_in: int, dim_out: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim_in, 2 * dim_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (geglu if self.fused else geglu_reference)(self.proj(x))


class FeedForward(nn.Module):
    """GEGLU to 4x the width, then a projection back (keys ``net.0.proj``, ``net.2``)."""

    def __init__(self, dim: int, mult: int = 4) -> None:
        super().__init__()
        self.net = nn.Sequential(GEGLU(dim, dim * mult), nn.Dropout(0.0), nn.Linear(dim * mult, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class TransformerBlock3D(nn.Module):
    """Pre-norm transformer block: self-attention over the tokens of all ``num_frames`` views of a group,
    cross-attention to each view's context, GEGLU feed-forward (keys ``attn1``, ``attn2``, ``ff``,
    ``norm1..3``)."""

    def __init__(self, dim: int, heads: int, dim_head: int, context_dim: int, ip_dim: int = 0,
                 ip_weight: float = 1.0) -> None:  # fmt: skip
        super().__init__()
        self.attn1 = MultiViewAttention(dim, None, heads, dim_head)
        self.ff = FeedForward(dim)
        self.attn2 = MultiViewAttention(dim, context_dim, heads, dim_head, ip_dim, ip_weight)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor, context: torch.Tensor, num_frames: int) -> torch.Tensor:
        """x [B, L, dim] (B = groups x num_frames, a group's views consecutive), context [B, M, D]."""
        x = x + self.self_attention(self.norm1(x), num_frames)
        x = x + self.attn2(self.norm2(x), context)
        return x + self.ff(self.norm3(x))

    def self_attention(self, x: torch.Tensor, num_frames: int) -> torch.Tensor:
        """``attn1`` over each group's views as one sequence: x [B, L, dim] -> [B, L, dim]."""
        B, L, C = x.shape
        return self.attn1(x.reshape(B // num_frames, num_frames * L, C)).reshape(B, L, C)


class SpatialTransformer3D(_Fusable):
    """Group norm (eps 1e-6), linear in, transformer blocks, linear out, residual (keys ``norm``,
    ``proj_in``, ``transformer_blocks.i``, ``proj_out``)."""

    def __init__(self, channels: int, heads: int, dim_head: int, context_dim: int, depth: int, groups: int,
                 ip_dim: int = 0, ip_weight: float = 1.0) -> None:  # fmt: skip
        super().__init__()
        inner = heads * dim_head
        self.norm = nn.GroupNorm(groups, channels, eps=1e-6)
        self.proj_in = nn.Linear(channels, inner)
        self.transformer_blocks = nn.ModuleList(
            [TransformerBlock3D(inner, heads, dim_head, context_dim, ip_dim, ip_weight) for _ in range(depth)]
        )
        self.proj_out = nn.Linear(inner, channels)

    def forward(self, x: torch.Tensor, context: torch.Tensor, num_frames: int) -> torch.Tensor:
        b, c, h, w = x.shape
        y = self.gnorm(x, self.norm)
        y = self.proj_in(y.permute(0, 2, 3, 1).reshape(b, h * w, c))
        for block in self.transformer_blocks:
            y = block(y, context, num_frames)
        y = self.proj_out(y).reshape(b, h, w, c).permute(0, 3, 1, 2)  # channels-last view
        return y + x


class ResBlock(_Fusable):
    """norm + SiLU + 3x3 conv, + the time embedding's projection, norm + SiLU + 3x3 conv, + skip (keys
    ``in_layers.0/2``, ``emb_layers.1``, ``out_layers.0/3``, ``skip_connection`` when the width changes)."""

    def __init__(self, channels: int, emb_channels: int, out_channels: int | None, groups: int) -> None:
        super().__init__()
        out = out_channels or channels
        self.in_layers = nn.Sequential(
            nn.GroupNorm(groups, channels), nn.SiLU(), nn.Conv2d(channels, out, 3, padding=1)
        )
        self.emb_layers = nn.Sequential(nn.SiLU(), nn.Linear(emb_channels, out))
        self.out_layers = nn.Sequential(nn.GroupNorm(groups, out), nn.SiLU(), nn.Dropout(0.0),
                                        nn.Conv2d(out, out, 3, padding=1))  # fmt: skip
        self.skip_connection = nn.Identity() if out == channels else nn.Conv2d(channels, out, 1)

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        h = self.in_layers[2](self.gnorm(x, self.in_layers[0], activation="silu"))
        e = self.emb_layers(emb).to(h.dtype)  # [B, out]: a per-sample channel bias inside the second norm
        h = self.out_layers[3](self.gnorm(h, self.out_layers[0], channel_bias=e, activation="silu"))
        return self.skip_connection(x) + h


class Downsample(nn.Module):
    """3x3 convolution with stride 2 (key ``op``)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.op = nn.Conv2d(channels, channels, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(x)


class Upsample(nn.Module):
    """Nearest-neighbour 2x upsampling, then a 3x3 convolution (key ``conv``)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2, mode="nearest"))


class _CondSequential(nn.Sequential):
    """Layers of one UNet block, each given what it takes (time embedding, context, views per group)."""

    def forward(self, x, emb, context, num_frames):  # noqa: D102
        for layer in self:
            if isinstance(layer, ResBlock):
                x = layer(x, emb)
            elif isinstance(layer, SpatialTransformer3D):
                x = layer(x, context, num_frames)
            else:
                x = layer(x)
        return x


class PerceiverAttention(nn.Module):
    """The resampler's attention: queries from the latent tokens, keys and values from [features;
    latents], each input layer-normed (keys ``norm1``, ``norm2``, ``to_q``, ``to_kv``, ``to_out``)."""

    def __init__(self, dim: int, dim_head: int, heads: int) -> None:
        super().__init__()
        inner = dim_head * heads
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.to_q = nn.Linear(dim, inner, bias=False)
        self.to_kv = nn.Linear(dim, 2 * inner, bias=False)
        self.to_out = nn.Linear(inner, dim, bias=False)

    def forward(self, x: torch.Tensor, latents: torch.Tensor) -> torch.Tensor:
        """x [B, N, dim] features, latents [B, Q, dim] -> [B, Q, dim]."""
        x, latents = self.norm1(x), self.norm2(latents)
        q = self.to_q(latents)
        k, v = self.to_kv(torch.cat([x, latents], dim=1)).chunk(2, dim=-1)
        q, k, v = (t.unflatten(-1, (self.heads, -1)).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v)  # softmax(q k^T / sqrt(d)) v, as upstream's
        return self.to_out(out.transpose(1, 2).flatten(2))


class Resampler(nn.Module):
    """ImageDream's image-prompt resampler: Q learned query tokens attend to CLIP image features
    through ``depth`` perceiver layers (keys ``latents``, ``proj_in``, ``layers.i.0`` attention,
    ``layers.i.1`` feed-forward, ``proj_out``, ``norm_out``)."""

    def __init__(self, dim: int, depth: int, dim_head: int, heads: int, num_queries: int, embedding_dim: int,
                 output_dim: int, ff_mult: int = 4) -> None:  # fmt: skip
        super().__init__()
        self.latents = nn.Parameter(torch.randn(1, num_queries, dim) / dim**0.5)
        self.proj_in = nn.Linear(embedding_dim, dim)
        self.proj_out = nn.Linear(dim, output_dim)
        self.norm_out = nn.LayerNorm(output_dim)
        self.layers = nn.ModuleList()
        for _ in range(depth):
            ff = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim * ff_mult, bias=False), nn.GELU(),
                               nn.Linear(dim * ff_mult, dim, bias=False))  # fmt: skip
            self.layers.append(nn.ModuleList([PerceiverAttention(dim, dim_head, heads), ff]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, N, embedding_dim] image features -> [B, Q, output_dim] image-prompt tokens."""
        latents = self.latents.expand(x.shape[0], -1, -1)
        x = self.proj_in(x)
        for attn, ff in self.layers:
            latents = attn(x, latents) + latents
            latents = ff(latents) + latents
        return self.norm_out(self.proj_out(latents))


# ------------------------------------------------------------------------------------------------- UNet
class MultiViewUNet(_Fusable):
    """MVDream's / ImageDream's multi-view UNet (upstream's ``MultiViewUNetModel``, LDM layout: the
    state-dict keys of the converted repositories' ``unet/diffusion_pytorch_model.safetensors``).

    Args:
        config: :class:`MultiViewUNetConfig`.
    """

    def __init__(self, config: MultiViewUNetConfig | None = None) -> None:
        super().__init__()
        cfg = self.config = config or MultiViewUNetConfig()
        mc, groups = cfg.model_channels, cfg.norm_num_groups
        emb_dim = 4 * mc
        self.time_embed = nn.Sequential(nn.Linear(mc, emb_dim), nn.SiLU(), nn.Linear(emb_dim, emb_dim))
        if cfg.camera_dim is not None:
            self.camera_embed = nn.Sequential(
                nn.Linear(cfg.camera_dim, emb_dim), nn.SiLU(), nn.Linear(emb_dim, emb_dim)
            )
        if cfg.ip_dim > 0:
            self.image_embed = Resampler(cfg.context_dim, cfg.ip_depth, cfg.ip_dim_head, cfg.ip_heads, cfg.ip_dim,
                                         cfg.ip_embedding_dim, cfg.context_dim)  # fmt: skip

        def transformer(ch: int) -> SpatialTransformer3D:
            heads = ch // cfg.num_head_channels
            return SpatialTransformer3D(ch, heads, cfg.num_head_channels, cfg.context_dim, cfg.transformer_depth,
                                        groups, cfg.ip_dim, cfg.ip_weight)  # fmt: skip

        self.input_blocks = nn.ModuleList([_CondSequential(nn.Conv2d(cfg.in_channels, mc, 3, padding=1))])
        skips = [mc]
        ch, ds = mc, 1
        for level, mult in enumerate(cfg.channel_mult):
            for _ in range(cfg.num_res_blocks):
                layers: list[nn.Module] = [ResBlock(ch, emb_dim, mult * mc, groups)]
                ch = mult * mc
                if ds in cfg.attention_resolutions:
                    layers.append(transformer(ch))
                self.input_blocks.append(_CondSequential(*layers))
                skips.append(ch)
            if level != len(cfg.channel_mult) - 1:
                self.input_blocks.append(_CondSequential(Downsample(ch)))
                skips.append(ch)
                ds *= 2
        self.middle_block = _CondSequential(
            ResBlock(ch, emb_dim, None, groups), transformer(ch), ResBlock(ch, emb_dim, None, groups)
        )
        self.output_blocks = nn.ModuleList()
        for level, mult in reversed(list(enumerate(cfg.channel_mult))):
            for i in range(cfg.num_res_blocks + 1):
                layers = [ResBlock(ch + skips.pop(), emb_dim, mc * mult, groups)]
                ch = mc * mult
                if ds in cfg.attention_resolutions:
                    layers.append(transformer(ch))
                if level and i == cfg.num_res_blocks:
                    layers.append(Upsample(ch))
                    ds //= 2
                self.output_blocks.append(_CondSequential(*layers))
        self.out = nn.Sequential(
            nn.GroupNorm(groups, ch), nn.SiLU(), nn.Conv2d(mc, cfg.out_channels, 3, padding=1)
        )

    @property
    def dtype(self) -> torch.dtype:
        return self.time_embed[0].weight.dtype

    def set_fused(self, enable: bool) -> int:
        """Run the group norms and GEGLU gates on the Triton kernels of :mod:`.fused` (``enable``; they
        take effect on channels-last CUDA tensors only) or on PyTorch's ops. Returns the blocks set."""
        blocks = [m for m in self.modules() if isinstance(m, _Fusable)]
        for m in blocks:
            m.fused = enable
        return len(blocks)

    def encode_image_prompt(self, features: torch.Tensor) -> torch.Tensor:
        """[B, N, ip_embedding_dim] CLIP image features -> [B, ip_dim, context_dim] image-prompt tokens."""
        if self.config.ip_dim <= 0:
            raise RuntimeError("this multi-view UNet has no image-prompt layers (ip_dim = 0)")
        return self.image_embed(features.to(self.dtype))

    def forward(self, x: torch.Tensor, timesteps: torch.Tensor, context: torch.Tensor,
                camera: torch.Tensor | None = None, num_frames: int = 1, ip: torch.Tensor | None = None,
                ip_img: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        """Predict the noise of a batch of views.

        Args:
            x: [B, in_channels, h, w] noisy latents; B = G groups x ``num_frames`` views, each group's
                views consecutive (they attend to each other).
            timesteps: [B] timesteps.
            context: [B, M, context_dim] cross-attention tokens per view; with image-prompt layers and
                ``ip`` None, its last ``ip_dim`` tokens must be the image prompt
                (:meth:`encode_image_prompt`).
            camera: [B, camera_dim] camera inputs (:func:`camera_matrices`; zeros for ImageDream's
                image view) or None.
            num_frames: F, views per group.
            ip: [B, N, ip_embedding_dim] CLIP image features, resampled and appended to ``context`` here
                (upstream's way), or None.
            ip_img: [G, in_channels, h, w] latents put in place of the last view of every group
                (ImageDream's input-image view; upstream's way), or None.

        Returns:
            [B, out_channels, h, w] in x's dtype.
        """
        if x.shape[0] % num_frames:
            raise ValueError(f"batch {x.shape[0]} is not a multiple of num_frames {num_frames}")
        if (camera is None) != (self.config.camera_dim is None):
            raise ValueError("camera must be given exactly when the UNet has a camera embedding")
        emb = self.time_embed(timestep_embedding(timesteps, self.config.model_channels).to(self.dtype))
        if camera is not None:
            emb = emb + self.camera_embed(camera.to(self.dtype))
        if ip_img is not None:
            x = x.clone()
            x[num_frames - 1 :: num_frames] = ip_img.to(x.dtype)
        if ip is not None:
            context = torch.cat([context.to(self.dtype), self.encode_image_prompt(ip)], dim=1)
        context = context.to(self.dtype)
        h = x.to(self.dtype)
        skips = []
        for block in self.input_blocks:
            h = block(h, emb, context, num_frames)
            skips.append(h)
        h = self.middle_block(h, emb, context, num_frames)
        for block in self.output_blocks:
            h = block(torch.cat([h, skips.pop()], dim=1), emb, context, num_frames)
        return self.out[2](self.gnorm(h, self.out[0], activation="silu")).to(x.dtype)

    # ------------------------------------------------------------------ files
    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike, dtype: torch.dtype = torch.float32,
                        device: torch.device | str = "cpu") -> MultiViewUNet:  # fmt: skip
        """Load ``folder`` (``config.json`` and ``diffusion_pytorch_model.safetensors`` or ``.bin``,
        upstream's key names) in ``dtype`` on ``device``.

        Raises:
            InputError: (one line) a missing or unreadable file, an unsupported setting, or weights
                that do not fit the configured network.
        """
        folder = Path(folder)
        cfg_path = folder / "config.json"
        if not cfg_path.exists():
            raise InputError(f"{folder}: no config.json; not a multi-view UNet folder")
        try:
            data = json.loads(cfg_path.read_text())
        except json.JSONDecodeError as e:
            raise InputError(f"{cfg_path}: not valid JSON ({e})") from None
        config = MultiViewUNetConfig.from_dict(data, str(cfg_path))
        state = _read_weights(folder)
        with torch.device("meta"):
            unet = cls(config)
        expected = unet.state_dict()
        missing = sorted(set(expected) - set(state))
        unexpected = sorted(set(state) - set(expected))
        wrong = [k for k in expected if k in state and tuple(state[k].shape) != tuple(expected[k].shape)]
        if missing or unexpected or wrong:
            parts = []
            for name, keys in (("missing", missing), ("unexpected", unexpected), ("wrong shape", wrong)):
                if keys:
                    parts.append(f"{len(keys)} {name} (e.g. {keys[0]})")
            raise InputError(
                f"{folder}: the weights do not fit the configured multi-view UNet: {'; '.join(parts)}"
            )
        unet.load_state_dict(state, assign=True)
        return unet.to(device=device, dtype=dtype).eval().requires_grad_(False)

    def save_pretrained(self, folder: str | os.PathLike) -> None:
        """Write ``config.json`` and ``diffusion_pytorch_model.safetensors`` (the layout
        :meth:`from_pretrained` and upstream read)."""
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(self.config.to_dict(), indent=2))
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        save_file(state, str(folder / WEIGHTS[0]))


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    st, pt = folder / WEIGHTS[0], folder / WEIGHTS[1]
    try:
        if st.exists():
            from safetensors.torch import load_file

            return load_file(str(st))
        if pt.exists():
            return torch.load(pt, map_location="cpu", weights_only=True)
    except Exception as e:  # a truncated or foreign file: say which
        raise InputError(f"{folder}: cannot read the weights ({e.__class__.__name__}: {e})") from None
    raise InputError(f"{folder}: no {WEIGHTS[0]} or {WEIGHTS[1]}")


# --------------------------------------------------------------------------------------------- loading
@dataclass
class MultiViewComponents:
    """The networks of an MVDream or ImageDream model (eval mode, no gradients).

    ``image_encoder`` (transformers' CLIPVisionModel, OpenCLIP ViT-H/14's vision tower) and
    ``feature_extractor`` (CLIPImageProcessor) are ImageDream's; None for MVDream.
    """

    unet: MultiViewUNet
    vae: nn.Module  # diffusers.AutoencoderKL
    text_encoder: nn.Module  # transformers.CLIPTextModel
    tokenizer: object  # transformers.CLIPTokenizer
    image_encoder: nn.Module | None = None
    feature_extractor: object | None = None

    def modules(self) -> list[nn.Module]:
        return [m for m in (self.unet, self.vae, self.text_encoder, self.image_encoder) if m is not None]

    def to(self, device, dtype: torch.dtype | None = None) -> MultiViewComponents:
        """Move every network to ``device`` and, where it differs, cast it to ``dtype``."""
        for m in self.modules():
            current = next(m.parameters()).dtype
            m.to(device=device, dtype=dtype if dtype is not None and dtype != current else None)
        return self


def load_components(
    path: str | os.PathLike,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    image_prompt: bool = False,
) -> MultiViewComponents:
    """Load a diffusers-format MVDream (or, with ``image_prompt``, ImageDream) folder, no network."""
    from diffusers import AutoencoderKL
    from diffusers.models.attention_processor import AttnProcessor2_0
    from transformers import CLIPTextModel, CLIPTokenizer

    path = Path(path)
    unet = MultiViewUNet.from_pretrained(path / "unet", dtype, device)
    if image_prompt and unet.config.ip_dim <= 0:
        raise InputError(
            f"{path}: its UNet has no image-prompt layers (ip_dim 0): an MVDream model, not ImageDream"
        )
    vae = AutoencoderKL.from_pretrained(path / "vae", torch_dtype=dtype, local_files_only=True)
    vae.set_attn_processor(AttnProcessor2_0())
    text_encoder = CLIPTextModel.from_pretrained(path / "text_encoder", dtype=dtype, attn_implementation="sdpa",
                                                 local_files_only=True)  # fmt: skip
    tokenizer = CLIPTokenizer.from_pretrained(path / "tokenizer", local_files_only=True)
    image_encoder = feature_extractor = None
    if image_prompt:
        from transformers import CLIPVisionModel

        from microdreamer.priors.zero123 import clip_image_processor_class

        CLIPImageProcessor = clip_image_processor_class()
        image_encoder = CLIPVisionModel.from_pretrained(path / "image_encoder", dtype=dtype, attn_implementation="sdpa",
                                                        local_files_only=True)  # fmt: skip
        feature_extractor = CLIPImageProcessor.from_pretrained(
            path / "feature_extractor", local_files_only=True
        )
    comps = MultiViewComponents(unet, vae, text_encoder, tokenizer, image_encoder, feature_extractor)
    for m in comps.modules():
        m.eval().requires_grad_(False)
    return comps.to(device)


# ----------------------------------------------------------------------------------------------- prior
class _UNetRunner:
    """Calls the multi-view UNet with a fixed number of views per group (eagerly or from CUDA graphs)
    and counts its calls."""

    def __init__(self, unet: MultiViewUNet, frames: int, use_graphs: bool) -> None:
        self.frames = frames
        self.call = _GraphedCall(
            lambda x, ts, ctx, cam: unet(x, ts, ctx, cam, num_frames=frames), use_graphs, "multi-view UNet"
        )
        self.calls = 0
        self.samples = 0

    @property
    def graphs(self) -> dict:
        return self.call.graphs

    def __call__(self, x: torch.Tensor, t: int, context: torch.Tensor, camera: torch.Tensor) -> torch.Tensor:
        """eps [B, 4, h, w] (UNet dtype) for x [B, 4, h, w] at timestep t, context [B, M, D], camera [B, 16]."""
        self.calls += 1
        self.samples += x.shape[0]
        ts = torch.full((x.shape[0],), float(t), device=x.device)
        return self.call(x, ts, context, camera)


class MVDreamPrior(Prior):
    """MVDream refining C = G x F renders into C targets (groups of F views attend to each other):
    MicroDreamer's hybrid forward process (noise to t1, DDIM inversion t1 -> t2 with the unconditional
    prediction) then DDIM sampling t2 -> 0 with classifier-free guidance.

    Call :meth:`set_prompt` before :meth:`refine`. The text embeddings of the prompt and the negative
    prompt are computed there, once.

    Args:
        components: the networks (:func:`load_components` or the random factory).
        config: :class:`MVDreamConfig` (its ``model`` only names the model here).
        device: where to run; the networks are moved there in the config's dtype.
    """

    kind = "MVDream"
    subfolders = SUBFOLDERS
    image_prompt = False  # ImageDream: True

    def __init__(
        self, components: MultiViewComponents, config: MVDreamConfig | None = None, device="cpu"
    ) -> None:
        self.config = config or MVDreamConfig()
        self.device = torch.device(device)
        self.dtype = resolve_dtype(self.config.dtype, self.device)
        self.nets = components.to(self.device, self.dtype)
        for m in self.nets.modules():
            m.eval().requires_grad_(False)
        if self.nets.unet.config.camera_dim is None:
            raise ValueError("the multi-view UNet has no camera embedding (camera_dim None)")
        self.image_size = self.config.image_size
        self.frames = self.config.frames
        self.ddim = DDIMRoundTrip(self.config.ddim)
        on_cuda = self.device.type == "cuda"

        def fmt(on: bool) -> torch.memory_format:
            return torch.channels_last if on_cuda and on else torch.contiguous_format

        self.nets.unet.to(memory_format=fmt(self.config.channels_last))
        self.nets.vae.to(memory_format=fmt(self.config.vae_channels_last))
        self.nets.unet.set_fused(self.config.fused_group_norm and on_cuda)
        fuse_ops(self.nets.vae, self.config.fused_group_norm and on_cuda)
        graphs = self.config.cuda_graphs and on_cuda
        self.unet = _UNetRunner(self.nets.unet, self._unet_frames, graphs)
        self.codec = LatentCodec(self.nets.vae, self.dtype, self.image_size, graphs, self.config.latents)
        self.vae_factor = self.codec.factor
        self.text_embeddings: torch.Tensor | None = None  # [2, 77, D]: prompt, negative prompt
        self.reference: Reference | None = None

    @property
    def _unet_frames(self) -> int:
        return self.frames

    @classmethod
    def from_pretrained(cls, config: MVDreamConfig | None = None, device="cpu"):
        """Load ``config.model`` (a folder or a cached repo id; never the network)."""
        config = config or cls._default_config()
        device = torch.device(device)
        path = resolve_model_path(config.model, config.hf_cache_dir, cls.subfolders, cls.kind)
        logger.info("loading %s from %s", cls.kind, path)
        comps = load_components(
            path, device, resolve_dtype(config.dtype, device), image_prompt=cls.image_prompt
        )
        return cls(comps, config, device)

    @staticmethod
    def _default_config() -> MVDreamConfig:
        return MVDreamConfig()

    # ------------------------------------------------------------------ conditioning
    @torch.no_grad()
    def encode_text(self, prompts: list[str]) -> torch.Tensor:
        """[N, 77, D] text tokens (the text encoder's last hidden state: OpenCLIP's penultimate layer
        after its final norm) of ``prompts``, padded to the tokenizer's length, in the UNet's dtype."""
        tok = self.nets.tokenizer
        ids = tok(prompts, padding="max_length", max_length=tok.model_max_length, truncation=True,
                  return_tensors="pt").input_ids  # fmt: skip
        out = self.nets.text_encoder(ids.to(self.device))
        return out.last_hidden_state.to(self.dtype)

    def set_prompt(self, prompt: str, negative_prompt: str | None = None) -> None:
        """Embed the prompt and the negative prompt (None: the config's), once per generation."""
        negative = self.config.negative_prompt if negative_prompt is None else negative_prompt
        self.text_embeddings = self.encode_text([prompt, negative])
        self.prompt, self.negative_prompt = prompt, negative

    def set_reference(self, reference: Reference, generator: torch.Generator | None = None) -> None:
        """MVDream is text-only: the reference is kept (for its camera) but conditions nothing."""
        self.reference = reference

    def ddim_grid(self) -> DDIMConfig:
        """See :meth:`Prior.ddim_grid`: the SIR round trip's grid (``config.ddim``)."""
        return self.config.ddim

    def camera(self, views: OrbitViews) -> torch.Tensor:
        """[C, 16] camera inputs (:func:`camera_matrices`) on the prior's device, in its dtype."""
        return camera_matrices(views).to(self.device, self.dtype)

    # ------------------------------------------------------------------ latents
    @torch.no_grad()
    def encode(self, images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """[C, 3, H, W] in [0, 1] -> [C, 4, S/8, S/8] float32 scaled latents (the posterior's sample from
        ``generator``, or its mode: ``config.latents``)."""
        return self.codec.encode(images, generator)

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """[C, 4, h, w] scaled latents -> [C, 3, S, S] float32 images in [0, 1]."""
        return self.codec.decode(latents)

    # ------------------------------------------------------------------ noise predictions
    def _contexts(self) -> tuple[torch.Tensor, torch.Tensor]:
        """([1, M, D] conditional, [1, M, D] unconditional) cross-attention tokens of every view."""
        if self.text_embeddings is None:
            raise RuntimeError(f"{type(self).__name__}.set_prompt must be called before refine")
        return self.text_embeddings[:1], self.text_embeddings[1:]

    def _branch(self, x: torch.Tensor, camera: torch.Tensor, context: torch.Tensor, conditional: bool):
        """UNet inputs of one branch: (latents [B, 4, h, w], camera [B, 16], context [B, M, D]) for
        C views' latents x (float32) and cameras [C, 16]."""
        B = x.shape[0]
        return x.to(self.dtype), camera, context.expand(B, -1, -1).contiguous()

    def _prediction(self, out: torch.Tensor) -> torch.Tensor:
        """The C views' noise predictions [C, 4, h, w] of one branch's UNet output."""
        return out

    def _eps_guided(self, camera: torch.Tensor):
        """eps(x, t) = uncond + scale * (cond - uncond), both branches in one batch of 2 x groups."""
        cond_ctx, uncond_ctx = self._contexts()
        scale = self.config.guidance_scale

        def eps(x: torch.Tensor, t: int) -> torch.Tensor:
            xc, cc, kc = self._branch(x, camera, cond_ctx, True)
            xu, cu, ku = self._branch(x, camera, uncond_ctx, False)
            out = self.unet(torch.cat([xc, xu]), t, torch.cat([kc, ku]), torch.cat([cc, cu])).float()
            cond, uncond = (self._prediction(o) for o in out.chunk(2))
            return uncond + scale * (cond - uncond)

        return eps

    def _eps_unconditional(self, camera: torch.Tensor):
        """eps(x, t) of the unconditional branch alone (the DDIM inversion's)."""
        _, uncond_ctx = self._contexts()

        def eps(x: torch.Tensor, t: int) -> torch.Tensor:
            xu, cu, ku = self._branch(x, camera, uncond_ctx, False)
            return self._prediction(self.unet(xu, t, ku, cu).float())

        return eps

    # ------------------------------------------------------------------ refine
    @torch.no_grad()
    def refine(self, images, views, t_stop, generator=None) -> torch.Tensor:
        """See :meth:`Prior.refine`; C = len(views) must be a multiple of ``config.frames`` (consecutive
        views form a group); ``generator`` must live on the prior's device."""
        C = len(views)
        if C % self.frames:
            raise ValueError(f"{self.kind} refines groups of {self.frames} views; got {C} views")
        out_size = images.shape[-2:] if images is not None else (self.image_size, self.image_size)
        if images is None:  # nothing rendered yet: pure noise from the top of the grid, whatever t_stop
            t1, t2 = None, self.ddim.timesteps[0]
        else:
            t1, t2 = self.ddim.plan(t_stop, self.config.inversion_ratio)
            if t2 is None:  # t_stop below the first grid timestep: nothing to refine
                return images.float().clamp(0, 1)
        self._contexts()  # fail early without a prompt
        camera = self.camera(views)
        h = w = self.image_size // self.vae_factor
        if t1 is None:
            x = torch.randn(C, 4, h, w, generator=generator, device=self.device, dtype=torch.float32)
        else:
            x = self.ddim.add_noise(self.encode(images, generator), t1, generator)
            x = self.ddim.invert(x, t1, t2, self._eps_unconditional(camera))
        x0 = self.ddim.denoise(x, t2, self._eps_guided(camera), self.config.eta, generator)
        targets = self.decode(x0)
        if tuple(targets.shape[-2:]) != tuple(out_size):
            targets = F.interpolate(targets, tuple(out_size), mode="bilinear", align_corners=False)
        return targets

    @torch.no_grad()
    def warmup(self, views: int) -> None:
        """Run every network once at the shapes of a ``views``-view refinement and capture the UNet's
        CUDA graphs (both branches, and the unconditional one alone), so the first iteration is not
        slower than the others. Needs :meth:`set_prompt` first (ImageDream warms up on a placeholder
        reference when none is set). No-op on the CPU."""
        if self.device.type != "cuda":
            return
        self.run_warmup_calls(views)
        torch.cuda.synchronize(self.device)
        self.unet.calls = self.unet.samples = 0
        self.codec.nonfinite.zero_()

    @torch.no_grad()
    def run_warmup_calls(self, views: int) -> None:
        """The calls of :meth:`warmup`, on any device: both UNet branches, the unconditional one, the
        VAE encoder and decoder, at the shapes of a ``views``-view refinement."""
        s = self.image_size
        g = OrbitViews(torch.zeros(views), torch.linspace(0, 360, views + 1)[:-1], 2.5)
        camera = self.camera(g)
        x = torch.randn(views, 4, s // self.vae_factor, s // self.vae_factor, device=self.device)
        self._eps_guided(camera)(x, 501)
        self._eps_unconditional(camera)(x, 501)
        self.decode(self.encode(torch.rand(views, 3, s, s, device=self.device)))

    def stats(self) -> dict:
        """UNet calls and samples since the warm-up, captured graphs, and non-finite decoded values
        (replaced by white; nonzero means the model or its precision misbehaves)."""
        bad = int(self.codec.nonfinite)
        if bad:
            logger.warning("%s decoded %d non-finite values (replaced by white)", self.kind, bad)
        return {
            "unet_calls": self.unet.calls,
            "unet_samples": self.unet.samples,
            "cuda_graphs": len(self.unet.graphs),
            "nonfinite_values": bad,
        }
