/*
 * kiln.h: the compiler's one internal header.
 *
 * The compiler is a pipeline of passes over plain data:
 *
 *   load_yaml -> infer_shapes -> rewrite -> optimize -> lower -> plan_memory
 *     -> schedule -> compile_kernels -> emit_c
 *
 * Graph, Node and Tensor describe the model; Program and Dispatch describe
 * what will run. Each pass is one file exporting one entry function, listed
 * below in a section named after the file. The compiler is a short-lived
 * program: it allocates from the heap and never frees; on the first error it
 * prints a located message and exits with status 1 before writing anything.
 */
#ifndef KILN_H
#define KILN_H

#include <limits.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "../runtime/kiln_rt.h"

/* One version for the compiler and the runtime it emits code for. */
#define KILN_VERSION KILN_RT_VERSION
#define MAX_RANK KILN_MAX_RANK
#define MAX_ARGS KILN_MAX_BINDINGS
#define MAX_DIMS KILN_MAX_DIMS

/* ---- util.c ------------------------------------------------------------ */

/* A place in an input file; line and col start at 1. file NULL: no place. */
typedef struct Loc {
    const char *file;
    int line, col;
} Loc;

void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t size);
char *xstrdup(const char *s);
void xfree(void *p);
/* NULL when out of memory (for callers that report it themselves). */
void *try_alloc(size_t size);
/* Frees every allocation and runs the cleanups registered with on_reset:
 * for programs that run the front end many times (tests/fuzz). */
void kiln_free_all(void);
void on_reset(void (*fn)(void *), void *arg);
void cancel_reset(void *arg);
/* When set, errors longjmp here instead of exiting (tests/fuzz); kiln_quiet
 * drops their messages. Internal errors abort when a trap is set. */
extern jmp_buf *kiln_error_trap;
extern bool kiln_quiet;
char *format(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* IEEE half precision (binary16) from and to float, round to nearest even. */
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);

/* file:line:col: error: ..., then the source line with a caret; exit(1)
 * (or longjmp to kiln_error_trap). */
_Noreturn void error_at(Loc loc, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* error_at with the node named first: "node 'NAME': ...", at the node's
 * line (node_error) or at loc (an attribute's or an input's). */
typedef struct Node Node;
_Noreturn void node_error(const Node *n, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
_Noreturn void node_error_at(const Node *n, Loc loc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* kiln: error: ...; exit(1). */
_Noreturn void fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
_Noreturn void internal_failure(const char *file, int line, const char *msg);
#define internal_error(...) internal_failure(__FILE__, __LINE__, format(__VA_ARGS__))

/* A growable string. */
typedef struct Str {
    char *buf;
    size_t len, cap;
} Str;
void str_add(Str *s, const char *text);
void str_addf(Str *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void str_addn(Str *s, const void *data, size_t n);

/* Growable array of pointers. */
typedef struct Vec {
    void **data;
    int len, cap;
} Vec;
void vec_push(Vec *v, void *item);

/* A string-keyed hash map (open addressing); values are pointers. */
typedef struct Map {
    const char **keys;
    void **vals;
    int cap, len;
} Map;
void *map_get(const Map *m, const char *key);
void map_put(Map *m, const char *key, void *val);

uint64_t hash_bytes(uint64_t h, const void *data, size_t n); /* FNV-1a 64 */
#define HASH_SEED 1469598103934665603ull

/* Reads a whole file; NULL when it cannot be opened (errno set). */
char *read_file(const char *path, size_t *out_size);
/* Threads for `jobs` independent jobs: min(jobs, cores, 16), or KILN_JOBS
 * (the kernel compiles, the weights checksum). */
int worker_threads(int jobs);
/* Calls fn(ctx, t, threads) for t in [0, threads) (at most 64), t > 0 on
 * threads of their own (on this one where none can start), t = 0 on this
 * one; returns when every call has. Each call takes the stripe of the work
 * its t names: items t, t + threads, ... */
void run_striped(int threads, void (*fn)(void *ctx, int index, int threads), void *ctx);
/* A regular file's bytes as a private, writable mapping (writes stay in
 * this process; it lasts until exit), else read_file's copy. */
char *map_file(const char *path, size_t *out_size);
/* Drops the whole pages within [p, p + n) of a file mapping, or of a
 * block that lasts until exit, from this process's memory: a page of a
 * file faults in again if read, one of a block reads as zeros (for bytes
 * nothing reads again). */
void drop_pages(const void *p, uint64_t n);
/* Opens a regular file and tells its size; NULL with errno set otherwise
 * (a directory, a device or a pipe is refused: weights are read by range). */
FILE *open_regular(const char *path, uint64_t *size);
/* Reads n bytes at offset; false on a short read or a failed seek. */
bool read_at(FILE *f, uint64_t offset, void *dst, uint64_t n);
/* Writes atomically: a temporary beside path, then rename. false on error. */
bool write_file(const char *path, const void *data, size_t size);

/* a * b, saturated at INT64_MIN / INT64_MAX instead of overflowing: a
 * shape built from hostile input then fails the element-count checks. */
int64_t sat_mul(int64_t a, int64_t b);
/* (int64_t)x without C's undefined cases: saturates, and NaN is 0. Narrower
 * integers take the low bits of the result. */
int64_t double_to_i64(double x);
int64_t shape_count(int rank, const int64_t *shape); /* saturating */
char *shape_str(int rank, const int64_t *shape); /* "[2, 3]" */
uint64_t align_up(uint64_t x, uint64_t a);

/* ---- graph ------------------------------------------------------------- */

/* An op's max_inputs when it takes any number (ops.def). */
#define VARIADIC INT_MAX

typedef enum OpKind {
#define OP(id, name, mn, mx, flags, attrs, shape, lower, dyn, expr) OP_##id,
#include "ops.def"
#undef OP
    OP_COUNT
} OpKind;

/* OpInfo.flags (ops.def's flags column) */
enum { ACTIVATION = 1 };

typedef struct OpInfo {
    const char *name;
    int min_inputs, max_inputs;
    unsigned flags;    /* ACTIVATION */
    const char *attrs; /* space-separated */
    const char *expr;  /* elementwise GLSL expression or NULL */
} OpInfo;
extern const OpInfo op_info[OP_COUNT];
/* OP_COUNT when no op has this name. */
OpKind op_lookup(const char *name);
/* An epilogue's `activation` attribute: the op it names (an ACTIVATION row),
 * OP_COUNT for "none", -1 for any other name. */
int activation_lookup(const char *name);
/* "none relu sigmoid ...": the names activation_lookup knows. */
const char *activation_names(void);
/* reshape, squeeze, unsqueeze, flatten: the same elements in order under
 * another shape (a view; lower_view). */
bool is_view_op(OpKind op);
/* NULL when op takes n inputs, else why not ("takes 2 inputs, got 3"). */
const char *op_arity_error(OpKind op, int n);
/* The default of an op's attribute ("" when it has none), or NULL when the
 * op does not take that attribute. */
const char *op_attr_default(OpKind op, const char *key);

/* T_STATE: lives on the device between runs (YAML `state:`); a run reads it
 * and, when it has an update tensor, leaves that tensor's value in it. */
typedef enum TensorKind { T_INPUT, T_WEIGHT, T_VALUE, T_STATE } TensorKind;

/* An extent that follows the dynamic dimensions: c0 + sum c[i] * dim i. */
typedef struct DimExpr {
    int64_t c0;
    int64_t c[MAX_DIMS];
} DimExpr;

/* How a dimension gets its value: given (declared), or derived from the
 * dims before it (dynamic_dims.c derive_dim): the product, the quotient rounded
 * down, the maximum or the minimum of two expressions of them. The values
 * match the runtime's KILN_DIM_MUL ... KILN_DIM_MIN. */
typedef enum DimOp { DIM_DECLARED = 0, DIM_MUL, DIM_DIV, DIM_MAX, DIM_MIN } DimOp;

/* A dynamic dimension (YAML `dims: {seq: 1..2048}`, ONNX --shape
 * seq=1..2048), or one derived from them (the declared ones come first). */
typedef struct DimSym {
    const char *name;
    int64_t lo, hi;
    Loc loc;
    DimOp op;
    DimExpr a, b; /* a derived dim's operands */
} DimSym;

/* Where a weight's bytes come from (YAML `file`, `safetensors`, `values`,
 * `value`, `init`). */
typedef enum WeightFrom {
    W_FILE, W_SAFETENSORS, W_VALUES, W_NORMAL, W_UNIFORM
} WeightFrom;

typedef struct WeightSource {
    WeightFrom from;
    const char *path;   /* W_FILE, W_SAFETENSORS: as resolved */
    uint64_t offset;    /* W_FILE: bytes */
    const char *key;    /* W_SAFETENSORS */
    double *values;     /* W_VALUES: nvalues numbers, or 1 to fill */
    int64_t nvalues;
    double a, b;        /* W_NORMAL: std, mean; W_UNIFORM: low, high */
    uint64_t seed;
    Loc loc;            /* of the source description */
} WeightSource;

/* A weight that arrived as 8-bit codes (an ONNX DequantizeLinear of a
 * constant, folded to f32 values): the codes, and the scale and zero point
 * of each, so that quantize.c can store a matmul's B as they are. */
typedef struct QuantCodes {
    const uint8_t *codes; /* one byte per element, the tensor's layout; NULL: none */
    bool is_signed;       /* int8 codes, else uint8 */
    const float *scale;   /* one per tensor, per index of axis, or per block */
    const uint8_t *zero;  /* zero points laid out like scale (codes' type), or NULL */
    int axis;             /* the axis the scales vary along; -1: one scale */
    int64_t block;        /* the indices of axis that share one scale; 0: each its own */
} QuantCodes;

typedef struct Tensor {
    const char *name;
    int id;
    TensorKind kind;
    kiln_dtype dtype;
    int rank;
    int64_t shape[MAX_RANK];
    bool is_output;
    /* Axes that follow the dynamic dimensions (dynamic.c): bit i of
     * dyn_axes set, a run has ext[i] elements along axis i, and shape[i] is
     * the largest value of ext[i]. The tensor is stored at its largest
     * shape; a run's elements past its extents are don't-care. */
    uint32_t dyn_axes;
    DimExpr ext[MAX_RANK];
    /* dynamic: one axis follows the dims and every axis before it is 1
     * (ext[dyn_axis] = extent): a run's elements are then a prefix of the
     * bytes, which kernels, copies and the runtime follow. Other dynamic
     * tensors are computed at their largest shape. */
    bool dynamic;
    int dyn_axis;
    DimExpr extent;
    Loc loc;            /* where it is defined */
    Node *producer;     /* NULL for inputs and weights */
    /* --guard: the 16 bytes where a dispatch reports a run-time index outside
     * its axis (lower_index.c), and which: a guard entry's index_node */
    const char *index_report;
    /* weights */
    WeightSource src;
    uint8_t *data;      /* little-endian, bytes() long, after load */
    bool owns_data;     /* data is a block of its own (xcalloc'd for it, not in a
                         * mapped file), which release_weight frees */
    bool file_bytes;    /* data is borrowed, kept until exit: an ONNX initializer's
                         * raw data in the model file's bytes (mapped, or read
                         * whole), or a folded view's source; release_weight drops
                         * its whole pages */
    QuantCodes quant;   /* rank-2 f32 weights folded from 8-bit codes */
    /* memory: set by lower (views) and plan_memory */
    struct Tensor *alias; /* the tensor whose bytes this one shares, or NULL */
    uint64_t view_offset; /* bytes into alias's where this one starts (a gather
                           * of one index where the axes before it are 1) */
    uint32_t buffer;    /* KILN_BUFFER_* */
    uint64_t offset;    /* bytes into that buffer */
    int first, last;    /* live range in dispatch indices (plan_memory) */
    uint64_t io_offset; /* staging offset of inputs and outputs */
    int uses;           /* inputs of live nodes that read it (optimize) */
    bool appended;      /* its producer wrote it into the state that its one
                         * reader, a concat, appends it to (lower) */
    /* state: the tensor whose value it takes after each run (or NULL), and
     * its bytes on the device (the larger of its own and the update's). */
    struct Tensor *update;
    Loc update_loc;
    uint64_t storage;
    bool is_update;     /* some state's update: kept whole, live to the end */
    /* rows decided at run time (nms): the i64 [1] tensor that holds how many
     * of the leading rows are valid (the rest are -1), or NULL */
    struct Tensor *row_count;
} Tensor;

/* Whether d is a float dtype (f32 or f16). */
static inline bool is_float(kiln_dtype d) { return d == KILN_DTYPE_F32 || d == KILN_DTYPE_F16; }
/* Element i of a weight's values, f32 or f16 (an f16 model's). */
float weight_float(const Tensor *t, int64_t i);

uint64_t tensor_bytes(const Tensor *t);
/* The bytes a tensor's slot needs (a state's storage, else tensor_bytes). */
uint64_t slot_bytes(const Tensor *t);
int64_t tensor_count(const Tensor *t);
/* The same rank and dims. */
bool shape_equal(const Tensor *a, const Tensor *b);
/* The tensor that owns the bytes (follows alias). */
Tensor *tensor_root(Tensor *t);
/* Where t's bytes start in its root's buffer: the root's offset plus the
 * views' offsets on the way. */
uint64_t tensor_base(Tensor *t);
/* Element i of a weight of i32 or i64 indices, as int64. */
int64_t index_value(const Tensor *t, int64_t i);

typedef struct Attr {
    const char *key;
    Loc loc;            /* of the value */
    bool is_list;
    const char *scalar; /* when !is_list */
    const char **items; /* when is_list */
    Loc *item_locs;
    int nitems;
} Attr;

struct Node {
    const char *name;
    int id;             /* order in the file */
    OpKind op;
    Loc loc;
    Tensor **inputs;
    Loc *input_locs;
    int ninputs;
    Tensor **outputs;
    int noutputs;
    Attr *attrs;
    int nattrs;
    struct Graph *graph; /* the graph it belongs to (its dims) */
    bool inferred;      /* infer_node has checked it and set its outputs */
    bool dead;          /* removed by optimize */
    /* A reshape's output axes that its shape gives as constants (an ONNX
     * Reshape's positive literals): never dynamic, whatever their sizes
     * match (dynamic.c). */
    uint32_t fixed_axes;
    /* Fusion (optimize.c): the node whose dispatch computes this one, and
     * for a matmul or conv the bias add (conv: batch_norm, folded into its
     * weights), a conv's residual add and the activation its epilogue
     * absorbed; epi_perm: a transpose to channels last after a grouped
     * conv, whose dispatch writes that layout, or the transpose back to
     * channels first after a norm between two (the norm then runs over
     * the channels in place). */
    struct Node *fused_into;
    struct Node *epi_bias, *epi_res, *epi_act, *epi_perm;
    /* QKV split: matmuls of the same A by other weights whose columns this
     * node's dispatch also computes (inputs[1] is then all the weights side
     * by side, and the siblings are fused_into it). */
    struct Node *siblings[2];
    int nsiblings;
    /* QKV split of products with biases (each sibling's epi_bias a
     * per-column constant): the biases side by side, [N0 + N1 + N2] */
    struct Tensor *qkv_bias;
    /* A gemm whose result (through a reshape) a Split along its columns
     * cuts into two or three: the Split (fused_into it, its outputs written
     * by the gemm's dispatch as a QKV split's are; optimize.c). */
    struct Node *split_out;
    /* --weights (quantize.c): a matmul or gemm whose B is stored in another
     * format; lowering binds these instead of inputs[1]. */
    int wformat;                     /* WeightFormat; WF_F32: none */
    struct Tensor *wq, *wscale, *wzero; /* data, scales, zero points */
    /* wq holds B K-major (a decode-shaped product's, for matvec_k.comp):
     * element (k, n) at n * K + k, scales and zero points at
     * n * ceil(K / QUANT_BLOCK) + k / QUANT_BLOCK. wformat may be WF_F32. */
    bool wkmajor;
    bool act_int8;                   /* --activations int8: A as 8-bit integers where
                                        matvec_k.comp multiplies 8- or 4-bit codes */
};

typedef struct Graph {
    const char *name;
    const char *path;   /* the model file */
    Vec tensors;        /* Tensor*, every tensor */
    Vec nodes;          /* Node*, in topological order after infer_shapes */
    Vec inputs;         /* Tensor*, in declaration order */
    Vec weights;        /* Tensor* */
    Vec outputs;        /* Tensor* */
    Vec states;         /* Tensor* (T_STATE), in declaration order */
    DimSym dims[MAX_DIMS]; /* dynamic dimensions */
    int ndims;
} Graph;

/* ---- graph.c ------------------------------------------------------------- */
/* The declared dims (the first ones; the rest are derived: dynamic_dims.c). */
int declared_dims(const Graph *g);

/* Constructors for loaders that build graphs in code (ONNX). Names must be
 * unique; nothing here checks op rules (infer_node does). */
Tensor *graph_tensor(Graph *g, const char *name, TensorKind kind, Loc loc);
Node *graph_node(Graph *g, OpKind op, const char *name, Loc loc);
/* The node whose dispatch computes n: n, or the end of its fused_into
 * chain (optimize.c). */
Node *fused_head(Node *n);
void node_add_input(Node *n, Tensor *t);
/* The operand of a two-input node that is not t (an add's other side). */
Tensor *other_input(const Node *n, const Tensor *t);
void node_add_output(Node *n, Tensor *t);
/* Frees weight b's own bytes (Tensor.owns_data; a model file's bytes,
 * Tensor.file_bytes: their whole pages leave the process) when no live node reads
 * it, but for the readers `spare` accepts (input k of m; those must never
 * read b's bytes again), and no other tensor points at them: a large
 * model's weights are not held twice, in the file's layout and in the
 * compiler's (issue 65: host memory within 1.5x the weights). */
void release_weight(Graph *g, Tensor *b, bool (*spare)(Node *m, int k, void *ctx),
                    void *ctx);
void node_set_strs(Node *n, const char *key, int count, char **items);
void node_set_attr(Node *n, const char *key, const char *scalar);
void node_set_int(Node *n, const char *key, int64_t v);
void node_set_float(Node *n, const char *key, double v);
void node_set_ints(Node *n, const char *key, int count, const int64_t *v);
void node_set_floats(Node *n, const char *key, int count, const double *v);

/* ---- load_yaml.c --------------------------------------------------------- */

Graph *load_yaml(const char *path);
/* The same from text in memory; path names it in messages. */
Graph *load_yaml_text(const char *path, const char *text, size_t size);

/* ---- load_onnx.c --------------------------------------------------------- */

/* shapes: "NAME=1x3x224x224" settings for inputs with symbolic dimensions;
 * consts: "NAME=TENSOR.pb" inputs bound to constants at compile time. */
Graph *load_onnx_bytes(const char *path, const char *raw, size_t size, int nshapes,
                       const char **shapes, int nconsts, const char **consts);
Graph *load_onnx(const char *path, int nshapes, const char **shapes, int nconsts,
                 const char **consts);
/* (onnx_value.c) kiln tensor IN.pb OUT.bin: an ONNX TensorProto's data,
 * raw; prints "DTYPE [dims] NAME". Returns the exit status. */
int convert_tensor(const char *in, const char *out);

/* ---- weights.c ----------------------------------------------------------- */

/* Reads or generates every weight's bytes (t->data), checking sizes. */
void load_weights(Graph *g);
/* The largest weight load_weights reads or generates (the fuzz targets lower
 * it so that a few bytes of YAML cannot ask for gigabytes). */
extern uint64_t weight_limit;
/* Where weight t's bytes start in a safetensors file of `size` bytes whose
 * first `have` bytes (at least its header) are `head`; checks dtype, shape
 * and range against t. */
uint64_t safetensors_find(Tensor *t, const char *file, const uint8_t *head,
                          size_t have, uint64_t size);
/* The deterministic generator behind `init:`; documented in docs/yaml.md. */
uint64_t splitmix64(uint64_t *state);

/* ---- infer_shapes.c ------------------------------------------------------ */

/* Orders nodes topologically (a cycle is an error), checks every op's rules
 * and sets every tensor's dtype and shape. */
void infer_shapes(Graph *g);
/* Checks one node and sets its outputs (its inputs already inferred). */
void infer_node(Node *n);

/* ---- op_params.c: what attributes and inputs mean ------------------------ */

/* Attribute access, with located errors on a wrong type or value. An absent
 * attribute takes the default of the op's row in ops.def (no call site
 * repeats it); one the row lists without a default is required, except
 * through the _or forms, for defaults computed from the node (attention's
 * scale = 1/sqrt(D)). */
Attr *node_attr(Node *n, const char *key);
int64_t attr_int(Node *n, const char *key);
double attr_float(Node *n, const char *key);
int64_t attr_int_or(Node *n, const char *key, int64_t computed);
/* A dims expression ("past + seq", 3) over the node's graph's dims. */
DimExpr attr_dims(Node *n, const char *key);
/* Parses a dims expression ("past + seq", "2*seq - 1", "3") over g's dims;
 * false when s is not one. */
bool parse_dim_expr(const Graph *g, const char *s, DimExpr *e);
double attr_float_or(Node *n, const char *key, double computed);
/* Fills out (at most max) and returns the count, or -1 when absent (more
 * than max items is a located error). */
int attr_ints(Node *n, const char *key, int64_t *out, int max);
/* Slice parameters per axis of the input (start, step) and the output
 * shape, ONNX semantics (negative indices, clamping). */
void slice_params(Node *n, int64_t *start, int64_t *step, int64_t *out_shape);
/* One axis of size dim sliced from *start to end by step (not 0), ONNX
 * semantics: *start becomes the first index taken; returns the count. */
int64_t slice_axis(int64_t dim, int64_t *start, int64_t end, int64_t step);
/* Split: the axis and each output's size along it (noutputs of them). */
int64_t *split_sizes(Node *n, int *axis);
/* Reductions: marks the reduced axes of the input; returns how many. */
int reduced_axes(Node *n, bool *reduced);
typedef struct AttentionDims {
    bool bshd;
    bool out_bshd; /* the output's layout (out_layout; default: layout) */
    int64_t B, H, KVH, Sq, Sk, D, DV;
    /* bshd: q, k and v's heads start off[i] elements into rows of row[i]
     * (head_dim and q_offset, k_offset, v_offset: the packed output of one
     * QKV product, read in place); else 0 and the heads' width */
    int64_t off[3], row[3];
} AttentionDims;
void attention_dims(Node *n, AttentionDims *a);
/* The signal ops (dft, stft, log_mel, welch) as transforms: OUTER x INNER
 * signals, each of NIN elements of C floats (1 real, 2 complex) read at
 * o * in_so + i * in_si + j * in_sj, windowed, transformed at length L;
 * NOUT bins kept (L, or L / 2 + 1 one-sided). Frames of stft, log_mel and
 * welch are the INNER signals, step apart. */
typedef struct Spectral {
    int64_t outer, inner, nin, C, L, nout, step;
    int64_t in_so, in_si, in_sj;
    int window;         /* WindowKind for log_mel and welch; stft: an input */
    bool inverse;
} Spectral;
void spectral_params(Node *n, Spectral *sp);
/* Convolution and pooling windows per spatial axis. */
typedef struct Window {
    int nsp;
    int64_t stride[MAX_RANK], dil[MAX_RANK], pad_begin[MAX_RANK], pad_end[MAX_RANK],
        out[MAX_RANK];
} Window;
void window_geometry(Node *n, const int64_t *in, const int64_t *k, int nsp, Window *w);
void resize_geometry(Node *n, double *scales, int64_t *out);
/* The index of a string attribute's value (or its default) in names. */
int attr_choice(Node *n, const char *key, const char *const *names, int count);
extern const char *const resize_modes[], *const resize_coords[], *const resize_nearest[];
extern const char *const grid_sample_pads[], *const roi_align_modes[], *const roi_align_coords[];
/* scatter: 0 none, 1 add, 2 mul, 3 max, 4 min. */
int scatter_reduction(Node *n);
/* pad: 0 constant, 1 reflect, 2 edge. */
int pad_mode(Node *n);
/* depth_to_space: true for CRD mode, false for DCR. */
bool depth_to_space_crd(Node *n);
/* Numpy broadcast of two shapes; false when they do not broadcast. */
bool broadcast_shapes(int ra, const int64_t *a, int rb, const int64_t *b,
                      int *rout, int64_t *out);

/* ---- dynamic_dims.c (the dims) and dynamic.c (which axes follow them) ---- */

/* "LO..HI" into lo and hi; false when s is not that. */
bool parse_dim_range(const char *s, int64_t *lo, int64_t *hi);
/* Adds a dynamic dimension (checking its range); returns its index. */
int declare_dim(Graph *g, const char *name, int64_t lo, int64_t hi, Loc loc);
/* The first dimension that no tensor's extent uses, or -1. */
int unused_dim(const Graph *g);
/* The index of a dimension by name, or -1. */
int find_dim(const Graph *g, const char *name);
/* a op b as an expression of the dims in *out: folded where it is constant
 * or a sum of dims, else a dim derived from them (found or added). False
 * where kiln does not follow it: a division of a value that can be negative
 * or by one that can be below 1, or no room for another dim. */
bool derive_dim(Graph *g, DimOp op, const DimExpr *a, const DimExpr *b, DimExpr *out);
/* Sets which axis of n's outputs follows the dynamic dimensions, or stops at
 * n with a located error where the op cannot take a dynamic extent. */
void infer_dynamic(Graph *g, Node *n);
/* Marks axis of t dynamic with extent e (declarations: inputs, states). */
void set_dyn_axis(Tensor *t, int axis, const DimExpr *e);
/* Sets t's prefix fields (dynamic, dyn_axis, extent) from dyn_axes. */
void update_prefix(Tensor *t);
/* Checks a state's dynamic axes: a state grows along one axis. */
void check_dynamic_state(Tensor *t);
/* True when axis of t follows the dynamic dimensions. */
bool is_dyn(const Tensor *t, int axis);
/* True when t follows them along one axis that is not its outermost larger
 * than 1 (a run's elements are then not a prefix of its bytes). */
bool dyn_inside(const Tensor *t);
bool dim_expr_eq(const DimExpr *a, const DimExpr *b);
/* True when e follows no dim (its value is e->c0). */
bool dim_expr_const(const DimExpr *e);
int64_t dim_expr_max(const Graph *g, const DimExpr *e);
int64_t dim_expr_min(const Graph *g, const DimExpr *e);
/* e * k, and a + b */
/* Whether arithmetic on e cannot overflow: its constant within +-2^40 and
 * each dim's coefficient within +-2^20 (the dims lie within +-2^31, so
 * its range stays within +-2^56). Shape arithmetic that leaves these
 * bounds is not followed as an expression of the dims. */
bool dim_expr_small(const DimExpr *e);
DimExpr dim_expr_scale(const DimExpr *e, int64_t k);
DimExpr dim_expr_add(const DimExpr *a, const DimExpr *b);
/* A GLSL int expression of e * scale, reading the run's dims (KILN_DIM). */
char *dim_expr_glsl(const DimExpr *e, int64_t scale);
/* "seq", "past + seq", "2*seq + 1" */
char *dim_expr_str(const Graph *g, const DimExpr *e);

/* ---- signal.c ------------------------------------------------------------ */

typedef enum WindowKind { WINDOW_RECT, WINDOW_HANN, WINDOW_HAMMING, WINDOW_BLACKMAN,
                          WINDOW_COUNT } WindowKind;
extern const char *const window_names[WINDOW_COUNT];
/* n values of a window (ONNX's HannWindow, HammingWindow, BlackmanWindow). */
void window_values(WindowKind kind, int64_t n, bool periodic, double *out);
/* cos, sin of 2 pi k / n for k in [0, n), interleaved (2n floats). */
void twiddle_values(int64_t n, float *out);
/* ONNX MelWeightMatrix, [dft_length / 2 + 1, mel_bins] row-major; false when
 * hi lies past the last bin. */
bool mel_weight_values(int64_t mel_bins, int64_t dft_length, double rate, double lo,
                       double hi, double *out);

/* ---- rewrite.c ----------------------------------------------------------- */

typedef struct Options Options;
/* rms_norm, rope and attention that exporters write out in pieces,
 * recognised and replaced by kiln's ops (after infer_shapes). */
void rewrite_patterns(Graph *g, const Options *opt);

/* ---- optimize.c ---------------------------------------------------------- */

struct Options {
    const char *name;       /* C prefix */
    const char *command;    /* the command line, for the frontmatter */
    uint64_t alignment;     /* arena alignment in bytes */
    bool verbose;
    bool debug_tensors;     /* --debug-tensors */
    bool guard;             /* --guard */
    bool sync_check;        /* --sync-check */
    const char *weights_file; /* --weights-file (or chosen by size) */
    bool embed_weights;     /* --embed-weights */
    bool report;            /* --report */
    bool time_stages;       /* --time */
    bool no_fuse_eltwise;   /* --no-fuse=eltwise */
    bool no_fuse_epilogue;  /* --no-fuse=epilogue */
    bool no_fuse_norm;      /* --no-fuse=norm */
    bool no_fuse_qkv;       /* --no-fuse=qkv */
    bool no_fuse_patterns;  /* --no-fuse=patterns */
    int weights_format;     /* --weights: a WeightFormat */
    kiln_dtype precision;   /* --precision: KILN_DTYPE_F32 or KILN_DTYPE_F16 */
    const char **keep_f32;  /* --keep-f32: node names */
    int nkeep_f32;
    bool io_f16;            /* --io f16: f32 inputs and outputs stored f16 */
    bool activations_int8;  /* --activations int8: matvec_k.comp's A_Q8 */
    const char *kernel_cache; /* --kernel-cache DIR, NULL: none */
};

/* Removes nodes that no output depends on, then fuses (each pass behind
 * its Options flag): matmul + bias + activation, residual add + norm,
 * elementwise chains. */
void optimize(Graph *g, const Options *opt);
/* (lower_eltwise.c) The GLSL of an elementwise node with everything fused
 * into it expanded; its leaf operands are collected into leaves (at most
 * max). Returns NULL when they would not fit. ct: the compute type. */
char *fused_expr(Node *n, const char *ct, Tensor **leaves, int *nleaves, int max);
/* (lower_dispatch.c) "name + name + ..." of a node and the nodes fused
 * into it. */
char *fused_label(Node *n);

/* ---- quantize.c ---------------------------------------------------------- */

/* Weight formats of --weights (the order is W_FORMAT in shaders/weights.glsl). */
typedef enum WeightFormat {
    WF_F32, WF_F16, WF_INT8, WF_INT8_ASYM, WF_INT4, WF_INT4_ASYM, WF_FP8_E4M3,
    WF_FP8_E5M2, WF_COUNT
} WeightFormat;
#define QUANT_BLOCK 32 /* consecutive k sharing a scale (and zero point) */
/* The most rows a product runs on the matrix-vector kernels (matvec.comp,
 * matvec_k.comp) rather than the tiled one. */
#define MATVEC_MAX_M 16
/* The most rows per unit of the dims that a product with dynamic rows may
 * have for its weight to be stored K-major: its runs of up to this many
 * rows take matvec_k.comp, longer ones the tiled kernel reading B K-major. */
#define MATVEC_K_DYN_M 4
extern const char *const weight_format_names[WF_COUNT];
/* The elements of format f in 16 bytes: matvec_k.comp's chunk of k. */
int64_t weight_chunk(int f);
/* KILN_MATVEC_K=0: matvec_k.comp off (no K-major weights here, none
 * given K-major taken by lower_matmul.c), for comparisons. */
bool matvec_k_off(void);
/* The index of element i of a tensor (rank, shape) into its quantization
 * scales or zero points: 0 with one per tensor (axis < 0), the coordinate
 * along axis with one per index of it (block 0), else the index into
 * parameters shaped as the tensor with axis cut into ceil(dim / block)
 * blocks. */
int64_t quant_param_index(int rank, const int64_t *shape, int axis, int64_t block, int64_t i);
/* Re-encodes the B weights of matmul and gemm nodes in opt->weights_format
 * (and, under --precision f16, decode_weight ones as f16 K-major). */
void quantize_weights(Graph *g, const Options *opt);
/* Whether every reader of weight b is a matmul taking it as B with rows
 * that follow the dims, few enough per unit to run as a decode step. */
bool decode_weight(Graph *g, const Tensor *b);

/* ---- precision.c --------------------------------------------------------- */

/* --precision f16: activations stored in f16 where their ops take it, f16
 * copies of matmul weights, casts where an op stays f32; checks the names
 * of --keep-f32. Runs after optimize, before quantize_weights. */
void apply_precision(Graph *g, const Options *opt);

/* ---- lower.c ------------------------------------------------------------- */

typedef struct Dispatch {
    Node *node;             /* source node (the root of a fused group) */
    const char *label;      /* the group's node names: "h + h_bias + a" */
    const char *family;     /* shader family: shaders/<family>.comp */
    Str defines;            /* "NAME VALUE\n" lines, in a fixed order */
    uint32_t groups[3];     /* workgroup counts */
    uint32_t local_size;    /* invocations per workgroup */
    Tensor *args[MAX_ARGS]; /* push-constant addresses, in order */
    uint64_t arg_offset[MAX_ARGS]; /* bytes added to the tensor's address */
    uint64_t arg_begin[MAX_ARGS], arg_end[MAX_ARGS]; /* bytes of the tensor
                               touched (relative to its start), for schedule */
    int nargs;
    uint32_t writes;        /* bit i: args[i] is written */
    uint32_t unused;        /* bit i: args[i] fills a slot the kernel does not
                               read for this node (dispatch_unused) */
    uint64_t flops;         /* estimated arithmetic operations */
    int module;             /* index into Program.modules */
    bool barrier;           /* a barrier before this dispatch */
    int wait_on;            /* the dispatch that made it needed, or -1 */
    const char *reason;     /* "read after write of t", ... */
    const char *why;        /* a product's: the rule that chose its kernel */
    /* Work that follows the dynamic dimensions: groups[dyn_axis] is
     * min(groups[dyn_axis], ceil(work * scale / per_group)) at run time. */
    bool dynamic;
    int dyn_axis;
    DimExpr work;
    int64_t scale, per_group;
    int64_t work_min, work_max; /* runs only for work * scale in this range */
    /* Another kernel for the same work, recorded right after this one; a
     * run gives groups to one of the two only (lower_matmul.c, matmul_dispatch),
     * or a device records one of the two only (needs, unless). */
    struct Dispatch *variant;
    bool one_row;           /* a product's variant for runs of exactly one row */
    /* writes only elements no other dispatch of its node writes (a
     * concat's pieces), however their byte ranges interleave: no barrier
     * between two such of one node for their writes (schedule.c) */
    bool disjoint_writes;
    /* reads only weights and writes nothing (prefetch.c): never waits on
     * a barrier, and the runtime records it where it stands even when
     * skipped dispatches before it left one pending (KILN_BARRIER_PREFETCH) */
    bool prefetch;
    /* KILN_FEATURE_* a device must have for this dispatch to be recorded
     * (needs), or must lack one of (unless): kiln_dispatch's fields. */
    uint32_t needs, unless;
    /* KILN_FEATURE_* that its KILN_SUBGROUP build (compile_spirv.c) needs
     * besides subgroup arithmetic: matvec_k.comp's F16_PAIRS, f16 math */
    uint32_t alt_needs;
} Dispatch;

/* Whether d's kernel reads the dims (a size in its defines follows them:
 * lower.c binds them to it). */
bool dispatch_reads_dims(const Dispatch *d);

typedef struct Module {
    const char *family;
    const char *defines;
    uint32_t *words;
    size_t nwords;
    uint64_t hash;
    /* A second build that devices with alt_needs run instead (kiln_kernel):
     * kernels that include reduce.glsl, with KILN_SUBGROUP 1. */
    uint32_t *alt_words;
    size_t alt_nwords;
    uint32_t alt_needs;
} Module;

typedef struct Program {
    Graph *graph;
    Dispatch **dispatches;
    int ndispatches, cap;
    /* u32 counters of dispatches whose last workgroup does more (lower_
     * matmul.c, norm_after_product): a weight, zero in the image */
    Tensor *counters;
    Module *modules;
    int nmodules;
    uint64_t arena_bytes;    /* planned */
    uint64_t peak_bytes;     /* lower bound: most bytes live at one step */
    uint64_t weight_bytes;
    uint64_t weights_checksum; /* of the weight image (emit_c sets it) */
    uint64_t io_bytes;
    uint64_t alignment;
    uint32_t features;       /* KILN_FEATURE_* */
    bool debug_tensors;      /* pin every tensor; list them in the output */
    /* --guard: no slot reuse, and a guard band after every arena slot that
     * the runtime fills with a pattern and checks after each run. */
    bool guard;
    kiln_guard *guards; /* the runtime's table entries, as emitted */
    int nguards;
    /* --sync-check: kernels also declare their bindings as descriptors
     * (compile_spirv.c) for synchronization validation. */
    bool sync_check;
    /* Dynamic dimensions: the int32 values every dynamic kernel reads
     * (push-constant slot DIMS_SLOT), and the indirect commands. */
    Tensor *dims, *indirect;
    uint64_t dims_io_offset, indirect_io_offset;
    int nindirect;
    /* States whose update is computed elsewhere: copied after the dispatches
     * (update -> state); an update that appends to its state in place
     * (concat) aliases it instead. */
    Tensor **state_copies; /* state tensors */
    int nstate_copies;
} Program;

#define DIMS_SLOT (MAX_ARGS - 1) /* push-constant slot of the dims address */

Program *lower(Graph *g, bool guard);

/* ---- lower_dispatch.c ---------------------------------------------------- */

/* Used by lowering functions: a new dispatch for node n. */
Dispatch *new_dispatch(Program *p, Node *n, const char *family);
void define_int(Dispatch *d, const char *name, int64_t v);
void define_float(Dispatch *d, const char *name, double v);
void define_str(Dispatch *d, const char *name, const char *v);
void define_list(Dispatch *d, const char *name, int n, const int64_t *v);
/* Appends an argument covering the whole tensor. */
void dispatch_arg(Dispatch *d, Tensor *t, bool written);
/* Fills a push-constant slot the kernel does not touch (with t's address). */
void dispatch_unused(Dispatch *d, Tensor *t);
/* Argument i becomes the whole of t (written or read), no longer unused. */
void dispatch_rebind(Dispatch *d, int i, Tensor *t, bool written);
/* Bytes a dispatch reads and writes (from its arguments' ranges). */
uint64_t dispatch_bytes_read(const Dispatch *d);
uint64_t dispatch_bytes_written(const Dispatch *d);
/* Whether a device with the KILN_FEATURE_* bits `features` records d (it
 * has every bit of d->needs and lacks one of d->unless, as the runtime
 * decides), and how many of p's dispatches it records. */
bool dispatch_runs_on(const Dispatch *d, uint32_t features);
int dispatches_on(const Program *p, uint32_t features);
/* The dispatches one device records, over every combination of the
 * features p's dispatches name: a dispatch with a variant for other
 * devices is listed but not run. most_features: a combination that runs
 * the most (the largest such). listed: p->ndispatches. */
typedef struct DeviceCounts {
    int listed, most, fewest;
    uint32_t most_features;
} DeviceCounts;
DeviceCounts device_counts(const Program *p);

/* ---- plan_memory.c ------------------------------------------------------- */

/* Places every tensor: weights packed in the weight buffer, the rest in the
 * arena by best fit over live ranges; inputs and outputs pinned. */
void plan_memory(Graph *g, Program *p);
/* Checks that no two tensors live at once overlap; returns the number of
 * violations (printed). Used by plan_memory and by the tests. */
int check_plan(Graph *g, Program *p);

/* ---- schedule.c ---------------------------------------------------------- */

/* Puts a barrier before a dispatch only where its byte ranges conflict with
 * a dispatch since the last barrier. */
void schedule(Graph *g, Program *p);
/* prefetch.c: with KILN_PREFETCH set, a prefetch of each one-row product's
 * weights before it (lower calls it last, before the dims). */
void add_prefetches(Program *p);

/* ---- compile_spirv.c ----------------------------------------------------- */

/* GLSL -> SPIR-V (shaderc), validated and optimized (spirv-tools); modules
 * with identical SPIR-V are kept once. cache: NULL, or where compiled
 * kernels are looked up first and stored. */
typedef struct KernelCache KernelCache;
void compile_kernels(Program *p, KernelCache *cache);
/* Bytes of SPIR-V in p's kernels, second builds included. */
uint64_t spirv_bytes(const Program *p);
/* spirv_khr.c: a kernel's GL_NV_cooperative_matrix words (workgroup-scope
 * matrices) as SPV_KHR_cooperative_matrix; NULL and *error (malloc'ed) when
 * it cannot. */
uint32_t *spirv_khr_coopmat(const uint32_t *words, size_t n, size_t *out_n, char **error);

/* ---- kernel_cache.c ------------------------------------------------------ */

struct KernelCache {
    char *dir;
    char *salt;      /* versions and the shader sources' hash: part of every key */
    bool verbose, failed;
    int hits, misses;
};
/* $KILN_CACHE_DIR (empty: none), $XDG_CACHE_HOME/kiln or ~/.cache/kiln. */
const char *kernel_cache_default(void);
/* NULL (no cache) when dir is NULL or cannot be made. */
/* shaderc's optimization level for every kernel (compile_spirv.c), named
 * in the kernel cache's key. */
#define SPIRV_OPTIMIZER_LEVEL "size"
KernelCache *kernel_cache_open(const char *dir, bool verbose);
/* The words of a kernel compiled before, or NULL (also for a damaged entry). */
uint32_t *kernel_cache_get(KernelCache *c, const char *family, const char *defines,
                           size_t *nwords);
void kernel_cache_put(KernelCache *c, const char *family, const char *defines,
                      const uint32_t *words, size_t nwords);

/* ---- emit_c.c ------------------------------------------------------------ */

/* Returns the generated .c and .h texts. With opt->weights_file set, the
 * C names that file (write_weights_file, called first, wrote it and set
 * p->weights_checksum) instead of embedding the weights. */
void emit_c(Graph *g, Program *p, const Options *opt, const char *header_name,
            Str *out_c, Str *out_h);

/* ---- weights_file.c ------------------------------------------------------ */

/* The weight image: p->weight_bytes bytes, each placed weight at its offset
 * and zeros between, given to fn piece by piece in order (never copied
 * whole: BERT-base's is 434 MB). */
typedef void (*WeightPieceFn)(void *ctx, const void *data, size_t n);
void weight_pieces(const Graph *g, const Program *p, WeightPieceFn fn, void *ctx);
/* Sets p->weights_checksum (kiln__hash of the image, runtime/hash.c) and
 * writes the sidecar file: "KILNWTS2", the
 * byte count and the checksum (little-endian u64s), then the image. When
 * path already holds exactly those bytes, only its modification time
 * changes (a recompile of the same model rewrites nothing; the comparison
 * and the checksum read each byte once). false, errno set, on error. */
bool write_weights_file(const Graph *g, Program *p, const char *path);

/* ---- inspect.c ----------------------------------------------------------- */

/* why: also the rule that chose each product's kernel (kiln inspect -v). */
void inspect_text(Graph *g, Program *p, FILE *f, bool why);
/* inspect's dispatch table (node, op, kernel, groups, bytes, barrier
 * reason), one line per dispatch under a heading line. */
void inspect_table(Program *p, Str *s);
/* KILN_MATMUL_TILE, ...: the tuning variables lowering reads (NULL-ended). */
extern const char *const tuning_variables[];
void inspect_json(Graph *g, Program *p, FILE *f);
void inspect_dot(Graph *g, Program *p, FILE *f);
/* profile: per-dispatch microseconds (nprofile of them), or NULL. */
void inspect_html(Graph *g, Program *p, const double *profile, int nprofile, FILE *f);
void compile_report(Graph *g, Program *p, uint64_t c_bytes, uint64_t runtime_bytes, FILE *f);

/* ---- embedded.c (generated from shaders/ and templates/ at build) -------- */

typedef struct EmbeddedFile {
    const char *name;
    const char *text;
    size_t size;
} EmbeddedFile;
extern const EmbeddedFile embedded_files[];
/* NULL when absent. */
const EmbeddedFile *embedded_file(const char *name);

#endif /* KILN_H */
