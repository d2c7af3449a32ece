"""Fused operations of the Zero123 networks as Triton kernels, and the patch that puts them into
diffusers' UNet and VAE (:func:`fuse_ops`): group normalisation (optionally with a
per-sample channel bias added first and SiLU after) for channels-last CUDA tensors, and GEGLU.

Why: the Zero123 UNet runs channels-last (NHWC: its convolutions are faster so), but PyTorch's
GroupNorm has no channels-last CUDA kernel: each of the UNet's 61 GroupNorms copies its input to
NCHW, normalises, copies back, and SiLU and the time-embedding add are more passes. On the H200 these
copies and passes were ~30% of a guided UNet call's kernel time (benchmarks/README.md, generate).

The kernels, for x [B, C, *spatial] whose channel stride is 1 (L = prod(spatial) positions, G groups
of C / G channels):

1. ``_moments``: grid (B, S), S ~ 1024 / B; each program sums ``x - k`` and its square per channel
   over its share of the L positions, k being the channel's value at position 0 (a shift that keeps
   the sums of squares well conditioned; the channel bias cancels out of them); partial sums
   [B, S, 2, C] in float32.
2. ``_finalize``: grid (B, G); per channel of the group: mean (k + bias + sum / L) and sum of squared
   deviations, then Chan's parallel combination over the group's channels: mean [B, G] and
   1 / sqrt(var + eps) [B, G] (float32, biased variance, as torch.nn.GroupNorm).
3. ``_apply``: grid (B, L / BLOCK_L); y = act((x + bias - mean_g) * rstd_g * weight + beta).

Also here: GEGLU (the transformer blocks' feed-forward gate, ``a * gelu(g)`` of the two halves of a
projection) in one kernel instead of three passes (:func:`geglu`).

The reference is :func:`group_norm_reference` (``torch.nn.functional.group_norm``); anything the
kernels do not take (CPU tensors, other layouts, no Triton) goes there.
"""

from __future__ import annotations

import importlib.util
import os
import types

import torch
import torch.nn.functional as F

ACTIVATIONS = (None, "silu")
_MOMENT_PROGRAMS = 1024  # programs of the moments kernel (all samples; ~8 per SM of an H200)
_TILE = 4096  # elements per loop step of the moments kernel and per program of the apply kernel
_GEGLU_BLOCK = 1024

# Triton comes with CUDA builds of PyTorch; without it everything takes the reference path
_HAS_TRITON = importlib.util.find_spec("triton") is not None
_INTERPRET = _HAS_TRITON and os.environ.get("TRITON_INTERPRET") == "1"


def group_norm_reference(
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    channel_bias: torch.Tensor | None = None,
    activation: str | None = None,
) -> torch.Tensor:
    """act(group_norm(x + channel_bias)) with PyTorch ops: x [B, C, *spatial], channel_bias [B, C] or None,
    weight / bias [C] or None, activation None or "silu"."""
    if channel_bias is not None:
        x = x + channel_bias.reshape(*channel_bias.shape, *([1] * (x.dim() - 2)))
    y = F.group_norm(x, num_groups, weight, bias, eps)
    return F.silu(y) if activation == "silu" else y


def _channels_last_rows(x: torch.Tensor) -> bool:
    """Whether x [B, C, *spatial] is laid out as [B, L, C] rows (channel stride 1, positions dense)."""
    if x.dim() < 3:
        return False
    perm = (0, *range(2, x.dim()), 1)
    return x.permute(*perm).is_contiguous()


def fused_available(x: torch.Tensor) -> bool:
    """Whether :func:`group_norm` runs ``x`` on the Triton kernels (else on the reference). With
    ``TRITON_INTERPRET=1`` set before import, CPU tensors run the kernels in Triton's interpreter
    (how the kernels are tested on a machine without a GPU)."""
    return (
        _HAS_TRITON
        and (x.is_cuda or _INTERPRET)
        and x.dtype in (torch.float16, torch.bfloat16, torch.float32)
        and _channels_last_rows(x)
        and x.numel() > 0
    )


def group_norm(
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    channel_bias: torch.Tensor | None = None,
    activation: str | None = None,
) -> torch.Tensor:
    """act(group_norm(x + channel_bias)) in one pass over x for statistics and one for the output.

    Args:
        x: [B, C, *spatial] float16, bfloat16 or float32; the kernels need it channels-last (channel
            stride 1, positions dense: ``torch.channels_last`` for 4-D); otherwise the reference runs.
        num_groups: G, dividing C.
        weight, bias: [C] affine parameters or None.
        eps: added to the variance.
        channel_bias: [B, C] added to x before normalising (the ResNet block's time embedding) or None.
        activation: None or "silu".

    Returns:
        Tensor like x (same shape, dtype and layout). Statistics are accumulated in float32.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    B, C = x.shape[:2]
    if C % num_groups:
        raise ValueError(f"num_groups {num_groups} does not divide {C} channels")
    if not fused_available(x):
        return group_norm_reference(x, num_groups, weight, bias, eps, channel_bias, activation)
    import triton

    from microdreamer.priors._fused_triton import _apply, _finalize, _moments

    L = x[0, 0].numel()
    G = num_groups
    BLOCK_C = triton.next_power_of_2(C)
    BLOCK_L = max(1, _TILE // BLOCK_C)
    split = max(1, min(triton.cdiv(_MOMENT_PROGRAMS, B), triton.cdiv(L, BLOCK_L)))
    rows_per_split = triton.cdiv(triton.cdiv(L, split), BLOCK_L) * BLOCK_L
    split = triton.cdiv(L, rows_per_split)
    cpg = C // G
    # one finalize kernel for every group size up to 128 channels (fewer compiled variants)
    BLOCK_J = max(128, triton.next_power_of_2(cpg))
    BLOCK_S = 8
    dev = x.device
    partial = torch.empty(B, split, 2, C, device=dev, dtype=torch.float32)
    stats = torch.empty(B, 2, G, device=dev, dtype=torch.float32)
    y = torch.empty_like(x)  # same strides: channels-last rows
    has_cb = channel_bias is not None
    cb = channel_bias.contiguous() if has_cb else x  # a dummy pointer when absent
    if has_cb and tuple(cb.shape) != (B, C):
        raise ValueError(f"channel_bias must be [{B}, {C}], got {tuple(cb.shape)}")
    w = weight if weight is not None else x
    b = bias if bias is not None else x
    _moments[(B, split)](x, partial, L, C, rows_per_split, split, BLOCK_L=BLOCK_L, BLOCK_C=BLOCK_C)
    _finalize[(B, G)](x, cb, partial, stats, L, C, G, cpg, split, eps, int(has_cb), BLOCK_S=BLOCK_S,
                      BLOCK_J=BLOCK_J)  # fmt: skip
    _apply[(B, triton.cdiv(L, BLOCK_L))](x, cb, stats, w, b, y, L, C, G, cpg, int(has_cb), int(weight is not None),
                                         int(bias is not None), int(activation == "silu"), BLOCK_L=BLOCK_L,
                                         BLOCK_C=BLOCK_C)  # fmt: skip
    return y


def geglu_reference(h: torch.Tensor) -> torch.Tensor:
    """a * gelu(g) (exact GELU) for h [..., 2D] = [a, g] -> [..., D], as diffusers' GEGLU."""
    a, g = h.chunk(2, dim=-1)
    return a * F.gelu(g)


def geglu(h: torch.Tensor) -> torch.Tensor:
    """:func:`geglu_reference` in one kernel for contiguous CUDA tensors (GELU evaluated in float32;
    the reference evaluates it in h's dtype); others take the reference."""
    if not (_HAS_TRITON and (h.is_cuda or _INTERPRET) and h.is_contiguous() and h.numel() > 0):
        return geglu_reference(h)
    if h.shape[-1] % 2:
        raise ValueError(f"geglu needs an even last dimension, got {h.shape[-1]}")
    import triton

    from microdreamer.priors._fused_triton import _geglu

    D = h.shape[-1] // 2
    y = torch.empty(*h.shape[:-1], D, device=h.device, dtype=h.dtype)
    total = y.numel()
    _geglu[(triton.cdiv(total, _GEGLU_BLOCK),)](h, y, total, D, BLOCK=_GEGLU_BLOCK)
    return y


# ------------------------------------------------------------------------------------ diffusers patch
class FusedGroupNorm(torch.nn.GroupNorm):
    """``torch.nn.GroupNorm`` (same parameters and state dict) computed by :func:`group_norm`, with an
    optional activation folded in (``activation``: None or "silu")."""

    activation: str | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return group_norm(x, self.num_groups, self.weight, self.bias, self.eps, activation=self.activation)


def _plain_group_norm(m) -> bool:
    return type(m) is torch.nn.GroupNorm


def _resnet_forward(self, input_tensor: torch.Tensor, temb: torch.Tensor | None, *args, **kwargs):
    """diffusers' ResnetBlock2D.forward for blocks :func:`_fusable_resnet` accepts: both norms with
    their SiLU in one call each; the time embedding and conv1's bias added inside the second norm."""
    n1, n2 = self.norm1, self.norm2
    h = group_norm(input_tensor, n1.num_groups, n1.weight, n1.bias, n1.eps, activation="silu")
    channel_bias = None
    if self.time_emb_proj is not None and temb is not None:
        channel_bias = self.time_emb_proj(temb if self.skip_time_act else F.silu(temb))
    if fused_available(h) and self.conv1.bias is not None:  # conv1's bias goes into norm2's channel bias
        c1 = self.conv1
        h = c1._conv_forward(h, c1.weight, None)
        channel_bias = c1.bias.expand(h.shape[0], -1) if channel_bias is None else channel_bias + c1.bias
    else:
        h = self.conv1(h)
    h = group_norm(h, n2.num_groups, n2.weight, n2.bias, n2.eps, channel_bias=channel_bias, activation="silu")
    h = self.conv2(self.dropout(h))
    x = self.conv_shortcut(input_tensor) if self.conv_shortcut is not None else input_tensor
    return (x + h) / self.output_scale_factor


def _geglu_forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """diffusers' GEGLU.forward with the gate in one kernel (:func:`geglu`)."""
    return geglu(self.proj(hidden_states))


def _fusable_resnet(m) -> bool:
    """A diffusers ResnetBlock2D whose forward :func:`_resnet_forward` reproduces exactly."""
    return (
        type(m).__name__ == "ResnetBlock2D"
        and getattr(m, "upsample", None) is None
        and getattr(m, "downsample", None) is None
        and getattr(m, "time_embedding_norm", None) == "default"
        and isinstance(getattr(m, "nonlinearity", None), torch.nn.SiLU)
        and _plain_group_norm(getattr(m, "norm1", None))
        and _plain_group_norm(getattr(m, "norm2", None))
    )


def fuse_ops(model: torch.nn.Module, enable: bool = True) -> int:
    """Route a diffusers UNet's or VAE's group norms through :func:`group_norm` and its GEGLU gates
    through :func:`geglu` (``enable``), or back to PyTorch's (``enable=False``); idempotent both
    ways. Outputs are unchanged up to rounding.

    Patched: every GEGLU; every ResnetBlock2D without its own up/down-sampling and with the "default"
    time embedding (norm + SiLU twice, the time embedding and conv1's bias added inside the second
    norm); every
    ``conv_norm_out`` followed by a SiLU ``conv_act`` (the SiLU folded into the norm); every other
    ``torch.nn.GroupNorm`` (transformer and attention input norms) as a plain norm. The kernels run
    only on channels-last CUDA tensors; anything else takes PyTorch's path inside the same modules.

    Returns:
        How many modules were patched (or restored).
    """
    count = 0
    for m in model.modules():
        if type(m).__name__ == "GEGLU" and isinstance(getattr(m, "proj", None), torch.nn.Linear):
            if enable and "forward" not in vars(m):
                m.forward = types.MethodType(_geglu_forward, m)
                count += 1
            elif not enable and "forward" in vars(m):
                del m.forward
                count += 1
        if type(m).__name__ == "ResnetBlock2D":
            if enable and _fusable_resnet(m) and "forward" not in vars(m):
                m.forward = types.MethodType(_resnet_forward, m)
                count += 1
            elif not enable and "forward" in vars(m):
                del m.forward
                count += 1
        act = getattr(m, "_md_conv_act", None)
        norm = getattr(m, "conv_norm_out", None)
        if (
            enable
            and act is None
            and _plain_group_norm(norm)
            and isinstance(getattr(m, "conv_act", None), torch.nn.SiLU)
        ):
            m._md_conv_act = m.conv_act
            m.conv_act = torch.nn.Identity()
            norm.__class__ = FusedGroupNorm
            norm.activation = "silu"
            count += 1
        elif not enable and act is not None:
            m.conv_act = act
            del m._md_conv_act
            norm.__class__ = torch.nn.GroupNorm
            del norm.activation
            count += 1
    for m in model.modules():  # the remaining plain norms (not those inside patched ResNet blocks' forward)
        if enable and _plain_group_norm(m):
            m.__class__ = FusedGroupNorm
            count += 1
        elif not enable and type(m) is FusedGroupNorm:
            m.__class__ = torch.nn.GroupNorm
            if "activation" in vars(m):
                del m.activation
            count += 1
    return count
