// The W2A8 products' epilogue (w2a8_matvec.glsl, w2a8_normed.glsl): the
// CPU's expressions, each operation rounded once. The including shader
// has the output buffer y and push constants p with mode, weight_scale
// and up_scale.

// The CPU's ((float)sum / act_scale) * weight_scale; with EXACT_DIVISION
// the division correctly rounded through double (vk_w2a8.h says why).
float epilogue_scale(int sum, float act_scale, float weight_scale)
{
#ifdef EXACT_DIVISION
    precise float q = float(double(float(sum)) / double(act_scale));
#else
    precise float q = float(sum) / act_scale;
#endif
    precise float v = q * weight_scale;
    return v;
}

// The output of the sum (and, for the gate and up, the up's sum) at y[o]:
// stored (mode 0), added to y[o] (mode 1: the residual add), or the
// squared-ReLU gate times the up (mode 2: the CPU's relu2_span).
void epilogue_store(uint o, int sum, int sum_up, float act_scale)
{
    const float v = epilogue_scale(sum, act_scale, p.weight_scale);
    if (p.mode == 1u) {
        precise float r = y[o] + v;
        y[o] = r;
    } else if (p.mode == 2u) {
        const float u = epilogue_scale(sum_up, act_scale, p.up_scale);
        // The test is on the bits (positive, at most +infinity), not a
        // compare a driver could turn into a max() that keeps a NaN.
        const int bits = floatBitsToInt(v);
        const float g = bits > 0 && bits <= 0x7f800000 ? v : 0.0;
        precise float r = (g * g) * u;
        y[o] = r;
    } else {
        y[o] = v;
    }
}
