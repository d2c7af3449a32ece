"""Zero123 models with random weights: the real architecture (full size) or a tiny one (tests).

``full`` is Stable-Zero123's: the Stable Diffusion 1.x UNet layout (320/640/1280/1280 channels, two
layers per block, 8-channel heads, cross-attention 768) with 8 input channels, the SD VAE
(128/256/512/512, 4 latent channels, scaling 0.18215), and CLIP ViT-L/14's vision tower (24 layers,
width 1024, patch 14 at 224^2, projection 768) with OpenAI's image preprocessing. Its outputs are
noise: it exists to time the pipeline and exercise the real loader, never to make assets.

Both save in the diffusers layout that :func:`microdreamer.priors.zero123.load_components` reads.

MVDream and ImageDream (:func:`build_random_mvdream`, :func:`build_random_imagedream`, :func:`save_mvdream`)
likewise, in the layout of the converted repositories that
:func:`microdreamer.priors.mvdream.load_components` reads.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import torch

from microdreamer.priors.ddim import DDIMConfig
from microdreamer.priors.zero123 import Zero123Components, _use_sdpa, save_camera_projection

logger = logging.getLogger(__name__)

SIZES = ("tiny", "full")


def architecture(size: str) -> dict:
    """Constructor arguments of each component for ``size`` ("tiny" or "full")."""
    if size == "full":
        return {
            "unet": {
                "sample_size": 32,
                "in_channels": 8,
                "out_channels": 4,
                "down_block_types": ["CrossAttnDownBlock2D"] * 3 + ["DownBlock2D"],
                "up_block_types": ["UpBlock2D"] + ["CrossAttnUpBlock2D"] * 3,
                "block_out_channels": [320, 640, 1280, 1280],
                "layers_per_block": 2,
                "attention_head_dim": 8,
                "cross_attention_dim": 768,
                "norm_num_groups": 32,
            },
            "vae": {
                "in_channels": 3,
                "out_channels": 3,
                "down_block_types": ["DownEncoderBlock2D"] * 4,
                "up_block_types": ["UpDecoderBlock2D"] * 4,
                "block_out_channels": [128, 256, 512, 512],
                "layers_per_block": 2,
                "latent_channels": 4,
                "norm_num_groups": 32,
                "sample_size": 256,
                "scaling_factor": 0.18215,
            },
            "clip": {
                "hidden_size": 1024,
                "intermediate_size": 4096,
                "num_hidden_layers": 24,
                "num_attention_heads": 16,
                "image_size": 224,
                "patch_size": 14,
                "projection_dim": 768,
                "hidden_act": "quick_gelu",
            },
            "processor": {"size": {"shortest_edge": 224}, "crop_size": {"height": 224, "width": 224}},
            "context_dim": 768,
        }
    if size == "tiny":
        return {
            "unet": {
                "sample_size": 8,
                "in_channels": 8,
                "out_channels": 4,
                "down_block_types": ["CrossAttnDownBlock2D", "DownBlock2D"],
                "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D"],
                "block_out_channels": [16, 32],
                "layers_per_block": 1,
                "attention_head_dim": 8,
                "cross_attention_dim": 32,
                "norm_num_groups": 8,
            },
            "vae": {  # four blocks: the real 8x downsampling, with few channels
                "in_channels": 3,
                "out_channels": 3,
                "down_block_types": ["DownEncoderBlock2D"] * 4,
                "up_block_types": ["UpDecoderBlock2D"] * 4,
                "block_out_channels": [8, 8, 16, 16],
                "layers_per_block": 1,
                "latent_channels": 4,
                "norm_num_groups": 4,
                "sample_size": 64,
                "scaling_factor": 0.18215,
            },
            "clip": {
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "image_size": 32,
                "patch_size": 8,
                "projection_dim": 32,
                "hidden_act": "quick_gelu",
            },
            "processor": {"size": {"shortest_edge": 32}, "crop_size": {"height": 32, "width": 32}},
            "context_dim": 32,
        }
    raise ValueError(f"unknown model size {size!r}; use one of {', '.join(SIZES)}")


def build_random_zero123(
    size: str = "tiny",
    seed: int = 0,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    camera_embedding: str = "stable-zero123",
) -> Zero123Components:
    """A Zero123 model of the given architecture with random weights (PyTorch's default initialisation,
    seeded), built directly on ``device`` and cast to ``dtype``."""
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    from microdreamer.priors.zero123 import clip_image_processor_class

    CLIPImageProcessor = clip_image_processor_class()

    arch = architecture(size)
    device = torch.device(device)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.device(device):
        torch.manual_seed(seed)
        unet = UNet2DConditionModel(**arch["unet"])
        vae = AutoencoderKL(**arch["vae"])
        clip_cfg = CLIPVisionConfig(**arch["clip"])
        clip_cfg._attn_implementation = "sdpa"
        image_encoder = CLIPVisionModelWithProjection(clip_cfg)
        d = arch["context_dim"]
        projection = torch.nn.Linear(d + 4, d)
    processor = CLIPImageProcessor(**arch["processor"])
    comps = Zero123Components(unet, vae, image_encoder, processor, projection, camera_embedding)
    comps.to(device, dtype)
    for m in comps.modules():
        m.eval().requires_grad_(False)
    _use_sdpa(comps)
    return comps


def zero123_model_index(camera_embedding: str | None = None) -> dict:
    """``model_index.json`` of a Zero123 folder, the Hub layout of ``ashawkey/stable-zero123-diffusers``:
    the components as (library, class) pairs that diffusers' ``DiffusionPipeline.from_pretrained`` resolves,
    with the camera projection in the ``zero123`` module (DreamGaussian's ``zero123.py``, which upstream
    MicroDreamer imports its ``Zero123Pipeline`` from) and no safety checker. ``camera_embedding`` goes
    under a key starting with "_", which diffusers' loaders leave alone."""
    import diffusers

    return {
        "_class_name": "Zero123Pipeline",
        "_diffusers_version": diffusers.__version__,
        "_camera_embedding": camera_embedding,
        "clip_camera_projection": ["zero123", "CLIPCameraProjection"],
        "feature_extractor": ["transformers", "CLIPImageProcessor"],
        "image_encoder": ["transformers", "CLIPVisionModelWithProjection"],
        "requires_safety_checker": False,
        "safety_checker": [None, None],
        "scheduler": ["diffusers", "DDIMScheduler"],
        "unet": ["diffusers", "UNet2DConditionModel"],
        "vae": ["diffusers", "AutoencoderKL"],
    }


def save_zero123(
    components: Zero123Components, folder: str | os.PathLike, ddim: DDIMConfig | None = None
) -> Path:
    """Write a model in the diffusers Hub layout (weights as safetensors, :func:`zero123_model_index`) to
    ``folder``, which must not exist or be empty. Written under a temporary name and renamed, so a failure
    leaves nothing."""
    from diffusers import DDIMScheduler

    folder = Path(folder)
    if folder.exists() and any(folder.iterdir()):
        raise FileExistsError(f"{folder} exists and is not empty")
    tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        tmp.mkdir(parents=True)
        components.unet.save_pretrained(tmp / "unet")
        components.vae.save_pretrained(tmp / "vae")
        components.image_encoder.save_pretrained(tmp / "image_encoder")
        components.feature_extractor.save_pretrained(tmp / "feature_extractor")
        save_camera_projection(components.camera_projection, tmp / "clip_camera_projection")
        DDIMScheduler(**(ddim or DDIMConfig()).scheduler_kwargs()).save_pretrained(tmp / "scheduler")
        index = zero123_model_index(components.camera_embedding)
        (tmp / "model_index.json").write_text(json.dumps(index, indent=2))
        if folder.exists():
            folder.rmdir()
        os.replace(tmp, folder)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return folder


# ------------------------------------------------------------------------------ MVDream and ImageDream
def multiview_architecture(size: str, image_prompt: bool = False) -> dict:
    """Constructor arguments of MVDream's (``image_prompt``: ImageDream's) components for ``size``.

    ``full`` is the converted repositories': the SD 2.1-base multi-view UNet (:class:`MultiViewUNetConfig`'s
    defaults; ImageDream: 16 image-prompt tokens), the SD VAE, OpenCLIP ViT-H/14's text tower as SD 2's
    CLIPTextModel (23 layers, width 1024) and, for ImageDream, its vision tower as a CLIPVisionModel (32
    layers, width 1280, patch 14 at 224^2). ``tiny`` keeps every kind of layer with few channels: 64^2
    images, 8^2 latents, two UNet levels with attention, a 17-token vision tower.
    """
    if size == "full":
        arch = {
            "unet": {"ip_dim": 16 if image_prompt else 0},
            "vae": architecture("full")["vae"],
            "text": {
                "vocab_size": 49408,
                "hidden_size": 1024,
                "intermediate_size": 4096,
                "num_hidden_layers": 23,
                "num_attention_heads": 16,
                "max_position_embeddings": 77,
                "hidden_act": "gelu",
                "projection_dim": 512,
            },
            "vision": {
                "hidden_size": 1280,
                "intermediate_size": 5120,
                "num_hidden_layers": 32,
                "num_attention_heads": 16,
                "image_size": 224,
                "patch_size": 14,
                "hidden_act": "gelu",
                "projection_dim": 1024,
            },
            "processor": {"size": {"shortest_edge": 224}, "crop_size": {"height": 224, "width": 224}},
        }
    elif size == "tiny":
        arch = {
            "unet": {
                "model_channels": 32,
                "num_res_blocks": 1,
                "attention_resolutions": (1, 2),
                "channel_mult": (1, 2),
                "num_head_channels": 16,
                "context_dim": 32,
                "norm_num_groups": 8,
                "image_size": 8,
                "ip_dim": 4 if image_prompt else 0,
                "ip_embedding_dim": 32,
                "ip_depth": 1,
                "ip_heads": 2,
                "ip_dim_head": 8,
            },
            "vae": architecture("tiny")["vae"],
            "text": {
                "vocab_size": 514,
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "max_position_embeddings": 77,
                "hidden_act": "gelu",
                "projection_dim": 32,
                "bos_token_id": 512,
                "eos_token_id": 513,
                "pad_token_id": 0,
            },
            "vision": {
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "image_size": 32,
                "patch_size": 8,
                "hidden_act": "gelu",
                "projection_dim": 32,
            },
            "processor": {"size": {"shortest_edge": 32}, "crop_size": {"height": 32, "width": 32}},
        }
    else:
        raise ValueError(f"unknown model size {size!r}; use one of {', '.join(SIZES)}")
    if not image_prompt:
        del arch["vision"], arch["processor"]
    return arch


def byte_level_tokenizer(model_max_length: int = 77):
    """A CLIPTokenizer over CLIP's 256 byte symbols (each also as a word end, ``</w>``) and its start /
    end tokens, without merges: 514 ids, ``!`` as padding (SD 2's choice). Real models ship their own
    49408-token vocabulary; this one exists so random models need no download."""
    import tempfile

    from transformers import CLIPTokenizer

    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    symbols = [chr(b) for b in printable] + [chr(256 + i) for i in range(256 - len(printable))]
    vocab = {s: i for i, s in enumerate(symbols)}
    vocab.update({s + "</w>": len(symbols) + i for i, s in enumerate(symbols)})
    vocab.update({"<|startoftext|>": 2 * len(symbols), "<|endoftext|>": 2 * len(symbols) + 1})
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "vocab.json").write_text(json.dumps(vocab))
        (Path(d) / "merges.txt").write_text("#version: 0.2\n")
        return CLIPTokenizer(str(Path(d) / "vocab.json"), str(Path(d) / "merges.txt"), pad_token="!",
                             model_max_length=model_max_length)  # fmt: skip


def build_random_mvdream(
    size: str = "tiny",
    seed: int = 0,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    image_prompt: bool = False,
):
    """An MVDream (``image_prompt``: ImageDream) model of the given architecture with random weights
    (PyTorch's default initialisation, seeded), built directly on ``device`` and cast to ``dtype``.

    Returns:
        :class:`~microdreamer.priors.mvdream.MultiViewComponents`.
    """
    from diffusers import AutoencoderKL
    from diffusers.models.attention_processor import AttnProcessor2_0
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPVisionConfig, CLIPVisionModel

    from microdreamer.priors.zero123 import clip_image_processor_class

    CLIPImageProcessor = clip_image_processor_class()

    from microdreamer.priors.mvdream import MultiViewComponents, MultiViewUNet, MultiViewUNetConfig

    arch = multiview_architecture(size, image_prompt)
    device = torch.device(device)
    image_encoder = processor = None
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.device(device):
        torch.manual_seed(seed)
        unet = MultiViewUNet(MultiViewUNetConfig(**arch["unet"]))
        vae = AutoencoderKL(**arch["vae"])
        text_cfg = CLIPTextConfig(**arch["text"])
        text_cfg._attn_implementation = "sdpa"
        text_encoder = CLIPTextModel(text_cfg)
        if image_prompt:
            vision_cfg = CLIPVisionConfig(**arch["vision"])
            vision_cfg._attn_implementation = "sdpa"
            image_encoder = CLIPVisionModel(vision_cfg)
    if image_prompt:
        processor = CLIPImageProcessor(**arch["processor"])
    comps = MultiViewComponents(unet, vae, text_encoder, byte_level_tokenizer(), image_encoder, processor)
    comps.to(device, dtype)
    for m in comps.modules():
        m.eval().requires_grad_(False)
    vae.set_attn_processor(AttnProcessor2_0())
    return comps


def build_random_imagedream(size: str = "tiny", seed: int = 0, device: str | torch.device = "cpu",
                            dtype: torch.dtype = torch.float32):  # fmt: skip
    """:func:`build_random_mvdream` with the image-prompt layers, image encoder and processor."""
    return build_random_mvdream(size, seed, device, dtype, image_prompt=True)


def save_mvdream(components, folder: str | os.PathLike, ddim: DDIMConfig | None = None) -> Path:
    """Write an MVDream or ImageDream model (:class:`~microdreamer.priors.mvdream.MultiViewComponents`)
    in the converted repositories' layout (``model_index.json``, ``unet/``, ``vae/``, ``text_encoder/``,
    ``tokenizer/``, ``scheduler/``, and ImageDream's ``image_encoder/``, ``feature_extractor/``; weights
    as safetensors) to ``folder``, which must not exist or be empty. Written under a temporary name and
    renamed, so a failure leaves nothing."""
    from diffusers import DDIMScheduler

    folder = Path(folder)
    if folder.exists() and any(folder.iterdir()):
        raise FileExistsError(f"{folder} exists and is not empty")
    tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    image = components.image_encoder is not None
    try:
        tmp.mkdir(parents=True)
        components.unet.save_pretrained(tmp / "unet")
        components.vae.save_pretrained(tmp / "vae")
        components.text_encoder.save_pretrained(tmp / "text_encoder")
        components.tokenizer.save_pretrained(tmp / "tokenizer")
        if image:
            components.image_encoder.save_pretrained(tmp / "image_encoder")
            components.feature_extractor.save_pretrained(tmp / "feature_extractor")
        DDIMScheduler(**(ddim or DDIMConfig()).scheduler_kwargs()).save_pretrained(tmp / "scheduler")
        index = {
            "_class_name": "MVDreamPipeline",
            "_diffusers_version": "0.25.0",
            "feature_extractor": ["transformers", "CLIPImageProcessor"] if image else [None, None],
            "image_encoder": ["transformers", "CLIPVisionModel"] if image else [None, None],
            "requires_safety_checker": False,
            "scheduler": ["diffusers", "DDIMScheduler"],
            "text_encoder": ["transformers", "CLIPTextModel"],
            "tokenizer": ["transformers", "CLIPTokenizer"],
            "unet": ["mv_unet", "MultiViewUNetModel"],
            "vae": ["diffusers", "AutoencoderKL"],
        }
        (tmp / "model_index.json").write_text(json.dumps(index, indent=2))
        if folder.exists():
            folder.rmdir()
        os.replace(tmp, folder)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return folder
