// An F16 value, given as its 16 bits, converted to float exactly by the
// bits (subnormal halves too, whatever the device does with them).

float half_bits_to_float(uint h)
{
    const uint sign = (h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 1023u;
    if (e == 0u) { // zero or subnormal: m 2^-24, exact in float
        const float v = float(m) * 5.9604644775390625e-8;
        return sign != 0u ? -v : v;
    }
    if (e == 31u) // infinity or NaN
        return uintBitsToFloat(sign | 0x7f800000u | (m << 13));
    return uintBitsToFloat(sign | ((e + 112u) << 23) | (m << 13));
}
