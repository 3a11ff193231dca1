// The op harness itself, on the CPU: it passes an op that matches its reference, and fails one
// that leaves an output unwritten or computes something else on the backend under test.
#include "ops/harness.h"

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include "kuiper/op/ops.h"

namespace kuiper::test {
namespace {

OpCase add_case(std::function<Status(std::vector<Tensor>&)> run) {
  return {"add",
          {in({3, 5}, DataType::kFp32), in({3, 5}, DataType::kFp32), out({3, 5}, DataType::kFp32)},
          std::move(run)};
}

TEST(OpHarness, PassesAnOpThatMatchesItsReference) {
  expect_backend_matches_cpu(
      {add_case([](std::vector<Tensor>& a) { return op::add(a[0], a[1], a[2]); })},
      DeviceType::kCpu);
}

TEST(OpHarness, FailsAnOutputLeftUnwritten) {
  int calls = 0;
  // The reference (first call) writes; the backend (second) leaves the NaN poison.
  const OpCase c = add_case([&calls](std::vector<Tensor>& a) {
    return ++calls == 1 ? op::add(a[0], a[1], a[2]) : Status::Ok();
  });
  EXPECT_NONFATAL_FAILURE(expect_backend_matches_cpu({c}, DeviceType::kCpu), "unwritten");
}

TEST(OpHarness, FailsAResultOutsideTheTolerance) {
  int calls = 0;
  // The backend computes a + a instead of a + b.
  const OpCase c = add_case(
      [&calls](std::vector<Tensor>& a) { return op::add(a[0], ++calls == 1 ? a[1] : a[0], a[2]); });
  EXPECT_NONFATAL_FAILURE(expect_backend_matches_cpu({c}, DeviceType::kCpu), "max abs error");
}

TEST(OpHarness, FailsAnOpThatReturnsAnError) {
  EXPECT_FATAL_FAILURE(
      expect_backend_matches_cpu(
          {add_case([](std::vector<Tensor>&) { return Status::Error("no kernel"); })},
          DeviceType::kCpu),
      "no kernel");
}

}  // namespace
}  // namespace kuiper::test
