// Running the built command-line programs from tests, and reading what they write.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kuiper::test {

struct CliResult {
  int exit_code = -1;  // -1 if the program did not exit normally
  std::string out;
  std::string err;
};

// Runs bin_dir()/<program> with `args` (each quoted for the shell) and `env` prefixed
// ("OMP_WAIT_POLICY=passive", say), feeding `input` on stdin; captures stdout and stderr.
CliResult run_program(const std::string& program, const std::vector<std::string>& args,
                      const std::string& input = "", const std::string& env = "");

std::string read_text(const std::string& path);
std::string shell_quote(const std::string& text);

// One JSON record a line of `text` (a program's --output); blank lines are skipped.
std::vector<nlohmann::json> parse_jsonl(const std::string& text);
// The raw fp32 values of a file (kuiper-logits' output).
std::vector<float> read_floats(const std::string& path);
// Token ids as a flag value: "1,2,3".
std::string ids_flag(const std::vector<int32_t>& ids);

}  // namespace kuiper::test
