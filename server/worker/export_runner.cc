#include "server/worker/export_runner.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "server/common/files.h"
#include "server/worker/subprocess.h"

namespace ferry {
namespace {

// ferry-worker's exit code for bad usage (worker.h's kWorkerBadUsage).
constexpr int kBadUsage = 2;
// The largest safetensors header read for a summary.
constexpr uint64_t kMaxHeaderBytes = 100 << 20;

std::atomic<uint64_t> g_exports{0};

}  // namespace

absl::StatusOr<ExportedWeights> ReadSafetensorsSummary(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  unsigned char size_bytes[8];
  if (!in.read(reinterpret_cast<char*>(size_bytes), 8)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a safetensors file (shorter than 8 bytes)"));
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | size_bytes[i];
  if (n > kMaxHeaderBytes) return absl::InvalidArgumentError(absl::StrCat(path, ": header of ", n, " bytes"));
  std::string header(static_cast<size_t>(n), '\0');
  if (!in.read(&header[0], static_cast<std::streamsize>(n))) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": truncated header"));
  }
  google::protobuf::Struct parsed;
  if (!google::protobuf::util::JsonStringToMessage(header, &parsed).ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": the header is not JSON"));
  }
  ExportedWeights summary;
  summary.path = path;
  in.seekg(0, std::ios::end);
  summary.bytes = static_cast<uint64_t>(in.tellg());
  for (const auto& [name, value] : parsed.fields()) {
    if (name != "__metadata__") {
      ++summary.tensors;
      continue;
    }
    auto step = value.struct_value().fields().find("step");
    if (step != value.struct_value().fields().end()) (void)absl::SimpleAtoi(step->second.string_value(), &summary.step);
  }
  return summary;
}

namespace {

// A folder export's summary: its files in name order (weights first, as
// their names sort), their sizes, and the tensors and step of its weights.
absl::StatusOr<ExportedWeights> ReadFolderSummary(const std::string& dir) {
  ExportedWeights summary;
  summary.path = dir;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return absl::InternalError(absl::StrCat("cannot read ", dir, ": ", std::strerror(errno)));
  std::vector<std::string> names;
  while (const dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    const std::string path = dir + "/" + name;
    struct stat st;
    if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      return absl::InternalError(absl::StrCat(path, " is not a file"));
    }
    if (absl::EndsWith(name, ".safetensors")) {
      absl::StatusOr<ExportedWeights> part = ReadSafetensorsSummary(path);
      if (!part.ok()) return part.status();
      summary.tensors += part->tensors;
      summary.step = part->step;
    }
    summary.files.push_back(name);
    summary.file_bytes.push_back(static_cast<uint64_t>(st.st_size));
    summary.bytes += static_cast<uint64_t>(st.st_size);
  }
  if (summary.tensors == 0) return absl::InternalError(absl::StrCat(dir, " holds no weights"));
  return summary;
}

}  // namespace

void RemoveExport(const ExportedWeights& exported) { RemoveFileOrFolder(exported.path); }

absl::StatusOr<ExportedWeights> RunWorkerExport(const std::string& worker_binary, const std::string& job_dir,
                                                const ferry::v1::JobSpec& spec,
                                                const std::function<bool()>& cancelled,
                                                const std::string& allowed_roots, bool folder) {
  if (absl::Status s = MakeDirs(job_dir); !s.ok()) return s;
  const std::string base =
      absl::StrCat(job_dir, "/export-", absl::ToUnixMicros(absl::Now()), "-", g_exports.fetch_add(1));
  const std::string spec_path = base + ".spec.json";
  const std::string log_path = base + ".log";
  const std::string out_path = base + (folder ? ".folder" : ".safetensors");
  struct Cleanup {
    std::string spec, log;
    ~Cleanup() {
      unlink(spec.c_str());
      unlink(log.c_str());
    }
  } cleanup{spec_path, log_path};
  {
    std::string json;
    google::protobuf::util::JsonPrintOptions print;
    print.preserve_proto_field_names = true;
    if (!google::protobuf::util::MessageToJsonString(spec, &json, print).ok()) {
      return absl::InternalError("cannot write the job's spec as JSON");
    }
    if (absl::Status s = WriteFileAtomically(spec_path, json); !s.ok()) return s;
  }
  const int log = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log < 0) return absl::InternalError(absl::StrCat("cannot open ", log_path, ": ", std::strerror(errno)));
  const int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
  std::vector<std::string> argv = {worker_binary, "--export=" + out_path, "--spec=" + spec_path, "--device=cpu"};
  if (!allowed_roots.empty()) argv.push_back("--allowed_roots=" + allowed_roots);
  absl::StatusOr<pid_t> pid = Spawn(argv, {{null >= 0 ? null : log, 0}, {log, 1}, {log, 2}});
  close(log);
  if (null >= 0) close(null);
  if (!pid.ok()) return absl::InternalError(std::string(pid.status().message()));
  int wait_status = 0;
  for (;;) {
    const pid_t done = waitpid(*pid, &wait_status, WNOHANG);
    if (done == *pid) break;
    if (done < 0 && errno != EINTR) return absl::InternalError(absl::StrCat("waitpid: ", std::strerror(errno)));
    if (cancelled && cancelled()) {
      kill(-*pid, SIGKILL);
      while (waitpid(*pid, &wait_status, 0) < 0 && errno == EINTR) {
      }
      RemoveFileOrFolder(out_path);
      return absl::CancelledError("the export was cancelled");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0) {
    absl::StatusOr<ExportedWeights> summary = folder ? ReadFolderSummary(out_path) : ReadSafetensorsSummary(out_path);
    if (!summary.ok()) {
      RemoveFileOrFolder(out_path);
      return absl::InternalError(absl::StrCat("ferry-worker --export wrote a bad file: ", summary.status().message()));
    }
    return summary;
  }
  RemoveFileOrFolder(out_path);
  const std::string tail = FileTail(log_path, 1, 4096);
  if (WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == kBadUsage) {
    return absl::FailedPreconditionError(std::string(absl::StripPrefix(tail, "ferry-worker: ")));
  }
  return absl::InternalError(absl::StrCat("ferry-worker --export ", DescribeWaitStatus(wait_status), ": ",
                                          FileTail(log_path, 5, 4096)));
}

}  // namespace ferry
