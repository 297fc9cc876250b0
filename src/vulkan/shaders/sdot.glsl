// OpSDot (4450) of two 32-bit words as four signed 8-bit lanes each
// (packed vector format 0, 4x8Bit): glslc knows no GLSL name for it. The
// including shader enables GL_EXT_spirv_intrinsics.
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018],
                  id = 4450)
int sdot_packed(int a, int b, spirv_literal int packed_format);
