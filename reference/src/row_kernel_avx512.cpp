// The hot loops built for x86-64-v4 (AVX-512, 8 doubles a vector).
#define NC_VARIANT avx512
#include "row_kernel_variant.inc"
