/*
 * status.c: status codes, their names, and the per-thread last error.
 *
 * The message buffer is thread-local where the compiler offers it (GCC and
 * clang), so two threads that fail at once do not garble each other's text.
 */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>

#if defined(__GNUC__)
#define KILN_THREAD_LOCAL __thread
#else
#define KILN_THREAD_LOCAL
#endif

static KILN_THREAD_LOCAL char last_error[512];

const char *kiln_status_string(kiln_status status) {
    switch (status) {
    case KILN_OK: return "KILN_OK";
    case KILN_ERROR_INVALID_ARGUMENT: return "KILN_ERROR_INVALID_ARGUMENT";
    case KILN_ERROR_OUT_OF_HOST_MEMORY: return "KILN_ERROR_OUT_OF_HOST_MEMORY";
    case KILN_ERROR_OUT_OF_DEVICE_MEMORY: return "KILN_ERROR_OUT_OF_DEVICE_MEMORY";
    case KILN_ERROR_NO_DEVICE: return "KILN_ERROR_NO_DEVICE";
    case KILN_ERROR_FEATURE_MISSING: return "KILN_ERROR_FEATURE_MISSING";
    case KILN_ERROR_DEVICE_LOST: return "KILN_ERROR_DEVICE_LOST";
    case KILN_ERROR_VULKAN: return "KILN_ERROR_VULKAN";
    case KILN_ERROR_INCOMPATIBLE: return "KILN_ERROR_INCOMPATIBLE";
    case KILN_ERROR_OUT_OF_BOUNDS: return "KILN_ERROR_OUT_OF_BOUNDS";
    case KILN_ERROR_WEIGHTS: return "KILN_ERROR_WEIGHTS";
    case KILN_ERROR_OUT_OF_RANGE: return "KILN_ERROR_OUT_OF_RANGE";
    }
    return "KILN_ERROR_UNKNOWN";
}

const char *kiln_last_error(void) { return last_error; }

const char *kiln_rt_version(uint32_t *number) {
    if (number)
        *number = KILN_RT_VERSION_NUMBER;
    return KILN_RT_VERSION;
}

kiln_status kiln__check_options_size(const char *type, uint32_t size, size_t size_0_2) {
    if (size != 0 && size < size_0_2)
        return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT,
                         "%s.size is %u: set it to sizeof(%s) (%u bytes or more), "
                         "or 0", type, size, type, (unsigned)size_0_2);
    return KILN_OK;
}

kiln_status kiln__fail(kiln_status status, const char *file, int line,
                       const char *fmt, ...) {
    int n = snprintf(last_error, sizeof last_error, "%s:%d: ", file, line);
    if (n < 0 || (size_t)n >= sizeof last_error)
        n = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error + n, sizeof last_error - (size_t)n, fmt, ap);
    va_end(ap);
    return status;
}

const char *kiln__vk_result_name(VkResult r) {
    switch (r) {
#define NAME(x) case x: return #x;
    NAME(VK_SUCCESS)
    NAME(VK_NOT_READY)
    NAME(VK_TIMEOUT)
    NAME(VK_INCOMPLETE)
    NAME(VK_ERROR_OUT_OF_HOST_MEMORY)
    NAME(VK_ERROR_OUT_OF_DEVICE_MEMORY)
    NAME(VK_ERROR_INITIALIZATION_FAILED)
    NAME(VK_ERROR_DEVICE_LOST)
    NAME(VK_ERROR_MEMORY_MAP_FAILED)
    NAME(VK_ERROR_LAYER_NOT_PRESENT)
    NAME(VK_ERROR_EXTENSION_NOT_PRESENT)
    NAME(VK_ERROR_FEATURE_NOT_PRESENT)
    NAME(VK_ERROR_INCOMPATIBLE_DRIVER)
    NAME(VK_ERROR_TOO_MANY_OBJECTS)
    NAME(VK_ERROR_FORMAT_NOT_SUPPORTED)
    NAME(VK_ERROR_FRAGMENTED_POOL)
    NAME(VK_ERROR_OUT_OF_POOL_MEMORY)
    NAME(VK_ERROR_INVALID_EXTERNAL_HANDLE)
    NAME(VK_ERROR_FRAGMENTATION)
    NAME(VK_ERROR_INVALID_OPAQUE_CAPTURE_ADDRESS)
    NAME(VK_ERROR_UNKNOWN)
#undef NAME
    default: return "VK_ERROR_(unnamed)";
    }
}

kiln_status kiln__vk_fail(VkResult r, const char *file, int line,
                          const char *what) {
    kiln_status s;
    switch (r) {
    case VK_ERROR_OUT_OF_HOST_MEMORY: s = KILN_ERROR_OUT_OF_HOST_MEMORY; break;
    case VK_ERROR_OUT_OF_DEVICE_MEMORY: s = KILN_ERROR_OUT_OF_DEVICE_MEMORY; break;
    case VK_ERROR_DEVICE_LOST: s = KILN_ERROR_DEVICE_LOST; break;
    case VK_ERROR_FEATURE_NOT_PRESENT:
    case VK_ERROR_EXTENSION_NOT_PRESENT:
    case VK_ERROR_LAYER_NOT_PRESENT: s = KILN_ERROR_FEATURE_MISSING; break;
    case VK_ERROR_INCOMPATIBLE_DRIVER: s = KILN_ERROR_NO_DEVICE; break;
    default: s = KILN_ERROR_VULKAN; break;
    }
    return kiln__fail(s, file, line, "%s returned %s", what,
                      kiln__vk_result_name(r));
}
