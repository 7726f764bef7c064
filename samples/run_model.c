/*
 * run_model.c: a command-line driver for any kiln-generated model.
 *
 * Build it with the generated file, naming the model's C prefix:
 *   cc -DKILN_MODEL=mlp -include mlp.h run_model.c mlp.c -lkilnrt -lvulkan
 * (or -DKILN_DECLARE_MODEL instead of -include, as the tests do).
 *
 *   run_model [-i IN.bin]... [-o OUT.bin]... [-n RUNS] [-q]
 *
 * -i gives each input's raw little-endian bytes, in the model's input order
 * (the sizes must match exactly); without -i, f32 inputs are filled with
 * u(k) = ((k * 2654435761 + 12345 * (i + 1)) mod 2^32) / 2^31 - 1 for element
 * k of input i, integers with k mod 7, bools with k mod 2. -o writes each
 * output's raw bytes. -n runs the model RUNS times and prints the mean wall
 * time of a run. It prints the device, the arena size, the dispatch count and
 * a summary of every output (-q: only errors).
 *
 * Exit status: 0 success, 1 an error (printed with its cause), 2 bad usage,
 * 3 the Vulkan validation layer (KILN_VALIDATION=1) reported messages.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 199309L
#endif
#include "kiln_rt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KILN_CAT_(a, b) a##b
#define KILN_CAT(a, b) KILN_CAT_(a, b)
#define MODEL_DESC KILN_CAT(KILN_MODEL, _desc)
#define MODEL_CREATE KILN_CAT(KILN_MODEL, _create)
#define MODEL_RUN KILN_CAT(KILN_MODEL, _run)
#define MODEL_DESTROY KILN_CAT(KILN_MODEL, _destroy)

#ifdef KILN_DECLARE_MODEL
const kiln_model_desc *MODEL_DESC(void);
kiln_status MODEL_CREATE(kiln_device *device, kiln_model **out_model);
kiln_status MODEL_RUN(kiln_model *model, const void *const *inputs,
                      void *const *outputs);
void MODEL_DESTROY(kiln_model *model);
#endif

#define MAX_TENSORS 64

static int read_exact(const char *path, void *dst, uint64_t bytes) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return 0;
    }
    size_t got = bytes ? fread(dst, 1, (size_t)bytes, f) : 0;
    int extra = fgetc(f) != EOF;
    fclose(f);
    if (got != bytes || extra) {
        fprintf(stderr, "run_model: %s must hold exactly %llu bytes\n", path,
                (unsigned long long)bytes);
        return 0;
    }
    return 1;
}

static void fill(const kiln_tensor_info *t, void *dst, uint32_t input) {
    uint64_t n = t->bytes / kiln_dtype_size(t->dtype);
    for (uint64_t k = 0; k < n; k++) {
        uint32_t h = (uint32_t)(k * 2654435761u + 12345u * (input + 1u));
        switch (t->dtype) {
        case KILN_DTYPE_F32: ((float *)dst)[k] = (float)(h / 2147483648.0 - 1.0); break;
        case KILN_DTYPE_I32: ((int32_t *)dst)[k] = (int32_t)(k % 7); break;
        case KILN_DTYPE_I64: ((int64_t *)dst)[k] = (int64_t)(k % 7); break;
        case KILN_DTYPE_BOOL: ((uint8_t *)dst)[k] = (uint8_t)(k % 2); break;
        default: ((uint8_t *)dst)[k * kiln_dtype_size(t->dtype)] = (uint8_t)(k % 7); break;
        }
    }
}

static void print_tensor(const kiln_tensor_info *t, const void *data) {
    printf("  %s: %s [", t->name, kiln_dtype_name(t->dtype));
    for (uint32_t i = 0; i < t->rank; i++)
        printf("%s%lld", i ? ", " : "", (long long)t->shape[i]);
    printf("]");
    if (t->dtype != KILN_DTYPE_F32) {
        printf(" (%llu bytes)\n", (unsigned long long)t->bytes);
        return;
    }
    const float *v = (const float *)data;
    uint64_t n = t->bytes / 4;
    double sum = 0;
    for (uint64_t k = 0; k < n; k++)
        sum += v[k];
    printf(" sum %.6g:", sum);
    for (uint64_t k = 0; k < n && k < 8; k++)
        printf(" %.6g", v[k]);
    printf("%s\n", n > 8 ? " ..." : "");
}

int main(int argc, char **argv) {
    const char *in_files[MAX_TENSORS], *out_files[MAX_TENSORS];
    int nin = 0, nout = 0, runs = 1, quiet = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-i") == 0 && i + 1 < argc && nin < MAX_TENSORS)
            in_files[nin++] = argv[++i];
        else if (strcmp(argv[i], "-o") == 0 && i + 1 < argc && nout < MAX_TENSORS)
            out_files[nout++] = argv[++i];
        else if (strcmp(argv[i], "-n") == 0 && i + 1 < argc && atoi(argv[i + 1]) > 0)
            runs = atoi(argv[++i]);
        else if (strcmp(argv[i], "-q") == 0)
            quiet = 1;
        else {
            fprintf(stderr, "usage: %s [-i IN.bin]... [-o OUT.bin]... [-n RUNS] [-q]\n",
                    argv[0]);
            return 2;
        }
    }
    const kiln_model_desc *d = MODEL_DESC();
    if (d->input_count > MAX_TENSORS || d->output_count > MAX_TENSORS ||
        (nin && (uint32_t)nin != d->input_count) ||
        (nout && (uint32_t)nout != d->output_count)) {
        fprintf(stderr, "run_model: model %s has %u inputs and %u outputs; got %d -i "
                "and %d -o\n", d->name, d->input_count, d->output_count, nin, nout);
        return 2;
    }

    void *inputs[MAX_TENSORS], *outputs[MAX_TENSORS];
    int status = 1;
    kiln_device *dev = NULL;
    kiln_model *m = NULL;
    memset(inputs, 0, sizeof inputs);
    memset(outputs, 0, sizeof outputs);
    for (uint32_t i = 0; i < d->input_count; i++) {
        inputs[i] = calloc(1, (size_t)d->inputs[i].bytes + 1);
        if (!inputs[i] || (nin ? !read_exact(in_files[i], inputs[i], d->inputs[i].bytes)
                               : (fill(&d->inputs[i], inputs[i], i), 0)))
            goto done;
    }
    for (uint32_t i = 0; i < d->output_count; i++)
        if (!(outputs[i] = calloc(1, (size_t)d->outputs[i].bytes + 1)))
            goto done;

    kiln_status s = kiln_device_create(NULL, &dev);
    if (s == KILN_OK)
        s = MODEL_CREATE(dev, &m);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int r = 0; r < runs && s == KILN_OK; r++)
        s = MODEL_RUN(m, (const void *const *)inputs, outputs);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (s != KILN_OK) {
        fprintf(stderr, "run_model: %s: %s\n", kiln_status_string(s), kiln_last_error());
        goto done;
    }
    if (!quiet) {
        printf("model: %s\ndevice: %s (%s)\narena: %llu bytes\ndispatches: %u\n",
               d->name, kiln_device_name(dev), kiln_device_type_name(dev),
               (unsigned long long)d->arena_bytes, d->dispatch_count);
        if (runs > 1)
            printf("runs: %d, %.1f us per run (wall clock)\n", runs,
                   ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / 1e3 / runs);
        printf("outputs:\n");
        for (uint32_t i = 0; i < d->output_count; i++)
            print_tensor(&d->outputs[i], outputs[i]);
    }
    status = 0;
    for (int i = 0; i < nout; i++) {
        FILE *f = fopen(out_files[i], "wb");
        if (!f || fwrite(outputs[i], 1, (size_t)d->outputs[i].bytes, f) !=
                      (size_t)d->outputs[i].bytes) {
            perror(out_files[i]);
            status = 1;
        }
        if (f && fclose(f) != 0)
            status = 1;
    }
done:
    MODEL_DESTROY(m);
    if (status == 0 && kiln_device_validation_count(dev)) {
        fprintf(stderr, "run_model: %u validation messages\n",
                kiln_device_validation_count(dev));
        status = 3;
    }
    kiln_device_destroy(dev);
    for (uint32_t i = 0; i < MAX_TENSORS; i++) {
        free(inputs[i]);
        free(outputs[i]);
    }
    return status;
}
