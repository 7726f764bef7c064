/*
 * spirv_khr.c: a kernel written with GL_NV_cooperative_matrix types of
 * workgroup scope, rewritten as SPV_KHR_cooperative_matrix.
 *
 * Workgroup-scope cooperative matrices (VK_NV_cooperative_matrix2's
 * cooperativeMatrixWorkgroupScope) are SPV_KHR_cooperative_matrix types
 * whose scope is Workgroup. Debian 12's glslang (11.13) predates
 * GL_KHR_cooperative_matrix, but compiles GL_NV_cooperative_matrix types of
 * any scope and size, and spirv-tools validates them. So coopmat_wg.comp is
 * written in the NV extension's GLSL, compiled and validated as usual, and
 * its words then rewritten here, instruction by instruction, into the KHR
 * form that a newer glslang emits for the same GLSL in the KHR syntax:
 *
 *   OpCapability CooperativeMatrixNV        -> CooperativeMatrixKHR
 *   OpExtension "SPV_NV_cooperative_matrix" -> "SPV_KHR_cooperative_matrix"
 *   OpTypeCooperativeMatrixNV T S R C       -> OpTypeCooperativeMatrixKHR T S R C Use
 *   OpCooperativeMatrixLoadNV  p stride colmajor [access] -> LoadKHR  p layout stride [access]
 *   OpCooperativeMatrixStoreNV p o stride colmajor [access] -> StoreKHR p o layout stride [access]
 *   OpCooperativeMatrixMulAddNV a b c       -> MulAddKHR a b c
 *   OpCooperativeMatrixLengthNV T           -> LengthKHR T
 *
 * A KHR type names its use (MatrixA, MatrixB, Accumulator), which the NV
 * type does not: a type is MatrixA where some multiply-add takes a value
 * of it as A, MatrixB as B, and Accumulator otherwise (the accumulator,
 * the result, and an f16 copy of it to store). One NV type in two uses
 * (a kernel whose A and B tiles have the same shape) is refused. The
 * layout is an id of the constant 0 (RowMajor) or 1 (ColumnMajor) where
 * the NV form had a boolean constant. Those constants (0, 1 and 2 as 32-bit
 * unsigned integers) are the module's own where it defines them before its
 * first matrix type, else added right after its 32-bit unsigned type.
 *
 * The rewritten words are not validated again: Debian 12's spirv-tools
 * (2022.4) does not know the KHR extension (tests/test_ops_matmul.py
 * validates them with a newer spirv-val where KILN_SPIRV_VAL names one). The NV form was validated
 * before (compile_spirv.c), and the rewrite changes no control flow, no
 * type other than the matrices', and no id but the constants it adds.
 */
#include "kiln.h"

#include <string.h>

enum {
    OP_EXTENSION = 10,
    OP_TYPE_INT = 21,
    OP_CONSTANT_TRUE = 41,
    OP_CONSTANT_FALSE = 42,
    OP_CONSTANT = 43,
    OP_FUNCTION = 54,
    OP_CAPABILITY = 17,
    OP_TYPE_CM_NV = 5358,
    OP_LOAD_NV = 5359,
    OP_STORE_NV = 5360,
    OP_MULADD_NV = 5361,
    OP_LENGTH_NV = 5362,
    OP_TYPE_CM_KHR = 4456,
    OP_LOAD_KHR = 4457,
    OP_STORE_KHR = 4458,
    OP_MULADD_KHR = 4459,
    OP_LENGTH_KHR = 4460,
    CAP_CM_NV = 5357,
    CAP_CM_KHR = 6022,
};

enum { USE_A = 0, USE_B = 1, USE_ACC = 2, USE_NONE = 3 };

/* The words of a string operand "s" (nul-terminated, padded to a word). */
static size_t string_words(const char *s) { return strlen(s) / 4 + 1; }

static bool string_is(const uint32_t *w, size_t nw, const char *s) {
    size_t n = string_words(s);
    if (n != nw)
        return false;
    char buf[64] = {0};
    if (n * 4 > sizeof buf)
        return false;
    memcpy(buf, s, strlen(s));
    return memcmp(buf, w, n * 4) == 0;
}

typedef struct Out {
    uint32_t *w;
    size_t n, cap;
} Out;

static void put(Out *o, uint32_t word) {
    if (o->n == o->cap) {
        o->cap = o->cap ? 2 * o->cap : 1024;
        o->w = xrealloc(o->w, o->cap * sizeof *o->w);
    }
    o->w[o->n++] = word;
}

static void put_op(Out *o, uint32_t op, uint32_t count) { put(o, count << 16 | op); }

uint32_t *spirv_khr_coopmat(const uint32_t *w, size_t n, size_t *out_n, char **error) {
    *error = NULL;
    if (n < 5 || w[0] != 0x07230203u) {
        *error = xstrdup("not a SPIR-V module");
        return NULL;
    }
    uint32_t bound = w[3];
    /* ids: the use each matrix type has (USE_NONE: not a matrix type), the
     * type of each matrix value, the value of each 32-bit unsigned
     * constant, and whether a boolean constant is true */
    uint8_t *use = xcalloc(bound, 1);
    uint32_t *type_of = xcalloc(bound, sizeof *type_of);
    int8_t *boolean = xcalloc(bound, 1); /* 1 false, 2 true */
    memset(use, USE_NONE, bound);
    uint32_t uint_type = 0, have[3] = {0, 0, 0};
    bool typed = false; /* a matrix type seen */
    bool in_function = false;
    for (size_t i = 5; i < n;) {
        uint32_t op = w[i] & 0xffffu, len = w[i] >> 16;
        if (len == 0 || i + len > n) {
            *error = xstrdup("a truncated instruction");
            goto fail;
        }
        const uint32_t *a = w + i + 1;
        if (op == OP_FUNCTION)
            in_function = true;
        if (op == OP_TYPE_INT && len == 4 && a[1] == 32 && a[2] == 0)
            uint_type = a[0];
        if (op == OP_CONSTANT && len == 4 && uint_type && a[0] == uint_type && a[2] < 3 &&
            !have[a[2]] && !typed)
            have[a[2]] = a[1];
        typed |= op == OP_TYPE_CM_NV;
        if ((op == OP_CONSTANT_TRUE || op == OP_CONSTANT_FALSE) && len == 3)
            boolean[a[1]] = op == OP_CONSTANT_TRUE ? 2 : 1;
        if (op == OP_TYPE_CM_NV && len == 6)
            use[a[0]] = USE_ACC;
        /* in a function, a first operand that is a matrix type is the
         * result's type: the result is a matrix value */
        if (in_function && len >= 3 && a[0] < bound && use[a[0]] != USE_NONE)
            type_of[a[1]] = a[0];
        i += len;
    }
    /* the uses, from the multiply-adds' A and B */
    uint8_t *seen = xcalloc(bound, 1); /* bit 1: A, bit 2: B, bit 4: accumulator */
    for (size_t i = 5; i < n; i += w[i] >> 16) {
        uint32_t op = w[i] & 0xffffu, len = w[i] >> 16;
        const uint32_t *a = w + i + 1;
        if (op != OP_MULADD_NV)
            continue;
        if (len != 6 || !type_of[a[2]] || !type_of[a[3]] || !type_of[a[4]]) {
            *error = xstrdup("a multiply-add whose operands' types are not known");
            goto fail_seen;
        }
        seen[type_of[a[2]]] |= 1;
        seen[type_of[a[3]]] |= 2;
        seen[type_of[a[4]]] |= 4;
        seen[a[0]] |= 4;
    }
    for (uint32_t id = 0; id < bound; id++) {
        if (use[id] == USE_NONE)
            continue;
        int uses = (seen[id] & 1) + (seen[id] >> 1 & 1) + (seen[id] >> 2 & 1);
        if (uses > 1) {
            *error = format("cooperative matrix type %u is used as more than one of A, B "
                            "and the accumulator", id);
            goto fail_seen;
        }
        use[id] = seen[id] & 1 ? USE_A : seen[id] & 2 ? USE_B : USE_ACC;
    }
    if (!uint_type) {
        *error = xstrdup("no 32-bit unsigned integer type");
        goto fail_seen;
    }
    uint32_t need = 0; /* constants to add, under new ids */
    for (int v = 0; v < 3; v++)
        if (!have[v])
            have[v] = bound + need++;

    Out o = {0};
    for (int k = 0; k < 5; k++)
        put(&o, k == 3 ? bound + need : w[k]);
    for (size_t i = 5; i < n; i += w[i] >> 16) {
        uint32_t op = w[i] & 0xffffu, len = w[i] >> 16;
        const uint32_t *a = w + i + 1;
        if (op == OP_CAPABILITY && len == 2 && a[0] == CAP_CM_NV) {
            put_op(&o, OP_CAPABILITY, 2);
            put(&o, CAP_CM_KHR);
        } else if (op == OP_EXTENSION && string_is(a, len - 1, "SPV_NV_cooperative_matrix")) {
            const char *ext = "SPV_KHR_cooperative_matrix";
            uint32_t sw = (uint32_t)string_words(ext), buf[16] = {0};
            memcpy(buf, ext, strlen(ext));
            put_op(&o, OP_EXTENSION, 1 + sw);
            for (uint32_t k = 0; k < sw; k++)
                put(&o, buf[k]);
        } else if (op == OP_TYPE_CM_NV) {
            put_op(&o, OP_TYPE_CM_KHR, 7);
            for (uint32_t k = 0; k < 5; k++)
                put(&o, a[k]);
            put(&o, have[use[a[0]]]);
        } else if (op == OP_LOAD_NV || op == OP_STORE_NV) {
            /* load: type, result, pointer, stride, colmajor[, access...];
             * store: pointer, object, stride, colmajor[, access...] */
            uint32_t fixed = op == OP_LOAD_NV ? 3 : 2; /* before the stride */
            if (len < 1 + fixed + 2 || !boolean[a[fixed + 1]]) {
                *error = xstrdup("a cooperative matrix load or store whose layout is not a "
                                 "constant");
                xfree(o.w);
                goto fail_seen;
            }
            put_op(&o, op == OP_LOAD_NV ? OP_LOAD_KHR : OP_STORE_KHR, len);
            for (uint32_t k = 0; k < fixed; k++)
                put(&o, a[k]);
            put(&o, have[boolean[a[fixed + 1]] == 2 ? 1 : 0]); /* layout */
            put(&o, a[fixed]);                                 /* stride */
            for (uint32_t k = fixed + 2; k < len - 1; k++)
                put(&o, a[k]);
        } else if (op == OP_MULADD_NV || op == OP_LENGTH_NV) {
            put_op(&o, op == OP_MULADD_NV ? OP_MULADD_KHR : OP_LENGTH_KHR, len);
            for (uint32_t k = 0; k < len - 1; k++)
                put(&o, a[k]);
        } else {
            for (uint32_t k = 0; k < len; k++)
                put(&o, w[i + k]);
        }
        if (op == OP_TYPE_INT && a[0] == uint_type) /* the constants it lacks, after it */
            for (uint32_t v = 0; v < 3; v++)
                if (have[v] >= bound) {
                    put_op(&o, OP_CONSTANT, 4);
                    put(&o, uint_type);
                    put(&o, have[v]);
                    put(&o, v);
                }
    }
    xfree(seen);
    xfree(use);
    xfree(type_of);
    xfree(boolean);
    *out_n = o.n;
    return o.w;
fail_seen:
    xfree(seen);
fail:
    xfree(use);
    xfree(type_of);
    xfree(boolean);
    return NULL;
}
