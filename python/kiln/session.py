"""session.py: InferenceSession, a compiled model loaded into this process.

One kiln device serves every session of the process (made at the first
session, destroyed at exit): sessions share its queue, which Vulkan wants
used by one thread at a time, so every call into a model (create, run,
destroy) holds one process-wide lock. A session may be used from several
threads: their runs take turns.
"""
import atexit
import shutil
import ctypes
import threading
import weakref
from ctypes import byref, c_int64, c_void_p
from pathlib import Path

import numpy as np

from . import _build, _rt
from ._errors import KilnError

_lock = threading.RLock()
_process = {"lib": None, "lib_path": None, "device": None}
_sessions = weakref.WeakSet()


def _check(lib, status, what):
    if status != _rt.KILN_OK:
        name = _rt.text(lib.kiln_status_string(status))
        raise KilnError(f"{what}: {name}: {_rt.text(lib.kiln_last_error())}", name)


def _runtime(tc):
    """libkilnrt, loaded once per process."""
    with _lock:
        if _process["lib"] is None:
            _process["lib"] = _rt.load(tc.lib)
            _process["lib_path"] = tc.lib.resolve()
        elif tc.lib.resolve() != _process["lib_path"]:
            raise KilnError(f"kiln: this process already uses {_process['lib_path']}; "
                            f"a session cannot load another runtime ({tc.lib})")
        return _process["lib"]


def _device(lib):
    if _process["device"] is None:
        dev = c_void_p()
        _check(lib, lib.kiln_device_create(None, byref(dev)), "kiln_device_create")
        _process["device"] = dev
        atexit.register(_shutdown)
    return _process["device"]


def _shutdown():
    with _lock:
        for s in list(_sessions):
            s.close()
        lib, dev = _process["lib"], _process["device"]
        if dev is not None:
            lib.kiln_device_destroy(dev)
            _process["device"] = None


def device_info():
    """The process' kiln device: {"name", "type", "validation_messages"} (the
    Khronos validation layer's messages so far, with KILN_VALIDATION=1);
    None before the first session."""
    with _lock:
        lib, dev = _process["lib"], _process["device"]
        if dev is None:
            return None
        return {"name": _rt.text(lib.kiln_device_name(dev)),
                "type": _rt.text(lib.kiln_device_type_name(dev)),
                "validation_messages": int(lib.kiln_device_validation_count(dev))}


class NodeArg:
    """An input or output as onnxruntime describes it: name, shape (ints, and
    for a dynamic axis the name of its dim or the expression of dims it
    follows, "seq" or "2*seq + 1"), type ("tensor(float)"), and dtype (numpy's)."""

    def __init__(self, name, shape, type_, dtype):
        self.name, self.shape, self.type, self.dtype = name, shape, type_, dtype

    def __repr__(self):
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape!r})"


class _Tensor:
    """An input or output of the loaded model and its staging memory."""

    def __init__(self, info, dim_names, memory):
        self.info = info
        self.name = _rt.text(info.name)
        self.dtype = np.dtype(_rt.DTYPES[info.dtype][0])
        self.max_shape = tuple(info.shape[a] for a in range(info.rank))
        # extents: {axis: (c0, {dim index: coefficient})} for the dynamic axes
        self.extents = {}
        for a in range(info.rank):
            if info.dyn_axes >> a & 1:
                e = info.extents[a]
                self.extents[a] = (e.c0, {j: e.c[j] for j in range(len(dim_names)) if e.c[j]})
        shape = [self._symbol(a, dim_names) if a in self.extents else d
                 for a, d in enumerate(self.max_shape)]
        self.arg = NodeArg(self.name, shape, _rt.DTYPES[info.dtype][1], self.dtype)
        n = info.bytes
        raw = (ctypes.c_uint8 * n).from_address(memory) if n else bytearray(0)
        self.full = np.frombuffer(raw, dtype=np.uint8).view(self.dtype).reshape(self.max_shape)

    def _symbol(self, axis, dim_names):
        c0, coef = self.extents[axis]
        terms = [(dim_names[j] if c == 1 else f"{c}*{dim_names[j]}") for j, c in coef.items()]
        if c0:
            terms.append(str(c0))
        return " + ".join(terms).replace("+ -", "- ") or str(c0)


class InferenceSession:
    """A model compiled by kiln and loaded, with onnxruntime's shape.

    InferenceSession(path, precision="f32", shapes=None, cache_dir=None,
    **compile_options): path is an ONNX model or a YAML graph (onnxruntime's
    sess_options, providers and provider_options are accepted and ignored:
    kiln runs on its Vulkan device); precision and
    compile_options are kiln compile's options (io="f16", weights="int8",
    no_fuse=["eltwise"], guard=True, ...); shapes fixes or bounds the model's
    symbolic dims ({"seq": range(1, 129)} compiles seq as a dynamic dim of
    1..128, {"batch": 1} fixes one, {"x": [1, 3, 224, 224]} an input's shape).
    The model is compiled and built once into the cache (kiln._build) and
    loaded; each session creates its own model on the process' device.
    """

    def __init__(self, path, precision="f32", shapes=None, cache_dir=None, sess_options=None,
                 providers=None, provider_options=None, **compile_options):
        # onnxruntime's own arguments are taken and left alone, so that a
        # session made for onnxruntime swaps in by its class name alone
        del sess_options, providers, provider_options
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"kiln: no model file {path}")
        args = _build.cli_options(precision, shapes, compile_options)
        self._dir, tc, self._temporary = _build.built_model(path.resolve(), args, cache_dir)
        lib = self._lib = _runtime(tc)
        so = ctypes.CDLL(str(self._dir / "model.so"))
        desc_fn = getattr(so, _build.PREFIX + "_desc")
        desc_fn.restype = ctypes.POINTER(_rt.ModelDesc)
        self._so, self._desc_ptr = so, desc_fn()
        desc = self._desc = self._desc_ptr.contents
        if desc.abi_version != _rt.ABI_VERSION:
            raise KilnError(f"kiln: {path}: the model's tables are ABI {desc.abi_version}, this "
                            f"package reads {_rt.ABI_VERSION} (kiln and the package differ)",
                            "KILN_ERROR_INCOMPATIBLE")
        weights = self._dir / "model.weights" if desc.weights_file else None
        self._options = _rt.ModelOptions(ctypes.sizeof(_rt.ModelOptions), 0,
                                         str(weights).encode() if weights else None, None)
        self._model = None
        model = c_void_p()
        with _lock:
            dev = _device(lib)
            _check(lib, lib.kiln_model_create_ex(dev, self._desc_ptr, byref(self._options),
                                                 byref(model)), f"kiln: creating {path}")
            self._model = model
            _sessions.add(self)
        self.path = path
        self._dims = [(_rt.text(desc.dims[j].name), desc.dims[j].min, desc.dims[j].max)
                      for j in range(desc.dim_count)]
        names = [d[0] for d in self._dims] + [_rt.text(desc.derived[j].name)
                                              for j in range(desc.derived_count)]
        self._dim_values = [d[2] for d in self._dims]  # the runtime starts them at max
        self._inputs = [_Tensor(desc.inputs[i], names, lib.kiln_model_input_memory(model, i))
                        for i in range(desc.input_count)]
        self._outputs = [_Tensor(desc.outputs[i], names, lib.kiln_model_output_memory(model, i))
                         for i in range(desc.output_count)]
        self._by_name = {t.name: i for i, t in enumerate(self._outputs)}

    # ---- onnxruntime's description ----

    def get_inputs(self):
        return [t.arg for t in self._inputs]

    def get_outputs(self):
        return [t.arg for t in self._outputs]

    def get_providers(self):
        return ["KilnVulkan"]

    @property
    def dims(self):
        """The dynamic dims: {name: (min, max)}."""
        return {name: (lo, hi) for name, lo, hi in self._dims}

    # ---- running ----

    def run(self, output_names, input_feed, run_options=None, copy=True):
        """Runs the model on input_feed ({input name: array}) and returns the
        outputs named in output_names (None: all) as numpy arrays, in that
        order. The dynamic dims follow the inputs' shapes. Each input is
        written straight into the model's mapped staging memory. copy=False
        returns the outputs as read-only views of that memory: no copy, but
        they change at the session's next run and must not be used after
        close()."""
        if run_options is not None:
            raise TypeError("kiln: run_options are not supported (pass None)")
        want = self._output_indexes(output_names)
        feed = self._feed(input_feed)
        lib = self._lib
        with _lock:
            if self._model is None:
                raise KilnError("kiln: the session is closed")
            self._set_dims(feed)
            for t, x in zip(self._inputs, feed):
                shape = self._shape(t)
                if x.shape != shape:
                    raise ValueError(f"kiln: input '{t.name}' has shape {list(x.shape)}; the "
                                     f"model takes {list(shape)}{self._dims_text()}")
                t.full[tuple(slice(0, n) for n in shape)] = x
            _check(lib, lib.kiln_model_run_mapped(self._model), f"kiln: running {self.path}")
            out = []
            for i in want:
                t = self._outputs[i]
                view = t.full[tuple(slice(0, n) for n in self._shape(t))]
                if copy:
                    out.append(np.array(view))
                else:
                    view = view.view()
                    view.flags.writeable = False
                    out.append(view)
            return out

    def reset_state(self):
        """A model with state (YAML state:): every state back to zeros."""
        with _lock:
            _check(self._lib, self._lib.kiln_model_reset_state(self._model), "kiln: reset_state")

    def _output_indexes(self, names):
        if names is None:
            return list(range(len(self._outputs)))
        if isinstance(names, str):
            raise TypeError("kiln: output_names is a list of names (or None), not a string")
        missing = [n for n in names if n not in self._by_name]
        if missing:
            raise ValueError(f"kiln: no output named {', '.join(map(repr, missing))}; the model's "
                             f"outputs are {', '.join(self._by_name)}")
        return [self._by_name[n] for n in names]

    def _feed(self, input_feed):
        names = [t.name for t in self._inputs]
        unknown = [n for n in input_feed if n not in names]
        missing = [n for n in names if n not in input_feed]
        if unknown or missing:
            said = [f"no input named {', '.join(map(repr, unknown))}" if unknown else "",
                    f"missing {', '.join(map(repr, missing))}" if missing else ""]
            raise ValueError(f"kiln: {'; '.join(s for s in said if s)}; the model's inputs "
                             f"are {', '.join(names)}")
        feed = []
        for t in self._inputs:
            x = input_feed[t.name]
            if not isinstance(x, np.ndarray):
                x = np.asarray(x, dtype=t.dtype)
            if x.dtype != t.dtype:
                raise TypeError(f"kiln: input '{t.name}' is {x.dtype}; the model takes "
                                f"{t.dtype} ({t.arg.type})")
            feed.append(x)
        return feed

    def _set_dims(self, feed):
        """The dims that the inputs' dynamic axes give, checked against each
        other and against the compiled ranges, then set."""
        if not self._dims:
            return
        values, source = list(self._dim_values), {}
        for t, x in zip(self._inputs, feed):
            if x.ndim != len(t.max_shape):
                raise ValueError(f"kiln: input '{t.name}' has rank {x.ndim}; the model takes "
                                 f"{len(t.max_shape)} ({t.arg.shape})")
            for a, (c0, coef) in t.extents.items():
                if len(coef) != 1 or next(iter(coef)) >= len(self._dims):
                    continue  # an axis of several dims: checked below, not solved
                (j, c), = coef.items()
                v, rest = divmod(x.shape[a] - c0, c)
                name = self._dims[j][0]
                if rest or (j in source and v != values[j]):
                    raise ValueError(f"kiln: input '{t.name}' axis {a} is {x.shape[a]}, which "
                                     f"gives no dim '{name}' matching "
                                     + (f"input '{source[j]}'" if j in source else t.arg.shape[a]))
                lo, hi = self._dims[j][1], self._dims[j][2]
                if not lo <= v <= hi:
                    raise ValueError(f"kiln: input '{t.name}' axis {a} gives {name} = {v}, "
                                     f"outside {lo}..{hi}, the range the model was compiled "
                                     f"for (shapes={{'{name}': range({lo}, {hi + 1})}})")
                values[j], source[j] = v, t.name
        arr = (c_int64 * len(values))(*values)
        _check(self._lib, self._lib.kiln_model_set_dims(self._model, arr, len(values)),
               "kiln: setting the dims")
        self._dim_values = values

    def _shape(self, t):
        if not t.extents:
            return t.max_shape
        shape = (c_int64 * max(1, len(t.max_shape)))()
        self._lib.kiln_model_tensor_shape(self._model, ctypes.byref(t.info), shape)
        return tuple(shape[a] for a in range(len(t.max_shape)))

    def _dims_text(self):
        if not self._dims:
            return ""
        return " at " + ", ".join(f"{d[0]}={v}" for d, v in zip(self._dims, self._dim_values))

    # ---- lifetime ----

    def close(self):
        """Destroys the model (runs after this raise); idempotent."""
        with _lock:
            if self._model is not None:
                self._lib.kiln_model_destroy(self._model)
                self._model = None
                _sessions.discard(self)
        if self._temporary:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._temporary = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
