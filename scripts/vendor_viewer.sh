#!/usr/bin/env bash
# Rebuild the viewer's vendored JavaScript (src/microdreamer/viewer/vendor/) from the npm registry.
#
# Pinned: three (renderer, glTF/OBJ/MTL loaders, orbit controls), @sparkjsdev/spark (3DGS splats
# on three) and 3d-tiles-renderer (OGC 3D Tiles streaming on three), bundled by esbuild into ONE
# minified classic script, mdv-vendor.min.js, that defines the global `MDV` = {THREE, GLTFLoader,
# OBJLoader, MTLLoader, OrbitControls, SparkRenderer, SplatMesh, TilesRenderer}.
# A classic script (not an ES module) so the viewer also opens from file://, where browsers refuse
# module scripts. Spark's dist carries its WebAssembly inline (about 2.2 MB of the bundle) and the
# fflate code (MIT) it was built with.
#
# Writes mdv-vendor.min.js, LICENSE.<package> for each package whose code is in the bundle, and
# VERSIONS (name, version, the npm integrity hash of each tarball, the bundle's sha256).
# Needs node >= 18 and npm; runs offline from npm's cache once the packages are cached.
# Usage: scripts/vendor_viewer.sh [--check]   (--check: rebuild in a temporary folder and fail if
#                                              the committed bundle differs)
set -euo pipefail

THREE_VERSION=0.183.2
SPARK_VERSION=2.2.0
TILES_VERSION=0.5.3
ESBUILD_VERSION=0.28.2

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$ROOT/src/microdreamer/viewer/vendor"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
OUT="$WORK/out"
mkdir -p "$OUT"

cd "$WORK"
cat > package.json <<JSON
{"name": "microdreamer-viewer-vendor", "private": true,
 "dependencies": {"three": "$THREE_VERSION", "@sparkjsdev/spark": "$SPARK_VERSION",
                  "3d-tiles-renderer": "$TILES_VERSION", "esbuild": "$ESBUILD_VERSION"}}
JSON
# --ignore-scripts: esbuild's binary comes from its platform package (@esbuild/<os>-<arch>), no
# install script needed
npm install --no-audit --no-fund --ignore-scripts --save-exact --loglevel=error >/dev/null

cat > entry.js <<'JS'
export * as THREE from "three";
export { GLTFLoader } from "three/addons/loaders/GLTFLoader.js";
export { OBJLoader } from "three/addons/loaders/OBJLoader.js";
export { MTLLoader } from "three/addons/loaders/MTLLoader.js";
export { OrbitControls } from "three/addons/controls/OrbitControls.js";
export { SparkRenderer, SplatMesh } from "@sparkjsdev/spark";
export { TilesRenderer } from "3d-tiles-renderer/three";
JS
./node_modules/.bin/esbuild entry.js --bundle --format=iife --global-name=MDV --minify \
  --legal-comments=none --target=es2020 --log-level=warning --outfile="$OUT/mdv-vendor.min.js"

cp node_modules/three/LICENSE "$OUT/LICENSE.three"
cp node_modules/@sparkjsdev/spark/LICENSE "$OUT/LICENSE.spark"
cp node_modules/fflate/LICENSE "$OUT/LICENSE.fflate"
cp node_modules/3d-tiles-renderer/LICENSE "$OUT/LICENSE.3d-tiles-renderer"

python3 - "$OUT" <<'PY'
import hashlib, json, pathlib, sys

out = pathlib.Path(sys.argv[1])
lock = json.loads(pathlib.Path("package-lock.json").read_text())["packages"]
lines = ["# name version integrity (npm tarball); the bundle built from them, by scripts/vendor_viewer.sh"]
for name in ("three", "@sparkjsdev/spark", "3d-tiles-renderer", "fflate", "esbuild"):
    p = lock[f"node_modules/{name}"]
    note = {
        "fflate": "  # licence only: spark's dist carries the fflate its build used (^0.8.2)",
        "esbuild": "  # the bundler, not in the bundle",
    }.get(name, "")
    lines.append(f"{name} {p['version']} {p['integrity']}{note}")
digest = hashlib.sha256((out / "mdv-vendor.min.js").read_bytes()).hexdigest()
lines.append(f"mdv-vendor.min.js sha256-{digest} {(out / 'mdv-vendor.min.js').stat().st_size} bytes")
(out / "VERSIONS").write_text("\n".join(lines) + "\n")
PY

if [[ "${1:-}" == "--check" ]]; then
  for f in "$OUT"/*; do
    cmp -s "$f" "$DEST/$(basename "$f")" || { echo "differs from the committed copy: $(basename "$f")" >&2; exit 1; }
  done
  echo "vendored files match a fresh build"
else
  mkdir -p "$DEST"
  cp "$OUT"/* "$DEST/"
  echo "wrote $(ls "$OUT" | tr '\n' ' ')to $DEST"
fi
