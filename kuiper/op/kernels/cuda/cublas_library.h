// cuBLAS and cuBLASLt, opened on first use (dlopen) instead of linked: loading them at start-up
// (libcublasLt is over 500 MB; its initializers and relocations) took about half a second of
// every start of every program of a CUDA build, GPU or not, though a run on the CPU never calls
// them. The functions keep their cuBLAS names and signatures: cublas->cublasGemmEx(...).
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>

#include "kuiper/base/status.h"

namespace kuiper::cuda {

// The functions Kuiper calls, X(name) each: from libcublas (and cublasGemmEx, below), and from
// libcublasLt.
#define KUIPER_CUBLAS_FUNCTIONS(X) \
  X(cublasCreate)                  \
  X(cublasSetStream)               \
  X(cublasSetWorkspace)
#define KUIPER_CUBLASLT_FUNCTIONS(X)      \
  X(cublasLtCreate)                       \
  X(cublasLtMatmulDescCreate)             \
  X(cublasLtMatmulDescSetAttribute)       \
  X(cublasLtMatrixLayoutCreate)           \
  X(cublasLtMatmulPreferenceCreate)       \
  X(cublasLtMatmulPreferenceSetAttribute) \
  X(cublasLtMatmulPreferenceDestroy)      \
  X(cublasLtMatmulAlgoGetHeuristic)       \
  X(cublasLtMatmul)

// cublasGemmEx, the library's function: C++ also sees an inline overload of it that takes the
// compute type as a cudaDataType (for code older than cublasComputeType_t).
using CublasGemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
                                        int, int, const void*, const void*, cudaDataType, int,
                                        const void*, cudaDataType, int, const void*, void*,
                                        cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);

struct CublasLibrary {
#define KUIPER_CUBLAS_MEMBER(name) decltype(&::name) name = nullptr;
  KUIPER_CUBLAS_FUNCTIONS(KUIPER_CUBLAS_MEMBER)
  KUIPER_CUBLASLT_FUNCTIONS(KUIPER_CUBLAS_MEMBER)
#undef KUIPER_CUBLAS_MEMBER
  CublasGemmEx cublasGemmEx = nullptr;
};

// The libraries of the toolkit Kuiper was built with (libcublas.so.CUBLAS_VER_MAJOR), opened and
// their functions found once, thread-safe; the error names what could not be opened or found.
Result<const CublasLibrary*> cublas_library();

}  // namespace kuiper::cuda
