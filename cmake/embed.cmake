# Writes OUTPUT, a C file defining `const unsigned char NAME[]` with the
# bytes of INPUT followed by a NUL, and `const size_t NAME_len` (the bytes
# without the NUL): a file shipped inside the binary.
# usage: cmake -DINPUT=f -DOUTPUT=f.c -DNAME=name -P embed.cmake
file(READ "${INPUT}" hex HEX)
string(LENGTH "${hex}" n_hex)
math(EXPR n "${n_hex} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
file(WRITE "${OUTPUT}"
     "/* Generated from ${INPUT} by cmake/embed.cmake: do not edit. */\n"
     "#include <stddef.h>\n"
     "const unsigned char ${NAME}[] = {\n    ${bytes}0x00};\n"
     "const size_t ${NAME}_len = ${n};\n")
