/*
 * decode.c: greedy autoregressive decoding with samples/decode/decoder.yaml.
 *
 * The model is compiled once for its largest extents (seq: 1..32 new
 * tokens, past: 0..224 cached ones); each run sets the two dynamic
 * dimensions and nothing is recompiled or re-recorded. The key/value cache
 * is model state: it stays on the GPU, each run appends to it in place, and
 * the host never sees it. The prompt goes through in one run (seq = prompt
 * length, past = 0); then each step feeds the last token back (seq = 1,
 * past = tokens so far), taking the model's own greedy choice (the `next`
 * output, an argmax computed on the GPU).
 *
 *   decode [-p PROMPT_LEN] [-n NEW_TOKENS] [--dump DIR] [-q]
 *
 * Prints the tokens and the decode speed in tokens per second (wall clock,
 * each step a full run: set dims, copy in, submit, wait, copy out). --dump
 * writes DIR/tokens.txt (prompt then generated tokens) and each run's logits
 * as DIR/logits_N.bin (f32 [seq, 256]) for tests/test_models.py, which
 * checks them against the CPU reference recomputing the whole prefix
 * without a cache.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 199309L
#endif
#include "decoder.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define VOCAB 256
#define MAX_SEQ 32
#define MAX_PAST 224

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int dump_logits(const char *dir, int step, const float *logits, int seq) {
    char path[4096];
    snprintf(path, sizeof path, "%s/logits_%d.bin", dir, step);
    FILE *f = fopen(path, "wb");
    size_t n = (size_t)seq * VOCAB;
    int ok = f && fwrite(logits, sizeof(float), n, f) == n;
    if (f && fclose(f) != 0)
        ok = 0;
    if (!ok)
        perror(path);
    return ok;
}

/* One run: `seq` tokens at positions past..; logits and next tokens out. */
static kiln_status step(kiln_model *m, const int32_t *tokens, int seq, int past,
                        float *logits, int64_t *next) {
    int32_t positions[MAX_SEQ];
    for (int i = 0; i < seq; i++)
        positions[i] = past + i;
    kiln_status s = kiln_model_set_dim(m, "seq", seq);
    if (s == KILN_OK)
        s = kiln_model_set_dim(m, "past", past);
    const void *in[2] = {tokens, positions};
    void *out[2] = {logits, next};
    return s == KILN_OK ? decoder_run(m, in, out) : s;
}

int main(int argc, char **argv) {
    int prompt_len = 16, new_tokens = 64, quiet = 0;
    const char *dump = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-p") == 0 && i + 1 < argc)
            prompt_len = atoi(argv[++i]);
        else if (strcmp(argv[i], "-n") == 0 && i + 1 < argc)
            new_tokens = atoi(argv[++i]);
        else if (strcmp(argv[i], "--dump") == 0 && i + 1 < argc)
            dump = argv[++i];
        else if (strcmp(argv[i], "-q") == 0)
            quiet = 1;
        else {
            fprintf(stderr, "usage: %s [-p PROMPT_LEN] [-n NEW_TOKENS] [--dump DIR] [-q]\n",
                    argv[0]);
            return 2;
        }
    }
    if (prompt_len < 1 || prompt_len > MAX_SEQ || new_tokens < 1 ||
        prompt_len + new_tokens - 1 > MAX_PAST) {
        fprintf(stderr, "decode: the prompt takes 1..%d tokens and the prompt and new "
                "tokens together fit in %d\n", MAX_SEQ, MAX_PAST + 1);
        return 2;
    }
    int total = prompt_len + new_tokens;
    int32_t *tokens = calloc((size_t)total, sizeof *tokens);
    float *logits = calloc((size_t)MAX_SEQ * VOCAB, sizeof *logits);
    int64_t next[MAX_SEQ];
    if (!tokens || !logits)
        return 1;
    for (int i = 0; i < prompt_len; i++) /* a fixed, arbitrary prompt */
        tokens[i] = (int32_t)((i * 37 + 11) % VOCAB);

    kiln_device *dev = NULL;
    kiln_model *m = NULL;
    int status = 1;
    kiln_status s = kiln_device_create(NULL, &dev);
    if (s == KILN_OK)
        s = decoder_create(dev, &m);
    double t0 = now_us();
    if (s == KILN_OK)
        s = step(m, tokens, prompt_len, 0, logits, next);
    double t1 = now_us();
    if (s == KILN_OK && dump && !dump_logits(dump, 0, logits, prompt_len))
        goto done;
    if (s == KILN_OK)
        tokens[prompt_len] = (int32_t)next[prompt_len - 1];
    for (int k = 1; k < new_tokens && s == KILN_OK; k++) {
        int past = prompt_len + k - 1;
        s = step(m, &tokens[past], 1, past, logits, next);
        if (s == KILN_OK && dump && !dump_logits(dump, k, logits, 1))
            goto done;
        tokens[past + 1] = (int32_t)next[0];
    }
    double t2 = now_us();
    if (s != KILN_OK) {
        fprintf(stderr, "decode: %s: %s\n", kiln_status_string(s), kiln_last_error());
        goto done;
    }
    if (dump) {
        char path[4096];
        snprintf(path, sizeof path, "%s/tokens.txt", dump);
        FILE *f = fopen(path, "w");
        for (int i = 0; f && i < total; i++)
            fprintf(f, "%d%c", tokens[i], i + 1 < total ? ' ' : '\n');
        if (!f || fclose(f) != 0) {
            perror(path);
            goto done;
        }
    }
    if (!quiet) {
        printf("device: %s\nprompt (%d tokens):", kiln_device_name(dev), prompt_len);
        for (int i = 0; i < prompt_len; i++)
            printf(" %d", tokens[i]);
        printf("\ngenerated (%d tokens):", new_tokens);
        for (int i = prompt_len; i < total; i++)
            printf(" %d", tokens[i]);
        printf("\nprompt: %.1f us (one run of %d tokens)\n", t1 - t0, prompt_len);
        if (new_tokens > 1)
            printf("decode: %.1f tokens/s (%.1f us per token, %d steps with the cache "
                   "on the GPU)\n", (new_tokens - 1) / ((t2 - t1) / 1e6),
                   (t2 - t1) / (new_tokens - 1), new_tokens - 1);
    }
    status = kiln_device_validation_count(dev) ? 3 : 0;
    if (status)
        fprintf(stderr, "decode: %u validation messages\n", kiln_device_validation_count(dev));
done:
    decoder_destroy(m);
    kiln_device_destroy(dev);
    free(tokens);
    free(logits);
    return status;
}
