// Assertions shared by the tests.
#pragma once

#include <gtest/gtest.h>

#include "kuiper/base/allocator.h"
#include "kuiper/base/status.h"

// Fails the test (and returns) with the message of a failed Status.
#define ASSERT_OK(expr)                                    \
  do {                                                     \
    const ::kuiper::Status s_ = (expr);                    \
    ASSERT_TRUE(s_.ok()) << #expr << ": " << s_.message(); \
  } while (0)

// Fails the test, and goes on, with the message of a failed Status.
#define EXPECT_OK(expr)                                    \
  do {                                                     \
    const ::kuiper::Status s_ = (expr);                    \
    EXPECT_TRUE(s_.ok()) << #expr << ": " << s_.message(); \
  } while (0)

// GPU tests skip, saying why, where there is no GPU (CI) or the build has no CUDA.
#define SKIP_WITHOUT_CUDA()       \
  if (!::kuiper::cuda_available()) \
  GTEST_SKIP() << "no usable CUDA device (or a build without CUDA)"
