/*
 * main.c: the kiln command line, which reads as the compiler's pipeline.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "kiln.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Two strings: C99 promises string literals of 4095 characters, no more. */
static const char *const usage[] = {
    "usage: kiln compile MODEL [-o OUT.c] [--name PREFIX] [--shape NAME=DxD..]...\n"
    "                          [--const NAME=TENSOR.pb]... [--align BYTES]\n"
    "                          [--debug-tensors] [--guard] [--sync-check]\n"
    "                          [--no-fuse[=LIST]] [--report] [--time] [-v]\n"
    "                          [--weights FORMAT] [--activations int8]\n"
    "                          [--precision f32|f16]\n"
    "                          [--keep-f32 NODE,...] [--io f32|f16]\n"
    "                          [--weights-file FILE | --embed-weights]\n"
    "                          [--kernel-cache DIR | --no-kernel-cache]\n"
    "       kiln inspect MODEL [--format text|json|dot] [--html REPORT.html]\n"
    "                          [--profile PROFILE.json] [-o FILE] [model options]\n"
    "       kiln tensor TENSOR.pb OUT.bin|OUT.npy\n"
    "       kiln --help | --version\n"
    "\n"
    "compile turns a neural-network graph (MODEL.yaml, or MODEL.onnx) into one C\n"
    "file and its header: a fixed Vulkan dispatch schedule, baked arena offsets,\n"
    "embedded SPIR-V kernels and the weights. Link the result with libkilnrt and\n"
    "libvulkan. inspect shows that schedule without writing C.\n"
    "\n"
    ,
    "model options (compile and inspect):\n"
    "  --name PREFIX    C prefix of the generated functions (default: the model's\n"
    "                   name, made a C identifier)\n"
    "  --shape NAME=DxD...  fix an ONNX input's symbolic dimensions (repeatable)\n"
    "  --shape DIM=MIN..MAX make the ONNX symbolic dimension DIM dynamic (a decoder\n"
    "                   with its cache: seq, default 1..128, and past, 0..384)\n"
    "  --shape DIM=N    fix the ONNX symbolic dimension DIM at N in every input\n"
    "  --const NAME=T.pb    make an ONNX input a constant, from a TensorProto file\n"
    "  --align BYTES    arena and weight alignment, a power of two >= 16\n"
    "                   (default 256)\n"
    "  --debug-tensors  keep every intermediate tensor for the whole run, so it can\n"
    "                   be read back (kiln_model_read_tensor, run_model --dump);\n"
    "                   turns fusion off\n"
    "  --guard          test mode: no arena reuse, and a guard band after every\n"
    "                   tensor that each run fills and checks (a kernel writing\n"
    "                   out of bounds, or an index outside its axis, fails the run)\n"
    "  --sync-check     test mode: kernels also bind what they read and write as\n"
    "                   descriptors, so that Vulkan's synchronization validation\n"
    "                   (KILN_VALIDATION=1) checks every barrier\n"
    "  --no-fuse[=LIST] turn fusions off: eltwise, epilogue, norm, qkv, patterns\n"
    "                   (rms_norm, rope, attention, tanh GELU, SiLU written\n"
    "                   out in pieces; default: all)\n"
    "  --weights FMT    store matmul and gemm weights as f16, int8, int8-asym,\n"
    "                   int4, int4-asym, fp8-e4m3 or fp8-e5m2 (blocks of 32 along\n"
    "                   K with an f32 scale), dequantized inside the matmul;\n"
    "                   arithmetic stays f32 (default f32: as given)\n"
    "  --activations int8  with --weights int8 or int4 (and -asym): products of\n"
    "                   one to four rows (decode steps) quantize A to 8-bit\n"
    "                   integers, a scale per 32 k, and multiply in integers\n"
    "                   (default as-is: A as it is, f32 arithmetic)\n"
    "  --precision P    f16: store activations in f16 where their ops take it and\n"
    "                   matmul weights in f16 (products accumulate in f32; other\n"
    "                   ops compute in f32 through casts); inputs and outputs keep\n"
    "                   their dtypes (default f32)\n"
    "  --keep-f32 LIST  with --precision f16: these nodes (comma-separated names)\n"
    "                   read and write f32\n"
    "  --io T           with --precision f16: f16 stores the model's f32 inputs and\n"
    "                   outputs (not its state) as f16, no casts at the edges\n"
    "                   (default f32: as the model declares them)\n"
    "  --kernel-cache DIR  keep compiled kernels in DIR and reuse them (default:\n"
    "                   $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else\n"
    "                   ~/.cache/kiln; KILN_CACHE_DIR= turns it off)\n"
    "  --no-kernel-cache  compile every kernel afresh, store nothing\n"
    "  -v               say what the optimizer removed and what the kernel cache did\n"
    "  --time           print how long each stage of the compiler took (stderr)\n"
    "compile:\n"
    "  -o OUT.c         write OUT.c and OUT.h (default: PREFIX.c here)\n"
    "  --report         print the size of each part and the device memory\n"
    "  --weights-file FILE  write the weights to FILE (a sidecar that create reads\n"
    "                   and checks) instead of into the C; the default above\n"
    "                   16 MiB of weights, as OUT.weights\n"
    "  --embed-weights  embed the weights in the C whatever their size\n"
    "inspect:\n"
    "  --format F       text (a table, default), json (schema kiln-inspect/1) or dot\n"
    "  --html FILE      also write a self-contained page with the schedule and a\n"
    "                   memory map\n"
    "  --profile FILE   a profile written by run_model -p: the page colours\n"
    "                   dispatches by their GPU time\n"
    "  -o FILE          write the text, json or dot there instead of stdout\n"
    "\n"
    "kiln tensor writes an ONNX TensorProto's data as raw little-endian bytes (a\n"
    "NumPy .npy file, dtype and shape, when OUT ends in .npy) and prints its\n"
    "dtype, shape and name.\n"};

static void print_usage(FILE *f) {
    fputs(usage[0], f);
    fputs(usage[1], f);
}

/* Weights above this go to a sidecar file unless --embed-weights. */
#define EMBED_LIMIT (16ull << 20)

#ifndef KILN_RUNTIME_BYTES
#define KILN_RUNTIME_BYTES 0
#endif

static char *sanitize_name(const char *name) {
    Str s = {0};
    if (!isalpha((unsigned char)name[0]) && name[0] != '_')
        str_add(&s, "m_");
    for (const char *c = name; *c; c++)
        str_addn(&s, isalnum((unsigned char)*c) ? c : "_", 1);
    return s.buf ? s.buf : xstrdup("model");
}

static bool is_identifier(const char *s) {
    if (!*s || (!isalpha((unsigned char)*s) && *s != '_'))
        return false;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && *s != '_')
            return false;
    return true;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static char *join_command(int argc, char **argv) {
    Str s = {0};
    str_add(&s, "kiln");
    for (int i = 1; i < argc; i++) {
        bool plain = *argv[i] != 0;
        for (const char *c = argv[i]; *c; c++)
            plain &= isalnum((unsigned char)*c) || strchr("-_./=+,:", *c);
        str_addf(&s, plain ? " %s" : " '%s'", argv[i]);
    }
    return s.buf;
}

typedef struct Args {
    Options opt;
    const char *model, *out, *format, *html, *profile;
    const char **shapes, **consts; /* argc entries each: every option fits */
    int nshapes, nconsts;
} Args;

static void parse_args(int argc, char **argv, bool inspect, Args *a) {
    memset(a, 0, sizeof *a);
    a->shapes = xcalloc((size_t)argc, sizeof(char *));
    a->consts = xcalloc((size_t)argc, sizeof(char *));
    a->opt.alignment = 256;
    a->opt.kernel_cache = kernel_cache_default();
    a->opt.command = join_command(argc, argv);
    a->format = "text";
    for (int i = 2; i < argc; i++) {
        const char *arg = argv[i];
        bool has_value = i + 1 < argc;
        if (strcmp(arg, "-o") == 0 && has_value) {
            a->out = argv[++i];
        } else if (strcmp(arg, "--name") == 0 && has_value) {
            a->opt.name = argv[++i];
            if (!is_identifier(a->opt.name))
                fatal("--name '%s' is not a C identifier", a->opt.name);
        } else if (strcmp(arg, "--align") == 0 && has_value) {
            char *end;
            unsigned long long v = strtoull(argv[++i], &end, 10);
            if (*end || v < 16 || v > 65536 || (v & (v - 1)))
                fatal("--align must be a power of two from 16 to 65536, not '%s'", argv[i]);
            a->opt.alignment = v;
        } else if ((strcmp(arg, "--shape") == 0 || strcmp(arg, "--const") == 0) && has_value) {
            bool shape = arg[2] == 's';
            int *n = shape ? &a->nshapes : &a->nconsts;
            const char *v = argv[++i];
            if (!strchr(v, '='))
                fatal("%s %s: expected %s", arg, v, shape ? "NAME=D0xD1x..." : "NAME=TENSOR.pb");
            (shape ? a->shapes : a->consts)[(*n)++] = v;
        } else if (strcmp(arg, "-v") == 0) {
            a->opt.verbose = true;
        } else if (strcmp(arg, "--time") == 0) {
            a->opt.time_stages = true;
        } else if (strncmp(arg, "--no-fuse", 9) == 0 && (arg[9] == 0 || arg[9] == '=')) {
            const char *which = arg[9] ? arg + 10 : "eltwise,epilogue,norm,qkv,patterns";
            for (const char *w = which; *w;) {
                const char *e = strchr(w, ',');
                size_t len = e ? (size_t)(e - w) : strlen(w);
                if (len == 7 && strncmp(w, "eltwise", 7) == 0)
                    a->opt.no_fuse_eltwise = true;
                else if (len == 8 && strncmp(w, "epilogue", 8) == 0)
                    a->opt.no_fuse_epilogue = true;
                else if (len == 4 && strncmp(w, "norm", 4) == 0)
                    a->opt.no_fuse_norm = true;
                else if (len == 3 && strncmp(w, "qkv", 3) == 0)
                    a->opt.no_fuse_qkv = true;
                else if (len == 8 && strncmp(w, "patterns", 8) == 0)
                    a->opt.no_fuse_patterns = true;
                else
                    fatal("--no-fuse: unknown fusion '%.*s' (eltwise, epilogue, norm, qkv, "
                          "patterns)",
                          (int)len, w);
                w += len + (e ? 1 : 0);
            }
        } else if (strcmp(arg, "--weights") == 0 && has_value) {
            const char *v = argv[++i];
            a->opt.weights_format = -1;
            for (int f = 0; f < WF_COUNT; f++)
                if (strcmp(v, weight_format_names[f]) == 0)
                    a->opt.weights_format = f;
            if (a->opt.weights_format < 0)
                fatal("--weights: unknown format '%s' (f32, f16, int8, int8-asym, int4, "
                      "int4-asym, fp8-e4m3, fp8-e5m2)", v);
        } else if (strcmp(arg, "--precision") == 0 && has_value) {
            const char *v = argv[++i];
            if (strcmp(v, "f32") == 0)
                a->opt.precision = KILN_DTYPE_F32;
            else if (strcmp(v, "f16") == 0)
                a->opt.precision = KILN_DTYPE_F16;
            else
                fatal("--precision: unknown precision '%s' (f32, f16)", v);
        } else if (strcmp(arg, "--io") == 0 && has_value) {
            const char *v = argv[++i];
            if (strcmp(v, "f32") != 0 && strcmp(v, "f16") != 0)
                fatal("--io: unknown type '%s' (f32: as the model declares, f16)", v);
            a->opt.io_f16 = strcmp(v, "f16") == 0;
        } else if (strcmp(arg, "--activations") == 0 && has_value) {
            const char *v = argv[++i];
            if (strcmp(v, "int8") != 0 && strcmp(v, "as-is") != 0)
                fatal("--activations: unknown choice '%s' (as-is, int8)", v);
            a->opt.activations_int8 = strcmp(v, "int8") == 0;
        } else if (strcmp(arg, "--keep-f32") == 0 && has_value) {
            for (char *w = xstrdup(argv[++i]), *e; *w; w = e) {
                e = w + strcspn(w, ",");
                if (*e)
                    *e++ = 0;
                if (!*w)
                    fatal("--keep-f32: an empty node name in '%s'", argv[i]);
                a->opt.keep_f32 = xrealloc(a->opt.keep_f32, sizeof(char *) *
                                           (size_t)(a->opt.nkeep_f32 + 1));
                a->opt.keep_f32[a->opt.nkeep_f32++] = w;
            }
        } else if (strcmp(arg, "--kernel-cache") == 0 && has_value) {
            a->opt.kernel_cache = argv[++i];
            if (!*a->opt.kernel_cache)
                fatal("--kernel-cache needs a directory (--no-kernel-cache turns it off)");
        } else if (strcmp(arg, "--no-kernel-cache") == 0) {
            a->opt.kernel_cache = NULL;
        } else if (strcmp(arg, "--debug-tensors") == 0) {
            a->opt.debug_tensors = true;
        } else if (strcmp(arg, "--guard") == 0) {
            a->opt.guard = true;
        } else if (strcmp(arg, "--sync-check") == 0) {
            a->opt.sync_check = true;
        } else if (!inspect && strcmp(arg, "--weights-file") == 0 && has_value) {
            a->opt.weights_file = argv[++i];
            if (!*a->opt.weights_file)
                fatal("--weights-file needs a file name");
        } else if (!inspect && strcmp(arg, "--embed-weights") == 0) {
            a->opt.embed_weights = true;
        } else if (!inspect && strcmp(arg, "--report") == 0) {
            a->opt.report = true;
        } else if (inspect && strcmp(arg, "--format") == 0 && has_value) {
            a->format = argv[++i];
            if (strcmp(a->format, "text") && strcmp(a->format, "json") && strcmp(a->format, "dot"))
                fatal("--format must be text, json or dot, not '%s'", a->format);
        } else if (inspect && strcmp(arg, "--html") == 0 && has_value) {
            a->html = argv[++i];
        } else if (inspect && strcmp(arg, "--profile") == 0 && has_value) {
            a->profile = argv[++i];
        } else if (arg[0] == '-') {
            fatal("unknown option '%s' (or it lacks its value); see kiln --help", arg);
        } else if (!a->model) {
            a->model = arg;
        } else {
            fatal("more than one model given ('%s' and '%s')", a->model, arg);
        }
    }
    if (!a->model)
        fatal("no model given; see kiln --help");
    if (a->opt.weights_file && a->opt.embed_weights)
        fatal("--weights-file and --embed-weights contradict each other");
    if (a->opt.nkeep_f32 && a->opt.precision != KILN_DTYPE_F16)
        fatal("--keep-f32 is for --precision f16");
    if (a->opt.io_f16 && a->opt.precision != KILN_DTYPE_F16)
        fatal("--io f16 is for --precision f16");
    if (a->opt.activations_int8 &&
        (a->opt.weights_format < WF_INT8 || a->opt.weights_format > WF_INT4_ASYM))
        fatal("--activations int8 is for --weights int8, int8-asym, int4 or int4-asym");
}

/* Stops with a clear message when `path` cannot be written because of
 * its directory (missing, not a directory, not writable): checked before
 * the compile, which may take a while, rather than after it. */
static void check_output_dir(const char *path) {
    if (!path)
        return;
    const char *slash = strrchr(path, '/');
    char *dir = slash ? format("%.*s", (int)(slash - path), path) : xstrdup(".");
    if (!*dir)
        dir = xstrdup("/");
    struct stat st;
    if (stat(dir, &st) != 0 && errno == ENOENT)
        fatal("cannot write %s: the directory %s does not exist", path, dir);
    if (stat(dir, &st) != 0)
        fatal("cannot write %s: %s: %s", path, dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        fatal("cannot write %s: %s is not a directory", path, dir);
    if (access(dir, W_OK) != 0)
        fatal("cannot write %s: no permission to write in %s", path, dir);
}

/* --time: each stage's wall-clock time, printed to stderr as it ends. */
static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* This process's resident memory now and at its peak, in MiB, from
 * /proc/self/status (Linux); false where that cannot be read. */
static bool host_memory(double *rss, double *peak) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return false;
    char line[256];
    long long now = -1, hwm = -1;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "VmRSS:", 6) == 0)
            now = strtoll(line + 6, NULL, 10);
        else if (strncmp(line, "VmHWM:", 6) == 0)
            hwm = strtoll(line + 6, NULL, 10);
    }
    fclose(f);
    *rss = (double)now / 1024.0;
    *peak = (double)hwm / 1024.0;
    return now >= 0 && hwm >= 0;
}

/* --time: the stage's seconds, and the host memory the compiler holds
 * (a model's weights are read, converted and re-encoded in memory). */
static void stage_done(const Options *opt, const char *stage) {
    static double last, first;
    double t = now_s(), rss, peak;
    if (!first)
        first = last = t;
    if (opt->time_stages && stage) {
        fprintf(stderr, "kiln: %-10s %8.3f s (%.3f s in all)", stage, t - last, t - first);
        if (host_memory(&rss, &peak))
            fprintf(stderr, "; host memory %.0f MiB, at most %.0f", rss, peak);
        fputc('\n', stderr);
    }
    last = t;
}

/* The whole pipeline up to SPIR-V: what compile emits and inspect shows. */
static Program *build(Args *a, Graph **out_graph) {
    const char *model = a->model;
    bool onnx = ends_with(model, ".onnx");
    if (!onnx && !ends_with(model, ".yaml") && !ends_with(model, ".yml"))
        fatal("%s: unsupported model format (kiln reads .yaml, .yml and .onnx)", model);
    if ((a->nshapes || a->nconsts) && !onnx)
        fatal("--shape and --const are for ONNX models");
    const Options *o = &a->opt;
    stage_done(o, NULL);
    Graph *g = onnx ? load_onnx(model, a->nshapes, a->shapes, a->nconsts, a->consts)
                    : load_yaml(model);
    stage_done(o, "read");
    load_weights(g);
    stage_done(o, "weights");
    infer_shapes(g);
    if (!o->debug_tensors && !o->no_fuse_patterns)
        rewrite_patterns(g, o);
    stage_done(o, "shapes");
    optimize(g, &a->opt);
    stage_done(o, "optimize");
    apply_precision(g, &a->opt);
    stage_done(o, "precision");
    quantize_weights(g, &a->opt);
    stage_done(o, "encode");
    if (!a->opt.name)
        a->opt.name = sanitize_name(g->name);
    Program *p = lower(g, a->opt.guard);
    p->alignment = a->opt.alignment;
    p->debug_tensors = a->opt.debug_tensors;
    p->sync_check = a->opt.sync_check;
    stage_done(o, "lower");
    plan_memory(g, p);
    schedule(g, p);
    stage_done(o, "plan");
    KernelCache *cache = kernel_cache_open(a->opt.kernel_cache, a->opt.verbose);
    compile_kernels(p, cache);
    stage_done(o, "kernels");
    if (cache && a->opt.verbose)
        fprintf(stderr, "kiln: kernel cache %s: %d kernels found, %d compiled\n", cache->dir,
                cache->hits, cache->misses);
    *out_graph = g;
    return p;
}

/* A dynamic model's dispatches that compute their largest shape every run
 * because they take a tensor that follows two dims or more at once (an
 * encoder's [batch, seq, hidden] with both dynamic: docs/unsupported.md):
 * a note with their count and the first such tensor, and the remedy, where
 * they move a tenth of the model's bytes or more. */
static void largest_shape_note(const Graph *g, const Program *p) {
    int count = 0;
    const Tensor *first = NULL;
    double bytes = 0.0, all = 0.0; /* moved by those dispatches, by all */
    for (int i = 0; i < p->ndispatches; i++) {
        const Dispatch *d = p->dispatches[i];
        double moved = (double)(dispatch_bytes_read(d) + dispatch_bytes_written(d));
        all += moved;
        const Tensor *multi = NULL;
        for (int k = 0; k < d->nargs && !multi; k++) {
            const Tensor *t = d->args[k];
            if (t->dyn_axes & (t->dyn_axes - 1))
                multi = t;
        }
        /* one that follows the dims: its groups, or its sizes in the
         * kernel (a matrix-vector product's rows, a product's batches) */
        if (!multi || d->dynamic || dispatch_reads_dims(d))
            continue;
        count++;
        bytes += moved;
        first = first ? first : multi;
    }
    /* not for a decoder's masks over [seq, past + seq], a small share */
    if (!count || bytes < 0.1 * all)
        return;
    Str shape = {0};
    str_add(&shape, "[");
    for (int i = 0; i < first->rank; i++) {
        if (i)
            str_add(&shape, ", ");
        if (is_dyn(first, i))
            str_add(&shape, dim_expr_str(g, &first->ext[i]));
        else
            str_addf(&shape, "%lld", (long long)first->shape[i]);
    }
    str_add(&shape, "]");
    printf("kiln: note: %d of %d dispatches (%.0f%% of the bytes moved) compute their "
           "largest shape every run: their tensors follow several dims at once, as '%s' %s "
           "(docs/unsupported.md)%s\n",
           count, p->ndispatches, 100.0 * bytes / all, first->name, shape.buf,
           g->ndims > 1 ? "; with all dims but one fixed (ONNX: --shape DIM=N, as batch=1) "
                          "they follow the remaining one"
                        : "");
}

/* --activations int8: how many matrix-vector dispatches multiply A as
 * 8-bit integers (A_Q8) and how many products of few rows with 8- or
 * 4-bit weights keep A as it is; a note when none does, or -v. */
static void activations_note(const Program *p, const Options *o) {
    if (!o->activations_int8)
        return;
    int q8 = 0, kept = 0;
    for (int i = 0; i < p->ndispatches; i++) {
        const Dispatch *d = p->dispatches[i];
        if (strcmp(d->family, "matvec_k") != 0 && strcmp(d->family, "matvec") != 0)
            continue;
        if (d->defines.buf && strstr(d->defines.buf, "A_Q8 1\n"))
            q8++;
        else if (d->defines.buf && strstr(d->defines.buf, "W_FORMAT ") &&
                 !strstr(d->defines.buf, "W_FORMAT 0\n") &&
                 !strstr(d->defines.buf, "W_FORMAT 1\n"))
            kept++;
    }
    if (!q8)
        printf("kiln: note: --activations int8 changed no product: it applies to products "
               "of one to four rows (decoding steps) on K-major weights (docs/cli.md, "
               "\"Activations as 8-bit integers\")\n");
    else if (o->verbose)
        fprintf(stderr, "kiln: %d matrix-vector dispatches multiply A as 8-bit integers, "
                "%d of few rows keep A as it is\n", q8, kept);
}

/* Without -o: the model file's name without its folder and extension,
 * in the current directory (models/cnn.onnx: cnn.c and cnn.h). */
static char *default_output(const char *model) {
    const char *base = strrchr(model, '/');
    char *stem = xstrdup(base ? base + 1 : model);
    char *dot = strrchr(stem, '.');
    if (dot && dot != stem)
        *dot = 0;
    return format("%s.c", stem);
}

static int compile(int argc, char **argv) {
    Args a;
    parse_args(argc, argv, false, &a);
    if (a.out && !ends_with(a.out, ".c"))
        fatal("the output name must end in .c (got '%s')", a.out);
    check_output_dir(a.out);
    check_output_dir(a.opt.weights_file);
    Graph *g;
    Program *p = build(&a, &g);
    const char *out = a.out ? a.out : default_output(a.model);
    char *header = xstrdup(out);
    header[strlen(header) - 1] = 'h';
    if (!a.opt.weights_file && !a.opt.embed_weights && p->weight_bytes > EMBED_LIMIT) {
        char *w = xstrdup(out);
        w[strlen(w) - 2] = 0;
        a.opt.weights_file = format("%s.weights", w);
    }
    if (a.opt.weights_file && !write_weights_file(g, p, a.opt.weights_file))
        fatal("cannot write %s: %s", a.opt.weights_file, strerror(errno));
    stage_done(&a.opt, a.opt.weights_file ? "sidecar" : NULL);
    Str c = {0}, h = {0};
    emit_c(g, p, &a.opt, header, &c, &h);
    stage_done(&a.opt, "emit");
    if (!write_file(header, h.buf, h.len))
        fatal("cannot write %s: %s", header, strerror(errno));
    if (!write_file(out, c.buf, c.len)) {
        int e = errno;
        remove(header);
        fatal("cannot write %s: %s", out, strerror(e));
    }
    stage_done(&a.opt, "write");
    int barriers = 0;
    for (int i = 0; i < p->ndispatches; i++)
        barriers += p->dispatches[i]->barrier;
    /* a dispatch with a variant for other devices is listed, not run */
    DeviceCounts dc = device_counts(p);
    const char *run = dc.most < dc.listed
                          ? format("at most %d run on one device; ", dc.most) : "";
    printf("kiln: %s -> %s: %d dispatches (%s%d barriers), %d kernels, arena %llu bytes "
           "(lower bound %llu), weights %llu bytes\n",
           a.model, out, p->ndispatches, run, barriers, p->nmodules,
           (unsigned long long)p->arena_bytes, (unsigned long long)p->peak_bytes,
           (unsigned long long)p->weight_bytes);
    largest_shape_note(g, p);
    activations_note(p, &a.opt);
    if (a.opt.weights_file)
        printf("kiln: weights in %s (%llu bytes); create reads it from there, or from "
               "kiln_model_options.weights_path\n", a.opt.weights_file,
               (unsigned long long)p->weight_bytes);
    if (a.opt.report)
        compile_report(g, p, c.len, KILN_RUNTIME_BYTES, stdout);
    return 0;
}

/* The per-dispatch microseconds of a run_model -p profile, in order. */
static double *read_profile(const char *path, int *count) {
    size_t size;
    char *text = read_file(path, &size);
    Loc loc = {path, 0, 0};
    if (!text)
        error_at(loc, "cannot read: %s", strerror(errno));
    if (!strstr(text, "\"kiln-profile/1\""))
        error_at(loc, "not a kiln profile (schema kiln-profile/1)");
    double *us = NULL;
    int n = 0;
    for (char *q = strstr(text, "\"us\":"); q; q = strstr(q + 5, "\"us\":")) {
        us = xrealloc(us, sizeof(double) * (size_t)(n + 1));
        us[n++] = strtod(q + 5, NULL);
    }
    *count = n;
    return us;
}

static int inspect(int argc, char **argv) {
    Args a;
    parse_args(argc, argv, true, &a);
    check_output_dir(a.out);
    check_output_dir(a.html);
    Graph *g;
    Program *p = build(&a, &g);
    int nprofile = 0;
    double *profile = a.profile ? read_profile(a.profile, &nprofile) : NULL;
    if (profile && nprofile != p->ndispatches)
        fatal("%s has %d dispatch times; the model has %d dispatches", a.profile, nprofile,
              p->ndispatches);
    FILE *f = stdout;
    if (a.out && !(f = fopen(a.out, "w")))
        fatal("cannot write %s", a.out);
    if (strcmp(a.format, "json") == 0)
        inspect_json(g, p, f);
    else if (strcmp(a.format, "dot") == 0)
        inspect_dot(g, p, f);
    else
        inspect_text(g, p, f, a.opt.verbose);
    if (f != stdout && fclose(f) != 0)
        fatal("cannot write %s", a.out);
    if (a.html) {
        FILE *h = fopen(a.html, "w");
        if (!h)
            fatal("cannot write %s", a.html);
        inspect_html(g, p, profile, nprofile, h);
        if (fclose(h) != 0)
            fatal("cannot write %s", a.html);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        print_usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        print_usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("kiln %s\n", KILN_VERSION);
        return 0;
    }
    if (strcmp(argv[1], "compile") == 0)
        return compile(argc, argv);
    if (strcmp(argv[1], "inspect") == 0)
        return inspect(argc, argv);
    if (strcmp(argv[1], "tensor") == 0) {
        if (argc != 4) {
            print_usage(stderr);
            return 2;
        }
        return convert_tensor(argv[2], argv[3]);
    }
    fprintf(stderr, "kiln: error: unknown command '%s'\n\n", argv[1]);
    print_usage(stderr);
    return 2;
}
