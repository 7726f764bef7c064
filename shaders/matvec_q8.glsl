// matvec_q8.glsl: matvec_k.comp's A_Q8 path (included where A_Q8 is set):
// A quantized to 8-bit codes in shared memory, products as exact integer
// sums scaled once a chunk.

// A's rows as bytes: word w of row m at sq[m * AW + w]; 8-bit codes: k 4w
// to 4w + 3 in order; 4-bit codes, whose words split into the nibbles at
// even k and odd k: word 2j k 8j, 8j + 2, 8j + 4, 8j + 6, word 2j + 1 the
// odd k between. sqs[m * (K / AB) + b]: the scale of run b; Q8_ASYM:
// sqsum[m * (K / 16) + h] the sum of the codes of k 16h to 16h + 15.
const uint AB = 32u, AW = K / 4u;
shared uint sq[M * AW];
shared float sqs[M * (K / AB)];
#if Q8_ASYM
shared int sqsum[M * (K / 16u)];
#endif

uint kiln_pack4(ivec4 q) {
    return uint(q.x & 255) | uint(q.y & 255) << 8 | uint(q.z & 255) << 16 | uint(q.w & 255) << 24;
}

// Quantizes the run's rows of A (batch at ca) into sq, sqs (and sqsum):
// an invocation a run of AB k.
void stage_q8(uint ca) {
    for (uint u = gl_LocalInvocationID.x; u < MROWS * (K / AB); u += WG) {
        const uint m = u / (K / AB), b = u % (K / AB);
        vec4 v[AB / 4];
        float most = 0.0;
        [[unroll]] for (uint i = 0; i < AB / 4; ++i) {
            v[i] = LOAD_A4(ca + m * A_SM + b * AB + 4u * i);
            const vec4 av = abs(v[i]);
            most = max(most, max(max(av.x, av.y), max(av.z, av.w)));
        }
        const float inv = most > 0.0 ? 127.0 / most : 0.0;
        sqs[u] = most / 127.0;
        const uint w0 = m * AW + b * (AB / 4);
        int sum[2] = {0, 0}; // of each 16 k
        [[unroll]] for (uint i = 0; i < AB / 4; i += 2) {
            const ivec4 x = ivec4(clamp(roundEven(v[i] * inv), -127.0, 127.0));
            const ivec4 y = ivec4(clamp(roundEven(v[i + 1] * inv), -127.0, 127.0));
            sum[i / 4] += x.x + x.y + x.z + x.w + y.x + y.y + y.z + y.w;
#if BITS == 4
            sq[w0 + i] = kiln_pack4(ivec4(x.x, x.z, y.x, y.z));
            sq[w0 + i + 1] = kiln_pack4(ivec4(x.y, x.w, y.y, y.w));
#else
            sq[w0 + i] = kiln_pack4(x);
            sq[w0 + i + 1] = kiln_pack4(y);
#endif
        }
#if Q8_ASYM
        sqsum[2 * u] = sum[0];
        sqsum[2 * u + 1] = sum[1];
#endif
    }
}

// Word i of column c's codes in chunk q, as A's layout has them (sq).
uint kiln_code_word(Chunk q, uint c, uint i) {
#if W_FORMAT == 4 // the nibble in a byte's top half: 16 q, signed
    const uint x = q.raw[c][i / 2u];
    return ((i & 1u) != 0u ? x : x << 4) & 0xF0F0F0F0u;
#elif BITS == 4
    return (q.raw[c][i / 2u] >> (4u * (i & 1u))) & 0x0F0F0F0Fu;
#else
    return q.raw[c][i] ^ Q8_FLIP;
#endif
}

// Chunk ch's products with A's rows: exact integer sums, each scaled by
// the weights' and A's scales, into acc.
void chunk_q8(uint ch, Chunk q, inout float acc[M][CN]) {
    const uint k = ch * KV, w0 = k / 4u;
    [[unroll]] for (uint m = 0; m < M; ++m) {
        if (m < MROWS) {
            int t[CN];
            [[unroll]] for (uint c = 0; c < CN; ++c)
                t[c] = 0;
            [[unroll]] for (uint i = 0; i < KV / 4; ++i) {
                const uint a = sq[m * AW + w0 + i];
                [[unroll]] for (uint c = 0; c < CN; ++c)
                    t[c] += kiln_dot4(a, kiln_code_word(q, c, i));
            }
#if Q8_ASYM
            int sum_a = sqsum[m * (K / 16u) + k / 16u];
            if (KV == 32u)
                sum_a += sqsum[m * (K / 16u) + k / 16u + 1u];
            [[unroll]] for (uint c = 0; c < CN; ++c)
                t[c] -= q.zq[c] * sum_a;
#endif
            const float sa = sqs[m * (K / AB) + k / AB] * (1.0 / Q8_UNIT);
            [[unroll]] for (uint c = 0; c < CN; ++c)
                acc[m][c] = fma(q.s[c] * sa, float(t[c]), acc[m][c]);
        }
    }
}
