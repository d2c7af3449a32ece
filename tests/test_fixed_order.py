"""Grouped and threaded CPU paths give each camera's and each texel's result independently of the
grouping, to the bit, on any CPU and BLAS.

The cause this guards against: a float32 matrix product on the CPU (``einsum``, ``@``, ``bmm``) goes to
MKL, whose kernel and summation order depend on the matrices' shapes and on the CPU's code path; on an
AVX-512 EPYC with ``MKL_CBWR`` unset (or AUTO, AVX2, AVX512, SSE4_2) a camera's projected points
differed in their last bits with the number of cameras in the call, and a texel's with the size of its
texel range. The paths now sum their small products in a fixed order on elementwise kernels
(:mod:`microdreamer.fixed_order`), so the grouping cannot change a bit. Checked here with every group
size, under every MKL code path (subprocesses, one per ``MKL_CBWR`` value) and with busy threads
started by the test. Nothing here depends on the machine's speed or on how threads are scheduled.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import microdreamer
from microdreamer import fixed_order
from microdreamer.cameras import orbit_cameras
from microdreamer.render import _torch_raster as tr
from microdreamer.render.mesh import rasterize, rasterize_depth
from microdreamer.synthetic import random_sh_splat
from microdreamer.texture.atlas import TexelSamples

MKL_CODE_PATHS = ["COMPATIBLE", "AUTO", "SSE4_2", "AVX2", "AVX512"]


# ------------------------------------------------------------------------------------------ builders
def _cameras(seed: int, n: int, width: int = 41, height: int = 37, radius: float = 1.5):
    g = torch.Generator().manual_seed(seed + 1000)
    el = torch.rand(n, generator=g) * 60 - 30
    az = torch.rand(n, generator=g) * 360
    return orbit_cameras(el, az, radius=radius, width=width, height=height)


def _soup(seed: int, n_vertices: int, n_faces: int):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n_vertices, 3, generator=g) - 0.5, torch.randint(
        0, n_vertices, (n_faces, 3), generator=g
    )


def _splits(n: int, quick: bool = False) -> list[list[int]]:
    """Ways to cut range(n) into consecutive groups: every group size 1..n-1 and one uneven cut
    (``quick``: sizes 1 and 2 and the uneven cut)."""
    sizes = (1, 2) if quick else range(1, n)
    cuts = [list(range(0, n, size)) + [n] for size in sizes]
    if n > 3:
        cuts.append([0, 1, n - 2, n])
    return cuts


def _texels(seed: int, t: int) -> TexelSamples:
    """T texels on a sphere of radius 0.5 with outward normals (what the bake's accumulation reads)."""
    g = torch.Generator().manual_seed(seed)
    n = torch.randn(t, 3, generator=g)
    n = n / n.norm(dim=-1, keepdim=True)
    empty = torch.zeros(t, dtype=torch.int64)
    return TexelSamples(8, 8, empty, empty, torch.zeros(t, 3), 0.5 * n, n)


# ------------------------------------------------------------------------------------------ checks
def check_products() -> None:
    """Each row of the fixed-order products equals the whole batch's, for every split of the batch."""
    g = torch.Generator().manual_seed(0)
    R, t = torch.randn(7, 3, 3, generator=g), torch.randn(7, 3, generator=g)
    p = torch.randn(1001, 3, generator=g)
    whole = fixed_order.transform_points(R, t, p)
    for cut in _splits(7):
        parts = [
            fixed_order.transform_points(R[a:b], t[a:b], p) for a, b in zip(cut[:-1], cut[1:], strict=True)
        ]
        assert torch.equal(torch.cat(parts), whole), cut
    for size in (1, 2, 17, 333, 500):
        parts = [fixed_order.transform_points(R, t, p[a : a + size]) for a in range(0, len(p), size)]
        assert torch.equal(torch.cat(parts, 1), whole), size
    a, b = torch.randn(5, 9, 4, 3, generator=g), torch.randn(5, 9, 3, 2, generator=g)
    whole = fixed_order.matmul(a, b)
    assert torch.equal(
        torch.cat([fixed_order.matmul(a[i : i + 2], b[i : i + 2]) for i in range(0, 5, 2)]), whole
    )
    assert torch.equal(
        fixed_order.matmul(a.transpose(0, 1).contiguous(), b.transpose(0, 1)), whole.transpose(0, 1)
    )
    v = torch.randn(1000, 3, generator=g)
    assert torch.equal(
        torch.cat([fixed_order.norm(v[i : i + 7]) for i in range(0, 1000, 7)]), fixed_order.norm(v)
    )


def check_mesh_rasterisation(quick: bool = False) -> None:
    """rasterize and rasterize_depth (PyTorch) of every group of cameras equal the one call's slice,
    and so do camera groups on threads."""
    verts, faces = _soup(7, 200, 300)
    cams = _cameras(7, 5)
    whole = rasterize(verts, faces, cams, max_candidates=5000, workers=1)
    depth, alpha = rasterize_depth(verts, faces, cams, cull_backfaces=True, workers=1, backend="torch")
    assert int((whole.face_id >= 0).sum()) > 0 and float(alpha.sum()) > 0
    for cut in _splits(len(cams), quick):
        for a, b in zip(cut[:-1], cut[1:], strict=True):
            part = rasterize(verts, faces, cams[a:b], max_candidates=5000, workers=1)
            for k in ("face_id", "bary", "depth", "alpha"):
                assert torch.equal(getattr(part, k), getattr(whole, k)[a:b]), (cut, k)
            d, al = rasterize_depth(verts, faces, cams[a:b], cull_backfaces=True, workers=1, backend="torch")
            assert torch.equal(d, depth[a:b]) and torch.equal(al, alpha[a:b]), cut
    for workers in (2,) if quick else (2, 3, 5):
        got = rasterize(verts, faces, cams, max_candidates=5000, workers=workers)
        assert all(torch.equal(getattr(got, k), getattr(whole, k)) for k in ("face_id", "bary", "depth")), (
            workers
        )
        d, al = rasterize_depth(verts, faces, cams, cull_backfaces=True, workers=workers, backend="torch")
        assert torch.equal(d, depth) and torch.equal(al, alpha), workers


def check_bake_accumulation(quick: bool = False) -> None:
    """The bake's accumulation (PyTorch, compacted or masked) on ranges of texels of every size, and on
    1-4 threads, equals the whole range's sums."""
    from microdreamer.config import BakeConfig
    from microdreamer.texture.bake import _accumulate, _accumulate_texels

    samples = _texels(3, 301)
    cams = _cameras(3, 4, 24, 20)
    verts, faces = _soup(3, 100, 200)
    depth = rasterize_depth(0.5 * verts, faces, cams, workers=1, backend="torch")[0].reshape(-1)
    depth = torch.where(depth > 0, depth, torch.full_like(depth, float("inf")))
    g = torch.Generator().manual_seed(3)
    rgba = torch.rand(len(cams) * 24 * 20, 4, generator=g)
    rgba[:, :3] *= rgba[:, 3:]
    config = BakeConfig(depth_eps=10.0)  # the random soup hides little: most pairs pass

    def sums(compact: bool, ranges) -> tuple[torch.Tensor, torch.Tensor]:
        num, den = torch.zeros(len(samples), 3), torch.zeros(len(samples))
        for a, b in ranges:
            _accumulate_texels(
                samples.points[a:b],
                samples.normals[a:b],
                cams,
                rgba,
                depth,
                config,
                num[a:b],
                den[a:b],
                compact,
            )
        return num, den

    whole = sums(False, [(0, len(samples))])
    assert 0 < int((whole[1] > 0).sum()) < len(samples)
    for compact in (False, True):
        for size in (1, 100) if quick else (1, 2, 3, 13, 100, 150, 300):
            ranges = [(a, min(a + size, len(samples))) for a in range(0, len(samples), size)]
            num, den = sums(compact, ranges)
            assert torch.equal(num, whole[0]) and torch.equal(den, whole[1]), (compact, size)
    for workers in (2,) if quick else (1, 2, 3, 4):
        num, den = torch.zeros(len(samples), 3), torch.zeros(len(samples))
        _accumulate(
            samples, cams, rgba, depth, config, num, den, compact=True, workers=workers, backend="torch"
        )
        assert torch.equal(num, whole[0]) and torch.equal(den, whole[1]), workers


def check_gaussian_projection(quick: bool = False) -> None:
    """The Gaussian projection (the C++ and PyTorch backends' first step) of every group of cameras
    equals the one call's slice: means, conics, depths and radii."""
    splat = random_sh_splat(300, seed=5, log_scale=-2.0, spread=0.5)
    cams = _cameras(5, 5, 40, 31, radius=2.5)
    op = splat.opacities()

    def project(c):
        return tr.project(splat.means, splat.covariances(), op, c.viewmats, c.Ks, 40, 31, c.near, c.far)

    with torch.no_grad():
        whole = project(cams)
        assert int((whole.radii > 0).all(-1).sum()) > 0
        for cut in _splits(len(cams), quick):
            for a, b in zip(cut[:-1], cut[1:], strict=True):
                part = project(cams[a:b])
                for k in ("means2d", "conics", "depths", "radii"):
                    assert torch.equal(getattr(part, k), getattr(whole, k)[a:b]), (cut, k)


def check_all(quick: bool = False) -> None:
    check_products()
    check_mesh_rasterisation(quick)
    check_bake_accumulation(quick)
    check_gaussian_projection(quick)


# ------------------------------------------------------------------------------------------ tests
def test_fixed_order_products_equal_the_plain_products_to_rounding():
    """The fixed-order products are the products (float64 reference; float32 rounding of 3 terms)."""
    g = torch.Generator().manual_seed(1)
    R, t, p = (
        torch.randn(4, 3, 3, generator=g),
        torch.randn(4, 3, generator=g),
        torch.randn(50, 3, generator=g),
    )
    want = torch.einsum("cij,nj->cni", R.double(), p.double()) + t.double()[:, None]
    torch.testing.assert_close(fixed_order.transform_points(R, t, p).double(), want, rtol=1e-6, atol=1e-6)
    got = fixed_order.transform_points(R, None, p).double()
    torch.testing.assert_close(got, want - t.double()[:, None], rtol=1e-6, atol=1e-6)
    a, b = torch.randn(6, 2, 5, generator=g), torch.randn(6, 5, 3, generator=g)
    torch.testing.assert_close(fixed_order.matmul(a, b), a @ b, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(fixed_order.dot(a, a), (a * a).sum(-1), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(fixed_order.norm(a), a.norm(dim=-1), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(fixed_order.total(b, 1), b.sum(1), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="matmul"):
        fixed_order.matmul(a, a)
    with pytest.raises(ValueError, match="dot"):
        fixed_order.dot(a, b)


def test_fixed_order_products_are_the_same_bits_in_any_batch():
    check_products()


def test_mesh_rasterisation_is_the_same_bits_for_any_camera_group():
    check_mesh_rasterisation()


def test_bake_accumulation_is_the_same_bits_for_any_texel_range():
    pytest.importorskip("xatlas", reason="the texture stage needs xatlas (pip install xatlas)")
    check_bake_accumulation()


def test_gaussian_projection_is_the_same_bits_for_any_camera_group():
    check_gaussian_projection()


def test_grouped_paths_are_the_same_bits_with_busy_threads():
    """The checks again while threads started here keep the CPU busy (BLAS products, elementwise work
    and pure-Python loops that hold the GIL): the results may come later, never differently. The busy
    threads stop when the checks end, however long that takes."""
    stop = threading.Event()

    # each busy thread works in bursts and then lets the others run: on 2 cores, three threads that never
    # yield the GIL or torch's thread pool made the checks take minutes (the point is contention, not
    # starvation); the products stay small enough for one BLAS thread, the elementwise ops under
    # torch's parallel grain
    def blas():
        x = torch.randn(96, 96)
        while not stop.is_set():
            for _ in range(20):
                x = torch.tanh(x @ x)
            time.sleep(0.0005)

    def elementwise():
        x = torch.randn(1 << 14)
        while not stop.is_set():
            for _ in range(20):
                x = torch.sin(x) * 1.0001 + 0.5
            time.sleep(0.0005)

    def python():
        n = 0
        while not stop.is_set():
            for _ in range(20000):
                n = (n * 31 + 7) % 1000003
            time.sleep(0.0005)

    threads = [threading.Thread(target=f, daemon=True) for f in (blas, elementwise, python)]
    for th in threads:
        th.start()
    try:
        check_all(quick=True)
    finally:
        stop.set()
        for th in threads:
            th.join()


def _child_env(cbwr: str) -> dict:
    """This process's environment with ``MKL_CBWR`` set and this checkout's package first on the path."""
    env = dict(os.environ)
    env["MKL_CBWR"] = cbwr
    src = str(Path(microdreamer.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(
        [src, str(Path(__file__).resolve().parent), env.get("PYTHONPATH", "")]
    )
    return env


def test_grouped_paths_are_the_same_bits_under_every_mkl_code_path():
    """:func:`check_all` in one subprocess per ``MKL_CBWR`` value (MKL reads it once, at load): the
    code paths that made grouped results differ on an AVX-512 EPYC, and the one that did not. A value
    the CPU cannot take leaves MKL on its default path, which is then checked twice. The subprocesses
    run side by side and are waited for without a time limit."""
    code = "import test_fixed_order as t; t.check_all(quick=True); print('grouped paths: same bits')"
    procs = {
        cbwr: subprocess.Popen(
            [sys.executable, "-c", code],
            env=_child_env(cbwr),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for cbwr in MKL_CODE_PATHS
    }
    failed = {}
    for cbwr, proc in procs.items():
        out, err = proc.communicate()
        if proc.returncode != 0 or "same bits" not in out:
            failed[cbwr] = err.strip().splitlines()[-3:]
    assert not failed, failed


#: every test elsewhere that compares a grouped or threaded CPU path with one call to the bit (or, for
#: the PyTorch Gaussian compositing, to its stated 1e-6)
GROUPED_TESTS = [
    "tests/test_render_mesh.py::test_camera_groups_on_threads_give_the_same_fragments",
    "tests/test_render_mesh.py::test_depth_only_rasterisation_equals_the_full_one",
    "tests/test_render_mesh.py::test_depth_only_rasterisation_of_a_closed_mesh_in_the_bake_views",
    "tests/test_render_mesh.py::test_result_independent_of_chunking",
    "tests/test_texture.py::test_compacted_accumulation_equals_the_masked_one_to_the_bit",
    "tests/test_render_gaussians.py::test_camera_groups_on_threads_match_one_thread",
    "tests/test_render_cpp.py::test_rasterize_parts_on_threads_match_one_thread",
    "tests/test_bake_cpu.py::test_cpp_accumulation_matches_the_torch_reference",
    "tests/test_fixed_order.py::test_grouped_paths_are_the_same_bits_with_busy_threads",
]


@pytest.mark.slow
@pytest.mark.parametrize("cbwr", MKL_CODE_PATHS)
def test_every_grouped_path_test_passes_under_the_mkl_code_path(cbwr):
    """The whole selection above in a pytest subprocess with ``MKL_CBWR`` set (~10 s each, hence slow;
    :func:`test_grouped_paths_are_the_same_bits_under_every_mkl_code_path` is the fast representative)."""
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *GROUPED_TESTS],
        cwd=root,
        env=_child_env(cbwr),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert " failed" not in proc.stdout and " passed" in proc.stdout
