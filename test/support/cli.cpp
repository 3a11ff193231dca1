#include "support/cli.h"

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "support/fixture_checkpoint.h"
#include "support/paths.h"

namespace kuiper::test {

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string shell_quote(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

CliResult run_program(const std::string& program, const std::vector<std::string>& args,
                      const std::string& input, const std::string& env) {
  TempDir scratch;
  std::ofstream(scratch.file("stdin"), std::ios::binary) << input;
  std::string command = env + " " + shell_quote(bin_dir() + "/" + program);
  for (const std::string& a : args) command += " " + shell_quote(a);
  command += " < " + scratch.file("stdin") + " > " + scratch.file("stdout") + " 2> " +
             scratch.file("stderr");
  const int status = std::system(command.c_str());
  CliResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read_text(scratch.file("stdout"));
  r.err = read_text(scratch.file("stderr"));
  return r;
}

}  // namespace kuiper::test
