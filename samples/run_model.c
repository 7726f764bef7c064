/*
 * run_model.c: a command-line driver for any kiln-generated model.
 *
 * Build it with the generated file, naming the model's C prefix:
 *   cc -std=c99 -DKILN_MODEL=mlp -DKILN_DECLARE_MODEL run_model.c mlp.c -lkilnrt -lvulkan
 * (-include mlp.h declares them too, but its system headers come first and
 * fix the feature macros: under -std=c99 that form also needs
 * -D_POSIX_C_SOURCE=199309L for the clock, as the Makefile passes).
 *
 *   run_model [-i IN.bin]... [-o OUT.bin]... [-n RUNS] [-q]
 *             [-p [PROFILE.json]] [--dump DIR] [-w WEIGHTS]
 *             [-d DIM=V[,V...]]... [--steps K] [--states DIR] [--reset-at S]
 *
 * -i gives each input's raw little-endian bytes, in the model's input order
 * (the sizes must match exactly), or a NumPy .npy file (by its name; its
 * dtype and shape must be the input's, C order); without -i, f32 inputs are filled with
 * u(k) = ((k * 2654435761 + 12345 * (i + 1)) mod 2^32) / 2^31 - 1 for element
 * k of input i, integers with k mod 7, bools with k mod 2. -o writes each
 * output's raw bytes, or a .npy file (dtype and shape) when its name ends
 * in .npy. -n runs the model RUNS times and prints the mean wall
 * time of a run. It prints the device, the arena size, the dispatch count and
 * a summary of every output (-q: only errors).
 *
 * -p turns on GPU timestamps and prints the ten dispatches that took longest
 * (mean over the runs): microseconds, share of the total, and the GB/s and
 * GFLOP/s that the compiler's byte and operation counts give; with a file
 * name it also writes the profile as JSON (schema kiln-profile/1, which
 * `kiln inspect --profile` reads). --dump DIR writes every intermediate tensor
 * of a model compiled with --debug-tensors as DIR/NNN.bin, listed in
 * DIR/manifest.tsv (name, dtype, shape, file), for samples/find_divergence.py;
 * DIR is made if it does not exist.
 *
 * -d sets a dynamic dimension (inputs and outputs then have the bytes of that
 * extent). --steps K runs the model K times in a row (state carries over):
 * step s takes the s-th value of each -d list (the last one repeats), and
 * every -i and -o path with a %d names a file per step (step number there).
 *
 * --states DIR: before the first step, state i is written from DIR/init<i>.bin
 * when that file exists (kiln_model_write_state); after the last, every state
 * is read out to DIR/state<i>.bin (kiln_model_read_state). --reset-at S sets
 * every state back to zeros before step S (kiln_model_reset_state).
 *
 * -w names the weights sidecar file of a model compiled with --weights-file
 * when it is not at the path given to the compiler.
 *
 * Exit status: 0 success, 1 an error (printed with its cause), 2 bad usage,
 * 3 the Vulkan validation layer (KILN_VALIDATION=1) reported messages.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 199309L
#endif
#include "kiln_rt.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

/* The rest of f (path) into dst: exactly bytes bytes ("bytes" followed by
 * what in the message when not). Closes f. */
static int read_rest(FILE *f, const char *path, void *dst, uint64_t bytes, const char *what) {
    size_t got = bytes ? fread(dst, 1, (size_t)bytes, f) : 0;
    int extra = fgetc(f) != EOF;
    fclose(f);
    if (got != bytes || extra) {
        fprintf(stderr, "run_model: %s must hold exactly %llu bytes%s\n", path,
                (unsigned long long)bytes, what);
        return 0;
    }
    return 1;
}

static int read_exact(const char *path, void *dst, uint64_t bytes) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return 0;
    }
    return read_rest(f, path, dst, bytes, "");
}

/* ---- NumPy .npy files (format versions 1 to 3; little-endian, C order) */

static const char *npy_descr(kiln_dtype dt) {
    static const char *const d[] = {"<f4", "<f2", "<i4", "<i8", "|b1", "|u1", "|i1"};
    return (unsigned)dt < sizeof d / sizeof d[0] ? d[dt] : "?";
}

static int ends_with_npy(const char *path) {
    size_t n = strlen(path);
    return n > 4 && strcmp(path + n - 4, ".npy") == 0;
}

/* The shape as NumPy writes it: (2, 3), (5,) or (). */
static void npy_shape(const int64_t *shape, uint32_t rank, char *out, size_t size) {
    size_t n = (size_t)snprintf(out, size, "(");
    for (uint32_t i = 0; i < rank && n < size; i++)
        n += (size_t)snprintf(out + n, size - n, "%s%lld", i ? ", " : "",
                              (long long)shape[i]);
    if (n < size)
        snprintf(out + n, size - n, rank == 1 ? ",)" : ")");
}

/* Reads path (.npy) into dst: its dtype and shape must be the tensor's at
 * the current dims, exactly. */
static int read_npy(const char *path, const kiln_model *m, const kiln_tensor_info *t,
                    void *dst, uint64_t bytes) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return 0;
    }
    unsigned char pre[12];
    char header[4096], want[512], shape_text[400];
    int ok = fread(pre, 1, 10, f) == 10 && memcmp(pre, "\x93NUMPY", 6) == 0 &&
             pre[6] >= 1 && pre[6] <= 3;
    size_t len = 0;
    if (ok && pre[6] == 1) {
        len = (size_t)pre[8] | (size_t)pre[9] << 8;
    } else if (ok) {
        ok = fread(pre + 10, 1, 2, f) == 2;
        len = (size_t)pre[8] | (size_t)pre[9] << 8 | (size_t)pre[10] << 16 |
              (size_t)pre[11] << 24;
    }
    ok = ok && len < sizeof header && fread(header, 1, len, f) == len;
    if (!ok) {
        fprintf(stderr, "run_model: %s is not a .npy file (or its header is over 4 KiB)\n",
                path);
        fclose(f);
        return 0;
    }
    header[len] = 0;
    int64_t shape[8] = {0};
    kiln_model_tensor_shape(m, t, shape);
    npy_shape(shape, t->rank, shape_text, sizeof shape_text);
    /* NumPy writes the keys in this order, with these spaces. */
    snprintf(want, sizeof want, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
             npy_descr(t->dtype), shape_text);
    if (strncmp(header, want, strlen(want)) != 0) {
        char *nl = strchr(header, '\n');
        if (nl)
            *nl = 0;
        fprintf(stderr, "run_model: %s holds %s; input '%s' needs dtype %s (%s), shape %s, C "
                "order\n", path, header, t->name, kiln_dtype_name(t->dtype),
                npy_descr(t->dtype), shape_text);
        fclose(f);
        return 0;
    }
    return read_rest(f, path, dst, bytes, " of data");
}

/* Writes the tensor's bytes as path: .npy (format 1.0, header padded to 64
 * bytes, as NumPy writes it) or raw. */
static int write_output(const char *path, const kiln_model *m, const kiln_tensor_info *t,
                        const void *src, uint64_t bytes) {
    FILE *f = fopen(path, "wb");
    int bad = !f;
    if (!bad && ends_with_npy(path)) {
        int64_t shape[8] = {0};
        char shape_text[400], header[512];
        kiln_model_tensor_shape(m, t, shape);
        npy_shape(shape, t->rank, shape_text, sizeof shape_text);
        int n = snprintf(header, sizeof header,
                         "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                         npy_descr(t->dtype), shape_text);
        size_t total = (10 + (size_t)n + 1 + 63) / 64 * 64; /* magic, header, newline */
        size_t pad = total - 10 - (size_t)n - 1;
        unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 0, 0};
        pre[8] = (unsigned char)((total - 10) & 0xff);
        pre[9] = (unsigned char)((total - 10) >> 8);
        bad = fwrite(pre, 1, 10, f) != 10 || fwrite(header, 1, (size_t)n, f) != (size_t)n;
        for (size_t i = 0; i < pad && !bad; i++)
            bad = fputc(' ', f) == EOF;
        bad = bad || fputc('\n', f) == EOF;
    }
    bad = bad || fwrite(src, 1, (size_t)bytes, f) != (size_t)bytes;
    if (f && fclose(f) != 0)
        bad = 1;
    if (bad)
        perror(path);
    return !bad;
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

/* The device's KILN_FEATURE_* bits, in words. */
static void print_features(uint32_t f) {
    static const struct {
        uint32_t bit;
        const char *name;
    } names[] = {{KILN_FEATURE_FLOAT16, "float16"},
                 {KILN_FEATURE_INT64, "int64"},
                 {KILN_FEATURE_STORAGE16, "16-bit storage"},
                 {KILN_FEATURE_STORAGE8, "8-bit storage"},
                 {KILN_FEATURE_COOPMAT, "cooperative matrices"},
                 {KILN_FEATURE_SHARED48K, "48 KiB shared memory"},
                 {KILN_FEATURE_SUBGROUP, "subgroup arithmetic"},
                 {KILN_FEATURE_INTDOT, "integer dot products"},
                 {KILN_FEATURE_COOPMAT_WG, "workgroup cooperative matrices"}};
    const char *sep = " ";
    printf("features:");
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (f & names[i].bit) {
            printf("%s%s", sep, names[i].name);
            sep = ", ";
        }
    printf("%s\n", *sep == ' ' ? " none" : "");
}

/* Each input and output: reached by the dispatches in staging memory
 * (direct) or copied to and from the arena on the device. */
static void print_io(const kiln_model *m, const kiln_model_desc *d) {
    const char *sep = " ";
    printf("io:");
    for (uint32_t k = 0; k < d->input_count + d->output_count; k++) {
        int out = k >= d->input_count;
        uint32_t i = out ? k - d->input_count : k;
        printf("%s%s %s %s", sep, out ? "output" : "input",
               out ? d->outputs[i].name : d->inputs[i].name,
               kiln_model_io_direct(m, out, i) ? "direct" : "copied");
        sep = ", ";
    }
    printf("%s\n", *sep == ' ' ? " none" : "");
}

/* t as the last run left it (its shape at the model's current dims). */
static void print_tensor(const kiln_model *m, const kiln_tensor_info *t, const void *data) {
    int64_t shape[KILN_MAX_RANK];
    uint64_t bytes = kiln_model_tensor_bytes(m, t);
    kiln_model_tensor_shape(m, t, shape);
    printf("  %s: %s [", t->name, kiln_dtype_name(t->dtype));
    for (uint32_t i = 0; i < t->rank; i++)
        printf("%s%lld", i ? ", " : "", (long long)shape[i]);
    printf("]");
    if (t->dtype != KILN_DTYPE_F32) {
        printf(" (%llu bytes)\n", (unsigned long long)bytes);
        return;
    }
    const float *v = (const float *)data;
    uint64_t n = bytes / 4;
    double sum = 0;
    for (uint64_t k = 0; k < n; k++)
        sum += v[k];
    printf(" sum %.6g:", sum);
    for (uint64_t k = 0; k < n && k < 8; k++)
        printf(" %.6g", v[k]);
    printf("%s\n", n > 8 ? " ..." : "");
}

/* Whether a device with these KILN_FEATURE_* bits records dispatch x: it
 * has every feature x needs and lacks one of those in x's unless
 * (kiln_rt_tables.h). The others are variants for other devices. */
static int recorded(uint32_t features, const kiln_dispatch *x) {
    return (x->needs & ~features) == 0 && (x->unless == 0 || (x->unless & ~features) != 0);
}

/* The ten slowest dispatches, and the whole profile as JSON when asked. */
static int print_profile(const kiln_model_desc *d, const double *us, const char *json,
                         const char *device, uint32_t features) {
    uint32_t n = d->dispatch_count, order[10], top = 0, run = 0;
    double total = 0;
    for (uint32_t i = 0; i < n; i++) {
        total += us[i];
        run += recorded(features, &d->dispatches[i]) != 0;
    }
    for (top = 0; top < 10 && top < n; top++) {
        uint32_t best = UINT32_MAX;
        for (uint32_t i = 0; i < n; i++) {
            int taken = 0;
            for (uint32_t j = 0; j < top; j++)
                taken |= order[j] == i;
            if (!taken && (best == UINT32_MAX || us[i] > us[best]))
                best = i;
        }
        order[top] = best;
    }
    if (run < n)
        printf("GPU time %.1f us over %u dispatches (%u listed, the others variants for other "
               "devices); the slowest:\n", total, run, n);
    else
        printf("GPU time %.1f us over %u dispatches; the slowest:\n", total, n);
    printf("%9s  %-28s %10s %7s %9s %10s\n", "dispatch", "node", "us", "share", "GB/s",
           "GFLOP/s");
    for (uint32_t k = 0; k < top; k++) {
        const kiln_dispatch *x = &d->dispatches[order[k]];
        double t = us[order[k]];
        printf("%9u  %-28.28s %10.2f %6.1f%% %9.1f %10.1f\n", order[k], x->node, t,
               total > 0 ? 100 * t / total : 0, t > 0 ? (double)x->bytes / t / 1e3 : 0,
               t > 0 ? (double)x->flops / t / 1e3 : 0);
    }
    if (!json)
        return 0;
    FILE *f = fopen(json, "w");
    if (!f) {
        perror(json);
        return 1;
    }
    fprintf(f, "{\"schema\": \"kiln-profile/1\", \"model\": \"%s\", \"device\": \"%s\",\n"
               " \"total_us\": %.3f, \"dispatches\": [", d->name, device, total);
    for (uint32_t i = 0; i < n; i++)
        fprintf(f, "%s\n  {\"index\": %u, \"us\": %.3f, \"bytes\": %llu, \"flops\": %llu}",
                i ? "," : "", i, us[i], (unsigned long long)d->dispatches[i].bytes,
                (unsigned long long)d->dispatches[i].flops);
    fprintf(f, "\n]}\n");
    return fclose(f) == 0 ? 0 : 1;
}

/* Every tensor of a --debug-tensors build, read back after the run. */
static int dump_tensors(kiln_model *m, const kiln_model_desc *d, const char *dir) {
    if (d->debug_count == 0) {
        fprintf(stderr, "run_model: %s has no debug tensors; compile it with "
                "--debug-tensors\n", d->name);
        return 1;
    }
    char path[4096];
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) { /* made if missing */
        perror(dir);
        return 1;
    }
    if (strlen(dir) > sizeof path - 32) { /* room for "/manifest.tsv", "/N.bin" */
        fprintf(stderr, "run_model: --dump %s: the path is too long\n", dir);
        return 1;
    }
    snprintf(path, sizeof path, "%s/manifest.tsv", dir);
    FILE *manifest = fopen(path, "w");
    if (!manifest) {
        perror(path);
        return 1;
    }
    int status = 0;
    for (uint32_t i = 0; i < d->debug_count && !status; i++) {
        const kiln_tensor_info *t = &d->debug_tensors[i];
        void *buf = calloc(1, (size_t)t->bytes + 1);
        kiln_status s = buf ? kiln_model_read_tensor(m, t, buf) : KILN_ERROR_OUT_OF_HOST_MEMORY;
        if (s != KILN_OK) {
            fprintf(stderr, "run_model: %s: %s\n", kiln_status_string(s), kiln_last_error());
            status = 1;
        } else {
            snprintf(path, sizeof path, "%s/%03u.bin", dir, i);
            FILE *f = fopen(path, "wb");
            if (!f || fwrite(buf, 1, (size_t)t->bytes, f) != (size_t)t->bytes)
                status = 1;
            if (f && fclose(f) != 0)
                status = 1;
            fprintf(manifest, "%s\t%s\t", t->name, kiln_dtype_name(t->dtype));
            for (uint32_t k = 0; k < t->rank; k++)
                fprintf(manifest, "%s%lld", k ? "x" : "", (long long)t->shape[k]);
            fprintf(manifest, "\t%03u.bin\n", i);
        }
        free(buf);
    }
    if (fclose(manifest) != 0)
        status = 1;
    return status;
}

/* The file name for a step: path with its one %d replaced by the step. */
static const char *step_path(const char *path, int step, char *buf, size_t size) {
    const char *pct = strstr(path, "%d");
    if (!pct)
        return path;
    snprintf(buf, size, "%.*s%d%s", (int)(pct - path), path, step, pct + 2);
    return buf;
}

#define MAX_STEPS 4096

/* -d NAME=V[,V...]: the values of a dynamic dimension, one per step. */
typedef struct DimArg {
    const char *name;
    int64_t values[MAX_STEPS];
    int count;
} DimArg;

static int parse_dim_arg(const char *arg, DimArg *out) {
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg)
        return 0;
    static char names[KILN_MAX_DIMS][256];
    static int used;
    if (used == KILN_MAX_DIMS || (size_t)(eq - arg) >= sizeof names[0])
        return 0;
    snprintf(names[used], sizeof names[used], "%.*s", (int)(eq - arg), arg);
    out->name = names[used++];
    out->count = 0;
    for (const char *p = eq + 1; *p && out->count < MAX_STEPS;) {
        char *end;
        out->values[out->count++] = strtoll(p, &end, 10);
        if (end == p || (*end && *end != ','))
            return 0;
        p = *end ? end + 1 : end;
    }
    return out->count > 0;
}

int main(int argc, char **argv) {
    /* every -i and -o fits: there are fewer than argc of each */
    const char **in_files = calloc((size_t)argc, sizeof *in_files);
    const char **out_files = calloc((size_t)argc, sizeof *out_files);
    if (!in_files || !out_files) {
        fprintf(stderr, "run_model: out of memory\n");
        free(in_files);
        free(out_files);
        return 1;
    }
    const char *profile_json = NULL, *dump_dir = NULL, *weights = NULL;
    int nin = 0, nout = 0, runs = 1, quiet = 0, profile = 0, steps = 1, ndims = 0;
    int reset_at = -1;
    const char *states = NULL;
    static DimArg dims[KILN_MAX_DIMS];
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-i") == 0 && i + 1 < argc)
            in_files[nin++] = argv[++i];
        else if (strcmp(argv[i], "-o") == 0 && i + 1 < argc)
            out_files[nout++] = argv[++i];
        else if (strcmp(argv[i], "-n") == 0 && i + 1 < argc && atoi(argv[i + 1]) > 0)
            runs = atoi(argv[++i]);
        else if (strcmp(argv[i], "-q") == 0)
            quiet = 1;
        else if (strcmp(argv[i], "-p") == 0) {
            profile = 1;
            if (i + 1 < argc && argv[i + 1][0] != '-')
                profile_json = argv[++i];
        } else if (strcmp(argv[i], "--dump") == 0 && i + 1 < argc)
            dump_dir = argv[++i];
        else if (strcmp(argv[i], "-w") == 0 && i + 1 < argc)
            weights = argv[++i];
        else if (strcmp(argv[i], "-d") == 0 && i + 1 < argc && ndims < KILN_MAX_DIMS &&
                 parse_dim_arg(argv[i + 1], &dims[ndims]))
            ndims++, i++;
        else if (strcmp(argv[i], "--states") == 0 && i + 1 < argc)
            states = argv[++i];
        else if (strcmp(argv[i], "--reset-at") == 0 && i + 1 < argc)
            reset_at = atoi(argv[++i]);
        else if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc && atoi(argv[i + 1]) > 0 &&
                 atoi(argv[i + 1]) <= MAX_STEPS)
            steps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [-i IN.bin]... [-o OUT.bin]... [-n RUNS] [-q] "
                    "[-p [PROFILE.json]] [--dump DIR] [-w WEIGHTS] [-d DIM=V[,V...]]... "
                    "[--steps K] [--states DIR] [--reset-at S]\n", argv[0]);
            free(in_files);
            free(out_files);
            return 2;
        }
    }
    const kiln_model_desc *d = MODEL_DESC();
    if ((nin && (uint32_t)nin != d->input_count) ||
        (nout && (uint32_t)nout != d->output_count)) {
        fprintf(stderr, "run_model: model %s has %u inputs and %u outputs; got %d -i "
                "and %d -o\n", d->name, d->input_count, d->output_count, nin, nout);
        free(in_files);
        free(out_files);
        return 2;
    }

    void **inputs = calloc(d->input_count + 1, sizeof *inputs);
    void **outputs = calloc(d->output_count + 1, sizeof *outputs);
    double *us = NULL, *sum_us = NULL;
    int status = 1;
    kiln_device *dev = NULL;
    kiln_model *m = NULL;
    char path[4096];
    if (!inputs || !outputs)
        goto done;
    for (uint32_t i = 0; i < d->input_count; i++)
        if (!(inputs[i] = calloc(1, (size_t)d->inputs[i].bytes + 1)))
            goto done;
    for (uint32_t i = 0; i < d->output_count; i++)
        if (!(outputs[i] = calloc(1, (size_t)d->outputs[i].bytes + 1)))
            goto done;

    us = calloc(d->dispatch_count + 1, sizeof *us);
    sum_us = calloc(d->dispatch_count + 1, sizeof *sum_us);
    if (!us || !sum_us)
        goto done;
    kiln_model_options mo = {sizeof mo, 0, NULL, NULL};
    mo.flags = profile ? KILN_MODEL_PROFILE : 0;
    mo.weights_path = weights;
    kiln_status s = kiln_device_create(NULL, &dev);
    struct timespec c0, c1;
    clock_gettime(CLOCK_MONOTONIC, &c0);
    if (s == KILN_OK)
        s = profile || weights ? kiln_model_create_ex(dev, d, &mo, &m) : MODEL_CREATE(dev, &m);
    clock_gettime(CLOCK_MONOTONIC, &c1);
    for (uint32_t i = 0; states && s == KILN_OK && i < d->state_count; i++) {
        snprintf(path, sizeof path, "%s/init%u.bin", states, i);
        FILE *f = fopen(path, "rb");
        if (!f)
            continue;
        fclose(f);
        void *buf = calloc(1, (size_t)d->states[i].bytes + 1);
        if (!buf || !read_exact(path, buf, d->states[i].bytes)) {
            free(buf);
            goto done;
        }
        s = kiln_model_write_state(m, i, buf);
        free(buf);
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    /* Each step: its dims, its inputs, `runs` runs (one when stepping), its
     * outputs. The model (and its state) lives across the steps. */
    for (int step = 0; step < steps && s == KILN_OK; step++) {
        if (step == reset_at)
            s = kiln_model_reset_state(m);
        for (int k = 0; k < ndims && s == KILN_OK; k++)
            s = kiln_model_set_dim(m, dims[k].name,
                                   dims[k].values[step < dims[k].count ? step
                                                                       : dims[k].count - 1]);
        if (s != KILN_OK)
            break;
        for (uint32_t i = 0; i < d->input_count; i++) {
            uint64_t bytes = kiln_model_tensor_bytes(m, &d->inputs[i]);
            if (!nin) {
                fill(&d->inputs[i], inputs[i], i);
                continue;
            }
            const char *in = step_path(in_files[i], step, path, sizeof path);
            if (!(ends_with_npy(in) ? read_npy(in, m, &d->inputs[i], inputs[i], bytes)
                                    : read_exact(in, inputs[i], bytes)))
                goto done;
        }
        int reps = steps > 1 ? 1 : runs;
        for (int r = 0; r < reps && s == KILN_OK; r++) {
            s = MODEL_RUN(m, (const void *const *)inputs, outputs);
            if (s == KILN_OK && profile) {
                s = kiln_model_profile(m, us, d->dispatch_count);
                for (uint32_t k = 0; k < d->dispatch_count; k++)
                    sum_us[k] += us[k] / reps;
            }
        }
        for (int i = 0; i < nout && s == KILN_OK; i++) {
            const char *out = step_path(out_files[i], step, path, sizeof path);
            uint64_t bytes = kiln_model_tensor_bytes(m, &d->outputs[i]);
            if (!write_output(out, m, &d->outputs[i], outputs[i], bytes))
                goto done;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    for (uint32_t i = 0; states && s == KILN_OK && i < d->state_count; i++) {
        void *buf = calloc(1, (size_t)d->states[i].bytes + 1);
        s = buf ? kiln_model_read_state(m, i, buf) : KILN_ERROR_OUT_OF_HOST_MEMORY;
        snprintf(path, sizeof path, "%s/state%u.bin", states, i);
        FILE *f = s == KILN_OK ? fopen(path, "wb") : NULL;
        int bad = s == KILN_OK && (!f || fwrite(buf, 1, (size_t)d->states[i].bytes, f) !=
                                             (size_t)d->states[i].bytes);
        if (f && fclose(f) != 0)
            bad = 1;
        free(buf);
        if (bad) {
            perror(path);
            goto done;
        }
    }
    if (s != KILN_OK) {
        fprintf(stderr, "run_model: %s: %s\n", kiln_status_string(s), kiln_last_error());
        goto done;
    }
    if (!quiet) {
        printf("model: %s\ndevice: %s (%s)\n", d->name, kiln_device_name(dev),
               kiln_device_type_name(dev));
        print_features(kiln_device_features(dev));
        printf("arena: %llu bytes\ndispatches: %u\n", (unsigned long long)d->arena_bytes,
               d->dispatch_count);
        printf("create: %.1f ms\n", ((double)(c1.tv_sec - c0.tv_sec) * 1e3 +
                                       (double)(c1.tv_nsec - c0.tv_nsec) * 1e-6));
        print_io(m, d);
        if (runs > 1 && steps == 1)
            printf("runs: %d, %.1f us per run (wall clock)\n", runs,
                   ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / 1e3 / runs);
        printf("outputs:\n");
        for (uint32_t i = 0; i < d->output_count; i++)
            print_tensor(m, &d->outputs[i], outputs[i]);
    }
    if (profile && (print_profile(d, sum_us, profile_json, kiln_device_name(dev),
                                 kiln_device_features(dev)) != 0))
        goto done;
    if (dump_dir && dump_tensors(m, d, dump_dir) != 0)
        goto done;
    status = 0;
done:
    free(us);
    free(sum_us);
    MODEL_DESTROY(m);
    if (status == 0 && kiln_device_validation_count(dev)) {
        fprintf(stderr, "run_model: %u validation messages\n",
                kiln_device_validation_count(dev));
        status = 3;
    }
    kiln_device_destroy(dev);
    for (uint32_t i = 0; inputs && i < d->input_count; i++)
        free(inputs[i]);
    for (uint32_t i = 0; outputs && i < d->output_count; i++)
        free(outputs[i]);
    free(inputs);
    free(outputs);
    free(in_files);
    free(out_files);
    return status;
}
