#include "tools/bench/matmul_bench.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kuiper/op/ops.h"
#include "kuiper/op/weight.h"
#include "tools/bench/flags.h"
#include "tools/bench/timing.h"

namespace kuiper::bench {

Result<json> bench_matmul(DataType activation, double copy_gbs) {
  KUIPER_ASSIGN_OR_RETURN(kuiper::ModelConfig c, read_config());
  struct Shape {
    const char* name;
    int64_t N, K;
  };
  const Shape shapes[] = {{"q_proj", c.q_dim(), c.hidden_size},
                          {"k_proj/v_proj", c.kv_dim(), c.hidden_size},
                          {"qkv (stacked)", c.q_dim() + 2 * c.kv_dim(), c.hidden_size},
                          {"o_proj", c.hidden_size, c.q_dim()},
                          {"gate/up_proj", c.intermediate_size, c.hidden_size},
                          {"gate+up (stacked)", 2 * c.intermediate_size, c.hidden_size},
                          {"down_proj", c.hidden_size, c.intermediate_size},
                          {"lm_head", c.vocab_size, c.hidden_size}};
  KUIPER_ASSIGN_OR_RETURN(const op::WeightFormat format, quantize_format());
  json rows = json::array();
  for (const Shape& s : shapes) {
    KUIPER_ASSIGN_OR_RETURN(Tensor plain, Tensor::empty({s.N, s.K}, activation, DeviceType::kCuda));
    std::vector<op::Weight> weights;
    double bytes = 0.0;  // of one copy: values, scales and zeros
    int copies = 1;
    for (int i = 0; i < copies; ++i) {
      // A plain weight is the filled tensor itself: each copy gets its own storage, or every
      // copy would be one matrix, warm in L2 whenever it fits there.
      if (i > 0 && format == op::WeightFormat::kPlain) {
        KUIPER_ASSIGN_OR_RETURN(plain, Tensor::empty({s.N, s.K}, activation, DeviceType::kCuda));
      }
      KUIPER_RETURN_IF_ERROR(kuiper::op::fill_random(plain, 10 + i, 0.02f, 0.0f));
      KUIPER_ASSIGN_OR_RETURN(op::Weight w, quantize_weight(plain));
      if (i == 0) {
        bytes = static_cast<double>(w.nbytes());
        copies = static_cast<int>(std::max(1.0, std::ceil(512e6 / bytes)));
      }
      weights.push_back(w);
    }
    json row{{"shape", s.name}, {"N", s.N}, {"K", s.K}, {"weight", weights[0].describe()}};
    if (format != op::WeightFormat::kPlain) {
      // op::quantize (how random quantized models are made) and op::dequantize (the many-row
      // path's first step, into the activation dtype), each on the whole matrix.
      KUIPER_ASSIGN_OR_RETURN(double q_s, time_on_stream([&](int) {
                                return kuiper::op::quantize(plain, weights[0]);
                              }));
      KUIPER_ASSIGN_OR_RETURN(double dq_s, time_on_stream([&](int i) {
                                return kuiper::op::dequantize(weights[i % copies], plain);
                              }));
      row["quantize_us"] = q_s * 1e6;
      row["dequantize_us"] = dq_s * 1e6;
    }
    // int8 / int4 weights in the GEMV's tiled order (weight.h), as the model holds them.
    for (op::Weight& w : weights) KUIPER_RETURN_IF_ERROR(op::tile(w).status());
    plain = Tensor();
    // 1 row (decode), 2..16 rows (batched decode at small B: the GEMV forms or the GEMM path
    // against T one-row products), then --prompt rows (prefill) whatever its length.
    auto time_rows = [&](int64_t T, Tensor& x, Tensor& out) -> Result<double> {
      KUIPER_ASSIGN_OR_RETURN(x, Tensor::empty({T, s.K}, activation, DeviceType::kCuda));
      KUIPER_ASSIGN_OR_RETURN(out, Tensor::empty({T, s.N}, activation, DeviceType::kCuda));
      KUIPER_RETURN_IF_ERROR(kuiper::op::fill_random(x, 5, 1.0f, 0.0f));
      return time_on_stream([&](int i) {
        return kuiper::op::matmul(x, weights[i % copies], nullptr, out);
      });
    };
    json small = json::object();
    for (int64_t T : {int64_t{1}, int64_t{2}, int64_t{4}, int64_t{8}, int64_t{16}}) {
      Tensor x, out;
      KUIPER_ASSIGN_OR_RETURN(double seconds, time_rows(T, x, out));
      if (T == 1) {
        row["decode_us"] = seconds * 1e6;
        row["decode_gb_s"] = bytes / seconds / 1e9;
        row["decode_pct_of_copy"] = 100.0 * bytes / seconds / 1e9 / copy_gbs;
        continue;
      }
      KUIPER_ASSIGN_OR_RETURN(double rowwise, time_on_stream([&](int i) {
                                for (int64_t t = 0; t < T; ++t) {
                                  Tensor x_row = x.rows(t, 1), out_row = out.rows(t, 1);
                                  KUIPER_RETURN_IF_ERROR(kuiper::op::matmul(
                                      x_row, weights[i % copies], nullptr, out_row));
                                }
                                return Status::Ok();
                              }));
      small[std::to_string(T)] = json{{"us", seconds * 1e6}, {"rowwise_us", rowwise * 1e6}};
    }
    {
      const int64_t T = FLAGS_prompt;
      Tensor x, out;
      KUIPER_ASSIGN_OR_RETURN(double seconds, time_rows(T, x, out));
      const double tflop_s = 2.0 * T * s.N * s.K / seconds / 1e12;
      row["prefill_tokens"] = T;
      row["prefill_us"] = seconds * 1e6;
      row["prefill_tflop_s"] = tflop_s;
      row["prefill_pct_of_peak"] = 100.0 * tflop_s / FLAGS_peak_tflops;
    }
    row["small_batch_us"] = small;
    rows.push_back(row);
  }
  return rows;
}

}  // namespace kuiper::bench
