"""Multi-view priors for score-based iterative reconstruction.

* :mod:`.base`: the :class:`Prior` interface, :class:`OrbitViews`, :class:`Reference`, and the trivial
  :class:`GroundTruthPrior`.
* :mod:`.ddim`: the partial diffusion round trip (noise to t1, DDIM inversion to t2, DDIM sampling).
* :mod:`.zero123`: Zero123 / Stable-Zero123 on diffusers + transformers (imported on first use).
* :mod:`.mvdream`: MVDream (text-to-3D): the multi-view UNet, its loader and cameras, :class:`MVDreamPrior`.
* :mod:`.imagedream`: ImageDream (image + text to 3D) on MVDream's UNet: :class:`ImageDreamPrior`.
* :mod:`.factory`: the same architecture with random weights (tiny for tests, full size for timing).

Importing this package imports neither diffusers nor transformers.
"""

from microdreamer.priors.base import (
    GroundTruthPrior,
    OrbitViews,
    Prior,
    Reference,
    even_orbit_views,
)

__all__ = [
    "GroundTruthPrior",
    "OrbitViews",
    "Prior",
    "Reference",
    "even_orbit_views",
]
