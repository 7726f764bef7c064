/*
 * test_embed.c: two models in one program, and no allocation on the run path.
 *
 * Built by tests/test_models.py with samples/mlp.yaml compiled as `mlp` and
 * samples/cnn.yaml as `cnn`: both link into this one program (no symbol
 * clashes) and run on one shared device. Unless built with -DNO_INTERPOSE
 * (the sanitizer build, whose allocator owns malloc), this file interposes
 * malloc, calloc, realloc and free and counts the calls made from this
 * executable, which holds the generated code and the static runtime; calls
 * from the Vulkan loader and driver are counted apart (lavapipe allocates
 * inside vkQueueSubmit). 100 runs of each model must make no allocation
 * from kiln's code; create must make some, which proves the counting works.
 * The zero-copy path (inputs written into kiln_model_input_memory, run with
 * kiln_model_run_mapped, outputs read from kiln_model_output_memory) must
 * give the bytes of kiln_model_run, also without allocating, and leave the
 * input in place as written (the dispatches read it there: direct I/O).
 */
#define _GNU_SOURCE
#include "cnn.h"
#include "mlp.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile int counting;
static long kiln_calls, other_calls;

#ifndef NO_INTERPOSE
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);

static const char anchor[1] = {0}; /* an address inside this executable */

static void count_caller(const void *ret) {
    if (!counting)
        return;
    counting = 0; /* dladdr may allocate */
    Dl_info self, caller;
    if (dladdr(anchor, &self) && dladdr(ret, &caller) &&
        caller.dli_fbase == self.dli_fbase)
        kiln_calls++;
    else
        other_calls++;
    counting = 1;
}

void *malloc(size_t n) {
    count_caller(__builtin_return_address(0));
    return __libc_malloc(n);
}
void *calloc(size_t a, size_t b) {
    count_caller(__builtin_return_address(0));
    return __libc_calloc(a, b);
}
void *realloc(void *p, size_t n) {
    count_caller(__builtin_return_address(0));
    return __libc_realloc(p, n);
}
void free(void *p) { __libc_free(p); }
#endif

static float mlp_in[MLP_INPUT0_BYTES / 4], mlp_out[2][MLP_OUTPUT0_BYTES / 4];
static float cnn_in[CNN_INPUT0_BYTES / 4], cnn_out[2][CNN_OUTPUT0_BYTES / 4];

int main(void) {
    int failures = 0;
    for (size_t i = 0; i < sizeof mlp_in / 4; i++)
        mlp_in[i] = (float)((int)(i % 13) - 6) / 4.0f;
    for (size_t i = 0; i < sizeof cnn_in / 4; i++)
        cnn_in[i] = (float)((int)(i % 11) - 5) / 3.0f;
    kiln_device *dev = NULL;
    kiln_model *a = NULL, *b = NULL;
    counting = 1;
    kiln_status s = kiln_device_create(NULL, &dev);
    if (s == KILN_OK)
        s = mlp_create(dev, &a);
    if (s == KILN_OK)
        s = cnn_create(dev, &b);
    counting = 0;
    long create_calls = kiln_calls;
    if (s != KILN_OK) {
        printf("FAIL create: %s %s\n", kiln_status_string(s), kiln_last_error());
        return 1;
    }
    const void *ai[1] = {mlp_in}, *bi[1] = {cnn_in};
    void *ao[1] = {mlp_out[0]}, *bo[1] = {cnn_out[0]};
    s = mlp_run(a, ai, ao);
    if (s == KILN_OK)
        s = cnn_run(b, bi, bo);
    kiln_calls = other_calls = 0;
    counting = 1;
    ao[0] = mlp_out[1];
    bo[0] = cnn_out[1];
    for (int r = 0; r < 100 && s == KILN_OK; r++) {
        s = mlp_run(a, ai, ao);
        if (s == KILN_OK)
            s = cnn_run(b, bi, bo);
    }
    /* Zero copy: the mapped memory, written and read in place. */
    void *in_mem = kiln_model_input_memory(a, 0);
    const void *out_mem = kiln_model_output_memory(a, 0);
    int zero_copy_ok = in_mem && out_mem && !kiln_model_input_memory(a, 1) &&
                       !kiln_model_output_memory(a, 1);
    /* The input written once: the dispatches read it in place (direct
     * I/O) and must leave it as it was for the next run. */
    if (zero_copy_ok)
        memcpy(in_mem, mlp_in, sizeof mlp_in);
    for (int r = 0; r < 10 && s == KILN_OK && zero_copy_ok; r++) {
        s = kiln_model_run_mapped(a);
        zero_copy_ok = s == KILN_OK && memcmp(out_mem, mlp_out[0], sizeof mlp_out[0]) == 0 &&
                       memcmp(in_mem, mlp_in, sizeof mlp_in) == 0;
    }
    counting = 0;
    if (!zero_copy_ok) {
        printf("FAIL zero-copy runs (kiln_model_run_mapped) differ from kiln_model_run\n");
        failures++;
    } else {
        printf("ok zero-copy runs give the bytes of kiln_model_run\n");
    }
    /* The mlp's input and output are small and only its dispatches touch
     * them: both direct, unless KILN_STAGED_IO=1 asks for copies. */
    const char *staged = getenv("KILN_STAGED_IO");
    int want_direct = !(staged && *staged && strcmp(staged, "0") != 0);
    if (kiln_model_io_direct(a, 0, 0) != want_direct ||
        kiln_model_io_direct(a, 1, 0) != want_direct || kiln_model_io_direct(a, 0, 1) ||
        kiln_model_io_direct(a, 1, 1) || kiln_model_io_direct(NULL, 0, 0)) {
        printf("FAIL kiln_model_io_direct: input %d, output %d (want %d)\n",
               kiln_model_io_direct(a, 0, 0), kiln_model_io_direct(a, 1, 0), want_direct);
        failures++;
    } else {
        printf("ok kiln_model_io_direct says the mlp's input and output are %s\n",
               want_direct ? "direct" : "copied");
    }
    if (s != KILN_OK) {
        printf("FAIL run: %s %s\n", kiln_status_string(s), kiln_last_error());
        failures++;
    }
    if (memcmp(mlp_out[0], mlp_out[1], sizeof mlp_out[0]) ||
        memcmp(cnn_out[0], cnn_out[1], sizeof cnn_out[0])) {
        printf("FAIL two models on one device: a later run differs from the first\n");
        failures++;
    } else {
        printf("ok two models (mlp, cnn) in one program on one device, 101 runs each\n");
    }
#ifndef NO_INTERPOSE
    if (create_calls == 0) {
        printf("FAIL the malloc interposer saw no allocation by create\n");
        failures++;
    } else if (kiln_calls != 0) {
        printf("FAIL %ld allocations by kiln's code in 210 runs\n", kiln_calls);
        failures++;
    } else {
        printf("ok no allocation by kiln's code in 210 runs (create made %ld; the loader and "
               "driver made %ld during the runs)\n", create_calls, other_calls);
    }
#else
    (void)create_calls;
#endif
    mlp_destroy(a);
    cnn_destroy(b);
    kiln_device_destroy(dev);
    return failures ? 1 : 0;
}
