// The activation dtype a model runs in: what `--dtype auto|bf16|fp16|fp32` asks for, and the one
// rule that turns auto into a dtype. Every program goes through these (Model::load applies
// resolve_activation for ModelOptions::auto_activation; kuiper-bench calls it itself).
#pragma once

#include <optional>
#include <string>

#include "kuiper/base/dtype.h"
#include "kuiper/model/model_file.h"

namespace kuiper {

// "auto" -> nullopt; "bf16", "fp16", "fp32" -> that dtype, refused where `device` cannot run it
// (the CPU computes in fp32). Anything else is an error listing the choices.
Result<std::optional<DataType>> parse_activation_dtype(const std::string& name, DeviceType device);

// The dtype the checkpoint's weights are stored in: of its floating-point dtypes, the one holding
// the most elements, that of the big matrices (a bf16 checkpoint with fp32 norms is bf16).
DataType checkpoint_dtype(const ModelFile& file);

// The activation dtype for weights stored as `stored` on `device`: `requested` when given (fp32
// on the CPU; fp32, fp16 or bf16 on CUDA), else auto: `stored` on CUDA, fp32 on the CPU.
Result<DataType> resolve_activation(std::optional<DataType> requested, DataType stored,
                                    DeviceType device);

}  // namespace kuiper
