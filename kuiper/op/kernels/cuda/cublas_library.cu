#include "kuiper/op/kernels/cuda/cublas_library.h"

#include <dlfcn.h>

#include <string>
#include <type_traits>

namespace kuiper::cuda {
namespace {

// A function's name as the header makes it (cublasCreate is cublasCreate_v2).
#define KUIPER_CUBLAS_QUOTE(name) #name
#define KUIPER_CUBLAS_NAME(name) KUIPER_CUBLAS_QUOTE(name)

// Opens library `name` by the loader's search (the program's run path, the system's folders),
// else in the toolkit's library folder that the build found.
Result<void*> open_library(const std::string& name) {
  void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (handle != nullptr) return handle;
  const std::string first = dlerror();
  const std::string path = std::string(KUIPER_CUDA_LIBRARY_DIR) + "/" + name;
  handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (handle != nullptr) return handle;
  return Status::Error("cannot open " + name + " (" + first + "; " + dlerror() + ")");
}

template <typename Fn>
Status find(void* library, const char* name, const std::string& file, Fn* out) {
  void* symbol = dlsym(library, name);
  if (symbol == nullptr) return Status::Error(file + " has no " + name);
  *out = reinterpret_cast<Fn>(symbol);
  return Status::Ok();
}

Status load(CublasLibrary* lib) {
  const std::string version = std::to_string(CUBLAS_VER_MAJOR);
  const std::string lt_file = "libcublasLt.so." + version, blas_file = "libcublas.so." + version;
  KUIPER_ASSIGN_OR_RETURN(void* lt, open_library(lt_file));  // first: libcublas needs it
  KUIPER_ASSIGN_OR_RETURN(void* blas, open_library(blas_file));
#define KUIPER_CUBLAS_FIND(name) \
  KUIPER_RETURN_IF_ERROR(find(blas, KUIPER_CUBLAS_NAME(name), blas_file, &lib->name));
#define KUIPER_CUBLASLT_FIND(name) \
  KUIPER_RETURN_IF_ERROR(find(lt, KUIPER_CUBLAS_NAME(name), lt_file, &lib->name));
  KUIPER_CUBLAS_FUNCTIONS(KUIPER_CUBLAS_FIND)
  KUIPER_CUBLAS_FIND(cublasGemmEx)
  KUIPER_CUBLASLT_FUNCTIONS(KUIPER_CUBLASLT_FIND)
#undef KUIPER_CUBLAS_FIND
#undef KUIPER_CUBLASLT_FIND
  return Status::Ok();
}

}  // namespace

Result<const CublasLibrary*> cublas_library() {
  static CublasLibrary lib;
  static const Status loaded = load(&lib);  // once, thread-safe
  if (!loaded.ok()) return loaded;
  return &lib;
}

}  // namespace kuiper::cuda
