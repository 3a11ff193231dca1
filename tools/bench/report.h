// The report: every figure measured, grouped by kind, printed as markdown tables and written as
// JSON (--json) for scripts/plot_perf.py and scripts/perf_report.sh.
#pragma once

#include <nlohmann/json.hpp>

#include "kuiper/base/status.h"

namespace kuiper::bench {

using nlohmann::json;

// Everything measured for the report, grouped by kind of figure.
struct Report {
  json decode = json::array();
  json prefill = json::array();
  json memory = json::array();
  json runs = json::array();  // the plain --prompt/--gen mode
  json attention = json::array();
  json matmul = json::array();
  json sample = json::array();  // op::sample_rows alone
  json throughput = json::array();  // one row per attention kind and concurrency
  json skipped = json::array();
};

// The markdown tables of every non-empty figure, the skipped runs and the copy bandwidth.
void print_tables(const Report& r, double copy_gbs);
// `doc` to --json (a file, or stdout for "-").
Status write_json(const json& doc);
// The report's figures into the JSON document.
void fill(json* doc, const Report& report);

}  // namespace kuiper::bench
