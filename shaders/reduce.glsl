// reduce.glsl: workgroup-wide reductions, for kernels that give one
// workgroup of WG invocations (a power of two) to a row. Every invocation of
// the workgroup must call them: they contain barriers, so shared-memory
// writes made before a call are visible to the whole workgroup after it.
//
// KILN_SUBGROUP 1 (the compiler's second build of each kernel that includes
// this file, run on devices with subgroup arithmetic, KILN_FEATURE_SUBGROUP):
// each subgroup reduces its values with one subgroup operation, its first
// active invocation writes the result to shared memory, and after one
// barrier every invocation combines the gl_NumSubgroups partials in the
// same order (so all get the same value): two barriers a reduction against
// 2 + log2(WG) for the tree through shared memory of the first build.
shared float kiln_red[WG];

#if KILN_SUBGROUP
#extension GL_KHR_shader_subgroup_arithmetic : require
#define KILN_REDUCE(name, combine, subgroup_op)                 \
    float name(float v) {                                       \
        v = subgroup_op(v);                                     \
        if (subgroupElect())                                    \
            kiln_red[gl_SubgroupID] = v;                        \
        barrier();                                              \
        float r = kiln_red[0];                                  \
        for (uint i = 1; i < gl_NumSubgroups; ++i)              \
            r = combine(r, kiln_red[i]);                        \
        barrier();                                              \
        return r;                                               \
    }
#else
#define KILN_REDUCE(name, combine, subgroup_op)                      \
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
#endif

#define KILN_ADD(x, y) ((x) + (y))
#define KILN_MUL(x, y) ((x) * (y))
KILN_REDUCE(kiln_reduce_sum, KILN_ADD, subgroupAdd)
KILN_REDUCE(kiln_reduce_max, max, subgroupMax)
KILN_REDUCE(kiln_reduce_min, min, subgroupMin)
KILN_REDUCE(kiln_reduce_prod, KILN_MUL, subgroupMul)

// Rows: row r of ROWS holds LEN elements, element j at
//   (r / INNER) * LEN * INNER + (r % INNER) + j * INNER,
// so a row runs along any one axis (INNER: the product of the axes after it).
#if defined(LEN) && defined(INNER)
uint kiln_row_base(uint r) { return (r / INNER) * (LEN * INNER) + (r % INNER); }
#endif
// ROW_BLOCK (rows dynamic along an axis before the row's, inside, stored at
// the largest shape): of a run's row q, the outer part o = q / INNER is the
// (o % ROW_RUN)-th of block o / ROW_RUN, each block ROW_BLOCK outer rows of
// the largest shape (ROW_RUN of them the run's).
#ifdef ROW_BLOCK
uint kiln_row_of(uint q) {
    const uint o = q / INNER;
    return (o / ROW_RUN * ROW_BLOCK + o % ROW_RUN) * INNER + q % INNER;
}
#else
#define kiln_row_of(q) (q)
#endif
