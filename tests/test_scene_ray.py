"""A scene's tiles on Ray workers and inside a memory budget (``mesh --tiles --workers N``, ``--memory GB``):
the same file as the serial run, resumed or not; smaller budgets, smaller tiles."""

from __future__ import annotations

import logging
import re
import sys

import pytest

from microdreamer.config import FieldConfig, MeshConfig
from microdreamer.mesh import save_mesh
from microdreamer.scene import plan_scene, scene_to_mesh

pytest.importorskip("skimage")
sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
from test_scene import SCENE, spheres  # noqa: E402  (the scene tests' input builder)


@pytest.fixture(scope="module")
def cluster():
    """One local cluster of 2 CPU workers for the module (Ray starts in seconds, not milliseconds)."""
    ray = pytest.importorskip("ray", reason="the Ray tests need ray (pip install -e '.[distributed]')")
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def four():
    """Four spheres, a plan of 20-cell tiles (18 tiles with Gaussians) and the serial run's GLB bytes."""
    splat = spheres(SCENE[:4])
    plan = plan_scene(splat, FieldConfig(), tile=20)
    serial = scene_to_mesh(splat, FieldConfig(), MeshConfig(threshold="auto"), plan=plan, colors=True)
    return splat, plan, serial


def _glb(mesh, path) -> bytes:
    save_mesh(mesh, path)
    return path.read_bytes()


def test_ray_tiles_give_the_serial_file(cluster, four, tmp_path):
    from microdreamer.jobs.scene_ray import RayTiles

    splat, plan, serial = four
    with RayTiles(workers=2) as tiles:
        assert tiles.workers == 2 and tiles.threads == 1
        result = scene_to_mesh(splat, FieldConfig(), MeshConfig(threshold="auto"), plan=plan, colors=True,
                               map_tiles=tiles)  # fmt: skip
    assert result.level == serial.level
    assert _glb(result.mesh, tmp_path / "ray.glb") == _glb(serial.mesh, tmp_path / "serial.glb")
    # the per-tile counters come back from the workers: the same peak of one tile's grid arrays
    assert (result.memory.peak, result.memory.largest) == (serial.memory.peak, serial.memory.largest)
    assert result.memory.current == 0
    assert set(result.stats["worker_seconds"]) >= {"field", "marching", "colour"}
    assert cluster.is_initialized()  # a cluster it did not start is left running


class _Stop(Exception):
    pass


def _stop_after(prefix: str, count: int):
    seen = []

    def progress(message: str) -> None:
        if message.startswith(prefix):
            seen.append(message)
            if len(seen) == count:
                raise _Stop

    return progress


@pytest.mark.parametrize("prefix", ["tile ", "iso-level pass"])
def test_a_resumed_ray_run_writes_the_uninterrupted_file(cluster, four, tmp_path, prefix):
    """Interrupted after 3 tiles of the second pass (or 3 fields of the first), then run again: the work
    folder's tiles (or fields) are reused and the file is the uninterrupted run's."""
    from microdreamer.jobs.scene_ray import RayTiles

    splat, plan, serial = four
    config = MeshConfig(threshold="auto")
    work = tmp_path / "work"
    with pytest.raises(_Stop), RayTiles(workers=2) as tiles:
        scene_to_mesh(splat, FieldConfig(), config, plan=plan, colors=True, work_dir=work, map_tiles=tiles,
                      progress=_stop_after(prefix, 3))  # fmt: skip
    kept = "tile" if prefix == "tile " else "field"
    assert len([p for p in work.iterdir() if re.fullmatch(rf"{kept}_\d+\.np[yz]", p.name)]) >= 3
    with RayTiles(workers=2) as tiles:
        resumed = scene_to_mesh(splat, FieldConfig(), config, plan=plan, colors=True, work_dir=work,
                                map_tiles=tiles)  # fmt: skip
    # the workers may finish a few more tiles before they are stopped: at least the 3 the driver saw
    assert resumed.stats["tiles_resumed" if kept == "tile" else "fields_resumed"] >= 3
    assert _glb(resumed.mesh, tmp_path / "resumed.glb") == _glb(serial.mesh, tmp_path / "serial.glb")


def test_mesh_command_with_workers_writes_the_serial_file(cluster, tmp_path, capsys):
    from microdreamer import cli
    from microdreamer.splat import write_ply

    write_ply(spheres(SCENE[:2], n=600), tmp_path / "two.ply")
    for name, extra in (("serial", []), ("ray", ["--workers", "2"])):
        assert cli.main(["mesh", str(tmp_path / "two.ply"), "-o", str(tmp_path / f"{name}.glb"),
                         "--tiles", "3", *extra]) == 0  # fmt: skip
    err = capsys.readouterr().err
    assert "tiles on 2 Ray worker(s), 1 thread(s) each" in err
    assert (tmp_path / "ray.glb").read_bytes() == (tmp_path / "serial.glb").read_bytes()
    assert not (tmp_path / "ray.glb.tiles").exists()


# --------------------------------------------------------------------------------------------- memory
def test_smaller_budgets_choose_smaller_tiles_and_the_counted_peak_stays_under():
    """The budget caps the tile; the counted grid arrays of one tile (MemoryCounter) follow the tile and
    stay under the budget, and under the estimate the tile was chosen by."""
    from microdreamer.scene import tiles as scene_tiles

    splat = spheres(SCENE[:4], n=600)
    config = MeshConfig(threshold=0.2)
    runs = {}
    for mb in (20, 6, 2):
        budget = mb * 10**6
        plan = plan_scene(splat, FieldConfig(), tile=128, memory=budget)
        runs[mb] = scene_to_mesh(splat, FieldConfig(), config, plan=plan, colors=True, memory=budget)
        r = runs[mb]
        assert r.memory.peak <= r.stats["tile_memory_estimate_bytes"] <= budget
        assert r.memory.current == 0
        assert r.stats["memory_budget_bytes"] == budget
        # the tile is the largest the estimate fits: 15 % larger would not
        larger = min(max(plan.grid.shape) - 1, int(plan.tile / 0.85) + 1)
        if larger > plan.tile:
            need = scene_tiles.tile_memory(larger, scene_tiles.densest_tile(plan.prepared, larger))
            assert need > budget
    tiles = [runs[mb].plan.tile for mb in (20, 6, 2)]
    peaks = [runs[mb].memory.peak for mb in (20, 6, 2)]
    assert tiles[0] > tiles[1] > tiles[2] >= scene_tiles.MIN_TILE, tiles
    assert peaks[0] > peaks[1] > peaks[2], peaks
    # whatever the tiling, the same surface
    faces = {runs[mb].mesh.num_faces for mb in runs}
    assert len(faces) == 1, faces


def test_the_estimate_bounds_the_densest_tile():
    """densest_tile (the centres' count grown by the halo) is at least the tiles' real bins here."""
    from microdreamer.scene import tiles as scene_tiles

    splat = spheres(SCENE[:4], n=600)
    for tile in (12, 20, 33):
        plan = plan_scene(splat, FieldConfig(), tile=tile)
        binned = int(plan.occupied()[1].max())
        assert scene_tiles.densest_tile(plan.prepared, tile) >= binned, tile


def test_the_progress_line_says_the_tile_and_the_budget(tmp_path, capsys):
    from microdreamer import cli
    from microdreamer.splat import write_ply

    write_ply(spheres(SCENE[:2], n=300), tmp_path / "two.ply")
    assert cli.main(["mesh", str(tmp_path / "two.ply"), "-o", str(tmp_path / "two.glb"), "--tiles", "auto",
                     "--memory", "0.004", "--texture", "none"]) == 0  # fmt: skip
    line = next(x for x in capsys.readouterr().err.splitlines() if "scene grid" in x)
    assert re.search(r"tiles of \d+\^3 cells .*one tile's work about .* GB of a 0.004 GB budget", line), line


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--tiles", "auto", "--memory", "0"], "error: --memory 0.0: must be a number of GB above 0, or auto"),
        (["--tiles", "auto", "--memory", "lots"], "error: --memory lots: must be a number of GB above 0, or auto"),
        (["--workers", "2"], "error: --workers: runs batches or a scene's tiles; give several inputs, a folder, "
                             "or --tiles auto|N (--tiles off runs here)"),
        (["--tiles", "off", "--ray-address", "auto"], "error: --ray-address: runs batches or a scene's tiles"),
        (["--tiles", "auto", "--memory", "0.000001"], "give --memory"),
    ],
)  # fmt: skip
def test_bad_values_are_one_line(tmp_path, capsys, extra, message):
    from microdreamer import cli
    from microdreamer.splat import write_ply

    write_ply(spheres(SCENE[:1], n=200), tmp_path / "one.ply")
    assert cli.main(["mesh", str(tmp_path / "one.ply"), "-o", str(tmp_path / "one.glb"), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and message in err[-1], err
    assert not (tmp_path / "one.glb").exists()


def test_workers_without_ray_is_one_line(tmp_path, capsys, monkeypatch):
    from microdreamer import cli
    from microdreamer.jobs import batch
    from microdreamer.splat import write_ply

    write_ply(spheres(SCENE[:1], n=200), tmp_path / "one.ply")
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    args = [
        "mesh",
        str(tmp_path / "one.ply"),
        "-o",
        str(tmp_path / "one.glb"),
        "--tiles",
        "2",
        "--workers",
        "2",
    ]
    assert cli.main(args) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == "error: " + batch.RAY_MISSING.format(
        flag="--workers"
    )
