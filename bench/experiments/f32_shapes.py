#!/usr/bin/env python3
"""f32_shapes.py: cuBLAS's f32 products (TF32 off) at the transformer shapes
of issue 26's TFLOP/s line, for scale against kiln's in-model numbers.

y = x @ W, x [M, K], W [K, N] f32 on the GPU, 50 products captured in one
CUDA graph (one launch, the products back to back as inside a model),
replayed 20 times after a warm-up; the median replay over 50 gives the
time of one product. Also with a bias and GELU (torch.addmm then gelu, two
kernels) where the model has them.

  bench/experiments/f32_shapes.py
"""
import torch

SHAPES = [("BERT-base QKV / ViT", 128, 768, 768), ("BERT-base FFN in", 128, 768, 3072),
          ("BERT-base FFN out", 128, 3072, 768), ("ViT-B/16 QKV", 197, 768, 2304),
          ("ViT-B/16 attention out", 197, 768, 768), ("ViT-B/16 FFN in", 197, 768, 3072),
          ("ViT-B/16 FFN out", 197, 3072, 768)]


def time_graph(fn, reps=50, replays=20):
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    for _ in range(5):
        g.replay()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / reps)
    return sorted(times)[len(times) // 2]


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, f32, TF32 off")
    print(f"{'product':26} {'M x K x N':>16} {'us':>7} {'TFLOP/s':>8}")
    g = torch.Generator(device="cuda").manual_seed(0)
    for name, m, k, n in SHAPES:
        x = torch.randn(m, k, device="cuda", generator=g)
        w = torch.randn(k, n, device="cuda", generator=g) / k ** 0.5
        out = torch.empty(m, n, device="cuda")
        us = time_graph(lambda: torch.mm(x, w, out=out))
        ref = (x.double() @ w.double()).float()
        err = ((out - ref).abs().max() / ref.abs().max()).item()
        assert err < 1e-5, f"{name}: error {err}"
        print(f"{name:26} {f'{m}x{k}x{n}':>16} {us:7.1f} {2 * m * k * n / us / 1e6:8.1f}")


if __name__ == "__main__":
    main()
