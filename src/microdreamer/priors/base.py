"""The prior interface of score-based iterative reconstruction, orbit views, and the trivial prior.

A prior turns C rendered views of the current 3D object into C target images for the next round of
reconstruction (MicroDreamer's "refine"). Zero123 (:mod:`microdreamer.priors.zero123`) is the real
one; :class:`GroundTruthPrior` returns known views (the reconstruction problem, and the test that
SIR converges); ImageDream and MVDream will implement the same interface.

Angles follow :mod:`microdreamer.cameras` (MicroDreamer's convention: azimuth 0 looks from +z,
negative elevation puts the camera above the object).
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass

import torch

from microdreamer.cameras import Cameras, orbit_cameras
from microdreamer.config import DDIMConfig


@dataclass
class OrbitViews:
    """C cameras on an orbit around the origin, by their angles (what the priors condition on).

    Attributes:
        elevation_deg: [C] float32 degrees, negative = above the object.
        azimuth_deg: [C] float32 degrees, 0 = from +z, 90 = from +x.
        radius: [C] float32 distance to the origin.
    """

    elevation_deg: torch.Tensor
    azimuth_deg: torch.Tensor
    radius: torch.Tensor

    def __post_init__(self) -> None:
        el = torch.as_tensor(self.elevation_deg, dtype=torch.float32).reshape(-1)
        az = torch.as_tensor(self.azimuth_deg, dtype=torch.float32).reshape(-1)
        r = torch.as_tensor(self.radius, dtype=torch.float32).reshape(-1)
        self.elevation_deg, self.azimuth_deg, self.radius = torch.broadcast_tensors(el, az, r)

    def __len__(self) -> int:
        return self.elevation_deg.shape[0]

    def cameras(self, fovy_deg: float = 49.1, width: int = 256, height: int = 256) -> Cameras:
        """The :class:`~microdreamer.cameras.Cameras` of these views (CPU tensors)."""
        return orbit_cameras(self.elevation_deg, self.azimuth_deg, self.radius, fovy_deg, width, height)

    def __getitem__(self, index) -> OrbitViews:
        return OrbitViews(self.elevation_deg[index], self.azimuth_deg[index], self.radius[index])

    @staticmethod
    def from_cameras(cameras: Cameras) -> OrbitViews:
        """The angles of cameras on an orbit around the origin (the inverse of :meth:`cameras`; an
        azimuth comes back in (-180, 180])."""
        c = cameras.camera_centers().detach().double().cpu()  # [C, 3]
        r = c.norm(dim=-1)
        el = -torch.rad2deg(torch.asin((c[:, 1] / r.clamp_min(1e-12)).clamp(-1.0, 1.0)))
        az = torch.rad2deg(torch.atan2(c[:, 0], c[:, 2]))
        return OrbitViews(el.float(), az.float(), r.float())

    @staticmethod
    def cat(views: list[OrbitViews]) -> OrbitViews:
        return OrbitViews(
            torch.cat([v.elevation_deg for v in views]),
            torch.cat([v.azimuth_deg for v in views]),
            torch.cat([v.radius for v in views]),
        )


def even_orbit_views(
    count: int,
    reference_elevation_deg: float = 0.0,
    elevation_range: tuple[float, float] = (-30.0, 30.0),
    radius: float = 2.0,
    generator: torch.Generator | None = None,
) -> OrbitViews:
    """MicroDreamer's novel views for one SIR iteration: azimuths evenly spaced (360 / C apart) from a
    random start in [-180, -180 + 360 / C), elevations uniform in a range around the reference's.

    The elevation offset from the reference is drawn from ``[lo, hi]`` where the nominal range
    ``elevation_range = (a, b)`` is widened so that the *absolute* range [a, b] is always covered and
    clipped so that no view passes +-80 degrees: ``lo = max(min(a, a - e), -80 - e)``,
    ``hi = min(max(b, b - e), 80 - e)`` for reference elevation ``e`` (MicroDreamer's rule; upstream
    draws integers, we draw floats).

    Args:
        count: C, views to draw.
        reference_elevation_deg: elevation of the input image's camera.
        elevation_range: (a, b) degrees.
        radius: orbit radius of every view.
        generator: CPU generator for the draws.

    Returns:
        :class:`OrbitViews` with absolute angles (elevation = reference + offset).
    """
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    a, b = elevation_range
    e = float(reference_elevation_deg)
    lo = max(min(a, a - e), -80.0 - e)
    hi = min(max(b, b - e), 80.0 - e)
    step = 360.0 / count
    u = torch.rand(count + 1, generator=generator, dtype=torch.float64)
    start = -180.0 + step * float(u[0])
    azimuth = start + step * torch.arange(count, dtype=torch.float64)
    offset = lo + (hi - lo) * u[1:]
    return OrbitViews((e + offset).float(), azimuth.float(), torch.full((count,), float(radius)))


@dataclass
class Reference:
    """The input view that conditions a prior and anchors the reconstruction.

    Attributes:
        rgb: [3, H, W] float32 in [0, 1], the object composited on white.
        mask: [1, H, W] float32 in [0, 1], its alpha.
        elevation_deg: the input camera's elevation (MicroDreamer's sign).
        azimuth_deg: the input camera's azimuth (0 by convention: the input view defines "front").
        radius: the input camera's distance to the origin.
    """

    rgb: torch.Tensor
    mask: torch.Tensor
    elevation_deg: float = 0.0
    azimuth_deg: float = 0.0
    radius: float = 2.0

    def __post_init__(self) -> None:
        if self.rgb.dim() != 3 or self.rgb.shape[0] != 3:
            raise ValueError(f"Reference.rgb must be [3, H, W], got {tuple(self.rgb.shape)}")
        if self.mask.shape != (1, *self.rgb.shape[1:]):
            raise ValueError(f"Reference.mask must be [1, H, W] = [1, {self.rgb.shape[1]}, {self.rgb.shape[2]}], "
                             f"got {tuple(self.mask.shape)}")  # fmt: skip

    @property
    def views(self) -> OrbitViews:
        """The reference camera as one :class:`OrbitViews`."""
        return OrbitViews([self.elevation_deg], [self.azimuth_deg], [self.radius])

    def straight_rgba(self) -> torch.Tensor:
        """[H, W, 4] straight (not premultiplied) RGBA whose composite on white is ``rgb``.

        Where the mask is 0 the colour is white (it is not observable).
        """
        a = self.mask[0]
        white = torch.ones_like(self.rgb)
        fg = torch.where(a > 0, (self.rgb - (1 - a) * white) / a.clamp_min(1e-8), white).clamp(0, 1)
        return torch.cat([fg, self.mask], 0).permute(1, 2, 0).contiguous()


class Prior(abc.ABC):
    """A multi-view prior for score-based iterative reconstruction.

    Subclasses implement :meth:`refine`; those conditioned on the input image override
    :meth:`set_reference` (called once before the loop).
    """

    #: image side the prior works at (None: any size).
    image_size: int | None = None

    def set_reference(self, reference: Reference, generator: torch.Generator | None = None) -> None:
        """Condition on the input view (embeddings are computed here, once); ``generator`` (on the
        prior's device) draws what is random in that, e.g. a VAE posterior's sample."""
        self.reference = reference

    def ddim_grid(self) -> DDIMConfig | None:
        """The DDIM grid the prior refines on: SIR lays its t2 schedule on it
        (:func:`microdreamer.sir.t_stop_schedule`). None: no grid of its own (the default one is used)."""
        return None

    @abc.abstractmethod
    def refine(
        self,
        images: torch.Tensor | None,
        views: OrbitViews,
        t_stop: float,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Refine renders into targets.

        Args:
            images: [C, 3, H, W] float in [0, 1], renders of the current object from ``views`` on
                white; None = nothing rendered yet (start from pure noise).
            views: the C views' angles.
            t_stop: t2 / T in (0, 1]: how far the images are pushed into the diffusion process before
                being denoised back; >= 1 means "start from pure noise" (the images are ignored).
            generator: randomness of the noise (on the prior's device).

        Returns:
            [C, 3, H, W] float32 targets in [0, 1], on the images' (or the prior's) device.
        """

    def strength_refine(
        self,
        images: torch.Tensor,
        views: OrbitViews,
        strength: float = 0.8,
        generator: torch.Generator | None = None,
        **settings,
    ) -> torch.Tensor:
        """Refine renders as MicroDreamer's stage 2 does (``strength`` of a DDIM schedule, see
        :meth:`microdreamer.priors.ddim.DDIMRoundTrip.strength_start`).

        Args:
            images: [C, 3, H, W] float in [0, 1], renders from ``views`` on white.
            views: the C views' angles.
            strength: the fraction of the DDIM grid skipped (0.8: the last 20% is run).
            generator: randomness of the noise (on the prior's device).
            settings: the prior's own settings (Zero123: ``steps``, ``guidance_scale``, ``eta``).

        Returns:
            [C, 3, H, W] float32 targets in [0, 1]. This default, for priors without such a schedule,
            is :meth:`refine` with ``t_stop = 1 - strength``.
        """
        return self.refine(images, views, 1.0 - strength, generator)

    def stats(self) -> dict:
        """Counters for reports (e.g. network evaluations); empty by default."""
        return {}


class GroundTruthPrior(Prior):
    """The trivial prior: the true views of a known object, whatever the renders look like.

    Args:
        render_views: ``render_views(views) -> [C, 3, H, W]`` float in [0, 1], the object seen from
            ``views`` on white.
    """

    def __init__(self, render_views: Callable[[OrbitViews], torch.Tensor]) -> None:
        self.render_views = render_views

    def refine(self, images, views, t_stop, generator=None) -> torch.Tensor:
        out = self.render_views(views).float()
        if images is not None:
            out = out.to(images.device)
        return out
