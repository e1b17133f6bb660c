// The public `select` operation on the CPU: selection intervals into the caller's tensors.
#include "core/parallel.hpp"
#include "cpu/arena.hpp"
#include "cpu/cpu_backend.hpp"
#include "cpu/pack.hpp"
#include "cpu/selection.hpp"

namespace fdma::cpu {
namespace {

template <class Acc>
struct SelectLayout {
  Acc* scores;  // [B, Hk, Sk]
  int32_t *heap, *begin, *end;  // per worker
  int64_t heap_len;
  SelectLayout(Arena& a, const detail::SelectProblem& s, int workers) {
    scores = a.take<Acc>(s.B * s.Hk * s.Sk);
    heap_len = std::min(s.window, s.Sk);
    heap = a.take<int32_t>(workers * heap_len);
    begin = a.take<int32_t>(workers * s.Sk);
    end = a.take<int32_t>(workers * s.Sk);
  }
};

template <class Acc>
void select_impl(const fdma_select_params& p, const detail::SelectProblem& s) {
  const int workers = detail::num_threads();
  Arena arena(p.workspace);
  SelectLayout<Acc> L(arena, s, workers);
  pack_3d(p.key_scores, L.scores);
  detail::parallel_for(
      s.B * s.Hk, 1,
      [&](int64_t lo, int64_t hi, int w) {
        int32_t* begin = L.begin + w * s.Sk;
        int32_t* end = L.end + w * s.Sk;
        for (int64_t r = lo; r < hi; ++r) {
          const int64_t b = r / s.Hk, hk = r % s.Hk;
          const uint8_t* pad =
              s.has_padding ? static_cast<const uint8_t*>(p.key_padding.data) + b * p.key_padding.stride[0] : nullptr;
          select_row(L.scores + r * s.Sk, pad, p.key_padding.stride[1], s.Sq, s.Sk, s.window, s.causal, begin, end,
                     L.heap + w * L.heap_len);
          auto out_b = static_cast<int32_t*>(p.keep_begin.data) + b * p.keep_begin.stride[0] + hk * p.keep_begin.stride[1];
          auto out_e = static_cast<int32_t*>(p.keep_end.data) + b * p.keep_end.stride[0] + hk * p.keep_end.stride[1];
          for (int64_t j = 0; j < s.Sk; ++j) {
            out_b[j * p.keep_begin.stride[2]] = begin[j];
            out_e[j * p.keep_end.stride[2]] = end[j];
          }
        }
      },
      workers);
}

bool f64_scores(DType dt) { return dt == DType::f64; }

}  // namespace

size_t select_workspace(const detail::SelectProblem& s, DType score_dtype) {
  Arena a;
  if (f64_scores(score_dtype))
    SelectLayout<double>(a, s, detail::num_threads());
  else
    SelectLayout<float>(a, s, detail::num_threads());
  return a.bytes();
}

void select(const fdma_select_params& p, const detail::SelectProblem& s) {
  f64_scores(static_cast<DType>(p.key_scores.dtype)) ? select_impl<double>(p, s) : select_impl<float>(p, s);
}

}  // namespace fdma::cpu
