// product.glsl: the batches of a matrix product (matmul, matvec, coopmat).
//
// BATCH batches over BRANK dimensions BSHAPE, with per-operand element
// strides C_BSTRIDES, A_BSTRIDES, B_BSTRIDES (0: broadcast).
const uint BSHAPE_[BRANK] = uint[BRANK](BSHAPE);
const uint CBS[BRANK] = uint[BRANK](C_BSTRIDES);
const uint ABS[BRANK] = uint[BRANK](A_BSTRIDES);
const uint BBS[BRANK] = uint[BRANK](B_BSTRIDES);

// Where batch bz starts in C, A and B (elements).
void kiln_batch_offsets(uint bz, out uint ca, out uint cb, out uint cc) {
    uint rem = bz;
    ca = 0;
    cb = 0;
    cc = 0;
    for (int d = BRANK - 1; d >= 0; --d) {
        uint x = rem % BSHAPE_[d];
        rem /= BSHAPE_[d];
        ca += x * ABS[d];
        cb += x * BBS[d];
        cc += x * CBS[d];
    }
}
