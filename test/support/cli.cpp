#include "support/cli.h"

#include <sys/wait.h>

#include <cstdlib>
#include <cstring>
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

std::vector<nlohmann::json> parse_jsonl(const std::string& text) {
  std::vector<nlohmann::json> records;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) records.push_back(nlohmann::json::parse(line));
  }
  return records;
}

std::vector<float> read_floats(const std::string& path) {
  const std::string bytes = read_text(path);
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

std::string ids_flag(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += (s.empty() ? "" : ",") + std::to_string(id);
  return s;
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
