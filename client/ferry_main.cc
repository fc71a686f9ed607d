// ferry: the command line client of ferryd.

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/str_split.h"
#include "client/cli.h"
#include "server/common/version.h"

ABSL_FLAG(std::string, address, "", "ferryd's address (default $FERRY_ADDRESS, else 127.0.0.1:50051).");
ABSL_FLAG(std::string, o, "text", "Output: text or json.");
ABSL_FLAG(bool, wait, false, "submit: watch the job until it ends; exit 0 only if it succeeded.");
ABSL_FLAG(std::vector<std::string>, set, {}, "submit: FIELD=VALUE overrides of the job file.");
ABSL_FLAG(std::string, request_id, "", "submit: idempotency key (default: a fresh one).");
ABSL_FLAG(double, timeout, 10, "Seconds to wait for each answer.");
ABSL_FLAG(std::vector<std::string>, state, {}, "list: only jobs in these states.");
ABSL_FLAG(int, limit, 1000, "list: at most this many jobs.");
ABSL_FLAG(std::string, out, "", "data prepare: the token file to write.");
ABSL_FLAG(int, rank, 0, "memory: which rank of a parallel job.");
ABSL_FLAG(bool, version, false, "Print the version and exit.");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(ferry::CliUsage());
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_version)) {
    std::cout << "ferry " << ferry::kFerryVersion << "\n";
    return 0;
  }
  ferry::CliOptions options;
  options.address = absl::GetFlag(FLAGS_address);
  if (options.address.empty()) {
    const char* env = std::getenv("FERRY_ADDRESS");
    options.address = env != nullptr && *env ? env : "127.0.0.1:50051";
  }
  const std::string output = absl::GetFlag(FLAGS_o);
  if (output != "text" && output != "json") {
    std::cerr << "ferry: -o " << output << ": use text or json\n";
    return ferry::kExitUsage;
  }
  options.json = output == "json";
  options.wait = absl::GetFlag(FLAGS_wait);
  options.overrides = absl::GetFlag(FLAGS_set);
  options.request_id = absl::GetFlag(FLAGS_request_id);
  if (!(absl::GetFlag(FLAGS_timeout) > 0)) {
    std::cerr << "ferry: --timeout must be positive\n";
    return ferry::kExitUsage;
  }
  options.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout));
  options.states = absl::GetFlag(FLAGS_state);
  options.limit = absl::GetFlag(FLAGS_limit);
  options.out_path = absl::GetFlag(FLAGS_out);
  if (absl::GetFlag(FLAGS_rank) < 0) {
    std::cerr << "ferry: --rank must be 0 or more\n";
    return ferry::kExitUsage;
  }
  options.rank = absl::GetFlag(FLAGS_rank);
  const std::vector<std::string> args(positional.begin() + 1, positional.end());
  return ferry::RunCli(args, options, std::cout, std::cerr);
}
