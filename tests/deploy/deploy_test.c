/* Links a deployable library (`rattn emit --target library`) and checks it:
 * a context made with no plan (the embedded one) must run on the embedded
 * kernel set named on the command line, then prefill and decode random
 * Q/K/V in every layer and match full attention computed here in float64.
 *
 *   deploy_test EXPECTED_CPU_KERNELS      e.g. "halide embedded:host"
 *
 * Prompts are short (PROMPT + STEPS tokens <= sinks + window + top_k of
 * tests/deploy/tiny.ra), so every token is attended and the result is exact
 * attention: Q/K/V are handed over in fp16 and the reference uses the same
 * fp16 values, leaving only fp32 arithmetic (tolerance below). With
 * RATTN_DEPLOY_EXPECT_GPU set, the static set must run on the GPU. Exit
 * status 0 on success, 1 on any failure. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rattn.h"

enum { PROMPT = 60, STEPS = 6, MAXT = PROMPT + STEPS, MAXH = 16, MAXD = 256 };
/* max |o - ref| <= TOL_OUT * max |ref| per head and step; |lse - ref| <= TOL_LSE. */
static const double TOL_OUT = 1e-4, TOL_LSE = 1e-4;

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double uniform(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (double)(rng >> 11) * (1.0 / 9007199254740992.0);
}
static double normal(void) {
  double u1 = uniform(), u2 = uniform();
  if (u1 < 1e-300) u1 = 1e-300;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static void on_log(rattn_log_level level, const char* text, void* user) {
  (void)user;
  printf("rattn log [%d]: %s\n", (int)level, text);
}

static int failed(const char* what, rattn_status s, const rattn_context* ctx) {
  printf("FAIL: %s: %s: %s\n", what, rattn_status_string(s), rattn_context_last_error(ctx));
  return 1;
}

/* Keys and values of one layer: [kv head][token][d], fp16. */
static _Float16 K[MAXH][MAXT][MAXD], V[MAXH][MAXT][MAXD];

int main(int argc, char** argv) {
  if (argc != 2) {
    printf("usage: deploy_test EXPECTED_CPU_KERNELS\n");
    return 1;
  }
  rattn_log_set(on_log, NULL);
  rattn_context_params p = rattn_context_default_params();
  p.n_threads = 2;
  p.kernels = RATTN_KERNELS_HALIDE; /* no silent fall back to the reference loops */
  rattn_context* ctx = NULL;
  rattn_status s = rattn_context_create(&p, &ctx);
  if (s != RATTN_OK) return failed("rattn_context_create with no plan (the embedded one)", s, NULL);
  rattn_context_info info;
  if ((s = rattn_context_get_info(ctx, &info)) != RATTN_OK) return failed("rattn_context_get_info", s, ctx);
  printf("context: %d layers, %d/%d heads, d %d, sinks %d, window %d, top_k %d\n", info.n_layers,
         info.n_q_heads, info.n_kv_heads, info.head_dim, info.sinks, info.window, info.top_k);
  printf("cpu kernels: %s\ngpu: %s\n", info.cpu_kernels, info.gpu_status);
  /* Set where a GPU of the embedded arch is present: the static set must run there. */
  if (getenv("RATTN_DEPLOY_EXPECT_GPU") && !info.gpu) {
    printf("FAIL: the static set is not on the GPU\n");
    return 1;
  }
  if (!strstr(info.cpu_kernels, argv[1])) {
    printf("FAIL: cpu kernels are '%s', expected '%s'\n", info.cpu_kernels, argv[1]);
    return 1;
  }
  const int L = info.n_layers, HQ = info.n_q_heads, HKV = info.n_kv_heads, D = info.head_dim;
  if (HQ > MAXH || HKV > MAXH || D > MAXD || info.sinks + info.window + info.top_k < MAXT) {
    printf("FAIL: the embedded plan is not the small test plan\n");
    return 1;
  }
  const int group = HQ / HKV;
  rattn_sequence* seq = NULL;
  if ((s = rattn_sequence_create(ctx, &seq)) != RATTN_OK) return failed("rattn_sequence_create", s, ctx);

  static _Float16 q[MAXH * MAXT * MAXD], kp[MAXH * MAXT * MAXD], vp[MAXH * MAXT * MAXD];
  static float out[MAXH * MAXD], lse[MAXH];
  double worst_out = 0, worst_lse = 0;
  for (int layer = 0; layer < L; ++layer) {
    for (int h = 0; h < HKV; ++h)
      for (int t = 0; t < MAXT; ++t)
        for (int j = 0; j < D; ++j) {
          K[h][t][j] = (_Float16)normal();
          V[h][t][j] = (_Float16)normal();
        }
    for (int h = 0; h < HQ; ++h)
      for (int t = 0; t < PROMPT; ++t)
        for (int j = 0; j < D; ++j) q[((size_t)h * PROMPT + t) * D + j] = (_Float16)(1.5 * normal());
    for (int h = 0; h < HKV; ++h)
      for (int t = 0; t < PROMPT; ++t)
        for (int j = 0; j < D; ++j) {
          kp[((size_t)h * PROMPT + t) * D + j] = K[h][t][j];
          vp[((size_t)h * PROMPT + t) * D + j] = V[h][t][j];
        }
    if ((s = rattn_sequence_prefill(seq, layer, PROMPT, q, kp, vp, RATTN_F16)) != RATTN_OK)
      return failed("rattn_sequence_prefill", s, ctx);
    for (int step = 0; step < STEPS; ++step) {
      const int t = PROMPT + step, n = t + 1;
      for (int h = 0; h < HQ; ++h)
        for (int j = 0; j < D; ++j) q[(size_t)h * D + j] = (_Float16)(1.5 * normal());
      for (int h = 0; h < HKV; ++h)
        for (int j = 0; j < D; ++j) {
          kp[(size_t)h * D + j] = K[h][t][j];
          vp[(size_t)h * D + j] = V[h][t][j];
        }
      if ((s = rattn_sequence_decode(seq, layer, q, kp, vp, RATTN_F16, out, lse)) != RATTN_OK)
        return failed("rattn_sequence_decode", s, ctx);
      for (int h = 0; h < HQ; ++h) {
        const int kv = h / group;
        double scores[MAXT], m = -INFINITY, sum = 0, ref[MAXD] = {0}, ref_max = 0, err = 0;
        for (int i = 0; i < n; ++i) {
          double dot = 0;
          for (int j = 0; j < D; ++j) dot += (double)q[(size_t)h * D + j] * (double)K[kv][i][j];
          scores[i] = dot / sqrt((double)D);
          if (scores[i] > m) m = scores[i];
        }
        for (int i = 0; i < n; ++i) sum += exp(scores[i] - m);
        for (int i = 0; i < n; ++i)
          for (int j = 0; j < D; ++j) ref[j] += exp(scores[i] - m) / sum * (double)V[kv][i][j];
        for (int j = 0; j < D; ++j) {
          if (fabs(ref[j]) > ref_max) ref_max = fabs(ref[j]);
          const double e = fabs((double)out[h * D + j] - ref[j]);
          if (!(e <= err)) err = e; /* NaN counts as the worst */
        }
        const double rel = err / (ref_max > 0 ? ref_max : 1);
        const double lse_err = fabs((double)lse[h] - (m + log(sum)));
        if (!(rel <= worst_out)) worst_out = rel;
        if (!(lse_err <= worst_lse)) worst_lse = lse_err;
      }
    }
  }
  printf("max relative output error %.3g (tolerance %.1g), max lse error %.3g (tolerance %.1g)\n", worst_out,
         TOL_OUT, worst_lse, TOL_LSE);
  rattn_sequence_free(seq);
  rattn_context_free(ctx);
  if (!(worst_out <= TOL_OUT) || !(worst_lse <= TOL_LSE)) {
    printf("FAIL: outside the tolerance\n");
    return 1;
  }
  printf("PASS\n");
  return 0;
}
