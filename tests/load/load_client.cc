// A load generator for ferryd: measures a training job's throughput in
// alternating windows, alone and while many watchers follow it and a steady
// stream of submits, gets, lists and cancels goes on beside it. Checks that nothing crashes,
// that every watcher sees every event of the job in order to its end, and
// that the daemon's memory stays bounded. The throughput ratio is measured
// and reported, never checked: on a shared 2-core machine its run-to-run
// spread is wider than the daemon's cost. Prints a table and writes JSON;
// exits 1 when a check fails.
//
//   load_client --address=HOST:PORT --daemon_pid=PID [--watchers=200]
//               [--seconds=60] [--ops_per_second=20] [--json_out=FILE]

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "ferry/v1/ferry.grpc.pb.h"

ABSL_FLAG(std::string, address, "127.0.0.1:50051", "ferryd's gRPC address.");
ABSL_FLAG(int, daemon_pid, 0, "ferryd's pid, for its memory.");
ABSL_FLAG(int, watchers, 200, "Concurrent WatchJob streams on the measured job.");
ABSL_FLAG(double, seconds, 60, "How long each job is measured.");
ABSL_FLAG(double, ops_per_second, 20, "Submits, gets, lists and cancels per second beside the watchers.");
ABSL_FLAG(double, max_rss_growth_mib, 64, "The daemon may grow by at most this much under load.");
ABSL_FLAG(std::string, json_out, "", "Write the figures here as JSON.");

namespace {

using ferry::v1::Ferry;
using ferry::v1::Job;
using ferry::v1::JobEvent;

ferry::v1::JobSpec TrainingSpec(const std::string& name) {
  ferry::v1::JobSpec spec;
  spec.set_name(name);
  // The demo's model: a few steps a second here, as a real job reports far
  // less often than a toy one.
  spec.mutable_model()->set_preset("gpt2-tiny");
  spec.mutable_data()->mutable_synthetic();
  spec.mutable_train()->set_steps(1000000);
  spec.mutable_train()->set_batch_size(8);
  spec.mutable_train()->set_threads(1);
  return spec;
}

uint64_t DaemonRssBytes(int pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      uint64_t kib = 0;
      std::string digits;
      for (char c : line) {
        if (c >= '0' && c <= '9') digits.push_back(c);
      }
      if (absl::SimpleAtoi(digits, &kib)) return kib * 1024;
    }
  }
  return 0;
}

bool Ok(const grpc::Status& s, const char* what, std::atomic<int>* errors) {
  if (s.ok()) return true;
  std::fprintf(stderr, "%s: %d %s\n", what, static_cast<int>(s.error_code()), s.error_message().c_str());
  ++*errors;
  return false;
}

Job Get(Ferry::Stub& stub, const std::string& id) {
  grpc::ClientContext ctx;
  ferry::v1::GetJobRequest request;
  request.set_job_id(id);
  Job job;
  (void)stub.GetJob(&ctx, request, &job);
  return job;
}

std::string Submit(Ferry::Stub& stub, const ferry::v1::JobSpec& spec, std::atomic<int>* errors) {
  grpc::ClientContext ctx;
  ferry::v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  Job job;
  if (!Ok(stub.SubmitJob(&ctx, request, &job), "SubmitJob", errors)) return "";
  return job.id();
}

void Cancel(Ferry::Stub& stub, const std::string& id, std::atomic<int>* errors) {
  grpc::ClientContext ctx;
  ferry::v1::CancelJobRequest request;
  request.set_job_id(id);
  Job job;
  Ok(stub.CancelJob(&ctx, request, &job), "CancelJob", errors);
}

// Waits until the job has made progress and returns it.
Job WaitForSteps(Ferry::Stub& stub, const std::string& id, uint64_t steps) {
  for (int i = 0; i < 1200; ++i) {
    Job job = Get(stub, id);
    if (job.progress().step() >= steps) return job;
    absl::SleepFor(absl::Milliseconds(100));
  }
  return Get(stub, id);
}

bool IsEnded(ferry::v1::JobState s) {
  return s == ferry::v1::JOB_STATE_SUCCEEDED || s == ferry::v1::JOB_STATE_FAILED ||
         s == ferry::v1::JOB_STATE_CANCELLED;
}


// Training in the windows of one kind, as the job's progress tells it.
struct Throughput {
  double tokens = 0;
  double seconds = 0;
  uint64_t steps = 0;

  // Adds the window between two answers of GetJob.
  void Add(const Job& from, const Job& to) {
    tokens += static_cast<double>(to.progress().tokens() - from.progress().tokens());
    seconds += to.progress().elapsed_seconds() - from.progress().elapsed_seconds();
    steps += to.progress().step() - from.progress().step();
  }
  double tokens_per_second() const { return seconds > 0 ? tokens / seconds : 0; }
};


struct WatcherResult {
  uint64_t events = 0;
  uint64_t gaps = 0;
  uint64_t heartbeats = 0;
  bool saw_end = false;
  grpc::Status status;
};

// Follows the job until it ends, or until `ctx` is cancelled (the end of a
// watched window before the last).
void Watch(std::shared_ptr<grpc::Channel> channel, const std::string& id, grpc::ClientContext* context,
           WatcherResult* out) {
  std::unique_ptr<Ferry::Stub> stub = Ferry::NewStub(channel);
  grpc::ClientContext& ctx = *context;
  ferry::v1::WatchJobRequest request;
  request.set_job_id(id);
  std::unique_ptr<grpc::ClientReader<JobEvent>> reader = stub->WatchJob(&ctx, request);
  JobEvent event;
  uint64_t last = 0;
  bool first = true;
  while (reader->Read(&event)) {
    if (event.has_heartbeat()) {
      ++out->heartbeats;
      continue;
    }
    if (first) {
      first = false;
      last = event.seq();  // the snapshot
      continue;
    }
    ++out->events;
    if (event.seq() != last + 1) ++out->gaps;
    last = event.seq();
    if (event.has_state_change() && IsEnded(event.state_change().to())) out->saw_end = true;
  }
  out->status = reader->Finish();
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string address = absl::GetFlag(FLAGS_address);
  const int pid = absl::GetFlag(FLAGS_daemon_pid);
  const int watchers = absl::GetFlag(FLAGS_watchers);
  const absl::Duration window = absl::Seconds(absl::GetFlag(FLAGS_seconds));
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  // Watchers spread over a few connections, as separate clients would be.
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < 8; ++i) {
    grpc::ChannelArguments a = args;
    a.SetInt("ferry.load.channel", i);  // distinct channels, not one shared subchannel
    channels.push_back(grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), a));
  }
  std::unique_ptr<Ferry::Stub> stub = Ferry::NewStub(channels[0]);
  std::atomic<int> errors{0};

  // One job, measured in alternating windows: unwatched, then watched with
  // the traffic beside it, twice. The same process in the same run on both
  // sides, so the ratio is the watchers' and callers' cost, not the
  // difference between two runs.
  const std::string id = Submit(*stub, TrainingSpec("measured"), &errors);
  if (id.empty()) return 1;
  WaitForSteps(*stub, id, 5);  // past the warm-up
  const absl::Duration half = window / 2;
  const uint64_t rss_before = DaemonRssBytes(pid);
  uint64_t rss_max = rss_before;
  Throughput base, watched;
  std::vector<WatcherResult> results(static_cast<size_t>(watchers));
  std::atomic<uint64_t> ops{0};
  const int rounds = 2;
  for (int round = 0; round < rounds; ++round) {
    const bool last_round = round + 1 == rounds;
    std::fprintf(stderr, "round %d: %.0f s unwatched, then %.0f s with %d watchers and %.0f calls/s\n", round + 1,
                 absl::ToDoubleSeconds(half), absl::ToDoubleSeconds(half), watchers,
                 absl::GetFlag(FLAGS_ops_per_second));
    Job a = Get(*stub, id);
    absl::SleepFor(half);
    base.Add(a, Get(*stub, id));

    std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
    std::vector<WatcherResult> round_results(static_cast<size_t>(watchers));
    std::vector<std::thread> threads;
    for (int i = 0; i < watchers; ++i) {
      contexts.push_back(std::make_unique<grpc::ClientContext>());
      threads.emplace_back(Watch, channels[static_cast<size_t>(i) % channels.size()], id, contexts.back().get(),
                           &round_results[static_cast<size_t>(i)]);
    }
    std::atomic<bool> stop{false};
    std::thread traffic([&] {
      const absl::Duration every = absl::Seconds(1.0 / std::max(0.1, absl::GetFlag(FLAGS_ops_per_second)));
      ferry::v1::JobSpec queued = TrainingSpec("queued");
      queued.mutable_train()->set_steps(10);
      for (uint64_t n = 0; !stop.load(); ++n) {
        const absl::Time next = absl::Now() + every;
        switch (n % 4) {
          case 0: {  // queued behind the running job, then cancelled
            const std::string queued_id = Submit(*stub, queued, &errors);
            if (!queued_id.empty()) Cancel(*stub, queued_id, &errors);
            break;
          }
          case 1: {
            grpc::ClientContext ctx;
            ferry::v1::GetJobRequest r;
            r.set_job_id(id);
            Job job;
            Ok(stub->GetJob(&ctx, r, &job), "GetJob", &errors);
            break;
          }
          case 2: {
            grpc::ClientContext ctx;
            ferry::v1::ListJobsRequest r;
            r.set_page_size(50);
            ferry::v1::ListJobsResponse page;
            Ok(stub->ListJobs(&ctx, r, &page), "ListJobs", &errors);
            break;
          }
          default: {
            grpc::ClientContext ctx;
            ferry::v1::GetDaemonInfoRequest r;
            ferry::v1::DaemonInfo info;
            Ok(stub->GetDaemonInfo(&ctx, r, &info), "GetDaemonInfo", &errors);
          }
        }
        ++ops;
        if (next > absl::Now()) absl::SleepFor(next - absl::Now());
      }
    });
    std::thread sampler([&] {
      while (!stop.load()) {
        rss_max = std::max(rss_max, DaemonRssBytes(pid));
        absl::SleepFor(absl::Milliseconds(500));
      }
    });
    absl::SleepFor(absl::Seconds(1));  // every watcher has its snapshot
    Job c = Get(*stub, id);
    absl::SleepFor(half);
    watched.Add(c, Get(*stub, id));
    stop.store(true);
    traffic.join();
    sampler.join();
    if (last_round) {
      Cancel(*stub, id, &errors);  // the watchers follow the job to its end
    } else {
      for (auto& ctx : contexts) ctx->TryCancel();
    }
    for (std::thread& t : threads) t.join();
    for (size_t i = 0; i < results.size(); ++i) {
      WatcherResult& r = results[i];
      const WatcherResult& now = round_results[i];
      r.events += now.events;
      r.gaps += now.gaps;
      r.heartbeats += now.heartbeats;
      if (last_round) {
        r.saw_end = now.saw_end;
        r.status = now.status;
      }
    }
  }
  const uint64_t rss_after = DaemonRssBytes(pid);

  // 3. Checks.
  uint64_t gaps = 0, unfinished = 0, failed_streams = 0, fewest = UINT64_MAX, most = 0;
  for (const WatcherResult& r : results) {
    gaps += r.gaps;
    if (!r.saw_end) ++unfinished;
    if (!r.status.ok()) ++failed_streams;
    fewest = std::min(fewest, r.events);
    most = std::max(most, r.events);
  }
  const double ratio = base.tokens_per_second() > 0 ? watched.tokens_per_second() / base.tokens_per_second() : 0;
  const double growth_mib = (static_cast<double>(rss_max) - static_cast<double>(rss_before)) / (1 << 20);
  const bool alive = pid <= 0 || DaemonRssBytes(pid) > 0;
  std::printf("%-44s %s\n", "check", "figure");
  std::printf("%-44s %.0f tok/s (%llu steps)\n", "throughput, unwatched windows", base.tokens_per_second(),
              static_cast<unsigned long long>(base.steps));
  std::printf("%-44s %.0f tok/s (%llu steps), %.3fx\n", "throughput, watched windows with traffic",
              watched.tokens_per_second(), static_cast<unsigned long long>(watched.steps), ratio);
  std::printf("%-44s %d watchers, %llu-%llu events each, %llu gaps, %llu without the end, %llu failed\n",
              "watchers", watchers, static_cast<unsigned long long>(fewest), static_cast<unsigned long long>(most),
              static_cast<unsigned long long>(gaps), static_cast<unsigned long long>(unfinished),
              static_cast<unsigned long long>(failed_streams));
  std::printf("%-44s %llu calls, %d errors\n", "submits, cancels, gets, lists, info",
              static_cast<unsigned long long>(ops.load()), errors.load());
  std::printf("%-44s %.1f MiB before, %.1f MiB peak, %.1f MiB after (+%.1f MiB)\n", "daemon resident memory",
              rss_before / 1048576.0, rss_max / 1048576.0, rss_after / 1048576.0, growth_mib);
  if (!absl::GetFlag(FLAGS_json_out).empty()) {
    std::ofstream(absl::GetFlag(FLAGS_json_out)) << absl::StrFormat(
        "{\"watchers\": %d, \"seconds\": %.0f, \"ops\": %d, \"op_errors\": %d,\n"
        " \"unwatched_tokens_per_second\": %.1f, \"watched_tokens_per_second\": %.1f, \"throughput_ratio\": %.4f,\n"
        " \"event_gaps\": %d, \"watchers_without_end\": %d, \"failed_streams\": %d, \"events_per_watcher_min\": %d,\n"
        " \"daemon_rss_before_bytes\": %d, \"daemon_rss_peak_bytes\": %d, \"daemon_rss_after_bytes\": %d}\n",
        watchers, absl::ToDoubleSeconds(window), ops.load(), errors.load(), base.tokens_per_second(),
        watched.tokens_per_second(), ratio, gaps, unfinished, failed_streams, fewest, rss_before, rss_max, rss_after);
  }
  bool ok = true;
  auto check = [&ok](bool good, const std::string& what) {
    if (!good) {
      std::printf("FAIL: %s\n", what.c_str());
      ok = false;
    }
  };
  check(alive, "the daemon died");
  check(errors.load() == 0, "calls failed");
  check(gaps == 0, "a watcher missed events");
  check(unfinished == 0 && failed_streams == 0, "a watcher did not see the job end");
  check(fewest > 0, "a watcher received nothing");
  check(growth_mib <= absl::GetFlag(FLAGS_max_rss_growth_mib),
        absl::StrFormat("the daemon grew by %.1f MiB", growth_mib));
  return ok ? 0 : 1;
}
