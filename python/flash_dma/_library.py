"""Finding and loading libfdma, and turning its status codes into Python exceptions.

The library is loaded on first use, from (in order) $FDMA_LIBRARY, the package directory
(where `pip install .` puts it), or a repository checkout's build/ directory.
"""
import os
import threading

from . import _abi

_lock = threading.Lock()
_lib = None

# fdma_status
OK, ERR_INVALID_ARGUMENT, ERR_UNSUPPORTED, ERR_WORKSPACE, ERR_DEVICE, ERR_INTERNAL = range(6)


class FlashDmaError(RuntimeError):
    """A CUDA runtime or internal failure inside libfdma."""


def _candidates():
    env = os.environ.get("FDMA_LIBRARY")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    return [os.path.join(here, "libfdma.so"), os.path.join(here, "..", "..", "build", "libfdma.so")]


def library():
    """The loaded libfdma (ctypes.CDLL); raises ImportError with what was tried."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            tried = []
            for path in _candidates():
                if not os.path.exists(path):
                    tried.append(f"{path} (missing)")
                    continue
                _lib = _abi.load_library(path)  # raises ImportError on an ABI mismatch
                break
            if _lib is None:
                raise ImportError("flash_dma cannot find libfdma.so; tried: " + ", ".join(tried) +
                                  ". Install the package with `pip install .` or set FDMA_LIBRARY.")
    return _lib


def check(status, what):
    """Raises the Python exception for a non-zero fdma_status."""
    if status == OK:
        return
    message = library().fdma_last_error().decode(errors="replace")
    if status in (ERR_INVALID_ARGUMENT, ERR_UNSUPPORTED, ERR_WORKSPACE):
        raise ValueError(message or what)  # the library's message names the op and the argument
    raise FlashDmaError(f"{what}: {message}")
