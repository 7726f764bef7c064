#!/usr/bin/env python3
"""test_golden.py: the generated C of the samples, byte for byte; and the
compiler's files depend one way, none of its, the runtime's or the
shaders' files over 1,000 lines.

Each sample (samples/*.yaml, samples/decode/decoder.yaml) and one exported
ONNX model (tests/models/densenet_tiny_legacy17) is compiled as a user would
(from the top of the tree, no test flags), and the SHA-256 of the generated
.c and .h (their `command:` line left out: it names the output path) must
be the one in tests/golden.sha256. The schedule, the arena offsets, the
SPIR-V and the weights all live in those files: a change that is meant to
leave them alone (a refactoring of the compiler) is held to that, and a
change that alters them on purpose updates the list in the same commit:

  tests/test_golden.py --update        (after make; uses build/kiln)
"""
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import BUILD, KILN, ROOT, check, registry  # noqa: E402

TESTS, case = registry()
LIST = ROOT / "tests" / "golden.sha256"
MODELS = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "samples").glob("*.yaml")) + [
    "samples/decode/decoder.yaml", "tests/models/densenet_tiny_legacy17/model.onnx"]


def digests(outdir):
    """{file name: sha256} of every model's generated .c and .h."""
    out = {}
    for model in MODELS:
        name = Path(model).parent.name if model.endswith(".onnx") else Path(model).stem
        c = Path(outdir) / f"{name}.c"
        r = subprocess.run([str(KILN), "compile", model, "--name", name, "-o", str(c)],
                           cwd=ROOT, capture_output=True, text=True,
                           env=dict(os.environ, ASAN_OPTIONS="detect_leaks=0"))
        check(r.returncode == 0, f"{model}: {r.stderr}")
        for f in (c, c.with_suffix(".h")):
            text = "".join(ln for ln in f.read_text().splitlines(keepends=True)
                           if not ln.startswith(" * command: "))
            out[f.name] = hashlib.sha256(text.encode()).hexdigest()
    return out


def stored():
    return dict(reversed(ln.split()) for ln in LIST.read_text().splitlines() if ln.strip())


@case("golden: the samples' generated C is byte for byte the recorded one")
def _(workdir):
    got, want = digests(workdir), stored()
    changed = sorted(n for n in set(got) | set(want) if got.get(n) != want.get(n))
    check(not changed, f"generated C differs for {changed}: if the change is meant to "
          f"alter it, run tests/test_golden.py --update (with {BUILD}/kiln) and commit "
          f"tests/golden.sha256 with it")


@case("golden: kernels compiled on one thread and on four give the same C (no cache)")
def _(workdir):
    """compile_spirv.c compiles the distinct kernels on a pool of threads
    (KILN_JOBS) and assembles them in dispatch order: the output may not
    depend on which thread finished first."""
    texts = []
    for jobs in ("1", "4"):
        out = Path(workdir) / f"j{jobs}"
        out.mkdir()
        r = subprocess.run([str(KILN), "compile", "samples/transformer.yaml", "--name", "t",
                            "-o", str(out / "t.c")], cwd=ROOT, capture_output=True, text=True,
                           env=dict(os.environ, KILN_JOBS=jobs, KILN_CACHE_DIR=str(out / "cache"),
                                    ASAN_OPTIONS="detect_leaks=0"))
        check(r.returncode == 0, r.stderr)
        texts.append("".join(ln for ln in (out / "t.c").read_text().splitlines(keepends=True)
                             if not ln.startswith(" * command: ")))
    check(texts[0] == texts[1], "the generated C depends on the number of threads")


def file_cycles(objdir):
    """The circles among one directory's objects, from their symbols (nm):
    file A uses what B defines, B (perhaps through others) what A defines.
    Returns (the number of objects, [each circle's files, sorted], uses,
    defs)."""
    defs, uses = {}, {}
    for o in sorted(objdir.glob("*.o")):
        r = subprocess.run(["nm", str(o)], capture_output=True, text=True)
        check(r.returncode == 0, f"nm {o}: {r.stderr}")
        rows = [ln.split() for ln in r.stdout.splitlines()]
        defs[o.stem] = {f[2] for f in rows if len(f) == 3 and f[1] in "TDRB"}
        uses[o.stem] = {f[1] for f in rows if len(f) == 2 and f[0] == "U"}
    owner = {sym: f for f, syms in defs.items() for sym in syms}
    calls = {f: {owner[s] for s in u if s in owner and owner[s] != f} for f, u in uses.items()}

    def reach(a):  # every file a depends on, directly or through others
        seen, todo = set(), [a]
        while todo:
            for b in calls[todo.pop()] - seen:
                seen.add(b)
                todo.append(b)
        return seen
    reached = {f: reach(f) for f in calls}
    circles = sorted({tuple(sorted(b for b in reached[a] if a in reached[b]))
                      for a in calls if a in reached[a]})
    return len(defs), circles, uses, defs


@case("structure: the files of compiler/ and of runtime/ depend one way (no circles)")
def _(workdir):
    """The passes and the families within them depend one way (driver,
    family, shared builders); so do the runtime's files (model.c, the
    model_* parts, the shared helpers)."""
    for sub, least in (("compiler", 20), ("runtime", 10)):
        n, circles, uses, defs = file_cycles(BUILD / sub)
        check(n >= least, f"only {n} objects in {BUILD / sub}")
        check(not circles, f"{sub}/: files that depend on each other: " + "; ".join(
            " -> ".join(f"{f}.c" for f in c) + " (" + ", ".join(
                f"{a} uses {sorted(uses[a] & defs[b])[:2]} of {b}"
                for a in c for b in c if a != b and uses[a] & defs[b]) + ")"
            for c in circles))


@case("structure: no file in compiler/, runtime/ or shaders/ over 1,000 lines")
def _(workdir):
    """Every C source and header, compute shader and GLSL include there
    stays within 1,000 lines: a file that grows past it is split by family
    (as lower_matmul.c into the matmul_*.c files). No exceptions."""
    counts = {f.relative_to(ROOT).as_posix(): len(f.read_bytes().splitlines())
              for sub in ("compiler", "runtime", "shaders") for f in sorted((ROOT / sub).iterdir())
              if f.is_file() and f.suffix in (".c", ".h", ".comp", ".glsl")}
    check(len(counts) >= 50, f"only {len(counts)} files found under {ROOT}")
    over = [f"{name} ({n} lines)" for name, n in counts.items() if n > 1000]
    check(not over, "files over 1,000 lines: " + ", ".join(over))


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit(__doc__)
    with tempfile.TemporaryDirectory() as d:
        LIST.write_text("".join(f"{h}  {n}\n" for n, h in sorted(digests(d).items())))
    print(f"wrote {LIST}")
