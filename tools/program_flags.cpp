#include "tools/program_flags.h"

#include <algorithm>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <utility>
#include <vector>

#include <cstdio>

#include <gflags/gflags.h>
#include <glog/logging.h>

#include "kuiper/model/activation_dtype.h"

namespace kuiper {

namespace {

bool is_flag(const std::string& name, bool bool_only) {
  gflags::CommandLineFlagInfo info;
  return gflags::GetCommandLineFlagInfo(name.c_str(), &info) && (!bool_only || info.type == "bool");
}

}  // namespace

std::string gflags_spelling(const std::string& arg) {
  if (arg.size() < 2 || arg[0] != '-' || arg == "--") return arg;
  const size_t dashes = arg[1] == '-' ? 2 : 1;
  const size_t eq = std::min(arg.find('='), arg.size());
  std::string name = arg.substr(dashes, eq - dashes);
  std::replace(name.begin(), name.end(), '-', '_');
  const std::string value = arg.substr(eq);
  if (is_flag(name, false)) return "--" + name + value;
  // --no-NAME: gflags' --noNAME for a bool flag NAME.
  if (name.rfind("no_", 0) == 0 && is_flag(name.substr(3), true)) {
    return "--no" + name.substr(3) + value;
  }
  if (name.rfind("no", 0) == 0 && is_flag(name.substr(2), true)) return "--" + name + value;
  return arg;
}

bool start_program(int argc, char** argv, const std::string& usage) {
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  gflags::SetUsageMessage(usage);
  if (!asks_for_help(argc, argv)) return false;
  std::fputs(program_help().c_str(), stdout);
  return true;
}

bool asks_for_help(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") return false;
    if (arg == "--help" || arg == "-help" || arg == "-h" || arg == "--helpshort" ||
        arg == "-helpshort") {
      return true;
    }
    // A flag that takes a value, given without '=', takes the next argument whatever it is.
    const std::string spelled = gflags_spelling(arg);
    if (spelled.rfind("--", 0) != 0 || spelled.find('=') != std::string::npos) continue;
    gflags::CommandLineFlagInfo info;
    if (gflags::GetCommandLineFlagInfo(spelled.substr(2).c_str(), &info) && info.type != "bool") {
      ++i;
    }
  }
  return false;
}

std::string program_help() {
  std::vector<gflags::CommandLineFlagInfo> flags;
  gflags::GetAllFlags(&flags);
  std::vector<gflags::CommandLineFlagInfo> own;
  for (const gflags::CommandLineFlagInfo& f : flags) {
    if (f.filename.find("/demo/") != std::string::npos ||
        f.filename.find("/tools/") != std::string::npos) {
      own.push_back(f);
    }
  }
  std::sort(own.begin(), own.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  std::string text = std::string(gflags::ProgramUsage()) +
                     "\n\nFlags (--helpfull lists glog's and gflags' own too):\n";
  for (const gflags::CommandLineFlagInfo& f : own) {
    std::string name = f.name;
    std::replace(name.begin(), name.end(), '_', '-');
    std::string value = f.default_value;
    if (f.type == "double") {  // 0.05, not 0.050000000000000003
      std::ostringstream shortest;
      shortest << std::stod(value);
      value = shortest.str();
    } else if (f.type == "string") {
      value = "\"" + value + "\"";
    }
    text += "  --" + name + " (" + f.type + ", default " + value + ")\n";
    // The description, wrapped at word boundaries under an indent of 6.
    std::istringstream words(f.description);
    std::string word, line;
    for (;;) {
      const bool more = static_cast<bool>(words >> word);
      if (!more || (!line.empty() && 6 + line.size() + 1 + word.size() > 100)) {
        if (!line.empty()) text += "      " + line + "\n";
        line.clear();
        if (!more) break;
      }
      line += (line.empty() ? "" : " ") + word;
    }
  }
  return text + "\nAnd glog's --v=1: the library's log (what was loaded, which kernels were chosen) "
                "on stderr.\n";
}

Status set_model_flags(const std::string& dtype, bool cuda_graph, bool graph_given,
                       ModelOptions* options) {
  Result<std::optional<DataType>> activation = parse_activation_dtype(dtype, options->device);
  if (!activation.ok()) return activation.status().With("--dtype");
  options->auto_activation = !activation->has_value();
  if (activation->has_value()) options->activation = **activation;
  if (graph_given && cuda_graph && options->device != DeviceType::kCuda) {
    return Status::Error("--cuda-graph needs --device cuda");
  }
  options->auto_cuda_graph = !graph_given;
  options->cuda_graph = cuda_graph;
  return Status::Ok();
}

Status set_kv_cache_flag(const std::string& value, ModelOptions* options) {
  if (value.empty()) return Status::Ok();
  const Status bad = Status::Error("--kv-cache: '" + value +
                                   "' is neither a fraction of free GPU memory in (0, 1] nor a "
                                   "size such as 8GiB, 512MiB or 2GB");
  size_t used = 0;
  double number = 0.0;
  try {
    number = std::stod(value, &used);
  } catch (const std::exception&) {
    return bad;
  }
  const std::string unit = value.substr(used);
  if (unit.empty() && number > 0.0 && number <= 1.0) {
    options->kv_cache_fraction = number;
    options->kv_cache_bytes = 0;
    return Status::Ok();
  }
  static const std::pair<const char*, double> kUnits[] = {
      {"", 1.0},     {"B", 1.0},   {"KB", 1e3},         {"MB", 1e6},         {"GB", 1e9},
      {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}};
  for (const auto& [name, scale] : kUnits) {
    if (unit != name) continue;
    const double bytes = number * scale;
    if (!(bytes >= 1.0 && bytes < 9e18)) return bad;
    options->kv_cache_bytes = static_cast<int64_t>(bytes);
    options->kv_cache_fraction = 0.0;
    return Status::Ok();
  }
  return bad;
}

}  // namespace kuiper
