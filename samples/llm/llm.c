/*
 * llm.c: greedy decoding with a language model exported by
 * samples/llm/export.py (or any decoder in that layout) and compiled with
 *
 *   kiln compile model.onnx --name llm -o llm_model.c \
 *       [--shape seq=1..128] [--shape past=0..384]
 *
 * The model is compiled once for its largest extents (seq: new tokens a
 * run takes, past: tokens already in the cache); the key/value cache is
 * model state on the GPU, appended to in place by each run. No tokenizer:
 * token ids in, token ids out. The prompt goes through in one run (seq =
 * its length, past = 0), then each step feeds the greedy choice back (seq =
 * 1, past = tokens so far), with attention_mask all ones and position_ids
 * past.. past + seq - 1.
 *
 *   llm [-n NEW_TOKENS] [-o IDS.txt] [-L LOGITS.bin] [-q] PROMPT_ID...
 *
 * Prints the generated ids, the prompt's latency and the decode speed
 * (tokens per second, wall clock: each step sets the dims, copies the ids
 * in, runs, copies the logits out and takes their argmax on the host). -o
 * writes every id (prompt, then generated) to a text file; -L the prompt
 * run's last row of logits (raw f32, vocabulary long).
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 199309L
#endif
#include "llm_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

/* The index of the named tensor in list, or -1. */
static int find(const kiln_tensor_info *list, uint32_t n, const char *name) {
    for (uint32_t i = 0; i < n; i++)
        if (strcmp(list[i].name, name) == 0)
            return (int)i;
    return -1;
}

static int64_t dim_max(const kiln_model_desc *d, const char *name) {
    for (uint32_t i = 0; i < d->dim_count; i++)
        if (strcmp(d->dims[i].name, name) == 0)
            return d->dims[i].max;
    return -1;
}

/* n integers value(i) into buf as the tensor's dtype (i64 or i32). */
static void fill(void *buf, kiln_dtype dt, int n, int64_t start, int64_t step) {
    for (int i = 0; i < n; i++) {
        int64_t v = start + step * i;
        if (dt == KILN_DTYPE_I64)
            ((int64_t *)buf)[i] = v;
        else
            ((int32_t *)buf)[i] = (int32_t)v;
    }
}

typedef struct Io {
    const kiln_model_desc *desc;
    int ids, mask, pos, logits; /* indices in inputs / outputs; pos -1: none */
    void *in[3];
    const void *in_ptrs[8];
    float *out_logits;
    int64_t vocab;
} Io;

/* One run: the tokens tok[0..seq) at positions past..; returns the greedy
 * next token after the last one in *next. */
static kiln_status step(kiln_model *m, Io *io, const int64_t *tok, int seq, int past,
                        int64_t *next) {
    const kiln_model_desc *d = io->desc;
    kiln_status s = kiln_model_set_dim(m, "seq", seq);
    if (s == KILN_OK)
        s = kiln_model_set_dim(m, "past", past);
    if (s != KILN_OK)
        return s;
    kiln_dtype ti = d->inputs[io->ids].dtype;
    for (int i = 0; i < seq; i++) {
        if (ti == KILN_DTYPE_I64)
            ((int64_t *)io->in[0])[i] = tok[i];
        else
            ((int32_t *)io->in[0])[i] = (int32_t)tok[i];
    }
    fill(io->in[1], d->inputs[io->mask].dtype, past + seq, 1, 0);
    if (io->pos >= 0)
        fill(io->in[2], d->inputs[io->pos].dtype, seq, past, 1);
    io->in_ptrs[io->ids] = io->in[0];
    io->in_ptrs[io->mask] = io->in[1];
    if (io->pos >= 0)
        io->in_ptrs[io->pos] = io->in[2];
    void *outs[8] = {0};
    outs[io->logits] = io->out_logits;
    s = llm_run(m, io->in_ptrs, outs);
    if (s != KILN_OK)
        return s;
    const float *row = io->out_logits + (size_t)(seq - 1) * (size_t)io->vocab;
    int64_t best = 0;
    for (int64_t v = 1; v < io->vocab; v++)
        if (row[v] > row[best])
            best = v; /* the first of equal maxima, as torch.argmax */
    *next = best;
    return KILN_OK;
}

int main(int argc, char **argv) {
    int new_tokens = 16, quiet = 0, nprompt = 0;
    const char *out_path = NULL, *logits_path = NULL;
    int64_t *tokens = calloc((size_t)argc + 1, sizeof *tokens);
    if (!tokens)
        return 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-n") == 0 && i + 1 < argc)
            new_tokens = atoi(argv[++i]);
        else if (strcmp(argv[i], "-o") == 0 && i + 1 < argc)
            out_path = argv[++i];
        else if (strcmp(argv[i], "-L") == 0 && i + 1 < argc)
            logits_path = argv[++i];
        else if (strcmp(argv[i], "-q") == 0)
            quiet = 1;
        else if (argv[i][0] >= '0' && argv[i][0] <= '9')
            tokens[nprompt++] = strtoll(argv[i], NULL, 10);
        else {
            fprintf(stderr, "usage: %s [-n NEW_TOKENS] [-o IDS.txt] [-L LOGITS.bin] [-q] "
                    "PROMPT_ID...\n", argv[0]);
            return 2;
        }
    }
    const kiln_model_desc *d = llm_desc();
    Io io = {d, find(d->inputs, d->input_count, "input_ids"),
             find(d->inputs, d->input_count, "attention_mask"),
             find(d->inputs, d->input_count, "position_ids"),
             find(d->outputs, d->output_count, "logits"), {0}, {0}, NULL, 0};
    int64_t max_seq = dim_max(d, "seq"), max_past = dim_max(d, "past");
    if (io.ids < 0 || io.mask < 0 || io.logits < 0 || max_seq < 1 || max_past < 0 ||
        d->input_count > 3 || d->output_count > 8) {
        fprintf(stderr, "llm: the model is not a decoder compiled with its cache (inputs "
                "input_ids, attention_mask[, position_ids]; output logits; dims seq, "
                "past)\n");
        return 2;
    }
    if (nprompt < 1 || nprompt > max_seq || new_tokens < 1 ||
        nprompt + new_tokens - 1 > max_past + 1) {
        fprintf(stderr, "llm: the prompt takes 1..%lld ids, and the prompt and new tokens "
                "together fit in %lld (past 0..%lld: recompile with --shape)\n",
                (long long)max_seq, (long long)(max_past + 1), (long long)max_past);
        return 2;
    }
    io.vocab = d->outputs[io.logits].shape[d->outputs[io.logits].rank - 1];
    int total = nprompt + new_tokens;
    tokens = realloc(tokens, sizeof *tokens * (size_t)total);
    for (int k = 0; k < 3; k++)
        io.in[k] = calloc((size_t)(max_seq + max_past), sizeof(int64_t));
    io.out_logits = calloc((size_t)(max_seq * io.vocab), sizeof(float));
    if (!tokens || !io.in[0] || !io.in[1] || !io.in[2] || !io.out_logits)
        return 1;

    kiln_device *dev = NULL;
    kiln_model *m = NULL;
    int status = 1;
    kiln_status s = kiln_device_create(NULL, &dev);
    if (s == KILN_OK)
        s = llm_create(dev, &m);
    double t0 = now_us();
    if (s == KILN_OK)
        s = step(m, &io, tokens, nprompt, 0, &tokens[nprompt]);
    double t1 = now_us();
    if (s == KILN_OK && logits_path) {
        FILE *f = fopen(logits_path, "wb");
        const float *row = io.out_logits + (size_t)(nprompt - 1) * (size_t)io.vocab;
        int ok = f && fwrite(row, sizeof *row, (size_t)io.vocab, f) == (size_t)io.vocab;
        if (f && fclose(f) != 0)
            ok = 0;
        if (!ok) {
            perror(logits_path);
            goto done;
        }
        t1 = now_us(); /* the decode timing leaves the write out */
    }
    for (int k = 1; k < new_tokens && s == KILN_OK; k++) {
        int past = nprompt + k - 1;
        s = step(m, &io, &tokens[past], 1, past, &tokens[past + 1]);
    }
    double t2 = now_us();
    if (s != KILN_OK) {
        fprintf(stderr, "llm: %s: %s\n", kiln_status_string(s), kiln_last_error());
        goto done;
    }
    if (out_path) {
        FILE *f = fopen(out_path, "w");
        for (int i = 0; f && i < total; i++)
            fprintf(f, "%lld%c", (long long)tokens[i], i + 1 < total ? ' ' : '\n');
        if (!f || fclose(f) != 0) {
            perror(out_path);
            goto done;
        }
    }
    if (!quiet) {
        printf("device: %s\ngenerated (%d tokens):", kiln_device_name(dev), new_tokens);
        for (int i = nprompt; i < total; i++)
            printf(" %lld", (long long)tokens[i]);
        printf("\nprompt: %.1f us (one run of %d tokens)\n", t1 - t0, nprompt);
        if (new_tokens > 1)
            printf("decode: %.1f tokens/s (%.1f us per token, %d steps with the cache on "
                   "the GPU)\n", (new_tokens - 1) / ((t2 - t1) / 1e6),
                   (t2 - t1) / (new_tokens - 1), new_tokens - 1);
    }
    status = 0;
done:
    kiln_model_destroy(m);
    kiln_device_destroy(dev);
    for (int k = 0; k < 3; k++)
        free(io.in[k]);
    free(io.out_logits);
    free(tokens);
    return status;
}
