"""torch tensors as fdma_tensor views (no copies), and the checks every op shares."""
import ctypes
import struct

import torch

from . import _abi

_DTYPES = {torch.float32: _abi.FLOAT32, torch.float16: _abi.FLOAT16, torch.bfloat16: _abi.BFLOAT16,
           torch.float64: _abi.FLOAT64, torch.bool: _abi.BOOL, torch.int32: _abi.INT32}
GPU_DTYPES = (torch.float16, torch.bfloat16)
CPU_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


# A tensor's fields after its data pointer (dtype, ndim, shape, stride), by ndim; unused dims stay 0.
_TENSOR_FIELDS = [struct.Struct(f"<ii{n}q{8 * (_abi.MAX_DIMS - n)}x{n}q{8 * (_abi.MAX_DIMS - n)}x")
                  for n in range(_abi.MAX_DIMS + 1)]
_POINTER = struct.Struct("<Q")
_OFFSETS = {}  # params ctype -> {field: byte offset}


def pack(ctype, tensors, **scalars):
    """One params struct for one call, written with struct.pack_into (ctypes attribute writes
    cost microseconds each, and this runs on every call). tensors: (field, tensor or None)
    pairs; None leaves the field an empty tensor. Returns (params, key): key is the packed bytes
    before the data pointers go in, i.e. everything the workspace size may depend on."""
    offsets = _OFFSETS.get(ctype)
    if offsets is None:
        offsets = _OFFSETS[ctype] = {name: getattr(ctype, name).offset for name, _ in ctype._fields_}
    buf = bytearray(ctypes.sizeof(ctype))
    present = []
    for field, t in tensors:
        if t is None:
            continue
        shape = t.shape
        if len(shape) > _abi.MAX_DIMS:
            raise ValueError(f"tensors have at most {_abi.MAX_DIMS} dims, got shape {tuple(shape)}")
        off = offsets[field]
        _TENSOR_FIELDS[len(shape)].pack_into(buf, off + 8, _DTYPES[t.dtype], len(shape), *shape, *t.stride())
        present.append((off, t))
    params = ctype.from_buffer(buf)
    for field, value in scalars.items():
        setattr(params, field, value)
    key = bytes(buf)
    for off, t in present:
        _POINTER.pack_into(buf, off, t.data_ptr())
    return params, key


try:  # the raw current-stream lookup torch's own generated code uses (no Stream object)
    _raw_stream = torch._C._cuda_getCurrentRawStream
except AttributeError:  # pragma: no cover - older or CPU-only torch builds
    _raw_stream = None


def stream_of(device):
    """The current CUDA stream of a device as a pointer, or None for the CPU."""
    if device.type != "cuda":
        return None
    if _raw_stream is not None:
        return _raw_stream(device.index)
    return torch.cuda.current_stream(device).cuda_stream


def workspace(nbytes, device):
    """Caller-owned workspace, allocated by torch (so it is graph-capturable)."""
    return torch.empty(max(int(nbytes), 1), dtype=torch.uint8, device=device)


def check_qkv(name, q, k, v, packed=False):
    """Layout [B, S, H, D] (packed: [total, H, D]), one dtype and device, contiguous head dim."""
    for t, n in ((q, "q"), (k, "k"), (v, "v")):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: {n} must be a torch.Tensor, got {type(t).__name__}")
        if packed and t.dim() != 3:
            raise ValueError(f"{name}: {n} must be [total_seqlen, heads, head_dim], got shape {tuple(t.shape)}")
        if not packed and t.dim() != 4:
            raise ValueError(f"{name}: {n} must be [batch, seqlen, heads, head_dim], got shape {tuple(t.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"{name}: q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    allowed = GPU_DTYPES if q.device.type == "cuda" else CPU_DTYPES
    if q.dtype not in allowed:
        raise TypeError(f"{name}: {q.device.type} tensors of dtype {q.dtype} are not supported; use one of "
                        f"{', '.join(str(d) for d in allowed)}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"{name}: q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    for t, n in ((q, "q"), (k, "k"), (v, "v")):
        if t.stride(-1) != 1:
            raise ValueError(f"{name}: {n} must have a contiguous head dim (stride 1), got strides {t.stride()}")
    if q.shape[-1] > 256:
        raise ValueError(f"{name}: head dims up to 256 are supported, got {q.shape[-1]}")


def check_seqlens(name, ref, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
    """cu_seqlens: int32 [num_seqs + 1] on q's device; max_seqlen: ints (the library checks the
    offsets against them on the CPU)."""
    check_same_device(name, ref, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    for t, n in ((cu_seqlens_q, "cu_seqlens_q"), (cu_seqlens_k, "cu_seqlens_k")):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != 1:
            raise TypeError(f"{name}: {n} must be an int32 tensor [num_seqs + 1], got "
                            f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}")
    for m, n in ((max_seqlen_q, "max_seqlen_q"), (max_seqlen_k, "max_seqlen_k")):
        if isinstance(m, bool) or not isinstance(m, (int, torch.SymInt)) or m < 0:
            raise ValueError(f"{name}: {n} must be an int >= 0, got {m!r}")


def check_same_device(name, ref, **tensors):
    for n, t in tensors.items():
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: {n} must be a torch.Tensor or None, got {type(t).__name__}")
        if t.device != ref.device:
            raise ValueError(f"{name}: {n} is on {t.device} but q is on {ref.device}")
