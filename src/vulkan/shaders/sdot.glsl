// OpSDot (4450) of two 32-bit words as four signed 8-bit lanes each
// (packed vector format 0, 4x8Bit): glslc knows no GLSL name for it. The
// including shader enables GL_EXT_spirv_intrinsics.
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018],
                  id = 4450)
int sdot_packed(int a, int b, spirv_literal int packed_format);

// The W2A8 products' (w2a8_matvec.glsl, w2a8_normed.glsl): the codes c of
// four weights (0, 1, 2 for -1, 0, +1; two bits each, lowest first) spread
// to the bytes of a word, and sum code x - sum x over four int8
// activations: their exact dot product with the weights.
int spread_codes(uint c)
{
    return int((c & 3u) | ((c & 0xcu) << 6) | ((c & 0x30u) << 12) | ((c & 0xc0u) << 18));
}

int ternary_dot(int spread, int acts)
{
    return sdot_packed(spread, acts, 0) - sdot_packed(0x01010101, acts, 0);
}
