"""Renderers: differentiable Gaussian splatting (gsplat or PyTorch backend).

Importing this package is cheap: gsplat is imported only when its backend renders.
"""

from microdreamer.render.gaussians import RenderOutput, render

__all__ = ["RenderOutput", "render"]
