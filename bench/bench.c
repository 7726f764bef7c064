/*
 * bench.c: times one kiln model. Built like samples/run_model.c (with
 * -DKILN_MODEL=prefix -include model.h).
 *
 *   bench [-i IN.bin]... [-o OUT.bin]... [-w WARMUP] [-W MS] [-n RUNS]
 *         [-d DIM=V]...
 *
 * -d sets a dynamic dimension for every run (each input file then holds
 * the largest extent's bytes, of which a run reads its own elements packed;
 * -o writes the run's; the in-place runs get them at the largest shape's
 * strides, as kiln_model_input_memory lays them out).
 * Creates the model twice, one after the other: with GPU timestamps after
 * every dispatch (the GPU times), then as a user would (the wall times, which
 * the timestamps would lengthen); runs each WARMUP times and for at least
 * MS milliseconds (the GPU's clocks come back up after the idle create),
 * then RUNS times.
 * Prints one JSON line: the median GPU time of the whole schedule (the sum
 * of the dispatches' times), the median wall time of a run (inputs in,
 * submit, fence wait, outputs out: kiln_model_run, copying from and to the
 * caller's memory), the median wall time of a run in place
 * (kiln_model_run_mapped: the inputs written beforehand into the model's
 * mapped staging memory, the outputs left there, as a caller that keeps
 * its tensors in that pinned memory runs; the same work as torch's copies
 * from and to pinned host memory), the time the first create took
 * (pipelines, buffers, weight upload, recording; the second finds the
 * driver's pipeline cache warm), and the dispatch and barrier counts. -o
 * writes the outputs of the last run.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 199309L
#endif
#include "kiln_rt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define MODEL_DESC CAT(KILN_MODEL, _desc)

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static int load(const char *path, void *dst, uint64_t bytes) {
    FILE *f = fopen(path, "rb");
    if (!f || fread(dst, 1, (size_t)bytes, f) != (size_t)bytes) {
        fprintf(stderr, "bench: cannot read %llu bytes from %s\n", (unsigned long long)bytes,
                path);
        if (f)
            fclose(f);
        return 0;
    }
    fclose(f);
    return 1;
}

/* Copies the run's elements of t from src to dst, between a packed buffer
 * (as kiln_model_run takes and gives them) and the mapped staging memory,
 * where they keep the largest shape's strides: to_staging 1 packed ->
 * staging, 0 staging -> packed. */
static void restride(const kiln_model *m, const kiln_tensor_info *t, char *dst,
                     const char *src, int to_staging) {
    int64_t run[KILN_MAX_RANK], idx[KILN_MAX_RANK] = {0}, count = 1, largest = 1;
    int rank = (int)(t->rank < KILN_MAX_RANK ? t->rank : KILN_MAX_RANK);
    kiln_model_tensor_shape(m, t, run);
    for (int a = 0; a < rank; a++) {
        count *= run[a];
        largest *= t->shape[a];
    }
    if (count <= 0 || largest <= 0)
        return;
    size_t es = (size_t)(t->bytes / (uint64_t)largest);
    for (int64_t e = 0; e < count; e++) {
        int64_t off = 0, stride = 1;
        for (int a = rank - 1; a >= 0; a--) {
            off += idx[a] * stride;
            stride *= t->shape[a];
        }
        size_t at = (size_t)off * es, packed = (size_t)e * es;
        memcpy(dst + (to_staging ? at : packed), src + (to_staging ? packed : at), es);
        for (int a = rank - 1; a >= 0 && ++idx[a] == run[a]; a--)
            idx[a] = 0;
    }
}

int main(int argc, char **argv) {
    const char *ins[64], *outs[64];
    int nin = 0, nout = 0, warmup = 3, runs = 20, ndims = 0;
    static char dim_names[KILN_MAX_DIMS][256];
    int64_t dim_values[KILN_MAX_DIMS];
    double warmup_us = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "-i") == 0 && nin < 64)
            ins[nin++] = argv[i + 1];
        else if (strcmp(argv[i], "-o") == 0 && nout < 64)
            outs[nout++] = argv[i + 1];
        else if (strcmp(argv[i], "-w") == 0)
            warmup = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "-W") == 0)
            warmup_us = 1e3 * atof(argv[i + 1]);
        else if (strcmp(argv[i], "-n") == 0)
            runs = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "-d") == 0 && ndims < KILN_MAX_DIMS) {
            const char *eq = strchr(argv[i + 1], '=');
            if (!eq || eq == argv[i + 1] || (size_t)(eq - argv[i + 1]) >= sizeof dim_names[0]) {
                fprintf(stderr, "bench: -d takes DIM=VALUE, not %s\n", argv[i + 1]);
                return 2;
            }
            snprintf(dim_names[ndims], sizeof dim_names[0], "%.*s", (int)(eq - argv[i + 1]),
                     argv[i + 1]);
            dim_values[ndims++] = strtoll(eq + 1, NULL, 10);
        }
    }
    const kiln_model_desc *d = MODEL_DESC();
    if ((uint32_t)nin != d->input_count || runs < 1 || d->output_count > 64) {
        fprintf(stderr, "bench: %s takes %u inputs\n", d->name, d->input_count);
        return 2;
    }
    void *in[64], *out[64];
    for (uint32_t i = 0; i < d->input_count; i++)
        if (!(in[i] = malloc((size_t)d->inputs[i].bytes + 1)) ||
            !load(ins[i], in[i], d->inputs[i].bytes))
            return 1;
    for (uint32_t i = 0; i < d->output_count; i++)
        if (!(out[i] = malloc((size_t)d->outputs[i].bytes + 1)))
            return 1;
    double *gpu = calloc((size_t)runs, sizeof *gpu), *wall = calloc((size_t)runs, sizeof *wall);
    double *mapped = calloc((size_t)runs, sizeof *mapped);
    double *us = calloc(d->dispatch_count + 1, sizeof *us);
    kiln_device *dev = NULL;
    kiln_model *m = NULL;
    kiln_status s = kiln_device_create(NULL, &dev);
    double create_us = 0;
    for (int pass = 0; pass < 2 && s == KILN_OK; pass++) { /* 0: profiled, 1: plain */
        kiln_model_options o = {sizeof o, pass == 0 ? KILN_MODEL_PROFILE : 0u, NULL, NULL};
        kiln_model_destroy(m);
        m = NULL;
        double t0 = now_us();
        s = kiln_model_create_ex(dev, d, &o, &m);
        if (pass == 0)
            create_us = now_us() - t0;
        for (int k = 0; k < ndims && s == KILN_OK; k++)
            s = kiln_model_set_dim(m, dim_names[k], dim_values[k]);
        for (double w0 = now_us(); s == KILN_OK && now_us() - w0 < warmup_us;)
            s = kiln_model_run(m, (const void *const *)in, out);
        for (int r = -warmup; r < runs && s == KILN_OK; r++) {
            double w0 = now_us();
            s = kiln_model_run(m, (const void *const *)in, out);
            double w1 = now_us();
            if (s == KILN_OK && pass == 0)
                s = kiln_model_profile(m, us, d->dispatch_count);
            if (r >= 0 && pass == 1)
                wall[r] = w1 - w0;
            if (r >= 0 && pass == 0)
                for (uint32_t k = 0; k < d->dispatch_count; k++)
                    gpu[r] += us[k];
        }
    }
    /* in place: the inputs where the model reads them, written once (a
     * run's elements at the largest shape's strides) */
    for (uint32_t i = 0; s == KILN_OK && i < d->input_count; i++)
        restride(m, &d->inputs[i], (char *)kiln_model_input_memory(m, i), (const char *)in[i],
                 1);
    for (int r = -warmup; r < runs && s == KILN_OK; r++) {
        double w0 = now_us();
        s = kiln_model_run_mapped(m);
        if (r >= 0)
            mapped[r] = now_us() - w0;
    }
    /* the same outputs in place as copied out (the kernels are deterministic) */
    for (uint32_t i = 0; s == KILN_OK && i < d->output_count; i++) {
        size_t bytes = (size_t)kiln_model_tensor_bytes(m, &d->outputs[i]);
        char *packed = malloc(bytes + 1);
        if (!packed)
            return 1;
        restride(m, &d->outputs[i], packed, (const char *)kiln_model_output_memory(m, i), 0);
        int same = memcmp(packed, out[i], bytes) == 0;
        free(packed);
        if (!same) {
            fprintf(stderr, "bench: output %u differs between kiln_model_run and "
                    "kiln_model_run_mapped\n", i);
            return 1;
        }
    }
    if (s != KILN_OK) {
        fprintf(stderr, "bench: %s: %s\n", kiln_status_string(s), kiln_last_error());
        return 1;
    }
    for (int i = 0; i < nout && (uint32_t)i < d->output_count; i++) {
        FILE *f = fopen(outs[i], "wb");
        size_t bytes = (size_t)kiln_model_tensor_bytes(m, &d->outputs[i]);
        if (!f || fwrite(out[i], 1, bytes, f) != bytes)
            return 1;
        fclose(f);
    }
    uint32_t barriers = 0;
    for (uint32_t k = 0; k < d->dispatch_count; k++)
        barriers += d->dispatches[k].barrier;
    printf("{\"model\": \"%s\", \"device\": \"%s\", \"gpu_us\": %.3f, \"wall_us\": %.3f, "
           "\"mapped_us\": %.3f, \"create_us\": %.1f, \"dispatches\": %u, \"barriers\": %u, "
           "\"arena_bytes\": %llu, \"features\": %u}\n",
           d->name, kiln_device_name(dev), median(gpu, runs), median(wall, runs),
           median(mapped, runs), create_us,
           d->dispatch_count, barriers, (unsigned long long)d->arena_bytes,
           kiln_device_features(dev));
    kiln_model_destroy(m);
    kiln_device_destroy(dev);
    for (uint32_t i = 0; i < d->input_count; i++)
        free(in[i]);
    for (uint32_t i = 0; i < d->output_count; i++)
        free(out[i]);
    free(gpu);
    free(wall);
    free(mapped);
    free(us);
    return 0;
}
