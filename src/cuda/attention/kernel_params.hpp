// Host helpers that fill the kernel params both operations share (attention_cuda.cu,
// dma_cuda.cu): q, k, v, out, lse and the sizes; dout and the gradients.
#pragma once

#include "core/problem.hpp"
#include "cuda/attention/attention_bwd_params.hpp"

namespace fdma::cuda {

inline void set_inputs_outputs(AttentionFwdParams& p, const fdma_tensor& q, const fdma_tensor& k, const fdma_tensor& v,
                               const fdma_tensor& out, const fdma_tensor& lse, const detail::Dims& d, double scale,
                               double softcap, bool causal) {
  p.q = q.data, p.k = k.data, p.v = v.data, p.out = out.data;
  p.lse = static_cast<float*>(lse.data);
  for (int i = 0; i < 3; ++i) {
    p.q_stride[i] = q.stride[i];
    p.k_stride[i] = k.stride[i];
    p.v_stride[i] = v.stride[i];
    p.out_stride[i] = out.stride[i];
    p.lse_stride[i] = lse.data ? lse.stride[i] : 0;
  }
  p.B = int(d.B), p.Sq = int(d.Sq), p.Sk = int(d.Sk), p.H = int(d.H), p.Hk = int(d.Hk), p.G = int(d.G()), p.D = int(d.D);
  p.scale = float(scale);
  p.softcap = float(softcap);
  p.causal = causal;
}

inline void set_gradients(AttentionBwdParams& p, const fdma_tensor& dout, const fdma_tensor& dq, const fdma_tensor& dk,
                          const fdma_tensor& dv) {
  p.dout = dout.data, p.dq = dq.data, p.dk = dk.data, p.dv = dv.data;
  for (int i = 0; i < 3; ++i) {
    p.dout_stride[i] = dout.stride[i];
    p.dq_stride[i] = dq.stride[i];
    p.dk_stride[i] = dk.stride[i];
    p.dv_stride[i] = dv.stride[i];
  }
}

}  // namespace fdma::cuda
