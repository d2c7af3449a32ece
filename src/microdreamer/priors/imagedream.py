"""ImageDream ("ipmv", image + text to 3D) as an SIR prior: MVDream's multi-view UNet with image-prompt
conditioning (:class:`~microdreamer.priors.mvdream.MultiViewUNet` with ``ip_dim`` = 16).

The model (a diffusers-format folder, the layout of ``ashawkey/imagedream-ipmv-diffusers``) is MVDream's
(:mod:`microdreamer.priors.mvdream`) plus::

    image_encoder/       CLIPVisionModel: OpenCLIP ViT-H/14's vision tower (1280 wide, 257 tokens at 224^2)
    feature_extractor/   CLIPImageProcessor (224^2, CLIP's normalisation)

Conditioning of one group of F = 4 views (upstream's pixel controller):

* the input image is a fifth view of the group: its clean VAE latent (the posterior's sample, scaled)
  takes the fifth latent slot, its camera input is all zeros, its noise prediction is dropped; it
  joins the group's self-attention like any view;
* every cross-attention also attends to 16 image-prompt tokens: the CLIP vision tower's penultimate
  hidden states [1, 257, 1280] resampled by the UNet's ``image_embed`` (computed once per image);
* the unconditional branch has the negative prompt's text, a zero image latent and the resampled
  zero image features.

The input image is seen from the front: our azimuth 90 (:data:`~microdreamer.priors.mvdream.FRONT_AZIMUTH_DEG`,
MicroDreamer's convention). diffusers and transformers are imported on first use.
"""

from __future__ import annotations

import logging

import torch

from microdreamer.config import ImageDreamConfig
from microdreamer.priors.base import Reference
from microdreamer.priors.mvdream import SUBFOLDERS as MVDREAM_SUBFOLDERS
from microdreamer.priors.mvdream import MVDreamPrior
from microdreamer.priors.zero123 import clip_pixels

logger = logging.getLogger(__name__)

SUBFOLDERS = (*MVDREAM_SUBFOLDERS, "image_encoder", "feature_extractor")


class ImageDreamPrior(MVDreamPrior):
    """ImageDream refining C = G x 4 renders into C targets, conditioned on the input image
    (:meth:`set_reference`) and a prompt (:meth:`set_prompt`; the empty prompt when never set).

    Args:
        components: the networks, with ``image_encoder`` and ``feature_extractor``.
        config: :class:`ImageDreamConfig`.
        device: where to run.
    """

    kind = "ImageDream"
    subfolders = SUBFOLDERS
    image_prompt = True

    def __init__(self, components, config: ImageDreamConfig | None = None, device="cpu") -> None:
        if components.image_encoder is None or components.feature_extractor is None:
            raise ValueError("ImageDream needs an image_encoder and a feature_extractor")
        if components.unet.config.ip_dim <= 0:
            raise ValueError("ImageDream needs a multi-view UNet with image-prompt layers (ip_dim > 0)")
        super().__init__(components, config or ImageDreamConfig(), device)
        self.image_tokens: torch.Tensor | None = None  # [2, ip_dim, D]: image, zero image
        self.image_latent: torch.Tensor | None = None  # [1, 4, h, w] scaled

    @property
    def _unet_frames(self) -> int:
        return self.frames + 1  # the input image joins every group

    @staticmethod
    def _default_config() -> ImageDreamConfig:
        return ImageDreamConfig()

    # ------------------------------------------------------------------ conditioning
    @torch.no_grad()
    def image_features(self, rgb: torch.Tensor) -> torch.Tensor:
        """[1, 257, 1280] CLIP features (the vision tower's penultimate hidden states, as ImageDream's
        ``local`` image prompt) of one image [1, 3, H, W] in [0, 1], seen as upstream hands it over
        (:func:`~microdreamer.priors.zero123.clip_pixels`: 8 bits by truncation, the PIL processor)."""
        pixels = clip_pixels(rgb, self.nets.feature_extractor)
        out = self.nets.image_encoder(pixels.to(self.device, self.dtype), output_hidden_states=True)
        return out.hidden_states[-2]

    @torch.no_grad()
    def set_reference(self, reference: Reference, generator: torch.Generator | None = None) -> None:
        """Resampled image-prompt tokens of the input image and of a zero image, and the image's latent
        (the posterior's sample from ``generator``, or its mode: ``config.latents``), once per generation.
        The reference's camera is not used: the image is ImageDream's front view."""
        self.reference = reference
        rgb = self.codec.resize(reference.rgb[None].to(self.device, torch.float32))  # [1, 3, S, S]
        feats = self.image_features(rgb)
        unet = self.nets.unet
        self.image_tokens = unet.encode_image_prompt(torch.cat([feats, torch.zeros_like(feats)]))
        self.image_latent = self.codec.encode(rgb, generator)

    @torch.no_grad()
    def run_warmup_calls(self, views: int) -> None:
        """:meth:`MVDreamPrior.run_warmup_calls`; before :meth:`set_reference` (``generate`` warms up
        before SIR sets the input), on a grey placeholder image of the same shapes, which is dropped
        after: the image encoder runs too, and the run's own reference replaces nothing captured."""
        if self.image_tokens is not None:
            return super().run_warmup_calls(views)
        s = self.image_size
        self.set_reference(Reference(torch.full((3, s, s), 0.5), torch.ones(1, s, s)))
        try:
            super().run_warmup_calls(views)
        finally:
            self.reference = self.image_tokens = self.image_latent = None

    def _contexts(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.image_tokens is None:
            raise RuntimeError("ImageDreamPrior.set_reference must be called before refine")
        if self.text_embeddings is None:
            logger.info("ImageDream: no prompt set; using the empty prompt")
            self.set_prompt("")
        text, img = self.text_embeddings, self.image_tokens.to(self.dtype)
        ctx = torch.cat([text, img], dim=1)  # [2, 77 + ip_dim, D]
        return ctx[:1], ctx[1:]

    def _branch(self, x: torch.Tensor, camera: torch.Tensor, context: torch.Tensor, conditional: bool):
        """Each group of F views followed by the image view: its latent (zeros in the unconditional
        branch) and a zero camera."""
        C, F_ = x.shape[0], self.frames
        G = C // F_
        img = self.image_latent if conditional else torch.zeros_like(self.image_latent)
        xs = torch.cat(
            [x.to(self.dtype).unflatten(0, (G, F_)), img.to(self.dtype).expand(G, 1, -1, -1, -1)], dim=1
        )
        cams = torch.cat([camera.unflatten(0, (G, F_)), camera.new_zeros(G, 1, camera.shape[-1])], dim=1)
        B = G * (F_ + 1)
        return xs.flatten(0, 1), cams.flatten(0, 1), context.expand(B, -1, -1).contiguous()

    def _prediction(self, out: torch.Tensor) -> torch.Tensor:
        """Drop the image view's prediction of every group."""
        F_ = self.frames
        return out.unflatten(0, (-1, F_ + 1))[:, :F_].flatten(0, 1)
