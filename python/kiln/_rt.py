"""_rt.py: libkilnrt through ctypes.

The structures mirror runtime/kiln_rt_tables.h at KILN_ABI_VERSION 10 (the
fields up to those the session reads; a model from another kiln version is
refused by its abi_version before anything else is read) and the functions
are those of runtime/kiln_rt.h that the session calls.
"""
import ctypes
from ctypes import (POINTER, Structure, c_char_p, c_double, c_int, c_int64,
                    c_uint32, c_uint64, c_void_p)

ABI_VERSION = 10
MAX_RANK = 8
MAX_DIMS = 8

KILN_OK = 0
KILN_ERROR_OUT_OF_RANGE = 11


class Dim(Structure):
    _fields_ = [("name", c_char_p), ("min", c_int64), ("max", c_int64)]


class Extent(Structure):
    _fields_ = [("c0", c_int64), ("c", c_int64 * MAX_DIMS)]


class DerivedDim(Structure):
    _fields_ = [("name", c_char_p), ("op", c_uint32), ("a", Extent), ("b", Extent)]


class TensorInfo(Structure):
    _fields_ = [("name", c_char_p), ("dtype", c_int), ("rank", c_uint32),
                ("shape", c_int64 * MAX_RANK), ("bytes", c_uint64), ("buffer", c_uint32),
                ("offset", c_uint64), ("io_offset", c_uint64), ("dyn_axes", c_uint32),
                ("extents", POINTER(Extent))]


class ModelDesc(Structure):
    _fields_ = [("abi_version", c_uint32), ("name", c_char_p), ("arena_bytes", c_uint64),
                ("alignment", c_uint64), ("io_bytes", c_uint64), ("features", c_uint32),
                ("weights", c_void_p), ("weight_bytes", c_uint64),
                ("kernel_count", c_uint32), ("kernels", c_void_p),
                ("dispatch_count", c_uint32), ("dispatches", c_void_p), ("bindings", c_void_p),
                ("input_count", c_uint32), ("inputs", POINTER(TensorInfo)),
                ("output_count", c_uint32), ("outputs", POINTER(TensorInfo)),
                ("debug_count", c_uint32), ("debug_tensors", POINTER(TensorInfo)),
                ("guard_count", c_uint32), ("guards", c_void_p),
                ("weights_file", c_char_p), ("weights_checksum", c_uint64),
                ("dim_count", c_uint32), ("dims", POINTER(Dim)),
                ("derived_count", c_uint32), ("derived", POINTER(DerivedDim)),
                ("dims_offset", c_uint64), ("dims_io_offset", c_uint64),
                ("indirect_offset", c_uint64), ("indirect_io_offset", c_uint64),
                ("indirect_count", c_uint32),
                ("state_count", c_uint32), ("states", POINTER(TensorInfo))]


class ModelOptions(Structure):
    _fields_ = [("size", c_uint32), ("flags", c_uint32), ("weights_path", c_char_p),
                ("pipeline_cache", c_char_p)]


# kiln_dtype -> numpy dtype name, and onnxruntime's type string.
DTYPES = {0: ("float32", "tensor(float)"), 1: ("float16", "tensor(float16)"),
          2: ("int32", "tensor(int32)"), 3: ("int64", "tensor(int64)"),
          4: ("bool", "tensor(bool)"), 5: ("uint8", "tensor(uint8)"),
          6: ("int8", "tensor(int8)")}


def load(path):
    """Opens libkilnrt.so (globally, so that the models' shared objects bind
    to this copy) and declares the functions the session calls."""
    lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    p_model, p_device = c_void_p, c_void_p
    sig = {
        "kiln_rt_version": (c_char_p, [POINTER(c_uint32)]),
        "kiln_status_string": (c_char_p, [c_int]),
        "kiln_last_error": (c_char_p, []),
        "kiln_device_create": (c_int, [c_void_p, POINTER(c_void_p)]),
        "kiln_device_destroy": (None, [p_device]),
        "kiln_device_name": (c_char_p, [p_device]),
        "kiln_device_type_name": (c_char_p, [p_device]),
        "kiln_device_validation_count": (c_uint32, [p_device]),
        "kiln_model_create_ex": (c_int, [p_device, POINTER(ModelDesc), POINTER(ModelOptions),
                                         POINTER(c_void_p)]),
        "kiln_model_destroy": (None, [p_model]),
        "kiln_model_set_dims": (c_int, [p_model, POINTER(c_int64), c_uint32]),
        "kiln_model_tensor_shape": (None, [p_model, POINTER(TensorInfo), POINTER(c_int64)]),
        "kiln_model_input_memory": (c_void_p, [p_model, c_uint32]),
        "kiln_model_output_memory": (c_void_p, [p_model, c_uint32]),
        "kiln_model_run_mapped": (c_int, [p_model]),
        "kiln_model_reset_state": (c_int, [p_model]),
        "kiln_model_profile": (c_int, [p_model, POINTER(c_double), c_uint32]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


def text(b):
    return b.decode("utf-8", "replace") if b is not None else None


__all__ = ["ABI_VERSION", "DTYPES", "Dim", "Extent", "DerivedDim", "TensorInfo", "ModelDesc",
           "ModelOptions", "load", "text"]
