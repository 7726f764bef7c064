/*
 * expect.h: the check of the C test programs that talk to the runtime
 * (test_runtime.c, test_vulkan.c). EXPECT prints "ok NAME", or "FAIL NAME:
 * the condition (last error: ...)" and counts the failure in `failures`,
 * which the program's exit status reports.
 */
#ifndef KILN_TEST_EXPECT_H
#define KILN_TEST_EXPECT_H

#include <stdio.h>

#include "kiln_rt.h"

static int failures;

#define EXPECT(name, cond)                                                    \
    do {                                                                      \
        if (cond) {                                                           \
            printf("ok %s\n", name);                                          \
        } else {                                                              \
            printf("FAIL %s: %s (last error: %s)\n", name, #cond,             \
                   kiln_last_error());                                        \
            failures++;                                                       \
        }                                                                     \
    } while (0)

#endif /* KILN_TEST_EXPECT_H */
