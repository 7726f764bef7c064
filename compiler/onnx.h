/*
 * onnx.h: what the ONNX loader's files share. load_onnx.c (the model:
 * inputs, initializers, declared types, the graph) calls onnx_map.c (each
 * node: folded, or mapped to kiln nodes), which calls onnx_fold.c; all of
 * them use onnx_value.c (values, TensorProto, node inputs and attributes,
 * making kiln nodes): the dependencies run one way.
 */
#ifndef KILN_ONNX_H
#define KILN_ONNX_H

#include "kiln.h"
#include "onnx.pb-c.h"

typedef struct Value {
    const char *name;
    kiln_dtype dtype;
    int rank;
    int64_t shape[MAX_RANK];
    uint8_t *data; /* a constant's bytes (kiln layout), or NULL */
    uint8_t *alloc; /* the block new_value allocated for them: its tensor owns
                       data while data is still that block (Tensor.owns_data) */
    Tensor *t;     /* the kiln tensor, once one exists */
    QuantCodes quant; /* a constant dequantized from 8-bit codes (to its tensor) */
    /* An integer value that follows the dynamic dims (a Shape of a dynamic
     * tensor and the arithmetic on it): each element's expression, no data;
     * onnx_fold.c folds shape computations on it, shape_ints reads it as a
     * shape, and a kernel that reads it as data gets range nodes (tens). */
    DimExpr *sym;
} Value;

typedef struct Ctx {
    const char *path, *dir;
    Graph *g;
    Map values;            /* name -> Value* */
    int64_t opset;
    Onnx__NodeProto *node; /* the node being mapped */
    const char *nname;     /* "name (OpType)" */
    Loc loc;
    /* What the model declares (graph outputs, value_info): name ->
     * Onnx__ValueInfoProto*; and the values of the symbolic dimensions
     * (dim_param) that the inputs fix: name -> int64_t*. */
    Map declared, syms;
    /* The node that computes each value (output name -> Onnx__NodeProto*),
     * so that a refusal can name the graph inputs a value comes from. */
    Map producer;
    /* Outputs kiln adds after the graph's own (Tensor*): the count of
     * NonMaxSuppression's selected rows. */
    Vec extra_outputs;
    int tmp_count;         /* names of internal values: NAME/1, NAME/2, ... */
    /* The nodes whose f16 inputs emit cast to f32 (their kernels compute
     * in f32 only), not finished yet: finish casts their f32 results back
     * to f16. */
    Vec widened;
    /* The dims expression of each symbolic dimension (dim_param) of the
     * inputs that follows the dynamic dims: name -> DimExpr*. */
    Map dim_exprs;
    /* A decoder's cache (load_onnx.c): past input name -> its state, in
     * [batch, position, kv_heads, head_dim] order; present output name ->
     * the same state. */
    Map past_states, present_states;
} Ctx;

#define MAX_CONST_FOLD (1 << 22) /* elements a folded constant may have */

/* ---- onnx_wire.c ------------------------------------------------------- */

/* protobuf-c leaves absent strings NULL; kiln reads names everywhere, so
 * those of a graph (and its nodes) become "" here, once. */
void fill_absent_names(Onnx__GraphProto *gp);

/* Initializer `initializer`'s raw_data: len bytes at data. */
typedef struct RawSpan {
    size_t initializer;
    const uint8_t *data;
    size_t len;
} RawSpan;

/* The bytes to unpack instead of raw (raw itself when nothing was taken
 * out), and the raw_data taken out of them, in initializer order. */
const uint8_t *onnx_take_raw_data(const uint8_t *raw, size_t size, size_t *out_size,
                                  RawSpan **spans, size_t *nspans);
/* After the unpack: the initializers' raw_data back from the spans. */
void onnx_put_raw_data(Onnx__GraphProto *gp, const RawSpan *spans, size_t nspans);

/* ---- onnx_value.c ------------------------------------------------------ */

_Noreturn void node_fail(Ctx *c, const char *msg);
int kiln_dtype_of(int32_t onnx);
const char *onnx_type_name(int32_t t);
bool is_integral(kiln_dtype d);
int64_t vcount(const Value *v);
double vget(const Value *v, int64_t i);
int64_t vgeti(const Value *v, int64_t i);
void vset(Value *v, int64_t i, double d);
void vseti(Value *v, int64_t i, int64_t x);
void vcopy(Value *o, int64_t i, const Value *v, int64_t j);
Value *new_value(const char *name, kiln_dtype dt, int rank, const int64_t *shape,
                 bool constant);
void bind_value(Ctx *c, const char *name, Value *v);
Tensor *tens(Ctx *c, Value *v);
Value *value_of_tensor(Tensor *t);
/* borrow: raw_data may become the value's bytes rather than be copied (it
 * outlives the compile and may be written: a private mapping). */
Value *decode_tensor(const char *path, const char *dir, Onnx__TensorProto *tp,
                     const char *what, Loc loc, bool borrow);
Value *read_tensor_file(const char *path, const char *what);
int nin(Ctx *c);
int nout(Ctx *c);
Value *in_opt(Ctx *c, int i);
Value *in(Ctx *c, int i);
Value *in_const(Ctx *c, int i, const char *what);
const char *out_name(Ctx *c, int i);
Onnx__AttributeProto *oattr(Ctx *c, const char *name);
/* oattr, refusing an attribute of another type than `type` (naming both);
 * oattr_ints for a list of ints. */
Onnx__AttributeProto *oattr_typed(Ctx *c, const char *name,
                                  Onnx__AttributeProto__AttributeType type);
Onnx__AttributeProto *oattr_ints(Ctx *c, const char *name);
int64_t oattr_int(Ctx *c, const char *name, int64_t dflt);
double oattr_float(Ctx *c, const char *name, double dflt);
const char *oattr_str(Ctx *c, const char *name, const char *dflt);
Node *knode(Ctx *c, OpKind op, const char *suffix);
Node *emit(Ctx *c, OpKind op, int n, Value **ins, const char *out);
Node *emit_outputs(Ctx *c, OpKind op, Value *x, int n);
Node *emit_tmp(Ctx *c, OpKind op, int n, Value **ins);
Value *finish(Ctx *c, Node *k);
/* v as dtype dt: v itself, or an internal cast node's result. */
Value *cast_to(Ctx *c, Value *v, kiln_dtype dt);
/* finish's last step alone: the node's outputs bound to their ONNX names
 * (for a mapper that marks dynamic axes of its own before infer_dynamic). */
Value *bind_outputs(Ctx *c, Node *k);
void copy_attrs(Ctx *c, Node *k, const char *renames);
int const_ints(Ctx *c, int i, const char *what, int64_t *out, int max);
/* A shape input (Reshape's, Expand's): a constant, or one that follows the
 * dims (its entries' expressions in exprs, *dynamic set); out gets the
 * values at the largest dims. */
int shape_ints(Ctx *c, int i, const char *what, int64_t *out, DimExpr *exprs, bool *dynamic,
               int max);
/* The axes of t whose shape entries (exprs, from shape_ints: the last n
 * axes, as broadcasting aligns them) follow the dims become dynamic; an
 * axis inference already marked must agree. */
void follow_shape(Ctx *c, Tensor *t, int n, const DimExpr *exprs);
/* A range node (size elements start + i * delta, dtype dt) producing ONNX
 * output `out` (or an internal value for ""): its value. */
Value *range_node(Ctx *c, const DimExpr *size, const DimExpr *start, int64_t delta,
                  kiln_dtype dt, const char *out);
extern ProtobufCAllocator pb_allocator;

/* ---- onnx_decoder.c ---------------------------------------------------- */

/* Whether the graph has the decoder layout (input_ids, past_key_values.N.*
 * inputs each with its present.N.* output). */
bool onnx_is_decoder(const Onnx__GraphProto *gp);
bool onnx_is_past(const char *name);
bool onnx_is_present(Ctx *c, const char *name);
/* Declares seq and past (unless --shape did) and binds the decoder inputs'
 * symbolic dimensions to them. */
void onnx_decoder_dims(Ctx *c, const Onnx__GraphProto *gp);
/* A past input as a state, read through a transpose: its value. */
Value *onnx_decoder_past(Ctx *c, const Onnx__ValueInfoProto *vi, kiln_dtype dt,
                         const int64_t *dims);
/* Concat(past, new): an append in place; false for any other node. */
bool onnx_decoder_append(Ctx *c);

/* ---- onnx_fold.c ------------------------------------------------------- */

bool fold(Ctx *c);

/* ---- onnx_map.c -------------------------------------------------------- */

/* onnx_versions.c */
/* The newest opset kiln knows the op versions of. */
int64_t onnx_opset_newest(void);
/* The version of op (an ONNX op type) in a model of this opset: the newest
 * of its versions not past it; 0 for an op ONNX does not define there. */
int64_t onnx_op_version(const char *op, int64_t opset);
/* Refuses c->node by name when kiln does not read its op's version. */
void check_op_version(Ctx *c);

typedef struct OnnxOp OnnxOp;
typedef void (*MapFn)(Ctx *c, const OnnxOp *op);
/* A row of onnx_map.c's table: the ONNX op, its mapper, the kiln op it
 * becomes (for the generic mappers) and its attribute renames
 * ("onnx_name=kiln_name ..."). */
struct OnnxOp {
    const char *name;
    MapFn fn;
    OpKind kop;
    const char *renames; /* for copy_attrs */
};
const OnnxOp *find_mapper(const char *name);
void map_node(Ctx *c);

/* The mappers, by family (onnx_map_<family>.c). */
/* onnx_map_generic.c */
void map_simple(Ctx *c, const OnnxOp *op);
void map_variadic(Ctx *c, const OnnxOp *op);
void map_unary_attr(Ctx *c, const OnnxOp *op);
void map_folded_only(Ctx *c, const OnnxOp *op);
/* onnx_map_layout.c */
void map_view(Ctx *c, const OnnxOp *op);
void map_slice(Ctx *c, const OnnxOp *op);
void map_split(Ctx *c, const OnnxOp *op);
void map_expand_tile(Ctx *c, const OnnxOp *op);
void map_pad(Ctx *c, const OnnxOp *op);
void map_gather(Ctx *c, const OnnxOp *op);
void map_compress(Ctx *c, const OnnxOp *op);
void map_onehot(Ctx *c, const OnnxOp *op);
void map_trilu(Ctx *c, const OnnxOp *op);
void map_scatter(Ctx *c, const OnnxOp *op);
void map_eye_like(Ctx *c, const OnnxOp *op);
void map_reverse_sequence(Ctx *c, const OnnxOp *op);
/* Row numbers that reverse each sequence within its length (ReverseSequence
 * and the recurrent ops' reverse direction); see onnx_map_layout.c. */
Value *reversal_rows(Ctx *c, Value *lens, int64_t T, int64_t B, bool time_major);
/* onnx_map_math.c */
void map_clip(Ctx *c, const OnnxOp *op);
void map_cast(Ctx *c, const OnnxOp *op);
void map_pow(Ctx *c, const OnnxOp *op);
void map_prelu(Ctx *c, const OnnxOp *op);
void map_softmax(Ctx *c, const OnnxOp *op);
void map_reduce(Ctx *c, const OnnxOp *op);
void map_arg(Ctx *c, const OnnxOp *op);
void map_gemm(Ctx *c, const OnnxOp *op);
void map_norm(Ctx *c, const OnnxOp *op);
void map_topk(Ctx *c, const OnnxOp *op);
void map_cumsum(Ctx *c, const OnnxOp *op);
void map_nll(Ctx *c, const OnnxOp *op);
void map_sce(Ctx *c, const OnnxOp *op);
void map_reduce_log_sum(Ctx *c, const OnnxOp *op);
void map_window(Ctx *c, const OnnxOp *op);
void map_resize(Ctx *c, const OnnxOp *op);
void map_grid_sample(Ctx *c, const OnnxOp *op);
void map_nms(Ctx *c, const OnnxOp *op);
void map_bit_shift(Ctx *c, const OnnxOp *op);
void map_roi_align(Ctx *c, const OnnxOp *op);
void map_affine_grid(Ctx *c, const OnnxOp *op);
void map_dft(Ctx *c, const OnnxOp *op);
void map_gelu(Ctx *c, const OnnxOp *op);
void map_mish_swish(Ctx *c, const OnnxOp *op);
void map_lp_norm(Ctx *c, const OnnxOp *op);
void map_lp_pool(Ctx *c, const OnnxOp *op);
void map_group_norm(Ctx *c, const OnnxOp *op);
void map_rms_norm(Ctx *c, const OnnxOp *op);
void map_mvn(Ctx *c, const OnnxOp *op);
void map_lrn(Ctx *c, const OnnxOp *op);
/* onnx_map_nd.c */
void map_gather_nd(Ctx *c, const OnnxOp *op);
void map_scatter_nd(Ctx *c, const OnnxOp *op);
void map_max_unpool(Ctx *c, const OnnxOp *op);
/* onnx_map_einsum.c */
void map_einsum(Ctx *c, const OnnxOp *op);
/* onnx_map_quant.c */
void map_dequantize(Ctx *c, const OnnxOp *op);
void map_quantize(Ctx *c, const OnnxOp *op);
void map_dynamic_quantize(Ctx *c, const OnnxOp *op);
void map_integer_product(Ctx *c, const OnnxOp *op);
void map_qlinear(Ctx *c, const OnnxOp *op);
/* onnx_map_rnn.c */
void map_recurrent(Ctx *c, const OnnxOp *op);
/* onnx_map_attention.c */
void map_attention(Ctx *c, const OnnxOp *op);
void map_rotary_embedding(Ctx *c, const OnnxOp *op);
/* Emitters the mappers share (onnx_map_generic.c): a
 * scalar constant, a view of v with another shape (v itself when the shape
 * is its own), v's positions [start, end) along axis (v itself when that is
 * all of it), n parts concatenated along axis (named out, or a temporary:
 * one part is itself), a one- or two-input kiln node on temporaries, v
 * transposed, and v as the node's output i (bind_output). */
Value *transposed(Ctx *c, Value *v, int n, const int64_t *perm);
void bind_output(Ctx *c, int i, Value *v);
void output_as(Ctx *c, Value *y, kiln_dtype dt);
Value *reshaped(Ctx *c, Value *v, int rank, const int64_t *shape);
Value *sliced(Ctx *c, Value *v, int axis, int64_t start, int64_t end);
Value *joined(Ctx *c, int n, Value **parts, int64_t axis, const char *out);
Value *const_scalar(Ctx *c, kiln_dtype dt, double v);
Value *unary_tmp(Ctx *c, OpKind op, Value *x);
Value *binary_tmp(Ctx *c, OpKind op, Value *a, Value *b);

#endif /* KILN_ONNX_H */
