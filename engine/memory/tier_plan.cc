#include "engine/memory/tier_plan.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

namespace ferry {
namespace {

std::string Size(uint64_t bytes) { return BytesText(bytes); }

}  // namespace

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

namespace {

// The host side's needs under `tiers`: steady (every chunk's parameters and
// gradients, the optimizer states kept on the host, the staging buffers) and
// at its peak during construction.
void HostNeeds(const TierInput& in, const std::vector<Tier>& tiers, TierPlan* plan) {
  uint64_t steady = 0, largest_disk = 0, disk = 0, on_host_states = 0;
  for (size_t c = 0; c < tiers.size(); ++c) {
    steady += in.param_bytes[c] + in.grad_bytes[c];
    if (tiers[c] == Tier::kDisk) {
      largest_disk = std::max(largest_disk, AlignToDisk(in.optimizer_bytes[c]));
      disk += AlignToDisk(in.optimizer_bytes[c]);
    } else {
      on_host_states += in.optimizer_bytes[c];
    }
  }
  plan->staging_bytes = disk > 0 ? kDiskStagingBuffers * largest_disk : 0;
  plan->host_steady_bytes = steady + on_host_states + plan->staging_bytes;
  // Construction fills each chunk's parameters (and, with the masters, its
  // host-kept states) before the values it was built from are freed; the
  // gradients come later.
  uint64_t all_params = 0;
  for (uint64_t p : in.param_bytes) all_params += p;
  uint64_t held = in.construction_bytes + plan->staging_bytes;
  uint64_t peak = held;
  for (size_t c = 0; c < tiers.size(); ++c) {
    held += in.param_bytes[c];
    if (in.masters_with_optimizer && tiers[c] == Tier::kHost) held += in.optimizer_bytes[c];
    peak = std::max(peak, held);
    const uint64_t built = all_params > 0 ? static_cast<uint64_t>(double(in.construction_bytes) *
                                                                  double(in.param_bytes[c]) / double(all_params))
                                          : 0;
    held -= std::min(held, built);
  }
  plan->host_construction_bytes = peak;
  plan->host_bytes = std::max(plan->host_steady_bytes, plan->host_construction_bytes);
  plan->disk_bytes = disk;
  plan->disk_read_bytes_per_step = disk;
  plan->disk_write_bytes_per_step = disk;
}

}  // namespace

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

TierPlan PlanTiers(const TierInput& in) {
  const size_t chunks = in.param_bytes.size();
  TierPlan plan;
  plan.optimizer_tier.assign(chunks, Tier::kHost);
  HostNeeds(in, plan.optimizer_tier, &plan);
  const auto host_fits = [&](const TierPlan& p) {
    return in.host_limit_bytes == 0 || p.host_bytes <= in.host_limit_bytes;
  };
  if (!host_fits(plan) && in.disk_limit_bytes > 0) {
    // The staging buffers are sized for the largest state on disk, so a
    // cap on what may go there trades staging for states kept: for each cap
    // (each state's size), move the largest states under it until the host
    // fits, and keep the feasible plan that puts the fewest bytes on disk
    // (the least traffic). With no feasible cap, the plan that needs the
    // least host memory shows how far off the budget is.
    std::vector<size_t> order(chunks);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return in.optimizer_bytes[a] > in.optimizer_bytes[b]; });
    TierPlan best, least = plan;
    bool found = false;
    for (size_t cap : order) {
      TierPlan trial;
      trial.optimizer_tier.assign(chunks, Tier::kHost);
      HostNeeds(in, trial.optimizer_tier, &trial);
      for (size_t c : order) {
        if (host_fits(trial)) break;
        if (in.optimizer_bytes[c] > in.optimizer_bytes[cap]) continue;
        trial.optimizer_tier[c] = Tier::kDisk;
        HostNeeds(in, trial.optimizer_tier, &trial);
      }
      if (trial.host_bytes < least.host_bytes) least = trial;
      if (host_fits(trial) && (!found || trial.disk_bytes < best.disk_bytes ||
                               (trial.disk_bytes == best.disk_bytes && trial.host_bytes < best.host_bytes))) {
        best = trial;
        found = true;
      }
    }
    plan = found ? std::move(best) : std::move(least);
  }
  const bool disk_fits = plan.disk_bytes <= in.disk_limit_bytes || plan.disk_bytes == 0;
  plan.feasible = host_fits(plan) && disk_fits;
  if (plan.feasible) return plan;

  uint64_t params = 0, grads = 0, states = 0;
  for (size_t c = 0; c < chunks; ++c) {
    params += in.param_bytes[c];
    grads += in.grad_bytes[c];
    states += in.optimizer_bytes[c];
  }
  std::string what = "memory: the model's data does not fit: " + Size(params) + " of weights, " + Size(grads) +
                     " of gradients and " + Size(states) + " of optimizer states";
  const std::string disk_limit =
      in.disk_limit_is_free_space
          ? Size(in.disk_limit_bytes) + " the disk tier may take (9/10 of the free space under " + in.disk_dir +
                "; memory.disk_budget is unset)"
          : Size(in.disk_limit_bytes) + " of memory.disk_budget";
  if (!host_fits(plan)) {
    int on_disk = 0;
    for (Tier t : plan.optimizer_tier) on_disk += t == Tier::kDisk ? 1 : 0;
    if (in.disk_limit_bytes > 0) {
      what += "; even with the optimizer states of " + std::to_string(on_disk) + " of " + std::to_string(chunks) +
              " chunks on disk the host needs " + Size(plan.host_bytes) + " (" +
              Size(plan.host_steady_bytes - plan.staging_bytes) + " of weights, gradients and states kept, " +
              Size(plan.staging_bytes) + " of disk staging buffers; " + Size(plan.host_construction_bytes) +
              " while the model is built)";
    } else if (!in.disk_dir.empty()) {
      what += "; the host needs " + Size(plan.host_bytes) + " and the disk tier under " + in.disk_dir +
              " has no room (" + (in.disk_limit_is_free_space ? "its file system is full" : "memory.disk_budget is 0") +
              ")";
    } else {
      what += "; the host needs " + Size(plan.host_bytes) + " and there is no disk tier";
    }
    what += ", more than the " + Size(in.host_limit_bytes) + " of memory.host_budget. Raise memory.host_budget, ";
    if (in.disk_dir.empty()) {
      what += "give the job a disk tier (memory.disk_dir), ";
    } else if (in.disk_limit_bytes == 0) {
      what += "free space under " + in.disk_dir + " or choose another memory.disk_dir, ";
    }
    what += "or choose a smaller model";
  } else {
    what += "; the disk tier needs " + Size(plan.disk_bytes) + " for the optimizer states that do not fit " +
            Size(in.host_limit_bytes) + " of memory.host_budget, more than the " + disk_limit +
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
