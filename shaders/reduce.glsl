// reduce.glsl: workgroup-wide reductions through shared memory, for kernels
// that give one workgroup of WG invocations (a power of two) to a row. Every
// invocation of the workgroup must call them (they contain barriers).
shared float kiln_red[WG];

float kiln_reduce_sum(float v) {
    uint l = gl_LocalInvocationID.x;
    kiln_red[l] = v;
    barrier();
    for (uint s = WG / 2; s > 0; s >>= 1) {
        if (l < s)
            kiln_red[l] += kiln_red[l + s];
        barrier();
    }
    float r = kiln_red[0];
    barrier();
    return r;
}

float kiln_reduce_max(float v) {
    uint l = gl_LocalInvocationID.x;
    kiln_red[l] = v;
    barrier();
    for (uint s = WG / 2; s > 0; s >>= 1) {
        if (l < s)
            kiln_red[l] = max(kiln_red[l], kiln_red[l + s]);
        barrier();
    }
    float r = kiln_red[0];
    barrier();
    return r;
}
