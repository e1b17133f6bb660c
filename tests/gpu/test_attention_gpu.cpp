// attention forward and backward on the GPU against the CPU backend and the float64
// reference, on the same inputs: every case of the CPU matrix that the GPU path supports (bf16/fp16, head
// dims that are multiples of 8). Tolerance from the precision (FlashAttention-3's rule):
// GPU error <= 2 x the CPU backend's error + one rounding unit of the output dtype.
// Skipped where no GPU is usable.
#include <gtest/gtest.h>

#include <memory>

#include "attention_case.hpp"
#include "device_tensor.hpp"
#include "empty_case.hpp"

using namespace fdma;
using namespace fdma::test;

namespace {

struct GpuAttention {
  AttnRun& r;
  DeviceTensor q, k, v, out, lse, dout, dq, dk, dv;
  std::unique_ptr<DeviceTensor> mask, bias, dbias;
  void* ws = nullptr;
  bool deterministic = false;
  bool want_dbias = true;  // a bias's gradient asked for
  explicit GpuAttention(AttnRun& run)
      : r(run), q(r.q), k(r.k), v(r.v), out(r.out), lse(r.lse), dout(r.dout), dq(r.dq), dk(r.dk), dv(r.dv) {
    if (r.c.mask.present) mask = std::make_unique<DeviceTensor>(r.mask);
    if (r.c.bias.present) {
      bias = std::make_unique<DeviceTensor>(r.bias);
      dbias = std::make_unique<DeviceTensor>(r.dbias);
    }
  }
  ~GpuAttention() {
    if (ws) cudaFree(ws);
  }
  bool ok() const { return q.ok() && k.ok() && v.ok() && out.ok() && lse.ok() && dout.ok() && dq.ok() && dk.ok() && dv.ok(); }
  AttentionParams params(cudaStream_t stream) const {
    AttentionParams p = r.params();
    p.q = q.view(), p.k = k.view(), p.v = v.view(), p.out = out.view(), p.lse = lse.view();
    p.dout = dout.view(), p.dq = dq.view(), p.dk = dk.view(), p.dv = dv.view();
    if (mask) p.mask = mask->view();
    if (bias) p.bias = bias->view();
    if (bias) p.dbias = want_dbias ? dbias->view() : decltype(p.dbias){};
    p.deterministic = deterministic;
    p.stream = stream;
    return p;
  }
  // Runs one pass into device outputs poisoned first; returns the workspace size it used.
  size_t run(Pass pass, cudaStream_t stream) {
    AttentionParams p = params(stream);
    if (pass == Pass::forward) {
      out.poison();
      lse.poison();
    } else {
      for (DeviceTensor* t : {&dq, &dk, &dv, dbias.get()})
        if (t) t->poison();
    }
    const size_t bytes = attention_workspace_size(p, pass);
    if (ws) cudaFree(ws), ws = nullptr;
    if (bytes && cudaMalloc(&ws, bytes) != cudaSuccess) ADD_FAILURE() << "cudaMalloc of the workspace failed";
    p.workspace = ws, p.workspace_bytes = bytes;
    pass == Pass::forward ? attention_forward(p) : attention_backward(p);
    EXPECT_EQ(stream ? cudaStreamSynchronize(stream) : cudaDeviceSynchronize(), cudaSuccess);
    return bytes;
  }
};

// Forward then backward on the GPU with path switch `sw` at "0", then at "1": paths that only
// reorder when or where the same arithmetic runs give out, lse, dq, dk, dv and dbias bitwise
// equal (a deterministic backward: the fused dq's atomics sum in any order).
void expect_switch_bitwise(GpuAttention& gpu, const ScopedEnv& sw) {
  AttnRun& r = gpu.r;
  gpu.deterministic = true;
  std::vector<std::vector<unsigned char>> off;
  for (int on = 0; on < 2; ++on) {
    sw.set(on ? "1" : "0");
    std::vector<std::vector<unsigned char>> got;
    gpu.run(Pass::forward, nullptr);
    for (auto [dev, host] : {std::pair{&gpu.out, &r.out}, {&gpu.lse, &r.lse}}) {
      dev->download();
      got.push_back(host->bytes());
    }
    gpu.run(Pass::backward, nullptr);
    for (auto [dev, host] : {std::pair{&gpu.dq, &r.dq}, {&gpu.dk, &r.dk}, {&gpu.dv, &r.dv}, {gpu.dbias.get(), &r.dbias}}) {
      if (!dev) continue;
      dev->download();
      got.push_back(host->bytes());
    }
    if (!on) off = got;
    else
      for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(got[i] == off[i]) << "output " << i << " differs";
  }
}

// Forward (and backward when asked) on the GPU against the CPU backend and the float64
// reference. The backward reads the CPU forward's out and lse, so both backends see the
// same stored inputs. want_dbias: a bias's gradient asked for of the GPU.
void run_gpu(AttnRun& r, bool backward, cudaStream_t stream = nullptr, bool want_dbias = true) {
  const AttnCase& c = r.c;
  SCOPED_TRACE(c.str());
  r.forward();  // CPU backend
  const auto cpu_out = r.out.values();
  const auto cpu_out_bytes = r.out.bytes(), cpu_lse_bytes = r.lse.bytes();
  const auto ref = ref::forward(r.rp);

  GpuAttention gpu(r);
  ASSERT_TRUE(gpu.ok());
  gpu.want_dbias = want_dbias;
  const size_t ws_bytes = gpu.run(Pass::forward, stream);
  EXPECT_EQ(ws_bytes == 0, !c.mask.present);  // only the mask tile summary needs workspace
  gpu.out.download();
  gpu.lse.download();
  EXPECT_TRUE(within_precision(r.out.values(), cpu_out, ref.out, max_abs(ref.out), c.dtype, "out"));
  EXPECT_TRUE(r.out.gaps_poisoned() && r.lse.gaps_poisoned()) << "out or lse written outside its elements";
  EXPECT_TRUE(all_close(r.lse.values(), ref.lse, {2e-4, 2e-5}, "lse (GPU)"));
  if (!backward) return;

  // Back to the CPU's forward outputs, then the CPU backward, then the GPU backward.
  r.out.bytes() = cpu_out_bytes;
  r.lse.bytes() = cpu_lse_bytes;
  gpu.out.upload();
  gpu.lse.upload();
  r.backward();
  const auto g = ref::backward(r.rp, r.dout.values());
  const auto cpu_dq = r.dq.values(), cpu_dk = r.dk.values(), cpu_dv = r.dv.values();
  const auto cpu_db = c.bias.present ? r.dbias.values() : std::vector<double>{};
  gpu.run(Pass::backward, stream);
  for (DeviceTensor* t : {&gpu.dq, &gpu.dk, &gpu.dv, gpu.dbias.get()})
    if (t) t->download();
  EXPECT_TRUE(within_precision(r.dq.values(), cpu_dq, g.dq, max_abs(g.dq), c.dtype, "dq"));
  EXPECT_TRUE(within_precision(r.dk.values(), cpu_dk, g.dk, max_abs(g.dk), c.dtype, "dk"));
  EXPECT_TRUE(within_precision(r.dv.values(), cpu_dv, g.dv, max_abs(g.dv), c.dtype, "dv"));
  if (c.bias.present && want_dbias) {
    // A reduced dbias element sums dS of both signs: scale its tolerance by the summed magnitude.
    std::vector<double> mag(g.dbias.size());
    for (size_t i = 0; i < mag.size(); ++i) mag[i] = std::fabs(g.dbias[i]);
    const auto db_ref = ref::reduce_broadcast(r.rp, g.dbias, r.bias_shape);
    const double scale = max_abs(ref::reduce_broadcast(r.rp, mag, r.bias_shape));
    EXPECT_TRUE(within_precision(r.dbias.values(), cpu_db, db_ref, scale, c.dtype, "dbias"));
  }
}

void run_gpu(const AttnCase& c, bool backward = true, cudaStream_t stream = nullptr) {
  AttnRun r(c);
  run_gpu(r, backward, stream);
}

AttnCase base(int64_t Sq, int64_t Sk, int64_t H, int64_t Hk, int64_t D, bool causal, DType dt, uint64_t seed) {
  AttnCase c;
  c.B = 2, c.Sq = Sq, c.Sk = Sk, c.H = H, c.Hk = Hk, c.D = D, c.causal = causal, c.dtype = dt, c.seed = seed;
  return c;
}

// A block mask over [Sq, Sk] into r.mask and the reference's keep: blk x blk blocks kept with
// probability block_p, their elements with elem_p.
void fill_block_mask(AttnRun& r, uint64_t seed, int64_t blk, double block_p, double elem_p) {
  const AttnCase& c = r.c;
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution block_on(block_p), elem_on(elem_p);
  const int64_t nbk = (c.Sk + blk - 1) / blk;
  std::vector<char> on(((c.Sq + blk - 1) / blk) * nbk);
  for (auto& x : on) x = block_on(rng);
  for (int64_t i = 0; i < c.Sq; ++i)
    for (int64_t j = 0; j < c.Sk; ++j) r.mask.set(i * c.Sk + j, on[(i / blk) * nbk + j / blk] && elem_on(rng));
  auto full = expand_full(c, r.mask.values(), declared_shape(c, c.mask));
  r.rp.keep.assign(full.begin(), full.end());
}

}  // namespace

TEST(AttentionGpu, RaggedLengthsHeadsCausal) {
  REQUIRE_GPU();
  uint64_t seed = 1;
  for (DType dt : {DType::bf16, DType::f16})
    for (auto [Sq, Sk] : {std::pair<int64_t, int64_t>{1, 1}, {7, 7}, {63, 64}, {64, 64}, {65, 65}, {100, 127},
                          {129, 63}, {1, 300}, {257, 1000}})
      for (auto [H, Hk] : {std::pair<int64_t, int64_t>{2, 2}, {4, 2}, {3, 1}})
        for (bool causal : {false, true}) run_gpu(base(Sq, Sk, H, Hk, 64, causal, dt, seed++));
}

TEST(AttentionGpu, HeadDims) {
  REQUIRE_GPU();
  uint64_t seed = 100;
  for (DType dt : {DType::bf16, DType::f16})
    for (int64_t D : {8, 32, 40, 64, 96, 112, 128, 160, 192, 256}) run_gpu(base(77, 150, 4, 2, D, true, dt, seed++));
}

TEST(AttentionGpu, EveryMaskAndBiasBroadcastShape) {
  REQUIRE_GPU();
  uint64_t seed = 200;
  for (int heads : {0, 1, 2})
    for (int bits = 0; bits < 8; ++bits) {
      AttnCase c = base(70, 90, 4, 2, 32, bits & 1, DType::bf16, seed++);
      c.mask.present = true;
      c.mask.b = bits & 1, c.mask.q = bits & 2, c.mask.k = bits & 4, c.mask.heads = heads;
      c.mask.expanded = bits == 5;
      run_gpu(c);
      AttnCase d = base(70, 90, 4, 2, 32, bits & 2, DType::f16, seed++);
      d.bias.present = true;
      d.bias.b = bits & 1, d.bias.q = bits & 2, d.bias.k = bits & 4, d.bias.heads = heads;
      d.bias.dtype = heads == 1 ? DType::f32 : DType::unset;
      d.bias.expanded = bits == 6;
      run_gpu(d);
    }
}

TEST(AttentionGpu, MaskBiasSoftcapLayoutsEmptyRows) {
  REQUIRE_GPU();
  uint64_t seed = 300;
  for (int layout : {0, 1, 3})
    for (double softcap : {0.0, 4.0}) {
      AttnCase c = base(150, 130, 4, 1, 128, true, layout == 1 ? DType::f16 : DType::bf16, seed++);
      c.layout = layout, c.softcap = softcap;
      c.mask.present = true;
      c.mask.heads = 1;
      c.empty_rows = 5;
      c.bias.present = true;
      c.bias.q = false;
      run_gpu(c);
    }
}

TEST(AttentionGpu, LongSequenceOnAStream) {
  REQUIRE_GPU();
  cudaStream_t s;
  FDMA_CUDA_OK(cudaStreamCreate(&s));
  AttnCase c = base(1000, 2100, 8, 2, 128, true, DType::bf16, 400);
  c.B = 1;
  run_gpu(c, false, s);
  cudaStreamDestroy(s);
}

TEST(AttentionGpu, ClearErrorsForWhatTheGpuPathRejects) {
  REQUIRE_GPU();
  AttnRun r(base(16, 16, 2, 2, 64, false, DType::bf16, 500));
  DeviceTensor q(r.q), k(r.k), v(r.v), out(r.out), lse(r.lse), dout(r.dout), dq(r.dq), dk(r.dk), dv(r.dv);
  AttentionParams p = r.params();
  p.q = q.view(), p.k = k.view(), p.v = v.view(), p.out = out.view(), p.lse = lse.view();
  p.dout = dout.view(), p.dq = dq.view(), p.dk = dk.view(), p.dv = dv.view();
  // Mixed devices: host k with device q.
  AttentionParams mixed = p;
  mixed.k = r.k.view();
  try {
    attention_forward(mixed);
    ADD_FAILURE() << "mixed host/device tensors accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("k is host memory but the CUDA backend runs this call"), std::string::npos)
        << e.what();
  }
  // Forcing the CPU backend on device memory is refused, not a crash.
  AttentionParams cpu = p;
  cpu.backend = FDMA_BACKEND_CPU;
  EXPECT_THROW(attention_forward(cpu), Error);
  // A host gradient among device tensors is named, not written through.
  AttentionParams host_dq = p;
  host_dq.dq = r.dq.view();
  try {
    attention_backward(host_dq);
    ADD_FAILURE() << "host dq with device inputs accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dq is host memory"), std::string::npos) << e.what();
  }
  // The backward needs its workspace: too small is refused before any launch.
  AttentionParams small = p;
  small.workspace_bytes = attention_workspace_size(p, Pass::backward) - 1;
  small.workspace = q.view().data;
  EXPECT_THROW(attention_backward(small), Error);
}

TEST(AttentionGpu, BackwardIsBitwiseDeterministic) {
  // dbias reduced over queries and heads, GQA and causal: every reduction the backward does,
  // with `deterministic` set (without it, Hopper sums dq with atomics).
  REQUIRE_GPU();
  AttnCase c = base(300, 333, 8, 2, 64, true, DType::bf16, 800);
  c.bias.present = true;
  c.bias.q = false, c.bias.heads = 0;
  AttnRun r(c);
  r.forward();
  GpuAttention gpu(r);
  ASSERT_TRUE(gpu.ok());
  gpu.deterministic = true;
  std::vector<std::vector<unsigned char>> first;
  for (int run = 0; run < 3; ++run) {
    gpu.run(Pass::backward, nullptr);
    int n = 0;
    for (DeviceTensor* t : {&gpu.dq, &gpu.dk, &gpu.dv, gpu.dbias.get()}) {
      t->download();
      HostTensor* h = t == &gpu.dq ? &r.dq : t == &gpu.dk ? &r.dk : t == &gpu.dv ? &r.dv : &r.dbias;
      if (run == 0) first.push_back(h->bytes());
      else EXPECT_TRUE(h->bytes() == first[n]) << "run " << run << " differs in gradient " << n;
      ++n;
    }
  }
}

TEST(AttentionGpu, MaskAndBiasTilesThroughSharedMemory) {
  // Key lengths whose rows are 16-byte aligned take the shared-memory tile path; 272 and 1040
  // also leave a partial last key tile.
  REQUIRE_GPU();
  uint64_t seed = 600;
  for (auto [Sq, Sk] : {std::pair<int64_t, int64_t>{200, 256}, {333, 272}, {64, 1040}})
    for (int heads : {0, 1, 2})
      for (int bits = 0; bits < 4; ++bits) {
        AttnCase c = base(Sq, Sk, 4, 2, bits & 1 ? 128 : 64, bits & 2, bits & 1 ? DType::bf16 : DType::f16, seed++);
        c.mask.present = true;
        c.mask.heads = heads, c.mask.q = bits & 1, c.mask.b = bits & 2;
        c.bias.present = true;
        c.bias.heads = 2 - heads, c.bias.q = !(bits & 1), c.bias.b = bits & 1;
        c.bias.dtype = bits & 2 ? DType::f32 : DType::unset;
        run_gpu(c);
      }
}

TEST(AttentionGpu, BackwardTermTilesEveryCombination) {
  // The backward's interior tiles take mask and bias from shared-memory tiles or, for a
  // query-broadcast bias, from registers (score_terms_bwd.cuh): every mask x bias source, with
  // causal diagonals, ragged ends and softcap; D = 64 and 128 run the wgmma kernels on Hopper,
  // D = 256 the mma.sync ones, whose larger tiles may fall back to per-score reads.
  REQUIRE_GPU();
  uint64_t seed = 650;
  for (int mask = 0; mask < 3; ++mask)    // none, [B, Hk, Sq, Sk], [B, 1, 1, Sk]
    for (int bias = 0; bias < 4; ++bias)  // none, [B, H, 1, Sk], [1, H, Sq, Sk] in q's dtype, same in float32
      for (int64_t D : {64, 128, 256}) {
        if (mask == 0 && bias == 0) continue;
        const bool causal = (mask + bias + D / 64) % 2 == 1;
        AttnCase c = base(200, 320, 4, 2, D, causal, D == 128 ? DType::bf16 : DType::f16, seed++);
        c.softcap = bias == 3 ? 5.0 : 0.0;
        c.mask.present = mask > 0;
        c.mask.heads = mask == 1 ? 1 : 0, c.mask.q = mask == 1;
        c.bias.present = bias > 0;
        c.bias.heads = 2, c.bias.q = bias >= 2, c.bias.b = bias == 1;
        c.bias.dtype = bias == 3 ? DType::f32 : DType::unset;
        run_gpu(c);
      }
}

TEST(AttentionGpu, BlockSparseMaskSkipsEmptyTiles) {
  // Blocks kept with probability 1/8, elements inside with 1/2: most tiles hold no kept key
  // and are skipped; rows whose blocks are all off must still give zeros. Then 128x128 blocks
  // kept whole (with probability 1/3; Sk = 896 so the mask's rows tile through shared memory):
  // tiles the mask keeps whole run as unmasked, in the forward's and the backward's tiles.
  // With the partial blocks, a [B, H, Sq, Sk] bias too, whose gradient is written directly.
  REQUIRE_GPU();
  uint64_t seed = 700;
  for (double elem_p : {0.5, 1.0})
    for (int64_t D : {64, 128})
      for (bool causal : {false, true}) {
        const int64_t blk = elem_p == 1.0 ? 128 : 64;
        AttnCase c = base(700, elem_p == 1.0 ? 896 : 900, 4, 2, D, causal, DType::bf16, seed++);
        c.mask.present = true;
        c.mask.b = false, c.mask.heads = 0;
        c.bias.present = elem_p < 1.0;  // zeros in dbias where the walk skips tiles
        AttnRun r(c);
        fill_block_mask(r, seed, blk, elem_p == 1.0 ? 1.0 / 3 : 1.0 / 8, elem_p);
        run_gpu(r, true);
      }
}

// The next-active table (the default; FDMA_NEXT_ACTIVE_TABLE=0 turns it off): the forward, dq
// and dk/dv CTAs step from one active tile to the next through a table built from the mask tile
// summary (next_active.cuh). They visit the same tiles either way, so every output equals the
// summary walk's bitwise; then against the CPU. A block mask with a bias broadcast over heads
// (non-causal bf16 D = 128 and causal, the wgmma kernels on Hopper), and a key padding mask
// whose summary broadcasts over query tiles (fp16 D = 96, the mma.sync kernels).
TEST(AttentionGpu, NextActiveTableMatchesTheSummaryWalk) {
  REQUIRE_GPU();
  const ScopedEnv table("FDMA_NEXT_ACTIVE_TABLE");
  uint64_t seed = 760;
  for (int variant = 0; variant < 3; ++variant) {
    const bool padding = variant == 2;
    AttnCase c = base(1000, 1300, 4, 2, padding ? 96 : 128, variant == 1, padding ? DType::f16 : DType::bf16, seed++);
    c.mask.present = true;
    c.mask.b = false, c.mask.heads = 0, c.mask.q = !padding;
    c.bias.present = variant != 1;
    c.bias.heads = 0;
    SCOPED_TRACE(c.str());
    AttnRun r(c);
    if (padding) {  // a [Sk] mask: 64-key blocks kept with probability 1/8, the first always
      std::mt19937_64 rng(seed);
      std::bernoulli_distribution block_on(1.0 / 8);
      for (int64_t j = 0; j < c.Sk; j += 64) {
        const bool on = block_on(rng) || j == 0;  // never a row with nothing kept
        for (int64_t jj = j; jj < std::min(c.Sk, j + 64); ++jj) r.mask.set(jj, on);
      }
      auto full = expand_full(c, r.mask.values(), declared_shape(c, c.mask));
      r.rp.keep.assign(full.begin(), full.end());
    } else {
      fill_block_mask(r, seed, 64, 1.0 / 8, 0.7);
    }
    {
      GpuAttention gpu(r);
      ASSERT_TRUE(gpu.ok());
      expect_switch_bitwise(gpu, table);
    }
    table.clear();
    run_gpu(r, true);
  }
}

// The dk/dv kernel with each number of warp groups per CTA forced (FDMA_DKDV_GROUPS; the
// default picks one per call, bwd_dkdv_groups): one walks all its steps itself (no hand-off,
// half the dbias slots), two take turns. Against the CPU backend: a block mask with a per-key
// bias (dbias summed over queries through the slots), causal and not, on the wgmma kernels
// (bf16 D = 128) and the mma.sync kernels (fp16 D = 96); and dense causal GQA.
TEST(AttentionGpu, DkdvWarpGroupsMatchTheCpu) {
  REQUIRE_GPU();
  const ScopedEnv groups("FDMA_DKDV_GROUPS");
  uint64_t seed = 1300;
  for (const char* n : {"1", "2"}) {
    SCOPED_TRACE(std::string("FDMA_DKDV_GROUPS=") + n);
    groups.set(n);
    for (int64_t D : {128, 96})
      for (bool causal : {false, true}) {
        AttnCase c = base(700, 900, 4, 2, D, causal, D == 96 ? DType::f16 : DType::bf16, seed++);
        c.mask.present = true;
        c.mask.b = false, c.mask.heads = 0;
        c.bias.present = true;
        c.bias.q = false;  // [B, H, 1, Sk]: dbias summed over queries by the dk/dv kernel
        AttnRun r(c);
        fill_block_mask(r, seed, 64, 1.0 / 4, 0.6);
        run_gpu(r, true);
      }
    run_gpu(base(1000, 1000, 8, 2, 128, true, DType::bf16, seed++));
  }
}

// The fused dq (non-deterministic backwards on Hopper; attention_bwd_params.hpp): the dk/dv
// kernel reduces dS K into an fp32 temporary and no dq kernel runs. Against the CPU backend at
// D 64 and 128, bf16 and fp16: ragged lengths (Sq < Sk and Sq > Sk), causal and not, GQA, a
// block mask, a per-key bias (dbias summed by the dk/dv kernel), softcap. Then dk and dv
// bitwise against the two-kernel path (FDMA_BWD_FUSED_DQ=0: the same arithmetic), and a
// deterministic call needing no temporary. Elsewhere both paths are the two kernels, and so is
// the block mask at D 128 (the fused dq would need two warp groups there and lose the tiles).
// At D 64 and 128 without a mask the warp-specialized backward would take these calls: switched off
// here (its own test is WarpSpecializedBackwardMatchesTheCpu).
TEST(AttentionGpu, FusedDqBackwardMatchesTheCpu) {
  REQUIRE_GPU();
  const ScopedEnv ws("FDMA_BWD_WS");
  ws.set("0");
  uint64_t seed = 1400;
  for (int64_t D : {64, 128})
    for (int variant = 0; variant < 5; ++variant) {
      const bool causal = variant % 2 == 1;
      const DType dtype = variant == 3 ? DType::f16 : DType::bf16;
      AttnCase c = base(variant == 2 ? 777 : 333, variant == 2 ? 459 : 517, 8, 2, D, causal, dtype, seed++);
      if (variant == 1 || variant == 4) {  // a per-key bias: dbias [B, H, 1, Sk]
        c.bias.present = true;
        c.bias.q = false;
      }
      if (variant == 3) c.softcap = 20.0;
      if (variant == 4) {
        c.mask.present = true;
        c.mask.b = false, c.mask.heads = 0;
      }
      AttnRun r(c);
      if (variant == 4) fill_block_mask(r, seed, 64, 1.0 / 3, 0.6);
      run_gpu(r, true);
    }
  const ScopedEnv fused("FDMA_BWD_FUSED_DQ");
  AttnCase c = base(600, 700, 8, 2, 128, true, DType::bf16, seed++);
  c.bias.present = true;
  c.bias.q = false;
  SCOPED_TRACE(c.str());
  AttnRun r(c);
  r.forward();
  GpuAttention gpu(r);  // with the CPU forward's out and lse
  ASSERT_TRUE(gpu.ok());
  std::vector<std::vector<unsigned char>> grads[2];
  size_t bytes[2];
  for (int on = 0; on < 2; ++on) {
    fused.set(on ? "1" : "0");
    bytes[on] = gpu.run(Pass::backward, nullptr);
    for (auto [dev, host] : {std::pair{&gpu.dk, &r.dk}, {&gpu.dv, &r.dv}, {gpu.dbias.get(), &r.dbias}}) {
      dev->download();
      grads[on].push_back(host->bytes());
    }
  }
  for (size_t i = 0; i < grads[0].size(); ++i) EXPECT_TRUE(grads[0][i] == grads[1][i]) << "gradient " << i << " differs";
  gpu.deterministic = true;
  EXPECT_EQ(gpu.run(Pass::backward, nullptr), bytes[0]);  // the two kernels, no temporary
  EXPECT_GE(bytes[1], bytes[0]);
}

// Overlapped launches (the default; FDMA_OVERLAP_LAUNCHES=0 turns them off): the forward kernel
// launched overlapping the mask tile summary, and the backward's prepare, dq, dk/dv and
// dbias-finish kernels each overlapping the one before (programmatic dependent launch on
// compute capability 9.0+). Each waits for its predecessor on the GPU, so the results equal the
// serial launches' bitwise, here on a block mask with many empty tiles and a bias broadcast over
// heads (reduction slots and the finish kernel).
TEST(AttentionGpu, OverlappedLaunchesMatchSerialOnes) {
  REQUIRE_GPU();
  const ScopedEnv overlap("FDMA_OVERLAP_LAUNCHES");
  AttnCase c = base(1000, 1200, 4, 2, 128, true, DType::bf16, 750);
  c.mask.present = true;
  c.mask.b = false, c.mask.heads = 0;
  c.bias.present = true;
  c.bias.heads = 0;
  AttnRun r(c);
  std::mt19937_64 rng(751);
  std::bernoulli_distribution block_on(1.0 / 4);
  const int64_t blk = 128, nbk = (c.Sk + blk - 1) / blk;
  std::vector<char> on(((c.Sq + blk - 1) / blk) * nbk);
  for (auto& x : on) x = block_on(rng);
  for (int64_t i = 0; i < c.Sq; ++i)
    for (int64_t j = 0; j < c.Sk; ++j) r.mask.set(i * c.Sk + j, on[(i / blk) * nbk + j / blk]);
  GpuAttention gpu(r);
  ASSERT_TRUE(gpu.ok());
  expect_switch_bitwise(gpu, overlap);
}

// Empty problems on the GPU (empty_case.hpp): no kernel of the operations runs; the outputs
// that have elements are filled on the device.
namespace {
struct DevicePlace {
  std::vector<std::unique_ptr<DeviceTensor>> copies;
  Tensor put(HostTensor& t) {
    copies.push_back(std::make_unique<DeviceTensor>(t));
    return copies.back()->view();
  }
  void back() {
    FDMA_CUDA_OK(cudaDeviceSynchronize());
    for (auto& c : copies) c->download();
    copies.clear();
  }
};
}  // namespace

// The warp-specialized forward (attention_fwd_ws.cuh; calls without a mask at D 64, 128 and
// 256 on Hopper) and the cp.async wgmma kernel (FDMA_FWD_WS=0), each against the CPU backend:
// ragged and multi-stage key walks, key counts that fill whole key tiles (352 = 2 x 176 at
// D 128, 384 = 2 x 192 at D 64), causal with more and fewer keys than queries (whole query
// tiles that see no key), GQA, softcap, both dtypes, the strided layouts the copy engine
// describes, and per-key biases ([B or 1, H or Hk or 1, 1, Sk], q's dtype or fp32, expanded or
// not).
TEST(AttentionGpu, WarpSpecializedForwardMatchesTheCpu) {
  REQUIRE_GPU();
  const ScopedEnv ws("FDMA_FWD_WS");
  uint64_t seed = 1500;
  for (const char* on : {"1", "0"}) {
    SCOPED_TRACE(std::string("FDMA_FWD_WS=") + on);
    ws.set(on);
    for (auto [Sq, Sk] : {std::pair<int64_t, int64_t>{1, 1}, {127, 129}, {300, 100}, {200, 700}, {640, 1100}, {400, 352},
                          {200, 384}})
      for (int64_t D : {64, 128, 256})
        for (bool causal : {false, true}) {
          AttnCase c = base(Sq, Sk, 6, 2, D, causal, D == 128 ? DType::bf16 : DType::f16, seed++);
          c.layout = int(seed % 3 == 0 ? 1 : seed % 3 == 1 ? 3 : 0);
          c.softcap = seed % 4 == 0 ? 5.0 : 0.0;
          run_gpu(c, false);
        }
    for (int heads : {0, 1, 2})
      for (int variant = 0; variant < 4; ++variant) {
        const int64_t D = variant == 1 ? 64 : variant == 3 ? 256 : 128;
        AttnCase c = base(variant < 2 ? 200 : 333, variant < 2 ? 300 : 290, 4, 2, D, variant >= 2,
                          variant == 1 ? DType::f16 : DType::bf16, seed++);
        c.bias.present = true;
        c.bias.q = false, c.bias.b = variant != 3, c.bias.heads = heads;
        c.bias.dtype = variant == 2 ? DType::f32 : DType::unset;
        c.bias.expanded = variant == 1;
        c.softcap = variant == 3 ? 4.0 : 0.0;
        run_gpu(c, false);
      }
  }
}

// Biases far from 1 in magnitude, forward against the CPU: a bias with a query dim whose every
// third row is the dtype's lowest value throughout (a fully masked row written as additive
// sentinels, as transformers' float masks do: the mean of its visible keys) and whose next rows
// hold 1e38 at every fifth key (their mean); a per-key bias with 1e38 at every seventh key. The
// softmax's fused exponent would put 0 or inf in every such row (softmax_sm80.cuh,
// kFusedExponentLimit). Both forward kernels, D 64, 128 and 256, f32 and bf16 biases, softcap;
// and the backward's NaN for the rows whose lse is too large for it.
TEST(AttentionGpu, HugeFiniteBiasesMatchTheCpu) {
  REQUIRE_GPU();
  const ScopedEnv ws("FDMA_FWD_WS");
  uint64_t seed = 1700;
  for (const char* on : {"1", "0"}) {
    ws.set(on);
    for (int variant = 0; variant < 6; ++variant) {
      SCOPED_TRACE(std::string("FDMA_FWD_WS=") + on + " variant " + std::to_string(variant));
      const int64_t D = variant % 3 == 0 ? 128 : variant % 3 == 1 ? 64 : 256;
      AttnCase c = base(300, 260 + 40 * (variant % 2), 4, 2, D, variant < 4, DType::bf16, seed++);
      c.bias.present = true;
      c.bias.q = variant < 4, c.bias.b = true, c.bias.heads = 2;
      c.bias.dtype = variant % 2 ? DType::f32 : DType::unset;
      c.softcap = variant == 2 ? 5.0 : 0.0;
      AttnRun r(c);
      const double lowest = variant % 2 ? -3.4028234663852886e38 : -3.3895313892515355e38;
      const std::vector<int64_t> s = r.bias.shape();
      const int64_t rows = s[2], cols = s[3];
      for (int64_t i = 0; i < r.bias.numel(); ++i) {
        const int64_t row = (i / cols) % rows, col = i % cols;
        if (c.bias.q && row % 3 == 0) r.bias.set(i, lowest);
        else if ((c.bias.q && row % 3 == 1 && col % 5 == 0) || (!c.bias.q && col % 7 == 0)) r.bias.set(i, 1e38);
      }
      r.rp.bias = expand_full(c, r.bias.values(), r.bias_shape);
      run_gpu(r, false);
      if (variant != 0 || std::string(on) != "1") continue;
      // The backward: rows whose lse is past what the float lse can carry (the sentinel rows,
      // the 1e38 rows) give NaN in dq, not a wrong finite value; the other rows, and those that
      // see no key (causal, Sk < Sq), stay finite.
      GpuAttention gpu(r);
      gpu.run(Pass::forward, nullptr);
      gpu.run(Pass::backward, nullptr);
      gpu.dq.download();
      const auto dq = r.dq.values();
      int64_t wrong = 0;
      for (int64_t b = 0; b < c.B; ++b)
        for (int64_t i = 0; i < c.Sq; ++i)
          for (int64_t h = 0; h < c.H; ++h)
            for (int64_t d = 0; d < c.D; ++d)
              wrong += std::isnan(dq[((b * c.Sq + i) * c.H + h) * c.D + d]) != (i % 3 != 2 && i + c.Sk - c.Sq >= 0);
      EXPECT_EQ(wrong, 0) << "dq elements NaN where the row's lse is ordinary, or not NaN where it is huge";
    }
  }
}

// Training with a float mask's sentinels: every third query row is the dtype's lowest value
// throughout (a padded query's row) and its dO is zero, as a masked loss leaves it. Such a
// row's lse is past what the backward's exponent takes, but its gradients are exactly zero
// whatever its probabilities: forward and backward match the CPU, with no NaN reaching dk and
// dv. D 64, 128 and 256, bf16 and f32 biases, GQA.
TEST(AttentionGpu, FloatMaskSentinelRowsWithZeroGradientsTrain) {
  REQUIRE_GPU();
  uint64_t seed = 1750;
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE("variant " + std::to_string(variant));
    const int64_t D = variant == 0 ? 128 : variant == 1 ? 64 : 256;
    AttnCase c = base(300, 260, 4, 2, D, false, DType::bf16, seed++);
    c.bias.present = true;
    c.bias.q = true, c.bias.b = true, c.bias.heads = 2;
    c.bias.dtype = variant == 1 ? DType::f32 : DType::unset;
    AttnRun r(c);
    const double lowest = variant == 1 ? -3.4028234663852886e38 : -3.3895313892515355e38;
    r.sentinel_rows(lowest);
    run_gpu(r, true);
  }
}

// Every plane of r.mask as blocks of 128 queries x 64 keys, each off, kept whole or kept
// elementwise (probability 0.7), so that the kernels skip some key tiles, run some unmasked
// and test the mask in the rest (and plane 0's first 128 rows keep nothing: zeros out); into
// the reference's keep too.
void fill_mixed_blocks(AttnRun& r, uint64_t seed) {
  const AttnCase& c = r.c;
  const std::vector<int64_t> s = declared_shape(c, c.mask);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> kind(0, 2);
  std::bernoulli_distribution elem_on(0.7);
  const int64_t rows = s[2], cols = s[3], planes = s[0] * s[1];
  const int64_t nbq = (rows + 127) / 128, nbk = (cols + 63) / 64;
  std::vector<int> block(planes * nbq * nbk);
  for (auto& x : block) x = kind(rng);
  for (int64_t bk = 0; bk < nbk; ++bk) block[bk] = 0;  // plane 0's first query tile sees no key
  for (int64_t pl = 0; pl < planes; ++pl)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        const int k = block[(pl * nbq + i / 128) * nbk + j / 64];
        r.mask.set((pl * rows + i) * cols + j, k == 1 || (k == 2 && elem_on(rng)));
      }
  auto full = expand_full(c, r.mask.values(), s);
  r.rp.keep.assign(full.begin(), full.end());
}

// The warp-specialized forward's scored calls (a mask, or a bias with a query dim: tiles the
// copy engine brings with K, the mask summary's empty tiles skipped and its full ones run
// unmasked) and the cp.async wgmma kernel (FDMA_FWD_WS=0), each against the CPU backend, at
// D 64, 128 and 256: masks per query head, per KV head and shared, of mixed blocks; masks
// broadcast over queries; biases with a query dim in q's dtype, alone and with a mask (a mask
// tile and a bias tile together: 128-key tiles at D 64, the 64-key scored_narrow kind at D 128,
// the mask laid over the bias tile at D 256 (masked_biased), whose mixed blocks include a query
// tile that keeps nothing);
// per-key biases beside a mask; softcap, causal with more and fewer keys than queries, GQA,
// both dtypes, ragged ends, key counts whose rows the copy engine cannot read (the other
// kernel), and outs whose rows of D are padded by 8 elements (the copy engine's store of O
// writes none of the padding).
TEST(AttentionGpu, WarpSpecializedScoredForwardMatchesTheCpu) {
  REQUIRE_GPU();
  const ScopedEnv ws("FDMA_FWD_WS");
  uint64_t seed = 3500;
  for (const char* on : {"1", "0"}) {
    SCOPED_TRACE(std::string("FDMA_FWD_WS=") + on);
    ws.set(on);
    for (int64_t D : {64, 128, 256})
      for (int variant = 0; variant < 9; ++variant) {
        const bool causal = (variant + D / 64) % 2 == 1;
        const auto [Sq, Sk] = variant == 5 || variant == 8 ? std::pair<int64_t, int64_t>{400, 160}
                              : variant == 6 ? std::pair<int64_t, int64_t>{130, 200}
                                             : std::pair<int64_t, int64_t>{333, 640};
        AttnCase c = base(Sq, Sk, 4, 2, D, causal, (variant + D / 64) % 3 == 0 ? DType::f16 : DType::bf16, seed++);
        c.softcap = variant == 2 || variant == 4 ? 5.0 : 0.0;
        switch (variant) {
          case 0:  // [B, H, Sq, Sk] mask of mixed blocks
          case 5:  // the same with fewer keys than queries
          case 6:  // 200-byte mask rows: not for the copy engine
            c.mask.present = true;
            break;
          case 1:  // a shared [1, Hk, Sq, Sk] mask and a per-key float32 bias
            c.mask.present = true, c.mask.b = false, c.mask.heads = 1;
            c.bias.present = true, c.bias.q = false, c.bias.dtype = DType::f32;
            break;
          case 2:  // a [B, H, Sq, Sk] bias alone
            c.bias.present = true;
            break;
          case 3:  // a key padding mask [B, 1, 1, Sk] and a [1, Hk, Sq, Sk] bias
            c.mask.present = true, c.mask.heads = 0, c.mask.q = false;
            c.bias.present = true, c.bias.b = false, c.bias.heads = 1;
            break;
          case 4:  // a [1, 1, Sq, Sk] mask and a [B, H, Sq, Sk] bias
            c.mask.present = true, c.mask.b = false, c.mask.heads = 0;
            c.bias.present = true;
            break;
          case 7:  // a [B, H, Sq, Sk] mask of mixed blocks and a [B, H, Sq, Sk] bias
          case 8:  // the same with fewer keys than queries
            c.mask.present = true;
            c.bias.present = true;
            break;
        }
        AttnRun r(c);
        if (c.mask.present && c.mask.q) fill_mixed_blocks(r, seed);
        run_gpu(r, false);
      }
    for (int64_t D : {64, 128, 256}) {
      AttnCase c = base(333, 640, 4, 2, D, D == 128, D == 64 ? DType::f16 : DType::bf16, seed++);
      c.mask.present = true;
      c.out_row_pad = 8;
      AttnRun r(c);
      fill_mixed_blocks(r, seed);
      run_gpu(r, false);
    }
  }
}

// The warp-specialized backward (attention_bwd_ws.cuh; non-deterministic calls without a mask
// at D 64 and 128 on Hopper, no bias or a per-key one) and the dk/dv kernel's fused dq (FDMA_BWD_WS=0), each against the
// CPU backend: key counts that leave a CTA's second group partly or wholly past the end, query
// tails (of 64- and, at D 64, 128-query steps) and whole steps, causal with more and fewer keys than queries (key groups that no query sees), GQA and
// MQA, softcap, both dtypes, the strided layouts the copy engine describes, and per-key biases
// with their dbias.
TEST(AttentionGpu, WarpSpecializedBackwardMatchesTheCpu) {
  REQUIRE_GPU();
  const ScopedEnv ws("FDMA_BWD_WS");
  uint64_t seed = 1600;
  for (const char* on : {"1", "0"}) {
    SCOPED_TRACE(std::string("FDMA_BWD_WS=") + on);
    ws.set(on);
    for (auto [Sq, Sk] : {std::pair<int64_t, int64_t>{1, 1}, {64, 128}, {127, 129}, {300, 100}, {200, 700}, {517, 333}, {256, 384}})
      for (int variant = 0; variant < 4; ++variant) {
        const bool causal = variant % 2 == 1;
        const int64_t D = variant < 2 ? 128 : 64;
        AttnCase c = base(Sq, Sk, causal ? 4 : 6, causal ? 1 : 2, D, causal, seed % 2 ? DType::f16 : DType::bf16,
                          seed);
        ++seed;
        c.layout = int(seed % 3 == 0 ? 1 : seed % 3 == 1 ? 3 : 0);
        c.softcap = seed % 4 == 0 ? 5.0 : 0.0;
        run_gpu(c);
      }
    // Per-key biases ([B or 1, H or Hk or 1, 1, Sk], q's dtype or fp32) and their dbias.
    for (int heads : {0, 1, 2})
      for (int variant = 0; variant < 3; ++variant) {
        AttnCase c = base(variant == 0 ? 200 : 333, variant == 0 ? 300 : 290, 4, 2, variant == 1 ? 64 : 128, variant >= 1,
                          variant == 1 ? DType::f16 : DType::bf16, seed++);
        c.bias.present = true;
        c.bias.q = false, c.bias.b = variant != 2, c.bias.heads = heads;
        c.bias.dtype = variant == 2 ? DType::f32 : DType::unset;
        c.softcap = variant == 2 ? 4.0 : 0.0;
        run_gpu(c);
      }
  }
}

// The warp-specialized backward's masked calls (a mask and no bias: each step's mask tile comes
// with its Q and dO, or a mask broadcast over queries is read per key; the steps the summary
// rules out are skipped and those it keeps whole run unmasked) and the dk/dv kernel's fused dq
// or the two kernels (FDMA_BWD_WS=0), each against the CPU backend at D 64, 128 and 256 (its
// own kernel, attention_bwd_ws_d256.cuh: 64-key CTAs, [64 queries][64 keys] mask tiles): masks per
// query head, per KV head and shared, of mixed blocks (a query tile that keeps nothing
// included), key padding masks [B, 1 or Hk, 1, Sk], causal with more and fewer keys than
// queries, ragged ends, GQA, softcap, both dtypes. Every other case runs without the
// next-active table (FDMA_NEXT_ACTIVE_TABLE=0), where the walk reads the summary per step (as
// walks longer than the kernel's step bitmaps do).
TEST(AttentionGpu, WarpSpecializedMaskedBackwardMatchesTheCpu) {
  REQUIRE_GPU();
  const ScopedEnv ws("FDMA_BWD_WS"), table("FDMA_NEXT_ACTIVE_TABLE");
  uint64_t seed = 3700;
  for (const char* on : {"1", "0"}) {
    SCOPED_TRACE(std::string("FDMA_BWD_WS=") + on);
    ws.set(on);
    for (int64_t D : {64, 128, 256})
      for (int variant = 0; variant < 6; ++variant) {
        const bool causal = (variant + D / 64) % 2 == 1;
        const auto [Sq, Sk] = variant == 2   ? std::pair<int64_t, int64_t>{400, 160}
                              : variant == 3 ? std::pair<int64_t, int64_t>{130, 384}
                              : variant == 5 ? std::pair<int64_t, int64_t>{200, 320}
                                             : std::pair<int64_t, int64_t>{333, 512};
        AttnCase c = base(Sq, Sk, 4, 2, D, causal, variant % 2 ? DType::f16 : DType::bf16, seed++);
        c.softcap = variant == 1 || variant == 5 ? 5.0 : 0.0;
        table.set((variant / 2 + D / 64) % 2 ? "0" : "1");
        c.mask.present = true;
        c.mask.b = variant != 1, c.mask.heads = variant == 1 || variant == 5 ? 1 : variant == 3 || variant == 4 ? 0 : 2;
        c.mask.q = variant < 4;  // 4, 5: key padding masks (random keys kept)
        AttnRun r(c);
        if (c.mask.q) fill_mixed_blocks(r, seed);
        run_gpu(r, true);
      }
  }
}

// The warp-specialized backward's biased calls (a bias with a query dim in q's dtype, no mask:
// each step's bias tile comes with its Q and dO; where dbias is asked for and each dS is one of
// its elements, the tile goes back out holding dS, and the rows above a causal CTA's keys are
// zeroed beside the walk; where dbias sums heads or batches, each step's dS is added into fp32
// sums) and the other kernels (FDMA_BWD_WS=0), each against the CPU backend at D 64 and 128:
// biases per query head, per KV head (GQA: its dbias sums two heads) and shared, with and
// without their gradient, [1, H, Sq, Sk] at B 1 and 2, float32 biases (the other kernels),
// causal with more and fewer keys than queries, ragged query ends, softcap, both dtypes. dbias
// is poisoned first: an element nobody writes fails.
TEST(AttentionGpu, WarpSpecializedBiasedBackwardMatchesTheCpu) {
  REQUIRE_GPU();
  const ScopedEnv ws("FDMA_BWD_WS");
  uint64_t seed = 4100;
  for (const char* on : {"1", "0"}) {
    SCOPED_TRACE(std::string("FDMA_BWD_WS=") + on);
    ws.set(on);
    for (int64_t D : {64, 128})
      for (int variant = 0; variant < 9; ++variant) {
        const bool causal = (variant + D / 64) % 2 == 1;
        const auto [Sq, Sk] = variant == 2   ? std::pair<int64_t, int64_t>{400, 160}
                              : variant == 3 ? std::pair<int64_t, int64_t>{130, 384}
                              : variant == 5 ? std::pair<int64_t, int64_t>{200, 200}
                                             : std::pair<int64_t, int64_t>{333, 512};
        AttnCase c = base(Sq, Sk, 4, variant == 4 ? 4 : 2, D, causal, variant % 2 ? DType::f16 : DType::bf16, seed++);
        c.softcap = variant == 1 || variant == 5 ? 5.0 : 0.0;
        c.layout = variant == 3 ? 1 : 0;
        c.bias.present = true;
        bool want_dbias = true;
        switch (variant) {
          case 1:  // [B, Hk, Sq, Sk] under GQA: dbias sums two heads
            c.bias.heads = 1;
            break;
          case 2:  // [1, H, Sq, Sk] at B 1: one dS an element
            c.B = 1, c.bias.b = false;
            break;
          case 3:  // [1, 1, Sq, Sk] without its gradient
            c.bias.b = false, c.bias.heads = 0;
            want_dbias = false;
            break;
          case 4:  // [B, Hk, Sq, Sk] with Hk = H
            c.bias.heads = 1;
            break;
          case 5:  // a float32 bias
            c.bias.dtype = DType::f32;
            break;
          case 6:  // [1, H, Sq, Sk] at B 2 without its gradient
            c.bias.b = false;
            want_dbias = false;
            break;
          case 7:  // [1, H, Sq, Sk] at B 2: dbias sums batches
            c.bias.b = false;
            break;
          case 8:  // [1, 1, Sq, Sk]: dbias sums batches and heads
            c.bias.b = false, c.bias.heads = 0;
            break;
        }
        AttnRun r(c);
        run_gpu(r, true, nullptr, want_dbias);
      }
  }
}

// The warp-specialized backward's calls with a mask and a bias with a query dim (masked_biased:
// the biased kind's steps over the masked kind's walk, the mask laid over each step's bias tile
// as -inf by the producer group's idle warps, who also zero the dbias tiles of skipped steps)
// and the other kernels (FDMA_BWD_WS=0), each against the CPU backend at D 64 and 128: masks of
// mixed blocks (a query tile that keeps nothing, blocks kept whole) per query head, per KV head
// and shared; a [1, 1, 1, Sk] key padding mask whose keys end inside a 16-byte chunk; rows that
// keep nothing; biases per query head, per KV head (GQA: dbias sums two heads) and shared, with
// dbias one dS an element, summed over heads or batches, or not asked for; causal with more and
// fewer keys than queries, ragged ends, softcap, both dtypes. Every other case runs without the
// next-active table. dbias is poisoned first: an element nobody writes fails.
TEST(AttentionGpu, WarpSpecializedMaskedBiasedBackwardMatchesTheCpu) {
  REQUIRE_GPU();
  const ScopedEnv ws("FDMA_BWD_WS"), table("FDMA_NEXT_ACTIVE_TABLE");
  uint64_t seed = 4700;
  for (const char* on : {"1", "0"}) {
    SCOPED_TRACE(std::string("FDMA_BWD_WS=") + on);
    ws.set(on);
    for (int64_t D : {64, 128})
      for (int variant = 0; variant < 7; ++variant) {
        const bool causal = (variant + D / 64) % 2 == 1;
        const auto [Sq, Sk] = variant == 2   ? std::pair<int64_t, int64_t>{400, 160}
                              : variant == 3 ? std::pair<int64_t, int64_t>{130, 200}
                              : variant == 6 ? std::pair<int64_t, int64_t>{200, 320}
                                             : std::pair<int64_t, int64_t>{333, 512};
        AttnCase c = base(Sq, Sk, 4, 2, D, causal, variant % 2 ? DType::f16 : DType::bf16, seed++);
        c.softcap = variant == 1 || variant == 5 ? 5.0 : 0.0;
        table.set((variant + D / 64) % 2 ? "0" : "1");
        c.mask.present = true;
        c.bias.present = true;
        bool want_dbias = true;
        switch (variant) {
          case 0:  // [B, H, Sq, Sk] mask and bias: one dS an element
          case 2:  // the same with fewer keys than queries, the bias [1, H, Sq, Sk] at B 1
            if (variant == 2) c.B = 1, c.bias.b = false;
            break;
          case 1:  // [B, Hk, Sq, Sk] mask and bias under GQA: dbias sums two heads
            c.mask.heads = 1, c.bias.heads = 1;
            break;
          case 3:  // a [1, 1, 1, Sk] key padding mask, 200 keys
            c.mask.b = false, c.mask.heads = 0, c.mask.q = false;
            break;
          case 4:  // a shared [1, 1, Sq, Sk] mask, dbias not asked for
            c.mask.b = false, c.mask.heads = 0;
            want_dbias = false;
            break;
          case 5:  // a [1, 1, Sq, Sk] bias: dbias sums batches and heads
            c.bias.b = false, c.bias.heads = 0;
            break;
          case 6:  // query rows that keep no key
            c.empty_rows = 70;
            break;
        }
        AttnRun r(c);
        if (c.mask.q && c.empty_rows == 0) fill_mixed_blocks(r, seed);
        run_gpu(r, true, nullptr, want_dbias);
      }
  }
}

// The same for D 256 (attention_bwd_ws_d256.cuh: the groups split dk's and dv's columns and
// each step's queries) and the two kernels (FDMA_BWD_WS=0), each against the CPU backend:
// tails of 64-query steps and 64-key CTAs, causal with more and fewer keys than queries, GQA
// and MQA, softcap, both dtypes, the strided layouts, and per-key biases with their dbias
// (whose two slot halves the groups fill).
TEST(AttentionGpu, WarpSpecializedBackwardD256MatchesTheCpu) {
  REQUIRE_GPU();
  const ScopedEnv ws("FDMA_BWD_WS");
  uint64_t seed = 2600;
  for (const char* on : {"1", "0"}) {
    SCOPED_TRACE(std::string("FDMA_BWD_WS=") + on);
    ws.set(on);
    // Not one key: dS = P (dP - delta) would be an exact cancellation of two 256-term sums that
    // the backends add in different orders (0 on the CPU, about 1e-6 here).
    for (auto [Sq, Sk] : {std::pair<int64_t, int64_t>{1, 3}, {64, 64}, {127, 129}, {300, 100}, {130, 200}})
      for (bool causal : {false, true}) {
        AttnCase c = base(Sq, Sk, causal ? 4 : 6, causal ? 1 : 2, 256, causal, seed % 2 ? DType::f16 : DType::bf16, seed);
        ++seed;
        c.layout = int(seed % 3 == 0 ? 1 : seed % 3 == 1 ? 3 : 0);
        c.softcap = seed % 4 == 0 ? 5.0 : 0.0;
        run_gpu(c);
      }
    for (int heads : {0, 1, 2}) {
      AttnCase c = base(150, 170, 4, 2, 256, heads == 1, heads == 2 ? DType::f16 : DType::bf16, seed++);
      c.bias.present = true;
      c.bias.q = false, c.bias.b = heads != 2, c.bias.heads = heads;
      c.bias.dtype = heads == 2 ? DType::f32 : DType::unset;
      run_gpu(c);
    }
  }
}

TEST(AttentionGpu, EmptyProblems) {
  REQUIRE_GPU();
  DevicePlace place;
  for (DType dt : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    check_empty_problems(place, dt);
  }
}
