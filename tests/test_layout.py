"""The package's dependency rules, read from the sources with ``ast`` (no module is imported):

* ``kernels/`` imports nothing from microdreamer (tensors and numbers in, tensors out);
* ``train/``, ``priors/`` and ``field/`` import nothing from ``jobs/``, ``mesh/`` or ``texture/`` (the stages
  below the export know nothing of meshes and files);
* no stage imports ``jobs/`` or the command line; ``config.py`` and ``errors.py`` import no stage.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "microdreamer"


def imported_modules(path: Path, package: Path = PACKAGE) -> set[str]:
    """Every module a source file imports (absolute names; relative imports resolved), at any depth."""
    parts = path.relative_to(package.parent).with_suffix("").parts
    package = parts[:-1] if parts[-1] != "__init__" else parts[:-1]
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1])
                names.add(f"{base}.{node.module}" if node.module else base)
            elif node.module:
                names.add(node.module)
    return names


def violations(folder: str, forbidden: tuple[str, ...], package: Path = PACKAGE) -> list[str]:
    files = sorted((package / folder).rglob("*.py")) if folder.endswith("/") else [package / folder]
    assert files, f"no sources under {package / folder}"
    bad = []
    for path in files:
        for name in imported_modules(path, package):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                bad.append(f"{path.relative_to(package)} imports {name}")
    return bad


def test_the_checker_finds_absolute_relative_and_nested_imports(tmp_path):
    fake = tmp_path / "microdreamer" / "kernels"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("import torch\n")
    (fake / "a.py").write_text("from ..field import common\n")
    (fake / "b.py").write_text("def f():\n    import microdreamer.mesh.types\n")
    (fake / "c.py").write_text("from . import _backend\n")
    found = violations("kernels/", ("microdreamer.field", "microdreamer.mesh"), tmp_path / "microdreamer")
    assert found == [
        "kernels/a.py imports microdreamer.field",
        "kernels/b.py imports microdreamer.mesh.types",
    ]


def test_kernels_import_nothing_from_microdreamer():
    outside = [
        v for v in violations("kernels/", ("microdreamer",)) if not v.endswith(("microdreamer.kernels",))
    ]
    assert [v for v in outside if " imports microdreamer.kernels." not in v] == []


@pytest.mark.parametrize("folder", ["train/", "priors/", "field/"])
def test_lower_stages_know_nothing_of_meshes_textures_and_jobs(folder):
    forbidden = ("microdreamer.jobs", "microdreamer.mesh", "microdreamer.texture", "microdreamer.cli")
    assert violations(folder, forbidden) == []


@pytest.mark.parametrize(
    "folder",
    [
        "data/",
        "field/",
        "kernels/",
        "mesh/",
        "priors/",
        "render/",
        "texture/",
        "train/",
        "sir.py",
        "splat.py",
    ],
)
def test_stages_do_not_import_jobs_or_the_cli(folder):
    assert violations(folder, ("microdreamer.jobs", "microdreamer.cli")) == []


@pytest.mark.parametrize("module", ["config.py", "errors.py"])
def test_config_and_errors_import_no_stage(module):
    allowed = {"microdreamer.errors"}
    bad = [n for n in imported_modules(PACKAGE / module) if n.startswith("microdreamer") and n not in allowed]
    assert bad == []
    heavy = {"torch", "numpy"} & {n.split(".")[0] for n in imported_modules(PACKAGE / module)}
    assert heavy == set(), "config and errors must stay cheap to import (the CLI builds its flags from them)"


@pytest.mark.parametrize(
    "module", sorted(p.name for p in (PACKAGE / "formats").glob("*.py")) + ["../splat_ply.py"]
)
def test_the_splat_readers_import_no_torch(module):
    """``mesh``, ``render`` and ``convert`` read their splat with formats/ before torch (~1 s) is imported."""
    names = imported_modules((PACKAGE / "formats" / module).resolve())
    assert "torch" not in {n.split(".")[0] for n in names}
    assert {
        n for n in names if n.startswith("microdreamer") and not n.startswith("microdreamer.formats")
    } <= {
        "microdreamer.errors",
        "microdreamer.progress",
        "microdreamer.io_utils",
    }
    assert "torch" not in {n.split(".")[0] for n in imported_modules(PACKAGE / "progress.py")}
