// The hot loops built for x86-64-v3 (AVX2 + FMA): the exact product is one FMA.
#define NC_VARIANT fma
#include "row_kernel_variant.inc"
