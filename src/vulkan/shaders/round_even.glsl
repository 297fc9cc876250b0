// Round half to even, written out instead of GLSL's roundEven(): Mesa's
// llvmpipe (lavapipe 22.3.6 with LLVM 15 on an AVX2 CPU without AVX-512)
// rounds exact halves of doubles toward zero there (test_vulkan_norm's
// ties: 69.5 gave 69), which breaks the kernels that must give the CPU's
// rint() bit for bit. v - floor(v) is exact for every finite v, so this is
// the IEEE rule on every device; NaN stays NaN, infinities stay.
// round_even(double) is declared with BN_FP64 or ROUND_EVEN_DOUBLE only, so
// that the float-only variants need no fp64.
#ifndef ROUND_EVEN_GLSL
#define ROUND_EVEN_GLSL

float round_even(float v)
{
    const float f = floor(v);
    precise float d = v - f;
    return d > 0.5 || (d == 0.5 && mod(f, 2.0) != 0.0) ? f + 1.0 : f;
}

#if defined(BN_FP64) || defined(ROUND_EVEN_DOUBLE)
double round_even(double v)
{
    const double f = floor(v);
    precise double d = v - f;
    return d > 0.5 || (d == 0.5 && mod(f, 2.0) != 0.0) ? f + 1.0 : f;
}
#endif

#endif
