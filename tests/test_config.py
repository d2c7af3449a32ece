import dataclasses

import pytest

from microdreamer.config import ExportConfig, from_dict, load_preset, to_dict
from microdreamer.errors import InputError
from microdreamer.field import FieldConfig

PRESET = "src/microdreamer/presets/dreamgaussian.yaml"


def test_defaults_are_documented_values():
    cfg = ExportConfig()
    assert cfg.field == FieldConfig(
        resolution="auto", mode="exact", num_blocks=16, relax_ratio=1.5, min_opacity=0.005
    )
    assert cfg.mesh.threshold == "auto" and cfg.field.filter_variance == 0.25
    assert cfg.mesh.carve == 24 and cfg.mesh.carve_level == 0.5
    assert FieldConfig().resolution == 128  # the library's default grid stays DreamGaussian's


def test_preset_loads_into_dataclasses(tmp_path):
    from pathlib import Path

    preset = Path(__file__).resolve().parents[1] / PRESET
    cfg = load_preset(ExportConfig, preset)
    assert cfg.field.mode == "upstream" and cfg.field.resolution == 128
    assert cfg.mesh.decimate_target == 100_000
    assert isinstance(cfg.mesh.threshold, float)


def test_round_trip():
    cfg = from_dict(ExportConfig, {"field": {"resolution": 64}, "mesh": {"threshold": 2}})
    again = from_dict(ExportConfig, to_dict(cfg))
    assert to_dict(again) == to_dict(cfg)
    assert dataclasses.is_dataclass(again.field)


@pytest.mark.parametrize(
    "text,fragment",
    [
        ("field:\n  resolutoin: 64\n", "unknown FieldConfig field(s) resolutoin"),
        ("field:\n  mode: fast\n", "FieldConfig.mode = 'fast': use one of exact, upstream"),
        ("field:\n  resolution: high\n", "FieldConfig.resolution = 'high': must be an integer"),
        ("field: [1, 2\n", "not valid YAML"),
    ],
)
def test_bad_presets_say_what_and_where(tmp_path, text, fragment):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(InputError) as e:
        load_preset(ExportConfig, p)
    assert fragment in str(e.value) and str(p) in str(e.value) and "\n" not in str(e.value)


def test_cli_flags_override_the_preset(tmp_path):
    from microdreamer.cli import build_parser, job_config

    p = tmp_path / "p.yaml"
    p.write_text("field:\n  resolution: 40\n  mode: upstream\nmesh:\n  threshold: 0.5\n")
    args = build_parser().parse_args(
        ["mesh", "x.ply", "-o", "y.glb", "--config", str(p), "--resolution", "50"]
    )
    cfg = job_config(args)
    assert (cfg.field.resolution, cfg.field.mode, cfg.mesh.threshold) == (50, "upstream", 0.5)


def test_up_axes_are_orient_s():
    """config.py keeps its own copy of the up axes (it imports no torch); they must be orient's."""
    from microdreamer import config, orient

    assert config.UP_AXES == orient.UP_AXES
    for cls in (config.ExportConfig, config.ViewsConfig, config.TurntableConfig, config.ReconstructJobConfig):
        assert cls().up == "+y"
        with pytest.raises(config.ConfigError, match="use one of"):
            cls(up="y")
    # auto (a ground's side) where the input is a splat or a mesh to look at: mesh and render; the jobs
    # that map their output back through the rotation (render-views, reconstruct) need a named axis
    assert config.ExportConfig(up="auto").up == config.TurntableConfig(up="auto").up == "auto"
    for cls in (config.ViewsConfig, config.ReconstructJobConfig):
        with pytest.raises(config.ConfigError, match="use one of"):
            cls(up="auto")
    with pytest.raises(config.ConfigError, match=r"export\.up = 'auto'"):
        config.ReconstructJobConfig(export=config.ExportConfig(up="auto"))
