// reduce.glsl: workgroup-wide reductions through shared memory, for kernels
// that give one workgroup of WG invocations (a power of two) to a row. Every
// invocation of the workgroup must call them (they contain barriers).
shared float kiln_red[WG];

#define KILN_REDUCE(name, combine)                                   \
    float name(float v) {                                            \
        uint l = gl_LocalInvocationID.x;                             \
        kiln_red[l] = v;                                             \
        barrier();                                                   \
        for (uint s = WG / 2; s > 0; s >>= 1) {                      \
            if (l < s)                                               \
                kiln_red[l] = combine(kiln_red[l], kiln_red[l + s]); \
            barrier();                                               \
        }                                                            \
        float r = kiln_red[0];                                       \
        barrier();                                                   \
        return r;                                                    \
    }

#define KILN_ADD(x, y) ((x) + (y))
#define KILN_MUL(x, y) ((x) * (y))
KILN_REDUCE(kiln_reduce_sum, KILN_ADD)
KILN_REDUCE(kiln_reduce_max, max)
KILN_REDUCE(kiln_reduce_min, min)
KILN_REDUCE(kiln_reduce_prod, KILN_MUL)

// Rows: row r of ROWS holds LEN elements, element j at
//   (r / INNER) * LEN * INNER + (r % INNER) + j * INNER,
// so a row runs along any one axis (INNER: the product of the axes after it).
#if defined(LEN) && defined(INNER)
uint kiln_row_base(uint r) { return (r / INNER) * (LEN * INNER) + (r % INNER); }
#endif
