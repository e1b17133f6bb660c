"""Flash-DMA: fused attention kernels where each query attends only to the keys a dynamic mask
keeps. PyTorch ops over libfdma's C ABI (one build for every torch >= 2.4); CUDA tensors run
the CUDA kernels, CPU tensors the CPU backend."""
from ._api import (Selection, attention, attention_varlen, attention_with_kvcache, dynamic_mask_attention,
                   dynamic_mask_attention_varlen, dynamic_mask_attention_with_kvcache, get_available_backends,
                   new_select_state, select_keys)
from ._library import FlashDmaError
from .compat import flash_dmattn_func, flash_dmattn_varlen_func
from . import nn  # noqa: E402

__all__ = ["attention", "dynamic_mask_attention", "attention_varlen", "dynamic_mask_attention_varlen",
           "dynamic_mask_attention_with_kvcache", "attention_with_kvcache",
           "new_select_state", "select_keys", "Selection", "get_available_backends",
           "flash_dmattn_func", "flash_dmattn_varlen_func", "FlashDmaError", "nn"]
__version__ = "0.1.0"


def _register_integrations():
    import importlib.util

    if importlib.util.find_spec("transformers") is not None:
        from .integrations import transformers as _hf

        try:
            _hf.register()
        except Exception as e:  # noqa: BLE001  (a transformers version we do not know must not break import)
            import warnings

            warnings.warn(f"flash_dma: could not register with transformers: {e}")


_register_integrations()
