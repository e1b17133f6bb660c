// Hopper (sm_90a) warpgroup MMA: one tiny typed wrapper per PTX instruction, plus the
// shared-memory descriptor and the swizzled tile layout the descriptors describe.
//
// A warpgroup is 4 consecutive warps. wgmma.mma_async m64nNk16 multiplies a 64 x 16 A by a
// 16 x N B into 64 x N fp32 accumulators. Accumulator layout: warp w of the group holds rows
// 16w..16w+15, and register d[nt][e] is row 16w + g + 8 (e >> 1), column 8 nt + 2t + (e & 1)
// (g = lane / 4, t = lane % 4): the mma.sync m16n8 C layout repeated over N / 8 tiles, so the
// sm80 score and softmax code runs on it unchanged. A from registers uses the mma.sync
// m16n8k16 A layout for the warp's 16 rows.
//
// Only sm_90a has these instructions; callers compile them under FDMA_SM90_ENABLED.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FDMA_SM90_ENABLED 1
#else
#define FDMA_SM90_ENABLED 0
#endif

namespace fdma::cuda::wgmma {

// --- the swizzled layout ------------------------------------------------------------------
// A [rows x D] tile of 16-bit elements is stored as D / 64 column blocks of [rows][128 bytes];
// within each block, 16-byte chunk c of row r sits at chunk c ^ (r % 8) (the 128-byte
// swizzle, applied by the hardware on address bits, so blocks are 1024-byte aligned). Rows
// are K-major operands (Q, K) as they are; read as N-major, the same tile is V.
constexpr int kSwizzleRowBytes = 128;
__host__ __device__ constexpr int sw128_tile_bytes(int rows, int head_dim) { return rows * head_dim * 2; }
// Byte offset of 16-byte chunk `chunk` (0 .. D/8 - 1) of row `row` in a tile of `rows` rows.
// Unsigned arithmetic: row and chunk are never negative, and % 8 becomes a mask.
__device__ __forceinline__ uint32_t sw128_offset(int rows, int row, int chunk) {
  const uint32_t r = row, c = chunk;
  return (c / 8) * rows * kSwizzleRowBytes + r * kSwizzleRowBytes + (((c % 8) ^ (r % 8)) << 4);
}
// A 16-column slice (one wgmma's K) of 16-bit elements in the 32-byte swizzle: rows of 32
// bytes, the two chunks of row r swapped where r % 8 >= 4 (address bit 4 ^= bit 7; blocks
// 256-byte aligned). A quarter of a 128-byte swizzled block's bytes for the same rows.
constexpr int kSw32RowBytes = 32;
__device__ __forceinline__ uint32_t sw32_offset(int row, int chunk) {
  const uint32_t r = row, c = chunk;
  return r * kSw32RowBytes + ((c ^ ((r / 4) % 2)) << 4);
}

// --- descriptors --------------------------------------------------------------------------
// Bits 0-13: start address >> 4; 16-29: leading byte offset >> 4; 32-45: stride byte offset
// >> 4; 62-63: swizzle mode (1 = 128 bytes, 3 = 32 bytes).
__device__ __forceinline__ uint64_t make_desc(uint32_t smem_addr, uint32_t lead_bytes, uint32_t stride_bytes,
                                              uint32_t swizzle_mode = 1) {
  return uint64_t((smem_addr & 0x3FFFF) >> 4) | uint64_t((lead_bytes >> 4) & 0x3FFF) << 16 |
         uint64_t((stride_bytes >> 4) & 0x3FFF) << 32 | uint64_t(swizzle_mode) << 62;
}
// K-major operand (rows = M or N, 16 elements of K from `addr`): consecutive 8-row groups are
// 1024 bytes apart; the leading offset is unused under swizzling.
__device__ __forceinline__ uint64_t desc_k_major(uint32_t addr) { return make_desc(addr, 16, 8 * kSwizzleRowBytes); }
// A K-major 16-column slice in the 32-byte swizzle (sw32_offset): 8-row groups 256 bytes apart.
__device__ __forceinline__ uint64_t desc_k_major_sw32(uint32_t addr) {
  return make_desc(addr, 16, 8 * kSw32RowBytes, 3);
}
// N-major operand (K = tile rows, N = columns): 64-column blocks are `block_bytes` apart (the
// leading offset), 8-row groups of K 1024 bytes apart (the stride offset).
__device__ __forceinline__ uint64_t desc_n_major(uint32_t addr, uint32_t block_bytes) {
  return make_desc(addr, block_bytes, 8 * kSwizzleRowBytes);
}

// The descriptor of addr + bytes, from addr's (bytes a multiple of 16). The start address
// field holds addr >> 4 in 14 bits and shared addresses stay below 2^18, so one add never
// carries out of it: a chain of wgmmas over one tile builds its descriptor once (rebuilding it
// per wgmma cost about 25 instructions each, a third of the backward's per-step instructions).
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }

// --- synchronisation ----------------------------------------------------------------------
// Orders this thread's register writes (accumulators, A fragments) before the wgmmas that follow.
__device__ __forceinline__ void fence() {
#if FDMA_SM90_ENABLED
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void commit_group() {
#if FDMA_SM90_ENABLED
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Wait until at most N committed groups are still running.
template <int N>
__device__ __forceinline__ void wait_group() {
#if FDMA_SM90_ENABLED
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Shared memory written through the generic proxy (st.shared, cp.async) must be fenced before
// the async proxy (wgmma) reads it.
__device__ __forceinline__ void fence_proxy_async_smem() {
#if FDMA_SM90_ENABLED
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// Keeps the compiler from moving reads or writes of accumulator registers across a wait.
template <int kTiles>
__device__ __forceinline__ void fence_operands(float (&d)[kTiles][4]) {
#pragma unroll
  for (int i = 0; i < kTiles; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[i][e])::"memory");
}

// --- warpgroup registers ------------------------------------------------------------------
// setmaxnreg: a warp-specialized kernel moves registers from its producer warpgroup (which
// only issues copies) to its consumer warpgroups. Takes effect only in a kernel with a
// register cap at entry (__launch_bounds__(threads, 1)), every warp of the group executing it.
template <int kRegs>
__device__ __forceinline__ void regs_grow() {
#if FDMA_SM90_ENABLED
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}
template <int kRegs>
__device__ __forceinline__ void regs_shrink() {
#if FDMA_SM90_ENABLED
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}

// --- the MMAs ----------------------------------------------------------------------------
// d (64 x N) = A * B (+ d when accumulate), A and B K-major in shared memory.
template <class T, int N>
__device__ __forceinline__ void mma_ss(float (&d)[N / 8][4], uint64_t a_desc, uint64_t b_desc, int accumulate);
// d (64 x N) = A * B (+ d when accumulate), A K-major and B N-major in shared memory.
template <class T, int N>
__device__ __forceinline__ void mma_ss_n_major(float (&d)[N / 8][4], uint64_t a_desc, uint64_t b_desc, int accumulate);
// d (64 x N) = A * B (+ d when accumulate), A in registers (m16n8k16 layout per warp), B
// N-major in shared memory.
template <class T, int N>
__device__ __forceinline__ void mma_rs_n_major(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t b_desc,
                                               int accumulate);

#define FDMA_WG_ACC4(d, i) "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])
#define FDMA_WG_ACC8X4(d, i)                                                                        \
  FDMA_WG_ACC4(d, i), FDMA_WG_ACC4(d, i + 1), FDMA_WG_ACC4(d, i + 2), FDMA_WG_ACC4(d, i + 3),     \
      FDMA_WG_ACC4(d, i + 4), FDMA_WG_ACC4(d, i + 5), FDMA_WG_ACC4(d, i + 6), FDMA_WG_ACC4(d, i + 7)
#define FDMA_WG_D16 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}"
#define FDMA_WG_D32 \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}"
#define FDMA_WG_D40 \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29," \
  "%30,%31,%32,%33,%34,%35,%36,%37,%38,%39}"
#define FDMA_WG_D64                                                                                                \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29," \
  "%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,"   \
  "%57,%58,%59,%60,%61,%62,%63}"

#define FDMA_WG_D88 \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29," \
  "%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59," \
  "%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87}"

#define FDMA_WG_D96 \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29," \
  "%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59," \
  "%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95}"

#define FDMA_WG_D128 \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31," \
  "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63," \
  "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95," \
  "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}"

// SS form, function FN, B K-major (TB 0) or N-major (TB 1): operands after the accumulators
// are a_desc, b_desc, accumulate; the accumulator constraints last (they hold commas).
#define FDMA_WG_SS_FORM(FN, TB, CTYPE, PTXTYPE, N, DLIST, A, B, S, ...)                                           \
  template <>                                                                                                    \
  __device__ __forceinline__ void FN<CTYPE, N>(float(&d)[N / 8][4], uint64_t a_desc, uint64_t b_desc,           \
                                               int accumulate) {                                                 \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #S ", 0;\n"                                                \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTXTYPE "." PTXTYPE " " DLIST ", %" #A       \
                 ", %" #B ", p, 1, 1, 0, " #TB ";\n}\n"                                                           \
                 : __VA_ARGS__                                                                                   \
                 : "l"(a_desc), "l"(b_desc), "r"(accumulate)                                                     \
                 : "memory");                                                                                    \
  }
#define FDMA_WG_SS(...) FDMA_WG_SS_FORM(mma_ss, 0, __VA_ARGS__)
#define FDMA_WG_SS_N(...) FDMA_WG_SS_FORM(mma_ss_n_major, 1, __VA_ARGS__)
// RS form with B transposed (N-major): a0..a3, b_desc, accumulate.
#define FDMA_WG_RS(CTYPE, PTXTYPE, N, DLIST, A0, A1, A2, A3, B, S, ACCS)                                         \
  template <>                                                                                                    \
  __device__ __forceinline__ void mma_rs_n_major<CTYPE, N>(float(&d)[N / 8][4], const uint32_t(&a)[4],         \
                                                           uint64_t b_desc, int accumulate) {                    \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #S ", 0;\n"                                                \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTXTYPE "." PTXTYPE " " DLIST ", {%" #A0     \
                 ", %" #A1 ", %" #A2 ", %" #A3 "}, %" #B ", p, 1, 1, 1;\n}\n"                                    \
                 : ACCS                                                                                          \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate)                      \
                 : "memory");                                                                                    \
  }

#if FDMA_SM90_ENABLED
#define FDMA_WG_ACC16(d) FDMA_WG_ACC4(d, 0), FDMA_WG_ACC4(d, 1), FDMA_WG_ACC4(d, 2), FDMA_WG_ACC4(d, 3)
#define FDMA_WG_ACC32(d) FDMA_WG_ACC8X4(d, 0)
#define FDMA_WG_ACC40(d) FDMA_WG_ACC8X4(d, 0), FDMA_WG_ACC4(d, 8), FDMA_WG_ACC4(d, 9)
#define FDMA_WG_ACC64(d) FDMA_WG_ACC8X4(d, 0), FDMA_WG_ACC8X4(d, 8)
#define FDMA_WG_ACC88(d)                                                                                    \
  FDMA_WG_ACC8X4(d, 0), FDMA_WG_ACC8X4(d, 8), FDMA_WG_ACC4(d, 16), FDMA_WG_ACC4(d, 17), FDMA_WG_ACC4(d, 18), \
      FDMA_WG_ACC4(d, 19), FDMA_WG_ACC4(d, 20), FDMA_WG_ACC4(d, 21)
#define FDMA_WG_ACC96(d) FDMA_WG_ACC8X4(d, 0), FDMA_WG_ACC8X4(d, 8), FDMA_WG_ACC8X4(d, 16)
#define FDMA_WG_ACC128(d) FDMA_WG_ACC8X4(d, 0), FDMA_WG_ACC8X4(d, 8), FDMA_WG_ACC8X4(d, 16), FDMA_WG_ACC8X4(d, 24)
FDMA_WG_SS(__nv_bfloat16, "bf16", 32, FDMA_WG_D16, 16, 17, 18, FDMA_WG_ACC16(d))
FDMA_WG_SS(__half, "f16", 32, FDMA_WG_D16, 16, 17, 18, FDMA_WG_ACC16(d))
FDMA_WG_SS(__nv_bfloat16, "bf16", 64, FDMA_WG_D32, 32, 33, 34, FDMA_WG_ACC32(d))
FDMA_WG_SS(__half, "f16", 64, FDMA_WG_D32, 32, 33, 34, FDMA_WG_ACC32(d))
FDMA_WG_SS(__nv_bfloat16, "bf16", 128, FDMA_WG_D64, 64, 65, 66, FDMA_WG_ACC64(d))
FDMA_WG_SS(__half, "f16", 128, FDMA_WG_D64, 64, 65, 66, FDMA_WG_ACC64(d))
// S = Q K^T over the warp-specialized forward's dense key tiles: 176 keys at D 128, 80 at
// D 256, 192 at D 64.
FDMA_WG_SS(__nv_bfloat16, "bf16", 176, FDMA_WG_D88, 88, 89, 90, FDMA_WG_ACC88(d))
FDMA_WG_SS(__half, "f16", 176, FDMA_WG_D88, 88, 89, 90, FDMA_WG_ACC88(d))
FDMA_WG_SS(__nv_bfloat16, "bf16", 80, FDMA_WG_D40, 40, 41, 42, FDMA_WG_ACC40(d))
FDMA_WG_SS(__half, "f16", 80, FDMA_WG_D40, 40, 41, 42, FDMA_WG_ACC40(d))
FDMA_WG_SS(__nv_bfloat16, "bf16", 192, FDMA_WG_D96, 96, 97, 98, FDMA_WG_ACC96(d))
FDMA_WG_SS(__half, "f16", 192, FDMA_WG_D96, 96, 97, 98, FDMA_WG_ACC96(d))
// dQ = dS K in the fused backward (dS written to shared memory, K read as N-major).
FDMA_WG_SS_N(__nv_bfloat16, "bf16", 64, FDMA_WG_D32, 32, 33, 34, FDMA_WG_ACC32(d))
FDMA_WG_SS_N(__half, "f16", 64, FDMA_WG_D32, 32, 33, 34, FDMA_WG_ACC32(d))
// dv, dk and dq over 128-column halves at D = 256 (attention_bwd_ws_d256.cuh).
FDMA_WG_SS_N(__nv_bfloat16, "bf16", 128, FDMA_WG_D64, 64, 65, 66, FDMA_WG_ACC64(d))
FDMA_WG_SS_N(__half, "f16", 128, FDMA_WG_D64, 64, 65, 66, FDMA_WG_ACC64(d))
FDMA_WG_RS(__nv_bfloat16, "bf16", 64, FDMA_WG_D32, 32, 33, 34, 35, 36, 37, FDMA_WG_ACC32(d))
FDMA_WG_RS(__half, "f16", 64, FDMA_WG_D32, 32, 33, 34, 35, 36, 37, FDMA_WG_ACC32(d))
FDMA_WG_RS(__nv_bfloat16, "bf16", 128, FDMA_WG_D64, 64, 65, 66, 67, 68, 69, FDMA_WG_ACC64(d))
FDMA_WG_RS(__half, "f16", 128, FDMA_WG_D64, 64, 65, 66, 67, 68, 69, FDMA_WG_ACC64(d))
// O += P V at D = 256 (the warp-specialized forward).
FDMA_WG_RS(__nv_bfloat16, "bf16", 256, FDMA_WG_D128, 128, 129, 130, 131, 132, 133, FDMA_WG_ACC128(d))
FDMA_WG_RS(__half, "f16", 256, FDMA_WG_D128, 128, 129, 130, 131, 132, 133, FDMA_WG_ACC128(d))
#undef FDMA_WG_ACC16
#undef FDMA_WG_ACC32
#undef FDMA_WG_ACC40
#undef FDMA_WG_ACC64
#undef FDMA_WG_ACC88
#undef FDMA_WG_ACC96
#undef FDMA_WG_ACC128
#else
// Other targets never run these (dispatch checks the device); they compile to a trap.
template <class T, int N>
__device__ __forceinline__ void mma_ss(float (&)[N / 8][4], uint64_t, uint64_t, int) {
  __trap();
}
template <class T, int N>
__device__ __forceinline__ void mma_rs_n_major(float (&)[N / 8][4], const uint32_t (&)[4], uint64_t, int) {
  __trap();
}
template <class T, int N>
__device__ __forceinline__ void mma_ss_n_major(float (&)[N / 8][4], uint64_t, uint64_t, int) {
  __trap();
}
#endif
#undef FDMA_WG_SS
#undef FDMA_WG_SS_N
#undef FDMA_WG_SS_FORM
#undef FDMA_WG_RS
#undef FDMA_WG_D16
#undef FDMA_WG_D32
#undef FDMA_WG_D64
#undef FDMA_WG_D128
#undef FDMA_WG_ACC8X4
#undef FDMA_WG_ACC4

}  // namespace fdma::cuda::wgmma
