// Correctly rounded float and double arithmetic where Vulkan's is not, for
// the kernels that must give the CPU's result bit for bit
// (norm_quantize.comp, rmsnorm.comp, attention.comp). Vulkan lets a division be off by 2.5 ulp and a square
// root by more, where C's are correctly rounded; these helpers need fp64
// (shaderFloat64). norm_quantize.comp uses them too; docs/VULKAN.md says
// why they hold:
//
// - a float division or square root goes through double and is rounded to
//   float: the exact result is never within 2^-49 (relative) of halfway
//   between two floats, and the double result is off by less than that
//   (the square root is also checked against the midpoints' exact squares);
// - a double division starts from the device's quotient and moves to the
//   neighbour with the smaller exact residual a - q b (the product split
//   into halves, Dekker) until neither neighbour is closer.
//
// exp_rn is not libm's expf (nothing portable is): it is exp in double
// rounded to float, correctly rounded unless the exact value lies within
// about 1e-15 (relative) of halfway between two floats, so it equals
// glibc's expf (at most 0.502 ulp off) wherever that one is correctly
// rounded.
//
// With BN_FP64 (the _f64 variants of the kernels) these are the exact
// helpers below and REAL is double; without (devices without fp64) REAL
// is float and the helpers are the device's own float operations, so
// those kernels give the CPU's results within a few roundings instead.

#include "round_even.glsl"

#ifdef BN_FP64
#define REAL double

// a - c b, with c b exact as a sum of two doubles (Dekker's product).
double residual(double a, double b, double c)
{
    precise double h = c * b;
    precise double tc = 134217729.0 * c;
    precise double ch = tc - (tc - c);
    precise double cl = c - ch;
    precise double tb = 134217729.0 * b;
    precise double bh = tb - (tb - b);
    precise double bl = b - bh;
    precise double l = ((ch * bh - h) + ch * bl + cl * bh) + cl * bl;
    precise double r = (a - h) - l;
    return r;
}

// The double next to positive finite v, one unit up (dir 1) or down (-1).
double step_to(double v, int dir)
{
    uvec2 b = unpackDouble2x32(v);
    if (dir > 0) {
        b.x += 1u;
        if (b.x == 0u)
            b.y += 1u;
    } else {
        if (b.x == 0u)
            b.y -= 1u;
        b.x -= 1u;
    }
    return packDouble2x32(b);
}

// a / b correctly rounded, for finite b > 0 (a infinite or NaN passes
// through as the device's quotient).
double div_rn(double a, double b)
{
    precise double q = abs(a) / b;
    if (q == 0.0 || isinf(q) || isnan(q))
        return a < 0.0 ? -q : q;
    const double aa = abs(a);
    for (int i = 0; i < 4; i++) {
        const double up = step_to(q, 1), down = step_to(q, -1);
        const double r = abs(residual(aa, b, q));
        if (abs(residual(aa, b, up)) < r)
            q = up;
        else if (down > 0.0 && abs(residual(aa, b, down)) < r)
            q = down;
        else
            break;
    }
    return a < 0.0 ? -q : q;
}

// Float division, correctly rounded (a finite, b finite and nonzero).
float fdiv_rn(float a, float b)
{
    precise double d = double(a) / double(b);
    return float(d);
}

// sqrtf, correctly rounded, for v >= 0 finite.
float fsqrt_rn(float v)
{
    float r = float(sqrt(double(v)));
    if (r == 0.0 || isinf(r))
        return r;
    // The midpoints around r; their squares are exact in double.
    const double lo = (double(r) + double(uintBitsToFloat(floatBitsToUint(r) - 1u))) * 0.5;
    const double hi = (double(r) + double(uintBitsToFloat(floatBitsToUint(r) + 1u))) * 0.5;
    if (double(v) < lo * lo)
        r = uintBitsToFloat(floatBitsToUint(r) - 1u);
    else if (double(v) > hi * hi)
        r = uintBitsToFloat(floatBitsToUint(r) + 1u);
    return r;
}

// e^x for float x <= 0 (or NaN), in double then rounded to float: x = k ln2
// + r with |r| <= ln2 / 2 (Cody and Waite's split of ln2, its high part
// short enough for k ln2_hi to be exact), e^r by its Taylor series to r^13
// (the rest is below 1e-17 of it), times 2^k. Below -104 expf is 0 (its
// smallest subnormal is e^-103.3).
float exp_rn(float x)
{
    if (isnan(x))
        return x;
    if (x < -104.0)
        return 0.0;
    const double LN2_HI = 6.93147180369123816490e-01lf; // 0x3fe62e42fee00000
    const double LN2_LO = 1.90821492927058770002e-10lf; // 0x3dea39ef35793c76
    const double INV_LN2 = 1.4426950408889634lf;
    const double xd = double(x);
    const double kd = round_even(xd * INV_LN2);
    precise double r = (xd - kd * LN2_HI) - kd * LN2_LO;
    precise double e = 1.6059043836821613e-10lf;   // 1/13!
    e = e * r + 2.08767569878681e-09lf;            // 1/12!
    e = e * r + 2.505210838544172e-08lf;
    e = e * r + 2.755731922398589e-07lf;
    e = e * r + 2.7557319223985893e-06lf;
    e = e * r + 2.48015873015873e-05lf;
    e = e * r + 0.0001984126984126984lf;
    e = e * r + 0.001388888888888889lf;
    e = e * r + 0.008333333333333333lf;
    e = e * r + 0.041666666666666664lf;
    e = e * r + 0.16666666666666666lf;
    e = e * r + 0.5lf;
    e = e * r + 1.0lf;
    e = e * r + 1.0lf;
    return float(ldexp(e, int(kd)));
}

#else
#define REAL float

float div_rn(float a, float b) { return a / b; }
float fdiv_rn(float a, float b) { return a / b; }
float fsqrt_rn(float v) { return sqrt(v); }
float exp_rn(float x) { return exp(x); }
#endif
