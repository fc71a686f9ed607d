// How fast the host-side optimizer updates parameters, all in one run:
// Ferry's fused CPU AdamW kernel, torch::optim::AdamW on one flat tensor and
// on a GPT's parameter list, and the bound memory bandwidth puts on any
// update (bytes it must move per parameter, into the bandwidth of a simple
// streaming kernel), each at 1 and 2 threads.
//
//   bazel run //bench:adam [-- --quick]
//
// Writes bench/results/adam.json and prints a table. Figures only.

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "bench/bench_output.h"
#include "bench/timing.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/common/host_info.h"
#include "engine/model/model_config.h"
#include "engine/optim/cpu_adam.h"

ABSL_FLAG(bool, quick, false, "One timed step per measurement (under two minutes).");
ABSL_FLAG(int64_t, params, 100000000, "Parameters to update.");
ABSL_FLAG(std::string, out, "", "JSON output path (default bench/results/adam.json).");

namespace ferry {
namespace {

// A GPT's parameter shapes, layers added until about `params` in all.
std::vector<std::vector<int64_t>> GptShapes(int64_t params) {
  const int64_t h = 768, vocab = 16384, seq = 1024;
  std::vector<std::vector<int64_t>> shapes = {{vocab, h}, {seq, h}};
  int64_t total = vocab * h + seq * h + 2 * h;
  while (total + 12 * h * h + 13 * h <= params) {
    for (std::vector<int64_t> s : std::vector<std::vector<int64_t>>{
             {h}, {h}, {3 * h, h}, {3 * h}, {h, h}, {h}, {h}, {h}, {4 * h, h}, {4 * h}, {h, 4 * h}, {h}}) {
      shapes.push_back(s);
    }
    total += 12 * h * h + 13 * h;
  }
  shapes.push_back({h});
  shapes.push_back({h});
  return shapes;
}

struct Row {
  int threads;
  double ferry, torch_flat, torch_list, bandwidth_bytes_per_second;
};

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  using namespace ferry;
  absl::ParseCommandLine(argc, argv);
  const bool quick = absl::GetFlag(FLAGS_quick);
  const int runs = quick ? 2 : 5;
  const int64_t n = absl::GetFlag(FLAGS_params);
  const SimdPath path = BestSimdPath();
  // Bytes an fp32 AdamW update must move per parameter: read the weight, the
  // gradient and both moments; write the weight and both moments.
  constexpr double kBytesPerParam = 7 * 4;

  torch::manual_seed(0);
  std::vector<Row> rows;
  for (int threads : {1, 2}) {
    if (threads > HostCpuCount()) break;
    at::set_num_threads(threads);
    Row row{threads, 0, 0, 0, 0};
    std::fprintf(stderr, "%d thread(s):\n", threads);

    // Streaming bandwidth with the update's own traffic and no arithmetic:
    // read four arrays, write three of them back in place (28 bytes a
    // parameter), as a plain OpenMP SIMD loop.
    {
      torch::Tensor a = torch::zeros({n}), b = torch::zeros({n}), c = torch::zeros({n}), d = torch::ones({n});
      float* pa = a.data_ptr<float>();
      float* pb = b.data_ptr<float>();
      float* pc = c.data_ptr<float>();
      const float* pd = d.data_ptr<float>();
      const double seconds = Time(runs, [&] {
#pragma omp parallel for simd num_threads(threads) schedule(static)
        for (int64_t i = 0; i < n; ++i) {
          pa[i] += pd[i];
          pb[i] += pd[i];
          pc[i] += pd[i];
        }
      });
      row.bandwidth_bytes_per_second = kBytesPerParam * double(n) / seconds;
      std::fprintf(stderr, "  stream: %.1f GB/s\n", row.bandwidth_bytes_per_second / 1e9);
    }
    {
      torch::Tensor p = torch::randn({n}), g = torch::randn({n}), m = torch::zeros({n}), v = torch::zeros({n});
      CpuAdamBuffers b{p.data_ptr<float>(), g.data_ptr<float>(), LowType::kFloat32, m.data_ptr<float>(),
                       v.data_ptr<float>(), nullptr, LowType::kFloat16, n};
      AdamWHyper h;
      h.weight_decay = 0.1;
      int64_t step = 0;
      const double seconds = Time(runs, [&] {
        h.step = ++step;
        CpuAdamWStep(b, {{0, n}}, h, path);
      });
      row.ferry = double(n) / seconds;
      std::fprintf(stderr, "  ferry (%s): %.3f s\n", SimdPathName(path), seconds);
    }
    {
      torch::Tensor p = torch::randn({n}).requires_grad_();
      p.mutable_grad() = torch::randn({n});
      torch::optim::AdamW adamw({p}, torch::optim::AdamWOptions(1e-3).weight_decay(0.1));
      const double seconds = Time(runs, [&] { adamw.step(); });
      row.torch_flat = double(n) / seconds;
      std::fprintf(stderr, "  torch flat: %.3f s\n", seconds);
    }
    {
      std::vector<torch::Tensor> params;
      int64_t total = 0;
      for (const std::vector<int64_t>& shape : GptShapes(n)) {
        torch::Tensor p = torch::randn(shape).requires_grad_();
        p.mutable_grad() = torch::randn(shape);
        total += p.numel();
        params.push_back(p);
      }
      torch::optim::AdamW adamw(params, torch::optim::AdamWOptions(1e-3).weight_decay(0.1));
      const double seconds = Time(runs, [&] { adamw.step(); });
      row.torch_list = double(total) / seconds;
      std::fprintf(stderr, "  torch list (%zu tensors, %lld params): %.3f s\n", params.size(),
                   static_cast<long long>(total), seconds);
    }
    rows.push_back(row);
  }

  std::printf("\nAdamW on %lld fp32 parameters (SIMD path %s); parameters updated per second, millions\n",
              static_cast<long long>(n), SimdPathName(path));
  // The machine's bandwidth: the best the streaming kernel reached at any
  // thread count. The headline figures are those of the most threads.
  const Row& best = rows.back();
  double bandwidth = 0;
  for (const Row& r : rows) bandwidth = std::max(bandwidth, r.bandwidth_bytes_per_second);
  const double bound = bandwidth / kBytesPerParam;
  std::printf("%-8s %10s %12s %12s %12s %10s %10s\n", "threads", "ferry", "torch flat", "torch list", "stream",
              "vs torch", "of bound");
  for (const Row& r : rows) {
    std::printf("%-8d %10.1f %12.1f %12.1f %10.1f GB/s %7.2fx %10.2f\n", r.threads, r.ferry / 1e6,
                r.torch_flat / 1e6, r.torch_list / 1e6, r.bandwidth_bytes_per_second / 1e9,
                r.ferry / r.torch_flat, r.ferry / bound);
  }
  std::printf("bandwidth bound: %.1f GB/s / %.0f bytes per parameter = %.1f M parameters/s\n", bandwidth / 1e9,
              kBytesPerParam, bound / 1e6);
  std::printf("thread scaling (ferry, 2 threads / 1): %.2fx\n",
              rows.size() > 1 ? rows[1].ferry / rows[0].ferry : 1.0);

  std::vector<std::string> json_rows;
  for (const Row& r : rows) {
    json_rows.push_back(absl::StrFormat(
        "    {\"threads\": %d, \"ferry_params_per_second\": %.0f, \"torch_flat_params_per_second\": %.0f, "
        "\"torch_list_params_per_second\": %.0f, \"bandwidth_bytes_per_second\": %.0f, "
        "\"bandwidth_bound_params_per_second\": %.0f}",
        r.threads, r.ferry, r.torch_flat, r.torch_list, r.bandwidth_bytes_per_second,
        r.bandwidth_bytes_per_second / kBytesPerParam));
  }
  const std::string json = absl::StrCat(
      "{\n  \"benchmark\": \"adam\",\n  \"quick\": ", quick ? "true" : "false", ",\n  \"params\": ", n,
      ",\n  \"simd\": \"", SimdPathName(path), "\",\n  \"threads\": ", best.threads,
      ",\n  \"bytes_per_param\": ", kBytesPerParam, ",\n  \"bandwidth_bytes_per_second\": ",
      absl::StrFormat("%.0f", bandwidth),
      ",\n  \"ferry_params_per_second\": ", absl::StrFormat("%.0f", best.ferry),
      ",\n  \"torch_flat_params_per_second\": ", absl::StrFormat("%.0f", best.torch_flat),
      ",\n  \"torch_list_params_per_second\": ", absl::StrFormat("%.0f", best.torch_list),
      ",\n  \"bandwidth_bound_params_per_second\": ", absl::StrFormat("%.0f", bound),
      ",\n  \"speedup_vs_torch\": ", absl::StrFormat("%.3f", best.ferry / best.torch_flat),
      ",\n  \"speedup_vs_torch_list\": ", absl::StrFormat("%.3f", best.ferry / best.torch_list),
      ",\n  \"fraction_of_bound\": ", absl::StrFormat("%.3f", best.ferry / bound),
      ",\n  \"thread_scaling\": [\n", absl::StrJoin(json_rows, ",\n"), "\n  ]\n}\n");
  return ferry::WriteBenchResult("adam", absl::GetFlag(FLAGS_out), json);
}
