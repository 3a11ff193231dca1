// Assertions shared by the tests.
#pragma once

#include <gtest/gtest.h>

#include "kuiper/base/allocator.h"
#include "kuiper/base/status.h"

namespace kuiper::test {

// The Status of a Status or of a Result, for the macros below.
inline const Status& status_of(const Status& s) { return s; }
template <typename T>
const Status& status_of(const Result<T>& r) {
  return r.status();
}

}  // namespace kuiper::test

// Fails the test (and returns) with the message of a failed Status or Result.
#define ASSERT_OK(expr)                                              \
  do {                                                               \
    const ::kuiper::Status s_ = ::kuiper::test::status_of(expr);     \
    ASSERT_TRUE(s_.ok()) << #expr << ": " << s_.message();           \
  } while (0)

// Fails the test, and goes on, with the message of a failed Status or Result.
#define EXPECT_OK(expr)                                              \
  do {                                                               \
    const ::kuiper::Status s_ = ::kuiper::test::status_of(expr);     \
    EXPECT_TRUE(s_.ok()) << #expr << ": " << s_.message();           \
  } while (0)

// GPU tests skip, saying why, where there is no GPU (CI) or the build has no CUDA.
#define SKIP_WITHOUT_CUDA()       \
  if (!::kuiper::cuda_available()) \
  GTEST_SKIP() << "no usable CUDA device (or a build without CUDA)"
