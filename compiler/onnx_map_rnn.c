/*
 * onnx_map_rnn.c: ONNX RNN, GRU and LSTM, unrolled over the sequence.
 *
 * kiln's shapes are static, so the sequence length is known and each time
 * step becomes its own nodes. For each direction:
 *
 *  - one gemm projects every step's input at once: X [seq * batch, input]
 *    times W^T, plus the biases that do not depend on the state;
 *  - each step is a gemm of the previous hidden state with R^T whose bias
 *    is that step's input projection (one dispatch for all the gates),
 *    then the gates' slices and elementwise ops, as the ONNX operator
 *    descriptions write them (gate orders: GRU z, r, h; LSTM i, o, f, c;
 *    peepholes i, o, f), with `clip` before each activation and GRU's
 *    `linear_before_reset` and LSTM's `input_forget`;
 *  - the reverse direction walks the steps backwards.
 *
 * sequence_lens (constant or not): at a step past a sequence's length its
 * state is carried and its output is 0, through a 0/1 mask per step; the
 * reverse direction of a shorter sequence starts at its own last step (a
 * Gather of the projected inputs in that order, and of the outputs back).
 * The activations are the ones ONNX lists (Relu, Tanh, Sigmoid, Affine,
 * LeakyRelu, ThresholdedRelu, ScaledTanh, HardSigmoid, Elu, Softsign,
 * Softplus), with activation_alpha/beta consumed in order by those that
 * take them. f32 only. layout 1 (batch first) transposes at the edges.
 */
#include "onnx.h"

#include <math.h>
#include <strings.h>
#include <string.h>

enum { CELL_RNN, CELL_GRU, CELL_LSTM };

typedef struct Act {
    const char *name;
    OpKind op;     /* OP_COUNT: Affine or ScaledTanh, built here */
    int params;    /* how many of alpha, beta it takes */
    double alpha, beta;
} Act;

static const Act acts[] = {
    {"Relu", OP_RELU, 0, 0, 0},
    {"Tanh", OP_TANH, 0, 0, 0},
    {"Sigmoid", OP_SIGMOID, 0, 0, 0},
    {"Affine", OP_COUNT, 2, 1, 0},
    {"LeakyRelu", OP_LEAKY_RELU, 1, 0.01, 0},
    {"ThresholdedRelu", OP_THRESHOLDED_RELU, 1, 1, 0},
    {"ScaledTanh", OP_COUNT, 2, 1, 1},
    {"HardSigmoid", OP_HARD_SIGMOID, 2, 0.2, 0.5},
    {"Elu", OP_ELU, 1, 1, 0},
    {"Softsign", OP_SOFTSIGN, 0, 0, 0},
    {"Softplus", OP_SOFTPLUS, 0, 0, 0},
};

typedef struct Rnn {
    int cell, gates, nact, dirs;
    int64_t seq, batch, input, hidden;
    double clip; /* 0: none */
    bool linear_before_reset, input_forget;
    Act act[2][3]; /* per direction: f, g, h */
} Rnn;

static Value *scaled(Ctx *c, Value *x, double k) {
    return k == 1 ? x : binary_tmp(c, OP_MUL, x, const_scalar(c, KILN_DTYPE_F32, k));
}

static Value *activate(Ctx *c, const Rnn *r, const Act *a, Value *x) {
    if (r->clip > 0) {
        Node *k = emit_tmp(c, OP_CLIP, 1, &x);
        node_set_float(k, "min", -r->clip);
        node_set_float(k, "max", r->clip);
        x = finish(c, k);
    }
    if (strcmp(a->name, "Affine") == 0) {
        x = scaled(c, x, a->alpha);
        return a->beta ? binary_tmp(c, OP_ADD, x, const_scalar(c, KILN_DTYPE_F32, a->beta)) : x;
    }
    if (strcmp(a->name, "ScaledTanh") == 0)
        return scaled(c, unary_tmp(c, OP_TANH, scaled(c, x, a->beta)), a->alpha);
    Node *k = emit_tmp(c, a->op, 1, &x);
    if (a->params >= 1)
        node_set_float(k, "alpha", a->alpha);
    if (a->params >= 2)
        node_set_float(k, "beta", a->beta);
    return finish(c, k);
}

/* The activations attribute (with alpha and beta) or the cell's defaults. */
static void read_activations(Ctx *c, Rnn *r) {
    static const char *defaults[3][3] = {
        {"Tanh"}, {"Sigmoid", "Tanh"}, {"Sigmoid", "Tanh", "Tanh"}};
    Onnx__AttributeProto *names =
        oattr_typed(c, "activations", ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRINGS);
    Onnx__AttributeProto *alpha =
        oattr_typed(c, "activation_alpha", ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS);
    Onnx__AttributeProto *beta =
        oattr_typed(c, "activation_beta", ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS);
    size_t n = names ? names->n_strings : 0, na = 0, nb = 0;
    if (n && n != (size_t)r->nact && n != (size_t)(r->nact * r->dirs))
        node_fail(c, format("%zu activations for %d per direction and %d direction%s", n, r->nact,
                            r->dirs, r->dirs > 1 ? "s" : ""));
    for (int d = 0; d < r->dirs; d++)
        for (int i = 0; i < r->nact; i++) {
            size_t at = (size_t)(d * r->nact + i) % (n ? n : 1);
            char name[32] = "";
            if (n) {
                size_t len = names->strings[at].len < sizeof name - 1 ? names->strings[at].len
                                                                      : sizeof name - 1;
                memcpy(name, names->strings[at].data, len);
                name[len] = 0;
            } else {
                strcpy(name, defaults[r->cell][i]);
            }
            const Act *a = NULL;
            for (size_t k = 0; k < sizeof acts / sizeof acts[0]; k++)
                if (strcasecmp(acts[k].name, name) == 0)
                    a = &acts[k];
            if (!a)
                node_fail(c, format("unsupported: activation '%s'", name));
            Act *out = &r->act[d][i];
            *out = *a;
            /* alpha and beta are read once for the first direction's list
             * when one list serves both */
            if (a->params >= 1 && alpha && na < alpha->n_floats && (n != (size_t)r->nact || !d))
                out->alpha = alpha->floats[na++];
            if (a->params >= 2 && beta && nb < beta->n_floats && (n != (size_t)r->nact || !d))
                out->beta = beta->floats[nb++];
            if (d && n == (size_t)r->nact)
                *out = r->act[0][i];
        }
}

/* v [1, rest...] or v's position d along axis 0, as [rest...]. */
static Value *part(Ctx *c, Value *v, int64_t d, int rank, const int64_t *shape) {
    return reshaped(c, sliced(c, v, 0, d, d + 1), rank, shape);
}

/* A gemm: a [M, K] times b^T (b [N, K]) plus bias. */
static Value *gemm_bt(Ctx *c, Value *a, Value *b, Value *bias) {
    Value *ins[3] = {a, b, bias};
    Node *k = emit_tmp(c, OP_GEMM, bias ? 3 : 2, ins);
    node_set_int(k, "trans_b", 1);
    return finish(c, k);
}

static void check_f32(Ctx *c, const Value *v, const char *what) {
    if (v->dtype != KILN_DTYPE_F32)
        node_fail(c, format("unsupported: %s of dtype %s (kiln's recurrent ops are f32)", what,
                            kiln_dtype_name(v->dtype)));
}

static void check_shape(Ctx *c, const Value *v, int rank, const int64_t *want, const char *what) {
    if (v->rank != rank || memcmp(v->shape, want, sizeof(int64_t) * (size_t)rank) != 0)
        node_fail(c, format("%s has shape %s, expected %s", what, shape_str(v->rank, v->shape),
                            shape_str(rank, want)));
    check_f32(c, v, what);
}

/* The 0/1 mask [batch, 1] of the sequences still running at step s. */
static Value *step_mask(Ctx *c, const Rnn *r, Value *lens, int64_t s) {
    int64_t shape[2] = {r->batch, 1};
    if (lens->data) {
        Value *m = new_value(format("%s/mask%d", c->nname, ++c->tmp_count), KILN_DTYPE_F32, 2,
                             shape, true);
        for (int64_t b = 0; b < r->batch; b++)
            vset(m, b, s < vgeti(lens, b) ? 1 : 0);
        return m;
    }
    Value *m = binary_tmp(c, OP_LT, const_scalar(c, KILN_DTYPE_I32, (double)s), lens);
    return reshaped(c, cast_to(c, m, KILN_DTYPE_F32), 2, shape);
}

/* v [seq, batch, n] reordered by rows (reversal_rows'). */
static Value *reorder(Ctx *c, const Rnn *r, Value *v, Value *rows) {
    int64_t n = v->shape[2], flat[2] = {r->seq * r->batch, n};
    Value *ins[2] = {reshaped(c, v, 2, flat), rows};
    Node *k = emit_tmp(c, OP_GATHER, 2, ins);
    node_set_int(k, "axis", 0);
    return finish(c, k);
}

/* new where the mask is 1, old where it is 0: old + m * (new - old). */
static Value *masked(Ctx *c, Value *m, Value *new, Value *old) {
    return binary_tmp(c, OP_ADD, old, binary_tmp(c, OP_MUL, m, binary_tmp(c, OP_SUB, new, old)));
}

/* One step of the cell: xt the projected input [batch, G * hidden]; h (and
 * c for LSTM) the state, replaced. */
static void step(Ctx *c, const Rnn *r, int d, Value *xt, Value *rw, Value *rbh, Value *peep,
                 Value **h, Value **cs) {
    const Act *a = r->act[d];
    int64_t H = r->hidden;
    if (r->cell == CELL_RNN) {
        *h = activate(c, r, &a[0], gemm_bt(c, *h, rw, xt));
        return;
    }
    if (r->cell == CELL_GRU) {
        Value *zr = gemm_bt(c, *h, sliced(c, rw, 0, 0, 2 * H), sliced(c, xt, 1, 0, 2 * H));
        Value *z = activate(c, r, &a[0], sliced(c, zr, 1, 0, H));
        Value *rg = activate(c, r, &a[0], sliced(c, zr, 1, H, 2 * H));
        Value *rh = sliced(c, rw, 0, 2 * H, 3 * H), *xh = sliced(c, xt, 1, 2 * H, 3 * H);
        Value *pre = r->linear_before_reset
                         ? binary_tmp(c, OP_ADD, xh, binary_tmp(c, OP_MUL, rg,
                                                                gemm_bt(c, *h, rh, rbh)))
                         : gemm_bt(c, binary_tmp(c, OP_MUL, rg, *h), rh, xh);
        Value *hh = activate(c, r, &a[1], pre);
        *h = masked(c, z, *h, hh); /* (1 - z) * hh + z * h */
        return;
    }
    Value *g = gemm_bt(c, *h, rw, xt);
    Value *pi = sliced(c, g, 1, 0, H), *po = sliced(c, g, 1, H, 2 * H);
    Value *pf = sliced(c, g, 1, 2 * H, 3 * H), *pc = sliced(c, g, 1, 3 * H, 4 * H);
    if (peep) {
        pi = binary_tmp(c, OP_ADD, pi, binary_tmp(c, OP_MUL, sliced(c, peep, 0, 0, H), *cs));
        pf = binary_tmp(c, OP_ADD, pf, binary_tmp(c, OP_MUL, sliced(c, peep, 0, 2 * H, 3 * H), *cs));
    }
    Value *i = activate(c, r, &a[0], pi);
    Value *f = r->input_forget
                   ? binary_tmp(c, OP_SUB, const_scalar(c, KILN_DTYPE_F32, 1), i)
                   : activate(c, r, &a[0], pf);
    Value *cell = activate(c, r, &a[1], pc);
    *cs = binary_tmp(c, OP_ADD, binary_tmp(c, OP_MUL, f, *cs), binary_tmp(c, OP_MUL, i, cell));
    if (peep)
        po = binary_tmp(c, OP_ADD, po, binary_tmp(c, OP_MUL, sliced(c, peep, 0, H, 2 * H), *cs));
    Value *o = activate(c, r, &a[0], po);
    *h = binary_tmp(c, OP_MUL, o, activate(c, r, &a[2], *cs));
}

/* Output i: v under the node's output name (a view), if the model uses it. */
static void bind_out(Ctx *c, int i, Value *v) {
    if (!*out_name(c, i))
        return;
    Node *k = emit(c, OP_RESHAPE, 1, &v, out_name(c, i));
    node_set_ints(k, "shape", v->rank, v->shape);
    finish(c, k);
}

void map_recurrent(Ctx *c, const OnnxOp *op) {
    Rnn r = {0};
    r.cell = strcmp(op->name, "RNN") == 0 ? CELL_RNN : strcmp(op->name, "GRU") == 0 ? CELL_GRU
                                                                                     : CELL_LSTM;
    r.gates = r.cell == CELL_RNN ? 1 : r.cell == CELL_GRU ? 3 : 4;
    r.nact = r.cell + 1;
    const char *dir = oattr_str(c, "direction", "forward");
    bool fwd = strcmp(dir, "forward") == 0, rev = strcmp(dir, "reverse") == 0;
    if (!fwd && !rev && strcmp(dir, "bidirectional") != 0)
        node_fail(c, format("direction '%s' (forward, reverse or bidirectional)", dir));
    r.dirs = fwd || rev ? 1 : 2;
    int layout = (int)oattr_int(c, "layout", 0);
    if (layout != 0 && layout != 1)
        node_fail(c, format("layout %d (0 or 1)", layout));
    r.clip = oattr_float(c, "clip", 0);
    r.linear_before_reset = oattr_int(c, "linear_before_reset", 0) != 0;
    r.input_forget = oattr_int(c, "input_forget", 0) != 0;
    if (oattr(c, "output_sequence") && !oattr_int(c, "output_sequence", 0) && *out_name(c, 0))
        node_fail(c, "output Y with output_sequence 0");

    Value *x = in(c, 0), *w = in(c, 1), *rw = in(c, 2), *b = in_opt(c, 3);
    Value *lens = in_opt(c, 4), *h0 = in_opt(c, 5);
    Value *c0 = r.cell == CELL_LSTM ? in_opt(c, 6) : NULL;
    Value *peep = r.cell == CELL_LSTM ? in_opt(c, 7) : NULL;
    if (x->rank != 3)
        node_fail(c, format("X has shape %s, expected rank 3", shape_str(x->rank, x->shape)));
    r.seq = x->shape[layout];
    r.batch = x->shape[1 - layout];
    r.input = x->shape[2];
    r.hidden = oattr_int(c, "hidden_size", rw->rank == 3 ? rw->shape[2] : 0);
    if (r.hidden < 1 || r.seq < 1)
        node_fail(c, format("hidden_size %lld and a sequence of %lld", (long long)r.hidden,
                            (long long)r.seq));
    read_activations(c, &r);
    int64_t G = r.gates, H = r.hidden, B = r.batch;
    int64_t ws[3] = {r.dirs, G * H, r.input}, rs[3] = {r.dirs, G * H, H}, bs[2] = {r.dirs, 2 * G * H};
    check_f32(c, x, "X");
    check_shape(c, w, 3, ws, "W");
    check_shape(c, rw, 3, rs, "R");
    if (b)
        check_shape(c, b, 2, bs, "B");
    int64_t state[3] = {layout ? B : r.dirs, layout ? r.dirs : B, H};
    int64_t perm3[3] = {1, 0, 2};
    if (h0) {
        check_shape(c, h0, 3, state, "initial_h");
        if (layout)
            h0 = transposed(c, h0, 3, perm3);
    }
    if (c0) {
        check_shape(c, c0, 3, state, "initial_c");
        if (layout)
            c0 = transposed(c, c0, 3, perm3);
    }
    int64_t ps[2] = {r.dirs, 3 * H};
    if (peep)
        check_shape(c, peep, 2, ps, "P");
    if (lens) {
        if (lens->rank != 1 || lens->shape[0] != B || lens->dtype != KILN_DTYPE_I32)
            node_fail(c, format("sequence_lens must be int32 [%lld]", (long long)B));
        for (int64_t i = 0; lens->data && i < B; i++)
            if (vgeti(lens, i) < 0 || vgeti(lens, i) > r.seq)
                node_fail(c, format("sequence_lens[%lld] is %lld, for a sequence of %lld",
                                    (long long)i, (long long)vgeti(lens, i), (long long)r.seq));
    }

    if (layout)
        x = transposed(c, x, 3, perm3); /* [seq, batch, input] */
    int64_t flat[2] = {r.seq * B, r.input}, proj[3] = {r.seq, B, G * H};
    int64_t mat_w[2] = {G * H, r.input}, mat_r[2] = {G * H, H}, vec[1] = {2 * G * H};
    int64_t hb[2] = {B, H}, one_hb[3] = {1, B, H};
    Value *xf = reshaped(c, x, 2, flat);
    Value *hs[2], *cs[2], *ys[2];
    for (int d = 0; d < r.dirs; d++) {
        bool backwards = rev || d == 1;
        Value *wd = part(c, w, d, 2, mat_w), *rd = part(c, rw, d, 2, mat_r);
        Value *bias = NULL, *rbh = NULL;
        if (b) {
            Value *bd = part(c, b, d, 1, vec);
            Value *wb = sliced(c, bd, 0, 0, G * H), *rb = sliced(c, bd, 0, G * H, 2 * G * H);
            if (r.cell == CELL_GRU && r.linear_before_reset) {
                /* R's h bias stays inside r * (h R_h^T + Rb_h) */
                rbh = sliced(c, rb, 0, 2 * H, 3 * H);
                int64_t gh = G * H;
                Value *keep = new_value(format("%s/zr%d", c->nname, ++c->tmp_count),
                                        KILN_DTYPE_F32, 1, &gh, true);
                for (int64_t i = 0; i < gh; i++)
                    vset(keep, i, i < 2 * H ? 1 : 0);
                rb = binary_tmp(c, OP_MUL, rb, keep);
            }
            bias = binary_tmp(c, OP_ADD, wb, rb);
        }
        Value *xw = reshaped(c, gemm_bt(c, xf, wd, bias), 3, proj);
        Value *rows = lens && backwards ? reversal_rows(c, lens, r.seq, r.batch, true) : NULL;
        if (rows)
            xw = reorder(c, &r, xw, rows);
        Value *h = h0 ? part(c, h0, d, 2, hb) : NULL, *cc = c0 ? part(c, c0, d, 2, hb) : NULL;
        if (!h) {
            h = new_value(format("%s/h0_%d", c->nname, ++c->tmp_count), KILN_DTYPE_F32, 2, hb,
                          true);
        }
        if (!cc && r.cell == CELL_LSTM)
            cc = new_value(format("%s/c0_%d", c->nname, ++c->tmp_count), KILN_DTYPE_F32, 2, hb,
                           true);
        Value *pd = peep ? part(c, peep, d, 1, &ps[1]) : NULL;
        Value **outs = xcalloc((size_t)r.seq, sizeof(Value *));
        for (int64_t s = 0; s < r.seq; s++) {
            int64_t t = backwards && !rows ? r.seq - 1 - s : s;
            Value *xt = part(c, xw, t, 2, &proj[1]);
            Value *hn = h, *cn = cc;
            step(c, &r, d, xt, rd, rbh, pd, &hn, &cn);
            Value *y = hn;
            if (lens) {
                Value *m = step_mask(c, &r, lens, s);
                hn = masked(c, m, hn, h);
                if (cn)
                    cn = masked(c, m, cn, cc);
                y = binary_tmp(c, OP_MUL, y, m);
            }
            outs[t] = reshaped(c, y, 3, one_hb);
            h = hn;
            cc = cn;
        }
        Value *yd = joined(c, (int)r.seq, outs, 0, NULL); /* [seq, batch, H] */
        if (rows) {
            int64_t sb[3] = {r.seq, B, H};
            yd = reshaped(c, reorder(c, &r, yd, rows), 3, sb);
            /* positions past each sequence's length are 0 */
            for (int64_t s = 0; s < r.seq; s++)
                outs[s] = reshaped(c, step_mask(c, &r, lens, s), 3, (int64_t[3]){1, B, 1});
            yd = binary_tmp(c, OP_MUL, yd, joined(c, (int)r.seq, outs, 0, NULL));
        }
        int64_t sdbh[4] = {r.seq, 1, B, H};
        ys[d] = reshaped(c, yd, 4, sdbh);
        hs[d] = reshaped(c, h, 3, one_hb);
        cs[d] = cc ? reshaped(c, cc, 3, one_hb) : NULL;
    }
    Value *y = joined(c, r.dirs, ys, 1, NULL), *yh = joined(c, r.dirs, hs, 0, NULL);
    Value *yc = r.cell == CELL_LSTM ? joined(c, r.dirs, cs, 0, NULL) : NULL;
    if (layout) {
        int64_t perm4[4] = {2, 0, 1, 3};
        y = *out_name(c, 0) ? transposed(c, y, 4, perm4) : y;
        yh = *out_name(c, 1) ? transposed(c, yh, 3, perm3) : yh;
        yc = yc && *out_name(c, 2) ? transposed(c, yc, 3, perm3) : yc;
    }
    bind_out(c, 0, y);
    bind_out(c, 1, yh);
    if (yc)
        bind_out(c, 2, yc);
}
