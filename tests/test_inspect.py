"""test_inspect.py: kiln inspect, profiling, the divergence finder, --report.

- the JSON view, parsed and checked against the schedule table of the C
  that kiln generates for the same model (dispatch count, kernels, groups,
  barriers, binding offsets);
- the DOT view laid out by graphviz's dot;
- the HTML page rendered by headless Chromium, every tensor's rectangle of
  the memory map present in the rendered DOM, the profile's shading there;
- GPU timestamps on the device: every dispatch present, times positive;
- the divergence finder: silent on a correct build, and naming the node of a
  deliberately corrupted kernel (its dispatch made to run another kernel);
- kiln compile --report.
"""
import json
import re
from pathlib import Path

from harness import (BUILD, CC, EXTRA_CFLAGS, KILN, ROOT, VULKAN_LIB, build_model, check,
                     kiln, registry, run)

TESTS, case = registry()

MODELS = ["mlp", "transformer", "cnn"]


def schedule_rows(c_text):
    """The dispatch records of generated C: (kernel, groups, first, count, barrier)."""
    return [tuple(int(x) for x in m.groups()) for m in re.finditer(
        r"\{(\d+)u, \{(\d+)u, (\d+)u, (\d+)u\}, (\d+)u, (\d+)u, (\d+)u, \"", c_text)]


def json_case(name):
    def test(workdir):
        wd = Path(workdir)
        r = kiln("inspect", ROOT / "samples" / f"{name}.yaml", "--format", "json",
                 "-o", wd / "s.json")
        check(r.returncode == 0, r.stderr)
        doc = json.loads((wd / "s.json").read_text())
        check(doc["schema"] == "kiln-inspect/1", "schema")
        r = kiln("compile", ROOT / "samples" / f"{name}.yaml", "-o", wd / "m.c")
        check(r.returncode == 0, r.stderr)
        rows = schedule_rows((wd / "m.c").read_text())
        ds = doc["dispatches"]
        check(len(rows) == len(ds) == doc["summary"]["dispatches"],
              f"{len(rows)} records in C, {len(ds)} in JSON")
        check(sum(1 for d in ds if d["barrier"]) == doc["summary"]["barriers"], "barriers")
        binding = [(m[1], int(m[2]), int(m[3]), int(m[4]), int(m[5])) for m in re.finditer(
            r"\{KILN_BUFFER_(ARENA|WEIGHTS), (\d+)ull, (\d+)ull, (\d+)ull, ([01])u\}, /\*",
            (wd / "m.c").read_text())]
        for i, (row, d) in enumerate(zip(rows, ds)):
            kernel, gx, gy, gz, first, count, barrier = row
            check(kernel == d["kernel"] and [gx, gy, gz] == d["groups"] and
                  barrier == (d["barrier"] is not None) and count == len(d["args"]),
                  f"dispatch {i}: C {row}, JSON {d}")
            for k, a in enumerate(d["args"]):
                buf, off, begin, end, writes = binding[first + k]
                check(buf.lower() == a["buffer"] and (a["access"] == "none" or
                                                      off <= a["begin"]) and
                      [begin, end] == [a["begin"], a["end"]] and
                      writes == (a["access"] == "write"),
                      f"dispatch {i} arg {k}: C {binding[first + k]}, JSON {a}")
        check(len(doc["kernels"]) == doc["summary"]["kernels"], "kernels")
        # Tensors live at once never overlap in the arena.
        ts = [t for t in doc["tensors"] if t["buffer"] == "arena" and t["view_of"] is None
              and t["bytes"]]
        for i, a in enumerate(ts):
            for b in ts[i + 1:]:
                if a["first"] <= b["last"] and b["first"] <= a["last"]:
                    check(a["offset"] + a["bytes"] <= b["offset"] or
                          b["offset"] + b["bytes"] <= a["offset"],
                          f"{a['name']} and {b['name']} overlap")
    return test


def text_case(name):
    def test(workdir):
        r = kiln("inspect", ROOT / "samples" / f"{name}.yaml")
        check(r.returncode == 0, r.stderr)
        doc = json.loads(kiln("inspect", ROOT / "samples" / f"{name}.yaml", "--format",
                              "json").stdout)
        lines = [ln for ln in r.stdout.splitlines() if re.match(r"\s+\d+  ", ln)]
        check(len(lines) == len(doc["dispatches"]), f"{len(lines)} table rows")
        for ln, d in zip(lines, doc["dispatches"]):
            check(d["node"] in ln and d["family"] in ln, f"row {ln!r} for {d['node']}")
            if d["barrier"]:
                check(f"after #{d['barrier']['after']}" in ln, f"barrier missing: {ln}")
        s = doc["summary"]
        for want in [f"dispatches  {s['dispatches']}, with {s['barriers']} barriers",
                     f"kernels     {s['kernels']} distinct", f"arena       {s['arena_bytes']} bytes",
                     f"lower bound (peak live bytes) {s['peak_live_bytes']}", "GFLOP"]:
            check(want in r.stdout, f"{want!r} missing from the summary")
    return test


def dot_case(name):
    def test(workdir):
        wd = Path(workdir)
        r = kiln("inspect", ROOT / "samples" / f"{name}.yaml", "--format", "dot",
                 "-o", wd / "g.dot")
        check(r.returncode == 0, r.stderr)
        r = run(["dot", "-Tsvg", wd / "g.dot", "-o", wd / "g.svg"])
        check(r.returncode == 0, f"dot rejected it: {r.stderr}")
        doc = json.loads(kiln("inspect", ROOT / "samples" / f"{name}.yaml", "--format",
                              "json").stdout)
        svg = (wd / "g.svg").read_text()
        check(svg.count('class="node"') == len(doc["dispatches"]), "one graph node per dispatch")
        check(svg.count("barrier") >= doc["summary"]["barriers"], "barrier edges")
    return test


CHROMIUM = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync"]


def html_case(name):
    def test(workdir):
        wd = Path(workdir)
        prog = build_model(wd, (ROOT / "samples" / f"{name}.yaml").read_text())
        r = run([prog, "-q", "-p", wd / "p.json"])
        check(r.returncode == 0, r.stderr)
        r = kiln("inspect", ROOT / "samples" / f"{name}.yaml", "--format", "json",
                 "-o", wd / "s.json", "--html", wd / "r.html", "--profile", wd / "p.json")
        check(r.returncode == 0, r.stderr)
        page = (wd / "r.html").read_text()
        check("http://" not in page.replace("http://www.w3.org/2000/svg", "") and
              "<script" not in page, "the page must be self-contained")
        r = run(CHROMIUM + [f"--user-data-dir={wd / 'chrome'}", "--dump-dom",
                            (wd / "r.html").as_uri()], timeout=120)
        check(r.returncode == 0 and "</html>" in r.stdout, f"chromium: {r.stderr[-500:]}")
        drawn = set(re.findall(r'<rect data-tensor="([^"]*)"', r.stdout))
        doc = json.loads((wd / "s.json").read_text())
        want = {t["name"] for t in doc["tensors"] if t["buffer"] == "arena" and
                t["view_of"] is None and t["bytes"] and t["first"] <= t["last"]}
        check(want == drawn, f"rectangles missing {sorted(want - drawn)}, extra "
                             f"{sorted(drawn - want)}")
        rows = re.findall(r'<tr data-dispatch="\d+" style="background:rgba', r.stdout)
        check(len(rows) == len(doc["dispatches"]), "every row shaded by its time")
    return test


for name in MODELS:
    case(f"inspect --format json {name}: agrees with the generated schedule")(json_case(name))
    case(f"inspect text table {name}")(text_case(name))
    case(f"inspect --format dot {name}: laid out by graphviz")(dot_case(name))
case("inspect --html transformer: rendered by headless Chromium")(html_case("transformer"))
case("inspect --html cnn: rendered by headless Chromium")(html_case("cnn"))


@case("profiling: GPU timestamps for every dispatch, positive")
def _(workdir):
    wd = Path(workdir)
    prog = build_model(wd, (ROOT / "samples" / "cnn.yaml").read_text())
    r = run([prog, "-n", "3", "-p", wd / "p.json"])
    check(r.returncode == 0, r.stderr)
    prof = json.loads((wd / "p.json").read_text())
    check(prof["schema"] == "kiln-profile/1", "schema")
    want = json.loads(kiln("inspect", ROOT / "samples" / "cnn.yaml", "--format",
                           "json").stdout)["summary"]["dispatches"]
    check(len(prof["dispatches"]) == want, f"{len(prof['dispatches'])} dispatches, want {want}")
    for d in prof["dispatches"]:
        check(d["us"] > 0, f"dispatch {d['index']}: {d['us']} us")
    check(abs(sum(d["us"] for d in prof["dispatches"]) - prof["total_us"]) < 0.01 *
          prof["total_us"] + 0.01, "the total")
    table = [ln for ln in r.stdout.splitlines() if re.match(r"\s+\d+  \S", ln)]
    check(len(table) == min(10, want) and "GB/s" in r.stdout and "GFLOP/s" in r.stdout,
          r.stdout)
    r = run([prog, "-q"], env={"KILN_PROFILE": "1"})
    check(r.returncode == 0, r.stderr)


@case("profiling: a dispatch the device does not record (an f16 product's cooperative-matrix "
      "kernel on lavapipe, its tiled variant where the device has the matrix units) takes "
      "0 us, the other more")
def _(workdir):
    wd = Path(workdir)
    y = json.dumps({"name": "mm", "inputs": {"a": {"dtype": "f16", "shape": [128, 96]},
                                            "b": {"dtype": "f16", "shape": [96, 192]}},
                    "nodes": [{"name": "y", "op": "matmul", "inputs": ["a", "b"]}],
                    "outputs": ["y"]})
    prog = build_model(wd, y)
    r = run([prog, "-n", "3", "-p", wd / "p.json"])
    check(r.returncode == 0, r.stderr)
    prof = json.loads((wd / "p.json").read_text())
    fams = [d["family"] for d in json.loads(kiln("inspect", wd / "model.yaml", "--format",
                                                  "json").stdout)["dispatches"]]
    us = [d["us"] for d in prof["dispatches"]]
    check(fams == ["coopmat", "matmul"] and (us[0] == 0) != (us[1] == 0) and max(us) > 0,
          f"kernels {fams}, us {us}")


@case("profiling: a dispatch the run's dims give no workgroups (a dynamic product's variant "
      "for other row counts, left out of the run's recording) takes 0 us")
def _(workdir):
    wd = Path(workdir)
    y = json.dumps({"name": "mm", "dims": {"seq": "1..64"},
                    "inputs": {"x": {"dtype": "f32", "shape": ["seq", 64]}},
                    "weights": {"w": {"dtype": "f32", "shape": [64, 48],
                                      "init": {"normal": 0.5}}},
                    "nodes": [{"name": "y", "op": "matmul", "inputs": ["x", "w"]}],
                    "outputs": ["y"]})
    prog = build_model(wd, y)
    for seq in (1, 40):
        r = run([prog, "-n", "3", "-d", f"seq={seq}", "-p", wd / "p.json"])
        check(r.returncode == 0, r.stderr)
        us = [d["us"] for d in json.loads((wd / "p.json").read_text())["dispatches"]]
        check(len(us) >= 2 and sum(u > 0 for u in us) == 1 and us.count(0) == len(us) - 1,
              f"seq {seq}: us {us}, expected one product kernel working")


DIV_MODEL = """name: chain
inputs:
  x: {dtype: f32, shape: [4, 64]}
nodes:
  - {name: r, op: relu, inputs: [x]}
  - {name: e, op: exp, inputs: [r]}
  - {name: t, op: tanh, inputs: [e]}
  - {name: y, op: neg, inputs: [t]}
outputs: [y]
"""


def divergence(workdir, corrupt):
    wd = Path(workdir)
    (wd / "chain.yaml").write_text(DIV_MODEL)
    r = kiln("compile", wd / "chain.yaml", "--debug-tensors", "--name", "model",
             "-o", wd / "model.c")
    check(r.returncode == 0, r.stderr)
    c = (wd / "model.c").read_text()
    if corrupt:
        # Dispatch 1 (node e, exp) made to run dispatch 3's kernel (neg).
        rows = schedule_rows(c)
        old = '{%du, {%du, %du, %du}, %du, %du, %du, "e"' % rows[1]
        new = '{%du, {%du, %du, %du}, %du, %du, %du, "e"' % ((rows[3][0],) + rows[1][1:])
        check(old in c, "the record of dispatch 1")
        (wd / "model.c").write_text(c.replace(old, new))
    r = run([CC, "-std=c99", *EXTRA_CFLAGS, "-I", ROOT / "runtime", "-o", wd / "model",
             wd / "model.c",
             BUILD / "run_model_test.o", "-L", BUILD, "-lkilnrt", VULKAN_LIB, "-lm"])
    check(r.returncode == 0, r.stderr)
    (wd / "dump").mkdir()
    r = run([wd / "model", "-q", "--dump", wd / "dump"])
    check(r.returncode == 0, r.stderr)
    return run(["/usr/bin/python3", ROOT / "samples" / "find_divergence.py",
                wd / "chain.yaml", wd / "dump"])


@case("divergence finder: a correct build agrees everywhere")
def _(workdir):
    r = divergence(workdir, False)
    check(r.returncode == 0 and "no divergence: all 4 tensors agree" in r.stdout,
          r.stdout + r.stderr)


@case("divergence finder: names the node of a corrupted kernel")
def _(workdir):
    r = divergence(workdir, True)
    check(r.returncode == 1, r.stdout + r.stderr)
    check("first divergence: tensor 'e' node 'e' (exp)" in r.stdout and
          "max absolute error" in r.stdout and "the 1 tensor(s) before it agree" in r.stdout,
          r.stdout + r.stderr)


@case("compile --report: the parts and the device memory")
def _(workdir):
    r = kiln("compile", ROOT / "samples" / "cnn.yaml", "-o", Path(workdir) / "c.c", "--report")
    check(r.returncode == 0, r.stderr)
    doc = json.loads(kiln("inspect", ROOT / "samples" / "cnn.yaml", "--format", "json").stdout)
    s = doc["summary"]
    size = (Path(workdir) / "c.c").stat().st_size
    for label, value in [("SPIR-V", s["spirv_bytes"]), ("weights", s["weight_bytes"]),
                         ("generated C source", size), ("arena", s["arena_bytes"]),
                         ("staging", s["staging_bytes"]),
                         ("total", s["arena_bytes"] + s["weight_bytes"] + s["staging_bytes"])]:
        check(re.search(rf"^  {label}\s+{value} bytes", r.stdout, re.M),
              f"{label} {value} missing:\n{r.stdout}")
    check("schedule tables" in r.stdout, r.stdout)
    m = re.search(r"runtime library\s+(\d+) bytes", r.stdout)
    check(m and int(m[1]) > 1000, "the runtime's size")


@case("inspect errors: bad format, profile of another model")
def _(workdir):
    r = kiln("inspect", ROOT / "samples" / "mlp.yaml", "--format", "xml")
    check(r.returncode == 1 and "--format must be text, json or dot" in r.stderr, r.stderr)
    p = Path(workdir) / "p.json"
    p.write_text('{"schema": "kiln-profile/1", "dispatches": [{"index": 0, "us": 1.0}]}')
    r = kiln("inspect", ROOT / "samples" / "mlp.yaml", "--profile", p, "--html",
             Path(workdir) / "x.html")
    check(r.returncode == 1 and "has 1 dispatch times; the model has 3" in r.stderr, r.stderr)
    p.write_text("{}")
    r = kiln("inspect", ROOT / "samples" / "mlp.yaml", "--profile", p)
    check(r.returncode == 1 and "not a kiln profile" in r.stderr, r.stderr)



@case("inspect -v: why each product got its kernel; the JSON's why")
def _(workdir):
    # two f16 products: [64, 256] x [256, 128], which the matrix units take,
    # and a batch of [12, 49, 32] x [12, 32, 49], which they do not
    wd = Path(workdir)
    (wd / "m.yaml").write_text(
        "name: why\ninputs:\n  a: {dtype: f16, shape: [64, 256]}\n"
        "  q: {dtype: f16, shape: [12, 49, 32]}\n  k: {dtype: f16, shape: [12, 32, 49]}\n"
        "weights:\n  w: {dtype: f16, shape: [256, 128], init: {normal: 0.05, seed: 1}}\n"
        "nodes:\n  - {name: big, op: matmul, inputs: [a, w]}\n"
        "  - {name: win, op: matmul, inputs: [q, k]}\n"
        "outputs: [big, win]\n")
    r = kiln("inspect", wd / "m.yaml", "-v")
    check(r.returncode == 0, r.stderr)
    text = r.stdout[r.stdout.index("why each product got its kernel:"):]
    check(re.search(r"#\d+ big: f16 operands: coopmat", text) is not None, text)
    check(re.search(r"#\d+ win: not on the matrix units \(a batch of products of at most "
                    r"64 x 64[^)]*\); the tiled kernel", text) is not None, text)
    plain = kiln("inspect", wd / "m.yaml").stdout
    check("why each product" not in plain, "the reasons print without -v")
    j = json.loads(kiln("inspect", wd / "m.yaml", "--format", "json").stdout)
    whys = {d["node"]: d["why"] for d in j["dispatches"]}
    check(whys["win"].endswith("the tiled kernel") and "coopmat" in whys["big"], str(whys))


def opening_comment(path):
    text = Path(path).read_text()
    return text[:text.index("*/")]


@case("generated C: its opening comment holds kiln inspect's table and tuning variables")
def _(workdir):
    wd = Path(workdir)
    model = ROOT / "samples" / "transformer.yaml"
    r = kiln("inspect", model, "-o", wd / "table.txt")
    check(r.returncode == 0, r.stderr)
    lines = (wd / "table.txt").read_text().splitlines()
    table = lines[2:lines.index("", 2)]  # the heading and one line per dispatch
    r = kiln("compile", model, "-o", wd / "m.c")
    check(r.returncode == 0, r.stderr)
    head = opening_comment(wd / "m.c")
    got = [ln[3:].rstrip() for ln in head.splitlines() if ln.startswith(" *  ")]
    check(got == [t.rstrip() for t in table],
          f"the comment's table differs from kiln inspect's:\n{got[:3]}\n{table[:3]}")
    check("tuning:" not in head, "a tuning line without a tuning variable set")
    # an absent bias or mask fills a slot of the kernel: labelled unused
    check(re.search(r"/\* \d+\.\d+ unused, holds \w+ \*/", (wd / "m.c").read_text()),
          "no binding labelled unused")
    r = run([KILN, "compile", model, "-o", wd / "t.c"],
            env={"KILN_MATVEC_NCOL": "8", "ASAN_OPTIONS": "detect_leaks=0"})
    check(r.returncode == 0, r.stderr)
    tuning = " * tuning: KILN_MATVEC_NCOL=8 (set when it was compiled)"
    check(tuning in opening_comment(wd / "t.c"), "KILN_MATVEC_NCOL is not recorded")
