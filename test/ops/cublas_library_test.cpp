// cuBLAS opened on first use (kernels/cuda/cublas_library.h): the toolkit's libraries open and
// hold every function Kuiper calls, GPU or not (opening them needs no device).
#ifdef KUIPER_WITH_CUDA

#include "kuiper/op/kernels/cuda/cublas_library.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

namespace kuiper::cuda {
namespace {

TEST(CublasLibrary, OpensAndFindsEveryFunction) {
  const Result<const CublasLibrary*> lib = cublas_library();
  ASSERT_TRUE(lib.ok()) << lib.status().message();
#define KUIPER_EXPECT_FOUND(name) EXPECT_NE((*lib)->name, nullptr) << #name;
  KUIPER_CUBLAS_FUNCTIONS(KUIPER_EXPECT_FOUND)
  KUIPER_CUBLASLT_FUNCTIONS(KUIPER_EXPECT_FOUND)
  KUIPER_EXPECT_FOUND(cublasGemmEx)
#undef KUIPER_EXPECT_FOUND
  // The process now maps both libraries, and a second call gives the same table.
  std::ifstream maps("/proc/self/maps");
  std::stringstream text;
  text << maps.rdbuf();
  EXPECT_NE(text.str().find("libcublas.so."), std::string::npos);
  EXPECT_NE(text.str().find("libcublasLt.so."), std::string::npos);
  const Result<const CublasLibrary*> again = cublas_library();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *lib);
}

}  // namespace
}  // namespace kuiper::cuda

#endif  // KUIPER_WITH_CUDA
