/*
 * lower_attention.c: attention (flash.comp for many query rows, else
 * attention.comp), rope (one elementwise dispatch), and attention's
 * gradient (grad.comp).
 */
#include "lower.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* Element strides of (batch, head, position) of operand t (0 q, 1 k, 2 v,
 * 3 the output) in either layout; bshd rows of a->row[t] elements (wider
 * than the heads where they are a packed QKV product's). */
static void operand_strides(const AttentionDims *a, int t, int64_t st[3]) {
    int64_t heads = t == 1 || t == 2 ? a->KVH : a->H, seq = t == 1 || t == 2 ? a->Sk : a->Sq;
    int64_t width = t < 2 ? a->D : a->DV;
    bool bshd = t == 3 ? a->out_bshd : a->bshd; /* the output's own layout */
    int64_t row = t < 3 && a->bshd ? a->row[t] : heads * width;
    st[0] = bshd ? seq * row : heads * seq * width;
    st[1] = bshd ? width : seq * width;
    st[2] = bshd ? row : width;
}

/* QS_B, QS_H, QS_S, KS_*, VS_*, OS_*: operand_strides as defines; Q_OFF,
 * K_OFF, V_OFF: where q's, k's and v's heads start in their rows. */
void attention_strides(Dispatch *d, const AttentionDims *a) {
    const char *names[4] = {"QS", "KS", "VS", "OS"};
    for (int t = 0; t < 4; t++) {
        int64_t st[3];
        operand_strides(a, t, st);
        define_int(d, format("%s_B", names[t]), st[0]);
        define_int(d, format("%s_H", names[t]), st[1]);
        define_int(d, format("%s_S", names[t]), st[2]);
    }
    define_int(d, "Q_OFF", a->off[0]);
    define_int(d, "K_OFF", a->off[1]);
    define_int(d, "V_OFF", a->off[2]);
}

/* The run's positions of operand i (q, k or v) where they follow the dims
 * (along axis 1 of bshd, 2 of bhsd), else NULL. */
static const DimExpr *positions(const Node *n, const AttentionDims *a, int i) {
    const Tensor *t = n->inputs[i];
    int seq = a->bshd ? 1 : 2;
    return is_dyn(t, seq) ? &t->ext[seq] : NULL;
}

/* The run's batch where q follows the dims along axis 0 (k and v then
 * with it: dynamic.c), else NULL. */
static const DimExpr *run_batch(const Node *n) {
    const Tensor *q = n->inputs[0];
    return is_dyn(q, 0) ? &q->ext[0] : NULL;
}

/* d's workgroups (groups[0], `tasks` a batch: its heads' rows or blocks)
 * follow a dynamic batch where the positions are fixed; where they follow
 * the positions (the caller's dyn_groups_along), a run of fewer batches
 * leaves the rest of them idle (B the run's: their loop ends first). */
static void batch_groups(Dispatch *d, const Node *n, int64_t tasks) {
    if (run_batch(n) && !d->dynamic)
        dyn_groups_along(d, 0, run_batch(n), tasks, 1);
}

/* The spans a row's keys split into (attention.comp's SPLITS): few query
 * rows leave most of a GPU idle, a workgroup per row walking every key
 * (a decode step: one row a head). Rows that follow the dims count at
 * their fewest. Spans of at least 32 keys, until about 512 workgroups; 64
 * invocations, 128 for spans of 128 keys or more. KILN_ATTN_SPLITS=S[,WG]
 * overrides them: alone at a 1.1B Llama's decoding step 8 spans of 128
 * invocations were faster (13.8 against 16.7 us at 384 keys), in the
 * model slower (attention 245 -> 259 us a step;
 * bench/experiments/attn_decode-h200.txt). */
static int64_t attention_splits(const Node *n, const AttentionDims *a) {
    const DimExpr *qpos = positions(n, a, 0);
    int64_t sq = qpos ? dim_expr_min(n->graph, qpos) : a->Sq;
    int64_t rows = a->B * a->H * (sq > 0 ? sq : 1), splits = 1;
    while (rows * splits * 2 <= 512 && a->Sk / (splits * 2) >= 32 && splits < 32)
        splits *= 2;
    return splits;
}

/* The defines attention.comp's two modes share: sizes, strides (of the
 * largest shapes: a run's positions, SQ and SK, may be fewer along any
 * layout's axis). */
static void attention_defines(Dispatch *d, Node *n, const AttentionDims *a) {
    const DimExpr *batch = run_batch(n);
    define_str(d, "B", batch ? format("uint(%s)", dim_expr_glsl(batch, 1))
                             : format("%lld", (long long)a->B));
    define_int(d, "H", a->H);
    define_int(d, "KVH", a->KVH);
    const DimExpr *qpos = positions(n, a, 0), *kpos = positions(n, a, 1);
    define_str(d, "SQ", qpos ? dim_expr_glsl(qpos, 1) : format("%lld", (long long)a->Sq));
    define_str(d, "SK", kpos ? dim_expr_glsl(kpos, 1) : format("%lld", (long long)a->Sk));
    define_int(d, "D", a->D);
    define_int(d, "DV", a->DV);
    attention_strides(d, a);
}

/* What attention.comp and flash.comp share: the storage types of q, k, v,
 * the mask and the output, the score's scale, softcap, causal and window,
 * and the arguments o (out: the output or the spans' parts), q, k, v and
 * the mask (its strides broadcast to [B, H, Sq, Sk]). */
static void attention_scores(Program *p, Dispatch *d, Node *n, const AttentionDims *a,
                             Tensor *out) {
    bool need[3] = {false, false, false};
    const char *names[3] = {"Q", "K", "V"};
    for (int i = 0; i < 3; i++)
        define_storage(p, d, need, names[i], n->inputs[i], false);
    define_storage(p, d, need, "O", n->outputs[0], true);
    if (n->ninputs > 3)
        define_storage(p, d, need, "MASK", n->inputs[3], false);
    define_needs(d, need);
    double scale = attr_float_or(n, "scale", 1.0 / sqrt((double)a->D));
    double cap = attr_float(n, "softcap");
    define_float(d, "SCALE", scale);
    define_int(d, "SOFTCAP_ON", cap > 0);
    define_float(d, "SOFTCAP", cap > 0 ? cap : 1.0);
    define_int(d, "CAUSAL", attr_int(n, "causal") != 0);
    define_int(d, "WINDOW", attr_int(n, "window"));
    dispatch_arg(d, out, true);
    for (int i = 0; i < 3; i++)
        dispatch_arg(d, n->inputs[i], false);
    int64_t ms[4] = {0, 0, 0, 0};
    if (n->ninputs > 3) {
        int64_t full[4] = {a->B, a->H, a->Sq, a->Sk};
        Operand m = broadcast(n->inputs[3], 4, full);
        memcpy(ms, m.strides, sizeof ms);
        dispatch_arg(d, n->inputs[3], false);
    } else {
        dispatch_unused(d, n->inputs[0]); /* the mask slot */
    }
    define_int(d, "HAS_MASK", n->ninputs > 3);
    define_int(d, "MS_B", ms[0]);
    define_int(d, "MS_H", ms[1]);
    define_int(d, "MS_I", ms[2]);
    define_int(d, "MS_J", ms[3]);
    d->flops = (uint64_t)(a->B * a->H * a->Sq * a->Sk) * (uint64_t)(2 * a->D + 2 * a->DV + 5);
}

/* flash.comp's blocks: BQ query rows sharing each chunk of BK keys, in
 * groups of RM rows with TPR invocations a group. */
#define FLASH_MIN_ROWS 8
typedef struct FlashTile {
    int64_t bq, bk, tpr, rm;
} FlashTile;

/* flash.comp's shared memory: the queries' rows in vec4s padded by one, a
 * chunk's keys' rows so (or its values' in vec4s, which take their place),
 * the probabilities' rows padded by one float, and a float a row and
 * lane. */
static int64_t flash_shared_bytes(const AttentionDims *a, FlashTile f) {
    int64_t d4 = (a->D + 3) / 4, dv4 = (a->DV + 3) / 4, kvr = d4 + 1 > dv4 ? d4 + 1 : dv4;
    return 16 * (f.bq * (d4 + 1) + f.bk * kvr) + 4 * (f.bq * (f.bk + 1) + f.bq * f.tpr);
}

/* The fewest query rows a run of n's attention has (its positions' least
 * where they follow the dims). */
static int64_t least_rows(const Node *n, const AttentionDims *a) {
    const DimExpr *qpos = positions(n, a, 0);
    return qpos ? dim_expr_min(n->graph, qpos) : a->Sq;
}

/* Whether attention takes flash.comp, and its blocks: for FLASH_MIN_ROWS
 * or more query rows (dynamic ones: the most; a run of fewer takes
 * attention.comp, lower_attention). The first of these (rows, invocations
 * a group, rows a group) whose blocks number FLASH_GROUPS or more at the
 * fewest rows a run has (the rest: wherever they fit), with the longest
 * chunk of keys (64 down to the lanes) that fits 32 KiB of shared memory:
 * 32 rows in groups of 4, 16 in groups of 2, then a row a group as before
 * (16 rows of 16 invocations, then 8 rows, then 8 invocations a row: D
 * 256 in f32). A group of RM rows reads each key once for all of them.
 * KILN_FLASH=BQ,BK[,TPR[,RM]] overrides the blocks (for tuning; TPR
 * invocations a group, default 16, a divisor of BK; RM rows a group,
 * default 1, a divisor of BQ), KILN_FLASH=0 keeps attention.comp. */
/* Workgroups that fill a large GPU: the bound for flash.comp's row groups
 * and for flash_rows.comp. */
#define FLASH_GROUPS 128
static bool flash_tile(const Node *n, const AttentionDims *a, FlashTile *f) {
    if (a->Sq < FLASH_MIN_ROWS)
        return false;
    const char *tune = getenv("KILN_FLASH");
    long v[4] = {0, 0, 16, 1};
    if (tune && strcmp(tune, "0") == 0)
        return false;
    if (tune && sscanf(tune, "%ld,%ld,%ld,%ld", &v[0], &v[1], &v[2], &v[3]) >= 2 && v[0] > 0 &&
        v[2] > 0 && v[3] > 0 && v[0] % v[3] == 0 && v[0] / v[3] * v[2] <= 1024 &&
        v[1] >= v[2] && v[1] % v[2] == 0) {
        *f = (FlashTile){v[0], v[1], v[2], v[3]};
        return flash_shared_bytes(a, *f) <= 32768;
    }
    static const int64_t tiles[6][3] = {{32, 16, 4}, {16, 16, 2}, {16, 16, 1},
                                        {8, 16, 1},  {16, 8, 1},  {8, 8, 1}};
    int64_t rows = least_rows(n, a);
    for (int i = 0; i < 6; i++) {
        *f = (FlashTile){tiles[i][0], 64, tiles[i][1], tiles[i][2]};
        if (f->rm > 1 && a->B * a->H * ((rows + f->bq - 1) / f->bq) < FLASH_GROUPS)
            continue;
        for (; f->bk >= f->tpr; f->bk /= 2)
            if (flash_shared_bytes(a, *f) <= 32768)
                return true;
    }
    return false;
}

static Dispatch *attention_combine(Program *p, Node *n, const AttentionDims *a, Tensor *part,
                                   int64_t splits);
static Dispatch *flash_dispatch(Program *p, Node *n, const AttentionDims *a, FlashTile f);

/* flash_cm.comp's shared memory for nsg subgroups: the block's queries
 * and, a subgroup, a chunk's keys (or its scores, its p) and values (or
 * its output at the end), and its rows' sums and references (rows padded
 * by a vector). */
static int64_t flash_cm_shared_bytes(const AttentionDims *a, int64_t nsg) {
    int64_t krs = a->D / 8 + 1, vrs = a->DV / 8 + 1, ors = a->DV / 4 + 1;
    int64_t kreg = 16 * (krs > 5 ? krs : 5);
    int64_t area = kreg + 16 * vrs > 16 * ors ? kreg + 16 * vrs : 16 * ors;
    return 16 * (16 * krs + nsg * area) + 8 * nsg * 16;
}

/* flash_rows.comp's shared memory for nsg subgroups of 16 rows, chunks of
 * 16 * kf keys, the values in slices of dvh columns, the queries in shared
 * memory (qshared) or staged there only: a chunk's keys and values' slice,
 * the subgroups' scores (rows padded by a vector). */
static int64_t flash_rows_shared_bytes(const AttentionDims *a, int64_t nsg, int64_t kf,
                                       int64_t dvh, bool qshared) {
    int64_t kc = 16 * kf, krs = a->D / 8 + 1, vrs = dvh / 8 + 1, srs = kc / 4 + 1;
    int64_t chunk = kc * (krs + vrs) + nsg * 16 * srs, q = 16 * nsg * krs;
    return 16 * (qshared ? chunk + q : chunk > q ? chunk : q);
}

/* flash_rows.comp (blocks of 16 * NSG query rows, each chunk of keys
 * loaded once for them) where its blocks alone fill a large GPU (at least
 * FLASH_GROUPS workgroups at the fewest rows a run has): long
 * sequences and batches, where flash_cm.comp's blocks of 16 rows re-read
 * every key and value once per 16 rows. Queries wider than 128 stay in
 * shared memory, values wider than 128 go by in slices (registers). Since
 * both kernels take one pass over the keys (2026-12-07), bench/ops.py's
 * sweep on an H100 (each result checked against torch first;
 * bench/experiments/flash-onepass-h100.txt) has it ahead at every width
 * where it applies: f16 attention at seq 4096, causal, D 64 331 -> 302 us,
 * 8 x 12 heads of 128 rows, D 64, masked 28.5 -> 21.4, 64 x 3 windows of
 * 49 rows, D 32 13.2 -> 9.7 (at D 128 the default since the day before:
 * two-pass, seq 8192 causal 3197 -> 2711 us). KILN_FLASH_ROWS=1 takes it
 * wherever it applies (tests and tuning), =0 never; NULL where it does not
 * apply or would not fill the GPU. */
static Dispatch *flash_rows_dispatch(Program *p, Node *n, const AttentionDims *a) {
    const char *tune = getenv("KILN_FLASH_ROWS");
    if (tune && strcmp(tune, "1") != 0 && strcmp(tune, "auto") != 0)
        return NULL;
    int64_t dvh = a->DV; /* the largest multiple of 16 dividing DV, up to 128 */
    while (dvh > 128 || a->DV % dvh || dvh % 16)
        dvh -= 16;
    bool qshared = a->D > 128;
    int64_t nsg = 4, kf = 2;
    while (flash_rows_shared_bytes(a, nsg, kf, dvh, qshared) > 49152 && (nsg > 2 || kf > 1)) {
        if (kf > 1)
            kf--;
        else
            nsg /= 2;
    }
    int64_t bytes = flash_rows_shared_bytes(a, nsg, kf, dvh, qshared);
    int64_t groups = a->B * a->H * ((least_rows(n, a) + 16 * nsg - 1) / (16 * nsg));
    if (bytes > 49152 || (!(tune && strcmp(tune, "1") == 0) && groups < FLASH_GROUPS))
        return NULL;
    Dispatch *d = new_dispatch(p, n, "flash_rows");
    d->needs = KILN_FEATURE_COOPMAT;
    if (bytes > 32768) /* past what every device has */
        d->needs |= KILN_FEATURE_SHARED48K;
    d->local_size = (uint32_t)(32 * nsg);
    define_int(d, "NSG", nsg);
    define_int(d, "KF", kf);
    define_int(d, "DVH", dvh);
    define_int(d, "QSHARED", qshared);
    attention_defines(d, n, a);
    attention_scores(p, d, n, a, n->outputs[0]);
    d->groups[0] = groups_for(a->B * a->H * ((a->Sq + 16 * nsg - 1) / (16 * nsg)), 1);
    return d;
}

/* flash.comp on the matrix units, for devices with cooperative matrices,
 * where it applies: q, k and v f16 (read as vectors of eight halves: D and
 * DV multiples of 16 make every stride a multiple of 8), D and DV at most
 * 256. flash_rows.comp where it fills the GPU (above), else flash_cm.comp:
 * blocks of 16 query rows, 8 subgroups a block sharing its keys (fewer
 * where their shared memory would pass 48 KiB; past 32 KiB the dispatch
 * needs KILN_FEATURE_SHARED48K too). Measured on an H200 inside BERT-base,
 * GPT-2, ViT-B/16 and a Llama (D 64; us an attention, 8 / 4 / 2
 * subgroups): 10.1 / 11.3 / 15.2, 10.0 / 11.1 / 15.2, 16.3 / 21.0 / 18.9,
 * 10.3 / 11.6 / 15.9; flash.comp 13.3 in GPT-2, 29.2 in ViT-B/16
 * (bench/experiments/flash-h200.txt). NULL where neither applies, or with
 * KILN_FLASH_CM=0 (for comparison; KILN_FLASH_CM=1, 2, 4 or 8 sets
 * flash_cm.comp's subgroups, for tuning); the caller records flash.comp as
 * its variant for the other devices. *rows: the query rows a workgroup
 * takes. */
static Dispatch *flash_cm_dispatch(Program *p, Node *n, const AttentionDims *a,
                                   int64_t *rows) {
    const char *tune = getenv("KILN_FLASH_CM");
    long want = tune ? strtol(tune, NULL, 10) : 8; /* 0: off; 1, 2, 4, 8: NSG */
    if ((tune && strcmp(tune, "0") == 0) || a->D % 16 || a->DV % 16 || a->D > 256 ||
        a->DV > 256)
        return NULL;
    for (int i = 0; i < 3; i++) /* rows and heads in vectors of eight halves */
        if (a->row[i] % 8 || a->off[i] % 8)
            return NULL;
    for (int i = 0; i < 3; i++)
        if (n->inputs[i]->dtype != KILN_DTYPE_F16)
            return NULL;
    Dispatch *d = flash_rows_dispatch(p, n, a);
    if (d) {
        *rows = 16 * (int64_t)d->local_size / 32;
        return d;
    }
    int64_t nsg = want == 1 || want == 2 || want == 4 ? want : 8;
    while (nsg > 1 && flash_cm_shared_bytes(a, nsg) > 49152)
        nsg /= 2;
    if (flash_cm_shared_bytes(a, nsg) > 49152)
        return NULL;
    d = new_dispatch(p, n, "flash_cm");
    d->needs = KILN_FEATURE_COOPMAT;
    if (flash_cm_shared_bytes(a, nsg) > 32768) /* past what every device has */
        d->needs |= KILN_FEATURE_SHARED48K;
    d->local_size = (uint32_t)(32 * nsg);
    define_int(d, "NSG", nsg);
    attention_defines(d, n, a);
    attention_scores(p, d, n, a, n->outputs[0]);
    d->groups[0] = groups_for(a->B * a->H * ((a->Sq + 15) / 16), 1);
    *rows = 16;
    return d;
}

/* Flash attention over a's rows: flash_cm.comp where it applies, with
 * flash.comp as its variant for devices without cooperative matrices, else
 * flash.comp; their workgroups follow the query positions where they do
 * (qpos: B * H rows each). Returns the first; its variant (if any) the
 * other. */
static Dispatch *flash_dispatches(Program *p, Node *n, const AttentionDims *a, FlashTile f,
                                  const DimExpr *qpos) {
    int64_t rows = 16;
    Dispatch *cm = flash_cm_dispatch(p, n, a, &rows);
    if (cm && qpos)
        dyn_groups_along(cm, 0, qpos, a->B * a->H, rows);
    if (cm)
        batch_groups(cm, n, a->H * ((a->Sq + rows - 1) / rows));
    Dispatch *fl = flash_dispatch(p, n, a, f);
    if (qpos)
        dyn_groups_along(fl, 0, qpos, a->B * a->H, f.bq);
    batch_groups(fl, n, a->H * ((a->Sq + f.bq - 1) / f.bq));
    if (!cm)
        return fl;
    fl->unless = cm->needs; /* devices that lack one of them */
    cm->variant = fl;
    return cm;
}

void lower_attention(Program *p, Node *n) {
    AttentionDims a;
    attention_dims(n, &a);
    if (a.B * a.H * a.Sq * a.DV == 0)
        return;
    FlashTile f;
    bool flash = flash_tile(n, &a, &f);
    /* q dynamic: along its positions (dynamic.c refuses others) */
    const DimExpr *qpos = positions(n, &a, 0);
    if (flash && (!qpos || dim_expr_min(n->graph, qpos) >= FLASH_MIN_ROWS)) {
        flash_dispatches(p, n, &a, f, qpos);
        return;
    }
    int64_t splits = attention_splits(n, &a), rows = a.B * a.H * a.Sq;
    /* KILN_ATTN_SPLITS=S[,WG]: the spans and invocations, for tuning
     * (bench/experiments/attn_decode.py) */
    const char *tune_s = getenv("KILN_ATTN_SPLITS");
    long ts[2] = {0, 0};
    int nts = tune_s ? sscanf(tune_s, "%ld,%ld", &ts[0], &ts[1]) : 0;
    if (nts >= 1 && ts[0] >= 1 && ts[0] <= 64)
        splits = ts[0];
    uint32_t wg = a.Sk / splits >= 128 ? 128 : 64; /* of the spans in effect */
    if (nts == 2 && (ts[1] == 32 || ts[1] == 64 || ts[1] == 128 || ts[1] == 256))
        wg = (uint32_t)ts[1];
    Tensor *part = splits > 1 ? scratch(p, n, "parts", 2,
                                        (int64_t[]){rows * splits, a.DV + 2}) : NULL;
    Dispatch *d = new_dispatch(p, n, "attention");
    d->local_size = wg;
    define_int(d, "WG", d->local_size);
    attention_defines(d, n, &a);
    define_int(d, "SPLITS", splits);
    int64_t ks[3];
    operand_strides(&a, 1, ks);
    bool kvec4 = a.D % 4 == 0 && all_multiples(3, ks, 4) && a.off[1] % 4 == 0 &&
                 n->inputs[1]->dtype == KILN_DTYPE_F32;
    define_int(d, "KVEC4", kvec4);
    /* A span (or row) of at most 64 keys, one chunk: its values loaded
     * first, in registers, at most 64 an invocation (VPRE), and f32 keys
     * in vec4s too while values and key stay within 128 registers (KPRE;
     * the 1.1B Llama's decoding step: 48 values and 64 key elements,
     * bench/experiments/attn_decode-h200.txt). KILN_ATTN_VPRE=0 off, for
     * comparison. */
    int64_t span = (a.Sk + splits - 1) / splits, acc_n = (a.DV + wg - 1) / wg;
    const char *vpre_env = getenv("KILN_ATTN_VPRE");
    if (span <= wg && span * acc_n <= 64 && !(vpre_env && strcmp(vpre_env, "0") == 0)) {
        define_int(d, "VPRE", span);
        if (kvec4 && span * acc_n + a.D <= 128)
            define_int(d, "KPRE", 1);
    }
    attention_scores(p, d, n, &a, part ? part : n->outputs[0]);
    d->groups[0] = groups_for(rows * splits, 1);
    if (qpos)
        dyn_groups_along(d, 0, qpos, a.B * a.H * splits, 1);
    batch_groups(d, n, a.H * a.Sq * splits);
    /* the spans' parts combined by each row's last span workgroup, or
     * (KILN_SPLIT_LAST=0, for comparison) by a second dispatch */
    bool last = part && !split_last_off();
    if (last) {
        define_int(d, "COMBINE_LAST", 1);
        dispatch_arg(d, n->outputs[0], true);
        bind_counters(p, d, rows);
        d->flops += (uint64_t)(rows * splits * a.DV) * 3;
    }
    Dispatch *c = part && !last ? attention_combine(p, n, &a, part, splits) : NULL;
    if (!flash)
        return;
    /* Dynamic rows up to at least FLASH_MIN_ROWS (a decoder's prompt and
     * its steps): attention.comp (and its combining pass) for runs of
     * fewer, flash.comp for the rest; a run gives workgroups to one of
     * them (work_min, work_max over the run's rows) and no barrier
     * separates the variants (schedule.c). */
    d->work_max = (FLASH_MIN_ROWS - 1) * d->scale;
    if (c)
        c->work_max = (FLASH_MIN_ROWS - 1) * c->scale;
    Dispatch *fl = flash_dispatches(p, n, &a, f, qpos); /* scale: B * H rows a position */
    for (Dispatch *v = fl; v; v = v->variant)
        v->work_min = FLASH_MIN_ROWS * v->scale;
    (c ? c : d)->variant = fl;
}

/* attention.comp's second pass (COMBINE): the spans' parts weighed into
 * the output, a workgroup per row. */
static Dispatch *attention_combine(Program *p, Node *n, const AttentionDims *a, Tensor *part,
                                   int64_t splits) {
    int64_t rows = a->B * a->H * a->Sq;
    Dispatch *c = new_dispatch(p, n, "attention");
    c->local_size = 64;
    define_int(c, "WG", 64);
    define_int(c, "COMBINE", 1);
    attention_defines(c, n, a);
    bool cneed[3] = {false, false, false};
    define_storage(p, c, cneed, "O", n->outputs[0], true);
    define_needs(c, cneed);
    define_int(c, "SPLITS", splits);
    dispatch_arg(c, n->outputs[0], true);
    dispatch_arg(c, part, false);
    c->groups[0] = groups_for(rows, 1);
    const DimExpr *qpos = positions(n, a, 0);
    if (qpos)
        dyn_groups_along(c, 0, qpos, a->B * a->H, 1);
    batch_groups(c, n, a->H * a->Sq);
    c->flops = (uint64_t)(rows * splits * a->DV) * 3;
    return c;
}

/* flash.comp over all of a's query rows, in blocks f (their count follows
 * the dims where the rows do: the caller's dyn_groups). */
static Dispatch *flash_dispatch(Program *p, Node *n, const AttentionDims *a, FlashTile f) {
    Dispatch *d = new_dispatch(p, n, "flash");
    d->local_size = (uint32_t)(f.bq / f.rm * f.tpr);
    define_int(d, "WG", d->local_size);
    define_int(d, "BQ", f.bq);
    define_int(d, "BK", f.bk);
    define_int(d, "TPR", f.tpr);
    define_int(d, "RM", f.rm);
    attention_defines(d, n, a);
    attention_scores(p, d, n, a, n->outputs[0]);
    d->groups[0] = groups_for(a->B * a->H * ((a->Sq + f.bq - 1) / f.bq), 1);
    return d;
}

/* Whether a dispatch after `at` writes t (or what t views). */
static bool written_after(const Program *p, int at, Tensor *t) {
    for (int i = at + 1; i < p->ndispatches; i++)
        for (int k = 0; k < p->dispatches[i]->nargs; k++)
            if (tensor_root(p->dispatches[i]->args[k]) == tensor_root(t) &&
                (p->dispatches[i]->writes >> k & 1u))
                return true;
    return false;
}

/* A decoding step's one row: rope node n (its dispatch d) of a part of a
 * QKV product (the first two parts; n's input the part or a view of it,
 * read by n alone) done by that product's one-row matvec_k variant as it
 * stores the part (matvec_k.comp's ROPE_D: its workgroups then take pairs
 * of a head's columns), into y (region: where a decoder's keys go in the
 * cache state); d then runs only for more rows. Rotate-half over whole
 * heads, tables made before the product. Returns whether it did. */
static bool rope_after_product(Program *p, Node *n, Dispatch *d, Tensor *y,
                               const Operand *region) {
    Tensor *x = n->inputs[0], *cs = n->inputs[1], *sn = n->inputs[2], *part = x;
    int64_t D = x->shape[x->rank - 1];
    if (n->op != OP_ROPE || !every_run(d) || attr_int(n, "interleaved") ||
        attr_int_or(n, "n_rot", D) != D || D % 2 || x->uses != 1)
        return false;
    while (part->producer && is_view_op(part->producer->op) && part->uses == 1)
        part = part->producer->inputs[0];
    Node *root = part->producer;
    if (root && root->fused_into)
        root = root->fused_into;
    if (!root || root->nsiblings < 1 || root->split_out || part->uses != 1 || part->is_output)
        return false;
    int which = part == root->outputs[0] ? 0 : part == root->siblings[0]->outputs[0] ? 1 : -1;
    Dispatch *one = one_row_of(p, root, d);
    int at = 0;
    while (at < p->ndispatches && p->dispatches[at] != one)
        at++;
    int64_t N = one ? define_value(one, "N") : 0, n0 = one ? define_value(one, "SPLIT_N0") : 0,
            n1 = one ? define_value(one, "SPLIT_N1") : 0,
            have = one ? define_value(one, "ROPE_D") : 0;
    if (which < 0 || (which == 0 && region) || !one || define_value(one, "CN") < 2 ||
        define_value(one, "GLU") || (have && have != D) || n0 % D || n1 % D ||
        (N - n0 - n1) % D || (N / 2) % (D / 2) || written_after(p, at, cs) ||
        written_after(p, at, sn) || (have && (one->args[10] != cs || one->args[11] != sn)) ||
        define_value(one, which ? "ROPE1" : "ROPE0"))
        return false;
    /* f32, or f16 where the kernel has 16-bit storage (its A or C f16) */
    bool f16 = one->args[0]->dtype == KILN_DTYPE_F16 || one->args[1]->dtype == KILN_DTYPE_F16;
    const Tensor *all[3] = {y, cs, sn};
    for (int k = 0; k < 3; k++)
        if (all[k]->dtype != KILN_DTYPE_F32 && (all[k]->dtype != KILN_DTYPE_F16 || !f16))
            return false;
    bool need[3] = {false, false, false}; /* recorded already */
    if (!have) {
        if (one->nargs != 8)
            return false;
        define_int(one, "ROPE_D", D);
        define_storage(p, one, need, "RC", cs, false);
        define_storage(p, one, need, "RS", sn, false);
        dispatch_unused(one, part); /* r0 */
        dispatch_unused(one, part); /* r1 */
        dispatch_arg(one, cs, false);
        dispatch_arg(one, sn, false);
    }
    define_int(one, which ? "ROPE1" : "ROPE0", 1);
    define_storage(p, one, need, which ? "R1" : "R0", y, true);
    if (region)
        define_str(one, "ROPE1_BASE",
                   region->dyn_base ? format("uint(%s)", dim_expr_glsl(&region->base_expr, 1))
                                    : format("%lldu", (long long)region->base));
    dispatch_rebind(one, 8 + which, y, true);
    d->work_min = 2 * d->scale;
    return true;
}

/* rope: for each rotated pair (x1, x2) at position s and frequency j,
 *   y1 = x1 cos[s, j] - x2 sin[s, j],   y2 = x2 cos[s, j] + x1 sin[s, j];
 * pairs are (j, j + R/2) (rotate-half) or (2j, 2j + 1) (interleaved). One
 * elementwise dispatch over the rotated part seen as [..., 2, R/2] (p, j;
 * interleaved: [..., R/2, 2]): y[p] = x[p] cos + sign[p] x[1 - p] sin, the
 * partner read at a negative stride and sign a table (-1, 1); and a copy of
 * the unrotated tail when n_rot < D. (Two dispatches, one per half, would
 * write interleaved bytes of one tensor: a barrier between them.) */
void lower_rope(Program *p, Node *n) {
    Tensor *x = n->inputs[0], *out = n->outputs[0];
    int rank = x->rank;
    int64_t D = x->shape[rank - 1], R = attr_int_or(n, "n_rot", D), half = R / 2;
    int axis = (int)attr_int(n, "seq_axis");
    if (axis < 0)
        axis += rank;
    bool inter = attr_int(n, "interleaved") != 0;
    /* rope_grad: the rotation's transpose, by -angle */
    bool back = n->op == OP_ROPE_GRAD;
    static const float forward_sign[2] = {-1, 1}, back_sign[2] = {1, -1};
    Tensor *sign = table_weight(p, n, back ? "kiln.rope_sign_back" : "kiln.rope_sign", 1,
                                (int64_t[]){2}, back ? back_sign : forward_sign);
    int64_t shape[MAX_RANK + 1];
    memcpy(shape, x->shape, sizeof(int64_t) * (size_t)rank);
    Operand self = whole(x), partner, y, c = {n->inputs[1], {0}, 0, false, {0, {0}}};
    Operand sg = {sign, {0}, 0, false, {0, {0}}};
    c.strides[axis] = half;
    /* The last axis becomes two: the pair member p (stride ps in x) and
     * the frequency j (stride js), in the order that walks x forward. */
    int pa = inter ? rank : rank - 1, ja = inter ? rank - 1 : rank;
    int64_t ps = inter ? 1 : half, js = inter ? 2 : 1;
    shape[pa] = 2;
    shape[ja] = half;
    self.strides[pa] = ps;
    self.strides[ja] = js;
    partner = self;
    partner.strides[pa] = -ps;
    partner.base = ps;
    y = self;
    y.t = out;
    /* a decoder's keys: written straight into the cache state */
    Operand region;
    bool appended = n->op == OP_ROPE && append_region(p, out, &region);
    if (appended) {
        y.t = region.t;
        y.base = region.base;
        y.dyn_base = region.dyn_base;
        y.base_expr = region.base_expr;
    }
    c.strides[pa] = 0;
    c.strides[ja] = 1;
    Operand s = c;
    s.t = n->inputs[2];
    sg.strides[pa] = 1;
    Operand in[5] = {self, partner, c, s, sg};
    Dispatch *d = eltwise_dispatch(p, n, rank + 1, shape, y, 5, in, "float",
                                   "a * c + e * b * d", dyn_one(x));
    /* at a decoding step's one row, in the QKV product before it */
    if (R == D)
        rope_after_product(p, n, d, y.t, appended ? &region : NULL);
    if (R < D) {
        Operand tail_in = whole(x), tail_out = appended ? region : whole(out);
        tail_in.base = R;
        tail_out.base += R;
        tail_out.base_expr.c0 += R;
        memcpy(shape, x->shape, sizeof(int64_t) * (size_t)rank);
        shape[rank - 1] = D - R;
        copy(p, n, rank, shape, tail_out, tail_in, dyn_one(x));
    }
}


/* attention_grad: an invocation per query row (dq, and each row's
 * log-sum-exp and dy . o in a scratch), then one per key row (dk, dv). */
void lower_attention_grad(Program *p, Node *n) {
    AttentionDims a;
    attention_dims(n, &a);
    if (a.B * a.H * a.Sq * a.Sk == 0)
        return;
    Tensor *stats = scratch(p, n, "stats", 2, (int64_t[]){a.B * a.H * a.Sq, 2});
    double scale = attr_float_or(n, "scale", 1.0 / sqrt((double)a.D));
    for (int pass = 0; pass < 2; pass++) {
        Dispatch *d = new_dispatch(p, n, "grad");
        d->local_size = 64;
        define_int(d, "WG", 64);
        define_int(d, "MODE", 2 + pass);
        define_int(d, "B", a.B);
        define_int(d, "H", a.H);
        define_int(d, "KVH", a.KVH);
        define_int(d, "SQ", a.Sq);
        define_int(d, "SK", a.Sk);
        define_int(d, "D", a.D);
        define_int(d, "DV", a.DV);
        attention_strides(d, &a);
        define_float(d, "SCALE", scale);
        define_int(d, "CAUSAL", attr_int(n, "causal") != 0);
        dispatch_arg(d, n->outputs[pass ? 1 : 0], true);
        dispatch_arg(d, pass ? n->outputs[2] : stats, true);
        dispatch_arg(d, n->inputs[3], false);
        for (int i = 0; i < 3; i++)
            dispatch_arg(d, n->inputs[i], false);
        if (pass)
            dispatch_arg(d, stats, false);
        d->groups[0] = groups_for(pass ? a.B * a.KVH * a.Sk : a.B * a.H * a.Sq, 64);
        d->flops = (uint64_t)(a.B * a.H * a.Sq * a.Sk) * (uint64_t)(4 * a.D + 4 * a.DV);
    }
}
