/*
 * fuzz.c: libFuzzer targets for kiln's front end (make fuzz).
 *
 * One file, one target per build, chosen by -DFUZZ_<target>:
 *
 *   yaml         load_yaml_text: the YAML graph format
 *   onnx         load_onnx_bytes (which folds constants and infers shapes
 *                node by node), then load_weights and infer_shapes
 *   onnx_dims    the same with dynamic dimensions: the input's first line
 *                holds up to 8 space-separated --shape arguments
 *                (NAME=MIN..MAX, NAME=AxB), the ONNX bytes follow it; the
 *                shape folding, dims derived from the dims and the
 *                dynamic-axis analysis run over the symbolic shapes
 *   safetensors  safetensors_find: the header parser, against a weight whose
 *                dtype and shape come from the input's first bytes
 *   frontend     YAML text through load_weights and infer_shapes
 *
 * A located error is the expected outcome of most inputs: the compiler's
 * errors longjmp back here (kiln_error_trap) and everything the attempt
 * allocated is freed (kiln_free_all), so each input starts clean. Crashes,
 * sanitizer findings, internal errors (which abort), timeouts and
 * allocations over -malloc_limit_mb are what the fuzzer reports.
 */
#include "kiln.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    kiln_quiet = getenv("KILN_FUZZ_VERBOSE") == NULL;
    weight_limit = 16u << 20;
    return 0;
}

#if defined(FUZZ_safetensors)
static void run(const uint8_t *data, size_t size) {
    static const kiln_dtype dtypes[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_I32,
                                        KILN_DTYPE_I64, KILN_DTYPE_U8};
    if (size < 2)
        return;
    Tensor *t = xcalloc(1, sizeof *t);
    t->name = "w";
    t->src.key = "w";
    t->src.loc.file = "fuzz.safetensors";
    t->dtype = dtypes[data[0] % 5];
    t->rank = data[1] % 4;
    for (int i = 0; i < t->rank; i++)
        t->shape[i] = 1 + i;
    (void)safetensors_find(t, "fuzz.safetensors", data + 2, size - 2, size - 2);
}
#else
static void run(const uint8_t *data, size_t size) {
    /* The loaders read text with an end pointer, but keep a terminator
     * after it, as read_file does. */
    char *text = xcalloc(1, size + 1);
    memcpy(text, data, size);
#if defined(FUZZ_onnx)
    Graph *g = load_onnx_bytes("fuzz.onnx", text, size, 0, NULL, 0, NULL);
#elif defined(FUZZ_onnx_dims)
    /* the first line: --shape arguments, each terminated in place */
    const char *shapes[8];
    int nshapes = 0;
    size_t at = 0;
    while (at < size && text[at] != '\n') {
        while (at < size && text[at] == ' ')
            at++;
        if (at >= size || text[at] == '\n')
            break;
        size_t start = at;
        while (at < size && text[at] != ' ' && text[at] != '\n')
            at++;
        if (nshapes < 8)
            shapes[nshapes++] = text + start;
        char end = at < size ? text[at] : '\n';
        text[at] = '\0';
        if (end == '\n')
            break;
        at++;
    }
    at = at < size ? at + 1 : size;
    Graph *g = load_onnx_bytes("fuzz.onnx", text + at, size - at, nshapes, shapes, 0, NULL);
#else
    Graph *g = load_yaml_text("fuzz.yaml", text, size);
#endif
#if !defined(FUZZ_yaml)
    load_weights(g);
    infer_shapes(g);
#endif
    (void)g;
}
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    jmp_buf trap;
    kiln_error_trap = &trap;
    if (setjmp(trap) == 0)
        run(data, size);
    kiln_error_trap = NULL;
    kiln_free_all();
    return 0;
}
