"""The fused Zero123 operations (Triton kernels): the channels-last group norm against
torch.nn.functional.group_norm and GEGLU against a * gelu(g), both in float64, and their patch of
diffusers' UNet and VAE against the unpatched networks.

The kernels run on CUDA (tests marked ``cuda``) and, where Triton is installed, also on the CPU in
Triton's interpreter (a subprocess with TRITON_INTERPRET=1)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from microdreamer.priors.fused import (
    fused_available,
    geglu,
    geglu_reference,
    group_norm,
    group_norm_reference,
)

# (B, C, spatial, groups): the UNet's and VAE's shapes at small sizes, odd channel counts per group
# (10, 20, 40 as in Stable Diffusion's 320/640/1280), positions that do not fill a tile, one position
SHAPES = [
    ((2, 320, (8, 8)), 32),
    ((3, 40, (5, 7)), 4),
    ((1, 1280, (4, 4)), 32),
    ((2, 128, (33, 31)), 32),
    ((2, 12, (1, 1)), 3),  # one position (Triton specialises the integer 1)
    ((2, 4, (6, 5)), 4),  # one channel per group
    ((2, 64, (300,)), 32),  # [B, C, L]: the VAE attention's input (a transposed [B, L, C])
]
FP32_TOL = 2e-6  # relative L2 error vs float64; float32 sums over at most ~10^4 values per partial


def _case(shape, dtype, device, seed, offset=5.0):
    """Channels-last input with a large common offset (stresses the variance computation), affine
    parameters, a per-sample channel bias."""
    (B, C, spatial) = shape
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(B, *spatial, C, generator=g) * 3 + offset  # rows of C: channels-last memory
    x = x.movedim(-1, 1)
    w, b = torch.randn(C, generator=g), torch.randn(C, generator=g)
    cb = torch.randn(B, C, generator=g)
    return [t.to(device=device, dtype=dtype) for t in (x, w, b, cb)]


def _check(device: str, dtype: torch.dtype, tol: float) -> None:
    for i, (shape, G) in enumerate(SHAPES):
        for act in (None, "silu"):
            for with_cb in (False, True):
                x, w, b, cb = _case(shape, dtype, device, seed=10 * i + with_cb)
                if i == 1:  # no affine parameters
                    w = b = None
                assert fused_available(x), shape
                y = group_norm(x, G, w, b, 1e-5, cb if with_cb else None, act)
                ref = group_norm_reference(x.double(), G, None if w is None else w.double(),
                                           None if b is None else b.double(), 1e-5,
                                           cb.double() if with_cb else None, act)  # fmt: skip
                assert y.dtype == x.dtype and y.shape == x.shape and y.stride() == x.stride()
                assert torch.isfinite(y).all()
                err = float((y.double() - ref).norm() / ref.norm())
                assert err < tol, (shape, G, act, with_cb, dtype, err)


GEGLU_SHAPES = [(3, 7, 10), (2, 300, 640), (1, 1, 2)]  # [..., 2D]


def _check_geglu(device: str, dtype: torch.dtype, tol: float) -> None:
    for i, shape in enumerate(GEGLU_SHAPES):
        g = torch.Generator(device="cpu").manual_seed(100 + i)
        h = (torch.randn(*shape, generator=g) * 2).to(device, dtype)
        y = geglu(h)
        ref = geglu_reference(h.double())
        assert y.dtype == dtype and y.shape == ref.shape and torch.isfinite(y).all()
        err = float((y.double() - ref).norm() / ref.norm())
        assert err < tol, (shape, dtype, err)


def test_reference_is_torch_group_norm_plus_bias_and_silu():
    x, w, b, cb = _case((2, 12, (3, 4)), torch.float64, "cpu", seed=1)
    want = torch.nn.functional.silu(torch.nn.functional.group_norm(x + cb[:, :, None, None], 3, w, b, 1e-6))
    torch.testing.assert_close(group_norm_reference(x, 3, w, b, 1e-6, cb, "silu"), want, rtol=0, atol=0)


def test_geglu_reference_is_diffusers_geglu():
    pytest.importorskip("diffusers", reason="diffusers' GEGLU")
    from diffusers.models.activations import GEGLU

    from microdreamer.priors.fused import fuse_ops

    m = GEGLU(6, 5).eval()
    x = torch.randn(2, 3, 6, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = m(x)
        assert torch.equal(geglu_reference(m.proj(x)), want)
        wrapper = torch.nn.Sequential(m)
        assert fuse_ops(wrapper) == 1 and "forward" in vars(m)
        torch.testing.assert_close(m(x), want, rtol=0, atol=0)  # CPU: the reference path
        fuse_ops(wrapper, enable=False)
        assert "forward" not in vars(m)


def test_cpu_and_non_channels_last_inputs_take_the_reference_path():
    x, w, b, cb = _case((2, 12, (3, 4)), torch.float32, "cpu", seed=2)
    if not os.environ.get("TRITON_INTERPRET"):
        assert not fused_available(x)
    nchw = x.contiguous()
    assert not fused_available(nchw)
    got = group_norm(nchw, 4, w, b, 1e-5, cb, "silu")
    torch.testing.assert_close(got, group_norm_reference(nchw, 4, w, b, 1e-5, cb, "silu"), rtol=0, atol=0)
    with pytest.raises(ValueError, match="activation"):
        group_norm(nchw, 4, activation="gelu")
    with pytest.raises(ValueError, match="divide"):
        group_norm(nchw, 5)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
def test_kernels_in_the_triton_interpreter():
    """The three kernels on the CPU through Triton's interpreter (float32 and float16), alone and
    inside the patched tiny networks."""
    code = textwrap.dedent(
        f"""
        import importlib.util, torch
        spec = importlib.util.spec_from_file_location("fused_tests", {str(Path(__file__))!r})
        t = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(t)
        t._check("cpu", torch.float32, t.FP32_TOL)
        t._check("cpu", torch.float16, 1e-3)
        t._check_geglu("cpu", torch.float32, t.FP32_TOL)
        t._patched_vs_plain("cpu", torch.float32, 1e-5)  # the patched tiny networks on the kernels
        """
    )
    env = dict(os.environ, TRITON_INTERPRET="1")
    # no timer: a busy machine must not fail it; CI's own limit bounds a hang
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.mark.cuda
@pytest.mark.parametrize(
    "dtype, tol",
    [
        (torch.float32, FP32_TOL),
        (torch.float16, 1e-3),  # output rounding: half an ulp of float16 is 2^-11 ~ 4.9e-4 relative
        (torch.bfloat16, 8e-3),  # half an ulp of bfloat16 is 2^-8 ~ 3.9e-3 relative
    ],
)
def test_kernels_match_float64_reference_on_cuda(dtype, tol):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    _check("cuda", dtype, tol)
    _check_geglu("cuda", dtype, tol)


@pytest.mark.cuda
def test_kernels_large_sample_on_cuda():
    """The VAE decoder's largest norm: 256^2 positions x 128 channels (many partial sums per sample)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    x, w, b, _ = _case((2, 128, (256, 256)), torch.float32, "cuda", seed=7, offset=20.0)
    y = group_norm(x, 32, w, b, 1e-6, None, "silu")
    ref = group_norm_reference(x.double(), 32, w.double(), b.double(), 1e-6, None, "silu")
    assert float((y.double() - ref).norm() / ref.norm()) < 1e-5


# ----------------------------------------------------------------------------------- diffusers patch
def _tiny_nets():
    pytest.importorskip("diffusers", reason="the Zero123 networks need diffusers")
    pytest.importorskip("transformers", reason="the Zero123 networks need transformers")
    from microdreamer.priors.factory import build_random_zero123

    return build_random_zero123("tiny", seed=6)


def _outputs(nets, device, dtype, memory_format):
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(3, 8, 8, 8, generator=g).to(device, dtype).contiguous(memory_format=memory_format)
    ctx = torch.randn(3, 1, 32, generator=g).to(device, dtype)
    imgs = (torch.rand(3, 3, 64, 64, generator=g) * 2 - 1).to(device, dtype)
    imgs = imgs.contiguous(memory_format=memory_format)
    t = torch.full((3,), 451.0, device=device)
    with torch.no_grad():
        eps = nets.unet(x, t, encoder_hidden_states=ctx).sample
        lat = nets.vae.encode(imgs).latent_dist.mode()
        dec = nets.vae.decode(lat.contiguous(memory_format=memory_format)).sample
    return eps.float(), lat.float(), dec.float()


def _patched_vs_plain(device, dtype, tol):
    from microdreamer.priors.fused import FusedGroupNorm, fuse_ops

    nets = _tiny_nets().to(device, dtype)
    fmt = torch.channels_last
    for net in (nets.unet, nets.vae):
        net.to(memory_format=fmt)
    plain = _outputs(nets, device, dtype, fmt)
    counts = [fuse_ops(net) for net in (nets.unet, nets.vae)]
    assert all(c > 0 for c in counts)
    assert any(type(m) is FusedGroupNorm for m in nets.vae.modules())
    assert any("forward" in vars(m) for m in nets.unet.modules() if type(m).__name__ == "ResnetBlock2D")
    assert any("forward" in vars(m) for m in nets.unet.modules() if type(m).__name__ == "GEGLU")
    assert fuse_ops(nets.unet) == 0  # idempotent
    fused = _outputs(nets, device, dtype, fmt)
    for a, b in zip(fused, plain, strict=True):
        err = float((a - b).norm() / b.norm())
        assert err < tol, err
    for net in (nets.unet, nets.vae):
        fuse_ops(net, enable=False)
    assert not any(type(m) is FusedGroupNorm for m in nets.modules())
    assert not any("forward" in vars(m) for m in nets.modules())
    back = _outputs(nets, device, dtype, fmt)
    for a, b in zip(back, plain, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_patched_networks_match_unpatched_on_cpu():
    """On the CPU the patched modules take PyTorch's path: the patched ResNet forward and the SiLU
    folded into conv_norm_out give the unpatched networks' outputs (float32 rounding)."""
    _patched_vs_plain("cpu", torch.float32, 1e-5)


@pytest.mark.cuda
def test_patched_networks_match_unpatched_on_cuda():
    """On the GPU the patched networks run the kernels: float16 UNet and VAE outputs agree with the
    unpatched ones to float16 rounding accumulated through the networks."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    # float32 without TF32 (cuDNN's default allows it: 1e-3-level differences between algorithms)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            _patched_vs_plain("cuda", torch.float32, 1e-4)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = tf32
    _patched_vs_plain("cuda", torch.float16, 1e-2)
