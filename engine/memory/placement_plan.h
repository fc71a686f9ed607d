#pragma once

// Where each chunk's data lives in the steady state of a step, and whether
// the step then fits the device. No LibTorch: tests drive it with made-up
// traces, the chunk manager with the warm-up's.
//
// A step is a cycle of periods: the forward of each stage, the backward of
// each stage in reverse, then the optimizer. A chunk's parameters (P) are
// needed on the device in the forward and backward periods of the stages
// using it, its gradients (G) from its first backward use to its last, and
// its optimizer states (O, two values per element) where the optimizer runs.
// A gradient whose chunk is used by backward periods far apart (a tied
// embedding: the head's backward comes first, the embeddings' last) may go
// to the host between its uses and come back for the next: the plan
// releases such gradients, the largest first, only where the step would not
// fit otherwise, and counts the copies (the runtime's farthest-next-use
// eviction sends them: placement_policy.h).
//
// Each chunk gets one of three classes:
//   kStreamed      P fetched when needed and evictable; G sent to the host
//                  after its last use; O and the master P on the host.
//   kPinnedParams  as kStreamed, but P stays on the device the whole step
//                  (ZeRO-Offload's split): P refreshed after each host update.
//   kDeviceHomed   P, G and O all stay on the device; the optimizer runs there
//                  and nothing moves.
// Per byte of device memory, pinning P saves the most traffic (4 B saved for
// 4 B: no re-fetch in backward), homing on the device next (8 more bytes saved
// for 12 more bytes), so the auto plan upgrades chunks in that order while
// every period still fits.

#include <cstdint>
#include <string>
#include <vector>

namespace ferry {

enum class ChunkClass { kStreamed, kPinnedParams, kDeviceHomed };

const char* ChunkClassName(ChunkClass c);

struct PlanInput {
  // Device bytes the plan may fill: capacity less the safety margin.
  uint64_t limit_bytes = 0;
  // Per period (forward periods, backward periods, then the optimizer):
  // memory that is not model data (activations, workspace), as measured in
  // warm-up.
  std::vector<uint64_t> non_model_bytes;
  // Per period: the chunks whose parameters it computes with.
  std::vector<std::vector<int>> period_chunks;
  // How many of the periods are forward periods and backward periods; the
  // last period is the optimizer.
  int forward_periods = 0;
  int backward_periods = 0;
  // Gradient accumulation: the forward and backward periods run once per
  // micro-batch before the optimizer, and a device-homed chunk's gradients
  // stay on the device through the later micro-batches' forward periods, so
  // they count in every period. (Other chunks' gradients go to the host
  // after each micro-batch's last use, as after a whole step's.)
  bool accumulates = false;
  // Per chunk: bytes of its parameters.
  std::vector<uint64_t> param_bytes;
  // Per chunk: bytes of its gradients (empty: as large as its parameters),
  // of its optimizer states (empty: twice its parameters, fp32's two
  // moments; in mixed precision the fp32 masters make them six times
  // 2-byte parameters), and of the temporaries an update on the device
  // allocates (empty: as large as its parameters).
  std::vector<uint64_t> grad_bytes;
  std::vector<uint64_t> optimizer_bytes;
  std::vector<uint64_t> update_temp_bytes;

  uint64_t grad(size_t c) const { return grad_bytes.empty() ? param_bytes[c] : grad_bytes[c]; }
  uint64_t optimizer(size_t c) const { return optimizer_bytes.empty() ? 2 * param_bytes[c] : optimizer_bytes[c]; }
  uint64_t update_temp(size_t c) const { return update_temp_bytes.empty() ? param_bytes[c] : update_temp_bytes[c]; }
};

struct Plan {
  std::vector<ChunkClass> classes;
  // Predicted device bytes in use per period, the binding one, and whether
  // every period fits limit_bytes.
  std::vector<uint64_t> need_bytes;
  int binding_period = 0;
  bool feasible = false;
  // The binding period's need (0 for no periods).
  uint64_t binding_need() const {
    return need_bytes.empty() ? 0 : need_bytes[static_cast<size_t>(binding_period)];
  }
  // Bytes moved between host and device per steady step, as planned.
  uint64_t traffic_bytes = 0;
  // Per chunk (empty: none): its gradients go to the host between backward
  // uses that are not adjacent periods, and come back.
  std::vector<bool> grads_released;
};

// Device bytes each period needs under `classes`, with the gradients of the
// chunks `released` names (Plan::grads_released) off the device between
// their backward uses.
std::vector<uint64_t> PeriodNeeds(const PlanInput& input, const std::vector<ChunkClass>& classes,
                                  const std::vector<bool>& released = {});

// Predicted traffic between host and device per steady step: kStreamed P in
// for the forward and again for the backward, G out; kPinnedParams P in
// (after its host update) and G out; kDeviceHomed nothing. A released
// gradient goes out and back once for each gap between its uses.
uint64_t PlannedTraffic(const PlanInput& input, const std::vector<ChunkClass>& classes,
                        const std::vector<bool>& released = {});

// Evaluates `classes` (and `released`) against the input.
Plan EvaluatePlan(const PlanInput& input, std::vector<ChunkClass> classes, std::vector<bool> released = {});

// Per chunk: whether backward periods that do not use it come between its
// first and last backward use.
std::vector<bool> GradientsWithGaps(const PlanInput& input);

// The least any step needs of the device: every chunk streamed, every
// gradient with gaps released.
Plan PlanLeast(const PlanInput& input);

// The auto plan: every chunk streamed (gradients released as far as needed
// to fit), then upgraded greedily (largest chunk first) to kPinnedParams,
// then to kDeviceHomed, keeping every period within limit_bytes.
// Infeasible only if even PlanLeast does not fit.
Plan PlanAuto(const PlanInput& input);

// The static plan: the first (1 - optimizer_host_fraction) of the chunks are
// device-homed; of the rest, the first (1 - param_host_fraction) of all
// chunks keep their parameters pinned and the others are streamed. The
// default (0, 1) is ZeRO-Offload's split: every P pinned, every O on host.
Plan PlanStatic(const PlanInput& input, double param_host_fraction, double optimizer_host_fraction);

}  // namespace ferry
