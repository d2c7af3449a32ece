"""Tiled meshing of scenes (microdreamer.scene): any tiling gives the same mesh, memory follows the tile,
a resumed run gives the same file."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from microdreamer.config import FieldConfig, MeshConfig
from microdreamer.scene import plan_scene, scene_to_mesh, threaded_tiles
from microdreamer.splat import Splat
from microdreamer.synthetic import surface_splat

pytest.importorskip("skimage")


def spheres(centres, n: int = 1200, radius: float = 0.3) -> Splat:
    """Copies of a sphere of flat Gaussians at ``centres`` (the scene's objects)."""
    one = surface_splat(n, radius=radius, scale=0.03)
    parts = [one.tensors() for _ in centres]
    for p, c in zip(parts, centres, strict=True):
        p["means"] = p["means"] + torch.tensor(c, dtype=torch.float32)
    return Splat(**{k: torch.cat([p[k] for p in parts]) for k in parts[0]})


#: 2 x 2 x 2 spheres, the x axis longer (the grid is 1.1-1.2x longer along x), so that tiles of one size
#: cut it into 1, 2, 8 or 27 tiles
SCENE = [(x, y, z) for x in (0.0, 1.0) for y in (0.0, 0.8) for z in (0.0, 0.8)]


def retile(plan, tile: int):
    tiles = tuple(max(1, math.ceil((s - 1) / tile)) for s in plan.grid.shape)
    return dataclasses.replace(plan, tile=tile, tiles=tiles, _order=None, _starts=None)


@pytest.fixture(scope="module")
def scene():
    splat = spheres(SCENE)
    plan = plan_scene(splat, FieldConfig(), tile=4096)
    sx, sy, sz = (s - 1 for s in plan.grid.shape)
    tiles = {1: sx, 2: max(sy, sz), 8: math.ceil(sx / 2), 27: math.ceil(sx / 3)}
    plans = {count: retile(plan, t) for count, t in tiles.items()}
    for count, p in plans.items():
        assert p.num_tiles == count, (count, p.tiles, plan.grid.shape)
    config = MeshConfig(threshold="auto")
    return splat, {count: scene_to_mesh(splat, FieldConfig(), config, plan=p) for count, p in plans.items()}


def _canonical_faces(faces: np.ndarray) -> set[tuple[int, int, int]]:
    """Faces as a set, each rotated to start at its smallest index (winding kept)."""
    r = np.argmin(faces, axis=1)
    rolled = np.stack([faces[np.arange(len(faces)), (r + k) % 3] for k in range(3)], 1)
    return set(map(tuple, rolled.tolist()))


def _border_edges(faces: np.ndarray) -> int:
    """Edges used by one face only (cracks, or an open surface)."""
    e = np.sort(np.concatenate([faces[:, [0, 1]], faces[:, [1, 2]], faces[:, [2, 0]]]), axis=1)
    _, counts = np.unique(e, axis=0, return_counts=True)
    return int((counts == 1).sum())


def _assert_same_mesh(one, many):
    """``many`` (a tiling) is ``one`` (one tile): the same level, vertices, faces; no crack, no doubled face."""
    from scipy.spatial import cKDTree

    assert many.level == one.level  # one iso level for the scene, whatever the tiling
    a, b = one.mesh, many.mesh
    assert (a.num_vertices, a.num_faces) == (b.num_vertices, b.num_faces)
    # the same vertices: those on grid edges bit for bit, cell-centre vertices to float32 rounding
    dist, match = cKDTree(b.vertices.astype(np.float64)).query(a.vertices.astype(np.float64))
    assert float(dist.max()) <= 1e-5 * one.plan.grid.spacing
    assert np.unique(match).size == a.num_vertices
    assert _canonical_faces(match[a.faces]) == _canonical_faces(b.faces)
    assert _border_edges(b.faces) == _border_edges(a.faces) == 0  # closed spheres: no crack at the seams
    assert len(_canonical_faces(np.sort(b.faces, axis=1))) == b.num_faces  # no doubled face
    assert many.stats["tiles_with_gaussians"] >= 2


@pytest.mark.parametrize("count", [2, 8, 27])
def test_any_tiling_gives_the_same_mesh(scene, count):
    _, results = scene
    _assert_same_mesh(results[1], results[count])


def test_threaded_tiles_give_the_same_mesh(scene):
    """Tiles on threads: the same pieces in the same order, so the same arrays (colours included)."""
    splat, results = scene
    plan = retile(results[8].plan, results[8].plan.tile)  # not binned yet: the threads must not race to it
    config = MeshConfig(threshold="auto")
    serial = scene_to_mesh(splat, FieldConfig(), config, plan=plan, colors=True)
    threaded = scene_to_mesh(splat, FieldConfig(), config, plan=retile(plan, plan.tile), colors=True,
                             map_tiles=threaded_tiles(3))  # fmt: skip
    np.testing.assert_array_equal(serial.mesh.faces, results[8].mesh.faces)
    for a, b in ((serial.mesh.vertices, threaded.mesh.vertices), (serial.mesh.faces, threaded.mesh.faces),
                 (serial.mesh.vertex_colors, threaded.mesh.vertex_colors), (serial.face_tile, threaded.face_tile)):  # fmt: skip
        np.testing.assert_array_equal(a, b)
    assert threaded.level == serial.level and "tiles" in threaded.stats["seconds"]
    with pytest.raises(ValueError, match="workers"):
        threaded_tiles(0)


def _assert_same_surface(a, b):
    """Two implementations' meshes of one scene: fields a few float32 ulps apart, and alpha images summed
    in float32 or in fixed point (the GPU's), give auto levels within 1e-3 of each other and vertices within
    5 % of a voxel (a vertex moves by the samples' or the level's difference over the field's slope), the
    same faces but for a rare sign change at the level."""
    from scipy.spatial import cKDTree

    assert abs(a.level - b.level) <= 1e-3 * abs(a.level)
    spacing = a.plan.grid.spacing
    for x, y in ((a.mesh, b.mesh), (b.mesh, a.mesh)):
        dist, _ = cKDTree(y.vertices.astype(np.float64)).query(x.vertices.astype(np.float64))
        assert float(np.quantile(dist, 0.999)) <= 0.05 * spacing and float(dist.max()) <= spacing
    assert abs(a.mesh.num_faces - b.mesh.num_faces) <= 1e-3 * a.mesh.num_faces


def _tilings(splat, **plan_args):
    """The scene fixture's tilings (1, 2 and 8 tiles) of ``splat`` planned with ``plan_args``, meshed."""
    plan = plan_scene(splat, FieldConfig(), tile=4096, **plan_args)
    sx, sy, sz = (s - 1 for s in plan.grid.shape)
    config = MeshConfig(threshold="auto")
    counts = {1: sx, 2: max(sy, sz), 8: math.ceil(sx / 2)}
    return {c: scene_to_mesh(splat, FieldConfig(), config, plan=retile(plan, t)) for c, t in counts.items()}


def test_torch_reference_tiles(scene):
    """The PyTorch reference of the tiles' field (what the CUDA path is checked against) on the CPU: every
    tiling gives the same welded mesh, and the C++ tiles' surface."""
    splat, results = scene
    ref = _tilings(splat, backend="torch")
    assert ref[1].stats["backend"] == "torch"
    for count in (2, 8):
        _assert_same_mesh(ref[1], ref[count])
    _assert_same_surface(ref[1], results[1])


@pytest.mark.cuda
def test_cuda_tiles(scene):
    """The CUDA tiles: every tiling gives the same welded mesh on the GPU (a gather in Gaussian order, no
    atomics), the C++ tiles' surface, and the PyTorch reference's on the GPU."""
    splat, results = scene
    gpu = _tilings(splat, device="cuda")
    assert gpu[1].stats["backend"] == "cuda"
    for count in (2, 8):
        _assert_same_mesh(gpu[1], gpu[count])
    _assert_same_surface(gpu[1], results[1])
    again = _tilings(splat, device="cuda")[8]
    assert np.array_equal(again.mesh.faces, gpu[8].mesh.faces)
    assert np.array_equal(again.mesh.vertices, gpu[8].mesh.vertices)
    ref = scene_to_mesh(splat, FieldConfig(), MeshConfig(threshold="auto"), tile=4096, device="cuda",
                        backend="torch")  # fmt: skip
    _assert_same_surface(gpu[1], ref)


@pytest.mark.cuda
def test_cuda_tiles_with_colours_and_work_folder(tmp_path):
    """Vertex colours from the GPU's colour field match the CPU's; a resumed GPU run writes the same file."""
    splat = spheres(SCENE[:4])
    config = MeshConfig(threshold="auto")
    cpu = scene_to_mesh(splat, FieldConfig(), config, tile=20, colors=True)
    gpu = scene_to_mesh(splat, FieldConfig(), config, tile=20, colors=True, device="cuda", work_dir=tmp_path)
    _assert_same_surface(gpu, cpu)
    from scipy.spatial import cKDTree

    _, near = cKDTree(cpu.mesh.vertices).query(gpu.mesh.vertices)
    assert float(np.abs(gpu.mesh.vertex_colors - cpu.mesh.vertex_colors[near]).max()) <= 1e-3
    assert not list(tmp_path.glob("field_*.npy"))  # a device computes the field again rather than keep it


def test_scene_keeps_every_object(scene):
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    _, results = scene
    mesh = results[8].mesh
    f = mesh.faces
    graph = coo_matrix(
        (np.ones(2 * len(f)), (f[:, :2].ravel(), f[:, 1:].ravel())), shape=(mesh.num_vertices,) * 2
    )
    n, _ = connected_components(graph, directed=False)
    assert n == len(SCENE)
    lo, hi = mesh.vertices.min(0), mesh.vertices.max(0)
    centres = np.asarray(SCENE)
    assert np.allclose(lo, centres.min(0) - 0.3, atol=0.05) and np.allclose(
        hi, centres.max(0) + 0.3, atol=0.05
    )


def test_peak_grid_memory_follows_the_tile():
    """The per-tile grid arrays (counted by the MemoryCounter hook) depend on the tile, not the scene."""
    config = MeshConfig(threshold=0.2)
    small = spheres([(0.0, 0.0, 0.0), (1.0, 0.0, 0.0)])
    large = spheres([(x, 0.0, z) for x in (0.0, 1.0, 2.0, 3.0) for z in (0.0, 1.0, 2.0)])
    peaks = {}
    for name, splat in (("small", small), ("large", large)):
        plan = plan_scene(splat, FieldConfig(), tile=24)
        peaks[name] = scene_to_mesh(splat, FieldConfig(), config, plan=plan)
        assert peaks[name].stats["tiles_with_gaussians"] > 1
    tile_bytes = 25**3 * 4  # one (tile + 1)^3 float32 field
    for r in peaks.values():
        assert r.memory.current == 0
        assert r.memory.largest <= (25 + 2) ** 3 * 4  # the padded copy of a border tile
        assert r.memory.peak <= 2 * (25 + 2) ** 3 * 4
    assert peaks["large"].memory.peak == peaks["small"].memory.peak
    whole = scene_to_mesh(large, FieldConfig(), config, plan=plan_scene(large, FieldConfig(), tile=4096))
    assert whole.memory.peak > 20 * tile_bytes  # one tile over the whole scene: the scene's grid
    assert peaks["large"].mesh.num_faces == whole.mesh.num_faces


class _Stop(Exception):
    pass


def test_a_resumed_run_writes_the_same_file(tmp_path):
    from microdreamer.mesh import save_mesh

    splat = spheres(SCENE[:4])
    plan = plan_scene(splat, FieldConfig(), tile=20)
    config = MeshConfig(threshold="auto")
    full = scene_to_mesh(splat, FieldConfig(), config, plan=plan, colors=True)
    save_mesh(full.mesh, tmp_path / "full.glb")

    done = []

    def stop_after_three(message: str) -> None:
        if message.startswith("tile "):
            done.append(message)
            if len(done) == 3:
                raise _Stop

    work = tmp_path / "work"
    with pytest.raises(_Stop):
        scene_to_mesh(splat, FieldConfig(), config, plan=retile(plan, 20), colors=True, work_dir=work,
                      progress=stop_after_three)  # fmt: skip
    assert len(list(work.glob("tile_*.npz"))) == 3
    resumed = scene_to_mesh(splat, FieldConfig(), config, plan=retile(plan, 20), colors=True, work_dir=work)
    assert resumed.stats["tiles_resumed"] == 3
    save_mesh(resumed.mesh, tmp_path / "resumed.glb")
    assert (tmp_path / "resumed.glb").read_bytes() == (tmp_path / "full.glb").read_bytes()
    # interrupted in the iso level's first pass: its tile fields are reused
    first = tmp_path / "first"
    passes = []

    def stop_in_the_first_pass(message: str) -> None:
        if message.startswith("iso-level pass"):
            passes.append(message)
            if len(passes) == 2:
                raise _Stop

    with pytest.raises(_Stop):
        scene_to_mesh(splat, FieldConfig(), config, plan=retile(plan, 20), colors=True, work_dir=first,
                      progress=stop_in_the_first_pass)  # fmt: skip
    again = scene_to_mesh(splat, FieldConfig(), config, plan=retile(plan, 20), colors=True, work_dir=first)
    assert again.stats["fields_resumed"] == 2
    save_mesh(again.mesh, tmp_path / "again.glb")
    assert (tmp_path / "again.glb").read_bytes() == (tmp_path / "full.glb").read_bytes()
    # other settings: the kept tiles are not reused
    other = scene_to_mesh(
        splat, FieldConfig(), MeshConfig(threshold=0.3), plan=retile(plan, 20), work_dir=work
    )
    assert other.stats["tiles_resumed"] == 0


def test_mesh_command_in_tiles(tmp_path, capsys):
    from microdreamer import cli
    from microdreamer.mesh.load import load_textured_mesh
    from microdreamer.splat import write_ply

    write_ply(spheres(SCENE[:2]), tmp_path / "scene.ply")
    out = tmp_path / "scene.glb"
    cli.main(["mesh", str(tmp_path / "scene.ply"), "-o", str(out), "--tiles", "2"])
    text = capsys.readouterr().out
    assert "tiles of" in text
    mesh = load_textured_mesh(out)
    assert mesh.num_faces > 1000 and mesh.vertex_colors is not None
    assert not (tmp_path / "scene.glb.tiles").exists()


def test_chunks_of_gaussians_change_nothing(monkeypatch):
    """The plan's preparation, binning and the iso level's alpha images, taken a few Gaussians at a time."""
    from microdreamer.scene import tiles

    splat = spheres(SCENE[:2], n=600)
    config = MeshConfig(threshold="auto")
    whole = scene_to_mesh(splat, FieldConfig(), config, tile=16)
    monkeypatch.setattr(tiles, "PREPARE_CHUNK", 97)
    chunked = scene_to_mesh(splat, FieldConfig(), config, tile=16)
    assert torch.equal(chunked.plan.prepared.means, whole.plan.prepared.means)
    assert torch.equal(chunked.plan.boxes, whole.plan.boxes)
    for t in range(whole.plan.num_tiles):
        assert torch.equal(chunked.plan.gaussians_of(t), whole.plan.gaussians_of(t))
    a = tiles._column_alphas(whole.plan, splat)
    monkeypatch.setattr(tiles, "PREPARE_CHUNK", 1 << 20)
    b = tiles._column_alphas(whole.plan, splat)
    for x, y in zip(a, b, strict=True):
        assert torch.allclose(x, y, atol=1e-6)  # float32 alphas of each chunk, combined in float64
    assert chunked.level == whole.level
    assert np.array_equal(chunked.mesh.faces, whole.mesh.faces)


def test_a_voxel_too_small_for_the_scene_is_refused():
    """Past what the plan addresses (2^20 points along an axis: tiles.grid_limit); a voxel of 1e-5 here
    (1.4e5 points along z) is within it."""
    with pytest.raises(ValueError, match="use a voxel of"):
        plan_scene(spheres(SCENE[:2], n=100), FieldConfig(), voxel=1e-7)


def test_a_thinned_iso_pass_is_the_same_whatever_the_tiling(monkeypatch):
    """Where the iso level's images would pass ISO_MAX_COLUMNS the columns are taken further apart (every
    3rd here): the level is the one the whole grid's column maxima and alphas at those columns give, in
    any tiling."""
    from microdreamer.field.iso import choose_iso_level
    from microdreamer.scene import tiles

    splat = spheres(SCENE)
    plan = plan_scene(splat, FieldConfig(), tile=4096)
    a, b = sorted(plan.grid.shape)[1:]
    monkeypatch.setattr(tiles, "ISO_MAX_COLUMNS", -(-a // 3) * -(-b // 3))
    assert tiles.iso_stride(plan.grid.shape) == 3
    values = torch.from_numpy(tiles.tile_field(plan, 0).copy())
    maxima = [values.amax(axis)[::3, ::3].contiguous() for axis in range(3)]
    level = choose_iso_level(maxima, tiles._column_alphas(plan, splat, 3)).level
    config = MeshConfig(threshold="auto")
    for tile in (plan.grid.shape[0] - 1, math.ceil((plan.grid.shape[0] - 1) / 3)):
        said = []
        result = scene_to_mesh(splat, FieldConfig(), config, plan=retile(plan, tile), progress=said.append)
        assert result.level == level
        assert any(s.startswith("iso level from a column every 3 grid points") for s in said)


def test_a_large_dense_export_names_tiles(tmp_path, monkeypatch):
    from microdreamer.config import ExportConfig, TextureConfig
    from microdreamer.jobs import scene as scene_job
    from microdreamer.jobs.export import export_mesh

    monkeypatch.setattr(scene_job, "SCENE_HINT_GAUSSIANS", 100)
    said = []
    config = ExportConfig(field=FieldConfig(resolution=32), texture=TextureConfig(mode="none"))
    export_mesh(spheres(SCENE[:1], n=400), tmp_path / "a.glb", config, torch.device("cpu"), stage=said.append)
    assert any("--tiles auto" in s for s in said)


def test_non_finite_gaussians_are_named():
    splat = spheres(SCENE[:1], n=100)
    splat.means[7, 1] = float("nan")
    with pytest.raises(ValueError, match="#7"):
        plan_scene(splat, FieldConfig())


def test_a_capped_work_folder_gives_the_same_mesh(tmp_path):
    """The first pass keeps tile fields on disk up to the cap (the rest are computed again): the same mesh,
    and never more field bytes in the folder than the cap."""
    from microdreamer.scene.tiles import field_file_bytes

    splat = spheres(SCENE[:4])
    plan = plan_scene(splat, FieldConfig(), tile=20)
    config = MeshConfig(threshold="auto")
    free = scene_to_mesh(splat, FieldConfig(), config, plan=retile(plan, 20))
    occupied = [t for t in range(plan.num_tiles) if retile(plan, 20).gaussians_of(t).numel()]
    cap = field_file_bytes(plan, occupied[0]) + field_file_bytes(plan, occupied[1]) + 100
    for n, limit in enumerate((cap, 0)):
        work, held = tmp_path / f"work{n}", []

        def watch(message: str, work=work, held=held) -> None:
            held.append(sum(f.stat().st_size for f in work.glob("field_*.npy")))

        capped = scene_to_mesh(splat, FieldConfig(), config, plan=retile(plan, 20), work_dir=work,
                               progress=watch, field_cache=limit)  # fmt: skip
        assert 0 < max(held) <= cap if limit else max(held) == 0
        np.testing.assert_array_equal(capped.mesh.faces, free.mesh.faces)
        np.testing.assert_array_equal(capped.mesh.vertices, free.mesh.vertices)


def _with(splat: Splat, means: torch.Tensor, log_scale: float, opacity_logit: float, seed: int = 0) -> Splat:
    """``splat`` and round Gaussians at ``means`` [n, 3] (scale exp(``log_scale``), one opacity)."""
    n = means.shape[0]
    g = torch.Generator().manual_seed(seed)
    extra = Splat(means=means.float(), sh_dc=torch.rand(n, 3, generator=g) - 0.5,
                  sh_rest=torch.zeros(n, splat.sh_rest.shape[1], 3), opacity_logits=torch.full((n,), opacity_logit),
                  log_scales=torch.full((n, 3), log_scale), quats=torch.tensor([[1.0, 0, 0, 0]]).expand(n, 4).clone())  # fmt: skip
    a, b = splat.tensors(), extra.tensors()
    return Splat(**{k: torch.cat([a[k], b[k]]) for k in a})


def backdrop(splat: Splat, seed: int = 0) -> Splat:
    """``splat`` inside a capture's far background: 20,000 big Gaussians on a half-dome 30 times its size
    away and 4,000 faint small floaters in a box 10 times its size."""
    g = torch.Generator().manual_seed(seed)
    lo, hi = splat.means.amin(0), splat.means.amax(0)
    size, centre = float((hi - lo).max()), (lo + hi) / 2
    d = torch.randn(20_000, 3, generator=g)
    d[:, 1] = d[:, 1].abs()
    dome = centre + 30 * size * d / d.norm(dim=1, keepdim=True)
    floaters = centre + (torch.rand(4000, 3, generator=g) - 0.5) * 10 * size
    out = _with(splat, dome, math.log(0.6 * size), 2.0, seed)
    return _with(out, floaters, math.log(0.01 * size), -1.0, seed + 1)


def room(per_area: float = 100.0, size=(6.0, 3.0, 6.0)) -> Splat:
    """A room: walls, floor and ceiling of flat Gaussians (``per_area`` a unit of area), three spheres
    inside."""
    g = torch.Generator().manual_seed(0)
    walls = []
    for axis in range(3):
        other = [a for a in range(3) if a != axis]
        n = int(per_area * size[other[0]] * size[other[1]])
        for side in (0.0, size[axis]):
            p = torch.rand(n, 3, generator=g) * torch.tensor(size)
            p[:, axis] = side
            walls.append(p)
    return _with(spheres([(1.0, 0.5, 1.0), (3.0, 0.5, 4.0), (4.5, 0.5, 2.0)]), torch.cat(walls),
                 math.log(1 / math.sqrt(per_area)), 2.0)  # fmt: skip


def test_the_guitar_copies_of_bench_scene_are_kept_whole(monkeypatch):
    """bench_scene's grid of guitar copies, and a street of them in a row, lose no Gaussian."""
    import sys
    from pathlib import Path

    from conftest import sample
    from microdreamer.jobs.scene import drop_background

    monkeypatch.setattr(sys, "path", [str(Path(__file__).resolve().parents[1] / "benchmarks"), *sys.path])
    import bench_scene

    monkeypatch.setattr(bench_scene, "GUITAR", sample("splats/pc_guitar_91k_sh0.decoded.ply"))
    grid, transforms, _ = bench_scene.scene_splat(1_000_000)
    guitar = bench_scene.scene_splat(1)[0]
    street = Splat(**{k: torch.cat([guitar.transformed(torch.eye(3, dtype=torch.float64),
                                                       translation=torch.tensor([3.0 * c, 0.0, 0.0])).tensors()[k]
                                    for c in range(8)]) for k in guitar.tensors()})  # fmt: skip
    for splat in (grid, street):
        said = []
        assert drop_background(splat, 0.005, said.append) is splat and not said


@pytest.mark.parametrize("name", ["spheres", "room", "sparse room", "street"])
def test_the_background_rule_keeps_a_whole_scene(name):
    """Scenes with no far background keep every Gaussian: the test scenes, a room (walls around the
    objects, even sparse ones) and a long street of objects."""
    from microdreamer.jobs.scene import drop_background

    splat = {"spheres": lambda: spheres(SCENE), "room": room, "sparse room": lambda: room(30.0),
             "street": lambda: spheres([(1.2 * k, 0.0, 0.0) for k in range(40)], n=300)}[name]()  # fmt: skip
    said = []
    assert drop_background(splat, 0.005, said.append) is splat and not said


def test_the_background_is_left_out_in_one_line():
    from microdreamer.jobs.scene import drop_background

    for objects in (spheres(SCENE), room()):
        said = []
        kept = drop_background(backdrop(objects), 0.005, said.append)
        assert len(kept) <= len(objects) + 20  # a few floaters inside the core's margin at most
        assert torch.equal(kept.means[: len(objects)], objects.means)
        assert (
            len(said) == 1 and "--background keep" in said[0] and f"of {len(objects) + 24_000:,}" in said[0]
        )


def test_mesh_with_tiles_drops_the_background_unless_told(tmp_path, monkeypatch):
    """``--tiles`` meshes the scene's core by default; ``--background keep`` and an explicit ``--crop`` box
    hand every (boxed) Gaussian to the tiles."""
    from microdreamer.config import ExportConfig, SceneConfig
    from microdreamer.jobs import export as export_job
    from microdreamer.jobs import scene as scene_job

    got = []
    monkeypatch.setattr(scene_job, "export_scene", lambda splat, *a, **k: got.append(len(splat)))
    objects = spheres(SCENE)
    splat = backdrop(objects)
    for background, crop in (("drop", None), ("keep", None), ("drop", "-20,-20,-20,20,20,20")):
        config = ExportConfig(scene=SceneConfig(tiles="auto", background=background), crop=crop)
        export_job.export_mesh(splat, tmp_path / "a.glb", config, torch.device("cpu"))
    assert got[0] <= len(objects) + 20 and got[1] == len(splat)
    assert got[2] == int((splat.means.abs() <= 20).all(-1).sum()) < len(splat)


def _surface_points(mesh, k: int = 12) -> np.ndarray:
    """Points on every face of ``mesh`` at the barycentric grid of step 1/k (the vertices included)."""
    w = np.array([(i, j, k - i - j) for i in range(k + 1) for j in range(k + 1 - i)], np.float64) / k
    tri = mesh.vertices.astype(np.float64)[mesh.faces]  # [F, 3, 3]
    return np.einsum("pk,fkc->fpc", w, tri).reshape(-1, 3)


def test_tiles_mesh_the_dense_path_s_surface():
    """On one object the tiled path (its grid of voxels in world units, cut into tiles) meshes the surface
    the dense path meshes (its normalised grid) at the same iso level and voxel: every vertex of either mesh
    lies within half a voxel of the other mesh's surface (sampled at a twelfth of its faces' size)."""
    from scipy.spatial import cKDTree

    from microdreamer.field import prepare_gaussians
    from microdreamer.jobs.export import splat_to_mesh

    splat = spheres([(0.0, 0.0, 0.0)], n=2400)
    mesh_config = MeshConfig(threshold=0.3)
    dense = splat_to_mesh(splat, FieldConfig(resolution=64), mesh_config, torch.device("cpu"))
    _, grid = prepare_gaussians(splat, FieldConfig(resolution=64))
    spacing = 2.0 / (64 - 1) / grid.scale  # the dense grid's voxel in world units
    tiled = scene_to_mesh(splat, FieldConfig(), mesh_config, voxel=spacing, tiles_along_longest=2)
    assert tiled.stats["tiles_with_gaussians"] >= 2
    assert tiled.level == pytest.approx(0.3)
    assert 0.8 < tiled.mesh.num_faces / dense.mesh.num_faces < 1.25
    for a, b in ((tiled.mesh, dense.mesh), (dense.mesh, tiled.mesh)):
        dist, _ = cKDTree(_surface_points(b)).query(a.vertices.astype(np.float64))
        assert float(dist.max()) < 0.5 * spacing, float(dist.max()) / spacing
        assert float(dist.mean()) < 0.1 * spacing, float(dist.mean()) / spacing


# ------------------------------------------------------------------------ mesh --tiles --tile-threads
def test_tile_threads_write_the_serial_file(tmp_path, capsys):
    """`--tile-threads 3` meshes three tiles at once: the same file, byte for byte, as one thread."""
    from microdreamer import cli
    from microdreamer.splat import write_ply

    write_ply(spheres(SCENE[:4], n=300), tmp_path / "four.ply")
    for threads in ("1", "3"):
        args = ["mesh", str(tmp_path / "four.ply"), "-o", str(tmp_path / f"t{threads}.glb"), "--tiles", "3",
                "--tile-threads", threads]  # fmt: skip
        assert cli.main(args) == 0
        err = capsys.readouterr().err
        assert ("tiles on 3 threads of this process" in err) == (threads == "3"), err
    assert (tmp_path / "t3.glb").read_bytes() == (tmp_path / "t1.glb").read_bytes()


def test_tile_threads_auto_follows_the_device(monkeypatch):
    import os

    from microdreamer.jobs.scene import GPU_TILE_THREADS, tile_threads

    assert tile_threads("auto", "cpu") == 1
    assert tile_threads(5, "cpu") == 5
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert tile_threads("auto", "cuda") == GPU_TILE_THREADS
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert tile_threads("auto", "cuda:1") == 2


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--tiles", "auto", "--tile-threads", "0"], "error: --tile-threads 0: must be auto or between 1 and 256"),
        (["--tiles", "auto", "--tile-threads", "many"], "error: --tile-threads many: must be auto or a thread count"),
        (["--tile-threads", "2"], "error: --tile-threads 2: meshes a scene's tiles at once; add --tiles auto"),
        (["--tiles", "auto", "--tile-threads", "2", "--workers", "2"], "with Ray workers each worker takes a tile"),
    ],
)  # fmt: skip
def test_bad_tile_threads_are_one_line(tmp_path, capsys, extra, message):
    from microdreamer import cli
    from microdreamer.splat import write_ply

    write_ply(spheres(SCENE[:1], n=200), tmp_path / "one.ply")
    assert cli.main(["mesh", str(tmp_path / "one.ply"), "-o", str(tmp_path / "one.glb"), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and message in err[-1], err
    assert not (tmp_path / "one.glb").exists()


def test_the_three_column_alpha_images_are_each_directions_own(monkeypatch):
    """The scene's alpha images along the three axes, made in one call, are the images each direction's own
    call gives (the same terms summed in the same order), also over several chunks. Compared within 1e-5:
    the two layouts place a term's exponential in other vector lanes (or a scalar tail), which a CPU's
    vector exp need not round alike; on this project's CPUs they came out equal."""
    from microdreamer.field.carve import DILATION, projected_alpha
    from microdreamer.scene import tiles
    from microdreamer.scene.tiles import _column_alphas, _prepare_voxel_units

    splat = spheres(SCENE[:3], n=400)
    plan = plan_scene(splat, FieldConfig(), tile=16)
    monkeypatch.setattr(tiles, "PREPARE_CHUNK", 500)  # three chunks of Gaussians
    together = _column_alphas(plan, splat)
    keep = splat.opacities().float() > plan.config.min_opacity
    index = torch.nonzero(keep).flatten()
    sizes = [tuple(-(-plan.grid.shape[b] // 2) for b in range(3) if b != a) for a in range(3)]
    log_t = [torch.zeros(size, dtype=torch.float64) for size in sizes]
    for start in range(0, index.numel(), 500):
        chunk = torch.zeros_like(keep)
        chunk[index[start : start + 500]] = True
        raw, _ = _prepare_voxel_units(splat, chunk, plan.grid, plan.config, 0.0)
        for a in range(3):
            basis = torch.eye(3, dtype=torch.float64)[[b for b in range(3) if b != a]]
            alpha = projected_alpha(raw, basis, (0.0, 0.0), sizes[a], 2.0, DILATION / 4, dtype=torch.float32)
            log_t[a] += torch.log1p(-alpha.double())
    for a in range(3):
        assert torch.allclose(together[a], (-torch.expm1(log_t[a])).float(), rtol=0, atol=1e-5)
        assert float(together[a].max()) > 0.5  # the spheres are there
