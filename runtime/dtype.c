/*
 * dtype.c: element types. No Vulkan here: the compiler links this file too,
 * so the compiler and the runtime agree on every size and name.
 */
#include "kiln_rt.h"

uint32_t kiln_dtype_size(kiln_dtype dtype) {
    switch (dtype) {
    case KILN_DTYPE_F32: return 4;
    case KILN_DTYPE_F16: return 2;
    case KILN_DTYPE_I32: return 4;
    case KILN_DTYPE_I64: return 8;
    case KILN_DTYPE_BOOL: return 1;
    case KILN_DTYPE_U8: return 1;
    case KILN_DTYPE_I8: return 1;
    }
    return 0;
}

const char *kiln_dtype_name(kiln_dtype dtype) {
    switch (dtype) {
    case KILN_DTYPE_F32: return "f32";
    case KILN_DTYPE_F16: return "f16";
    case KILN_DTYPE_I32: return "i32";
    case KILN_DTYPE_I64: return "i64";
    case KILN_DTYPE_BOOL: return "bool";
    case KILN_DTYPE_U8: return "u8";
    case KILN_DTYPE_I8: return "i8";
    }
    return "?";
}
