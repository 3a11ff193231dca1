// What the programs that read flags with gflags share: flag names as people type them, and the
// model flags every program that runs a model has (--dtype, --cuda-graph), with one meaning.
#pragma once

#include <string>

#include "kuiper/model/model.h"

namespace kuiper {

// `arg` in gflags' spelling when it names a defined flag. gflags spells names with underscores
// and turns a bool flag off with --noNAME; people type --top-p and --no-cuda-graph:
// "--no-cuda-graph" -> "--nocuda_graph", "-top-p=0.9" -> "--top_p=0.9" (the value after '='
// untouched); "--no-think" stays the flag no_think. Anything else (a value, an unknown flag,
// which gflags then reports) comes back as it is. Call it after the program's flags are defined,
// that is from main().
std::string gflags_spelling(const std::string& arg);

// The start every program shares: the library's logs (VLOG, shown with --v=1) to stderr, not
// files; `usage` as gflags' usage message; and help: true when the arguments ask for it
// (asks_for_help), which has then been printed (program_help()) and the program exits 0.
bool start_program(int argc, char** argv, const std::string& usage);

// Whether the arguments ask for help: --help, -help, -h or --helpshort (a flag's value, as in
// --prompt --help, does not; nor anything after "--"). gflags' own --help lists glog's and its own
// flags before the program's and exits 1; a program asks this first, prints program_help() and
// exits 0 (--helpfull still lists everything, as gflags does).
bool asks_for_help(int argc, char** argv);

// The usage message (gflags::SetUsageMessage) and the flags the program defines itself (in demo/
// and tools/), in name order, each as people type it (--top-p) with its type, default and
// description wrapped to 100 columns.
std::string program_help();

// Sets `options`' activation dtype and CUDA graph from --dtype (auto|bf16|fp16|fp32, checked
// against options->device) and --cuda-graph: left out (`graph_given` false), the graph is used
// where the device has one; asked for on a device without one, it is an error. Errors name the
// flag.
Status set_model_flags(const std::string& dtype, bool cuda_graph, bool graph_given,
                       ModelOptions* options);

// Sets the KV pool size of `options` from --kv-cache: a fraction of the free GPU memory
// ("0.9": ModelOptions::kv_cache_fraction) or a size in bytes with an optional unit ("8GiB",
// "512MiB", "2GB", "1000000"; kv_cache_bytes); empty leaves the default (room for
// max_sequences sequences of max_context tokens). Errors name the flag.
Status set_kv_cache_flag(const std::string& value, ModelOptions* options);

}  // namespace kuiper
