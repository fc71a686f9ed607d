#include "engine/memory/tier_plan.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

namespace ferry {

// In the largest binary unit that keeps the figure at least 1.
std::string BytesText(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = double(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, unit == 0 ? "%.0f %s" : "%.2f %s", value, kUnits[unit]);
  return buf;
}

const char* TierName(Tier tier) {
  switch (tier) {
    case Tier::kDevice:
      return "device";
    case Tier::kHost:
      return "host";
    case Tier::kDisk:
      return "disk";
  }
  return "unknown";
}

uint64_t AlignToDisk(uint64_t bytes) { return (bytes + kDiskAlignment - 1) / kDiskAlignment * kDiskAlignment; }

uint64_t DiskRegionBytes(int64_t elements, uint64_t element_bytes) {
  const uint64_t bytes = static_cast<uint64_t>(elements) * element_bytes;
  return (bytes + kDiskBlockBytes - 1) / kDiskBlockBytes * kDiskBlockBytes;
}

uint64_t DiskFileBytes(int64_t elements, uint64_t element_bytes, int regions) {
  return static_cast<uint64_t>(regions) * DiskRegionBytes(elements, element_bytes);
}

int TierPlan::optimizer_chunks_on_disk() const {
  return static_cast<int>(std::count(optimizer_tier.begin(), optimizer_tier.end(), Tier::kDisk));
}

int TierPlan::grad_chunks_on_disk() const {
  return static_cast<int>(std::count(grad_tier.begin(), grad_tier.end(), Tier::kDisk));
}

TierInput ChunkTierInput(const std::vector<int64_t>& capacity, bool mixed_precision) {
  TierInput in;
  in.elements = capacity;
  in.weight_bytes = mixed_precision ? 2 : 4;
  in.masters_with_optimizer = mixed_precision;
  return in;
}

namespace {

int64_t RoundUp(int64_t n, int64_t q) { return (n + q - 1) / q * q; }

// The staging slots and each chunk's slice for the payloads `plan` puts on
// disk: a slice holds at most `slice_bytes` of them (and no more than the
// chunk), in whole quanta.
void ShapeStaging(const TierInput& in, uint64_t slice_bytes, TierPlan* plan) {
  plan->slot_bytes = 0;
  plan->slice_elements.assign(in.elements.size(), 0);
  for (size_t c = 0; c < in.elements.size(); ++c) {
    uint64_t per_element = 0;
    if (plan->optimizer_tier[c] == Tier::kDisk) per_element += 4 * static_cast<uint64_t>(in.optimizer_regions());
    if (plan->grad_tier[c] == Tier::kDisk) per_element += in.weight_bytes;
    if (per_element == 0) continue;
    const int64_t quanta = static_cast<int64_t>(slice_bytes / (per_element * kDiskSliceQuantum));
    const int64_t most = std::max<int64_t>(1, quanta) * kDiskSliceQuantum;
    const int64_t slice = std::min(most, RoundUp(std::max<int64_t>(in.elements[c], 1), kDiskSliceQuantum));
    plan->slice_elements[c] = slice;
    plan->slot_bytes = std::max(plan->slot_bytes, static_cast<uint64_t>(slice) * per_element);
  }
  plan->staging_bytes = kDiskStagingSlots * plan->slot_bytes;
}

// The host side's needs under the plan's tiers: steady (every chunk's
// parameters, the gradients and optimizer states kept on the host, the
// staging slots) and at its peak during construction.
void HostNeeds(const TierInput& in, uint64_t slice_bytes, TierPlan* plan) {
  ShapeStaging(in, slice_bytes, plan);
  uint64_t steady = 0;
  plan->disk_optimizer_bytes = 0;
  plan->disk_grad_bytes = 0;
  for (size_t c = 0; c < in.elements.size(); ++c) {
    steady += in.param_bytes(c);
    if (plan->grad_tier[c] == Tier::kDisk) {
      plan->disk_grad_bytes += DiskFileBytes(in.elements[c], in.weight_bytes, 1);
    } else {
      steady += in.grad_bytes(c);
    }
    if (plan->optimizer_tier[c] == Tier::kDisk) {
      plan->disk_optimizer_bytes += DiskFileBytes(in.optimizer_numel(c), 4, in.optimizer_regions());
    } else {
      steady += in.optimizer_bytes(c);
    }
  }
  plan->host_steady_bytes = steady + plan->staging_bytes;
  // Construction fills each chunk's parameters (and, with the masters, its
  // host-kept states; a disk-kept chunk's masters are drawn into a chunk of
  // fp32 first and written through the staging) before the values it was
  // built from are freed; the gradients come later.
  uint64_t all_params = 0;
  for (size_t c = 0; c < in.elements.size(); ++c) all_params += in.param_bytes(c);
  uint64_t held = in.built_bytes + in.init_scratch_bytes + plan->staging_bytes;
  uint64_t peak = held;
  for (size_t c = 0; c < in.elements.size(); ++c) {
    held += in.param_bytes(c);
    uint64_t drawn = 0;
    if (in.masters_with_optimizer) {
      if (plan->optimizer_tier[c] == Tier::kHost) {
        held += in.optimizer_bytes(c);
        // A shard's masters are drawn whole first.
        if (in.optimizer_numel(c) != in.elements[c]) drawn = static_cast<uint64_t>(in.elements[c]) * 4;
      } else {
        drawn = static_cast<uint64_t>(in.elements[c]) * 4;
      }
    }
    // So are a weight shard's values (the fp32 ones; the masters' above).
    if (in.host_numel(c) != in.elements[c]) drawn = static_cast<uint64_t>(in.elements[c]) * 4;
    peak = std::max(peak, held + drawn);
    const uint64_t built =
        all_params > 0
            ? static_cast<uint64_t>(double(in.built_bytes) * double(in.param_bytes(c)) / double(all_params))
            : 0;
    held -= std::min(held, built);
  }
  plan->host_construction_bytes = peak;
  plan->host_bytes = std::max(plan->host_steady_bytes, plan->host_construction_bytes);
  plan->disk_bytes = plan->disk_optimizer_bytes + plan->disk_grad_bytes;
  const uint64_t grad_moves = static_cast<uint64_t>(std::max(in.micro_batches, 1));
  plan->disk_read_bytes_per_step = plan->disk_optimizer_bytes + grad_moves * plan->disk_grad_bytes;
  plan->disk_write_bytes_per_step = plan->disk_read_bytes_per_step;
}

// Exposed disk traffic per byte of host memory a payload on disk frees:
// optimizer states are read and written in the update (2); gradients are
// read by the update and, before each later micro-batch, written and read
// back (2M - 1).
uint64_t GradCostPerByte(const TierInput& in) { return 2 * static_cast<uint64_t>(std::max(in.micro_batches, 1)) - 1; }
constexpr uint64_t kOptimizerCostPerByte = 2;

// Disk time a step cannot hide, as bytes: the payloads on disk at their
// cost per byte (above); each slice of each region moved is a request.
uint64_t ExposedDiskCost(const TierInput& in, const TierPlan& plan) {
  uint64_t requests = 0;
  for (size_t c = 0; c < in.elements.size(); ++c) {
    if (plan.slice_elements[c] == 0) continue;
    const uint64_t slices =
        static_cast<uint64_t>((in.elements[c] + plan.slice_elements[c] - 1) / plan.slice_elements[c]);
    if (plan.optimizer_tier[c] == Tier::kDisk) {
      requests += kOptimizerCostPerByte * slices * static_cast<uint64_t>(in.optimizer_regions());
    }
    if (plan.grad_tier[c] == Tier::kDisk) requests += GradCostPerByte(in) * slices;
  }
  return kOptimizerCostPerByte * plan.disk_optimizer_bytes + GradCostPerByte(in) * plan.disk_grad_bytes +
         requests * kDiskRequestCostBytes;
}

TierPlan AllOnHost(const TierInput& in) {
  TierPlan plan;
  plan.optimizer_tier.assign(in.elements.size(), Tier::kHost);
  plan.grad_tier.assign(in.elements.size(), Tier::kHost);
  HostNeeds(in, kDiskSliceBytes, &plan);
  return plan;
}

}  // namespace

std::vector<int64_t> ShardChunks(std::vector<int64_t>* capacity, int64_t shards) {
  std::vector<int64_t> shard;
  for (int64_t& c : *capacity) {
    const int64_t on_blocks = RoundUp(c, shards * kDiskSliceQuantum);
    c = shards == 1 || (on_blocks - c) * 4 > on_blocks ? RoundUp(c, shards) : on_blocks;
    shard.push_back(c / shards);
  }
  return shard;
}

TierPlan PlanTiers(const TierInput& in) {
  const size_t chunks = in.elements.size();
  TierPlan plan = AllOnHost(in);
  const auto host_fits = [&](const TierPlan& p) {
    return in.host_limit_bytes == 0 || p.host_bytes <= in.host_limit_bytes;
  };
  if (!host_fits(plan) && in.disk_limit_bytes > 0) {
    // The cheaper payload per byte freed first (gradients without
    // accumulation, optimizer states with it), the largest chunk first, then
    // the other. In a small model the staging slots can be sized by the
    // largest chunk on disk, so a cap on the states that may go there trades
    // staging for states kept: for each cap (none, or each state's size)
    // move what it allows until the host fits, and keep the feasible plan
    // with the least exposed disk traffic. With no feasible cap, the plan
    // that needs the least host memory shows how far off the budget is.
    const bool grads_first = GradCostPerByte(in) <= kOptimizerCostPerByte;
    std::vector<size_t> order(chunks);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return in.elements[a] > in.elements[b]; });
    std::vector<uint64_t> caps = {0};
    for (size_t c : order) caps.push_back(in.optimizer_bytes(c));
    TierPlan best, least = plan;
    bool found = false;
    // Larger slices first: on equal cost the larger disk requests win.
    for (uint64_t slice = kDiskSliceBytes; slice >= kDiskMinSliceBytes; slice /= 2) {
      for (uint64_t cap : caps) {
        TierPlan trial = AllOnHost(in);
        const auto move_grads = [&] {
          for (size_t c : order) {
            if (host_fits(trial)) break;
            if (!in.disk_aligned(c)) continue;
            trial.grad_tier[c] = Tier::kDisk;
            HostNeeds(in, slice, &trial);
          }
        };
        const auto move_states = [&] {
          for (size_t c : order) {
            if (host_fits(trial)) break;
            if (in.optimizer_bytes(c) > cap || !in.disk_aligned(c)) continue;
            trial.optimizer_tier[c] = Tier::kDisk;
            HostNeeds(in, slice, &trial);
          }
        };
        if (grads_first) {
          move_grads();
          move_states();
        } else {
          move_states();
          move_grads();
        }
        if (trial.host_bytes < least.host_bytes) least = trial;
        if (host_fits(trial) && (!found || ExposedDiskCost(in, trial) < ExposedDiskCost(in, best))) {
          best = trial;
          found = true;
        }
      }
    }
    plan = found ? std::move(best) : std::move(least);
  }
  const bool disk_fits = plan.disk_bytes <= in.disk_limit_bytes || plan.disk_bytes == 0;
  plan.feasible = host_fits(plan) && disk_fits;
  if (plan.feasible) return plan;

  uint64_t params = 0, grads = 0, states = 0;
  for (size_t c = 0; c < chunks; ++c) {
    params += in.param_bytes(c);
    grads += in.grad_bytes(c);
    states += in.optimizer_bytes(c);
  }
  std::string what = "memory: the model's data does not fit: " + BytesText(params) + " of weights, " +
                     BytesText(grads) + " of gradients and " + BytesText(states) + " of optimizer states";
  const std::string disk_limit =
      in.disk_limit_is_free_space
          ? BytesText(in.disk_limit_bytes) + " the disk tier may take (9/10 of the free space under " + in.disk_dir +
                "; memory.disk_budget is unset)"
          : BytesText(in.disk_limit_bytes) + " of memory.disk_budget";
  if (!host_fits(plan)) {
    if (in.disk_limit_bytes > 0) {
      what += "; even with the gradients of " + std::to_string(plan.grad_chunks_on_disk()) +
              " and the optimizer states of " + std::to_string(plan.optimizer_chunks_on_disk()) + " of " +
              std::to_string(chunks) + " chunks on disk the host needs " + BytesText(plan.host_bytes) + " (" +
              BytesText(plan.host_steady_bytes - plan.staging_bytes) + " of weights, gradients and states kept, " +
              BytesText(plan.staging_bytes) + " of disk staging; " + BytesText(plan.host_construction_bytes) +
              " while the model is built)";
    } else if (!in.disk_dir.empty()) {
      what += "; the host needs " + BytesText(plan.host_bytes) + " and the disk tier under " + in.disk_dir +
              " has no room (" + (in.disk_limit_is_free_space ? "its file system is full" : "memory.disk_budget is 0") +
              ")";
    } else {
      what += "; the host needs " + BytesText(plan.host_bytes) + " and there is no disk tier";
    }
    what += ", more than the " + BytesText(in.host_limit_bytes) + " of memory.host_budget. Raise memory.host_budget, ";
    if (in.disk_dir.empty()) {
      what += "give the job a disk tier (memory.disk_dir), ";
    } else if (in.disk_limit_bytes == 0) {
      what += "free space under " + in.disk_dir + " or choose another memory.disk_dir, ";
    }
    what += "or choose a smaller model";
  } else {
    what += "; the disk tier needs " + BytesText(plan.disk_bytes) +
            " for the gradients and optimizer states that do not fit " + BytesText(in.host_limit_bytes) +
            " of memory.host_budget, more than the " + disk_limit +
            ". Raise memory.disk_budget or free space under memory.disk_dir" +
            (in.disk_dir.empty() ? std::string() : " (" + in.disk_dir + ")") +
            ", raise memory.host_budget, or choose a smaller model";
  }
  plan.problem = what;
  return plan;
}

uint64_t DefaultHostBudgetBytes(uint64_t host_memory_bytes, uint64_t device_in_host_bytes) {
  const uint64_t rest = host_memory_bytes > device_in_host_bytes ? host_memory_bytes - device_in_host_bytes : 0;
  // Three quarters of what remains: the rest of the process and the page
  // cache need room too.
  return rest / 4 * 3;
}

uint64_t DefaultDiskBudgetBytes(uint64_t free_disk_bytes) {
  // Nine tenths: a disk filled to the last block fails everything else on
  // it too.
  return free_disk_bytes / 10 * 9;
}

}  // namespace ferry
