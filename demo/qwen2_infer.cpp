// qwen2_infer: chat with, or batch-run, a Qwen2 / Qwen2.5 model file.
#include "demo/infer_main.h"

int main(int argc, char** argv) {
  return kuiper::demo::infer_main(argc, argv, kuiper::Architecture::kQwen2);
}
