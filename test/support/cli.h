// Running the built command-line programs from tests.
#pragma once

#include <string>
#include <vector>

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

}  // namespace kuiper::test
