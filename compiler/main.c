/*
 * main.c: the kiln command line, which reads as the compiler's pipeline.
 */
#include "kiln.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: kiln compile MODEL [-o OUT.c] [--name PREFIX] [--shape NAME=DxDx..]...\n"
    "                          [--const NAME=TENSOR.pb]...\n"
    "                          [--align BYTES] [-v]\n"
    "       kiln tensor TENSOR.pb OUT.bin\n"
    "       kiln --help | --version\n"
    "\n"
    "Compiles a neural-network graph (MODEL.yaml, or MODEL.onnx) into one C file\n"
    "and its header: a fixed\n"
    "Vulkan dispatch schedule, baked arena offsets, embedded SPIR-V kernels and\n"
    "the weights. Link the result with libkilnrt and libvulkan.\n"
    "\n"
    "options:\n"
    "  -o OUT.c         write OUT.c and OUT.h (default: PREFIX.c in the current\n"
    "                   directory)\n"
    "  --name PREFIX    C prefix of the generated functions (default: the model's\n"
    "                   name, made a C identifier)\n"
    "  --shape NAME=DxD...  fix an ONNX input's symbolic dimensions (repeatable)\n"
    "  --const NAME=T.pb    make an ONNX input a constant, from a TensorProto file\n"
    "  --align BYTES    arena and weight alignment, a power of two >= 16\n"
    "                   (default 256)\n"
    "  -v               say what the optimizer removed\n"
    "\n"
    "kiln tensor writes an ONNX TensorProto's data as raw little-endian bytes\n"
    "and prints its dtype and shape.\n"
    "  --help           this text\n"
    "  --version        kiln's version\n";

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

static int compile(int argc, char **argv) {
    const char *model = NULL, *out = NULL;
    const char *shapes[64], *consts[64];
    int nshapes = 0, nconsts = 0;
    Options opt = {0};
    opt.alignment = 256;
    opt.command = join_command(argc, argv);
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        bool has_value = i + 1 < argc;
        if (strcmp(a, "-o") == 0 && has_value) {
            out = argv[++i];
        } else if (strcmp(a, "--name") == 0 && has_value) {
            opt.name = argv[++i];
            if (!is_identifier(opt.name))
                fatal("--name '%s' is not a C identifier", opt.name);
        } else if (strcmp(a, "--align") == 0 && has_value) {
            char *end;
            unsigned long long v = strtoull(argv[++i], &end, 10);
            if (*end || v < 16 || v > 65536 || (v & (v - 1)))
                fatal("--align must be a power of two from 16 to 65536, not '%s'",
                      argv[i]);
            opt.alignment = v;
        } else if (strcmp(a, "--shape") == 0 && has_value) {
            if (nshapes == 64)
                fatal("too many --shape options");
            shapes[nshapes] = argv[++i];
            if (!strchr(shapes[nshapes], '='))
                fatal("--shape %s: expected NAME=D0xD1x...", shapes[nshapes]);
            nshapes++;
        } else if (strcmp(a, "--const") == 0 && has_value) {
            if (nconsts == 64)
                fatal("too many --const options");
            consts[nconsts] = argv[++i];
            if (!strchr(consts[nconsts], '='))
                fatal("--const %s: expected NAME=TENSOR.pb", consts[nconsts]);
            nconsts++;
        } else if (strcmp(a, "-v") == 0) {
            opt.verbose = true;
        } else if (a[0] == '-') {
            fatal("unknown option '%s' (or it lacks its value); see kiln --help", a);
        } else if (!model) {
            model = a;
        } else {
            fatal("more than one model given ('%s' and '%s')", model, a);
        }
    }
    if (!model)
        fatal("no model given; see kiln --help");
    if (out && !ends_with(out, ".c"))
        fatal("the output name must end in .c (got '%s')", out);
    bool onnx = ends_with(model, ".onnx");
    if (!onnx && !ends_with(model, ".yaml") && !ends_with(model, ".yml"))
        fatal("%s: unsupported model format (kiln reads .yaml, .yml and .onnx)", model);
    if ((nshapes || nconsts) && !onnx)
        fatal("--shape and --const are for ONNX models");

    Graph *g = onnx ? load_onnx(model, nshapes, shapes, nconsts, consts) : load_yaml(model);
    load_weights(g);
    infer_shapes(g);
    optimize(g, &opt);
    if (!opt.name)
        opt.name = sanitize_name(g->name);
    Program *p = lower(g);
    p->alignment = opt.alignment;
    plan_memory(g, p);
    schedule(g, p);
    compile_kernels(p);

    if (!out)
        out = format("%s.c", opt.name);
    char *header = xstrdup(out);
    header[strlen(header) - 1] = 'h';
    Str c = {0}, h = {0};
    emit_c(g, p, &opt, header, &c, &h);
    if (!write_file(header, h.buf, h.len))
        fatal("cannot write %s", header);
    if (!write_file(out, c.buf, c.len)) {
        remove(header);
        fatal("cannot write %s", out);
    }
    int barriers = 0;
    for (int i = 0; i < p->ndispatches; i++)
        barriers += p->dispatches[i]->barrier;
    printf("kiln: %s -> %s: %d dispatches (%d barriers), %d kernels, arena %llu bytes "
           "(lower bound %llu), weights %llu bytes\n",
           model, out, p->ndispatches, barriers, p->nmodules,
           (unsigned long long)p->arena_bytes, (unsigned long long)p->peak_bytes,
           (unsigned long long)p->weight_bytes);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fputs(usage, stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        fputs(usage, stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("kiln %s\n", KILN_VERSION);
        return 0;
    }
    if (strcmp(argv[1], "compile") == 0)
        return compile(argc, argv);
    if (strcmp(argv[1], "tensor") == 0) {
        if (argc != 4) {
            fputs(usage, stderr);
            return 2;
        }
        return convert_tensor(argv[2], argv[3]);
    }
    fprintf(stderr, "kiln: error: unknown command '%s'\n\n%s", argv[1], usage);
    return 2;
}
