/*
 * weights.c: the bytes of every weight, from wherever the model says.
 *
 *   file         raw little-endian data at `offset` bytes into the file
 *   safetensors  the tensor `key` of a .safetensors file; its dtype and shape
 *                must match the declaration
 *   values       inline numbers, exactly one per element (or `value`: one
 *                number for every element)
 *   init         a seeded fill for samples and benchmarks:
 *                  draw k of seed s = splitmix64 output k with state s;
 *                  u(k) = (draw k >> 11) * 2^-53, in [0, 1);
 *                  uniform: lo + (hi - lo) * u(i);
 *                  normal:  mean + std * sqrt(-2 ln(1 - u(2i))) * cos(2 pi u(2i+1))
 *                rounded to the weight's dtype (f32 or f16).
 *
 * Every mismatch (missing file, short file, wrong dtype or shape, value count)
 * is an error at the weight's declaration.
 */
#include "kiln.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

uint64_t weight_limit = UINT64_MAX;

uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double unit(uint64_t *state) {
    return (double)(splitmix64(state) >> 11) * (1.0 / 9007199254740992.0);
}

/* Round-to-nearest-even float -> IEEE half. */
static uint16_t to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t mag = x & 0x7fffffffu;
    if (mag >= 0x7f800000u) /* inf or nan */
        return (uint16_t)(sign | 0x7c00u | (mag > 0x7f800000u ? 0x200u : 0));
    if (mag >= 0x477ff000u) /* rounds to >= 65520: overflow */
        return (uint16_t)(sign | 0x7c00u);
    if (mag < 0x38800000u) { /* subnormal half or zero */
        float a;
        memcpy(&a, &mag, 4);
        uint32_t h = (uint32_t)lrintf(a * 16777216.0f); /* a / 2^-24 */
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((mag - 0x38000000u) >> 13);
    uint32_t rest = mag & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
        h++;
    return (uint16_t)(sign | h);
}

/* Stores v as element i of a buffer of dtype dt. */
static void store(uint8_t *data, kiln_dtype dt, int64_t i, double v) {
    switch (dt) {
    case KILN_DTYPE_F32: {
        float f = (float)v;
        memcpy(data + i * 4, &f, 4);
        break;
    }
    case KILN_DTYPE_F16: {
        uint16_t h = to_half((float)v);
        memcpy(data + i * 2, &h, 2);
        break;
    }
    case KILN_DTYPE_I32: {
        int32_t x = (int32_t)(uint32_t)double_to_i64(v);
        memcpy(data + i * 4, &x, 4);
        break;
    }
    case KILN_DTYPE_I64: {
        int64_t x = double_to_i64(v);
        memcpy(data + i * 8, &x, 8);
        break;
    }
    case KILN_DTYPE_BOOL: data[i] = v != 0; break;
    case KILN_DTYPE_U8: data[i] = (uint8_t)double_to_i64(v); break;
    case KILN_DTYPE_I8: data[i] = (uint8_t)double_to_i64(v); break;
    }
}

static bool is_integral(kiln_dtype dt) {
    return dt != KILN_DTYPE_F32 && dt != KILN_DTYPE_F16;
}

/* The values an integer dtype holds (i64: those a double can name). */
static void integral_range(kiln_dtype dt, double *lo, double *hi) {
    switch (dt) {
    case KILN_DTYPE_I32: *lo = -2147483648.0; *hi = 2147483647.0; break;
    case KILN_DTYPE_I64: *lo = -9223372036854775808.0; *hi = 9223372036854774784.0; break;
    case KILN_DTYPE_BOOL: *lo = 0; *hi = 1; break;
    case KILN_DTYPE_U8: *lo = 0; *hi = 255; break;
    case KILN_DTYPE_I8: *lo = -128; *hi = 127; break;
    default: *lo = -HUGE_VAL; *hi = HUGE_VAL; break;
    }
}

static void from_values(Tensor *t) {
    int64_t n = tensor_count(t);
    if (t->src.nvalues != 1 && t->src.nvalues != n)
        error_at(t->src.loc, "weight '%s' %s has %lld elements but %lld values "
                 "are given", t->name, shape_str(t->rank, t->shape), (long long)n,
                 (long long)t->src.nvalues);
    for (int64_t i = 0; i < t->src.nvalues; i++) {
        double v = t->src.values[i];
        if (is_integral(t->dtype) && v != floor(v))
            error_at(t->src.loc, "weight '%s' is %s but value %lld (%g) is not an "
                     "integer", t->name, kiln_dtype_name(t->dtype), (long long)i, v);
        double lo, hi;
        integral_range(t->dtype, &lo, &hi);
        if (is_integral(t->dtype) && (v < lo || v > hi))
            error_at(t->src.loc, "weight '%s' is %s but value %lld (%g) is out of its "
                     "range [%.0f, %.0f]", t->name, kiln_dtype_name(t->dtype), (long long)i,
                     v, lo, hi);
    }
    for (int64_t i = 0; i < n; i++)
        store(t->data, t->dtype, i, t->src.values[t->src.nvalues == 1 ? 0 : i]);
}

static void from_init(Tensor *t) {
    if (is_integral(t->dtype))
        error_at(t->src.loc, "weight '%s': init fills f32 and f16 weights, not %s",
                 t->name, kiln_dtype_name(t->dtype));
    int64_t n = tensor_count(t);
    uint64_t state = t->src.seed;
    for (int64_t i = 0; i < n; i++) {
        double v;
        if (t->src.from == W_UNIFORM) {
            v = t->src.a + (t->src.b - t->src.a) * unit(&state);
        } else {
            double u1 = unit(&state), u2 = unit(&state);
            v = t->src.b + t->src.a * sqrt(-2.0 * log(1.0 - u1)) *
                               cos(6.283185307179586 * u2);
        }
        store(t->data, t->dtype, i, v);
    }
}

/* Reads t's bytes at `offset` of its file, after checking that the file is
 * a regular file holding them. */
static void read_weight_range(Tensor *t, const char *file, uint64_t offset,
                              const char *what) {
    uint64_t size = 0, need = tensor_bytes(t);
    FILE *f = open_regular(file, &size);
    if (!f)
        error_at(t->src.loc, "weight '%s': cannot read %s: %s", t->name, file,
                 strerror(errno));
    bool fits = offset <= size && size - offset >= need;
    bool ok = fits && read_at(f, offset, t->data, need);
    fclose(f);
    if (!fits)
        error_at(t->src.loc, "weight '%s' %s %s needs %llu bytes at %s %llu, "
                 "but %s has %llu bytes", t->name, kiln_dtype_name(t->dtype),
                 shape_str(t->rank, t->shape), (unsigned long long)need, what,
                 (unsigned long long)offset, file, (unsigned long long)size);
    if (!ok)
        error_at(t->src.loc, "weight '%s': cannot read %s", t->name, file);
}

static void from_file(Tensor *t) {
    read_weight_range(t, t->src.path, t->src.offset, "offset");
}

/* ---- safetensors: an 8-byte header length, a JSON header, the data ---- */

typedef struct Json {
    const char *p, *end;
} Json;

static void skip_ws(Json *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\n' || *j->p == '\r' ||
                             *j->p == '\t'))
        j->p++;
}

static bool json_char(Json *j, char c) {
    skip_ws(j);
    if (j->p < j->end && *j->p == c) {
        j->p++;
        return true;
    }
    return false;
}

/* Reads a string without escapes other than \" and \\ (all safetensors
 * writers emit plain keys); NULL on malformed input. */
static char *json_string(Json *j) {
    if (!json_char(j, '"'))
        return NULL;
    Str s = {0};
    while (j->p < j->end && *j->p != '"') {
        if (*j->p == '\\' && j->p + 1 < j->end)
            j->p++;
        str_addn(&s, j->p, 1);
        j->p++;
    }
    if (j->p >= j->end)
        return NULL;
    j->p++;
    return s.buf ? s.buf : xstrdup("");
}

static bool json_skip_value(Json *j, int depth);

static bool json_int(Json *j, int64_t *out) {
    skip_ws(j);
    char buf[32];
    int n = 0;
    while (j->p < j->end && n < 31 && (*j->p == '-' || (*j->p >= '0' && *j->p <= '9')))
        buf[n++] = *j->p++;
    buf[n] = 0;
    if (n == 0)
        return false;
    char *e;
    errno = 0;
    *out = strtoll(buf, &e, 10);
    return *e == 0 && errno == 0;
}

static bool json_skip_value(Json *j, int depth) {
    if (depth > 64)
        return false;
    skip_ws(j);
    if (j->p >= j->end)
        return false;
    char c = *j->p;
    if (c == '"')
        return json_string(j) != NULL;
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        j->p++;
        if (json_char(j, close))
            return true;
        do {
            if (c == '{' && (!json_string(j) || !json_char(j, ':')))
                return false;
            if (!json_skip_value(j, depth + 1))
                return false;
        } while (json_char(j, ','));
        return json_char(j, close);
    }
    while (j->p < j->end && *j->p != ',' && *j->p != '}' && *j->p != ']')
        j->p++;
    return true;
}

static const char *safetensors_dtype(kiln_dtype dt) {
    switch (dt) {
    case KILN_DTYPE_F32: return "F32";
    case KILN_DTYPE_F16: return "F16";
    case KILN_DTYPE_I32: return "I32";
    case KILN_DTYPE_I64: return "I64";
    case KILN_DTYPE_BOOL: return "BOOL";
    case KILN_DTYPE_U8: return "U8";
    case KILN_DTYPE_I8: return "I8";
    }
    return "?";
}

/* The safetensors header's limit (the format's own, 100 MB). */
#define SAFETENSORS_MAX_HEADER (100u << 20)

static uint64_t le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

uint64_t safetensors_find(Tensor *t, const char *file, const uint8_t *head,
                          size_t have, uint64_t size) {
    uint64_t hlen = have >= 8 ? le64(head) : 0;
    if (have < 8 || size < 8 || hlen > have - 8 || hlen > size - 8)
        error_at(t->src.loc, "weight '%s': %s is not a safetensors file (header "
                 "length %llu, file %llu bytes)", t->name, file,
                 (unsigned long long)hlen, (unsigned long long)size);
    Json j = {(const char *)head + 8, (const char *)head + 8 + hlen};
    uint64_t data_size = size - 8 - hlen;
    uint64_t at = 0;
    bool found = false;
#define BAD() error_at(t->src.loc, "weight '%s': malformed safetensors header in %s", \
                       t->name, file)
    if (!json_char(&j, '{'))
        BAD();
    if (!json_char(&j, '}')) {
        do {
            char *name = json_string(&j);
            if (!name || !json_char(&j, ':'))
                BAD();
            if (strcmp(name, t->src.key) != 0) {
                if (!json_skip_value(&j, 0))
                    BAD();
                continue;
            }
            found = true;
            char *dtype = NULL;
            int64_t shape[MAX_RANK + 1], begin = -1, end = -1;
            int rank = -1;
            if (!json_char(&j, '{'))
                BAD();
            do {
                char *field = json_string(&j);
                if (!field || !json_char(&j, ':'))
                    BAD();
                if (strcmp(field, "dtype") == 0) {
                    if (!(dtype = json_string(&j)))
                        BAD();
                } else if (strcmp(field, "shape") == 0 ||
                           strcmp(field, "data_offsets") == 0) {
                    bool is_shape = field[0] == 's';
                    int64_t vals[MAX_RANK + 1];
                    int n = 0;
                    if (!json_char(&j, '['))
                        BAD();
                    if (!json_char(&j, ']')) {
                        do {
                            if (n > MAX_RANK || !json_int(&j, &vals[n++]))
                                BAD();
                        } while (json_char(&j, ','));
                        if (!json_char(&j, ']'))
                            BAD();
                    }
                    if (is_shape) {
                        rank = n;
                        memcpy(shape, vals, sizeof(int64_t) * (size_t)n);
                    } else {
                        if (n != 2)
                            BAD();
                        begin = vals[0];
                        end = vals[1];
                    }
                } else if (!json_skip_value(&j, 0)) {
                    BAD();
                }
            } while (json_char(&j, ','));
            if (!json_char(&j, '}') || !dtype || rank < 0 || begin < 0)
                BAD();
            if (strcmp(dtype, safetensors_dtype(t->dtype)) != 0)
                error_at(t->src.loc, "weight '%s' is declared %s but %s:%s is %s",
                         t->name, kiln_dtype_name(t->dtype), file, t->src.key, dtype);
            if (rank != t->rank ||
                memcmp(shape, t->shape, sizeof(int64_t) * (size_t)rank) != 0)
                error_at(t->src.loc, "weight '%s' is declared %s but %s:%s is %s",
                         t->name, shape_str(t->rank, t->shape), file, t->src.key,
                         shape_str(rank, shape));
            if (end < begin || (uint64_t)end > data_size ||
                (uint64_t)(end - begin) != tensor_bytes(t))
                error_at(t->src.loc, "weight '%s': %s:%s has data_offsets [%lld, "
                         "%lld] but needs %llu bytes within %llu", t->name, file,
                         t->src.key, (long long)begin, (long long)end,
                         (unsigned long long)tensor_bytes(t),
                         (unsigned long long)data_size);
            at = 8 + hlen + (uint64_t)begin;
        } while (!found && json_char(&j, ','));
    }
#undef BAD
    if (!found)
        error_at(t->src.loc, "weight '%s': %s has no tensor named '%s'", t->name,
                 file, t->src.key);
    return at;
}

static void from_safetensors(Tensor *t) {
    const char *file = t->src.path;
    uint64_t size = 0;
    uint8_t prefix[8];
    FILE *f = open_regular(file, &size);
    if (!f)
        error_at(t->src.loc, "weight '%s': cannot read %s: %s", t->name, file,
                 strerror(errno));
    /* The prefix tells how much header to read; safetensors_find judges
     * it (a prefix alone, or nothing, fails there with the sizes). */
    const uint8_t *head = prefix;
    size_t have = size >= 8 && read_at(f, 0, prefix, 8) ? 8 : 0;
    uint64_t hlen = have ? le64(prefix) : 0;
    uint8_t *whole = NULL;
    if (have && hlen <= size - 8 && hlen <= SAFETENSORS_MAX_HEADER) {
        whole = xcalloc(1, (size_t)hlen + 8);
        if (read_at(f, 0, whole, hlen + 8)) {
            head = whole;
            have = (size_t)hlen + 8;
        }
    }
    fclose(f);
    uint64_t at = safetensors_find(t, file, head, have, size);
    xfree(whole);
    read_weight_range(t, file, at, "offset");
}

void load_weights(Graph *g) {
    for (int i = 0; i < g->weights.len; i++) {
        Tensor *t = g->weights.data[i];
        if (t->data)
            continue; /* an ONNX initializer or folded constant */
        if (tensor_bytes(t) > weight_limit)
            error_at(t->src.loc, "weight '%s' has %llu bytes, over this build's limit of "
                     "%llu", t->name, (unsigned long long)tensor_bytes(t),
                     (unsigned long long)weight_limit);
        t->data = xcalloc(1, (size_t)tensor_bytes(t) + 1);
        switch (t->src.from) {
        case W_FILE: from_file(t); break;
        case W_SAFETENSORS: from_safetensors(t); break;
        case W_VALUES: from_values(t); break;
        case W_NORMAL:
        case W_UNIFORM: from_init(t); break;
        }
    }
}
