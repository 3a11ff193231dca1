// qwen3_vl_infer: chat with, or batch-run, a Qwen3-VL model file, with images (--image,
// /image in the REPL, "images" in a prompts file).
#include "demo/infer_main.h"

int main(int argc, char** argv) {
  return kuiper::demo::infer_main(argc, argv, kuiper::Architecture::kQwen3VL);
}
