#version 460
// prefetch.comp: reads the first BYTES bytes of a product's weights and
// nothing else, so that they sit in the GPU's last-level cache when the
// product runs (compiler/prefetch.c, KILN_PREFETCH). The compiler places it
// before the product with no barrier of its own: it runs beside whatever
// ran since the last barrier (in a decoding step: the previous product, or
// attention), while those leave the memory idle in their ramp and tail.
// Each invocation loads U4 vectors four strides apart before it combines
// them, so four loads are in flight at once. The loads feed a store that
// never runs (a dispatch has at least one workgroup along y), which keeps
// them from being dropped as dead code.
#include "common.glsl"

layout(local_size_x = 256) in;

layout(push_constant) uniform Args {
    U4 w;
} args;

const uint COUNT = BYTES / 16;

void main() {
    const uint stride = gl_NumWorkGroups.x * 256u;
    uvec4 acc = uvec4(0);
    for (uint j = gl_GlobalInvocationID.x; j < COUNT; j += 4u * stride) {
        uvec4 a = args.w.v[j];
        uvec4 b = j + stride < COUNT ? args.w.v[j + stride] : uvec4(0);
        uvec4 c = j + 2u * stride < COUNT ? args.w.v[j + 2u * stride] : uvec4(0);
        uvec4 d = j + 3u * stride < COUNT ? args.w.v[j + 3u * stride] : uvec4(0);
        acc ^= a ^ b ^ c ^ d;
    }
    if (gl_NumWorkGroups.y == 0u)
        args.w.v[gl_GlobalInvocationID.x] = acc;
}
