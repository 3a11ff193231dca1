// kuiper-tokenize: text to token ids and back, one JSON value per line, for scripts and for
// checking Kuiper's tokenizer against others. Also times encoding (--bench).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gflags/gflags.h>
#include <glog/logging.h>
#include <nlohmann/json.hpp>

#include "kuiper/base/json_reader.h"
#include "kuiper/model/model_file.h"
#include "kuiper/tokenizer/tokenizer.h"
#include "tools/program_flags.h"

DEFINE_string(tokenizer, "", "tokenizer.json to use");
DEFINE_string(model, "", "Kuiper model file (.bin) whose embedded tokenizer to use");
DEFINE_bool(decode, false, "read JSON arrays of ids, write JSON strings (instead of the reverse)");
DEFINE_string(bench, "", "time encoding this file's text (raw, not JSON) and report on stderr");
DEFINE_int32(bench_runs, 3, "encodings to time with --bench; the fastest is reported");

namespace {

using kuiper::Result;
using kuiper::Status;
using kuiper::Tokenizer;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr char kUsage[] =
    "text <-> token ids with a Qwen tokenizer.\n"
    "  kuiper-tokenize --tokenizer tokenizer.json < strings.jsonl > ids.jsonl\n"
    "  kuiper-tokenize --model model.bin --decode < ids.jsonl > strings.jsonl\n"
    "  kuiper-tokenize --tokenizer tokenizer.json --bench text.txt\n"
    "Each input line is one JSON string (encode) or one JSON array of ids (--decode); each\n"
    "output line is the matching JSON array or string. A line that cannot be handled is\n"
    "reported on stderr with its number and written as null, so output lines stay aligned with\n"
    "input lines; the exit status is then 1. Exit status 2: bad flags.";

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// CPU time next to wall time: on a busy machine (a shared CI box) the wall clock mostly
// measures the neighbours.
double cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

Result<Tokenizer> load_tokenizer() {
  if (!FLAGS_tokenizer.empty()) return Tokenizer::from_file(FLAGS_tokenizer);
  KUIPER_ASSIGN_OR_RETURN(auto model, kuiper::ModelFile::open(FLAGS_model));
  const std::string tokenizer_json = model->tokenizer_json();
  if (tokenizer_json.empty()) return Status::Error(FLAGS_model + " holds no tokenizer");
  auto tokenizer = Tokenizer::from_json(tokenizer_json);
  if (!tokenizer.ok()) return tokenizer.status().With(FLAGS_model + ": embedded tokenizer.json");
  return tokenizer;
}

// One input line through the checked parser (a number beyond a double, 1e999, is an error too,
// not an exception). nlohmann's message gives its own position ("... at line 1, column 5: "),
// whose line would read as a line of our input; keep the column and the reason.
Result<json> parse_line(const std::string& line) {
  Result<json> value = kuiper::parse_json(line, "input");
  if (value.ok()) return value;
  const std::string& message = value.status().message();
  const size_t column = message.find("column");
  return Status::Error(column == std::string::npos ? message
                                                   : "invalid JSON at " + message.substr(column));
}

Result<std::string> encode_line(const Tokenizer& tokenizer, const std::string& line) {
  KUIPER_ASSIGN_OR_RETURN(const json value, parse_line(line));
  if (!value.is_string()) return Status::Error("expected a JSON string, got " + value.dump());
  KUIPER_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer.encode(value.get<std::string>()));
  return json(ids).dump();
}

Result<std::string> decode_line(const Tokenizer& tokenizer, const std::string& line) {
  KUIPER_ASSIGN_OR_RETURN(const json value, parse_line(line));
  if (!value.is_array()) return Status::Error("expected a JSON array of ids, got " + value.dump());
  const kuiper::JsonReader reader(value, "ids");
  KUIPER_ASSIGN_OR_RETURN(std::vector<int64_t> ids,
                          reader.to_int_list(0, tokenizer.vocab_size() - 1));
  return json(tokenizer.decode(std::vector<int32_t>(ids.begin(), ids.end()))).dump();
}

// Returns the exit status: 0 when every line was handled.
int convert_lines(const Tokenizer& tokenizer) {
  int failed = 0;
  std::string line;
  for (int64_t number = 1; std::getline(std::cin, line); ++number) {
    auto out = FLAGS_decode ? decode_line(tokenizer, line) : encode_line(tokenizer, line);
    if (out.ok()) {
      std::cout << out.value() << '\n';
    } else {
      std::cout << "null\n";
      std::cerr << "kuiper-tokenize: line " << number << ": " << out.status().message() << '\n';
      ++failed;
    }
  }
  std::cout.flush();
  if (failed > 0) std::cerr << "kuiper-tokenize: " << failed << " line(s) failed\n";
  return failed > 0 ? 1 : 0;
}

int bench(const Tokenizer& tokenizer) {
  std::ifstream file(FLAGS_bench, std::ios::binary);
  if (!file) {
    std::cerr << "kuiper-tokenize: cannot open " << FLAGS_bench << '\n';
    return 1;
  }
  std::ostringstream contents;
  contents << file.rdbuf();
  const std::string text = contents.str();
  const int runs = std::max(FLAGS_bench_runs, 1);
  double best_wall = 0, best_cpu = 0;
  size_t tokens = 0;
  for (int run = 0; run < runs; ++run) {
    const auto start = Clock::now();
    const double cpu_start = cpu_seconds();
    auto ids = tokenizer.encode(text);
    const double cpu = cpu_seconds() - cpu_start;
    const double wall = seconds_since(start);
    if (!ids.ok()) {
      std::cerr << "kuiper-tokenize: " << FLAGS_bench << ": " << ids.status().message() << '\n';
      return 1;
    }
    tokens = ids->size();
    if (run == 0 || wall < best_wall) best_wall = wall;
    if (run == 0 || cpu < best_cpu) best_cpu = cpu;
  }
  const double megabytes = static_cast<double>(text.size()) / 1e6;
  std::fprintf(stderr, "encode %s: %.3f MB -> %zu tokens, one thread, best of %d\n",
               FLAGS_bench.c_str(), megabytes, tokens, runs);
  for (const auto& [clock, seconds] : {std::pair{"wall", best_wall}, std::pair{"cpu ", best_cpu}}) {
    std::fprintf(stderr, "  %s %.3f s: %6.2f MB/s, %8.0f tokens/s\n", clock, seconds,
                 megabytes / seconds, static_cast<double>(tokens) / seconds);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (kuiper::start_program(argc, argv, kUsage)) return 0;
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (FLAGS_tokenizer.empty() == FLAGS_model.empty() || argc > 1) {
    std::cerr << "kuiper-tokenize: give exactly one of --tokenizer or --model (see --help)\n";
    return 2;
  }
  const auto load_start = Clock::now();
  auto tokenizer = load_tokenizer();
  if (!tokenizer.ok()) {
    std::cerr << "kuiper-tokenize: " << tokenizer.status().message() << '\n';
    return 1;
  }
  if (!FLAGS_bench.empty()) {
    std::fprintf(stderr, "loaded tokenizer (%lld ids) in %.3f s\n",
                 static_cast<long long>(tokenizer->vocab_size()), seconds_since(load_start));
    return bench(tokenizer.value());
  }
  return convert_lines(tokenizer.value());
}
