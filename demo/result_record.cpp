#include "demo/result_record.h"

namespace kuiper::demo {

nlohmann::ordered_json result_record(const nlohmann::ordered_json& id, const nlohmann::ordered_json& request,
                             const Generation& generation, uint64_t seed) {
  nlohmann::ordered_json record = {{"id", id}};
  for (const auto& [key, value] : request.items()) record[key] = value;
  record["output"] = generation.text;
  record["output_ids"] = generation.ids;
  record["finish_reason"] = finish_reason_name(generation.finish);
  record["seed"] = seed;
  record["stats"] = generation.stats.to_json();
  return record;
}

nlohmann::ordered_json error_record(const nlohmann::ordered_json& id, int64_t line, const std::string& message) {
  return {{"id", id}, {"line", line}, {"error", message}};
}

std::string jsonl_line(const nlohmann::ordered_json& record) {
  return record.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

}  // namespace kuiper::demo
