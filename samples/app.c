/*
 * app.c: the smallest program around a kiln model, for a model with one f32
 * input and one f32 output compiled with --name model (the README's tour
 * builds and runs it with samples/mlp.yaml):
 *
 *   build/kiln compile samples/mlp.yaml -o model.c --name model
 *   cc -std=c99 -Iruntime -I. -o app samples/app.c model.c -Lbuild -lkilnrt -lvulkan -lm
 *   ./app
 *
 * The buffers are static, sized by the generated header's macros; the input
 * is a ramp. It prints the first outputs, or the status and its message.
 */
#include "model.h"

#include <stdio.h>

static float x[MODEL_INPUT0_BYTES / sizeof(float)];
static float y[MODEL_OUTPUT0_BYTES / sizeof(float)];

int main(void) {
    for (size_t i = 0; i < sizeof x / sizeof x[0]; i++)
        x[i] = (float)(i % 7) / 7.0f;

    kiln_model *m = NULL;
    kiln_status s = model_create(NULL, &m);        /* NULL: the best device */
    const void *inputs[] = {x};                    /* host pointers, model order */
    void *outputs[] = {y};
    if (s == KILN_OK)
        s = model_run(m, inputs, outputs);         /* one submit, one wait */
    if (s != KILN_OK)
        fprintf(stderr, "%s: %s\n", kiln_status_string(s), kiln_last_error());
    model_destroy(m);

    if (s == KILN_OK)
        printf("y[0..3] = %g %g %g %g\n", y[0], y[1], y[2], y[3]);
    return s == KILN_OK ? 0 : 1;
}
