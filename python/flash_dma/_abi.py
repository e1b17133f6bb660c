"""ctypes mirror of include/fdma/fdma.h (C ABI version 5).

The structs here must match the C header field for field; `load_library` refuses a library
whose fdma_abi_version() differs from ABI_VERSION.
"""
import ctypes
import os

ABI_VERSION = 5
MAX_DIMS = 4

# fdma_dtype
FLOAT32, FLOAT16, BFLOAT16, FLOAT64, BOOL, INT32 = 1, 2, 3, 4, 5, 6
# fdma_backend
BACKEND_AUTO, BACKEND_CPU, BACKEND_CUDA = 0, 1, 2
PASS_FORWARD, PASS_BACKWARD = 0, 1


class Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.c_int64 * MAX_DIMS),
        ("stride", ctypes.c_int64 * MAX_DIMS),
    ]


class AttentionParams(ctypes.Structure):
    _fields_ = [
        ("q", Tensor), ("k", Tensor), ("v", Tensor), ("mask", Tensor), ("bias", Tensor),
        ("scale", ctypes.c_double), ("softcap", ctypes.c_double),
        ("causal", ctypes.c_int32), ("deterministic", ctypes.c_int32),
        ("out", Tensor), ("lse", Tensor),
        ("dout", Tensor), ("dq", Tensor), ("dk", Tensor), ("dv", Tensor), ("dbias", Tensor),
        ("backend", ctypes.c_int32), ("stream", ctypes.c_void_p),
        ("workspace", ctypes.c_void_p), ("workspace_bytes", ctypes.c_size_t),
        ("cu_seqlens_q", Tensor), ("cu_seqlens_k", Tensor),
        ("max_seqlen_q", ctypes.c_int64), ("max_seqlen_k", ctypes.c_int64),
    ]


class SelectParams(ctypes.Structure):
    _fields_ = [
        ("key_scores", Tensor), ("key_padding", Tensor),
        ("num_queries", ctypes.c_int64), ("window", ctypes.c_int64), ("causal", ctypes.c_int32),
        ("keep_begin", Tensor), ("keep_end", Tensor),
        ("backend", ctypes.c_int32), ("stream", ctypes.c_void_p),
        ("workspace", ctypes.c_void_p), ("workspace_bytes", ctypes.c_size_t),
    ]


class DmaParams(ctypes.Structure):
    _fields_ = [
        ("q", Tensor), ("k", Tensor), ("v", Tensor), ("key_scores", Tensor), ("key_padding", Tensor),
        ("window", ctypes.c_int64), ("causal", ctypes.c_int32), ("add_scores", ctypes.c_int32),
        ("scale", ctypes.c_double), ("softcap", ctypes.c_double), ("deterministic", ctypes.c_int32),
        ("out", Tensor), ("lse", Tensor),
        ("dout", Tensor), ("dq", Tensor), ("dk", Tensor), ("dv", Tensor), ("dkey_scores", Tensor),
        ("keep_begin", Tensor), ("keep_end", Tensor),
        ("backend", ctypes.c_int32), ("stream", ctypes.c_void_p),
        ("workspace", ctypes.c_void_p), ("workspace_bytes", ctypes.c_size_t),
        ("cu_seqlens_q", Tensor), ("cu_seqlens_k", Tensor),
        ("max_seqlen_q", ctypes.c_int64), ("max_seqlen_k", ctypes.c_int64),
    ]


class KvCacheParams(ctypes.Structure):
    _fields_ = [
        ("q", Tensor), ("k_cache", Tensor), ("v_cache", Tensor), ("score_cache", Tensor),
        ("cache_seqlens", Tensor), ("block_table", Tensor), ("k", Tensor), ("v", Tensor), ("scores", Tensor),
        ("select_state", Tensor),
        ("window", ctypes.c_int64), ("causal", ctypes.c_int32), ("add_scores", ctypes.c_int32),
        ("scale", ctypes.c_double), ("softcap", ctypes.c_double),
        ("out", Tensor), ("lse", Tensor),
        ("backend", ctypes.c_int32), ("stream", ctypes.c_void_p),
        ("workspace", ctypes.c_void_p), ("workspace_bytes", ctypes.c_size_t),
    ]


def load_library(path=None):
    """Loads libfdma and checks its ABI version; returns the ctypes CDLL."""
    path = path or os.environ.get("FDMA_LIBRARY") or os.path.join(os.path.dirname(__file__), "libfdma.so")
    lib = ctypes.CDLL(path)
    lib.fdma_abi_version.restype = ctypes.c_int32
    if lib.fdma_abi_version() != ABI_VERSION:
        raise ImportError(f"{path} has C ABI {lib.fdma_abi_version()}, this package needs {ABI_VERSION}")
    lib.fdma_last_error.restype = ctypes.c_char_p
    for name, ptype in [("attention", AttentionParams), ("dma", DmaParams)]:
        for fn in ("fwd", "bwd"):
            f = getattr(lib, f"fdma_{name}_{fn}")
            f.argtypes, f.restype = [ctypes.POINTER(ptype)], ctypes.c_int32
        ws = getattr(lib, f"fdma_{name}_workspace_size")
        ws.argtypes = [ctypes.POINTER(ptype), ctypes.c_int32, ctypes.POINTER(ctypes.c_size_t)]
        ws.restype = ctypes.c_int32
    lib.fdma_select.argtypes, lib.fdma_select.restype = [ctypes.POINTER(SelectParams)], ctypes.c_int32
    lib.fdma_select_workspace_size.argtypes = [ctypes.POINTER(SelectParams), ctypes.POINTER(ctypes.c_size_t)]
    lib.fdma_select_workspace_size.restype = ctypes.c_int32
    lib.fdma_kvcache_fwd.argtypes, lib.fdma_kvcache_fwd.restype = [ctypes.POINTER(KvCacheParams)], ctypes.c_int32
    lib.fdma_kvcache_workspace_size.argtypes = [ctypes.POINTER(KvCacheParams), ctypes.POINTER(ctypes.c_size_t)]
    lib.fdma_kvcache_workspace_size.restype = ctypes.c_int32
    lib.fdma_cuda_available.restype = ctypes.c_int32
    return lib
