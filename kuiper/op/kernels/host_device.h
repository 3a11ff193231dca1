// KUIPER_HOST_DEVICE marks a function shared by the CPU and CUDA kernels: __host__ __device__
// under nvcc, a plain function in the C++ compiler.
#pragma once

#if defined(__CUDACC__)
#define KUIPER_HOST_DEVICE __host__ __device__
#else
#define KUIPER_HOST_DEVICE
#endif
