"""_build.py: finding kiln, compiling a model with it, building the shared
object, and the cache directory that keeps both.

Where kiln is (the first of these that is set or holds kiln):
  KILN_HOME=PREFIX          an install (make install PREFIX=...): PREFIX/bin/kiln,
                            PREFIX/include/kiln_rt.h, PREFIX/lib/libkilnrt.so
  KILN_BUILD=DIR            a build directory of a kiln tree (make B=DIR):
                            DIR/kiln, DIR/shared/libkilnrt.so, the tree's runtime/
  the tree this file is in  python/kiln/ of a kiln checkout, built with make
  the tree installed from   pip install ./python records it (kiln/_tree.py)
  `kiln` on PATH            an install: PREFIX is the folder above its bin/
"""
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from ._errors import CompileError, KilnError

PREFIX = "kilnpy_model"  # the generated functions' prefix (kiln_model_* is the runtime's)


class Toolchain:
    """The kiln binary, the runtime's headers and its shared library."""

    def __init__(self, kiln, include, lib):
        self.kiln, self.include, self.lib = Path(kiln), Path(include), Path(lib)

    def missing(self):
        return [str(p) for p in (self.kiln, self.include / "kiln_rt.h", self.lib)
                if not p.exists()]


def _tree_toolchain(root, build):
    return Toolchain(build / "kiln", root / "runtime", build / "shared" / "libkilnrt.so")


def _install_toolchain(prefix):
    return Toolchain(prefix / "bin" / "kiln", prefix / "include", prefix / "lib" / "libkilnrt.so")


def find_toolchain():
    """KILN_HOME's or KILN_BUILD's files when either is set (an error when they
    are not there: a variable set is meant), else the first of the tree this
    file is in, the tree installed from and PATH that holds all three; a
    KilnError saying where it looked otherwise."""
    root = Path(__file__).resolve().parent.parent.parent
    for var, make in (("KILN_HOME", lambda v: _install_toolchain(Path(v))),
                      ("KILN_BUILD", lambda v: _tree_toolchain(root, Path(v)))):
        if os.environ.get(var):
            tc = make(os.environ[var])
            if tc.missing():
                raise KilnError(f"kiln: {var}={os.environ[var]}: no {', '.join(tc.missing())}")
            return tc
    tried = []
    if (root / "runtime" / "kiln_rt.h").exists():
        tried.append(("the kiln tree", _tree_toolchain(root, root / "build")))
    try:
        from ._tree import TREE
        tried.append(("the tree installed from", _tree_toolchain(Path(TREE), Path(TREE) / "build")))
    except ImportError:
        pass
    on_path = shutil.which("kiln")
    if on_path:
        tried.append(("PATH", _install_toolchain(Path(on_path).resolve().parent.parent)))
    for _, tc in tried:
        if not tc.missing():
            return tc
    said = "; ".join(f"{where}: no {', '.join(tc.missing())}" for where, tc in tried)
    raise KilnError(
        "kiln: cannot find the kiln compiler and runtime" + (f" ({said})" if said else "")
        + ". Build the tree (make), or install kiln (make install PREFIX=...) and set "
        "KILN_HOME=PREFIX, or set KILN_BUILD to a build directory of this tree")


def cache_root(cache_dir=None):
    """Where built models are kept: cache_dir, else $KILN_CACHE_DIR/python,
    else $XDG_CACHE_HOME/kiln/python, else ~/.cache/kiln/python. None when
    KILN_CACHE_DIR is set empty (the cache off: each session builds in a
    temporary directory of its own)."""
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("KILN_CACHE_DIR")
    if env is not None:
        return Path(env) / "python" if env else None
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "kiln" / "python"


def cli_options(precision="f32", shapes=None, options=None):
    """kiln compile's options from Python's: precision="f16"; shapes, a dict
    of NAME to an int (N), a range (range(2, 129): 2..128, a dynamic dim), a
    list or tuple of ints (an input's whole shape) or a string passed as is;
    any other option by its name with _ for - (io="f16", weights="int8",
    keep_f32=["a", "b"], no_fuse=True or ["eltwise"], guard=True)."""
    args = ["--precision", str(precision)]
    for name, v in (shapes or {}).items():
        if isinstance(v, bool):
            raise TypeError(f"shapes['{name}']: {v!r} is not a size")
        if isinstance(v, int):
            v = str(v)
        elif isinstance(v, range):
            if v.step != 1 or len(v) == 0:
                raise ValueError(f"shapes['{name}']: {v!r} is not a range of sizes with step 1")
            v = f"{v.start}..{v.stop - 1}"
        elif isinstance(v, (list, tuple)):
            v = "x".join(str(int(d)) for d in v)
        elif not isinstance(v, str):
            raise TypeError(f"shapes['{name}']: {v!r} is not an int, a range, a shape or a string")
        args += ["--shape", f"{name}={v}"]
    for key, v in (options or {}).items():
        flag = "--" + key.replace("_", "-")
        if key in ("o", "name", "weights_file", "embed_weights", "shape"):
            raise TypeError(f"option '{key}': the session sets it (use shapes= for --shape)")
        if v is None or v is False:
            continue
        if v is True:
            args.append(flag)
        elif isinstance(v, (list, tuple)):
            joined = ",".join(str(x) for x in v)
            args += [f"{flag}={joined}"] if key == "no_fuse" else [flag, joined]
        else:
            args += [f"{flag}={v}"] if key == "no_fuse" else [flag, str(v)]
    return args


_digests = {}


def _file_digest(path, look_for=b""):
    """(sha256, whether look_for occurs) of a file, in one pass; kept per
    path, size and time in this process."""
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns, look_for)
    if key not in _digests:
        h, found, tail = hashlib.sha256(), False, b""
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
                if look_for and not found:
                    found = look_for in tail + chunk
                    tail = chunk[-len(look_for):]
        _digests[key] = (h.hexdigest(), found)
    return _digests[key]


def model_key(model, args, tc, cc):
    """A hash of what the built model depends on: the model's bytes, the
    files beside it when the model can refer to them (a YAML graph's weights,
    an ONNX file with external data), the options, kiln's binary, the runtime
    library and the C compiler."""
    h = hashlib.sha256()
    digest, external = _file_digest(model, b"location")  # an external_data entry's key
    h.update(digest.encode())
    refers = model.suffix.lower() in (".yaml", ".yml") or external
    if refers:
        for p in sorted(model.parent.iterdir()):
            if p.is_file() and p != model:
                st = p.stat()
                h.update(f"{p.name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    h.update("\0".join(args).encode())
    h.update(_file_digest(tc.kiln)[0].encode())
    h.update(_file_digest(tc.lib)[0].encode())
    h.update(cc.encode())
    return h.hexdigest()[:32]


def run_kiln(tc, args, cwd=None):
    r = subprocess.run([str(tc.kiln), *map(str, args)], cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise CompileError(r.stderr.strip() or f"kiln exited with status {r.returncode}",
                           r.returncode)
    return r


def compile_model(tc, model, out_c, args, weights_file=None, prefix=PREFIX):
    """kiln compile MODEL -o OUT_C --name PREFIX ARGS (prefix None: the
    model's name): the .c, .h and (with weights_file, or weights over 16 MiB)
    the weights sidecar, whose path it returns (None: weights in the C). Runs
    in OUT_C's folder, so that a relative weights_file lands there and the C
    names it as given."""
    out_c = Path(out_c).resolve()
    extra = ["--weights-file", str(weights_file)] if weights_file else []
    extra += ["--name", prefix] if prefix else []
    r = run_kiln(tc, ["compile", Path(model).resolve(), "-o", out_c, *extra, *args],
                 cwd=out_c.parent)
    m = re.search(r"^kiln: weights in (.+) \(\d+ bytes\)", r.stdout, re.M)
    return out_c.parent / m.group(1) if m else None


def build_shared(tc, c_file, so_file, cc):
    cmd = [*cc.split(), "-std=c99", "-O1", "-fPIC", "-shared", f"-I{tc.include}", str(c_file),
           "-o", str(so_file), f"-L{tc.lib.parent}", "-lkilnrt", f"-Wl,-rpath,{tc.lib.parent}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise KilnError(f"kiln: building {c_file.name} failed ({' '.join(cmd)}):\n{r.stderr}")


def built_model(model, args, cache_dir=None):
    """The directory that holds MODEL compiled with ARGS and built: model.c,
    model.h, model.so and, when it has weights, model.weights. Made when it is
    not in the cache yet (in a temporary directory renamed into place, so
    that processes that build the same model at once never see half of it).
    Returns (directory, toolchain, temporary): temporary is True when the
    cache is off and the caller owns the directory."""
    tc = find_toolchain()
    cc = os.environ.get("CC", "cc")
    root = cache_root(cache_dir)
    temporary = root is None
    if temporary:
        root = Path(tempfile.mkdtemp(prefix="kiln-python-"))
        final = root
    else:
        final = root / model_key(model, args, tc, cc)
        if (final / "model.so").exists():
            return final, tc, False
        root.mkdir(parents=True, exist_ok=True)
    work = final if temporary else Path(tempfile.mkdtemp(prefix=".build-", dir=root))
    try:
        compile_model(tc, model, work / "model.c", args, weights_file="model.weights")
        build_shared(tc, work / "model.c", work / "model.so", cc)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    if not temporary:
        try:
            os.rename(work, final)
        except OSError:  # another process built it first
            shutil.rmtree(work, ignore_errors=True)
    return final, tc, temporary
