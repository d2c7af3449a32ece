"""The lean training step against the way it was written before (same maths, fewer launches).

* CPU: the trainer's step (image gradients written out, composited targets cached, the leaner
  densification statistics, no depth channel) against the step through the autograd loss
  (:meth:`GaussianTrainer.loss`) and the previous statistics formula, both written out below; a
  render without depth against one with depth.
* CUDA: the direct gsplat path (:func:`render_gsplat`) against ``gsplat.rasterization`` with the
  previous arguments, forward and backward, and a few trainer steps against the previous path.
"""

from __future__ import annotations

import pytest
import torch

from microdreamer.cameras import orbit_cameras
from microdreamer.render import render
from microdreamer.splat import Splat
from microdreamer.synthetic import near_far_cameras, random_sh_splat
from microdreamer.train import GaussianTrainer, TrainConfig, random_ball_splat
from microdreamer.train.densify import DensifyStats, reset_opacity

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


# ------------------------------------------------------------------ the previous formulations
def accumulate_reference(stats: DensifyStats, g: torch.Tensor, radii: torch.Tensor, width: int, height: int):
    """DensifyStats.accumulate as it was written before."""
    scale = torch.tensor([0.5 * width, 0.5 * height], dtype=g.dtype, device=g.device)
    norm = (g * scale).norm(dim=-1)
    vis = (radii > 0).all(-1)
    stats.grad_sum += (norm * vis).sum(0).to(stats.grad_sum.dtype)
    stats.count += vis.sum(0).to(stats.count.dtype)
    r = (radii.max(-1).values * vis).amax(0).to(stats.max_radius.dtype)
    stats.max_radius = torch.maximum(stats.max_radius, r)


def reference_step(tr: GaussianTrainer, targets, cameras, background=None, rgb_weights=None,
                   alpha_weights=None, render_fn=None):  # fmt: skip
    """GaussianTrainer.step as it was written before: the loss through autograd (``tr.loss``), the
    previous statistics formula. The render is ``render(..., depth=False)`` (the depth channel is
    checked on its own below) unless ``render_fn(splat, cameras, bg, track)`` replaces it."""
    cfg = tr.config
    tr.iteration += 1
    it = tr.iteration
    for group in tr.optimizer.param_groups:
        if group["name"] == "means":
            group["lr"] = tr.position_lr(it)
    bg, _ = tr._backgrounds(background, len(cameras))
    track = tr.densifying(it)
    if render_fn is None:
        out = render(
            tr.splat, cameras, background=bg, backend=tr.backend, retain_means2d_grad=track, depth=False
        )
    else:
        out = render_fn(tr.splat, cameras, bg, track)
    losses = tr.loss(out, targets, bg, rgb_weights, alpha_weights)
    losses["loss"].backward()
    if track and out.means2d.grad is not None:
        accumulate_reference(tr.stats, out.means2d.grad, out.radii, cameras.width, cameras.height)
    tr.optimizer.step()
    tr.optimizer.zero_grad(set_to_none=True)
    if track and it % cfg.densify_interval == 0:
        tr.densify_and_prune()
    if track and cfg.opacity_reset_interval > 0 and it % cfg.opacity_reset_interval == 0:
        tr.params = reset_opacity(tr.params, tr.optimizer, cfg.opacity_reset_value)
    return {k: v.detach() for k, v in losses.items()}


def rgba_targets(C: int, size: int, seed: int, device="cpu") -> torch.Tensor:
    """[C, S, S, 4] smooth random RGBA targets (alpha in [0, 1], some exactly 0 and 1)."""
    g = torch.Generator().manual_seed(seed)
    low = torch.rand(C, 4, 5, 5, generator=g)
    img = torch.nn.functional.interpolate(low, (size, size), mode="bilinear", align_corners=False)
    img[:, 3] = ((img[:, 3] - 0.3) * 2).clamp(0, 1)
    return img.permute(0, 2, 3, 1).contiguous().to(device)


# ------------------------------------------------------------------ CPU
def test_accumulate_matches_previous_formula():
    g = torch.Generator().manual_seed(0)
    C, N = 3, 301
    grad = torch.randn(C, N, 2, generator=g) * 1e-3
    radii = torch.randint(0, 9, (C, N, 2), generator=g, dtype=torch.int32)
    radii[0, :50] = 0  # culled in view 0
    radii[1, 50:60, 1] = 0  # one axis zero: not drawn
    new, ref = DensifyStats.zeros(N, "cpu"), DensifyStats.zeros(N, "cpu")
    for _ in range(3):  # accumulates across calls
        new.accumulate(grad, radii, 100, 60)
        accumulate_reference(ref, grad, radii, 100, 60)
        grad = grad.flip(0)
        radii = radii.roll(1, 0)
    # the same operations on the same values in the same order: equal to the bit
    for a, b in ((new.grad_sum, ref.grad_sum), (new.count, ref.count), (new.max_radius, ref.max_radius)):
        assert a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("alpha", [False, True])
def test_step_equals_autograd_loss_step(alpha):
    """The lean step against the previous one on the torch backend, densification, an opacity
    reset and random backgrounds included: every loss, parameter, Adam moment and statistic equal
    to the bit (the image gradients are what autograd computes for the loss, to the bit)."""
    S, C = 16, 3
    el, az = torch.tensor([-10.0, 20.0, 5.0]), torch.tensor([0.0, 120.0, 240.0])
    cams = orbit_cameras(el, az, width=S, height=S)
    targets = rgba_targets(C, S, seed=1) if alpha else rgba_targets(C, S, seed=1)[..., :3].contiguous()
    cfg = TrainConfig(num_pts=120, densify_start_iter=2, densify_end_iter=7, densify_interval=3,
                      densify_grad_threshold=0.0, opacity_reset_interval=5, random_background=alpha,
                      lambda_alpha=0.5 if alpha else 0.0, backend="torch")  # fmt: skip
    start = random_ball_splat(120, seed=2)
    new, ref = GaussianTrainer(start, cfg), GaussianTrainer(start, cfg)
    for _ in range(8):
        a = new.step(targets, cams)
        b = reference_step(ref, targets, cams)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert len(new) == len(ref) > 120  # densified twice
    for k in new.params:
        assert torch.equal(new.params[k], ref.params[k]), k
    for pa, pb in zip(new.optimizer.param_groups, ref.optimizer.param_groups, strict=True):
        sa, sb = new.optimizer.state[pa["params"][0]], ref.optimizer.state[pb["params"][0]]
        assert torch.equal(sa["exp_avg"], sb["exp_avg"]) and torch.equal(sa["exp_avg_sq"], sb["exp_avg_sq"])
    for k in ("grad_sum", "count", "max_radius"):
        assert torch.equal(getattr(new.stats, k), getattr(ref.stats, k)), k


def test_step_weights_and_cached_targets_follow_changes():
    """Per-view weights (SIR's), a fixed background tensor, and targets changed in place or swapped
    between steps: the cached composite must follow; every step equal to the previous step's."""
    S, C = 12, 2
    cams = orbit_cameras(torch.tensor([0.0, 15.0]), torch.tensor([30.0, 200.0]), width=S, height=S)
    cfg = TrainConfig(num_pts=60, densify_end_iter=0, backend="torch")
    start = random_ball_splat(60, seed=3)
    new, ref = GaussianTrainer(start, cfg), GaussianTrainer(start, cfg)
    white = torch.tensor([1.0, 1.0, 1.0])
    rgb_w, alpha_w = torch.tensor([0.5, 0.3]), torch.tensor([0.0, 0.01])
    targets = rgba_targets(C, S, seed=4)
    for i in range(6):
        if i == 2:
            targets[..., 3] = 1.0 - targets[..., 3]  # in place: the version counter moves
        if i == 3:
            white.fill_(0.5)  # the background too
        if i == 4:
            targets = rgba_targets(C, S, seed=5)  # a new tensor
        a = new.step(targets, cams, background=white, rgb_weights=rgb_w, alpha_weights=alpha_w)
        b = reference_step(ref, targets, cams, background=white, rgb_weights=rgb_w, alpha_weights=alpha_w)
        assert set(a) == {"loss", "rgb", "alpha"}
        assert all(torch.equal(a[k], b[k]) for k in a), (i, a, b)
    for k in new.params:
        assert torch.equal(new.params[k], ref.params[k]), k
    # a fixed config background is made on the device once and reused
    bg1, src1 = new._backgrounds(None, C)
    bg2, src2 = new._backgrounds(None, C)
    assert src1 is src2 and torch.equal(bg1, torch.ones(C, 3))


def test_render_without_depth_changes_nothing_else():
    """depth=False (3 composited channels instead of 4) on the torch backend: same images and
    gradients; the batched compositing sums per channel, so float64 agrees to rounding (1e-12)."""
    splat = random_sh_splat(40, seed=6, sh_degree=1, dtype=torch.float64)
    cams = near_far_cameras(21, 17, n=2)
    grads, outs = [], []
    for depth in (True, False):
        p = {k: v.clone().requires_grad_(True) for k, v in splat.tensors().items()}
        out = render(Splat(**p), cams, background=(0.2, 0.5, 0.9), backend="torch", depth=depth,
                     retain_means2d_grad=True)  # fmt: skip
        w = torch.linspace(-1, 1, out.rgb.numel(), dtype=torch.float64).reshape(out.rgb.shape)
        ((w * out.rgb).sum() + (out.alpha**2).sum()).backward()
        grads.append({k: v.grad for k, v in p.items()} | {"means2d": out.means2d.grad})
        outs.append(out)
    assert outs[1].depth is None and outs[0].depth is not None
    torch.testing.assert_close(outs[1].rgb, outs[0].rgb, rtol=0, atol=1e-12)
    torch.testing.assert_close(outs[1].alpha, outs[0].alpha, rtol=0, atol=1e-12)
    assert torch.equal(outs[1].radii, outs[0].radii)
    for k in grads[0]:
        if grads[0][k] is not None and grads[0][k].numel():
            torch.testing.assert_close(grads[1][k], grads[0][k], rtol=1e-10, atol=1e-12)


def test_empty_splat_step_does_not_fail():
    cams = orbit_cameras(torch.tensor([0.0]), torch.tensor([0.0]), width=8, height=8)
    splat = random_ball_splat(5, seed=0).subset(torch.zeros(5, dtype=torch.bool))
    trainer = GaussianTrainer(splat, TrainConfig(num_pts=1, backend="torch"))
    losses = trainer.step(torch.rand(1, 8, 8, 3), cams)
    assert torch.isfinite(losses["loss"]) and len(trainer) == 0


# ------------------------------------------------------------------ CUDA: gsplat
def _gsplat_cases():
    return [
        # (N, C, W, H, sh_degree, depth)
        (1, 1, 33, 31, 0, False),
        (3000, 4, 97, 80, 0, False),
        (3000, 4, 97, 80, 0, True),
        (3000, 3, 64, 64, 1, False),
        (3000, 4, 97, 80, 3, True),
        (20000, 7, 256, 256, 0, False),  # the SIR training render
    ]


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("case", _gsplat_cases(), ids=lambda c: "N{}-C{}-{}x{}-sh{}-depth{}".format(*c))
def test_gsplat_direct_matches_rasterization(case):
    """The direct path against ``gsplat.rasterization`` with the previous arguments ("RGB+ED", or
    "RGB" without depth): forward and every gradient, incl. the view-space one."""
    pytest.importorskip("gsplat")
    from microdreamer.render._gsplat import render_gsplat, render_gsplat_rasterization

    N, C, W, H, degree, depth = case
    splat = random_sh_splat(N, seed=N + C + degree, sh_degree=degree, log_scale=-3.0, device="cuda")
    cams = near_far_cameras(W, H, n=min(C, 4)).to("cuda")
    if C > 4:  # SIR-like: views around the object
        el = torch.linspace(-30, 30, C)
        cams = orbit_cameras(el, torch.arange(C) * (360.0 / C), width=W, height=H).to("cuda")
    bg = torch.rand(C, 3, generator=torch.Generator().manual_seed(1)).cuda()
    results = []
    for fn in (render_gsplat, render_gsplat_rasterization):
        p = {k: v.clone().requires_grad_(True) for k, v in splat.tensors().items()}
        out = fn(Splat(**p), cams, bg, degree, 16, depth)
        out.means2d.retain_grad()
        g = torch.Generator(device="cuda").manual_seed(0)
        w_rgb = torch.randn(out.rgb.shape, device="cuda", generator=g)
        w_a = torch.randn(out.alpha.shape, device="cuda", generator=g)
        loss = (w_rgb * out.rgb).sum() + (w_a * out.alpha).sum()
        if depth:
            loss = loss + 0.1 * (out.depth * (out.alpha.detach() > 0.05)).sum()
        loss.backward()
        grads = {k: v.grad for k, v in p.items() if v.grad is not None and v.numel()}
        results.append((out, grads | {"means2d": out.means2d.grad}))
    (fast, gf), (ref, gr) = results
    # forward: the same kernels on the same inputs (degree 0's colour C0 * dc + 0.5 is the same float32
    # arithmetic as gsplat's SH kernel plus its +0.5): expected equal to the bit; 1e-6 leaves room
    # for a few float32 ulps (values in [0, 1]) should a compiler contract differently. gsplat leaves
    # means2d unwritten (uninitialised memory) where a Gaussian is culled: compared where drawn.
    assert torch.equal(fast.radii, ref.radii)
    drawn = (ref.radii > 0).all(-1)
    assert torch.equal(fast.means2d[drawn], ref.means2d[drawn])
    torch.testing.assert_close(fast.rgb, ref.rgb, rtol=0, atol=1e-6)
    torch.testing.assert_close(fast.alpha, ref.alpha, rtol=0, atol=1e-6)
    if depth:
        drawn = ref.alpha > 0.05
        torch.testing.assert_close(fast.depth[drawn], ref.depth[drawn], rtol=1e-6, atol=0)
    else:
        assert fast.depth is None
    # backward: gsplat's rasteriser backward sums with float32 atomics in a run-dependent order, and
    # for degree 0 the C views' colour gradients are summed before (ours) or after (gsplat's SH
    # backward) the factor C0: float32 rounding of sums of up to thousands of terms. Each
    # gradient within 1e-4 of its largest entry, and the same direction to 1e-8.
    assert gf.keys() == gr.keys()
    for k in gr:
        a, b = gf[k].double().flatten(), gr[k].double().flatten()
        if b.abs().max() == 0:  # nothing drawn (possible for N = 1)
            assert a.abs().max() == 0, k
            continue
        scale = b.abs().max()
        assert (a - b).abs().max() / scale < 1e-4, (k, ((a - b).abs().max() / scale).item())
        assert torch.nn.functional.cosine_similarity(a, b, dim=0) > 1 - 1e-8, k


@pytest.mark.cuda
@cuda
def test_render_gsplat_depth_flag():
    """render(..., depth=False) on gsplat: the same rgb/alpha as with depth, no depth."""
    pytest.importorskip("gsplat")
    splat = random_sh_splat(2000, seed=3, log_scale=-3.0, device="cuda")
    cams = near_far_cameras(64, 48, n=3).to("cuda")
    with torch.no_grad():
        a = render(splat, cams, backend="gsplat", depth=True)
        b = render(splat, cams, backend="gsplat", depth=False)
    assert b.depth is None and a.depth.shape == (3, 48, 64, 1)
    # 3 vs 4 composited channels: per-channel identical arithmetic (see above for 1e-6)
    torch.testing.assert_close(b.rgb, a.rgb, rtol=0, atol=1e-6)
    torch.testing.assert_close(b.alpha, a.alpha, rtol=0, atol=1e-6)


@pytest.mark.cuda
@cuda
def test_trainer_steps_match_previous_gsplat_path():
    """SIR's setting (7 views of 128^2 on white, RGBA targets, per-view weights, densifying
    statistics) for 4 steps: the trainer against the previous step with ``gsplat.rasterization``
    ("RGB+ED") and the autograd loss.

    Tolerances. Step 1 starts from the same parameters and its gradients differ by float32
    rounding only (test above): losses to 1e-5, statistics to 1e-4 relative (counts and radii
    exactly), and Adam's first step (lr * sign(g)) the same except where a gradient is rounding
    noise (< 0.1% of elements; on the H200 the random ball's isotropic Gaussians, whose quaternion
    gradients are pure rounding noise, took a different first step in 5.7% of quaternion elements,
    hence the anisotropic scales here). Later steps: Adam moves an element by about lr whatever
    the size of its gradient, so where a gradient is tiny (1e-9 against 1e-1) the rounding
    differences of the renders can change its step by up to 2 lr: at most 1% of each parameter may
    differ by more than 1e-5, none by more than 2.05 lr per step, and as such elements barely touch
    the images, the two splats' renders must agree (mean 1e-5, max 1e-2). Measured on the CPU with
    gsplat's PyTorch reference functions in place of its kernels (24^2 views, 300 Gaussians): no
    element past 1e-5 after 4 steps, renders within 1.2e-7.
    """
    pytest.importorskip("gsplat")
    from microdreamer.render._gsplat import render_gsplat_rasterization

    C, S = 7, 128
    el = torch.linspace(-30, 30, C)
    cams = orbit_cameras(el, torch.arange(C) * (360.0 / C), width=S, height=S).to("cuda")
    targets = rgba_targets(C, S, seed=7, device="cuda")
    targets[:-1, ..., 3] = 1.0
    white = torch.ones(3, device="cuda")
    rgb_w = torch.full((C,), 1.0 / (C - 1), device="cuda")
    rgb_w[-1] = 0.3
    alpha_w = torch.zeros(C, device="cuda")
    alpha_w[-1] = 0.01
    start = random_ball_splat(5000, seed=8, device="cuda")
    # random rotations, colours and anisotropic scales: no gradient zero by symmetry (the ball's
    # Gaussians are isotropic, so their quaternion gradients would be rounding noise only)
    g = torch.Generator().manual_seed(9)
    start.quats = torch.randn(5000, 4, generator=g).cuda()
    start.log_scales = start.log_scales + 0.3 * torch.randn(5000, 3, generator=g).cuda()
    start.sh_dc = torch.randn(5000, 3, generator=g).cuda()
    start.opacity_logits = torch.randn(5000, generator=g).cuda()
    cfg = TrainConfig(backend="gsplat")
    new, ref = GaussianTrainer(start, cfg), GaussianTrainer(start, cfg)
    new.iteration = ref.iteration = 150  # inside the densification window, no densification next

    def previous(splat, cameras, bg, track):
        out = render_gsplat_rasterization(splat, cameras, bg, 0, 16, depth=True)
        if track:
            out.means2d.retain_grad()
        return out

    kw = dict(background=white, rgb_weights=rgb_w, alpha_weights=alpha_w)
    bound = dict.fromkeys(new.params, 0.0)
    for i in range(4):
        a = new.step(targets, cams, **kw)
        b = reference_step(ref, targets, cams, render_fn=previous, **kw)
        for k in b:
            torch.testing.assert_close(a[k], b[k], rtol=1e-5 if i == 0 else 1e-4, atol=0)
        for grp in ref.optimizer.param_groups:
            bound[grp["name"]] += 2.05 * grp["lr"]  # Adam with bias correction: |step| <= 1.01 lr here
        if i == 0:
            assert torch.equal(new.stats.count, ref.stats.count)
            assert torch.equal(new.stats.max_radius, ref.stats.max_radius)
            scale = ref.stats.grad_sum.abs().max()
            assert (new.stats.grad_sum - ref.stats.grad_sum).abs().max() / scale < 1e-4
            for k in new.params:
                d = (new.params[k] - ref.params[k]).abs()
                assert d.numel() == 0 or (d > 1e-5).float().mean() < 1e-3, (k, (d > 1e-5).float().mean())
    for grp in ref.optimizer.param_groups:
        k = grp["name"]
        d = (new.params[k] - ref.params[k]).abs()
        assert (d > 1e-5).float().mean() < 0.01, (k, (d > 1e-5).float().mean().item())
        assert d.max() <= bound[k], (k, d.max().item(), bound[k])
    with torch.no_grad():
        ra = render(new.splat, cams, background=white, backend="gsplat", depth=False)
        rb = render(ref.splat, cams, background=white, backend="gsplat", depth=False)
    diff = torch.cat([(ra.rgb - rb.rgb).abs(), (ra.alpha - rb.alpha).abs()], -1)
    assert diff.mean() < 1e-5 and diff.max() < 1e-2, (diff.mean().item(), diff.max().item())
