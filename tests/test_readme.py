"""test_readme.py: every block of commands in the README and docs/ runs as written.

The ```sh blocks of the README, then of each page in docs/ (DOC_PAGES'
order: a page may use what the README's tour built), are run in order,
each as one `bash -e` script,
in a scratch copy of this tree (its `build` a copy of the build under
test, HOME a scratch directory, `python3` the interpreter running the
tests), as a user would run them from the top of the tree after `make`.
The block with `make test` (the two commands) is tests/fresh_machine.sh's:
it runs that block on a bare Debian root. The C block must be the core of
samples/app.c, and the sample output of `make` must list what run_model
prints. The README stays short (under 150 lines) and links every page in
docs/; every relative link in them names a file that exists.
"""
import os
import re
import shutil
import sys
from pathlib import Path

from harness import BUILD, EXTRA_CFLAGS, ROOT, Skip, check, registry, run

TESTS, case = registry()

DOCS = ROOT / "docs"
# The order their blocks run in, after the README's.
DOC_PAGES = ["embedding.md", "python.md", "cli.md", "onnx.md", "onnx-ops.md", "yaml.md", "ops.md",
             "runtime.md", "design.md", "tests.md", "performance.md", "unsupported.md"]


def blocks(text, lang):
    """The fenced blocks of a language, in order, as (line number, body)."""
    out = []
    for m in re.finditer(r"^```" + lang + r"\n(.*?)^```", text, re.S | re.M):
        out.append((text[:m.start()].count("\n") + 1, m.group(1)))
    return out


def scratch_tree(wd):
    """A copy of the source tree (git and other builds left out) with a copy
    of the build under test as its build/, times kept: the README's `make
    install` finds it up to date, and whatever make does stays in the copy,
    never touching the build the other tests run."""
    tree = wd / "tree"
    shutil.copytree(ROOT, tree, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", "build", "build-*", ".gl", ".dev*", "__pycache__", "*.tmp*"))
    shutil.copytree(BUILD, tree / "build", symlinks=True)
    (wd / "home").mkdir()
    return tree


@case("readme: every command block runs as written")
def _(workdir):
    if EXTRA_CFLAGS:
        raise Skip("the sanitizer build's objects cannot make a shared library; the plain "
                   "build runs the README's commands")
    wd = Path(workdir)
    tree = scratch_tree(wd)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    env.update(HOME=str(wd / "home"),
               PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}",
               KILN_VALIDATION=os.environ.get("KILN_TEST_VALIDATION", "1"))
    ran = 0
    for page in [ROOT / "README.md"] + [DOCS / p for p in DOC_PAGES]:
        name = page.relative_to(ROOT)
        for line, body in blocks(page.read_text(), "sh"):
            if re.search(r"^make test\b", body, re.M):
                continue  # the two commands: tests/fresh_machine.sh
            script = wd / f"block{ran}.sh"
            script.write_text(body)
            r = run(["bash", "-e", script], cwd=tree, env=env, timeout=600)
            check(r.returncode == 0, f"{name}:{line}: the block failed ({r.returncode}):\n"
                  f"{body}\n--- output ---\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
            ran += 1
    check(ran >= 6, f"only {ran} command blocks found")


@case("readme: under 150 lines, linking every docs/ page; every relative link resolves")
def _(workdir):
    readme = (ROOT / "README.md").read_text()
    check(readme.count("\n") < 150, f"the README has {readme.count(chr(10))} lines")
    pages = sorted(p.name for p in DOCS.glob("*.md"))
    check(sorted(DOC_PAGES) == pages, f"docs/ holds {pages}; DOC_PAGES lists {DOC_PAGES}")
    for p in pages:
        check(f"(docs/{p})" in readme, f"the README does not link docs/{p}")
    for page in [ROOT / "README.md", ROOT / "compiler" / "ADDING_AN_OP.md"] + \
            [DOCS / p for p in pages]:
        if not page.exists():
            continue
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            check((page.parent / target).exists(),
                  f"{page.relative_to(ROOT)} links {target}, which does not exist")


@case("readme: its C example is samples/app.c's core; its make output is run_model's")
def _(workdir):
    readme = (ROOT / "README.md").read_text()
    app = (ROOT / "samples" / "app.c").read_text()
    (line, body), = [b for b in blocks(readme, "c") if "model_create(NULL" in b[1]]
    for ln in body.splitlines():
        check(not ln.strip() or ln.strip() in app,
              f"README.md:{line}: '{ln.strip()}' is not in samples/app.c")
    # The lines `make` prints, by their keys, against what run_model prints.
    start = readme.index("What `make` prints at the end")
    shown = blocks(readme[start:], "")[0][1]
    keys = [ln.split(":")[0] for ln in shown.splitlines() if ln and not ln.startswith(" ")]
    wd = Path(workdir)
    r = run([BUILD / "kiln", "compile", ROOT / "samples" / "mlp.yaml", "-o", wd / "mlp.c"])
    check(r.returncode == 0, r.stderr)
    prog = wd / "mlp"
    r = run(["cc", "-std=c99", *EXTRA_CFLAGS, "-I", ROOT / "runtime", "-DKILN_MODEL=mlp",
             "-DKILN_DECLARE_MODEL", ROOT / "samples" / "run_model.c", wd / "mlp.c",
             "-L", BUILD, "-lkilnrt", "-lvulkan", "-lm", "-o", prog])
    check(r.returncode == 0, r.stderr)
    r = run([prog])
    check(r.returncode == 0, r.stderr)
    printed = [ln.split(":")[0] for ln in r.stdout.splitlines()
               if ln and not ln.startswith(" ")]
    check(keys == printed, f"the README shows lines {keys}; run_model prints {printed}")
