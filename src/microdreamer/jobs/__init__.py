"""The jobs the command line runs, each a function of its config (:mod:`microdreamer.config`):

* :mod:`.export`: splat -> field -> mesh -> texture -> file (``mesh``, and every job's mesh export);
* :mod:`.reconstruct`: a posed dataset -> splat -> mesh, with held-out metrics (``reconstruct``);
* :mod:`.generate`: one image -> Zero123 prior -> SIR -> splat -> mesh (``generate``);
* :mod:`.demo`: an object built in code -> views -> reconstruct, with metrics (``demo``);
* :mod:`.turntable`: videos and contact sheets of meshes and splats (``render``).

Importing this package imports nothing heavy; each job module imports its stages.
"""

from __future__ import annotations

DEVICES = ("auto", "cpu", "cuda")


def resolve_device(device: str):
    """``auto|cpu|cuda`` -> a torch device; a one-line InputError when CUDA is asked for and absent."""
    import torch

    from microdreamer.errors import InputError

    if isinstance(device, torch.device):
        return device
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError("device cuda: no CUDA device is available here; use cpu or auto")
    if device not in DEVICES:
        raise InputError(f"device {device!r} is unknown; use auto, cpu or cuda")
    return torch.device(device)
