#include "engine/train/generator.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"

namespace ferry {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

}  // namespace

absl::Status ValidateSampling(const SamplingOptions& options) {
  if (options.max_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens: ", options.max_tokens, " generates nothing; give at least 1"));
  }
  if (!(options.temperature >= 0) || !std::isfinite(options.temperature)) {
    return absl::InvalidArgumentError(absl::StrCat("temperature: ", options.temperature,
                                                   " is not allowed; give 0 (greedy) or a positive number"));
  }
  if (options.top_k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_k: ", options.top_k, " is negative; give 0 (all tokens) or a positive count"));
  }
  if (!(options.top_p > 0 && options.top_p <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_p: ", options.top_p, " is outside (0, 1]; give e.g. 0.9, or 1 to keep every token"));
  }
  return absl::OkStatus();
}

int64_t SampleToken(const std::vector<float>& logits, const SamplingOptions& options, std::mt19937_64* rng) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  // Most likely first; equals by id, so that the order (and greedy, and
  // top_k = 1) never depends on the sort.
  std::vector<int64_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  auto more_likely = [&](int64_t a, int64_t b) {
    const float la = logits[static_cast<size_t>(a)], lb = logits[static_cast<size_t>(b)];
    // NaN sorts last.
    if (std::isnan(la) || std::isnan(lb)) return !std::isnan(la) && std::isnan(lb);
    return la != lb ? la > lb : a < b;
  };
  if (options.temperature == 0) return *std::min_element(order.begin(), order.end(), more_likely);
  int64_t keep = vocab;
  if (options.top_k > 0) keep = std::min(keep, options.top_k);
  std::partial_sort(order.begin(), order.begin() + keep, order.end(), more_likely);
  order.resize(static_cast<size_t>(keep));
  // Probabilities of the kept tokens, in double, from the largest logit.
  const double top = logits[static_cast<size_t>(order[0])];
  std::vector<double> p(order.size());
  double sum = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    const double l = logits[static_cast<size_t>(order[i])];
    p[i] = std::isfinite(l) ? std::exp((l - top) / options.temperature) : 0.0;
    sum += p[i];
  }
  if (!(sum > 0) || !std::isfinite(sum)) return order[0];
  if (options.top_p < 1) {
    double cumulative = 0;
    size_t n = 0;
    while (n < p.size() && cumulative < options.top_p * sum) cumulative += p[n++];
    n = std::max<size_t>(n, 1);
    p.resize(n);
    order.resize(n);
    sum = cumulative > 0 ? cumulative : p[0];
  }
  // One uniform draw in [0, sum), walked along the cumulative distribution.
  const double u = std::generate_canonical<double, 53>(*rng) * sum;
  double cumulative = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    cumulative += p[i];
    if (u < cumulative) return order[i];
  }
  return order[p.size() - 1];
}

absl::StatusOr<GenerationStats> Generate(InferenceModel& model, const std::vector<int64_t>& prompt,
                                         const SamplingOptions& options,
                                         const std::function<bool(int64_t token)>& on_token) {
  RETURN_IF_ERROR(ValidateSampling(options));
  const ModelConfig& config = model.config();
  if (prompt.empty()) {
    return absl::InvalidArgumentError("prompt: is empty; give at least one token (a text, or ids)");
  }
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("prompt: token ", i, " is ", prompt[i],
                                                     ", outside the model's vocabulary of ", config.vocab_size,
                                                     " ids (0 .. ", config.vocab_size - 1, ")"));
    }
  }
  size_t cached_from = 0;
  std::mt19937_64 rng(options.seed);
  std::vector<int64_t> context = prompt;
  GenerationStats stats;
  stats.prompt_tokens = static_cast<int64_t>(prompt.size());
  const Clock::time_point start = Clock::now();
  std::vector<float> logits(static_cast<size_t>(config.vocab_size));
  // Rows [from, end) of the context as a [1, n] tensor.
  auto rows = [&](size_t from) {
    at::Tensor tokens = at::empty({1, static_cast<int64_t>(context.size() - from)}, at::kLong);
    std::memcpy(tokens.data_ptr<int64_t>(), context.data() + from, (context.size() - from) * sizeof(int64_t));
    return tokens;
  };
  if (options.use_cache) model.ResetCache();
  for (int64_t n = 0; n < options.max_tokens; ++n) {
    at::Tensor last;
    if (!options.use_cache) {
      const size_t window = std::min<size_t>(context.size(), static_cast<size_t>(config.seq_len));
      ASSIGN_OR_RETURN(last, model.LastLogits(rows(context.size() - window)));
    } else {
      // The cache holds the context's positions from `cached_from` on; a
      // full one starts again from the context's last half window.
      if (model.cached_positions() == 0 || cached_from + model.cached_positions() + 1 > context.size() ||
          model.cached_positions() >= config.seq_len) {
        model.ResetCache();
        const size_t window = std::min<size_t>(
            context.size(), static_cast<size_t>(n == 0 ? config.seq_len : std::max<int64_t>(1, config.seq_len / 2)));
        cached_from = context.size() - window;
        ASSIGN_OR_RETURN(last, model.AppendLogits(rows(cached_from)));
      } else {
        ASSIGN_OR_RETURN(last, model.AppendLogits(rows(context.size() - 1)));
      }
    }
    const at::Tensor row = last.reshape({-1}).to(at::kFloat).contiguous();
    if (row.numel() != config.vocab_size) {
      return absl::InternalError(absl::StrCat("the model gave ", row.numel(), " logits for a vocabulary of ",
                                              config.vocab_size));
    }
    std::memcpy(logits.data(), row.data_ptr<float>(), logits.size() * sizeof(float));
    const int64_t next = SampleToken(logits, options, &rng);
    context.push_back(next);
    ++stats.generated_tokens;
    if (n == 0) stats.first_token_seconds = Seconds(start, Clock::now());
    const bool stop = std::find(options.stop_tokens.begin(), options.stop_tokens.end(), next) !=
                      options.stop_tokens.end();
    if (!on_token(next) || stop) {
      stats.stopped = stats.generated_tokens < options.max_tokens;
      stats.stop_token = stop;
      break;
    }
  }
  stats.seconds = Seconds(start, Clock::now());
  return stats;
}

}  // namespace ferry
