"""test_signal.py: the signal ops on Vulkan against numpy's FFT.

dft (real and complex, forward and inverse, one-sided, padded and cut,
power-of-two lengths through the radix-2 kernel, other lengths and long
ones through the direct sum), stft (with and without a window), log_mel
(built-in filter bank and windows, and a given matrix) and welch (against
scipy's defaults, rewritten in numpy), each on several shapes; every element
checked. The ONNX DFT, STFT, window and MelWeightMatrix conformance cases run
in test_onnx.py.
"""
import numpy as np

import reference as ref
from harness import ROOT, assert_close, check, registry
from ops_common import one_op, rng, values

TESTS, case = registry()


def spectral_tol(n):
    """Sums of n terms of unit size: f32 error grows with sqrt(n) log(n)."""
    return 2e-5 * np.sqrt(n) * max(np.log2(max(n, 2)), 1)


DFTS = [  # shape, attrs
    ([3, 10, 2], {}),
    ([2, 16, 1], {}),                       # real, radix 2
    ([4, 64, 3, 2], {"axis": 1}),           # strided signals
    ([2, 7, 1], {"onesided": 1}),
    ([1, 1024, 2], {"inverse": 1}),
    ([2, 12, 2], {"length": 16}),           # zero-padded to 16
    ([2, 40, 1], {"length": 25, "onesided": 1}),  # cut to 25
    ([5, 1, 2], {}),                        # one point
    ([2, 2048, 2], {}),                     # the longest radix-2 in shared memory
    ([1, 3000, 1], {}),                     # direct sum, shared memory
    ([1, 4096, 2], {"inverse": 1}),         # past shared memory: direct from x
    ([6, 3, 5, 1], {"axis": 0}),
]


def dft_case(i, shape, attrs):
    def test(workdir):
        x = values(rng(700 + i), shape, 1.0)
        axis = attrs.get("axis", -2)
        n = attrs.get("length", shape[axis])
        want = ref.dft(x, **attrs)
        scale = 1.0 / n if attrs.get("inverse") else 1.0
        one_op(workdir, "dft", [x], want, attrs, rtol=1e-4, atol=spectral_tol(n) * scale)
    return test


for i, (shape, attrs) in enumerate(DFTS):
    case(f"op dft {shape} {attrs}")(dft_case(i, shape, attrs))


@case("op dft: inverse of the forward transform gives the signal back")
def _(workdir):
    from harness import model_yaml, run_model
    x = values(rng(790), [3, 96, 2], 1.0)
    y = model_yaml("roundtrip", {"a": {"dtype": "f32", "shape": [3, 96, 2]}},
                   [{"name": "f", "op": "dft", "inputs": ["a"]},
                    {"name": "y", "op": "dft", "inputs": ["f"], "inverse": 1}], ["y"])
    got, = run_model(workdir, y, [x], [x])
    assert_close(got, x, 1e-4, 1e-5)


STFTS = [  # signal shape, frame_step, window (kind, length) or frame_length, onesided
    ([2, 128, 1], 8, ("hann", 16), 1),
    ([1, 100, 2], 7, 20, 0),
    ([3, 500], 50, ("hamming", 100), 1),
    ([1, 4000], 160, ("hann", 400), 1),
]


def stft_case(i, shape, step, win, onesided):
    def test(workdir):
        x = values(rng(720 + i), shape, 1.0)
        attrs = {"frame_step": step, "onesided": onesided}
        if isinstance(win, tuple):
            w = ref.window(*win).astype(np.float32)
            ins, want, n = [x, w], ref.stft(x, step, w, None, onesided), win[1]
        else:
            attrs["frame_length"] = win
            ins, want, n = [x], ref.stft(x, step, None, win, onesided), win
        one_op(workdir, "stft", ins, want, attrs, rtol=1e-4, atol=spectral_tol(n))
    return test


for i, args in enumerate(STFTS):
    case(f"op stft {args[0]} step {args[1]} window {args[2]}")(stft_case(i, *args))

LOG_MELS = [  # shape, attrs
    ([2, 1600], {"n_fft": 400, "hop": 160, "n_mels": 40}),
    ([3000], {"n_fft": 256, "hop": 64, "n_mels": 20, "sample_rate": 8000, "fmin": 100,
              "fmax": 3000, "window": "hamming"}),
    ([1, 2, 1024], {"n_fft": 128, "n_mels": 16, "sample_rate": 22050,
                    "window": "blackman"}),   # hop n_fft / 4
    ([1, 16000], {"n_fft": 512, "hop": 256, "n_mels": 80}),
]


def log_mel_case(i, shape, attrs):
    def test(workdir):
        r = rng(740 + i)
        x = values(r, shape, 1.0)
        want = ref.log_mel(x, attrs["n_fft"], attrs.get("hop"), attrs.get("sample_rate", 16000),
                           attrs.get("n_mels", 80), attrs.get("fmin", 0), attrs.get("fmax", 0),
                           attrs.get("window", "hann"))
        one_op(workdir, "log_mel", [x], want, attrs, rtol=1e-4, atol=2e-4)
    return test


for i, (shape, attrs) in enumerate(LOG_MELS):
    case(f"op log_mel {shape} {attrs}")(log_mel_case(i, shape, attrs))


@case("op log_mel with a given filter bank (a weight)")
def _(workdir):
    r = rng(760)
    x = values(r, [2, 800], 1.0)
    mel = np.abs(values(r, [129, 12], 0.1))
    one_op(workdir, "log_mel", [x, mel], ref.log_mel(x, 256, 100, mel=mel),
           {"n_fft": 256, "hop": 100}, rtol=1e-4, atol=2e-4)


WELCHES = [  # shape, attrs
    ([2, 4096], {"segment": 256}),
    ([1000], {"segment": 100, "overlap": 30, "fs": 8000, "window": "blackman"}),
    ([3, 2, 777], {"segment": 64, "overlap": 0, "window": "rect"}),
    ([1, 3000], {"segment": 3000}),          # one segment, direct sum from x
    ([1, 20000], {"segment": 1024, "overlap": 768, "fs": 16000}),
]


def welch_case(i, shape, attrs):
    def test(workdir):
        r = rng(770 + i)
        t = np.arange(shape[-1])
        # Tones over noise and an offset (which the detrending removes).
        x = (values(r, shape, 0.5) + 2 * np.sin(0.3 * t) + np.sin(1.7 * t) + 0.7)
        x = x.astype(np.float32)
        want = ref.welch(x, attrs["segment"], attrs.get("overlap"), attrs.get("fs", 1.0),
                         attrs.get("window", "hann"))
        one_op(workdir, "welch", [x], want, attrs, rtol=2e-4,
               atol=1e-5 * float(np.max(want)))
    return test


for i, (shape, attrs) in enumerate(WELCHES):
    case(f"op welch {shape} {attrs}")(welch_case(i, shape, attrs))


@case("model samples/signal.yaml (log-mel spectrogram, Welch peaks) against the CPU "
      "reference")
def test_signal_sample(workdir):
    import interpret
    from harness import build_model, run_program
    path = ROOT / "samples" / "signal.yaml"
    t = np.arange(8000) / 8000.0
    r = np.random.default_rng(8)
    # Three tones on Welch bins (8000 / 512 Hz apart) over noise.
    x = (np.sin(2 * np.pi * 437.5 * t) + 0.8 * np.sin(2 * np.pi * 1250 * t) +
         0.6 * np.sin(2 * np.pi * 3000 * t) + 0.1 * r.standard_normal(8000))
    x = x.astype(np.float32)[None]
    wants = interpret.interpret(path, [x])
    prog = build_model(workdir, path.read_text(), guard=True)
    gots = run_program(prog, [x], [np.asarray(w, np.asarray(w).dtype) for w in wants])
    assert_close(gots[0], wants[0], 1e-4, 2e-4, "log_mel")
    check(np.array_equal(gots[1], wants[1]), f"peaks: got {gots[1]}, expected {wants[1]}")
    check(gots[1].tolist() == [[28, 80, 192]], f"the tones' bins: {gots[1].tolist()}")
