/*
 * test_runtime.c: the runtime's API contract, on a real Vulkan device.
 *
 * Linked with a generated model compiled with --name model (any model with
 * one f32 input and one f32 output). Prints "ok NAME" / "FAIL NAME: why"
 * lines and exits 1 on any failure.
 */
#include "kiln_rt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "expect.h"

const kiln_model_desc *model_desc(void);
kiln_status model_create(kiln_device *device, kiln_model **out_model);
kiln_status model_run(kiln_model *model, const void *const *inputs,
                      void *const *outputs);
void model_destroy(kiln_model *model);

int main(void) {
    /* Status names are distinct and name themselves. */
    int named = 1;
    for (int s = KILN_OK; s <= KILN_ERROR_INCOMPATIBLE; s++)
        named &= strncmp(kiln_status_string((kiln_status)s), "KILN_", 5) == 0;
    named &= strcmp(kiln_status_string(KILN_ERROR_DEVICE_LOST),
                    "KILN_ERROR_DEVICE_LOST") == 0;
    named &= strcmp(kiln_status_string((kiln_status)999), "KILN_ERROR_UNKNOWN") == 0;
    EXPECT("runtime: kiln_status_string names every status", named);
    uint32_t version = 0;
    EXPECT("runtime: kiln_rt_version is the header's",
           strcmp(kiln_rt_version(&version), KILN_RT_VERSION) == 0 &&
               version == KILN_RT_VERSION_NUMBER && kiln_rt_version(NULL) != NULL);
    EXPECT("runtime: dtype sizes", kiln_dtype_size(KILN_DTYPE_F16) == 2 &&
                                       kiln_dtype_size(KILN_DTYPE_I64) == 8 &&
                                       kiln_dtype_size(KILN_DTYPE_BOOL) == 1);

    /* NULL out pointers are errors, not crashes. */
    EXPECT("runtime: device_create(NULL out) is INVALID_ARGUMENT",
           kiln_device_create(NULL, NULL) == KILN_ERROR_INVALID_ARGUMENT &&
               strstr(kiln_last_error(), "device.c:") != NULL);
    EXPECT("runtime: model_create(NULL out) is INVALID_ARGUMENT",
           kiln_model_create(NULL, model_desc(), NULL) == KILN_ERROR_INVALID_ARGUMENT);
    EXPECT("runtime: run(NULL model) is INVALID_ARGUMENT",
           kiln_model_run(NULL, NULL, NULL) == KILN_ERROR_INVALID_ARGUMENT);
    kiln_model_destroy(NULL);
    kiln_device_destroy(NULL);

    /* Options with a size too small for their fields are refused by name;
     * size 0 is every field of 0.2.0. */
    kiln_device_options small = {4, 0, NULL, 0, NULL};
    kiln_device *dev = (kiln_device *)1;
    EXPECT("runtime: device options with size 4 are INVALID_ARGUMENT",
           kiln_device_create(&small, &dev) == KILN_ERROR_INVALID_ARGUMENT && dev == NULL &&
               strstr(kiln_last_error(), "kiln_device_options.size is 4") != NULL);
    kiln_model_options msmall = {8, 0, NULL, NULL};
    kiln_model *none = (kiln_model *)1;
    EXPECT("runtime: model options with size 8 are INVALID_ARGUMENT",
           kiln_model_create_ex(NULL, model_desc(), &msmall, &none) ==
                   KILN_ERROR_INVALID_ARGUMENT && none == NULL &&
               strstr(kiln_last_error(), "kiln_model_options.size is 8") != NULL);

    /* Device selection: by index, by name, and bad requests. */
    kiln_device_options o = {0, 99, NULL, 0, NULL};
    EXPECT("runtime: a device index past the end is NO_DEVICE and sets out to NULL",
           kiln_device_create(&o, &dev) == KILN_ERROR_NO_DEVICE && dev == NULL &&
               strstr(kiln_last_error(), "device index 99") != NULL);
    o.index = -1;
    o.name_contains = "no such device, surely";
    EXPECT("runtime: a device name that matches nothing is NO_DEVICE",
           kiln_device_create(&o, &dev) == KILN_ERROR_NO_DEVICE);
    o.name_contains = NULL;
    o.index = 0;
    kiln_status s = kiln_device_create(&o, &dev);
    EXPECT("runtime: device 0 by index", s == KILN_OK && dev != NULL);
    if (s != KILN_OK)
        return 1;
    char name[256];
    snprintf(name, sizeof name, "%s", kiln_device_name(dev));
    kiln_device_destroy(dev);
    name[4] = 0; /* a prefix of its name */
    o.index = -1;
    o.name_contains = name;
    s = kiln_device_create(&o, &dev);
    EXPECT("runtime: device by a name substring", s == KILN_OK);
    if (s != KILN_OK)
        return 1;

    /* A model with the wrong ABI is refused. */
    kiln_model_desc bad = *model_desc();
    bad.abi_version = KILN_ABI_VERSION + 1;
    kiln_model *m = (kiln_model *)1;
    EXPECT("runtime: tables of another ABI are INCOMPATIBLE",
           kiln_model_create(dev, &bad, &m) == KILN_ERROR_INCOMPATIBLE && m == NULL);
    /* ... and a derived dim over a dim not before it, or of an unknown op */
    bad = *model_desc();
    kiln_dim one = {"n", 1, 4};
    kiln_derived_dim twice = {"n*n", KILN_DIM_MUL, {0, {1}}, {0, {1}}};
    bad.dim_count = 1;
    bad.dims = &one;
    bad.derived_count = 1;
    bad.derived = &twice;
    twice.b.c[1] = 1; /* itself */
    m = (kiln_model *)1;
    EXPECT("runtime: a derived dim over itself is INVALID_ARGUMENT",
           kiln_model_create(dev, &bad, &m) == KILN_ERROR_INVALID_ARGUMENT && m == NULL &&
               strstr(kiln_last_error(), "derived dim 0 is malformed"));
    twice.b.c[1] = 0;
    twice.op = 9;
    m = (kiln_model *)1;
    EXPECT("runtime: a derived dim of an unknown op is INVALID_ARGUMENT",
           kiln_model_create(dev, &bad, &m) == KILN_ERROR_INVALID_ARGUMENT && m == NULL &&
               strstr(kiln_last_error(), "derived dim 0 is malformed"));

    /* Run twice on a shared device, and once on a model-owned device: the
     * same outputs each time. */
    const kiln_model_desc *d = model_desc();
    float *in = calloc(1, (size_t)d->inputs[0].bytes + 4);
    float *o1 = calloc(1, (size_t)d->outputs[0].bytes + 4);
    float *o2 = calloc(1, (size_t)d->outputs[0].bytes + 4);
    float *o3 = calloc(1, (size_t)d->outputs[0].bytes + 4);
    for (uint64_t i = 0; i < d->inputs[0].bytes / 4; i++)
        in[i] = (float)((i * 37) % 17) / 8.0f - 1.0f;
    const void *ins[1] = {in};
    void *outs1[1] = {o1}, *outs2[1] = {o2}, *outs3[1] = {o3};
    s = model_create(dev, &m);
    EXPECT("runtime: create on a caller's device", s == KILN_OK);
    if (s == KILN_OK) {
        EXPECT("runtime: run", model_run(m, ins, outs1) == KILN_OK);
        EXPECT("runtime: run again", model_run(m, ins, outs2) == KILN_OK);
        EXPECT("runtime: repeated runs agree",
               memcmp(o1, o2, (size_t)d->outputs[0].bytes) == 0);
        const void *null_in[1] = {NULL};
        EXPECT("runtime: a NULL input pointer is INVALID_ARGUMENT",
               model_run(m, null_in, outs2) == KILN_ERROR_INVALID_ARGUMENT);
        EXPECT("runtime: the model's device is the caller's", kiln_model_device(m) == dev);
        int64_t v[2] = {4, 4}, shape[KILN_MAX_RANK];
        EXPECT("runtime: set_dims of a model without dims: count 0 only",
               kiln_model_set_dims(m, v, 0) == KILN_OK &&
                   kiln_model_set_dims(m, v, 1) == KILN_ERROR_INVALID_ARGUMENT &&
                   kiln_model_set_dims(NULL, v, 0) == KILN_ERROR_INVALID_ARGUMENT);
        EXPECT("runtime: set_dim of an unknown name is INVALID_ARGUMENT",
               kiln_model_set_dim(m, "seq", 1) == KILN_ERROR_INVALID_ARGUMENT &&
                   strstr(kiln_last_error(), "no dynamic dimension 'seq'") != NULL &&
                   kiln_model_set_dim(m, NULL, 1) == KILN_ERROR_INVALID_ARGUMENT);
        kiln_model_tensor_shape(m, &d->inputs[0], shape);
        EXPECT("runtime: a fixed tensor's shape and bytes are its own",
               kiln_model_tensor_bytes(m, &d->inputs[0]) == d->inputs[0].bytes &&
                   shape[0] == d->inputs[0].shape[0] && shape[1] == d->inputs[0].shape[1]);
        EXPECT("runtime: state calls on a model without state",
               kiln_model_reset_state(m) == KILN_OK &&
                   kiln_model_read_state(m, 0, o2) == KILN_ERROR_INVALID_ARGUMENT &&
                   kiln_model_write_state(m, 0, o2) == KILN_ERROR_INVALID_ARGUMENT &&
                   kiln_model_reset_state(NULL) == KILN_ERROR_INVALID_ARGUMENT);
        model_destroy(m);
    }
    kiln_model *owned = NULL;
    s = model_create(NULL, &owned);
    EXPECT("runtime: create on the default device", s == KILN_OK);
    if (s == KILN_OK) {
        EXPECT("runtime: run on the default device", model_run(owned, ins, outs3) == KILN_OK);
        EXPECT("runtime: same outputs on the default device",
               memcmp(o1, o3, (size_t)d->outputs[0].bytes) == 0);
        model_destroy(owned);
    }
    EXPECT("runtime: no validation messages", kiln_device_validation_count(dev) == 0);
    kiln_device_destroy(dev);
    free(in);
    free(o1);
    free(o2);
    free(o3);
    return failures ? 1 : 0;
}
