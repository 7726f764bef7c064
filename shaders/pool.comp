#version 460
// pool.comp: max and average pooling over 1 to 3 spatial dimensions, one
// invocation per output element. Shapes as in conv.comp (IN_SP, OUT_SP,
// K_SP, STRIDE, PAD, DIL, padded to 3 dimensions), NC = N * C planes.
// MAX 1: the largest element in the window (padding never wins). MAX 0: the
// mean; INCLUDE_PAD 1 counts window positions inside the padded input
// (begin PAD, end PAD_END), 0 only those inside the input.
// INDICES 1 (MAX 1): also each maximum's flat index into x (the first of
// equal maxima), the spatial axes counted row-major or, COLUMN_MAJOR 1,
// column-major (ONNX MaxPool's storage_order). X and Y f32 or f16 (X_BUF,
// Y_BUF, Y_T), the arithmetic f32.
#include "common.glsl"

layout(local_size_x = WG) in;

layout(push_constant) uniform Args {
    Y_BUF y;
    X_BUF x;
#if INDICES
    I64 indices;
#endif
    KILN_DIMS
} args;

const uint IN_[3] = uint[3](IN_SP);
const uint OUT_[3] = uint[3](OUT_SP);
const uint K_[3] = uint[3](K_SP);
const int STRIDE_[3] = int[3](STRIDE);
const int PAD_[3] = int[3](PAD);
const int PAD_END_[3] = int[3](PAD_END);
const int DIL_[3] = int[3](DIL);
const uint IN_VOL = IN_[0] * IN_[1] * IN_[2];
const uint OUT_VOL = OUT_[0] * OUT_[1] * OUT_[2];
const uint K_VOL = K_[0] * K_[1] * K_[2];
#ifdef NC_RUN // the run's planes (a dynamic batch): an expression of the dims
#define COUNT (uint(NC_RUN) * OUT_VOL)
#else
const uint COUNT = NC * OUT_VOL;
#endif

void main() {
    const uint step = gl_NumWorkGroups.x * WG;
    for (uint o = gl_GlobalInvocationID.x; o < COUNT;) {
        const uint sp = o % OUT_VOL, plane = o / OUT_VOL;
        const int op[3] = int[3](int(sp / (OUT_[1] * OUT_[2])), int((sp / OUT_[2]) % OUT_[1]),
                                 int(sp % OUT_[2]));
#if MAX
        float acc = -1.0 / 0.0;
#else
        float acc = 0.0;
#endif
        uint count = 0;
#if INDICES
        uint best = 0;
#endif
        for (uint kk = 0; kk < K_VOL; ++kk) {
            const int kp[3] = int[3](int(kk / (K_[1] * K_[2])), int((kk / K_[2]) % K_[1]),
                                     int(kk % K_[2]));
            bool inside = true, padded = true;
            uint xi = 0, column = 0;
            for (int d = 0; d < 3; ++d) {
                int i = op[d] * STRIDE_[d] - PAD_[d] + kp[d] * DIL_[d];
                inside = inside && i >= 0 && i < int(IN_[d]);
                padded = padded && i >= -PAD_[d] && i < int(IN_[d]) + PAD_END_[d];
                xi = xi * IN_[d] + uint(max(i, 0));
                column = column * IN_[2 - d] + uint(max(op[2 - d] * STRIDE_[2 - d] - PAD_[2 - d]
                                                        + kp[2 - d] * DIL_[2 - d], 0));
            }
            if (inside) {
                float v = float(args.x.v[plane * IN_VOL + xi]);
#if MAX && INDICES
                if (v > acc || count == 0u) {
                    acc = v;
                    best = COLUMN_MAJOR != 0 ? column : xi;
                }
#elif MAX
                acc = max(acc, v);
#else
                acc += v;
#endif
            }
#if INCLUDE_PAD
            count += padded ? 1u : 0u;
#else
            count += inside ? 1u : 0u;
#endif
        }
#if MAX
        args.y.v[o] = Y_T(acc);
#if INDICES
        args.indices.v[o] = int64_t(plane) * int64_t(IN_VOL) + int64_t(best);
#endif
#else
        args.y.v[o] = Y_T(count > 0 ? acc / float(count) : 0.0);
#endif
        if (COUNT - o <= step)
            break;
        o += step;
    }
}
