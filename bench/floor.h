#pragma once

// A training step's floor on the host's own cores: the parts of a step no
// schedule hides, each timed alone at the job's sizes -- its matrix
// products and the optimizer's update of every parameter -- and the disk
// tier's own bandwidth. Shared by the benchmarks that set runs beside them.

#include <ATen/ATen.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/timing.h"
#include "engine/model/model_config.h"
#include "engine/optim/cpu_adam.h"

namespace ferry {

// Seconds for the forward and backward products of `count` linear layers
// [in -> out] at `tokens` rows, in `type`: X W^T, then G W and G^T X. The
// weights rotate through four of them, so that they come from memory as a
// streamed layer's do rather than from the cache.
inline double ProductSeconds(int64_t tokens, int64_t in, int64_t out, at::ScalarType type, int64_t count) {
  const at::TensorOptions options = at::TensorOptions().dtype(type);
  std::vector<at::Tensor> weights;
  for (int i = 0; i < 4; ++i) weights.push_back(at::randn({out, in}, options.dtype(at::kFloat)).to(type));
  const at::Tensor x = at::randn({tokens, in}, options.dtype(at::kFloat)).to(type);
  const at::Tensor g = at::randn({tokens, out}, options.dtype(at::kFloat)).to(type);
  at::Tensor y = at::empty({tokens, out}, options), dx = at::empty({tokens, in}, options);
  at::Tensor dw = at::empty({out, in}, options);
  size_t next = 0;
  const double each = Time(8, [&] {
    const at::Tensor& w = weights[next++ % weights.size()];
    at::mm_out(y, x, w.t());
    at::mm_out(dx, g, w);
    at::mm_out(dw, g.t(), x);
  });
  return each * double(count);
}

// Seconds for the products of one step of `model` at `tokens` rows: the
// blocks' four linear layers (q/k/v, the attention's output, the MLP's
// [gate and] up, its down) and the head (the sliced head computes the same
// products a slice at a time).
inline double StepProductSeconds(const ModelConfig& model, int64_t tokens, at::ScalarType type) {
  const int64_t h = model.hidden, inner = model.Intermediate();
  const int64_t up = (model.Gated() ? 2 : 1) * inner;
  return ProductSeconds(tokens, h, model.QkvRows(), type, model.layers) +
         ProductSeconds(tokens, model.heads * model.HeadDim(), h, type, model.layers) +
         ProductSeconds(tokens, h, up, type, model.layers) + ProductSeconds(tokens, inner, h, type, model.layers) +
         ProductSeconds(tokens, h, model.vocab_size, type, 1);
}

// Seconds for one AdamW update of `parameters` values on the host, timed
// over 64 Mi of them (more than any cache) and scaled: fp32 weights, or
// mixed (bf16 gradients in, fp32 master weights updated and rounded to
// bf16 copies).
inline double UpdateSeconds(int64_t parameters, bool mixed) {
  const int64_t n = std::min<int64_t>(parameters, int64_t(64) << 20);
  std::vector<float> master(n, 0.5f), m(n, 0.0f), v(n, 0.0f);
  std::vector<uint16_t> low_grad(mixed ? n : 0, 0x3c00), copy(mixed ? n : 0, 0);
  std::vector<float> grad(mixed ? 0 : n, 0.25f);
  CpuAdamBuffers b;
  b.master = master.data();
  b.exp_avg = m.data();
  b.exp_avg_sq = v.data();
  b.numel = n;
  if (mixed) {
    b.grad = low_grad.data();
    b.grad_type = LowType::kBFloat16;
    b.copy = copy.data();
    b.copy_type = LowType::kBFloat16;
  } else {
    b.grad = grad.data();
  }
  AdamWHyper hyper;
  hyper.lr = 1e-4;
  hyper.weight_decay = 0.1;
  const std::vector<DecaySegment> decay = {{0, n}};
  const double each = Time(3, [&] {
    ++hyper.step;
    CpuAdamWStep(b, decay, hyper, BestSimdPath());
  });
  return each * double(parameters) / double(n);
}

// The disk's bandwidth for the tier's own access: `bytes` written to a
// file in `dir` and read back, both with O_DIRECT (no page cache) in 4 MiB
// requests, bytes a second each way; 0 where the file system refuses
// O_DIRECT or the directory is not writable.
struct DiskBandwidth {
  double write = 0, read = 0;
};
inline DiskBandwidth MeasureDiskBandwidth(const std::string& dir, uint64_t bytes = uint64_t{512} << 20) {
  DiskBandwidth out;
  const std::string path = dir + "/.ferry-bandwidth-probe";
  constexpr size_t kBlock = size_t{4} << 20;
  void* buffer = nullptr;
  if (posix_memalign(&buffer, 4096, kBlock) != 0) return out;
  std::fill(static_cast<char*>(buffer), static_cast<char*>(buffer) + kBlock, 'x');
  auto seconds_since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
  if (fd >= 0) {
    auto start = std::chrono::steady_clock::now();
    uint64_t done = 0;
    while (done < bytes && write(fd, buffer, kBlock) == static_cast<ssize_t>(kBlock)) done += kBlock;
    fsync(fd);
    out.write = done / std::max(1e-9, seconds_since(start));
    close(fd);
    fd = open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (fd >= 0) {
      start = std::chrono::steady_clock::now();
      uint64_t got = 0;
      while (got < done && read(fd, buffer, kBlock) == static_cast<ssize_t>(kBlock)) got += kBlock;
      out.read = got / std::max(1e-9, seconds_since(start));
      close(fd);
    }
    unlink(path.c_str());
  }
  free(buffer);
  return out;
}

}  // namespace ferry
