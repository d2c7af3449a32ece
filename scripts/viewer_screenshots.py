"""Screenshots of the viewer for the docs: each input's viewer page in headless Chromium.

    python scripts/viewer_screenshots.py docs/ \\
        viewer_mesh.png=/tmp/ghost.glb viewer_splat.png=../shared/samples/splats/dg_ghost_amd_17k.ply \\
        viewer_generate.png=/tmp/gen

Each NAME=INPUT builds a viewer of INPUT, serves it on 127.0.0.1, waits until every view is drawn,
and writes the page (at most --max-height CSS pixels of it) as OUT_DIR/NAME: an RGB PNG, or one of
256 colours where that is over --max-bytes. Needs Playwright and the system Chromium (see tests/test_viewer.py).
"""

from __future__ import annotations

import argparse
import io
import tempfile
from pathlib import Path

from microdreamer.viewer import build_viewer, serve

ROOT = Path(__file__).resolve().parents[1]

ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--use-angle=swiftshader", "--enable-unsafe-swiftshader",
]  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir", type=Path)
    p.add_argument("shots", nargs="+", metavar="NAME=INPUT")
    p.add_argument("--width", type=int, default=1000, help="viewport width in CSS pixels")
    p.add_argument("--max-height", type=int, default=1300, help="keep at most this much of the page")
    p.add_argument("--max-bytes", type=int, default=290_000, help="above this, save with 256 colours")
    p.add_argument("--chromium", default="/usr/bin/chromium")
    args = p.parse_args()

    from PIL import Image
    from playwright.sync_api import sync_playwright

    args.out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(Path(tmp) / "profile"), executable_path=args.chromium, args=ARGS, headless=True,
            viewport={"width": args.width, "height": 800}, device_scale_factor=1,
        )  # fmt: skip
        for k, shot in enumerate(args.shots):
            name, _, source = shot.partition("=")
            index = build_viewer(
                [Path(source)], Path(tmp) / f"v{k}", title=f"microdreamer view {Path(source).name}"
            )
            url, server = serve(index.parent)
            page = context.new_page()
            page.goto(url)
            page.wait_for_function(
                "(() => { const s = JSON.parse(document.getElementById('md-stats').textContent);"
                " return s.state === 'error' || (s.state === 'ready' && s.views.every(v => v.idle)); })()",
                timeout=600_000,
            )
            state = page.eval_on_selector("#md-stats", "e => e.dataset.state")
            if state != "ready":
                raise SystemExit(f"{source}: the page reports {state}")
            height = min(args.max_height, page.evaluate("document.documentElement.scrollHeight"))
            raw = page.screenshot(
                full_page=True, clip={"x": 0, "y": 0, "width": args.width, "height": height}
            )
            image = Image.open(io.BytesIO(raw)).convert("RGB")
            image.save(args.out_dir / name, optimize=True)
            if (args.out_dir / name).stat().st_size > args.max_bytes:  # 256 colours (bands smooth shading)
                image.quantize(256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(
                    args.out_dir / name, optimize=True
                )
            print(
                f"{args.out_dir / name}: {image.size[0]}x{image.size[1]}, {(args.out_dir / name).stat().st_size} bytes"
            )
            page.close()
            server.shutdown()
            server.server_close()
        context.close()


if __name__ == "__main__":
    main()
