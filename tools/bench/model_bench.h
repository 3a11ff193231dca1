// Model mode: a prefill and decode run, or decode-vs-context and prefill-vs-length sweeps, of
// the whole model.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "kuiper/base/dtype.h"
#include "kuiper/model/config.h"
#include "kuiper/model/quantization.h"
#include "tools/bench/report.h"

namespace kuiper::bench {

struct ModelSetup {
  kuiper::ModelConfig config;
  std::string name;
  DataType activation;
  double copy_gbs;
  kuiper::QuantizeSpec quantize;  // --quantize: the random model's projections
};

// The sweep a model-mode run does for one attention kind.
// `flush` is called after every measurement (the JSON file is rewritten, so a run cut short
// keeps what it measured).
Status bench_model(const std::string& kind, const ModelSetup& setup,
                   const std::vector<int64_t>& contexts, const std::vector<int64_t>& lengths,
                   Report* report, const std::function<Status()>& flush);

}  // namespace kuiper::bench
