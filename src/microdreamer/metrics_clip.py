"""CLIP image similarity, MicroDreamer's quality measure (its ``clip_sim.py``, used by ``scripts/cal_sim.py``).

Upstream embeds each image with ``CLIPModel.get_image_features`` of
``laion/CLIP-ViT-bigG-14-laion2B-39B-b160k`` after its ``CLIPProcessor`` (resize, centre crop,
normalisation), divides each embedding by its norm, and scores two images by the dot product of their
embeddings; an asset's score is the mean over its renders of the score against the input image. Images
enter as uint8 RGB, an RGBA image composited on white first in float32 and truncated to uint8
(``(x * 255).astype(np.uint8)``): :func:`upstream_uint8`, :func:`read_image_on_white`.

:class:`ClipImageEncoder` loads a transformers-format CLIP folder (``config.json``,
``preprocessor_config.json``, the weights) or a repo id found in the local Hugging Face cache, never the
network; the text tower is dropped after loading. :func:`save_random_clip` writes a tiny CLIP with random
weights in that format (tests, smoke runs). transformers is imported on first use.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import torch

from microdreamer.errors import InputError
from microdreamer.image_io import decode_errors, standard_image

logger = logging.getLogger(__name__)

#: what a CLIP folder must hold besides the weights
CLIP_FILES = ("config.json", "preprocessor_config.json")


def resolve_clip_path(model: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """The transformers-format folder of ``model``: a folder, or a repo id looked up offline.

    Raises:
        InputError: (one line) not a folder, not in the local cache, or a folder that is not a CLIP model.
    """
    text = str(model)
    path = Path(text).expanduser()
    need = ", ".join(CLIP_FILES) + " and the weights"
    if not path.exists() and _looks_like_repo_id(text):
        from huggingface_hub import constants, snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError

        try:
            path = Path(snapshot_download(text, cache_dir=cache_dir, local_files_only=True))
        except (LocalEntryNotFoundError, FileNotFoundError, OSError):
            cache = Path(cache_dir) if cache_dir is not None else Path(constants.HF_HUB_CACHE)
            raise InputError(
                f"--model {text}: the CLIP model is not in the local Hugging Face cache ({cache}) and nothing "
                f"is downloaded here; run `hf download {text}` on a machine with network and copy the cache "
                f"here, or pass --model PATH to a transformers-format CLIP folder ({need})"
            ) from None
    if not path.is_dir():
        raise InputError(f"--model {text}: no such folder; pass a transformers-format CLIP folder ({need}) "
                         "or a repo id in the local Hugging Face cache")  # fmt: skip
    missing = [f for f in CLIP_FILES if not (path / f).is_file()]
    if missing:
        raise InputError(f"--model {text}: the folder {path} lacks {', '.join(missing)}; a CLIP model folder "
                         f"holds {need} (transformers format)")  # fmt: skip
    return path


def _looks_like_repo_id(model: str) -> bool:
    parts = model.split("/")
    return len(parts) == 2 and all(parts) and not model.startswith((".", "~")) and "\\" not in model


def upstream_uint8(image: np.ndarray) -> np.ndarray:
    """[H, W, 3] float in [0, 1] -> uint8 as upstream converts it: ``(x * 255).astype(np.uint8)`` in
    float32 (truncation, not rounding)."""
    return (np.clip(np.asarray(image, np.float32), 0.0, 1.0) * np.float32(255)).astype(np.uint8)


def read_image_on_white(path: str | os.PathLike) -> np.ndarray:
    """[H, W, 3] uint8 RGB of an image file; one with alpha is composited on white first (in float32,
    ``rgb * a + (1 - a)``), as upstream's ``read_image`` + ``cal_clip_sim`` do. Upright as its EXIF
    orientation says, 16-bit greyscale scaled (:func:`~microdreamer.image_io.standard_image`).

    Raises:
        InputError: the file is missing, not an image, or has samples out of range.
    """
    from PIL import Image

    path = Path(path)
    if not path.is_file():
        raise InputError(f"--image {path}: no such file; give the input image (PNG or JPEG) of the asset")
    try:
        with Image.open(path) as im:
            # bit depth scaled and EXIF orientation applied, as generate prepares its input
            im = standard_image(im, path, orient=True)
            has_alpha = im.mode == "RGBA"
            arr = np.asarray(im)
    except InputError:
        raise
    except decode_errors() as e:
        raise InputError(
            f"--image {path}: cannot read it as an image ({str(e).splitlines()[0] if str(e) else type(e).__name__}); "
            "give a PNG or JPEG file"
        ) from None
    if not has_alpha:
        return np.ascontiguousarray(arr)
    x = arr.astype(np.float32) / np.float32(255)
    a = x[..., 3:]
    return upstream_uint8(x[..., :3] * a + (np.float32(1) - a))


class ClipImageEncoder:
    """CLIP's image tower and its preprocessing: uint8 images -> unit embeddings.

    Args:
        model: a ``transformers.CLIPModel`` (its ``vision_model`` and ``visual_projection`` are used).
        processor: its ``CLIPImageProcessor``.
        device: where the model runs.
        name: the model's name, for reports.
    """

    def __init__(self, model: torch.nn.Module, processor, device: str | torch.device = "cpu",
                 name: str = "clip") -> None:  # fmt: skip
        self.device = torch.device(device)
        self.model = model.to(self.device).eval().requires_grad_(False)
        self.processor = processor
        self.dtype = next(self.model.parameters()).dtype
        self.name = name

    @classmethod
    def from_pretrained(
        cls,
        model: str | os.PathLike,
        device: str | torch.device = "cpu",
        dtype: str = "auto",
        cache_dir: str | os.PathLike | None = None,
    ) -> ClipImageEncoder:
        """Load a CLIP folder or a cached repo id (:func:`resolve_clip_path`; never the network).

        ``dtype``: "auto" (float32, as upstream), "float16", "bfloat16" or "float32".
        """
        from transformers import CLIPImageProcessor, CLIPModel

        path = resolve_clip_path(model, cache_dir)
        torch_dtype = {"auto": torch.float32, "float32": torch.float32, "float16": torch.float16,
                       "bfloat16": torch.bfloat16}[dtype]  # fmt: skip
        logger.info("loading CLIP from %s", path)
        try:
            net = CLIPModel.from_pretrained(path, dtype=torch_dtype, local_files_only=True)
            processor = CLIPImageProcessor.from_pretrained(path, local_files_only=True)
        except (OSError, ValueError) as e:
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise InputError(f"--model {model}: {path} is not a loadable CLIP model ({first})") from None
        for tower in ("text_model", "text_projection"):  # only images are embedded here
            if hasattr(net, tower):
                delattr(net, tower)
        return cls(net, processor, device, str(model))

    @torch.no_grad()
    def embed(self, images: list[np.ndarray] | np.ndarray, batch: int = 8) -> torch.Tensor:
        """[N, D] float32 unit embeddings of N uint8 RGB images ([H, W, 3] each, any size)."""
        images = list(images)
        out = []
        for b in range(0, len(images), batch):
            pixels = self.processor(images=images[b : b + batch], return_tensors="pt").pixel_values
            pooled = self.model.vision_model(pixel_values=pixels.to(self.device, self.dtype)).pooler_output
            feats = self.model.visual_projection(pooled).float()
            out.append(feats / feats.norm(dim=-1, keepdim=True))
        return torch.cat(out) if out else torch.zeros(0, self.model.config.projection_dim)

    def similarity(self, reference: np.ndarray, images: list[np.ndarray] | np.ndarray) -> torch.Tensor:
        """[N] cosine similarities of N uint8 images to the uint8 ``reference`` image (each in [-1, 1])."""
        ref = self.embed([reference])
        return (self.embed(images) * ref).sum(-1).cpu()


def save_random_clip(folder: str | os.PathLike, seed: int = 0, image_size: int = 32) -> Path:
    """Write a tiny CLIP (2 layers, width 32, projection 16) with random weights and its image processor in
    the transformers format :meth:`ClipImageEncoder.from_pretrained` reads; returns ``folder``."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    folder = Path(folder)
    tower = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
    cfg = CLIPConfig(
        text_config={
            **tower,
            "vocab_size": 99,
            "max_position_embeddings": 16,
            "bos_token_id": 0,
            "eos_token_id": 1,
            "pad_token_id": 1,
        },
        vision_config={**tower, "image_size": image_size, "patch_size": 8},
        projection_dim=16,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = CLIPModel(cfg)
    model.save_pretrained(folder)
    side = {"height": image_size, "width": image_size}
    CLIPImageProcessor(size={"shortest_edge": image_size}, crop_size=side).save_pretrained(folder)
    return folder
