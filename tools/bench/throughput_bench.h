// Throughput mode: --num-prompts random prompts served through the Engine, all queued at once,
// at each --concurrency (the engine's max batch): output and total tok/s, requests/s, TTFT and
// inter-token latency percentiles, the prefix cache's share of the prompts, and on a GPU the
// share of the bandwidth/compute roofline. Runs on the CPU as well (--device cpu).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "kuiper/base/dtype.h"
#include "kuiper/model/config.h"
#include "kuiper/model/quantization.h"
#include "tools/bench/report.h"

namespace kuiper::bench {

struct ThroughputSetup {
  kuiper::ModelConfig config;
  std::string name;
  DeviceType device = DeviceType::kCuda;
  DataType activation = DataType::kFp16;
  double copy_gbs = 0;      // the roofline's bandwidth; 0: no roofline (the CPU)
  double usable_bytes = 0;  // GPU memory the model may take; 0: not checked
  kuiper::QuantizeSpec quantize;  // --quantize: the random model's projections
};

// The concurrency sweep for one attention kind, one row per concurrency in report->throughput;
// `on_point` is called with each row as it is measured.
Status bench_throughput(const std::string& kind, const ThroughputSetup& setup,
                        const std::vector<int64_t>& concurrency, Report* report,
                        const std::function<Status(const json& point)>& on_point);

}  // namespace kuiper::bench
