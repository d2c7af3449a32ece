"""The performance page and the README's performance table are what ``benchmarks/report.py`` writes from
``benchmarks/results/*.json``: no figure in them is copied by hand."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _report():
    spec = importlib.util.spec_from_file_location("md_report", ROOT / "benchmarks" / "report.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_the_committed_performance_page_is_generated():
    report = _report()
    assert report.PAGE.read_text() == report.page(), (
        "docs/performance.md is stale: run python benchmarks/report.py"
    )


def test_the_readme_table_is_generated():
    report = _report()
    text = report.README.read_text()
    assert report.readme_with_table(text) == text, (
        "README.md's table is stale: run python benchmarks/report.py"
    )


def test_every_headline_names_an_existing_result():
    report = _report()
    for h in report.HEADLINES:
        assert (report.RESULTS / h.source).is_file(), h.source
        assert h.figure()  # the figure is read from that file


def test_the_page_lists_every_result_file():
    report = _report()
    page = report.page()
    for path in report.RESULTS.glob("*.json"):
        assert f"`{path.name}`" in page, path.name


def test_a_changed_result_changes_the_page(tmp_path, monkeypatch):
    """The table follows the JSON: a different figure in a result file gives a different table."""
    import json
    import shutil

    report = _report()
    results = tmp_path / "results"
    shutil.copytree(report.RESULTS, results)
    before = report.headline_table()
    doc = json.loads((results / "serve_cpu.json").read_text())
    doc["median"]["overhead_s"] = 12.5
    (results / "serve_cpu.json").write_text(json.dumps(doc))
    monkeypatch.setattr(report, "RESULTS", results)
    after = report.headline_table()
    assert after != before and "12.50 s per request" in after
