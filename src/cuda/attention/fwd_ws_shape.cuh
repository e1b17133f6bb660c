// The warp-specialized forward's shapes (attention_fwd_ws.cuh): the kinds of call, their key
// tiles, a CTA's shared-memory layout and mbarriers (FwdWsShape), a scored call's terms in shared
// memory (FwdWsTerms), the key tiles a scored CTA walks (FwdWsWalk), and the copy engine's maps.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <type_traits>

#include "cuda/attention/attention_fwd_params.hpp"
#include "cuda/attention/fwd_mma_sm90.cuh"
#include "cuda/attention/kernel_table.hpp"
#include "cuda/attention/next_active.cuh"
#include "cuda/primitives/tile_io_sm80.cuh"
#include "cuda/primitives/wgmma.cuh"

namespace fdma::cuda {

// Copy-engine descriptors of q, k and v (boxes of 64 columns by 128 rows of one head), of a
// bias (per-key rows of a key tile, or 64-key blocks of 128 rows), of a mask (a key tile's
// row, or its 128 rows) and of out (64 columns by a consumer group's 64 rows: the kinds that
// store O through the copy engine).
struct FwdTensorMaps {
  CUtensorMap q, k, v, bias, mask, o;
};

// The calls a kernel takes; each kind is an instantiation of its own, so that a kernel's
// unrolled loop holds only its own score path.
enum class FwdWsKind {
  dense,          // no mask; no bias or a per-key one ([.., 1, Sk])
  scored,         // a mask and/or a bias with a query dim: tiles copied with K, the mask summary walked
  scored_narrow,  // the same on 64-key tiles at D = 128: a mask tile and a bias tile together
  masked_biased,  // scored, with a mask tile and a bias tile where both do not fit (D = 256): the
                  // bias tile copied, the mask laid over it by the producer group's idle warps
  gathered,       // dynamic-mask mode: the keys of a query tile's list
};
constexpr bool fwd_ws_scored(FwdWsKind kind) {
  return kind == FwdWsKind::scored || kind == FwdWsKind::scored_narrow || kind == FwdWsKind::masked_biased;
}

// Keys per tile: 128 for gathered calls (64 at D = 256, where two stages of 128 K and V rows
// would not fit beside Q); for dense calls 192 at D = 64,
// 176 at D = 128 and 80 at D = 256 (O takes 128 registers a thread there): the widest S the
// consumers' registers hold, which spreads a step's fixed costs (the turn barriers, the row
// maxima's shuffles, O's rescale) over the most keys (docs/performance.md, "attention forward").
// Scored calls: 128 (64 at D = 256), where a stage's mask and bias tiles fit beside K and V and
// their rows are one swizzle span (128 or 64 bytes of mask, 64-key blocks of bias). At D = 128
// two stages of K, V, a mask tile and a bias tile of 128 keys take 256 KB; of 64 keys, 144 KB
// (scored_narrow, the kind such calls take).
constexpr int fwd_ws_key_tile(int head_dim, FwdWsKind kind) {
  if (kind == FwdWsKind::gathered) return head_dim == 256 ? 64 : 128;
  if (kind == FwdWsKind::scored_narrow) return 64;
  if (kind == FwdWsKind::scored || kind == FwdWsKind::masked_biased) return head_dim == 256 ? 64 : 128;
  return head_dim == 64 ? 192 : head_dim == 128 ? 176 : 80;
}

// The CTA's shape and shared memory: Q, then kStages K buffers, kVStages V buffers (each
// 1024-byte aligned for the swizzle), per stage the gathered keys' KeyInfo records (gathered
// calls) or the key tile's bias row (dense calls), then the mbarriers; scored calls then their
// terms (FwdWsTerms), sized per call.
template <class T, int kHeadDim, FwdWsKind kKind>
struct FwdWsShape {
  static constexpr bool kGather = kKind == FwdWsKind::gathered, kScored = fwd_ws_scored(kKind);
  static constexpr bool kMaskOverBias = kKind == FwdWsKind::masked_biased;
  static_assert(kKind != FwdWsKind::scored_narrow || kHeadDim == 128, "narrow scored tiles: D = 128");
  using Mma = FwdMmaSm90<T, kHeadDim, fwd_ws_key_tile(kHeadDim, kKind)>;
  static constexpr int kBlockM = Mma::kBlockM, kBlockN = Mma::kBlockN;
  static constexpr int kStages = 2;
  // Gathered calls up to D 128 keep a third V buffer: their producer gathers V rows only into a
  // buffer both groups have released, and with three the groups release V after the softmax
  // (the dense kinds' order) without the producer waiting on it. At D 256 it does not fit.
  static constexpr int kVStages = kGather && kHeadDim <= 128 ? 3 : kStages;
  static constexpr int kConsumers = 2;  // warp groups of 64 rows
  static constexpr int kGroupRows = kBlockM / kConsumers;  // (the box of out's tensor map)
  static constexpr int kThreads = 128 * (1 + kConsumers);
  // Registers a thread, with 168 a thread at launch: 24 x 128 + 240 x 256 fit the SM's 64 K,
  // and so do 40 x 128 + 232 x 256, which the gathering producer takes (each lane's source
  // column and swizzle for K and V kept across tiles, gather_rows_by_warp, spilled at 24).
  static constexpr int kProducerRegs = kGather ? 40 : 24, kConsumerRegs = kGather ? 232 : 240;
  static_assert(kProducerRegs + kConsumers * kConsumerRegs <= 3 * 168, "the register file holds the split");
  static constexpr int kColBlocks = kHeadDim / 64;  // TMA copies per tile: one per 128-byte column block
  // A stage's KeyInfo records or bias row (fp32 at most), padded to 128 bytes: the copy engine
  // writes bias rows to 128-byte aligned addresses.
  static constexpr int kInfoUsed = kGather ? kBlockN * int(sizeof(KeyInfo)) : kScored ? 0 : kBlockN * 4;
  static constexpr int kInfoBytes = (kInfoUsed + 127) / 128 * 128;
  // Gathered bf16 calls fold each key's term into S (KeyLists::bias_chunks): one more 16-column
  // slice of Q and of each K stage, in 32-byte swizzled blocks of their own (Q's holds ones,
  // written once; a K stage's the listed keys' chunks, copied with their rows).
  static constexpr bool kFold = kGather && std::is_same_v<T, __nv_bfloat16> && kHeadDim <= 128;  // lists_fold_bias
  static constexpr int kTermBlockBytes = kFold ? kBlockM * wgmma::kSw32RowBytes : 0;  // kBlockN == kBlockM
  static constexpr int kQ = 0, kK = kQ + Mma::kQBytes, kV = kK + kStages * Mma::kKVBytes;
  static constexpr int kQTerm = kV + kVStages * Mma::kKVBytes, kKTerm = kQTerm + kTermBlockBytes;
  static constexpr int kInfo = kKTerm + kStages * kTermBlockBytes;
  static constexpr int kBars = kInfo + kStages * kInfoBytes;
  // q_full, then per K stage k_full, k_empty, per V stage v_full, v_empty; mask over bias, per
  // K stage ready (the mask laid over the stage's bias tile)
  static constexpr int kNumBars = 1 + 2 * kStages + 2 * kVStages + (kMaskOverBias ? kStages : 0);
  static constexpr int kSmemBytes = align_slack<1024>() + kBars + kNumBars * 8;  // without a scored call's terms
  static_assert(kSmemBytes <= 227 * 1024, "fits an SM's shared memory");
  static constexpr int kTerms = (kBars + kNumBars * 8 + 1023) / 1024 * 1024;  // scored calls' terms (1024-aligned)
  // Arrivals that fill a buffer: the TMA thread's one, or one per gathering thread.
  static constexpr int kFillArrivals = kGather ? 128 : 1;
  // O stored by the copy engine from shared memory (fwd_ws_consume), else from registers. Not
  // in dense calls at D 128: there the staged store's code made the key loop slower on long
  // rows; at D 64 it was faster at every length, at D 256 as fast or faster (docs/performance.md,
  // "the forward's epilogue").
  static constexpr bool kStoreThroughCopy = kKind != FwdWsKind::dense || kHeadDim != 128;

  __device__ static uint32_t q_full(uint32_t base) { return base + kBars; }
  __device__ static uint32_t k_full(uint32_t base, int s) { return base + kBars + 8 * (1 + s); }
  __device__ static uint32_t k_empty(uint32_t base, int s) { return base + kBars + 8 * (1 + kStages + s); }
  __device__ static uint32_t v_full(uint32_t base, int s) { return base + kBars + 8 * (1 + 2 * kStages + s); }
  __device__ static uint32_t v_empty(uint32_t base, int s) {
    return base + kBars + 8 * (1 + 2 * kStages + kVStages + s);
  }
  __device__ static uint32_t ready(uint32_t base, int s) {
    return base + kBars + 8 * (1 + 2 * kStages + 2 * kVStages + s);
  }
  __device__ static uint32_t k_tile(uint32_t base, int s) { return base + kK + s * Mma::kKVBytes; }
  __device__ static uint32_t v_tile(uint32_t base, int s) { return base + kV + s * Mma::kKVBytes; }
  __device__ static uint32_t k_term_tile(uint32_t base, int s) { return base + kKTerm + s * kTermBlockBytes; }
  __device__ static int info_offset(int s) { return kInfo + s * kInfoBytes; }
  __device__ static int bias_offset(int s) { return info_offset(s); }
};

// A scored call's terms in shared memory after the barriers: per stage the key tile's mask
// tile (128 rows of kBlockN bytes) or, for a mask broadcast over queries, its mask row; and its
// bias tile (kBlockN / 64 blocks of 128 rows x 64 elements in q's dtype) or bias row (q's dtype
// or float32). Tiles first, 1024-byte aligned for the swizzle; rows after them, 128-byte
// aligned for the copy engine; the next-active table last. Sized per call, so that a call
// pays shared memory only for the terms it has.
template <class Shape>
struct FwdWsTerms {
  static constexpr int kS = Shape::kStages;
  int mask_tile, mask_row, bias_tile, bias_row;  // bytes a stage; 0 where absent

  __host__ __device__ explicit FwdWsTerms(const AttentionFwdParams& p) {
    const bool mask_keys = p.mask && p.mask_stride[2] == 0, bias_keys = p.bias && p.bias_stride[2] == 0;
    mask_tile = p.mask && !mask_keys && !Shape::kMaskOverBias ? Shape::kBlockM * Shape::kBlockN : 0;
    mask_row = mask_keys ? 128 : 0;  // kBlockN <= 128 bytes
    bias_tile = p.bias && !bias_keys ? Shape::kBlockM * Shape::kBlockN * 2 : 0;
    bias_row = bias_keys ? Shape::kBlockN * (p.bias_f32 ? 4 : 2) : 0;  // a multiple of 128
  }
  __host__ __device__ int mask_tile_at(int s) const { return Shape::kTerms + s * mask_tile; }
  __host__ __device__ int bias_tile_at(int s) const { return Shape::kTerms + kS * mask_tile + s * bias_tile; }
  __host__ __device__ int mask_row_at(int s) const { return Shape::kTerms + kS * (mask_tile + bias_tile) + s * mask_row; }
  __host__ __device__ int bias_row_at(int s) const {
    return Shape::kTerms + kS * (mask_tile + bias_tile + mask_row) + s * bias_row;
  }
  __host__ __device__ int table_at() const { return Shape::kTerms + kS * (mask_tile + bias_tile + mask_row + bias_row); }
  // Bytes the copies of a key tile's terms bring (the mask's none where the tile is kept whole).
  __host__ __device__ int copy_bytes(bool mask_keeps_all) const {
    return (mask_keeps_all ? 0 : mask_tile + (mask_row ? Shape::kBlockN : 0)) + bias_tile + bias_row;
  }
  __host__ __device__ int smem_bytes(const AttentionFwdParams& p) const {
    return align_slack<1024>() + table_at() + next_active_bytes(p, Shape::kBlockN);
  }
};

// The summary tiles a scored CTA's tile covers: its 128 query rows and kBlockN keys over the
// summary's fwd_block_m x fwd_block_n tiles (mask_tile_summary.cu).
template <class Shape, int kHeadDim>
using FwdWsSummary = SummaryTiles<Shape::kBlockM / fwd_block_m(kHeadDim), Shape::kBlockN / fwd_block_n(kHeadDim)>;

// The key tiles a scored CTA walks, in order: the active ones below n_blocks, through the
// next-active table in shared memory where the call has one (next_active.cuh).
template <class Summary>
struct FwdWsWalk {
  Summary tiles;
  const int16_t* table;  // null: step through the summary
  int n_blocks;
  __device__ int next(int nb) const {
    if (table) return nb < n_blocks ? int(table[nb]) : nb;
    while (nb < n_blocks && !tiles.active(nb)) ++nb;
    return nb;
  }
};

}  // namespace fdma::cuda
