#include "models/engine/eval_accuracy.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "core/dtype.h"
#include "core/stats.h"

namespace rattn::engine {

namespace {
double log_sum_exp(const float* x, int64_t n) {
  const double mx = double(*std::max_element(x, x + n));
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(double(x[i]) - mx);
  return mx + std::log(s);
}
}  // namespace

double kl_divergence(const float* p_logits, const float* q_logits, int64_t n) {
  const double lp = log_sum_exp(p_logits, n), lq = log_sum_exp(q_logits, n);
  double kl = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double log_p = double(p_logits[i]) - lp, log_q = double(q_logits[i]) - lq;
    kl += std::exp(log_p) * (log_p - log_q);
  }
  return std::max(kl, 0.0);  // >= 0 in exact arithmetic
}

double token_nll(const float* logits, int64_t n, int32_t target) { return log_sum_exp(logits, n) - double(logits[target]); }

double top2_margin(const float* logits, int64_t n) {
  double a = -INFINITY, b = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    const double x = logits[i];
    if (x > a) {
      b = a;
      a = x;
    } else if (x > b) {
      b = x;
    }
  }
  return n > 1 ? a - b : INFINITY;
}

PerplexityDelta perplexity_delta(const std::vector<double>& nll_diff, int resamples, uint64_t seed) {
  PerplexityDelta out;
  const size_t n = nll_diff.size();
  if (n == 0) return out;
  double sum = 0;
  for (double x : nll_diff) sum += x;
  out.delta = std::expm1(sum / double(n));
  std::mt19937_64 rng(seed);
  std::vector<double> means(static_cast<size_t>(std::max(resamples, 1)));
  for (double& m : means) {
    double s = 0;
    for (size_t i = 0; i < n; ++i) s += nll_diff[size_t(rng() % n)];  // modulo bias ~ n / 2^64: none to speak of
    m = std::expm1(s / double(n));
  }
  out.lo = quantile(means, 0.025);
  out.hi = quantile(means, 0.975);
  return out;
}

RoundedKvAttention::RoundedKvAttention(const GemmaConfig& cfg, const GemmaSequence& model_seq)
    : cfg_(cfg), model_seq_(model_seq), k16_(size_t(cfg.n_layer)), v16_(size_t(cfg.n_layer)) {}

void RoundedKvAttention::decode(int layer, int64_t pos, const float* q, const float* /*k*/, const float* /*v*/, float* out) {
  const int H = cfg_.n_head, HK = cfg_.n_kv_head, d = cfg_.head_dim, group = H / HK;
  const size_t row = size_t(HK) * size_t(d);
  // The sequence's cache already holds this token at `pos`. Rows before it
  // are kept (a truncated model_seq re-decodes from a shared prefix), the rest
  // rounded from the cache.
  std::vector<float>& kr = k16_[size_t(layer)];
  std::vector<float>& vr = v16_[size_t(layer)];
  const size_t need = size_t(pos) + 1, keep = std::min(kr.size() / row, size_t(pos));
  kr.resize(keep * row);
  vr.resize(keep * row);
  for (size_t i = keep * row; i < need * row; ++i) {
    kr.push_back(f16_to_f32(f32_to_f16(model_seq_.keys(layer)[i])));
    vr.push_back(f16_to_f32(f32_to_f16(model_seq_.values(layer)[i])));
  }
  std::vector<double> s(need), acc(static_cast<size_t>(d));
  for (int h = 0; h < H; ++h) {
    const int kh = h / group;
    const float* qh = q + size_t(h) * size_t(d);
    double mx = -INFINITY;
    for (size_t j = 0; j < need; ++j) {
      const float* kj = &kr[j * row + size_t(kh) * size_t(d)];
      double dot = 0;
      for (int i = 0; i < d; ++i) dot += double(qh[i]) * double(kj[i]);
      s[j] = dot * double(cfg_.attn_scale);
      mx = std::max(mx, s[j]);
    }
    double sum = 0;
    std::fill(acc.begin(), acc.end(), 0.0);
    for (size_t j = 0; j < need; ++j) {
      const double w = std::exp(s[j] - mx);
      sum += w;
      const float* vj = &vr[j * row + size_t(kh) * size_t(d)];
      for (int i = 0; i < d; ++i) acc[size_t(i)] += w * double(vj[i]);
    }
    for (int i = 0; i < d; ++i) out[size_t(h) * size_t(d) + size_t(i)] = float(acc[size_t(i)] / sum);
  }
}

ExactCheckStep exact_check_step(const float* full, const float* rattn, const float* rounded, int64_t vocab) {
  ExactCheckStep st;
  double num = 0, den = 0, num_r = 0;
  int64_t am_f = 0, am_r = 0;
  for (int64_t j = 0; j < vocab; ++j) {
    const double f = full[j];
    num += (double(rattn[j]) - f) * (double(rattn[j]) - f);
    den += f * f;
    st.full_max_abs = std::max(st.full_max_abs, std::fabs(f));
    if (full[j] > full[am_f]) am_f = j;
    if (rattn[j] > rattn[am_r]) am_r = j;
    if (rounded) {
      const double e = double(rounded[j]) - f;
      num_r += e * e;
      st.storage_abs_error = std::max(st.storage_abs_error, std::fabs(e));
    }
  }
  den = std::max(den, 1e-300);
  st.logits_rel_error = std::sqrt(num / den);
  st.storage_rel_error = std::sqrt(num_r / den);
  st.full_margin = top2_margin(full, vocab);
  st.argmax_equal = am_f == am_r;
  return st;
}

ExactCheckReport exact_check(const std::vector<ExactCheckStep>& steps) {
  using R = ExactCheckReport;
  R r;
  for (const ExactCheckStep& s : steps) {
    r.storage_rel_error_max = std::max(r.storage_rel_error_max, s.storage_rel_error);
    r.storage_abs_error_max = std::max(r.storage_abs_error_max, s.storage_abs_error);
    r.logits_rel_error_max = std::max(r.logits_rel_error_max, s.logits_rel_error);
  }
  r.logits_gate = R::kFloor + R::kSafety * r.storage_rel_error_max;
  for (size_t i = 0; i < steps.size(); ++i) {
    const ExactCheckStep& s = steps[i];
    const double bound = 2.0 * (R::kFloor * s.full_max_abs + R::kSafety * r.storage_abs_error_max);
    if (s.full_margin <= bound) r.near_ties.push_back({int64_t(i), s.full_margin, bound, !s.argmax_equal});
    else if (!s.argmax_equal) r.failing_flips.push_back(int64_t(i));
  }
  if (r.logits_rel_error_max > r.logits_gate) {
    r.pass = false;
    r.reason = "logits relative L2 error " + std::to_string(r.logits_rel_error_max) + " over the gate " +
               std::to_string(r.logits_gate);
  }
  if (!r.failing_flips.empty()) {
    r.pass = false;
    if (!r.reason.empty()) r.reason += "; ";
    r.reason += std::to_string(r.failing_flips.size()) + " argmax flip(s) where full attention's top-2 margin exceeds the rounding bound (first at step " +
                std::to_string(r.failing_flips.front()) + ")";
  }
  return r;
}

}  // namespace rattn::engine
