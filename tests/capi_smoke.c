/* The C header compiles as C99 and the C ABI runs a small attention from plain C. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fdma/fdma.h"

static fdma_tensor contiguous4(void* data, int32_t dtype, int64_t a, int64_t b, int64_t c, int64_t d) {
  fdma_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = dtype;
  t.ndim = 4;
  t.shape[0] = a, t.shape[1] = b, t.shape[2] = c, t.shape[3] = d;
  t.stride[3] = 1, t.stride[2] = d, t.stride[1] = c * d, t.stride[0] = b * c * d;
  return t;
}

int main(void) {
  enum { B = 1, S = 3, H = 1, D = 2 };
  float q[B * S * H * D] = {1, 0, 0, 1, 1, 1}, k[B * S * H * D] = {1, 0, 0, 1, -1, 0};
  float v[B * S * H * D] = {1, 2, 3, 4, 5, 6}, out[B * S * H * D];
  fdma_attention_params p;
  memset(&p, 0, sizeof p);
  p.q = contiguous4(q, FDMA_FLOAT32, B, S, H, D);
  p.k = contiguous4(k, FDMA_FLOAT32, B, S, H, D);
  p.v = contiguous4(v, FDMA_FLOAT32, B, S, H, D);
  p.out = contiguous4(out, FDMA_FLOAT32, B, S, H, D);
  p.causal = 1;
  size_t bytes = 0;
  if (fdma_attention_workspace_size(&p, FDMA_PASS_FORWARD, &bytes) != FDMA_OK) {
    fprintf(stderr, "workspace size failed: %s\n", fdma_last_error());
    return 1;
  }
  void* ws = malloc(bytes);
  p.workspace = ws;
  p.workspace_bytes = bytes;
  int32_t st = fdma_attention_fwd(&p);
  free(ws);
  if (st != FDMA_OK) {
    fprintf(stderr, "attention failed: %s\n", fdma_last_error());
    return 1;
  }
  /* Causal: query 0 sees only key 0, so its output is v[0] exactly. */
  if (fabsf(out[0] - 1.0f) > 1e-6f || fabsf(out[1] - 2.0f) > 1e-6f) {
    fprintf(stderr, "wrong output %f %f\n", out[0], out[1]);
    return 1;
  }
  /* Bad input comes back as a status with a message, not a crash. */
  p.q.shape[3] = 0;
  if (fdma_attention_fwd(&p) != FDMA_ERR_INVALID_ARGUMENT || strstr(fdma_last_error(), "q.shape[3]") == NULL) {
    fprintf(stderr, "expected an argument error, got: %s\n", fdma_last_error());
    return 1;
  }
  printf("C ABI %d (%s): ok\n", fdma_abi_version(), fdma_version_string());
  return 0;
}
