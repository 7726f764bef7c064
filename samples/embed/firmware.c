/*
 * firmware.c: a firmware-style main loop around a kiln model.
 *
 * Every buffer is static, sized by the macros of the generated header; the
 * loop allocates nothing. It creates the model once, runs it RUNS times on
 * fixed inputs, checks that every run gives the bytes of the first, and
 * prints the latency percentiles of a run (host to host: copy in, submit,
 * wait, copy out).
 */
#define _POSIX_C_SOURCE 199309L
#include "net.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RUNS 1000

/* One input and one output in this sample; a model with more adds its
 * NET_INPUT<i>_BYTES buffers the same way. */
static float input[NET_INPUT0_BYTES / sizeof(float) + 1];
static unsigned char output[NET_OUTPUT0_BYTES + 1], first[NET_OUTPUT0_BYTES + 1];
static double latency_us[RUNS];

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(void) {
    if (NET_INPUT_COUNT != 1 || NET_OUTPUT_COUNT != 1) {
        fprintf(stderr, "firmware: this sample wants one input and one output\n");
        return 2;
    }
    for (size_t i = 0; i < sizeof input / sizeof input[0]; i++)
        input[i] = (float)((int)(i * 37 % 101) - 50) / 25.0f;

    kiln_model *m = NULL;
    kiln_status s = net_create(NULL, &m);
    const void *ins[1] = {input};
    void *outs[1] = {output};
    for (int r = 0; r < RUNS && s == KILN_OK; r++) {
        double t0 = now_us();
        s = net_run(m, ins, outs);
        latency_us[r] = now_us() - t0;
        if (r == 0)
            memcpy(first, output, sizeof output);
        else if (s == KILN_OK && memcmp(first, output, sizeof output) != 0) {
            fprintf(stderr, "firmware: run %d differs from run 0\n", r);
            net_destroy(m);
            return 1;
        }
    }
    if (s != KILN_OK) {
        fprintf(stderr, "firmware: %s: %s\n", kiln_status_string(s), kiln_last_error());
        net_destroy(m);
        return 1;
    }
    net_destroy(m);
    qsort(latency_us, RUNS, sizeof latency_us[0], by_value);
    printf("%s: %d runs, latency p50 %.1f us, p99 %.1f us, max %.1f us\n",
           net_desc()->name, RUNS, latency_us[RUNS / 2], latency_us[RUNS * 99 / 100],
           latency_us[RUNS - 1]);
    return 0;
}
