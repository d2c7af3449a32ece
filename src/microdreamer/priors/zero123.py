"""Zero123 / Stable-Zero123 as an SIR prior, on diffusers and transformers building blocks.

The model (a diffusers-format folder, the layout of ``ashawkey/stable-zero123-diffusers`` and
``ashawkey/zero123-xl-diffusers``)::

    unet/                    UNet2DConditionModel, 8 input channels: noisy latent + reference latent
    vae/                     AutoencoderKL (Stable Diffusion's)
    image_encoder/           CLIPVisionModelWithProjection (ViT-L/14)
    feature_extractor/       CLIPImageProcessor
    clip_camera_projection/  Linear(D + 4 -> D): [CLIP image embedding, camera embedding] -> context
    scheduler/               (read by nobody here: the schedule is :class:`DDIMConfig`)

Conditioning: the cross-attention context of view c is ``proj([clip(ref), cam_c])`` ([1, D] per view)
and the reference latent is the VAE posterior's sample (``Zero123Config.latents``: or its mode) of the
input image *without* the latent scaling factor (Zero123's ``c_concat``); the unconditional branch zeroes
both. CLIP sees the input as MicroDreamer hands it over: 8 bits by truncation, transformers' PIL-backed
processor (:func:`clip_pixels`). Camera embeddings, from the
view's angles relative to the input view (MicroDreamer's signs, which match Zero123's polar angle):

* ``zero123-xl``:     [d_elevation (rad), sin d_azimuth, cos d_azimuth, d_radius]
* ``stable-zero123``: [d_elevation (rad), sin d_azimuth, cos d_azimuth, deg2rad(90 + input elevation)]

Loading never touches the network: a folder path, or a repo id looked up in the local Hugging Face
cache with ``local_files_only=True``. diffusers and transformers are imported on first use.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from microdreamer.config import CAMERA_EMBEDDINGS, LATENTS, DDIMConfig, Zero123Config
from microdreamer.errors import InputError
from microdreamer.priors.base import OrbitViews, Prior, Reference
from microdreamer.priors.ddim import DDIMRoundTrip
from microdreamer.priors.fused import fuse_ops

logger = logging.getLogger(__name__)

SUBFOLDERS = ("unet", "vae", "image_encoder", "feature_extractor", "clip_camera_projection")


class _DropEmptyFp32Notice(logging.Filter):
    """Drops diffusers' "There are modules in X that should be kept in float32: []" warning, which it
    logs on every ``.to(dtype)`` even when no module must be kept (the empty list): nothing for the user
    to act on. The same warning with modules listed passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "should be kept in float32: []" not in record.getMessage()


@contextlib.contextmanager
def quiet_library_notices():
    """Silence, while models are built and moved, the library log records that are not the user's
    business (see :class:`_DropEmptyFp32Notice`)."""
    log = logging.getLogger("diffusers.models.modeling_utils")
    notice = _DropEmptyFp32Notice()
    log.addFilter(notice)
    try:
        yield
    finally:
        log.removeFilter(notice)


def clip_image_processor_class() -> type:
    """transformers' PIL-backed CLIP image processor class, whatever else is installed.

    transformers 5 makes ``CLIPImageProcessor`` a torchvision-backed class when torchvision is installed
    (``CLIPImageProcessorPil`` otherwise); its resize is not PIL's, so its pixels are not upstream's
    (transformers 4's ``CLIPImageProcessor`` was the PIL one). Older transformers: ``CLIPImageProcessor``."""
    import transformers

    try:
        return transformers.CLIPImageProcessorPil
    except (AttributeError, ImportError):  # older transformers: CLIPImageProcessor is the PIL one
        return transformers.CLIPImageProcessor


def to_8bit(images: torch.Tensor) -> list:
    """[B, 3, H, W] float in [0, 1] -> B PIL images, 8 bits by truncation as torchvision's ``to_pil_image``
    makes them (``x * 255`` cast to uint8), as MicroDreamer hands its input view to CLIP
    (``guidance/zero123_utils.py`` ``get_img_embeds``, ``imagedream_utils.py`` ``get_image_text_embeds``)."""
    from PIL import Image

    u8 = (images.detach().float().clamp(0, 1) * 255).to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    return [Image.fromarray(a) for a in u8]


def clip_pixels(images: torch.Tensor, processor) -> torch.Tensor:
    """CLIP's input for images [B, 3, H, W] float in [0, 1]: [B, 3, h, w] float32 pixel values, upstream's
    (:func:`to_8bit`, then the PIL-backed processor, :func:`clip_image_processor_class`, with
    ``processor``'s settings); a processor of another class (transformers' torchvision-backed one) gives
    its settings only, so every install computes the same pixels."""
    pil_class = clip_image_processor_class()
    if type(processor) is not pil_class:
        processor = pil_class.from_dict(processor.to_dict())
    return processor(images=to_8bit(images), return_tensors="pt").pixel_values.float()


@dataclass
class Zero123Components:
    """The networks of a Zero123 model (eval mode, no gradients)."""

    unet: torch.nn.Module  # diffusers.UNet2DConditionModel
    vae: torch.nn.Module  # diffusers.AutoencoderKL
    image_encoder: torch.nn.Module  # transformers.CLIPVisionModelWithProjection
    feature_extractor: object  # transformers.CLIPImageProcessor
    camera_projection: torch.nn.Linear
    camera_embedding: str | None = None  # what the folder declares, if anything

    def to(self, device, dtype: torch.dtype | None = None) -> Zero123Components:
        """Move every network to ``device`` and, where it differs, cast it to ``dtype``."""
        with quiet_library_notices():
            for m in self.modules():
                current = next(m.parameters()).dtype
                if dtype is not None and dtype != current:
                    m.to(device=device, dtype=dtype)
                else:  # no dtype argument at all: diffusers warns about one even when it is None
                    m.to(device=device)
        return self

    def modules(self) -> list[torch.nn.Module]:
        return [self.unet, self.vae, self.image_encoder, self.camera_projection]


# ---------------------------------------------------------------------------------------------- loading
def hf_cache_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """The Hugging Face hub cache that repo ids are looked up in."""
    if cache_dir is not None:
        return Path(cache_dir)
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def _looks_like_repo_id(model: str) -> bool:
    parts = model.split("/")
    return len(parts) == 2 and all(parts) and not model.startswith((".", "~")) and "\\" not in model


def resolve_model_path(
    model: str | os.PathLike,
    cache_dir: str | os.PathLike | None = None,
    subfolders: tuple[str, ...] = SUBFOLDERS,
    kind: str = "Zero123",
) -> Path:
    """The diffusers-format folder of ``model`` (a folder, or a repo id in the local HF cache).

    Args:
        model: a folder, or a Hugging Face repo id looked up offline.
        cache_dir: the Hugging Face cache (None: the default one).
        subfolders: the components the folder must hold (Zero123's by default).
        kind: the model's name in messages.

    Raises:
        InputError: (one line) the model is neither, or the folder lacks a component.
    """
    text = str(model)
    path = Path(text).expanduser()
    parts = ", ".join(s + "/" for s in subfolders)
    if not path.exists() and _looks_like_repo_id(text):
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError

        try:
            path = Path(snapshot_download(text, cache_dir=cache_dir, local_files_only=True))
        except (LocalEntryNotFoundError, FileNotFoundError, OSError):
            cache = hf_cache_dir(cache_dir)
            raise InputError(
                f"--model {text}: not in the local Hugging Face cache ({cache}) and nothing is downloaded "
                f"here; run `hf download {text}` on a machine with network and copy the cache there, "
                f"or pass --model PATH to a diffusers-format {kind} folder ({parts})"
            ) from None
    if not path.is_dir():
        raise InputError(
            f"--model {text}: no such folder; pass a diffusers-format {kind} folder "
            f"({parts}) or a repo id in the local Hugging Face cache ({hf_cache_dir(cache_dir)})"
        )
    missing = [s for s in subfolders if not (path / s).is_dir()]
    if missing:
        raise InputError(
            f"--model {text}: the folder {path} lacks {', '.join(m + '/' for m in missing)}; a {kind} model "
            f"folder holds {parts} (diffusers format)"
        )
    return path


def load_camera_projection(folder: str | os.PathLike, dtype: torch.dtype = torch.float32) -> torch.nn.Linear:
    """The ``clip_camera_projection/`` component: ``config.json`` (embedding_dim D,
    additional_embeddings 4) and ``diffusion_pytorch_model.safetensors`` (or ``.bin``) holding
    ``proj.weight`` [D, D + 4] and ``proj.bias`` [D]."""
    folder = Path(folder)
    cfg = json.loads((folder / "config.json").read_text())
    dim = int(cfg.get("embedding_dim", 768))
    extra = int(cfg.get("additional_embeddings", 4))
    st, pt = folder / "diffusion_pytorch_model.safetensors", folder / "diffusion_pytorch_model.bin"
    if st.exists():
        from safetensors.torch import load_file

        state = load_file(str(st))
    elif pt.exists():
        state = torch.load(pt, map_location="cpu", weights_only=True)
    else:
        raise InputError(
            f"{folder}: no diffusion_pytorch_model.safetensors or .bin; the camera projection is missing"
        )
    linear = torch.nn.Linear(dim + extra, dim)
    try:
        linear.load_state_dict({"weight": state["proj.weight"], "bias": state["proj.bias"]})
    except (KeyError, RuntimeError) as e:
        raise InputError(f"{folder}: not a Zero123 camera projection ({e.__class__.__name__}: {e})") from None
    return linear.to(dtype).eval().requires_grad_(False)


def save_camera_projection(linear: torch.nn.Linear, folder: str | os.PathLike) -> None:
    """Write ``clip_camera_projection/`` in the layout :func:`load_camera_projection` (and upstream) reads."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    dim = linear.out_features
    import diffusers

    cfg = {
        "_class_name": "CLIPCameraProjection",
        "_diffusers_version": diffusers.__version__,
        "embedding_dim": dim,
        "additional_embeddings": linear.in_features - dim,
    }
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    state = {
        "proj.weight": linear.weight.detach().contiguous().cpu(),
        "proj.bias": linear.bias.detach().contiguous().cpu(),
    }
    save_file(state, str(folder / "diffusion_pytorch_model.safetensors"))


def _use_sdpa(components: Zero123Components) -> None:
    from diffusers.models.attention_processor import AttnProcessor2_0

    components.unet.set_attn_processor(AttnProcessor2_0())
    components.vae.set_attn_processor(AttnProcessor2_0())


class SingleTokenCrossAttention:
    """A diffusers attention processor for cross-attention to ONE context token (Zero123's context is
    [B, 1, D]): softmax over a single key is exactly 1 for every query, so the attention output is
    that token's value at every position, ``to_out(to_v(context))`` [B, 1, C], broadcast over the
    sequence. Skips the query and key projections, the attention kernel and the output projection
    of every position. Anything else (masks, several tokens, group or spatial norms, 4-D inputs)
    goes to ``fallback`` (diffusers' SDPA processor)."""

    def __init__(self) -> None:
        from diffusers.models.attention_processor import AttnProcessor2_0

        self.fallback = AttnProcessor2_0()

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None,
                 *args, **kwargs):  # fmt: skip
        """hidden_states [B, S, C] (queries) and encoder_hidden_states [B, 1, D] -> [B, S, C]."""
        if (
            encoder_hidden_states is None
            or encoder_hidden_states.shape[1] != 1
            or attention_mask is not None
            or hidden_states.ndim != 3
            or attn.spatial_norm is not None
            or attn.group_norm is not None
        ):
            return self.fallback(
                attn, hidden_states, encoder_hidden_states, attention_mask, temb, *args, **kwargs
            )
        ctx = encoder_hidden_states
        if attn.norm_cross:
            ctx = attn.norm_encoder_hidden_states(ctx)
        out = attn.to_out[1](attn.to_out[0](attn.to_v(ctx)))  # [B, 1, C]; to_out[1] is dropout
        out = out.expand(-1, hidden_states.shape[1], -1)
        if attn.residual_connection:
            out = out + hidden_states
        return out / attn.rescale_output_factor if attn.rescale_output_factor != 1.0 else out


def set_cross_attention(unet: torch.nn.Module, single_token: bool) -> int:
    """Give every cross-attention layer (``attn2``) of ``unet`` the :class:`SingleTokenCrossAttention`
    processor (``single_token``) or diffusers' SDPA one; self-attention keeps its processor.

    Returns:
        the number of layers set.
    """
    from diffusers.models.attention_processor import AttnProcessor2_0

    n = 0
    for name, module in unet.named_modules():
        if name.endswith("attn2") and hasattr(module, "set_processor"):
            module.set_processor(SingleTokenCrossAttention() if single_token else AttnProcessor2_0())
            n += 1
    return n


WEIGHTS = "diffusion_pytorch_model"


def load_diffusers_model(cls, folder: str | os.PathLike, device: torch.device | str, dtype: torch.dtype):
    """A diffusers model (``cls``: UNet2DConditionModel, AutoencoderKL) from ``folder``, its weights read
    from safetensors straight onto ``device`` and cast to ``dtype`` there.

    The model is built on the meta device (no allocation, no initialisation) and takes the loaded
    tensors as its parameters (``load_state_dict(assign=True)``); ``diffusion_pytorch_model.fp16.safetensors``
    is read when ``dtype`` is float16 and the folder has it (half the bytes). Anything this path does not
    cover (.bin or sharded weights, keys that differ from the model's, e.g. a checkpoint with diffusers'
    deprecated attention names) goes through ``cls.from_pretrained`` and then to ``device``, which handles
    all of those.
    """
    from safetensors.torch import load_file

    folder, device = Path(folder), torch.device(device)
    fp16 = folder / f"{WEIGHTS}.fp16.safetensors"
    file = fp16 if dtype == torch.float16 and fp16.exists() else folder / f"{WEIGHTS}.safetensors"
    if file.exists():
        with torch.device("meta"):
            model = cls.from_config(cls.load_config(folder))
        state = load_file(str(file), device=str(device))
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
        missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
        on_meta = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
        if not (missing or unexpected or on_meta):
            return model.eval()
        logger.info("%s: %d missing, %d unexpected keys, %d tensors unset; loading through diffusers",
                    folder, len(missing), len(unexpected), len(on_meta))  # fmt: skip
        del model, state
    model = cls.from_pretrained(folder, torch_dtype=dtype, local_files_only=True)
    return model.to(device).eval()


def load_components(
    path: str | os.PathLike, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
) -> Zero123Components:
    """Load every component of a diffusers-format Zero123 folder (no network), on ``device`` in ``dtype``:
    the UNet and the VAE (93% of the weights) through :func:`load_diffusers_model`, straight to ``device``;
    the CLIP image encoder through transformers on the CPU, then moved."""
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPVisionModelWithProjection

    CLIPImageProcessor = clip_image_processor_class()
    path, device = Path(path), torch.device(device)
    unet = load_diffusers_model(UNet2DConditionModel, path / "unet", device, dtype)
    vae = load_diffusers_model(AutoencoderKL, path / "vae", device, dtype)
    image_encoder = CLIPVisionModelWithProjection.from_pretrained(
        path / "image_encoder", dtype=dtype, attn_implementation="sdpa", local_files_only=True
    )  # built on the CPU, moved below (its device_map path needs accelerate)
    feature_extractor = CLIPImageProcessor.from_pretrained(path / "feature_extractor", local_files_only=True)
    projection = load_camera_projection(path / "clip_camera_projection", dtype)
    declared = None
    index = path / "model_index.json"
    if index.exists():
        entries = json.loads(index.read_text())  # "_camera_embedding" (folders saved before: the older key)
        declared = entries.get("_camera_embedding", entries.get("microdreamer_camera_embedding"))
    comps = Zero123Components(unet, vae, image_encoder, feature_extractor, projection, declared)
    for m in comps.modules():
        m.eval().requires_grad_(False)
    _use_sdpa(comps)
    return comps.to(device)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    return {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[name]


# ------------------------------------------------------------------------------------ camera embedding
def camera_embedding(views: OrbitViews, reference: Reference, kind: str) -> torch.Tensor:
    """[C, 4] float32 Zero123 camera embeddings of ``views`` relative to the reference view.

    Args:
        views: C target views (absolute angles).
        reference: the input view (its elevation, azimuth and radius).
        kind: "stable-zero123" or "zero123-xl" (see the module docstring).
    """
    d_el = torch.deg2rad(views.elevation_deg - reference.elevation_deg)
    d_az = torch.deg2rad(views.azimuth_deg - reference.azimuth_deg)
    if kind == "stable-zero123":
        last = torch.full_like(d_el, math.radians(90.0 + reference.elevation_deg))
    elif kind == "zero123-xl":
        last = views.radius - reference.radius
    else:
        raise ValueError(f"unknown camera embedding {kind!r}; use one of {', '.join(CAMERA_EMBEDDINGS)}")
    return torch.stack([d_el, torch.sin(d_az), torch.cos(d_az), last], dim=-1)


# ----------------------------------------------------------------------------------------------- UNet
class _GraphedCall:
    """``fn(*tensors) -> tensor``, run eagerly or replayed from one captured CUDA graph per input
    signature (shapes, strides, dtypes); the output is a fresh tensor either way.

    Args:
        fn: a function of tensors only, with no host synchronisation inside.
        use_graphs: capture and replay on CUDA inputs (else always eager).
        name: for the log.
    """

    def __init__(self, fn: Callable[..., torch.Tensor], use_graphs: bool, name: str) -> None:
        self.fn = fn
        self.use_graphs = use_graphs
        self.name = name
        self.graphs: dict[tuple, tuple] = {}
        self.pool = None  # one memory pool shared by this function's graphs (replayed one at a time)

    def __call__(self, *args: torch.Tensor) -> torch.Tensor:
        if self.use_graphs and args[0].is_cuda:
            key = tuple((tuple(a.shape), a.stride(), a.dtype) for a in args)
            if key not in self.graphs:
                try:
                    self.graphs[key] = self._capture(args)
                except RuntimeError as e:  # a capture failure costs speed, not the result
                    logger.warning(
                        "CUDA graph capture of the %s failed (%s); running it eagerly", self.name, e
                    )
                    self.use_graphs = False
            if key in self.graphs:
                graph, static_in, static_out = self.graphs[key]
                for s, a in zip(static_in, args, strict=True):
                    s.copy_(a)
                graph.replay()
                return static_out.clone()
        return self.fn(*args)

    def _capture(self, args: tuple[torch.Tensor, ...]) -> tuple:
        static_in = [a.clone() for a in args]  # clone keeps the memory format
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up (cuDNN / cuBLAS / Triton choices) outside the capture
            for _ in range(2):
                self.fn(*static_in)
        torch.cuda.current_stream().wait_stream(side)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            static_out = self.fn(*static_in)
        logger.debug(
            "captured a CUDA graph of the %s for inputs %s", self.name, [tuple(a.shape) for a in args]
        )
        return graph, static_in, static_out


# ------------------------------------------------------------------------------------------------ VAE
class LatentCodec:
    """Images <-> scaled latents through a diffusers ``AutoencoderKL`` (eagerly or from CUDA graphs,
    :class:`_GraphedCall`), at a fixed image side; shared by the priors.

    Args:
        vae: the autoencoder (on its device, in ``dtype``).
        dtype: the precision the VAE runs in.
        image_size: S, the side the VAE sees; other sizes are resized on the way in.
        use_graphs: replay the encoder and the decoder from CUDA graphs (CUDA inputs only).
        latents: "sample" (the posterior's sample, upstream's) or "mode" (its mean) is what encoding gives.
    """

    def __init__(
        self,
        vae: torch.nn.Module,
        dtype: torch.dtype,
        image_size: int,
        use_graphs: bool,
        latents: str = "sample",
    ) -> None:
        if latents not in LATENTS:
            raise ValueError(f"latents {latents!r}: use one of {', '.join(LATENTS)}")
        self.vae = vae
        self.dtype = dtype
        self.image_size = image_size
        self.latents = latents
        self.scale = float(vae.config.scaling_factor)
        self.factor = 2 ** (len(vae.config.block_out_channels) - 1)
        # the posterior's parameters [C, 2 x 4, h, w]: mean, log-variance
        self.encode_call = _GraphedCall(
            lambda x: vae.encode(x).latent_dist.parameters, use_graphs, "VAE encoder"
        )
        self.decode_call = _GraphedCall(lambda z: vae.decode(z).sample, use_graphs, "VAE decoder")
        device = next(vae.parameters()).device
        self.nonfinite = torch.zeros((), dtype=torch.long, device=device)  # non-finite decoded values

    def resize(self, images: torch.Tensor) -> torch.Tensor:
        """[C, 3, H, W] -> [C, 3, S, S] (plain bilinear, upstream's), unchanged when already S x S."""
        s = self.image_size
        if images.shape[-2:] == (s, s):
            return images
        return torch.nn.functional.interpolate(images, (s, s), mode="bilinear", align_corners=False)

    def encode(
        self, images: torch.Tensor, generator: torch.Generator | None = None, graphed: bool = True
    ) -> torch.Tensor:
        """[C, 3, H, W] in [0, 1] -> [C, 4, S/8, S/8] float32 scaled latents: the posterior's sample
        (mean + std * noise, the noise drawn from ``generator``, as diffusers' ``latent_dist.sample()``
        with the log-variance clamped to [-30, 20]) or its mode (``latents``). ``graphed`` False: the
        encoder runs eagerly (a one-off encoding, e.g. the input view's: no graph captured for it)."""
        device = self.nonfinite.device
        x = self.resize(images.to(device, torch.float32)).to(self.dtype) * 2 - 1
        moments = self.encode_call(x) if graphed else self.encode_call.fn(x)
        mean, logvar = moments.float().chunk(2, dim=1)
        if self.latents == "sample":
            noise = torch.randn(mean.shape, generator=generator, device=device, dtype=torch.float32)
            mean = mean + torch.exp(0.5 * logvar.clamp(-30.0, 20.0)) * noise
        return mean * self.scale

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """[C, 4, h, w] scaled latents -> [C, 3, S, S] float32 images in [0, 1]; non-finite values
        become white and are counted in ``nonfinite`` (read by the priors' stats, one sync)."""
        # contiguous: latents from the encoder come channels-last-strided (its posterior's mean is a channel
        # slice), those from noise do not; one layout means one decoder graph, the one warm-up captures
        x = self.decode_call((latents / self.scale).to(self.dtype).contiguous()).float()
        bad = ~torch.isfinite(x)
        self.nonfinite = self.nonfinite + bad.sum()
        return (torch.where(bad, torch.ones_like(x), x) / 2 + 0.5).clamp(0, 1)


class _UNetRunner:
    """Calls the UNet (eagerly or from CUDA graphs, :class:`_GraphedCall`) and counts its calls."""

    def __init__(self, unet: torch.nn.Module, use_graphs: bool) -> None:
        self.call = _GraphedCall(
            lambda x, ts, ctx: unet(x, ts, encoder_hidden_states=ctx).sample, use_graphs, "UNet"
        )
        self.calls = 0
        self.samples = 0

    @property
    def graphs(self) -> dict:
        return self.call.graphs

    def __call__(self, sample: torch.Tensor, t: int, context: torch.Tensor) -> torch.Tensor:
        """eps [B, 4, h, w] (UNet dtype) for ``sample`` [B, 8, h, w], timestep t, ``context`` [B, 1, D]."""
        self.calls += 1
        self.samples += sample.shape[0]
        ts = torch.full((sample.shape[0],), float(t), device=sample.device)
        return self.call(sample, ts, context)


# ---------------------------------------------------------------------------------------------- prior
def _with_cudnn_flags(method):
    """Run a :class:`Zero123Prior` method under its cuDNN settings (:meth:`Zero123Prior._cudnn`)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self._cudnn():
            return method(self, *args, **kwargs)

    return wrapper


class Zero123Prior(Prior):
    """Zero123 (or Stable-Zero123) refining C renders into C targets: MicroDreamer's hybrid forward
    process (noise to t1, DDIM inversion t1 -> t2) then DDIM sampling t2 -> 0 with guidance.

    Args:
        components: the networks (:func:`load_components` or the random factory).
        config: :class:`Zero123Config` (its ``model`` only names the model here).
        device: where to run; the networks are moved there in the config's dtype.
    """

    def __init__(
        self, components: Zero123Components, config: Zero123Config | None = None, device="cpu"
    ) -> None:
        self.config = config or Zero123Config()
        self.device = torch.device(device)
        self.dtype = resolve_dtype(self.config.dtype, self.device)
        self.nets = components.to(self.device, self.dtype)
        for m in self.nets.modules():
            m.eval().requires_grad_(False)
        self.image_size = self.config.image_size
        self.kind = self._camera_kind()
        self.ddim = DDIMRoundTrip(self.config.ddim)
        self._ddim_by_steps: dict[int, DDIMRoundTrip] = {}  # other grids (stage 2's 50 steps)
        on_cuda = self.device.type == "cuda"

        # set both ways: several priors may share one set of networks (benchmark variants)
        def fmt(on: bool) -> torch.memory_format:
            return torch.channels_last if on_cuda and on else torch.contiguous_format

        self.nets.unet.to(memory_format=fmt(self.config.channels_last))
        self.nets.vae.to(memory_format=fmt(self.config.vae_channels_last))
        set_cross_attention(self.nets.unet, self.config.single_token_cross_attention)
        for net in (self.nets.unet, self.nets.vae):
            fuse_ops(net, self.config.fused_group_norm and on_cuda)
        graphs = self.config.cuda_graphs and on_cuda
        self.unet = _UNetRunner(self.nets.unet, graphs)
        self.codec = LatentCodec(self.nets.vae, self.dtype, self.image_size, graphs, self.config.latents)
        self.latent_scale = self.codec.scale
        self.vae_factor = self.codec.factor
        self.clip_embedding: torch.Tensor | None = None  # [1, 1, D]
        self.reference_latent: torch.Tensor | None = None  # [1, 4, h, w]
        self.reference: Reference | None = None

    @classmethod
    def from_pretrained(cls, config: Zero123Config | None = None, device="cpu") -> Zero123Prior:
        """Load ``config.model`` (a folder or a cached repo id; never the network)."""
        config = config or Zero123Config()
        device = torch.device(device)
        path = resolve_model_path(config.model, config.hf_cache_dir)
        logger.info("loading Zero123 from %s", path)
        comps = load_components(path, device, resolve_dtype(config.dtype, device))
        return cls(comps, config, device)

    def _camera_kind(self) -> str:
        if self.config.camera_embedding != "auto":
            return self.config.camera_embedding
        if self.nets.camera_embedding in CAMERA_EMBEDDINGS:
            return self.nets.camera_embedding
        return "stable-zero123" if "stable" in str(self.config.model).lower() else "zero123-xl"

    # ------------------------------------------------------------------ conditioning
    def _cudnn(self):
        """cuDNN settings of the prior's calls: autotuning on (CUDA, ``cudnn_benchmark``), the rest as is."""
        import torch.backends.cudnn as cudnn

        bench = self.device.type == "cuda" and self.config.cudnn_benchmark
        return cudnn.flags(enabled=cudnn.enabled, benchmark=bench or cudnn.benchmark,
                           deterministic=cudnn.deterministic, allow_tf32=cudnn.allow_tf32)  # fmt: skip

    @_with_cudnn_flags
    @torch.no_grad()
    def set_reference(self, reference: Reference, generator: torch.Generator | None = None) -> None:
        """CLIP image embedding (of :func:`clip_pixels`) and VAE latent (the posterior's sample from
        ``generator``, or its mode: ``config.latents``) of the input view (once per generation)."""
        self.reference = reference
        rgb = self._resize(reference.rgb[None].to(self.device, torch.float32))  # [1, 3, S, S]
        pixels = clip_pixels(rgb, self.nets.feature_extractor)
        emb = self.nets.image_encoder(pixels.to(self.device, self.dtype)).image_embeds  # [1, D]
        self.clip_embedding = emb[:, None, :]
        latent = self.codec.encode(rgb, generator, graphed=False) / self.latent_scale  # Zero123's c_concat
        self.reference_latent = latent.to(self.dtype)

    def context(self, views: OrbitViews) -> torch.Tensor:
        """[C, 1, D] cross-attention context of the conditional branch for ``views``."""
        if self.clip_embedding is None or self.reference is None:
            raise RuntimeError("Zero123Prior.set_reference must be called before refine")
        cam = camera_embedding(views, self.reference, self.kind).to(self.device, self.dtype)[:, None, :]
        clip = self.clip_embedding.expand(len(views), 1, -1)
        return self.nets.camera_projection(torch.cat([clip, cam], dim=-1))

    # ------------------------------------------------------------------ latents
    def _resize(self, images: torch.Tensor) -> torch.Tensor:
        return self.codec.resize(images)

    @_with_cudnn_flags
    @torch.no_grad()
    def encode(self, images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """[C, 3, S, S] in [0, 1] -> [C, 4, S/8, S/8] float32 scaled latents (the posterior's sample from
        ``generator``, or its mode: ``config.latents``)."""
        return self.codec.encode(images, generator)

    @_with_cudnn_flags
    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """[C, 4, h, w] scaled latents -> [C, 3, S, S] float32 images in [0, 1]."""
        return self.codec.decode(latents)

    # ------------------------------------------------------------------ noise predictions
    def _eps_guided(self, context: torch.Tensor, scale: float | None = None):
        """The guided noise predictor for ``context`` [C, 1, D]; ``scale`` None = the config's."""
        C = context.shape[0]
        ref = self.reference_latent.expand(C, -1, -1, -1)
        concat = torch.cat([ref, torch.zeros_like(ref)])  # [2C, 4, h, w]
        ctx = torch.cat([context, torch.zeros_like(context)])  # [2C, 1, D]
        scale = self.config.guidance_scale if scale is None else float(scale)

        def eps(x: torch.Tensor, t: int) -> torch.Tensor:
            xin = torch.cat([x, x]).to(self.dtype)
            out = self.unet(torch.cat([xin, concat], dim=1), t, ctx).float()
            cond, uncond = out.chunk(2)
            return uncond + scale * (cond - uncond)

        return eps

    def _eps_unconditional(self, C: int, context_dim: int):
        h = w = self.image_size // self.vae_factor
        concat = torch.zeros(C, 4, h, w, device=self.device, dtype=self.dtype)
        ctx = torch.zeros(C, 1, context_dim, device=self.device, dtype=self.dtype)

        def eps(x: torch.Tensor, t: int) -> torch.Tensor:
            return self.unet(torch.cat([x.to(self.dtype), concat], dim=1), t, ctx).float()

        return eps

    # ------------------------------------------------------------------ refine
    @_with_cudnn_flags
    @torch.no_grad()
    def refine(self, images, views, t_stop, generator=None) -> torch.Tensor:
        """See :meth:`Prior.refine`; ``generator`` must live on the prior's device."""
        C = len(views)
        out_size = images.shape[-2:] if images is not None else (self.image_size, self.image_size)
        t1, t2 = self.ddim.plan(t_stop, self.config.inversion_ratio)
        if t2 is None:  # t_stop below the first grid timestep: nothing to refine
            return images.float().clamp(0, 1)
        context = self.context(views)
        h = w = self.image_size // self.vae_factor
        if images is None or t1 is None:
            x = torch.randn(C, 4, h, w, generator=generator, device=self.device, dtype=torch.float32)
            t2 = self.ddim.timesteps[0] if images is None else t2
        else:
            x = self.ddim.add_noise(self.encode(images, generator), t1, generator)
            x = self.ddim.invert(x, t1, t2, self._eps_unconditional(C, context.shape[-1]))
        x0 = self.ddim.denoise(x, t2, self._eps_guided(context), self.config.eta, generator)
        targets = self.decode(x0)
        if tuple(targets.shape[-2:]) != tuple(out_size):
            targets = torch.nn.functional.interpolate(
                targets, tuple(out_size), mode="bilinear", align_corners=False
            )
        return targets

    def ddim_with_steps(self, steps: int) -> DDIMRoundTrip:
        """The config's DDIM schedule on a grid of ``steps`` steps (the SIR round trip's own when equal;
        built once per step count)."""
        if steps == self.ddim.config.num_inference_steps:
            return self.ddim
        if steps not in self._ddim_by_steps:
            self._ddim_by_steps[steps] = DDIMRoundTrip(replace(self.config.ddim, num_inference_steps=steps))
        return self._ddim_by_steps[steps]

    @_with_cudnn_flags
    @torch.no_grad()
    def strength_refine(
        self,
        images: torch.Tensor,
        views: OrbitViews,
        strength: float = 0.8,
        generator: torch.Generator | None = None,
        steps: int = 50,
        guidance_scale: float = 2.0,
        eta: float = 0.0,
    ) -> torch.Tensor:
        """MicroDreamer's stage-2 refinement (``guidance/zero123_utils.py`` ``Zero123.refine``): encode the
        renders, add noise up to ``t = grid[int(steps * strength)]`` of a ``steps``-step DDIM grid, then
        DDIM-denoise through the rest of the grid with guidance ``guidance_scale``, conditioned on the
        input image and the views' cameras; decode.

        The renders are shrunk to the model's side with plain bilinear interpolation (upstream's), their
        latents are the VAE posterior's sample (``config.latents``); the noise comes from ``generator``.

        Args:
            images: [C, 3, H, W] float in [0, 1], renders from ``views`` on white.
            views: the C views' angles.
            strength: fraction of the grid skipped (upstream: 0.8 of 50 -> t = 181, 10 steps).
            generator: on the prior's device.
            steps, guidance_scale, eta: the DDIM grid, the guidance and DDIM's eta (upstream: 50, 2, 0).

        Returns:
            [C, 3, H, W] float32 targets in [0, 1] (decoded at the model's side, resized back to H x W).
        """
        ddim = self.ddim_with_steps(steps)
        t = ddim.strength_start(strength)
        if t is None:  # nothing left to denoise
            return images.float().clamp(0, 1)
        context = self.context(views)
        x = ddim.add_noise(self.encode(images, generator), t, generator)
        x0 = ddim.denoise(x, t, self._eps_guided(context, guidance_scale), eta, generator)
        targets = self.decode(x0)
        if tuple(targets.shape[-2:]) != tuple(images.shape[-2:]):
            targets = torch.nn.functional.interpolate(
                targets, tuple(images.shape[-2:]), mode="bilinear", align_corners=False
            )
        return targets

    def warmup_calls(
        self, views: int, from_renders: bool = True, extra_views: tuple[int, ...] = ()
    ) -> list[tuple[Callable, tuple]]:
        """The calls :meth:`warmup` makes, as (function, arguments): exactly the signatures a C-view SIR
        run replays. Always the guided UNet (batch 2C) and the VAE decoder (C); with ``from_renders``
        (some refinement starts from renders: SIR iterations after the first) also the VAE encoder (C)
        and, when the inversion has steps (``inversion_ratio`` < 1), the unconditional UNet (batch C); for
        each C' of ``extra_views`` (stage 2's guided-only refinement of C' renders) the guided UNet (2C'),
        the encoder and the decoder (C')."""
        C, s = views, self.image_size
        h = s // self.vae_factor
        d = self.nets.camera_projection.out_features
        batches = [2 * C] + ([C] if from_renders and self.config.inversion_ratio < 1.0 else [])
        calls: list[tuple[Callable, tuple]] = []
        for b in batches:
            x = torch.randn(b, 8, h, h, device=self.device, dtype=self.dtype)
            calls.append((self.unet, (x, 500, torch.randn(b, 1, d, device=self.device, dtype=self.dtype))))
        if from_renders:
            calls.append((self.encode, (torch.rand(C, 3, s, s, device=self.device),)))
        latents = torch.randn(C, 4, h, h, device=self.device)
        calls.append((self.decode, (latents,)))
        for c in dict.fromkeys(c for c in extra_views if c != C):
            x = torch.randn(2 * c, 8, h, h, device=self.device, dtype=self.dtype)
            calls.append(
                (self.unet, (x, 500, torch.randn(2 * c, 1, d, device=self.device, dtype=self.dtype)))
            )
            calls.append((self.encode, (torch.rand(c, 3, s, s, device=self.device),)))
            calls.append((self.decode, (torch.randn(c, 4, h, h, device=self.device),)))
        return calls

    @_with_cudnn_flags
    @torch.no_grad()
    def warmup(self, views: int, from_renders: bool = True, extra_views: tuple[int, ...] = ()) -> None:
        """Run every network once at the shapes of a C-view refinement (cuDNN and cuBLAS choices) and
        capture the CUDA graphs the run will replay (:meth:`warmup_calls`), so the first iteration is
        not slower than the others. No-op on the CPU."""
        if self.device.type != "cuda":
            return
        for fn, args in self.warmup_calls(views, from_renders, extra_views):
            fn(*args)
        torch.cuda.synchronize(self.device)
        self.unet.calls = self.unet.samples = 0
        self.codec.nonfinite.zero_()

    def ddim_grid(self) -> DDIMConfig:
        """See :meth:`Prior.ddim_grid`: the SIR round trip's grid (``config.ddim``)."""
        return self.config.ddim

    def stats(self) -> dict:
        """UNet calls and samples since the warm-up, captured graphs, and non-finite decoded values
        (replaced by white; nonzero means the model or its precision misbehaves)."""
        bad = int(self.codec.nonfinite)
        if bad:
            logger.warning("Zero123 decoded %d non-finite values (replaced by white)", bad)
        return {
            "unet_calls": self.unet.calls,
            "unet_samples": self.unet.samples,
            "cuda_graphs": len(self.unet.graphs),
            "nonfinite_values": bad,
        }
