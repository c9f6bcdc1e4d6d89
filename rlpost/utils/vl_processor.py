"""Load vision-language processors (Qwen2-VL family) where torchvision is not installed.

transformers builds every Qwen2-VL processor with a video processor, and its video processors need torchvision;
the CPU build of PyTorch has no matching torchvision here (ENVIRONMENT.md), so `AutoProcessor.from_pretrained`
of any Qwen2-VL folder fails before a single image is processed. `allow_missing_video_processor()` makes the
processors treat the video processor as absent (images work; a video raises) when torchvision is missing, and
does nothing when it is installed. It must run before the processor is loaded, in every process that loads one
(the dataset at start-up, the actor worker, vLLM's in-process engine).
"""

from __future__ import annotations

import importlib.util
from typing import Any, TypedDict

_PATCHED = False


class _NoVideoKwargs(TypedDict, total=False):
    """No video options: there is no video processor."""


class NoVideoProcessor:
    """What a processor holds in place of the video processor torchvision would provide: it declares no
    options (vLLM reads `valid_kwargs` of every sub-processor) and refuses any video."""

    valid_kwargs = _NoVideoKwargs

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise ValueError("not supported yet: videos (the video processor needs torchvision, not installed)")


def torchvision_available() -> bool:
    """True when torchvision can be imported (video processors work)."""
    return importlib.util.find_spec("torchvision") is not None


def allow_missing_video_processor() -> None:
    """Drop `video_processor` from the processors' sub-processor list when torchvision is missing (idempotent)."""
    global _PATCHED
    if _PATCHED or torchvision_available():
        return
    from transformers import processing_utils

    original = processing_utils.ProcessorMixin.get_attributes.__func__

    def get_attributes(cls: type) -> list[str]:
        # Save, load and __init__ all iterate this list: without the entry the video processor is never built
        return [name for name in original(cls) if name != "video_processor"]

    processing_utils.ProcessorMixin.get_attributes = classmethod(get_attributes)
    processing_utils.ProcessorMixin.video_processor = NoVideoProcessor()  # instances without one see this
    _alias_torchvision_image_processor()
    _PATCHED = True


def _alias_torchvision_image_processor() -> None:
    """Make `transformers.models.qwen2_vl.image_processing_qwen2_vl` the PIL image processor's module.

    That module imports torchvision at its top; transformers itself falls back to `Qwen2VLImageProcessorPil`
    when torchvision is missing, but code that imports the module by path (vLLM's Qwen2-VL model file imports
    `smart_resize` and `Qwen2VLImageProcessor` from it) would fail, so the path names the PIL module instead."""
    import sys

    name = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
    if name in sys.modules:
        return
    import importlib
    import types

    pil = importlib.import_module("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
    alias = types.ModuleType(name, "transformers' PIL Qwen2-VL image processor (torchvision is not installed)")
    alias.__dict__.update({k: v for k, v in vars(pil).items() if not k.startswith("__")})
    alias.Qwen2VLImageProcessor = pil.Qwen2VLImageProcessorPil
    sys.modules[name] = alias


def inspect_vllm_models_in_process() -> None:
    """Let vLLM inspect model classes in this process instead of a fresh interpreter.

    vLLM imports each architecture's file in a child Python (to keep CUDA uninitialised in the parent); that
    child has none of the fixes above, so its import of the Qwen2-VL file fails without torchvision. On a
    machine without torchvision (the CPU build) the inspection runs here, where the fixes are in place."""
    if torchvision_available():
        return
    allow_missing_video_processor()
    from vllm.model_executor.models import registry

    registry._run_in_subprocess = lambda fn: fn()
