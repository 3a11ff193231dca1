// Tuning choices the CUDA ops make at run time (the decode partition, the GEMV form), logged at
// VLOG(1) (--v=1) once per distinct choice, so a run shows what each shape got.
#pragma once

#include <glog/logging.h>

#include <mutex>
#include <set>
#include <string>

namespace kuiper::cuda {

// Logs `choice` at VLOG(1) the first time it is seen in this process.
inline void log_tuning_once(const std::string& choice) {
  static std::mutex mutex;
  static std::set<std::string> seen;
  std::lock_guard<std::mutex> lock(mutex);
  if (seen.insert(choice).second) VLOG(1) << choice;
}

}  // namespace kuiper::cuda

// The message is built only when VLOG(1) is on: the choices are made on every call.
#define KUIPER_LOG_TUNING(message)                                     \
  do {                                                                 \
    if (VLOG_IS_ON(1)) ::kuiper::cuda::log_tuning_once(message);       \
  } while (0)
