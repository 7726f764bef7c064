#!/usr/bin/env python3
"""attn_decode.py: attention.comp at a decoding step, by its spans and
invocations (KILN_ATTN_SPLITS=S,WG): one query row of H heads against a
cache of SK keys and values of KVH heads (the 1.1B Llama's shape: 32 and 4
heads of 128, f16 queries, f32 cache [1, past, heads x 128] as the decoder's
state), the cache's length dynamic (past 1..512, run at SK). Prints the attention dispatch's GPU microseconds
(run_model -p, 200 runs) per setting. Runs where kiln and a Vulkan GPU are;
KILN_BUILD, KILN_VULKAN_LIB as bench/llm.py.

  bench/experiments/attn_decode.py [--work DIR] [--sk 128,256,384] [--configs S,WG;...]
"""
import json
import re
import sys
from pathlib import Path

from matvec_k_dyn import BUILD, ROOT, VULKAN_LIB, sh  # the same helpers

H, KVH, D = 32, 4, 128


def arg(name, default):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def main():
    work = Path(arg("--work", "/tmp/attn-decode"))
    work.mkdir(parents=True, exist_ok=True)
    sks = [int(v) for v in arg("--sk", "128,384").split(",")]
    configs = [None] + [c for c in arg("--configs", "4,64;8,64;16,32;16,64;32,32;32,64;8,128")
                        .split(";")]
    model = {"name": "ad", "dims": {"past": "1..512"},
             "inputs": {"q": {"dtype": "f16", "shape": [1, 1, H * D]},
                        "k": {"dtype": "f32", "shape": [1, "past", KVH * D]},
                        "v": {"dtype": "f32", "shape": [1, "past", KVH * D]}},
             "nodes": [{"name": "y", "op": "attention", "inputs": ["q", "k", "v"],
                        "layout": "bshd", "heads": H, "kv_heads": KVH}],
             "outputs": ["y"]}
    y = work / "ad.yaml"
    y.write_text(json.dumps(model))
    rows = []
    for cfg in configs:
        env = {"KILN_ATTN_SPLITS": cfg} if cfg else {}
        line = [cfg or "default"]
        try:
            sh([BUILD / "kiln", "compile", y, "--name", "ad", "-o", work / "ad.c"], env=env)
            sh(["cc", "-O2", "-std=c99", "-D_POSIX_C_SOURCE=199309L", "-I", ROOT / "runtime",
                "-DKILN_MODEL=ad", "-include", work / "ad.h", "-o", work / "ad",
                ROOT / "samples" / "run_model.c", work / "ad.c", "-L", BUILD, "-lkilnrt",
                VULKAN_LIB, "-lm"])
            for sk in sks:
                out = sh([work / "ad", "-d", f"past={sk}", "-n", "200", "-p"], cwd=work)
                us = sum(float(m.group(1)) for m in
                         re.finditer(r"^\s+\d+\s+y\s+([\d.]+)", out, re.M))
                line.append(f"{us:.1f}")
                rows.append({"cfg": cfg, "sk": sk, "us": us})
        except Exception as e:  # noqa: BLE001
            line.append("err")
            print(e, file=sys.stderr)
        print(" ".join(line), flush=True)
    print("SK:", sks)
    (work / "attn_decode.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
