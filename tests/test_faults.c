/*
 * test_faults.c: every failure the runtime can meet, injected one at a time.
 *
 * Built by tests/test_models.py from the runtime's sources with
 * -DKILN_FAULT_INJECTION and a compiled model (--name model --debug-tensors).
 * A clean cycle (create with profiling, run, run, read the profile, read a
 * debug tensor, destroy) is counted first: H host allocations
 * and V Vulkan calls that return a VkResult. Then, for every N in 1..V and
 * each of VK_ERROR_OUT_OF_HOST_MEMORY, VK_ERROR_OUT_OF_DEVICE_MEMORY,
 * VK_ERROR_DEVICE_LOST and VK_ERROR_INITIALIZATION_FAILED, and for every N in
 * 1..H (the allocation fails), the cycle runs again with that fault:
 *
 *   - the failing call returns a status that is not KILN_OK, with a message;
 *   - a run that returns KILN_OK wrote the right outputs;
 *   - after a run fails, the next run fails too (the model says why) unless
 *     the failure left the model whole, in which case the next run is right;
 *   - destroy works; host allocations and frees balance (and LeakSanitizer
 *     checks the same in the sanitizer build; the validation layer reports
 *     Vulkan objects left behind, which the Python side counts as failure).
 *
 * Prints "ok ..." / "FAIL ..." lines and a summary; exit 1 on any failure.
 */
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const kiln_model_desc *model_desc(void);

static int failures, cases, have_want;
static float *inputs[KILN_MAX_BINDINGS], *want[KILN_MAX_BINDINGS], *got[KILN_MAX_BINDINGS];

static void fail(const char *what, uint64_t n, const char *why) {
    if (failures < 20)
        printf("FAIL %s at %llu: %s\n", what, (unsigned long long)n, why);
    failures++;
}

static int outputs_match(const kiln_model_desc *d) {
    if (!have_want)
        return 1;
    for (uint32_t i = 0; i < d->output_count; i++)
        if (memcmp(got[i], want[i], (size_t)d->outputs[i].bytes) != 0)
            return 0;
    return 1;
}

/* One create / run / run / destroy cycle; returns the first failing status
 * (KILN_OK when none) and checks the rules above. */
static kiln_status cycle(const char *what, uint64_t n) {
    const kiln_model_desc *d = model_desc();
    kiln_device_options opts = {sizeof opts, -1, NULL, 0, NULL};
    const char *v = getenv("KILN_VALIDATION");
    if (v && strcmp(v, "1") == 0)
        opts.flags |= KILN_DEVICE_VALIDATION;
    kiln_device *dev = NULL;
    kiln_model *m = NULL;
    kiln_model_options mo = {sizeof mo, KILN_MODEL_PROFILE, NULL, NULL};
    kiln_status first = kiln_device_create(&opts, &dev);
    if (first == KILN_OK)
        first = kiln_model_create_ex(dev, d, &mo, &m);
    if (first != KILN_OK && m != NULL)
        fail(what, n, "create failed but returned a model");
    if (first == KILN_OK) {
        kiln_status r1 = kiln_model_run(m, (const void *const *)inputs, (void *const *)got);
        if (r1 == KILN_OK && !outputs_match(d))
            fail(what, n, "run 1 returned KILN_OK with wrong outputs");
        memset(got[0], 0, (size_t)d->outputs[0].bytes);
        kiln_status r2 = kiln_model_run(m, (const void *const *)inputs, (void *const *)got);
        if (r2 == KILN_OK && !outputs_match(d))
            fail(what, n, "run 2 returned KILN_OK with wrong outputs");
        if (r1 == KILN_ERROR_DEVICE_LOST && r2 != KILN_ERROR_DEVICE_LOST)
            fail(what, n, "a run after a device loss did not return KILN_ERROR_DEVICE_LOST");
        first = r1 != KILN_OK ? r1 : r2;
        /* Profiles and debug reads have their own Vulkan calls. */
        if (first == KILN_OK) {
            double us[256];
            first = kiln_model_profile(m, us, 256);
        }
        if (first == KILN_OK && d->debug_count > 0) {
            void *buf = malloc((size_t)d->debug_tensors[0].bytes + 1);
            first = kiln_model_read_tensor(m, &d->debug_tensors[0], buf);
            free(buf);
        }
    }
    if (first != KILN_OK && kiln_last_error()[0] == 0)
        fail(what, n, "a failure without a message");
    kiln_model_destroy(m);
    kiln_device_destroy(dev);
    kiln_fault_counts c = kiln_fault_get();
    if (c.allocs != c.frees) {
        char why[96];
        snprintf(why, sizeof why, "%llu host allocations, %llu frees",
                 (unsigned long long)c.allocs, (unsigned long long)c.frees);
        fail(what, n, why);
    }
    cases++;
    return first;
}

int main(void) {
    const kiln_model_desc *d = model_desc();
    for (uint32_t i = 0; i < d->input_count; i++) {
        size_t count = (size_t)d->inputs[i].bytes / 4 + 1;
        inputs[i] = malloc(count * 4);
        for (size_t k = 0; k < count; k++)
            inputs[i][k] = (float)sin(0.37 * (double)k + i) * 2.0f;
    }
    for (uint32_t i = 0; i < d->output_count; i++) {
        want[i] = calloc((size_t)d->outputs[i].bytes + 4, 1);
        got[i] = calloc((size_t)d->outputs[i].bytes + 4, 1);
    }

    kiln_fault_set(0, 0, 0);
    kiln_status s = cycle("clean", 0);
    kiln_fault_counts clean = kiln_fault_get();
    if (s != KILN_OK) {
        printf("FAIL clean cycle: %s %s\n", kiln_status_string(s), kiln_last_error());
        return 1;
    }
    for (uint32_t i = 0; i < d->output_count; i++)
        memcpy(want[i], got[i], (size_t)d->outputs[i].bytes);
    have_want = 1;
    /* The clean cycle again: runs are deterministic. */
    kiln_fault_set(0, 0, 0);
    if (cycle("clean again", 0) != KILN_OK)
        fail("clean again", 0, kiln_last_error());

    static const struct {
        VkResult result;
        const char *name;
    } results[] = {
        {VK_ERROR_OUT_OF_HOST_MEMORY, "VK_ERROR_OUT_OF_HOST_MEMORY"},
        {VK_ERROR_OUT_OF_DEVICE_MEMORY, "VK_ERROR_OUT_OF_DEVICE_MEMORY"},
        {VK_ERROR_DEVICE_LOST, "VK_ERROR_DEVICE_LOST"},
        {VK_ERROR_INITIALIZATION_FAILED, "VK_ERROR_INITIALIZATION_FAILED"},
    };
    int injected = 0;
    for (size_t r = 0; r < sizeof results / sizeof results[0]; r++) {
        int failed = 0;
        for (uint64_t n = 1; n <= clean.vk_calls; n++) {
            kiln_fault_set(0, n, results[r].result);
            failed += cycle(results[r].name, n) != KILN_OK;
            injected++;
        }
        printf("%s %s: %llu call sites in turn, %d cycles failed cleanly\n",
               failed ? "ok" : "FAIL", results[r].name,
               (unsigned long long)clean.vk_calls, failed);
        failures += !failed;
    }
    int failed = 0;
    for (uint64_t n = 1; n <= clean.allocs; n++) {
        kiln_fault_set(n, 0, 0);
        failed += cycle("host allocation", n) != KILN_OK;
        injected++;
    }
    printf("%s host allocations: %llu in turn, %d cycles failed cleanly\n",
           failed == (int)clean.allocs ? "ok" : "FAIL", (unsigned long long)clean.allocs, failed);
    failures += failed != (int)clean.allocs;
    printf("%d faults injected over %llu Vulkan calls and %llu host allocations; "
           "%d cycles, %d failures\n", injected, (unsigned long long)clean.vk_calls,
           (unsigned long long)clean.allocs, cases, failures);
    for (uint32_t i = 0; i < d->input_count; i++)
        free(inputs[i]);
    for (uint32_t i = 0; i < d->output_count; i++) {
        free(want[i]);
        free(got[i]);
    }
    return failures ? 1 : 0;
}
