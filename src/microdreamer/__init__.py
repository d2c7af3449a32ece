"""microdreamer: image-to-3D with score-based iterative reconstruction, and fast splat-to-mesh.

Importing the package is cheap: heavy modules (diffusers, gsplat, the CUDA kernels) load lazily
inside the stage that needs them.
"""

from microdreamer.errors import InputError
from microdreamer.splat import Splat, read_ply, write_ply

__all__ = ["InputError", "Splat", "read_ply", "write_ply"]
__version__ = "0.1.0"
