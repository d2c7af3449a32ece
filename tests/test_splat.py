import logging

import numpy as np
import pytest
import torch

from conftest import sample
from microdreamer.errors import InputError
from microdreamer.splat import LOG_SCALE_MIN, Splat, num_sh_coeffs, quat_to_rotmat, read_ply, write_ply
from microdreamer.synthetic import make_random_splat

INRIA_ORDER = (
    ["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2"],
    ["opacity", "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"],
)


def _random_splat(n, degree, seed=0):
    s = make_random_splat(n, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    s.sh_rest = torch.randn(n, num_sh_coeffs(degree) - 1, 3, generator=g)
    return s


def _write_raw(path, props, data, fmt="binary_little_endian", count=None, extra_header=""):
    """Write a PLY by hand: props [names], data [N, P] float32."""
    count = len(data) if count is None else count
    header = f"ply\nformat {fmt} 1.0\n{extra_header}element vertex {count}\n"
    header += "".join(f"property float {p}\n" for p in props) + "end_header\n"
    with open(path, "wb") as f:
        f.write(header.encode())
        if fmt == "ascii":
            f.write("\n".join(" ".join(repr(float(v)) for v in row) for row in data).encode() + b"\n")
        else:
            f.write(np.asarray(data, dtype="<f4" if fmt == "binary_little_endian" else ">f4").tobytes())


def _table(n=5, seed=0):
    g = np.random.default_rng(seed)
    props = INRIA_ORDER[0] + INRIA_ORDER[1]
    data = g.standard_normal((n, len(props))).astype(np.float32)
    return props, data


@pytest.mark.parametrize("degree", [0, 1, 2, 3])
@pytest.mark.parametrize("n", [1, 7, 300])
def test_roundtrip_every_sh_degree(tmp_path, degree, n):
    s = _random_splat(n, degree, seed=n + degree)
    write_ply(s, tmp_path / "s.ply")
    back = read_ply(tmp_path / "s.ply")
    assert back.sh_degree == degree
    for name, t in s.tensors().items():
        assert torch.equal(getattr(back, name), t.float()), name


def test_written_header_is_inria_layout(tmp_path):
    write_ply(_random_splat(3, 1), tmp_path / "s.ply")
    raw = (tmp_path / "s.ply").read_bytes()
    header = raw[: raw.index(b"end_header")].decode().splitlines()
    assert header[1] == "format binary_little_endian 1.0"
    props = [line.split()[-1] for line in header if line.startswith("property")]
    assert props == INRIA_ORDER[0] + [f"f_rest_{i}" for i in range(9)] + INRIA_ORDER[1]
    assert all(line.startswith("property float ") for line in header if line.startswith("property"))


def test_f_rest_is_channel_major(tmp_path):
    """f_rest_j holds channel j // (K-1), coefficient j % (K-1), as INRIA's exporter writes it."""
    s = _random_splat(2, 1)
    write_ply(s, tmp_path / "s.ply")
    raw = (tmp_path / "s.ply").read_bytes()
    body = np.frombuffer(raw[raw.index(b"end_header\n") + 11 :], dtype="<f4").reshape(2, -1)
    f_rest = body[:, 9:18]
    assert np.array_equal(f_rest[:, 3 * 1 + 2], s.sh_rest[:, 2, 1].numpy())  # green, coefficient 2


def test_activations_and_covariance():
    s = _random_splat(50, 0, seed=3)
    q = s.rotations()
    assert torch.allclose(q.norm(dim=-1), torch.ones(50), atol=1e-6)
    rot = quat_to_rotmat(torch.nn.functional.normalize(s.quats.double(), dim=-1))
    assert torch.allclose(
        rot @ rot.transpose(1, 2), torch.eye(3, dtype=torch.float64).expand(50, 3, 3), atol=1e-12
    )
    assert torch.allclose(torch.linalg.det(rot), torch.ones(50, dtype=torch.float64), atol=1e-12)
    cov = s.covariances().double()
    eig = torch.linalg.eigvalsh(cov)
    assert torch.allclose(eig.sort(-1).values, (s.scales().double() ** 2).sort(-1).values, rtol=1e-4)
    assert torch.allclose(s.opacities(), torch.sigmoid(s.opacity_logits))


def test_ascii_and_big_endian_are_read(tmp_path):
    props, data = _table(4)
    data[:, props.index("rot_0")] = 1.0
    ref_path, asc, big = tmp_path / "le.ply", tmp_path / "ascii.ply", tmp_path / "be.ply"
    _write_raw(ref_path, props, data)
    _write_raw(asc, props, data, fmt="ascii")
    _write_raw(big, props, data, fmt="binary_big_endian")
    ref = read_ply(ref_path)
    for p in (asc, big):
        got = read_ply(p)
        for name, t in ref.tensors().items():
            assert torch.equal(getattr(got, name), t), (p.name, name)


def test_unknown_property_is_ignored_with_a_warning(tmp_path, caplog):
    props, data = _table(3)
    data[:, props.index("rot_0")] = 1.0
    _write_raw(tmp_path / "x.ply", props + ["transform"], np.concatenate([data, data[:, :1]], 1))
    with caplog.at_level(logging.WARNING):
        s = read_ply(tmp_path / "x.ply")
    assert len(s) == 3
    assert "ignoring unknown PLY properties: transform" in caplog.text


# --- bad input: one line, naming the file and the problem -------------------------------------------
def _expect_error(path, *fragments):
    with pytest.raises(InputError) as e:
        read_ply(path)
    msg = str(e.value)
    assert "\n" not in msg
    assert str(path) in msg
    for frag in fragments:
        assert frag in msg, msg
    return msg


def test_missing_file(tmp_path):
    _expect_error(tmp_path / "nope.ply", "file not found")


def test_not_a_ply(tmp_path):
    (tmp_path / "a.ply").write_bytes(b"\x89PNG\r\n\x1a\n" + b"0" * 100)
    _expect_error(tmp_path / "a.ply", "not a PLY file")


def test_missing_required_properties(tmp_path):
    props, data = _table(3)
    keep = [i for i, p in enumerate(props) if p not in ("scale_1", "rot_3")]
    _write_raw(tmp_path / "m.ply", [props[i] for i in keep], data[:, keep])
    _expect_error(tmp_path / "m.ply", "missing required PLY properties", "scale_1", "rot_3")


def test_truncated_data(tmp_path):
    props, data = _table(10)
    _write_raw(tmp_path / "t.ply", props, data)
    raw = (tmp_path / "t.ply").read_bytes()
    (tmp_path / "t.ply").write_bytes(raw[: len(raw) - 5])
    _expect_error(tmp_path / "t.ply", "truncated", "declares 10 Gaussians", "holds 9")


def test_non_finite_values_are_counted(tmp_path):
    props, data = _table(6)
    data[:, props.index("rot_0")] = 1.0
    data[1, props.index("x")] = np.nan
    data[2, props.index("scale_2")] = np.inf
    data[4, props.index("scale_0")] = -np.inf
    _write_raw(tmp_path / "n.ply", props, data)
    _expect_error(
        tmp_path / "n.ply", "3 non-finite values", "position (1)", "scale (2)", "Gaussians #1, #2, #4"
    )


def test_zero_length_quaternions_are_dropped_and_named(tmp_path, caplog):
    """Policy (splat.py docstring): a Gaussian with no orientation is dropped with a warning naming it."""
    props, data = _table(5)
    for p in ("rot_0", "rot_1", "rot_2", "rot_3"):
        data[[1, 3], props.index(p)] = 0.0
    _write_raw(tmp_path / "q.ply", props, data)
    with caplog.at_level(logging.WARNING):
        s = read_ply(tmp_path / "q.ply")
    assert len(s) == 3
    assert torch.equal(s.means, torch.from_numpy(data[[0, 2, 4]][:, :3]))
    assert "dropped 2 of 5 Gaussians" in caplog.text and "#1, #3" in caplog.text and "all zero" in caplog.text


def test_tiny_quaternions_are_not_called_zero(tmp_path, caplog):
    props, data = _table(4)
    for p in ("rot_0", "rot_1", "rot_2", "rot_3"):
        data[2, props.index(p)] = 1e-30
    _write_raw(tmp_path / "q.ply", props, data)
    with caplog.at_level(logging.WARNING):
        assert len(read_ply(tmp_path / "q.ply")) == 3
    assert "length down to 2e-30" in caplog.text and "all zero" not in caplog.text and "#2" in caplog.text


def test_every_gaussian_degenerate_is_an_error(tmp_path):
    props, data = _table(3)
    for p in ("rot_0", "rot_1", "rot_2", "rot_3"):
        data[:, props.index(p)] = 0.0
    _write_raw(tmp_path / "q.ply", props, data)
    _expect_error(tmp_path / "q.ply", "every Gaussian is degenerate", "#0, #1, #2")


def test_underflowing_log_scales_are_clamped_and_named(tmp_path, caplog):
    """exp(-200) is 0 in float32; such an axis is raised to the smallest normal scale (a flat disc)."""
    props, data = _table(6)
    data[:, props.index("rot_0")] = 1.0
    data[4, props.index("scale_1")] = -200.0
    _write_raw(tmp_path / "t.ply", props, data)
    with caplog.at_level(logging.WARNING):
        s = read_ply(tmp_path / "t.ply")
    assert len(s) == 6
    assert float(s.log_scales[4, 1]) == pytest.approx(LOG_SCALE_MIN)
    assert torch.equal(s.log_scales[[0, 1, 2, 3, 5]], torch.from_numpy(data[[0, 1, 2, 3, 5]][:, -7:-4]))
    assert bool((s.scales() > 0).all()) and bool(torch.isfinite(s.scales()).all())
    assert "1 Gaussians (#4)" in caplog.text and "-200" in caplog.text


def test_overflowing_log_scales_are_dropped(tmp_path, caplog):
    props, data = _table(6)
    data[:, props.index("rot_0")] = 1.0
    data[0, props.index("scale_2")] = 100.0
    _write_raw(tmp_path / "t.ply", props, data)
    with caplog.at_level(logging.WARNING):
        s = read_ply(tmp_path / "t.ply")
    assert len(s) == 5 and bool(torch.isfinite(s.scales()).all())
    assert "dropped 1 of 6" in caplog.text and "#0" in caplog.text


def test_integer_typed_scales_load_finite(tmp_path):
    """A retyped property (int scale_0 over float bytes) reads as numbers; the degenerate ones are
    clamped, so every scale is positive and finite."""
    write_ply(make_random_splat(40, seed=2), tmp_path / "s.ply")
    raw = (tmp_path / "s.ply").read_bytes()
    (tmp_path / "i.ply").write_bytes(raw.replace(b"property float scale_0", b"property int scale_0"))
    s = read_ply(tmp_path / "i.ply")
    scales = s.scales()
    assert len(s) > 0 and bool(torch.isfinite(scales).all()) and bool((scales > 0).all())


def test_doubles_beyond_float32_are_non_finite(tmp_path):
    props, data = _table(3)
    data[:, props.index("rot_0")] = 1.0
    header = "ply\nformat binary_little_endian 1.0\nelement vertex 3\n"
    header += "".join(f"property {'double' if p == 'x' else 'float'} {p}\n" for p in props) + "end_header\n"
    dtype = np.dtype([(p, "<f8" if p == "x" else "<f4") for p in props])
    table = np.zeros(3, dtype)
    for j, p in enumerate(props):
        table[p] = data[:, j]
    table["x"][1] = 1e300
    (tmp_path / "d.ply").write_bytes(header.encode() + table.tobytes())
    _expect_error(tmp_path / "d.ply", "1 non-finite values", "too large for float32", "Gaussians #1")


def _header_edit(tmp_path, old, new, n=5):
    props, data = _table(n)
    data[:, props.index("rot_0")] = 1.0
    _write_raw(tmp_path / "h.ply", props, data)
    raw = (tmp_path / "h.ply").read_bytes()
    assert old in raw
    (tmp_path / "h.ply").write_bytes(raw.replace(old, new, 1))
    return tmp_path / "h.ply"


def test_duplicate_property_names(tmp_path):
    path = _header_edit(tmp_path, b"property float nx", b"property float x")
    _expect_error(path, "property 'x' appears twice")


@pytest.mark.parametrize(
    "old,new",
    [
        (b"property float nx\n", b"property\n"),  # bare
        (b"property float nx\n", b"property float\n"),
        (b"property float nx\n", b"property float nx extra\n"),
        (b"property float nx\n", b"property list uchar\n"),
        (b"element vertex 5", b"element vertex five"),
        (b"element vertex 5", b"element vertex -5"),
        (b"property float nx\n", b"propertx float nx\n"),
    ],
)
def test_malformed_header_lines(tmp_path, old, new):
    _expect_error(_header_edit(tmp_path, old, new), "malformed PLY header line")


def test_unknown_property_type(tmp_path):
    _expect_error(
        _header_edit(tmp_path, b"property float nx", b"property half nx"), "unsupported PLY property type"
    )


@pytest.mark.parametrize("count", [10**9, 10**12, 10**30])
def test_huge_counts_are_checked_against_the_file_size(tmp_path, count):
    """The header's count is weighed against the file's size before anything is allocated."""
    import tracemalloc

    path = _header_edit(tmp_path, b"element vertex 5", f"element vertex {count}".encode())
    tracemalloc.start()
    try:
        _expect_error(path, "truncated", f"declares {count} Gaussians", "holds 5")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_huge_ascii_count_is_checked_against_the_file_size(tmp_path):
    props, data = _table(4)
    data[:, props.index("rot_0")] = 1.0
    _write_raw(tmp_path / "a.ply", props, data, fmt="ascii", count=10**12)
    _expect_error(tmp_path / "a.ply", "truncated", "declares 1000000000000 Gaussians", "room for at most")


def test_header_without_end_is_read_up_to_a_limit(tmp_path):
    """A file of zeros behind a PLY start (no newline, no end_header) is not read whole."""
    import tracemalloc

    path = tmp_path / "z.ply"
    with open(path, "wb") as f:
        f.write(b"ply\nformat binary_little_endian 1.0\ncomment ")
        f.truncate(1 << 30)  # 1 GB, sparse
    tracemalloc.start()
    try:
        _expect_error(path, "header runs past 1 MB")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20


def test_non_numeric_ascii_value(tmp_path):
    props, data = _table(3)
    data[:, props.index("rot_0")] = 1.0
    _write_raw(tmp_path / "a.ply", props, data, fmt="ascii")
    raw = (tmp_path / "a.ply").read_text().splitlines()
    row = raw[-2].split()
    row[props.index("opacity")] = "abc"
    raw[-2] = " ".join(row)
    (tmp_path / "a.ply").write_text("\n".join(raw) + "\n")
    _expect_error(tmp_path / "a.ply", "row 1 has the non-numeric value 'abc'", "'opacity'")


def test_read_reports_progress(tmp_path):
    write_ply(make_random_splat(50, seed=1), tmp_path / "s.ply")
    seen = []
    read_ply(tmp_path / "s.ply", progress=seen.append)
    assert seen and seen[-1] == 1.0 and seen == sorted(seen)


def test_empty_splat(tmp_path):
    props, data = _table(0)
    _write_raw(tmp_path / "e.ply", props, data)
    _expect_error(tmp_path / "e.ply", "empty (0 Gaussians)")


def test_bad_sh_count(tmp_path):
    props, data = _table(2)
    props = props[:9] + ["f_rest_0", "f_rest_1"] + props[9:]
    data = np.concatenate([data[:, :9], np.zeros((2, 2), np.float32), data[:, 9:]], 1)
    _write_raw(tmp_path / "sh.ply", props, data)
    _expect_error(tmp_path / "sh.ply", "found 2 f_rest_* properties")


def test_write_is_atomic(tmp_path, monkeypatch):
    s = _random_splat(4, 0)

    def broken(*a, **k):
        raise RuntimeError("disk full")

    # fails after the header has been written
    monkeypatch.setattr("microdreamer.splat.np.ascontiguousarray", broken)
    with pytest.raises(RuntimeError):
        write_ply(s, tmp_path / "s.ply")
    assert list(tmp_path.iterdir()) == []


def test_splat_shape_checks():
    s = _random_splat(3, 0)
    with pytest.raises(ValueError, match="log_scales"):
        Splat(s.means, s.sh_dc, s.sh_rest, s.opacity_logits, s.log_scales[:2], s.quats)


@pytest.mark.parametrize(
    "name,n,degree",
    [
        ("dg_creative_tmp_8.8k.ply", 8773, 0),
        ("dg_ghost_amd_17k.ply", 17038, 0),
        ("supersplat_fruit_drops_4.7k_sh3.ply", 4721, 3),
        ("pc_guitar_91k_sh0.decoded.ply", 90854, 0),
    ],
)
def test_sample_splats_load(tmp_path, name, n, degree):
    s = read_ply(sample(f"splats/{name}"))
    assert len(s) == n and s.sh_degree == degree
    write_ply(s, tmp_path / "copy.ply")
    back = read_ply(tmp_path / "copy.ply")
    assert all(torch.equal(getattr(back, k), v) for k, v in s.tensors().items())


@pytest.mark.parametrize("degree", [0, 1, 3])
@pytest.mark.parametrize("up", ["-y", "+z", "-z", "random"])
def test_transformed_splat_renders_as_the_same_object(degree, up):
    """A similarity x -> s R x + t applied to the splat, and to the cameras, changes no pixel: the
    centres, the Gaussians' axes and scales and the view-dependent SH bands all move with it."""
    from microdreamer.cameras import Cameras, orbit_cameras
    from microdreamer.orient import up_rotation
    from microdreamer.render import render
    from microdreamer.synthetic import random_sh_splat

    g = torch.Generator().manual_seed(7)
    if up == "random":
        q = torch.nn.functional.normalize(torch.randn(4, generator=g, dtype=torch.float64), dim=0)
        R = quat_to_rotmat(q)
    else:
        R = torch.as_tensor(np.asarray(up_rotation(up)), dtype=torch.float64)
    s, t = 1.7, torch.tensor([0.3, -0.2, 0.5], dtype=torch.float64)
    splat = random_sh_splat(300, seed=3, sh_degree=degree, spread=0.4, dtype=torch.float64)
    moved = splat.transformed(R, s, t)
    cams = orbit_cameras(torch.tensor([-20.0, 25.0]), torch.tensor([30.0, 200.0]), 2.5, 49.1, 32, 32)
    vm = cams.viewmats.double()
    rc, tc = vm[:, :3, :3], vm[:, :3, 3]
    vm2 = torch.eye(4, dtype=torch.float64).repeat(len(cams), 1, 1)
    vm2[:, :3, :3] = rc @ R.T
    vm2[:, :3, 3] = s * tc - (rc @ R.T @ t)
    cams2 = Cameras(vm2, cams.Ks.double(), cams.width, cams.height, cams.near * s, cams.far * s)
    a = render(splat, Cameras(vm, cams.Ks.double(), 32, 32, cams.near, cams.far), backend="torch")
    b = render(moved, cams2, backend="torch")
    assert a.alpha.max() > 0.5
    torch.testing.assert_close(b.rgb, a.rgb, rtol=0, atol=1e-7)  # float64 rounding
    torch.testing.assert_close(b.alpha, a.alpha, rtol=0, atol=1e-7)
    torch.testing.assert_close(moved.opacity_logits, splat.opacity_logits)


def test_rotmat_to_quat_round_trip():
    from microdreamer.splat import rotmat_to_quat

    g = torch.Generator().manual_seed(0)
    qs = torch.nn.functional.normalize(torch.randn(50, 4, generator=g, dtype=torch.float64), dim=-1)
    qs = torch.cat([qs, torch.eye(4, dtype=torch.float64)])  # the 180-degree cases
    for q in qs:
        back = rotmat_to_quat(quat_to_rotmat(q))
        assert torch.allclose(back, q, atol=1e-12) or torch.allclose(back, -q, atol=1e-12)
