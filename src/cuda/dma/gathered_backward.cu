#include "cuda/dma/gathered_backward.hpp"

#include <string>

#include "cuda/cuda_backend.hpp"
#include "cuda/dma/bwd_setup.hpp"
#include "cuda/dma/bwd_ws_finish.hpp"
#include "cuda/dma/bwd_ws_plan.hpp"
#include "cuda/dma/dkdv_split.hpp"
#include "cuda/primitives/device_guard.hpp"

namespace fdma::cuda {

void set_gathered_rows(AttentionBwdParams& k, char* rows, size_t row_bytes) {
  k.delta = reinterpret_cast<float*>(rows);
  k.lse2 = reinterpret_cast<float*>(rows + row_bytes);
  k.Sq_pad = (k.f.Sq + kBwdBlockM - 1) / kBwdBlockM * kBwdBlockM;
  k.rows_batches_per_block = k.rows_heads_per_block = 1;
}

void set_split_partials(AttentionBwdParams& k, int splits, void* partial) {
  k.dkdv_splits = splits;
  if (splits <= 1) return;
  const AttentionFwdParams& f = k.f;
  k.dkdv_partial = static_cast<float*>(partial);
  k.dscores_partial = k.dkdv_partial + size_t(splits) * size_t(int64_t(f.B) * f.Hk * f.Sk) * size_t(2 * f.D);
}

namespace {

size_t align256(size_t x) { return (x + 255) / 256 * 256; }

// Offsets of fused_temporaries_bytes' pieces after the dq sums (at 0); bwd_setup zeroes
// [counters, rows) and the kept keys' rows, the kernel the dq sums (bwd_ws_dq_zero.cuh).
struct FusedLayout {
  BwdWsPlanShape plan;
  size_t counters, rows, dscores, plan_keys, plan_groups, plan_halves, plan_items, total;
  FusedLayout(int64_t B, int64_t H, int64_t Hk, int64_t Sq, int64_t Sk, int64_t D)
      : plan(bwd_ws_plan_shape(B, Hk, H / Hk, Sq, Sk)) {
    const int64_t sq_pad = (Sq + kBwdBlockM - 1) / kBwdBlockM * kBwdBlockM;
    counters = align256(size_t(B * H) * size_t(sq_pad) * size_t(D) * 4);
    rows = counters + align256(plan.counters_bytes());
    dscores = rows + size_t(B * Hk * Sk) * size_t(2 * D) * 4;
    plan_keys = align256(dscores + size_t(B * Hk * Sk) * 4);
    plan_groups = plan_keys + align256(plan.keys_bytes());
    plan_halves = plan_groups + align256(plan.groups_bytes());
    plan_items = plan_halves + align256(plan.halves_bytes());
    total = plan_items + align256(plan.items_bytes());
  }
};

}  // namespace

size_t fused_temporaries_bytes(int64_t B, int64_t H, int64_t Hk, int64_t Sq, int64_t Sk, int64_t D) {
  return FusedLayout(B, H, Hk, Sq, Sk, D).total;
}

void set_fused_temporaries(AttentionBwdParams& k, char* base, int64_t window) {
  const AttentionFwdParams& f = k.f;
  const FusedLayout l(f.B, f.H, f.Hk, f.Sq, f.Sk, f.D);
  k.dkdv_splits = 1;
  k.dq_acc = reinterpret_cast<float*>(base);
  k.dkdv_partial = reinterpret_cast<float*>(base + l.rows);
  k.dscores_partial = reinterpret_cast<float*>(base + l.dscores);
  k.ws.counts = reinterpret_cast<int*>(base + l.counters);
  k.ws.taken = k.ws.counts + l.plan.max_ranges;
  k.ws.range_done = k.ws.taken + l.plan.max_ranges;
  k.ws.finish_taken = k.ws.range_done + l.plan.max_ranges;
  k.ws.group_done = k.ws.finish_taken + l.plan.max_ranges;
  k.ws.zero_done = k.ws.group_done + l.plan.groups;
  k.ws.zero_next = k.ws.zero_done + l.plan.max_ranges;
  static_assert(kBwdBlockM == 64, "the zeroed tiles are Sq_pad's 64-row tiles");
  k.ws.dq_tiles = int((f.Sq + kBwdBlockM - 1) / kBwdBlockM);
  k.ws.dq_tile_float4s = kBwdBlockM * int(f.D) / 4;
  k.ws.keys = reinterpret_cast<int32_t*>(base + l.plan_keys);
  k.ws.groups = reinterpret_cast<BwdWsGroup*>(base + l.plan_groups);
  k.ws.halves = reinterpret_cast<BwdWsGroup*>(base + l.plan_halves);
  k.ws.items = reinterpret_cast<BwdWsItem*>(base + l.plan_items);
  k.ws.tiles_per_range = bwd_ws_tiles_per_range(f, window);
  const int64_t tiles = (f.Sq + 63) / 64;
  k.ws.ranges = int((tiles + k.ws.tiles_per_range - 1) / k.ws.tiles_per_range);
  k.ws.groups_per_row = int(bwd_ws_groups_per_row(f.Sk));
  k.ws.n_groups = int(l.plan.groups);
}

void run_gathered_backward(const char* op, const AttentionBwdParams& given, const DmaListShape& s, const fdma_tensor& dk,
                           const fdma_tensor& dv, DType dtype, cudaStream_t stream, bool overlap) {
  AttentionBwdParams k = given;
  const AttentionFwdParams& f = k.f;
  const bool fused = k.dq_acc && backward_ws_takes(k, dtype);
  if (k.dq_acc && !fused) k.dq_acc = nullptr, k.dkdv_partial = k.dscores_partial = nullptr, k.ws = BwdWsPlan{};
  BwdZeroArgs z{};
  z.dk = dk.data, z.dv = dv.data;
  for (int i = 0; i < 3; ++i) z.dk_stride[i] = dk.stride[i], z.dv_stride[i] = dv.stride[i];
  z.D = f.D;
  z.elem_bytes = int(dtype_size(dtype));
  z.dscores = f.lists.dscores;
  for (int i = 0; i < 3; ++i) z.dscores_stride[i] = f.lists.dscores_stride[i];
  z.dscores_bytes = f.lists.dscores_f32 ? 4 : z.elem_bytes;
  if (fused) {  // the plan's counters (FusedLayout); the kernel zeroes the dq sums itself
    z.kept_rows = k.dkdv_partial, z.kept_dscores = k.dscores_partial;
    z.sums = reinterpret_cast<float4*>(k.ws.counts);
    z.sum_float4s = int64_t(reinterpret_cast<char*>(k.dkdv_partial) - reinterpret_cast<char*>(k.ws.counts)) / 16;
  }
  // The prepare's rows go with the setup launch, beside its sort and its zeroing (the dq sums
  // are the kernel's to zero): one launch fewer in the chain.
  const BwdPrepareRows prep = bwd_prepare_rows(k, dtype == DType::bf16);
  check_cuda(bwd_setup(s, f.lists.info, f.lists.kept, f.lists.kept_count, f.lists.kept_by_end, z, prep, stream, overlap),
             std::string(op) + " (CUDA): order kept keys, prepare rows, zero temporaries");
  if (fused) check_cuda(bwd_ws_plan(f, k.ws, stream), std::string(op) + " (CUDA): backward work list");
  run_backward_kernels(k, dtype, stream, /*prepared=*/true);
  if (k.dkdv_splits <= 1 && !fused) return;
  DkdvSplitSum a{};
  a.dkdv_partial = k.dkdv_partial, a.dscores_partial = k.dscores_partial;
  a.splits = k.dkdv_splits, a.B = f.B, a.Hk = f.Hk, a.Sk = f.Sk, a.D = f.D;  // fused: 1 (set_fused_temporaries)
  a.kept = f.lists.kept, a.kept_count = f.lists.kept_count;
  a.dk = dk.data, a.dv = dv.data;
  for (int i = 0; i < 3; ++i) a.dk_stride[i] = dk.stride[i], a.dv_stride[i] = dv.stride[i];
  a.bf16 = dtype == DType::bf16;
  a.dscores = f.lists.dscores, a.dscores_f32 = f.lists.dscores_f32;
  for (int i = 0; i < 3; ++i) a.dscores_stride[i] = f.lists.dscores_stride[i];
  if (fused)
    check_cuda(bwd_ws_finish(k, a, stream), std::string(op) + " (CUDA): backward finish");
  else
    check_cuda(dkdv_split_sum(a, stream), std::string(op) + " (CUDA): dk/dv split sum");
}

}  // namespace fdma::cuda
