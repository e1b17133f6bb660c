/* Flash-DMA C ABI.
 *
 * Plain C over the same operations as the C++ API (fdma.hpp). Every function returns an
 * fdma_status; on failure fdma_last_error() gives a message for the calling thread. The
 * library never allocates memory for the caller: outputs and workspace come from the
 * caller, and the workspace size comes from the *_workspace_size functions. A CUDA call's
 * workspace is device memory aligned to 16 bytes (cudaMalloc and PyTorch give 256); what it
 * holds on entry does not matter (a call writes every byte it reads first).
 *
 * Structs are zero-initialisable: a zeroed params struct means "no optional tensor, default
 * scale, no softcap, not causal, automatic backend".
 */
#ifndef FDMA_FDMA_H
#define FDMA_FDMA_H

#include <stddef.h>
#include <stdint.h>

#if defined(FDMA_BUILDING_LIBRARY) && defined(__GNUC__)
#define FDMA_API __attribute__((visibility("default")))
#else
#define FDMA_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever a struct layout or a function signature changes. */
#define FDMA_ABI_VERSION 5
#define FDMA_MAX_DIMS 4
#define FDMA_MAX_HEAD_DIM 256

typedef enum fdma_status {
  FDMA_OK = 0,
  FDMA_ERR_INVALID_ARGUMENT = 1, /* bad shape, stride, dtype, pointer or value */
  FDMA_ERR_UNSUPPORTED = 2,      /* valid, but this build/backend cannot run it */
  FDMA_ERR_WORKSPACE = 3,        /* workspace missing or too small */
  FDMA_ERR_DEVICE = 4,           /* CUDA runtime error */
  FDMA_ERR_INTERNAL = 5
} fdma_status;

typedef enum fdma_dtype {
  FDMA_DTYPE_UNSET = 0,
  FDMA_FLOAT32 = 1,
  FDMA_FLOAT16 = 2,
  FDMA_BFLOAT16 = 3,
  FDMA_FLOAT64 = 4, /* CPU only: computes in float64 (reference mode) */
  FDMA_BOOL = 5,    /* one byte per element, nonzero = true */
  FDMA_INT32 = 6
} fdma_dtype;

typedef enum fdma_backend {
  FDMA_BACKEND_AUTO = 0, /* CUDA when the tensors are in device memory, else CPU */
  FDMA_BACKEND_CPU = 1,
  FDMA_BACKEND_CUDA = 2
} fdma_backend;

typedef enum fdma_pass { FDMA_PASS_FORWARD = 0, FDMA_PASS_BACKWARD = 1 } fdma_pass;

/* A strided view. An optional tensor is absent when it is all zeros (data NULL, ndim 0); a
 * tensor with no elements may have a NULL data pointer. Strides are in elements and must be
 * >= 0; a dim of size 1 may have any stride (it is ignored).
 *
 * Empty problems: B, Sq and Sk (and num_queries of select) may be 0; heads and the head dim
 * may not. Such a call runs no kernel and needs no workspace; what has elements comes back as
 * the problem computes it, as SDPA and FlashAttention return it: out 0 and lse -inf (no key
 * to attend), every gradient 0, every selection interval empty. A KV-cache call with no query
 * may not append. */
typedef struct fdma_tensor {
  void* data;
  int32_t dtype; /* fdma_dtype */
  int32_t ndim;
  int64_t shape[FDMA_MAX_DIMS];
  int64_t stride[FDMA_MAX_DIMS];
} fdma_tensor;

/* Packed variable-length batches ("varlen", FlashAttention's flash_attn_varlen_func layout),
 * for attention and dynamic_mask_attention, forward and backward. Given cu_seqlens_q and
 * cu_seqlens_k (both or neither), the batch is N sequences packed without padding:
 *   cu_seqlens_q, cu_seqlens_k : [N + 1] int32, non-decreasing, starting at 0 and ending at
 *                                total_q / total_k: sequence s owns rows [cu[s], cu[s + 1])
 *   max_seqlen_q, max_seqlen_k : host ints >= every sequence's length (they size the grids)
 *   q, out, dout, dq : [total_q, H, D]      k, v, dk, dv : [total_k, Hk, D]
 *   lse              : [H, total_q]
 * Each sequence is its own problem with the unpacked call's semantics (bottom-right causal
 * and top-w per sequence; a sequence may be empty). Per-key tensors follow the keys:
 *   attention: mask [1|Hk|H, total_k] bool and bias, dbias [1|Hk|H, total_k] (a per-key mask
 *     and bias, the same for every query of the key's sequence);
 *   dynamic_mask_attention: key_scores, dkey_scores [Hk, total_k], key_padding [total_k],
 *     keep_begin, keep_end [Hk, total_k] (query indices within the key's sequence, 0-based).
 * The CPU backend checks cu_seqlens and the max lengths; the CUDA backend cannot read them
 * without a synchronization. On CUDA, attention's per-key mask and bias are [1|Hk, total_k]
 * ([H, total_k] only where H == Hk). */

/* attention (README, "What it computes"). Forward reads q, k, v, mask, bias and writes out, lse.
 * Backward also reads out, lse, dout and writes dq, dk, dv and (if given) dbias.
 *   q, out, dout, dq : [B, Sq, H, D]        k, v, dk, dv : [B, Sk, Hk, D]
 *   lse              : [B, H, Sq] float32 (float64 allowed when q is float64)
 *   mask             : [B|1, 1|Hk|H, Sq|1, Sk|1] bool, nonzero keeps
 *   bias, dbias      : same broadcast rules as mask; bias dtype = q's or float32;
 *                      dbias dtype = bias's or float32, reduced over broadcast dims. */
typedef struct fdma_attention_params {
  fdma_tensor q, k, v, mask, bias;
  double scale;   /* 0 = default 1/sqrt(D); otherwise any finite value */
  double softcap; /* 0 = off; > 0: scores become softcap * tanh(score / softcap) */
  int32_t causal; /* bottom-right: key j visible to query i iff j <= i + Sk - Sq */
  int32_t deterministic; /* bitwise-reproducible backward (the CPU always is). 0: on Hopper the
                          * backward may sum dq with atomics into an fp32 temporary (B*H*Sq*D
                          * floats of workspace, Sq rounded up to 128 and D to 64, 128 or 256;
                          * query the size with the same flag) */
  fdma_tensor out, lse;
  fdma_tensor dout, dq, dk, dv, dbias;
  int32_t backend; /* fdma_backend */
  void* stream;    /* cudaStream_t for the CUDA backend; ignored by the CPU */
  void* workspace;
  size_t workspace_bytes;
  fdma_tensor cu_seqlens_q, cu_seqlens_k; /* varlen (above); absent: [B, S, H, D] batches */
  int64_t max_seqlen_q, max_seqlen_k;
} fdma_attention_params;

/* selection (docs/design.md, "Selection"): which queries keep each key. For every key j of (b, hk) the
 * queries that keep it form one interval [keep_begin, keep_end); a key no query keeps has
 * keep_begin == keep_end == 0.
 *   key_scores : [B, Hk, Sk] float32, float16, bfloat16 or float64 (NaN ranks lowest)
 *   key_padding: optional [B, Sk] bool, nonzero = the key exists and may be kept
 *   keep_begin, keep_end : [B, Hk, Sk] int32 outputs */
typedef struct fdma_select_params {
  fdma_tensor key_scores, key_padding;
  int64_t num_queries; /* Sq */
  int64_t window;      /* w >= 1 */
  int32_t causal;
  fdma_tensor keep_begin, keep_end;
  int32_t backend;
  void* stream;
  void* workspace;
  size_t workspace_bytes;
} fdma_select_params;

/* dynamic_mask_attention (README, "What it computes"). Same layouts as attention; key_scores
 * [B, Hk, Sk] in float32 or q's dtype; dkey_scores (optional in backward) has the shape
 * and dtype of key_scores.
 *   keep_begin, keep_end: optional [B, Hk, Sk] int32, both or neither: the selection's
 *     intervals, as fdma_select writes them. The forward writes its selection there; the
 *     backward reads it from there instead of selecting again (saving the selection's time
 *     and workspace). They must hold what the forward, or fdma_select with the same
 *     key_scores, key_padding, Sq, window and causal, wrote: other intervals are clamped to
 *     the queries that exist, so they give wrong gradients but never an access out of bounds. */
typedef struct fdma_dma_params {
  fdma_tensor q, k, v, key_scores, key_padding;
  int64_t window;
  int32_t causal;
  int32_t add_scores; /* nonzero: key_scores are added to the kept scores as a bias */
  double scale, softcap;
  int32_t deterministic; /* bitwise-reproducible backward (the CPU always is). 0: on Hopper at
                          * D 64, 128 and 256 the backward may sum dq, dk, dv and dkey_scores with
                          * atomics into fp32 temporaries (B*H*Sq*D + B*Hk*Sk*(2D+1) floats of
                          * workspace and a work list, at most 4 GiB; query the size with the
                          * same flag). Forward calls with at most 16 queries: 0 also lets them
                          * run on the decode path */
  fdma_tensor out, lse;
  fdma_tensor dout, dq, dk, dv, dkey_scores;
  fdma_tensor keep_begin, keep_end;
  int32_t backend;
  void* stream;
  void* workspace;
  size_t workspace_bytes;
  fdma_tensor cu_seqlens_q, cu_seqlens_k; /* varlen (above); absent: [B, S, H, D] batches */
  int64_t max_seqlen_q, max_seqlen_k;
} fdma_dma_params;

/* Attention of a few new queries against a KV cache (docs/decode.md), the inference path,
 * forward only. dynamic_mask_attention when score_cache is given (each query keeps its top-w
 * cached keys by score), plain attention over the whole cache when it is not.
 *
 * Caches, contiguous (block_table absent) or paged (block_table given, as vLLM/FlashInfer):
 *   k_cache, v_cache : [B, max_len, Hk, D]            or [num_pages, page_size, Hk, D]
 *   score_cache      : [B, Hk, max_len]               or [num_pages, page_size, Hk]
 *                      float32 or q's dtype
 *   block_table      : [B, max_pages] int32: page p of sequence b is block_table[b, p];
 *                      page_size must be a multiple of 16
 *   cache_seqlens    : [B] int32, keys in the cache of sequence b before this call; absent:
 *                      every sequence holds all capacity keys (max_len, or max_pages *
 *                      page_size) and nothing is appended
 * Optional new tokens, appended in place at positions cache_seqlens[b] + t before attending
 * (the caller advances cache_seqlens afterwards, as with FlashAttention):
 *   k, v : [B, Snew, Hk, D] (q's dtype)      scores : [B, Hk, Snew] (score_cache's dtype)
 * Sequence b then holds L_b = cache_seqlens[b] + Snew keys, and query i of q [B, Sq, H, D]
 * sits at position L_b - Sq + i: causal, it sees keys j <= L_b - Sq + i. Outputs out
 * [B, Sq, H, D] and optionally lse [B, H, Sq] float32; a query that sees no key gets 0 / -inf.
 * The CPU backend rejects lengths past the cache and block_table entries outside
 * [0, num_pages); the CUDA backend, which cannot read them without a synchronization, clamps
 * L_b to the cache's capacity and treats keys on such pages as absent (never read or written).
 *
 * select_state (optional, with score_cache): [B, Hk, 1 + 2 * min(window, capacity)] int32,
 *   owned by the caller, read and rewritten by every call that gets it (capacity: max_len, or
 *   max_pages * page_size). With S = min(window, capacity): entry 0 of row (b, hk) is a prefix
 *   length n, entries 1..S the positions of the top-min(window, n) keys of [0, n), ascending,
 *   and entries S+1..2S those keys' scores as float32 bits (NaN as 0x7fc00000), the library's
 *   copy: a decode step reads them there instead of gathering them across the cache, so they
 *   are trusted as written and must not be edited. After a call the row describes [0, L_b).
 *   With scores fixed per key, the top-w of a cache grown by a few keys is
 *   the old top-w with each new key taking the worst one's place when it ranks above it, so a
 *   decode step that finds a state describing its cache up to its new keys updates it instead
 *   of selecting over the whole cache. Any other content (zeros, a longer prefix after a
 *   rollback, positions out of order or out of range) makes the call select from scratch and
 *   rewrite it, so a zeroed tensor is a valid start. The caller's part: while a row's state
 *   is kept, the scores at positions below its n do not change. Appending only through calls
 *   that get the state keeps that (after cache_seqlens is rolled back, the next call finds a
 *   longer prefix and rebuilds); before appending or rewriting scores by other means, set the
 *   row's entry 0 to 0. With that, the result is the same with or without a state. */
typedef struct fdma_kvcache_params {
  fdma_tensor q;
  fdma_tensor k_cache, v_cache, score_cache;
  fdma_tensor cache_seqlens, block_table;
  fdma_tensor k, v, scores;
  fdma_tensor select_state;
  int64_t window;     /* w >= 1 with score_cache; must be 0 without */
  int32_t causal;
  int32_t add_scores; /* nonzero: the kept keys' scores are added as a bias */
  double scale, softcap;
  fdma_tensor out, lse;
  int32_t backend;
  void* stream;
  void* workspace;
  size_t workspace_bytes;
} fdma_kvcache_params;

FDMA_API int32_t fdma_abi_version(void);
FDMA_API const char* fdma_version_string(void);
/* Message of the last failed call on this thread ("" if none). Valid until the next call. */
FDMA_API const char* fdma_last_error(void);
FDMA_API const char* fdma_status_name(int32_t status);

/* CPU backend threads: 0 restores the default (FDMA_NUM_THREADS or all cores). The CPU
 * workspace size depends on it, so query the size after setting it. */
FDMA_API int32_t fdma_set_num_threads(int32_t n);
FDMA_API int32_t fdma_get_num_threads(void);
/* 1 when this build has CUDA and a GPU is usable, else 0. */
FDMA_API int32_t fdma_cuda_available(void);

FDMA_API int32_t fdma_attention_workspace_size(const fdma_attention_params* p, int32_t pass, size_t* bytes);
FDMA_API int32_t fdma_attention_fwd(const fdma_attention_params* p);
FDMA_API int32_t fdma_attention_bwd(const fdma_attention_params* p);

FDMA_API int32_t fdma_select_workspace_size(const fdma_select_params* p, size_t* bytes);
FDMA_API int32_t fdma_select(const fdma_select_params* p);

FDMA_API int32_t fdma_dma_workspace_size(const fdma_dma_params* p, int32_t pass, size_t* bytes);
FDMA_API int32_t fdma_dma_fwd(const fdma_dma_params* p);
FDMA_API int32_t fdma_dma_bwd(const fdma_dma_params* p);

/* The workspace size depends on shapes and flags only (not on cache_seqlens or block_table
 * values), so one size serves every step of a decode loop and a captured CUDA graph. */
FDMA_API int32_t fdma_kvcache_workspace_size(const fdma_kvcache_params* p, size_t* bytes);
FDMA_API int32_t fdma_kvcache_fwd(const fdma_kvcache_params* p);

#ifdef __cplusplus
} /* extern "C" */
#endif
#endif /* FDMA_FDMA_H */
