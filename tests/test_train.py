"""Gaussian optimisation: schedule values, initialisation, densify/prune on constructed cases, Adam
state bookkeeping, and tiny reconstructions (loss falls, held-out PSNR clears a floor)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from microdreamer.cameras import orbit_cameras
from microdreamer.jobs.reconstruct import reconstruct_dataset
from microdreamer.render import render
from microdreamer.splat import Splat, read_ply
from microdreamer.train import (
    GaussianTrainer,
    ReconstructConfig,
    TrainConfig,
    exponential_lr,
    random_ball_splat,
)
from microdreamer.train.densify import DensifyStats, densify_and_prune, reset_opacity
from microdreamer.train.initialize import knn_mean_sq_dist
from microdreamer.train.reconstruct import evaluate_views, reconstruct


# ------------------------------------------------------------------ input builders
def synthetic_views(size: int = 32, n_views: int = 15, seed: int = 0):
    """RGBA views of a small seeded object splat: (images [C, S, S, 4], cameras, held-out mask [C])."""
    from microdreamer.synthetic import make_synthetic_object

    gt = make_synthetic_object(2000, seed=seed, scale_fraction=0.03)
    g = torch.Generator().manual_seed(seed)
    el = torch.rand(n_views, generator=g) * 60 - 30
    az = torch.arange(n_views, dtype=torch.float32) * (360.0 / n_views)
    cams = orbit_cameras(el, az, width=size, height=size)
    with torch.no_grad():
        out = render(gt, cams, background=(0.0, 0.0, 0.0), backend="torch")
    images = torch.cat([out.rgb / out.alpha.clamp_min(1e-6), out.alpha], -1).clamp(0, 1)
    held_out = torch.zeros(n_views, dtype=torch.bool)
    held_out[2::5] = True
    return images, cams, held_out


def tiny_config(iters: int = 120) -> ReconstructConfig:
    """A CPU-sized reconstruction: 300 initial points, at most 1500 Gaussians, 4 views a step."""
    return ReconstructConfig(
        iters=iters,
        batch_views=4,
        log_every=10,
        train=TrainConfig(
            num_pts=300,
            max_gaussians=1500,
            lambda_alpha=1.0,
            random_background=True,
            densify_start_iter=25,
            densify_end_iter=int(0.6 * iters),
            densify_interval=25,
            position_lr_max_steps=iters,
            opacity_reset_interval=0,
            backend="torch",
        ),
    )


# ------------------------------------------------------------------ schedule
def test_exponential_lr_values():
    assert exponential_lr(0, 0.01, 0.0002, 500) == pytest.approx(0.01, rel=1e-12)
    assert exponential_lr(500, 0.01, 0.0002, 500) == pytest.approx(0.0002, rel=1e-12)
    assert exponential_lr(900, 0.01, 0.0002, 500) == pytest.approx(0.0002, rel=1e-12)  # flat after the end
    assert exponential_lr(250, 0.01, 0.0002, 500) == pytest.approx(math.sqrt(0.01 * 0.0002), rel=1e-12)
    assert exponential_lr(-1, 0.01, 0.0002, 500) == 0.0
    assert exponential_lr(123, 0.003, 0.003, 500) == 0.003
    # delay: starts at delay_mult x, reaches 1x at delay_steps along a sine
    assert exponential_lr(0, 0.01, 0.0002, 500, delay_steps=100, delay_mult=0.02) == pytest.approx(
        0.0002, rel=1e-12
    )
    lr50 = 0.01 * (0.0002 / 0.01) ** 0.1 * (0.02 + 0.98 * math.sin(math.pi / 4))
    assert exponential_lr(50, 0.01, 0.0002, 500, delay_steps=100, delay_mult=0.02) == pytest.approx(
        lr50, rel=1e-12
    )


def test_trainer_uses_microdreamer_position_schedule():
    cfg = TrainConfig()
    trainer = GaussianTrainer(random_ball_splat(50), cfg)
    # MicroDreamer: 0.001 and 0.00002 times spatial_lr_scale 10, over 500 steps, no delay
    assert trainer.position_lr(0) == pytest.approx(0.01)
    assert trainer.position_lr(500) == pytest.approx(0.0002)
    lrs = {g["name"]: g["lr"] for g in trainer.optimizer.param_groups}
    assert lrs == {
        "means": pytest.approx(0.01), "sh_dc": 0.01, "opacity_logits": 0.05, "log_scales": 0.005,
        "quats": 0.0005,
    }  # fmt: skip
    assert trainer.optimizer.defaults["eps"] == 1e-15


# ------------------------------------------------------------------ initialisation
def test_knn_mean_sq_dist_matches_brute_force():
    pts = torch.rand(301, 3, generator=torch.Generator().manual_seed(4))
    got = knn_mean_sq_dist(pts, k=3, chunk=64)
    d2 = ((pts[:, None, :] - pts[None, :, :]) ** 2).sum(-1).double().numpy()
    np.fill_diagonal(d2, np.inf)
    want = np.sort(d2, axis=1)[:, :3].mean(1)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-7)  # cdist in float32
    assert knn_mean_sq_dist(pts[:1]).item() == 0.0


def test_random_ball_splat_follows_microdreamer():
    s = random_ball_splat(5000, radius=0.5, seed=3)
    assert len(s) == 5000 and s.sh_degree == 0
    assert s.means.norm(dim=1).max() <= 0.5 + 1e-6
    # uniform in the ball: the fraction inside radius 0.25 is (1/2)^3 = 1/8
    assert abs((s.means.norm(dim=1) < 0.25).float().mean().item() - 0.125) < 0.015
    torch.testing.assert_close(s.opacities(), torch.full((5000,), 0.1), atol=1e-6, rtol=0)
    assert (s.colors() - 0.5).abs().max() < 0.002  # grey: SH in [0, 1/255]
    torch.testing.assert_close(s.rotations(), torch.tensor([1.0, 0, 0, 0]).expand(5000, 4))
    want = 0.5 * torch.log(knn_mean_sq_dist(s.means).clamp_min(1e-7))
    torch.testing.assert_close(s.log_scales, want[:, None].expand(5000, 3))
    s2 = random_ball_splat(5000, radius=0.5, seed=3)
    assert torch.equal(s.means, s2.means)


# ------------------------------------------------------------------ densification
def _constructed_splat() -> Splat:
    """A: small, high gradient (clone). B: large, high gradient (split). C: small, low gradient (stays).
    D: low opacity (pruned). E: huge (pruned). F: high gradient but never drawn (stays)."""
    means = torch.tensor([[0.0, 0, 0], [0.3, 0, 0], [-0.3, 0, 0], [0, 0.3, 0], [0, -0.3, 0], [0, 0, 0.3]])
    scales = torch.tensor([[0.01] * 3, [0.2, 0.1, 0.05], [0.01] * 3, [0.01] * 3, [0.5] * 3, [0.01] * 3])
    quats = torch.nn.functional.normalize(
        torch.tensor([[1.0, 0, 0, 0], [0.9, 0.3, 0.2, 0.1]] + [[1.0, 0, 0, 0]] * 4)
    )
    opac = torch.tensor([0.5, 0.6, 0.7, 0.003, 0.8, 0.5])
    colors = torch.rand(6, 3, generator=torch.Generator().manual_seed(0))
    return Splat.from_activated(means, scales, quats, opac, colors)


def _trainer_with_moments(splat: Splat) -> GaussianTrainer:
    trainer = GaussianTrainer(splat, TrainConfig(backend="torch"))
    for p in trainer.params.values():
        if p.requires_grad:
            st = trainer.optimizer.state[p]
            st["exp_avg"] = torch.arange(p.numel(), dtype=torch.float32).reshape(p.shape) + 1
            st["exp_avg_sq"] = 2 * st["exp_avg"]
            st["step"] = torch.tensor(7.0)
    return trainer


def test_densify_clone_split_prune_constructed():
    splat = _constructed_splat()
    trainer = _trainer_with_moments(splat)
    stats = DensifyStats.zeros(6, "cpu")
    # one view of W x H = 100 x 60: pixel gradients scaled by (50, 30) to NDC units
    g = torch.zeros(1, 6, 2)
    g[0, 0] = torch.tensor([0.0004, 0.0])  # 0.02 NDC: clone
    g[0, 1] = torch.tensor([0.0, 0.001])  # 0.03 NDC: split
    g[0, 2] = torch.tensor([0.0001, 0.0])  # 0.005 NDC: below 0.01
    g[0, 5] = torch.tensor([0.01, 0.0])  # huge, but radius 0: never drawn
    radii = torch.ones(1, 6, 2, dtype=torch.int32)
    radii[0, 5] = 0
    stats.accumulate(g, radii, width=100, height=60)
    torch.testing.assert_close(stats.mean_grad()[:3], torch.tensor([0.02, 0.03, 0.005]))
    assert stats.count.tolist() == [1, 1, 1, 1, 1, 0]
    old = {k: v.detach().clone() for k, v in trainer.params.items()}
    old_m = {
        k: trainer.optimizer.state[v]["exp_avg"].clone() for k, v in trainer.params.items() if v.requires_grad
    }
    gen = torch.Generator().manual_seed(0)
    params, info = densify_and_prune(
        trainer.params, trainer.optimizer, stats, grad_threshold=0.01, percent_dense=0.01, scene_extent=4.0,
        min_opacity=0.005, max_scale=0.1, generator=gen,
    )  # fmt: skip
    assert info == {"cloned": 1, "split": 1, "pruned": 2, "num_gaussians": 6}
    # order: kept originals (A, C, F), then A's clone, then B's two children
    torch.testing.assert_close(params["means"][:3], old["means"][[0, 2, 5]])
    torch.testing.assert_close(params["means"][3], old["means"][0])
    children = params["means"][4:]
    torch.testing.assert_close(params["log_scales"][4:], old["log_scales"][[1, 1]] - math.log(1.6))
    torch.testing.assert_close(params["quats"][4:], old["quats"][[1, 1]])
    # children are drawn from B: within 4 standard deviations along B's largest axis
    assert ((children - old["means"][1]).norm(dim=1) < 4 * 0.2).all()
    # Adam moments follow their Gaussians; new ones start at zero; the step count is kept
    for name, p in params.items():
        if not p.requires_grad:
            continue
        st = trainer.optimizer.state[p]
        torch.testing.assert_close(st["exp_avg"][:3], old_m[name][[0, 2, 5]])
        assert st["exp_avg"][3:].abs().max() == 0 and st["exp_avg_sq"][3:].abs().max() == 0
        assert float(st["step"]) == 7.0
    group_params = {g["name"]: g["params"][0] for g in trainer.optimizer.param_groups}
    assert all(group_params[k] is params[k] for k in group_params)


def test_densify_respects_max_gaussians():
    splat = _constructed_splat()
    trainer = _trainer_with_moments(splat)
    stats = DensifyStats.zeros(6, "cpu")
    g = torch.zeros(1, 6, 2)
    g[0, 0, 0], g[0, 1, 1], g[0, 2, 0] = 0.001, 0.002, 0.0005  # all three over 0.01 NDC
    stats.accumulate(g, torch.ones(1, 6, 2, dtype=torch.int32), width=100, height=60)
    _, info = densify_and_prune(
        trainer.params, trainer.optimizer, stats, 0.01, 0.01, 4.0, 0.005, 0.1, max_gaussians=7,
    )  # fmt: skip
    assert info["cloned"] + info["split"] == 1  # room for one: the highest gradient (B, a split)
    assert info["split"] == 1


def test_reset_opacity_clamps_and_zeroes_only_its_moments():
    trainer = _trainer_with_moments(_constructed_splat())
    before = {
        k: trainer.optimizer.state[v]["exp_avg"].clone() for k, v in trainer.params.items() if v.requires_grad
    }
    params = reset_opacity(trainer.params, trainer.optimizer, 0.01)
    op = torch.sigmoid(params["opacity_logits"].detach())
    assert op.max() <= 0.01 + 1e-6
    assert op.min().item() == pytest.approx(0.003, rel=1e-4)  # lower ones stay
    for name, p in params.items():
        if not p.requires_grad:
            continue
        m = trainer.optimizer.state[p]["exp_avg"]
        if name == "opacity_logits":
            assert m.abs().max() == 0
        else:
            torch.testing.assert_close(m, before[name])


def test_trainer_step_schedule_and_consistency():
    images, cams, _ = synthetic_views(size=16, n_views=4)
    cfg = TrainConfig(num_pts=80, densify_start_iter=2, densify_end_iter=6, densify_interval=3,
                      opacity_reset_interval=5, densify_grad_threshold=0.0, backend="torch")  # fmt: skip
    trainer = GaussianTrainer(random_ball_splat(80, seed=1), cfg)
    sizes = []
    for _ in range(7):
        losses = trainer.step(images, cams)
        assert set(losses) == {"loss", "rgb"} and torch.isfinite(losses["loss"])
        sizes.append(len(trainer))
    # threshold 0: every drawn Gaussian densifies at step 3 and step 6 (only)
    assert (
        sizes[0] == sizes[1] == 80
        and sizes[2] > 80
        and sizes[3] == sizes[4] == sizes[2]
        and sizes[5] > sizes[4]
    )
    # the reset at step 5 capped opacities (then one Adam step at lr 0.05 moved them a little)
    assert trainer.iteration == 7
    group_params = {g["name"]: g["params"][0] for g in trainer.optimizer.param_groups}
    assert all(group_params[k] is trainer.params[k] for k in group_params)
    assert trainer.stats.grad_sum.shape == (len(trainer),)


def test_step_weights_and_alpha_term():
    images, cams, _ = synthetic_views(size=16, n_views=3)
    trainer = GaussianTrainer(random_ball_splat(60), TrainConfig(lambda_alpha=2.0, backend="torch"))
    with torch.no_grad():
        out = render(trainer.splat, cams, background=(1, 1, 1), backend="torch")
        bg = torch.ones(3, 3)
        losses = trainer.loss(out, images, bg)
        tgt = images[..., :3] * images[..., 3:] + (1 - images[..., 3:])
        l1 = (out.rgb - tgt).abs().sum() / 3
        l2 = 2.0 * (out.alpha - images[..., 3:]).square().sum() / 3
        torch.testing.assert_close(losses["rgb"], l1)
        torch.testing.assert_close(losses["alpha"], l2)
        w = torch.tensor([1.0, 0.0, 0.0])
        one = trainer.loss(out, images, bg, rgb_weights=w)["rgb"]
        torch.testing.assert_close(one, (out.rgb[0] - tgt[0]).abs().sum())


# ------------------------------------------------------------------ tiny reconstructions
def test_tiny_reconstruction_loss_falls_and_psnr_floor():
    """12 training views at 32 x 32, 120 steps on the CPU (~10 s on 2 cores). Measured when written:
    held-out PSNR 37.4 dB, loss 200 -> 11.5. Floor: 30 dB; the loss must fall 5x."""
    torch.manual_seed(0)
    images, cams, held = synthetic_views(size=32)
    train = (~held).nonzero().squeeze(1)
    test = held.nonzero().squeeze(1)
    splat, stats = reconstruct(images[train], cams[train], tiny_config(120), progress=False)
    first, last = stats["history"][0][1], stats["history"][-1][1]
    assert last < first / 5, stats["history"]
    assert len(splat) <= 1500
    held_psnr = evaluate_views(splat, images[test], cams[test], backend="torch")["psnr"]
    assert held_psnr >= 30.0, held_psnr


def test_reconstruct_dataset_writes_outputs(tmp_path):
    from microdreamer.config import (
        BakeConfig,
        BakeViewsConfig,
        ExportConfig,
        MeshConfig,
        ReconstructJobConfig,
        TextureConfig,
    )
    from microdreamer.data import Normalization, save_dataset
    from microdreamer.field import FieldConfig
    from microdreamer.orient import up_rotation

    images, cams, held = synthetic_views(size=24, n_views=10)
    # as render-views records a Z-up mesh centred at c, scaled by 0.5, turned upright
    c, R = np.array([5.0, -1.0, 2.0]), np.asarray(up_rotation("+z"))
    save_dataset(tmp_path / "data", images, cams, held, normalization=Normalization(c, 0.5, R))
    texture = TextureConfig(
        size=64, bake=BakeConfig(views=BakeViewsConfig(size=48))
    )  # the default bake, small
    export = ExportConfig(field=FieldConfig(resolution=32), mesh=MeshConfig(threshold=0.2), texture=texture)
    config = ReconstructJobConfig(reconstruct=tiny_config(30), export=export)
    metrics = reconstruct_dataset(tmp_path / "data", tmp_path / "out", config, device="cpu", progress=False)
    for name in ("splat.ply", "mesh.glb", "held_out_views.png", "metrics.json"):
        assert (tmp_path / "out" / name).exists(), name
    import trimesh

    glb = trimesh.load(tmp_path / "out" / "mesh.glb", process=False)
    geom = next(iter(glb.geometry.values())) if isinstance(glb, trimesh.Scene) else glb
    # the outputs are in the source mesh's units and position (upright): x_dataset / 0.5 + R c; the
    # object (radius ~0.5 about the dataset origin) comes out about 1 in radius around R c
    out_means = read_ply(tmp_path / "out" / "splat.ply").means.double().numpy()
    for points in (out_means, np.asarray(geom.vertices)):
        centre = 0.5 * (points.min(0) + points.max(0))
        assert np.abs(centre - R @ c).max() < 0.25, centre
        assert 1.4 < np.ptp(points, axis=0).max() < 2.6, np.ptp(points, axis=0)
    assert metrics["output_frame"]["name"] == "input"
    from PIL import Image

    sheet = Image.open(tmp_path / "out" / "held_out_views.png")  # 2 held-out rows x (truth, splat, mesh)
    assert sheet.size[0] >= 3 * 120 and sheet.size[1] >= 2 * 120
    assert geom.visual.uv is not None and geom.visual.material.baseColorTexture.size == (64, 64)
    assert metrics["mesh"]["texture"] == {"mode": "bake", "size": 64}
    on_disk = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert (
        on_disk["num_gaussians"] == metrics["num_gaussians"] == len(read_ply(tmp_path / "out" / "splat.ply"))
    )
    assert on_disk["num_held_out_views"] == int(held.sum()) and len(on_disk["psnr_per_view"]) == int(
        held.sum()
    )
    assert on_disk["psnr"] > 10 and 0 < on_disk["ssim"] <= 1
    assert set(on_disk["seconds"]) >= {"load", "train", "evaluate", "mesh"}
    assert on_disk["mesh"]["faces"] > 0


@pytest.mark.slow
def test_reconstruction_is_identical_run_to_run_with_two_threads():
    """One seed, two threads, two runs of a small reconstruction (densifying at steps 10 and 20): the
    same splat bit for bit. (With the rasteriser's gathers by advanced indexing, this failed: the
    centres differed after the first steps. ~30-120 s on the shared 2-core CPU, hence slow; the
    render's backward has its own fast test in test_render_gaussians.py.)"""
    images, cams, _ = synthetic_views(size=24, n_views=8)
    config = tiny_config(30)
    config = replace(config, train=replace(config.train, densify_start_iter=10, densify_interval=10,
                                           densify_end_iter=25))  # fmt: skip
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        a, _ = reconstruct(images, cams, config, progress=False)
        b, _ = reconstruct(images, cams, config, progress=False)
    finally:
        torch.set_num_threads(threads)
    assert len(a) == len(b)
    for name, value in a.tensors().items():
        assert torch.equal(value, b.tensors()[name]), name
