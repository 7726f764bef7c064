#!/usr/bin/env python3
"""export.py: real exporter output for kiln's tests, and checks of full-size models.

Runs where PyTorch, torchvision, onnx and onnxruntime are (the GPU machine;
not CI). Two commands:

  export.py corpus [--out tests/models] [--skip-existing DIR] [NAME...]
      Writes the small models the repository carries (all, or those NAMEd:
      densenet_tiny, gn_convnet, bert_tiny, bert_wide_ffn, llama_tiny, gpt2_tiny,
      qwen2_tiny, t5_tiny,
      vit_tiny, whisper_encoder_tiny, mobilenet_v3_small, resnet_tiny,
      squeezenet_tiny, einsum_block,
      rnn_block, stn (a spatial transformer), roi_head (torchvision's
      roi_align), efficientnet_tiny, shufflenet_tiny, qdq_convnet: onnxruntime's QDQ quantization of an export), each
      exported as listed in tiny_models(): each one a directory
      NAME/ with model.onnx as torch.onnx.export wrote it, input_N.npy (seeded
      random inputs), ort_N.npy and torch_N.npy (onnxruntime's and torch's
      outputs, f32 on the CPU) and meta.json (exporter, opset, versions, date,
      the largest difference between the two references). tests/test_corpus.py
      compiles every such directory with kiln, runs it on Vulkan and compares
      each output element with onnxruntime's. With --kiln BUILD, each model
      also runs with kiln on this machine's GPU, compared likewise.

  export.py dynamic [--out tests/models/dynamic] [--kiln BUILD] [NAME...]
      Exports the models of dynamic_models() with dynamic axes
      (torch.export.Dim "seq", 1..32, at a fixed batch of 2, or "batch",
      1..4, and "seq" with an attention mask as a second input; the dynamo
      exporter, opset 20): each a directory NAME/ with model.onnx,
      meta.json (the dims' ONNX names and ranges, each run's values) and,
      for each run K, runK_input_I.npy, runK_ort_0.npy and
      runK_torch_0.npy. tests/test_corpus.py compiles each once with
      --shape DIM=MIN..MAX and runs every run in one process. With --kiln
      BUILD, also on this machine's GPU (f32 and --precision f16).

  export.py plain [--out tests/models/plain] [NAME...]
      transformers models exported as a user would, with nothing of the
      project's around them (plain_models(): decoders as *ForCausalLM,
      encoders, a ViT): torch.onnx.export(model, (x,), dynamo=True,
      dynamic_shapes=({1: Dim("seq", min=2, max=32)},)) (a ViT's batch,
      1..4); each NAME/ holds model.onnx, meta.json and, at three sizes,
      runK_input_0.npy and every output of onnxruntime (runK_ort_J.npy).

  export.py run DIR... [--kiln BUILD]
      Runs stored corpus directories with kiln on this machine's GPU and
      compares each output element with the stored onnxruntime outputs.

  export.py check MODEL... [--kiln build] [--out DIR]
      Exports torchvision's full-size MODELs (densenet121, resnet50, ...;
      random weights, eval mode, batch 1, 224 x 224) or transformers' (bert-base,
      gpt2, vit-b16, llama-1024; sequence 128), compiles each with
      kiln from --kiln (a build directory holding kiln, libkilnrt.a and
      run_model_test.o), builds and runs it on the first Vulkan device, and
      prints the largest difference from onnxruntime and torch. Exit 1 when
      a model does not compile or is off by more than atol 1e-4 + rtol 1e-3.

The torchvision models are exported twice: by the TorchScript-based
exporter (dynamo=False) at opset 17 and by the dynamo exporter at opset 18;
the newer tiny models by the dynamo exporter at opsets 20 and up.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torchvision

ROOT = Path(__file__).resolve().parents[2]
EXPORTS = [("legacy17", dict(dynamo=False, opset_version=17)),
           ("dynamo18", dict(dynamo=True, opset_version=18, external_data=False))]


def randomize_norms(m, seed):
    """BatchNorm statistics and affine weights away from their defaults (1, 0),
    so that a wrong channel in a folded norm shows."""
    g = torch.Generator().manual_seed(seed)
    for mod in m.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            c = mod.num_features
            mod.running_mean.copy_(torch.rand(c, generator=g) * 0.4 - 0.2)
            mod.running_var.copy_(torch.rand(c, generator=g) * 1.5 + 0.5)
            mod.weight.data.copy_(torch.rand(c, generator=g) + 0.5)
            mod.bias.data.copy_(torch.rand(c, generator=g) * 0.4 - 0.2)
    return m


class Mish(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.mish(x)


def gn_convnet():
    """Convolutions with GroupNorm and the activations exporters now write as
    their own ops (Gelu exact and tanh from opset 20, Mish)."""
    torch.manual_seed(0)
    nn = torch.nn
    m = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.GroupNorm(4, 16), nn.SiLU(),
        nn.Conv2d(16, 16, 3, padding=1), nn.GroupNorm(8, 16), nn.GELU(approximate="tanh"),
        nn.Conv2d(16, 8, 1), Mish(), nn.GELU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(8, 10))
    g = torch.Generator().manual_seed(2)
    for mod in m.modules():  # affine weights away from (1, 0): a wrong channel shows
        if isinstance(mod, nn.GroupNorm):
            mod.weight.data.copy_(torch.rand(mod.num_channels, generator=g) + 0.5)
            mod.bias.data.copy_(torch.rand(mod.num_channels, generator=g) * 0.4 - 0.2)
    return m.eval()


class EinsumBlock(torch.nn.Module):
    """Attention and a bilinear readout written with torch.einsum, as some
    research code and older transformers models are: the TorchScript
    exporter writes them as ONNX Einsum nodes."""
    def __init__(self, d=16, heads=2):
        super().__init__()
        torch.manual_seed(0)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.w = torch.nn.Parameter(torch.randn(4, d, d) / d)
        self.heads = heads

    def forward(self, x):                                  # [B, S, d]
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).unbind(2)
        att = torch.einsum("bqhd,bkhd->bhqk", q, k).softmax(-1)
        y = torch.einsum("bhqk,bkhd->bqhd", att, v).reshape(b, s, d)
        return torch.einsum("bsi,oij,bsj->bso", y, self.w, x)


class RnnBlock(torch.nn.Module):
    """A two-layer bidirectional LSTM and a GRU over its outputs, batch
    first, as speech and time-series models stack them."""
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lstm = torch.nn.LSTM(8, 12, num_layers=2, bidirectional=True, batch_first=True)
        self.gru = torch.nn.GRU(24, 10, batch_first=True)
        self.out = torch.nn.Linear(10, 4)

    def forward(self, x):                                  # [B, T, 8]
        y, _ = self.lstm(x)
        y, h = self.gru(y)
        return self.out(y), h


class SpatialTransformer(torch.nn.Module):
    """A spatial transformer network: a small localization net predicts an
    affine transform (near the identity), F.affine_grid and F.grid_sample
    resample the input by it, a classifier reads the result."""
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.loc = torch.nn.Sequential(
            torch.nn.Conv2d(1, 6, 5), torch.nn.MaxPool2d(2), torch.nn.ReLU(),
            torch.nn.Conv2d(6, 8, 5), torch.nn.MaxPool2d(2), torch.nn.ReLU(),
            torch.nn.Flatten(), torch.nn.Linear(8 * 4 * 4, 6))
        with torch.no_grad():
            self.loc[-1].weight.mul_(0.05)
            self.loc[-1].bias.copy_(torch.tensor([1.0, 0.1, 0.05, -0.1, 0.9, 0.0]))
        self.head = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(),
                                        torch.nn.Flatten(), torch.nn.Linear(4 * 26 * 26, 10))

    def forward(self, x):                                  # [B, 1, 28, 28]
        theta = self.loc(x).view(-1, 2, 3)
        grid = torch.nn.functional.affine_grid(theta, list(x.shape), align_corners=False)
        y = torch.nn.functional.grid_sample(x, grid, mode="bilinear", padding_mode="zeros",
                                            align_corners=False)
        return self.head(y), grid


class RoiHead(torch.nn.Module):
    """A detector's second stage: torchvision's roi_align pools fixed
    regions (with their image numbers, as detectors pass them) of a small
    backbone's features, a linear layer classifies each."""
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.backbone = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1),
                                            torch.nn.ReLU(),
                                            torch.nn.Conv2d(8, 8, 3, stride=2, padding=1))
        self.register_buffer("rois", torch.tensor(
            [[0, 1.5, 2.0, 20.0, 25.5], [1, 0.0, 0.0, 31.0, 31.0], [0, 10.2, 4.7, 17.9, 12.3],
             [1, -3.0, 20.0, 8.0, 40.0], [0, 5.0, 5.0, 5.5, 6.0]]))
        self.cls = torch.nn.Linear(8 * 3 * 3, 5)

    def forward(self, x):                                  # [2, 3, 32, 32]
        f = self.backbone(x)
        r = torchvision.ops.roi_align(f, self.rois, (3, 3), spatial_scale=0.5,
                                      sampling_ratio=2, aligned=True)
        return self.cls(r.flatten(1))


def efficientnet_tiny():
    """torchvision's EfficientNet at a quarter of B0's width and depth
    (squeeze-and-excitation, SiLU, depthwise convolutions)."""
    from torchvision.models.efficientnet import EfficientNet, _efficientnet_conf
    torch.manual_seed(0)
    setting, last = _efficientnet_conf("efficientnet_b0", width_mult=0.25, depth_mult=0.25)
    return randomize_norms(EfficientNet(setting, 0.2, num_classes=10, last_channel=last), 3).eval()


def shufflenet_tiny():
    """torchvision's ShuffleNetV2 with small stages (channel split and
    shuffle: reshapes, transposes, splits and concatenations)."""
    torch.manual_seed(0)
    m = torchvision.models.ShuffleNetV2([2, 2, 2], [8, 16, 32, 64, 128], num_classes=10)
    return randomize_norms(m, 4).eval()


def qdq_convnet():
    """A small convolutional network, to be quantized by onnxruntime's
    quantize_static (QDQ format, int8 weights per channel, uint8
    activations) after export: export() does that for the "qdq" exports."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.Conv2d(8, 16, 3, stride=2, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 16, 1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(), torch.nn.Linear(16, 10))
    return randomize_norms(m, 2).eval()


def quantize_qdq(src, dst, inputs):
    """onnxruntime's static quantization of src into dst (QDQ), calibrated
    on the inputs and 15 more random sets like them."""
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)
    name = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).get_inputs()[0].name
    rng = np.random.default_rng(5)
    sets = [inputs[0]] + [rng.standard_normal(inputs[0].shape).astype(np.float32)
                          for _ in range(15)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter({name: x} for x in sets)

        def get_next(self):
            return next(self.it, None)
    quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ,
                    per_channel=True, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8)


class LastHidden(torch.nn.Module):
    """A transformers model called on its one input (token ids, pixels or
    audio features), returning its last hidden state (a plain tensor for
    the exporter)."""
    def __init__(self, model, arg="input_ids"):
        super().__init__()
        self.model, self.arg = model, arg

    def forward(self, x):
        return self.model(**{self.arg: x}).last_hidden_state


def bert_tiny():
    import transformers
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=64,
                                  max_position_embeddings=32)
    return LastHidden(transformers.BertModel(cfg, add_pooling_layer=False)).eval()


def bert_wide_ffn():
    """BERT with a long FFN for its width (64 to 2048 and back) at 32
    tokens: its FFN output, [32, 2048] x [2048, 64], is one tile of kiln's
    tiled matmul, which splits it along K (split-K, splitk.comp)."""
    import transformers
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=2048,
                                  max_position_embeddings=32)
    return LastHidden(transformers.BertModel(cfg, add_pooling_layer=False)).eval()


def llama_tiny():
    import transformers
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=64, max_position_embeddings=32)
    return LastHidden(transformers.LlamaModel(cfg)).eval()


def gpt2_tiny():
    import transformers
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=100, n_positions=32, n_embd=32, n_layer=2,
                                  n_head=2)
    return LastHidden(transformers.GPT2Model(cfg)).eval()


def qwen2_tiny():
    import transformers
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=64, max_position_embeddings=32)
    return LastHidden(transformers.Qwen2Model(cfg)).eval()


class Seq2Seq(torch.nn.Module):
    """An encoder-decoder called on source and target token ids, returning
    the decoder's last hidden state."""
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, src, tgt):
        return self.model(input_ids=src, decoder_input_ids=tgt).last_hidden_state


def t5_tiny():
    """transformers' T5 (relative position buckets, cross-attention, RMS
    norms without a mean) at a tiny configuration."""
    import transformers
    torch.manual_seed(0)
    cfg = transformers.T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                num_decoder_layers=2, num_heads=4,
                                relative_attention_num_buckets=8,
                                relative_attention_max_distance=16, decoder_start_token_id=0)
    cfg._attn_implementation = "eager"
    return Seq2Seq(transformers.T5Model(cfg)).eval()


def vit_tiny():
    import transformers
    torch.manual_seed(0)
    cfg = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                 intermediate_size=64, image_size=32, patch_size=8)
    return LastHidden(transformers.ViTModel(cfg, add_pooling_layer=False),
                      "pixel_values").eval()


def whisper_encoder_tiny():
    import transformers
    torch.manual_seed(0)
    cfg = transformers.WhisperConfig(vocab_size=100, d_model=32, encoder_layers=2,
                                     encoder_attention_heads=2, decoder_layers=1,
                                     decoder_attention_heads=2, encoder_ffn_dim=64,
                                     decoder_ffn_dim=64, num_mel_bins=16,
                                     max_source_positions=16, max_target_positions=16,
                                     pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                     decoder_start_token_id=1)
    return LastHidden(transformers.WhisperModel(cfg).encoder, "input_features").eval()


def mobilenet_small():
    """At a quarter width. torchvision's initialization (a linear layer's
    weights of std 0.01) leaves its random logits near 1e-9, where any
    tolerance passes: convolutions and linear layers get weights of std
    1/sqrt(fan in) instead, so that the outputs are of order 1."""
    torch.manual_seed(0)
    m = torchvision.models.mobilenet_v3_small(width_mult=0.25, num_classes=10)
    for mod in m.modules():
        if isinstance(mod, (torch.nn.Conv2d, torch.nn.Linear)):
            fan_in = mod.weight[0].numel()
            torch.nn.init.normal_(mod.weight, 0.0, fan_in ** -0.5)
            if mod.bias is not None:
                torch.nn.init.uniform_(mod.bias, -0.1, 0.1)
    return randomize_norms(m, 1).eval()


def resnet_tiny():
    """ResNet's family at a small width, from torchvision's own blocks: the
    stem (7x7 convolution at stride 2, max pool), a BasicBlock (ResNet-18's),
    Bottlenecks (ResNet-50's) with their strided 1x1 downsampling, one
    grouped as ResNeXt groups it, global average pooling and a linear head."""
    from torchvision.models.resnet import BasicBlock, Bottleneck, conv1x1
    torch.manual_seed(0)
    nn = torch.nn

    def down(cin, cout, stride):
        return nn.Sequential(conv1x1(cin, cout, stride), nn.BatchNorm2d(cout))
    m = nn.Sequential(
        nn.Conv2d(3, 16, 7, 2, 3, bias=False), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2, 1),
        BasicBlock(16, 16),
        Bottleneck(16, 8, stride=2, downsample=down(16, 32, 2)),
        Bottleneck(32, 8, groups=4, base_width=32, stride=2, downsample=down(32, 32, 2)),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
    return randomize_norms(m, 5).eval()


def squeezenet_tiny():
    """SqueezeNet 1.1's structure at a small width, from torchvision's own
    Fire module: max pools with ceil_mode (an output row past the input's
    edge), squeeze and expand convolutions concatenated, dropout, a
    convolutional classifier and global average pooling."""
    from torchvision.models.squeezenet import Fire
    torch.manual_seed(0)
    nn = torch.nn
    m = nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2), nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2, ceil_mode=True),
        Fire(16, 4, 8, 8), Fire(16, 4, 8, 8),
        nn.MaxPool2d(3, 2, ceil_mode=True),
        Fire(16, 8, 16, 16),
        nn.Dropout(0.5), nn.Conv2d(32, 10, 1), nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1), nn.Flatten())
    return m.eval()


def dynamo(opset):
    return (f"dynamo{opset}", dict(dynamo=True, opset_version=opset, external_data=False))


def densenet_tiny():
    torch.manual_seed(0)
    dense = torchvision.models.DenseNet(growth_rate=4, block_config=(3, 12, 4),
                                        num_init_features=8, bn_size=2, num_classes=10)
    return randomize_norms(dense, 1).eval()


def tiny_models():
    """(name, module, inputs: (shape, dtype, high) each, exports): small
    configurations of torchvision's and transformers' own classes.
    DenseNet's second block has 12 layers, so its concatenations take up to
    13 inputs. Token ids are int64 below high."""
    cnn = [EXPORTS[0], dynamo(20), dynamo(23)]
    return [("densenet_tiny", densenet_tiny,
             [((1, 3, 32, 32), np.float32, None)], EXPORTS + [dynamo(20), dynamo(23)]),
            ("gn_convnet", gn_convnet, [((1, 3, 16, 16), np.float32, None)],
             [dynamo(20), dynamo(21), dynamo(23)]),
            ("bert_tiny", bert_tiny, [((1, 8), np.int64, 100)],
             [EXPORTS[0], dynamo(20), dynamo(23)]),
            ("bert_wide_ffn", bert_wide_ffn, [((1, 32), np.int64, 100)], [dynamo(20)]),
            ("llama_tiny", llama_tiny, [((1, 8), np.int64, 100)], [dynamo(20), dynamo(23)]),
            ("gpt2_tiny", gpt2_tiny, [((1, 8), np.int64, 100)], [dynamo(20), dynamo(23)]),
            ("qwen2_tiny", qwen2_tiny, [((1, 8), np.int64, 100)], [dynamo(20), dynamo(23)]),
            ("t5_tiny", t5_tiny, [((1, 8), np.int64, 100), ((1, 6), np.int64, 100)],
             [EXPORTS[0], dynamo(20), dynamo(23)]),
            ("vit_tiny", vit_tiny, [((1, 3, 32, 32), np.float32, None)],
             [EXPORTS[0], dynamo(20), dynamo(23)]),
            ("whisper_encoder_tiny", whisper_encoder_tiny, [((1, 16, 32), np.float32, None)],
             [EXPORTS[0], dynamo(20), dynamo(23)]),
            ("mobilenet_v3_small", mobilenet_small, [((1, 3, 64, 64), np.float32, None)], cnn),
            ("resnet_tiny", resnet_tiny, [((1, 3, 64, 64), np.float32, None)], cnn),
            ("squeezenet_tiny", squeezenet_tiny, [((1, 3, 64, 64), np.float32, None)], cnn),
            ("einsum_block", lambda: EinsumBlock().eval(), [((2, 6, 16), np.float32, None)],
             [EXPORTS[0], dynamo(20), dynamo(23)]),
            ("rnn_block", lambda: RnnBlock().eval(), [((2, 7, 8), np.float32, None)],
             [EXPORTS[0], dynamo(20), dynamo(23)]),
            ("stn", lambda: SpatialTransformer().eval(), [((2, 1, 28, 28), np.float32, None)],
             [EXPORTS[0], dynamo(20), dynamo(23)]),
            ("roi_head", lambda: RoiHead().eval(), [((2, 3, 32, 32), np.float32, None)],
             [EXPORTS[0], dynamo(20), dynamo(23)]),
            ("efficientnet_tiny", efficientnet_tiny, [((1, 3, 64, 64), np.float32, None)], cnn),
            ("shufflenet_tiny", shufflenet_tiny, [((1, 3, 64, 64), np.float32, None)], cnn),
            ("qdq_convnet", qdq_convnet, [((1, 3, 16, 16), np.float32, None)],
             [("dynamo20_qdq", dict(dynamo=True, opset_version=20, external_data=False,
                                    qdq=True))])]


class TokenMLP(torch.nn.Module):
    """A pre-norm feed-forward block over [B, S, 16] tokens: layer norm,
    Linear 16 -> 48, GELU, Linear 48 -> 16, the residual."""
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.norm = torch.nn.LayerNorm(16)
        self.up = torch.nn.Linear(16, 48)
        self.down = torch.nn.Linear(48, 16)

    def forward(self, x):                                  # [B, S, 16]
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class MaskedHidden(torch.nn.Module):
    """A transformers encoder or decoder called on token ids and an
    attention mask (1 for a token, 0 for padding), as optimum exports them;
    returns the last hidden state."""
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, mask):
        return self.model(input_ids=ids, attention_mask=mask).last_hidden_state


def distilbert_tiny():
    import transformers
    torch.manual_seed(0)
    cfg = transformers.DistilBertConfig(vocab_size=100, dim=32, n_layers=2, n_heads=2,
                                        hidden_dim=64, max_position_embeddings=32)
    return MaskedHidden(transformers.DistilBertModel(cfg)).eval()


def roberta_tiny():
    """RoBERTa: position ids counted from the tokens that are not padding
    (a cumulative sum over the sequence), offset by the padding index."""
    import transformers
    torch.manual_seed(0)
    cfg = transformers.RobertaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=64,
                                     max_position_embeddings=40, pad_token_id=1)
    return MaskedHidden(transformers.RobertaModel(cfg, add_pooling_layer=False)).eval()


def t5_encoder_tiny():
    """T5's encoder alone: relative position buckets (a log of the
    distances) over a dynamic sequence."""
    import transformers
    torch.manual_seed(0)
    cfg = transformers.T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                num_heads=4, relative_attention_num_buckets=8,
                                relative_attention_max_distance=16)
    cfg._attn_implementation = "eager"
    return MaskedHidden(transformers.T5EncoderModel(cfg)).eval()


class SentenceEmbedding(torch.nn.Module):
    """A sentence-transformers style embedding: BERT's last hidden state
    averaged over the tokens the mask keeps, then L2-normalized."""
    def __init__(self):
        super().__init__()
        self.model = bert_tiny().model

    def forward(self, ids, mask):
        h = self.model(input_ids=ids, attention_mask=mask).last_hidden_state
        m = mask.unsqueeze(-1).to(h.dtype)
        pooled = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, p=2, dim=1)


class Logits(torch.nn.Module):
    """A transformers classifier called on token ids and a mask; returns
    its logits."""
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, mask):
        return self.model(input_ids=ids, attention_mask=mask).logits


def gpt2_classifier():
    """GPT-2 for sequence classification: the logits of each row's last
    token that is not padding (found from the ids: an argmax over the
    sequence)."""
    import transformers
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=100, n_positions=32, n_embd=32, n_layer=2,
                                  n_head=2, num_labels=3, pad_token_id=0)
    return Logits(transformers.GPT2ForSequenceClassification(cfg)).eval()


DYN_SEQS = [1, 5, 8, 13, 32, 2]  # sequence lengths at a fixed batch of 2, in run order
DYN_MAX = 32
DYN_BATCH = [1, 4, 2, 3, 1, 4]  # image batches of the CNNs (and ViT, Whisper), in run order
# (batch, seq) pairs where both are dynamic (batch 1..4), in run order
DYN_BATCH_SEQ = [(1, 1), (4, 32), (2, 5), (3, 13), (1, 32), (4, 1)]


def masked(make):
    return lambda: MaskedHidden(make().model).eval()


def dynamic_models():
    """(name, module, inputs, dims, runs): inputs (shape with "batch" and
    "seq" for the dynamic axes, dtype, high for token ids or "mask"),
    dims {name: (min, max)}, runs [{dim: value}]: exported with those axes
    dynamic, as a server batches requests."""
    ids2 = ((2, "seq"), np.int64, 100)
    seq_runs = [{"seq": s} for s in DYN_SEQS]
    both = [((("batch", "seq"), np.int64, 100)), (("batch", "seq"), np.int64, "mask")]
    both_dims = {"batch": (1, 4), "seq": (1, DYN_MAX)}
    both_runs = [{"batch": b, "seq": q} for b, q in DYN_BATCH_SEQ]
    return [("token_mlp_b2", lambda: TokenMLP().eval(), [((2, "seq", 16), np.float32, None)],
             {"seq": (1, DYN_MAX)}, seq_runs),
            ("bert_tiny_b2", bert_tiny, [ids2], {"seq": (1, DYN_MAX)}, seq_runs),
            ("gpt2_tiny_b2", gpt2_tiny, [ids2], {"seq": (1, DYN_MAX)}, seq_runs),
            ("llama_tiny_b2", llama_tiny, [ids2], {"seq": (1, DYN_MAX)}, seq_runs),
            ("bert_tiny_mask_bs", masked(bert_tiny), both, both_dims, both_runs),
            ("gpt2_tiny_mask_bs", masked(gpt2_tiny), both, both_dims, both_runs),
            ("llama_tiny_mask_bs", masked(llama_tiny), both, both_dims, both_runs),
            ("qwen2_tiny_mask_bs", masked(qwen2_tiny), both, both_dims, both_runs),
            ("distilbert_tiny_mask_bs", distilbert_tiny, both, both_dims, both_runs),
            ("roberta_tiny_mask_bs", roberta_tiny, both, both_dims, both_runs),
            ("t5_encoder_tiny_mask_bs", t5_encoder_tiny, both, both_dims, both_runs),
            ("sentence_embedding_mask_bs", lambda: SentenceEmbedding().eval(), both, both_dims,
             both_runs),
            ("gpt2_classifier_mask_bs", gpt2_classifier, both, both_dims, both_runs)] + [
        (f"{name}_bs", make, [(("batch",) + shape, np.float32, None)], {"batch": (1, 4)},
         [{"batch": b} for b in DYN_BATCH])
        for name, make, shape in (("resnet_tiny", resnet_tiny, (3, 32, 32)),
                                  ("mobilenet_v3_small", mobilenet_small, (3, 32, 32)),
                                  ("squeezenet_tiny", squeezenet_tiny, (3, 32, 32)),
                                  ("efficientnet_tiny", efficientnet_tiny, (3, 32, 32)),
                                  ("shufflenet_tiny", shufflenet_tiny, (3, 32, 32)),
                                  ("densenet_tiny", densenet_tiny, (3, 32, 32)),
                                  ("vit_tiny", vit_tiny, (3, 32, 32)),
                                  ("whisper_encoder_tiny", whisper_encoder_tiny, (16, 32)))]


def dynamic_inputs(specs, dims, seed):
    """The inputs at dims: token ids below high, masks of ones with row r's
    last r positions padding (at least one token each), floats normal."""
    rng = np.random.default_rng(seed)
    out = []
    for shape, dt, high in specs:
        shp = tuple(dims[d] if isinstance(d, str) else d for d in shape)
        if high == "mask":
            m = np.ones(shp, dt)
            for r in range(shp[0]):
                m[r, max(1, shp[1] - r):] = 0
            out.append(m)
        elif high:
            out.append(rng.integers(0, high, size=shp).astype(dt))
        else:
            out.append(rng.standard_normal(shp).astype(dt))
    return out


def dynamic_export(module, specs, dims, path):
    """Exports module with the named axes of its inputs dynamic; returns
    {our name: the ONNX dim_param the exporter wrote}."""
    example = dynamic_inputs(specs, {d: max(3, min(8, hi)) for d, (lo, hi) in dims.items()}, 5)
    err = None
    for how in ("named", "unnamed", "auto"):  # the first the exporter takes
        objs = {d: torch.export.Dim(d, min=lo, max=hi) if how == "named" else
                torch.export.Dim(d) if how == "unnamed" else torch.export.Dim.DYNAMIC
                for d, (lo, hi) in dims.items()}
        shapes = tuple({a: objs[d] for a, d in enumerate(shape) if isinstance(d, str)}
                       for shape, _, _ in specs)
        try:
            with torch.no_grad():
                torch.onnx.export(module, tuple(torch.from_numpy(x) for x in example),
                                  str(path), input_names=[f"x{i}" for i in range(len(specs))],
                                  dynamic_shapes=shapes, dynamo=True, opset_version=20,
                                  external_data=False)
            break
        except Exception as e:  # a constraint this model's trace refuses
            print(f"  export ({how} dims): {type(e).__name__}: {str(e)[:600]}", flush=True)
            err = e
    else:
        raise err
    onnx.checker.check_model(str(path))
    names = {}
    inputs = onnx.load(str(path)).graph.input
    for i, (shape, _, _) in enumerate(specs):
        dp = inputs[i].type.tensor_type.shape.dim
        for a, d in enumerate(shape):
            if isinstance(d, str):
                if not dp[a].dim_param:
                    raise RuntimeError(f"axis {a} of input {i} was exported fixed")
                if names.setdefault(d, dp[a].dim_param) != dp[a].dim_param:
                    raise RuntimeError(f"{d} exported as {names[d]} and {dp[a].dim_param}")
    return names


def run_kiln_steps(build, model, shape_flags, onnx_dims, steps, wd, precision):
    """Compiles model with the --shape flags, runs every (inputs,
    reference) of steps in one process; returns (the largest max |error|
    over max |reference| of a step, note) or (None, note)."""
    rc, log = sh([build / "kiln", "compile", model, "--name", "model", "-o", wd / "model.c",
                  *shape_flags, "--precision", precision])
    if rc:
        return None, f"kiln compile failed:\n{log[-3000:]}"
    rc, log2 = sh([os.environ.get("CC", "cc"), "-O2", "-std=c99", "-I", ROOT / "runtime",
                   "-o", wd / "model", wd / "model.c", build / "run_model_test.o",
                   "-L", build, "-lkilnrt", os.environ.get("KILN_VULKAN_LIB", "-lvulkan"), "-lm"])
    if rc:
        return None, f"building the generated C failed:\n{log2[-3000:]}"
    args = [wd / "model", "-q", "--steps", len(steps)]
    for ours, theirs in onnx_dims.items():
        args += ["-d", f"{theirs}=" + ",".join(str(dims[ours]) for dims, _, _ in steps)]
    for i in range(len(steps[0][1])):
        args += ["-i", wd / f"in{i}_%d.bin"]
    args += ["-o", wd / "out_%d.bin"]
    for k, (_, xs, _) in enumerate(steps):
        for i, x in enumerate(xs):
            x.tofile(wd / f"in{i}_{k}.bin")
    rc, log3 = sh(args, cwd=wd)
    if rc:
        return None, f"the model failed ({rc}):\n{log3[-3000:]}"
    worst = 0.0
    for k, (_, _, want) in enumerate(steps):
        got = np.fromfile(wd / f"out_{k}.bin", np.float32).reshape(want.shape)
        worst = max(worst, float(np.abs(got - want).max() / np.abs(want).max()))
    cm = (wd / "model.c").read_text().count('"coopmat"')
    return worst, f"{log.strip().splitlines()[-1]}; {cm} coopmat kernel(s)"


def dynamic_corpus(out, only, build=None):
    """Writes the dynamic corpus (dynamic_models()): each model.onnx, its
    inputs at each run (runK_input_I.npy) and onnxruntime's and torch's
    outputs (runK_ort_0.npy, runK_torch_0.npy), meta.json with the dims
    (their ONNX names and ranges) and each run's values; with build, runs
    each with kiln on this GPU. 1 when one fails."""
    failed = 0
    for name, make, specs, dims, runs in dynamic_models():
        if only and name not in only:
            continue
        module = make()
        d = Path(out) / name
        d.mkdir(parents=True, exist_ok=True)
        try:
            onnx_dims = dynamic_export(module, specs, dims, d / "model.onnx")
        except Exception as e:  # the exporter's failure, reported
            print(f"{name}: export failed: {type(e).__name__}: {str(e)[:1500]}", flush=True)
            failed += 1
            continue
        sess = ort.InferenceSession(str(d / "model.onnx"), providers=["CPUExecutionProvider"])
        steps, gap = [], 0.0
        for k, run in enumerate(runs):
            xs = dynamic_inputs(specs, run, 10 + k)
            want = np.asarray(sess.run(None, {f"x{i}": x for i, x in enumerate(xs)})[0],
                              np.float32)
            with torch.no_grad():
                t = module(*(torch.from_numpy(x) for x in xs)).numpy()
            gap = max(gap, float(np.abs(want - t).max()))
            for i, x in enumerate(xs):
                np.save(d / f"run{k}_input_{i}.npy", x)
            np.save(d / f"run{k}_ort_0.npy", want)
            np.save(d / f"run{k}_torch_0.npy", t)
            steps.append((run, xs, want))
        opset, ops = op_counts(d / "model.onnx")
        meta = {"model": f"{type(module).__name__} {name} (tiny config)", "exporter": "dynamo",
                "opset": opset, "dims": {onnx_dims[k]: list(v) for k, v in dims.items()},
                "runs": [{onnx_dims[k]: v for k, v in run.items()} for run in runs],
                "torch": torch.__version__, "onnx": onnx.__version__,
                "onnxruntime": ort.__version__, "date": datetime.date.today().isoformat(),
                "ort_vs_torch_max_abs": gap, "ops": ops}
        (d / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        print(f"{name}: dims {onnx_dims}, ort vs torch {gap:.3g}, ops {ops}", flush=True)
        if build:
            flags = [a for k, (lo, hi) in dims.items()
                     for a in ("--shape", f"{onnx_dims[k]}={lo}..{hi}")]
            for prec in ("f32", "f16"):
                with tempfile.TemporaryDirectory() as wd:
                    err, note = run_kiln_steps(Path(build), d / "model.onnx", flags, onnx_dims,
                                               steps, Path(wd), prec)
                bad = err is None or err > (1e-2 if prec == "f16" else 1e-4)
                failed += bad
                print(f"{name} {prec}: kiln on this GPU: "
                      f"{'FAIL' if bad else 'ok'} max |error| / max |ort| "
                      f"{err if err is None else f'{err:.3g}'} ({note})", flush=True)
    return 1 if failed else 0


PLAIN_MAX = 32
PLAIN_RUNS = [2, 17, 32]  # the smallest, a middle and the largest size, in run order


def plain_models():
    """(name, make, example shape, dynamic axis, dtype): transformers models
    as a user exports them, with nothing of the project's around them: the
    decoders as *ForCausalLM with use_cache=False (the logits), the encoders as their base model, and a ViT with
    a dynamic batch."""
    import transformers as tf
    small = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=64, max_position_embeddings=64)
    # a decoder for scoring or prompt processing: no cache (torch.export
    # cannot return transformers' DynamicCache without its pytree registered)
    gqa = dict(small, num_key_value_heads=2, use_cache=False)

    def make(cls, cfg):
        def build():
            torch.manual_seed(0)
            return cls(cfg).eval()
        return build
    ids = ((1, 8), "seq", np.int64)
    return [
        ("gpt2", make(tf.GPT2LMHeadModel, tf.GPT2Config(vocab_size=100, n_positions=64, n_embd=32,
                                                         n_layer=2, n_head=2, use_cache=False)),
         *ids),
        ("llama", make(tf.LlamaForCausalLM, tf.LlamaConfig(**gqa)), *ids),
        ("qwen2", make(tf.Qwen2ForCausalLM, tf.Qwen2Config(**gqa)), *ids),
        ("mistral", make(tf.MistralForCausalLM, tf.MistralConfig(**gqa, sliding_window=None)),
         *ids),
        ("phi3", make(tf.Phi3ForCausalLM, tf.Phi3Config(**gqa, pad_token_id=0)), *ids),
        ("gemma", make(tf.GemmaForCausalLM, tf.GemmaConfig(**gqa, head_dim=8)), *ids),
        ("bert", make(tf.BertModel, tf.BertConfig(**small)), *ids),
        ("roberta", make(tf.RobertaModel, tf.RobertaConfig(**dict(small, max_position_embeddings=80),
                                                           pad_token_id=1)), *ids),
        ("distilbert", make(tf.DistilBertModel, tf.DistilBertConfig(
            vocab_size=100, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
            max_position_embeddings=64)), *ids),
        ("vit", make(tf.ViTModel, tf.ViTConfig(hidden_size=32, num_hidden_layers=2,
                                               num_attention_heads=4, intermediate_size=64,
                                               image_size=32, patch_size=8)),
         (2, 3, 32, 32), "batch", np.float32),
    ]


def plain_corpus(out, only):
    """Writes tests/models/plain/NAME/: model.onnx exported by a plain
    torch.onnx.export(model, (x,), dynamo=True, dynamic_shapes=...) with
    one dynamic axis (the sequence, 2..32, or the batch, 1..4), and at each
    of three sizes runK_input_0.npy and every output of onnxruntime
    (runK_ort_J.npy); meta.json names the dim as the exporter did."""
    failed = 0
    for name, make, example, axis_name, dt in plain_models():
        if only and name not in only:
            continue
        d = Path(out) / name
        d.mkdir(parents=True, exist_ok=True)
        module = make()
        axis = 1 if axis_name == "seq" else 0
        lo, hi = (2, PLAIN_MAX) if axis_name == "seq" else (1, 4)
        runs = PLAIN_RUNS if axis_name == "seq" else [1, 3, 4]
        rng = np.random.default_rng(0)

        def inputs(n):
            shape = list(example)
            shape[axis] = n
            if dt == np.int64:
                return rng.integers(3, 100, size=shape).astype(dt)
            return rng.standard_normal(shape).astype(dt)
        try:
            with torch.no_grad():
                torch.onnx.export(module, (torch.from_numpy(inputs(example[axis])),),
                                  str(d / "model.onnx"), dynamo=True, external_data=False,
                                  dynamic_shapes=({axis: torch.export.Dim(axis_name, min=lo,
                                                                          max=hi)},))
        except Exception:  # the exporter's whole story: its last frames decide
            print(f"{name}: export failed:\n{traceback.format_exc()[-4000:]}", flush=True)
            failed += 1
            continue
        m = onnx.load(str(d / "model.onnx"))
        dim = m.graph.input[0].type.tensor_type.shape.dim[axis].dim_param
        sess = ort.InferenceSession(str(d / "model.onnx"), providers=["CPUExecutionProvider"])
        for k, n in enumerate(runs):
            x = inputs(n)
            np.save(d / f"run{k}_input_0.npy", x)
            for j, y in enumerate(sess.run(None, {sess.get_inputs()[0].name: x})):
                np.save(d / f"run{k}_ort_{j}.npy", y)
        opset, ops = op_counts(d / "model.onnx")
        meta = {"model": f"transformers {type(module).__name__} (tiny config)",
                "exporter": "dynamo, plain dynamic_shapes", "opset": opset,
                "dims": {dim: [lo, hi]}, "runs": [{dim: n} for n in runs],
                "outputs": [o.name for o in m.graph.output],
                "torch": torch.__version__, "onnx": onnx.__version__,
                "onnxruntime": ort.__version__, "date": datetime.date.today().isoformat(),
                "ops": ops}
        import transformers
        meta["transformers"] = transformers.__version__
        (d / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        print(f"{name}: dim {dim}, {len(m.graph.output)} outputs, opset {opset}", flush=True)
    return 1 if failed else 0


def transformers_model(name):
    """Full-size transformers models (random weights): bert-base, gpt2, vit-b16,
    and a Llama architecture of width 1024, 8 layers, grouped-query heads."""
    import transformers as tf
    torch.manual_seed(0)
    ids = [((1, 128), np.int64, 1000)]
    if name == "bert-base":
        return LastHidden(tf.BertModel(tf.BertConfig(), add_pooling_layer=False)), ids
    if name == "gpt2":
        return LastHidden(tf.GPT2Model(tf.GPT2Config())), ids
    if name == "vit-b16":
        return (LastHidden(tf.ViTModel(tf.ViTConfig(), add_pooling_layer=False), "pixel_values"),
                [((1, 3, 224, 224), np.float32, None)])
    if name == "llama-1024":
        cfg = tf.LlamaConfig(vocab_size=32000, hidden_size=1024, num_hidden_layers=8,
                             num_attention_heads=16, num_key_value_heads=4,
                             intermediate_size=2816)
        return LastHidden(tf.LlamaModel(cfg)), ids
    return None, None


def full_model(name):
    """(module, inputs, exports) of a full-size model: torchvision's (both
    exporters) or transformers' (the dynamo exporter at opsets 20 and 23)."""
    m, specs = transformers_model(name)
    if m is not None:
        return m.eval(), specs, [dynamo(20), dynamo(23)]
    torch.manual_seed(0)
    m = getattr(torchvision.models, name)(weights=None)
    return randomize_norms(m, 1).eval(), [((1, 3, 224, 224), np.float32, None)], EXPORTS


def make_inputs(specs, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, high, size=shape).astype(dt) if high else
            rng.standard_normal(shape).astype(dt) for shape, dt, high in specs]


def export(module, inputs, path, kw):
    """Exports module to path; returns (ort outputs, torch outputs). With
    qdq=True in kw, path is onnxruntime's QDQ quantization of the export,
    and onnxruntime runs it with its graph optimizations off: each Q and DQ
    node as written (optimized, it fuses them into integer kernels whose
    rounding differs); torch's outputs are then the float model's."""
    kw = dict(kw)
    qdq = kw.pop("qdq", False)
    args = tuple(torch.from_numpy(x) for x in inputs)
    target = path.with_suffix(".f32.onnx") if qdq else path
    torch.onnx.export(module, args, str(target), input_names=[f"x{i}" for i in range(len(args))],
                      **kw)
    if qdq:
        quantize_qdq(target, path, inputs)
        target.unlink()
    onnx.checker.check_model(str(path))
    with torch.no_grad():
        out = module(*args)
    outs_torch = [o.numpy() for o in (out if isinstance(out, (tuple, list)) else [out])]
    so = ort.SessionOptions()
    if qdq:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    feeds = {i.name: x for i, x in zip(sess.get_inputs(), inputs)}
    outs_ort = [np.asarray(o, np.float32) for o in sess.run(None, feeds)]
    return outs_ort, outs_torch


def op_counts(path):
    """{op_type (version): count} of the exported graph."""
    m = onnx.load(str(path))
    opset = {o.domain: o.version for o in m.opset_import}.get("", 0)
    counts = {}
    for n in m.graph.node:
        counts[n.op_type] = counts.get(n.op_type, 0) + 1
    return opset, dict(sorted(counts.items()))


def corpus(out, only, build=None, skip=None):
    """Writes the corpus; with build (a kiln build directory), also runs
    each model with kiln on this machine's GPU and prints the largest
    difference from onnxruntime; with skip (a directory), leaves out the
    exports that skip already holds. 1 when one is off or fails."""
    failed = 0
    for name, make, specs, exports in tiny_models():
        if only and name not in only:
            continue
        try:
            module = make()
        except Exception as e:  # a configuration this torch or transformers refuses
            print(f"{name}: cannot build: {type(e).__name__}: {str(e)[:800]}")
            continue
        inputs = make_inputs(specs)
        for how, kw in exports:
            d = Path(out) / f"{name}_{how}"
            if skip and (Path(skip) / d.name / "model.onnx").exists():
                continue
            d.mkdir(parents=True, exist_ok=True)
            try:
                ort_outs, torch_outs = export(module, inputs, d / "model.onnx", kw)
            except Exception as e:  # the exporter's failure, reported
                print(f"{d.name}: export failed: {type(e).__name__}: {str(e)[:800]}")
                for f in d.iterdir():
                    f.unlink()
                d.rmdir()
                continue
            for i, x in enumerate(inputs):
                np.save(d / f"input_{i}.npy", x)
            for i, (a, b) in enumerate(zip(ort_outs, torch_outs)):
                np.save(d / f"ort_{i}.npy", a)
                np.save(d / f"torch_{i}.npy", b)
            opset, ops = op_counts(d / "model.onnx")
            meta = {"model": f"{type(module).__name__} {name} (tiny config)",
                    "exporter": "dynamo" if kw["dynamo"] else "torchscript",
                    "opset": kw["opset_version"], "torch": torch.__version__,
                    "torchvision": torchvision.__version__, "onnx": onnx.__version__,
                    "onnxruntime": ort.__version__,
                    "date": datetime.date.today().isoformat(),
                    "ort_vs_torch_max_abs": max(float(np.abs(a - b).max())
                                                for a, b in zip(ort_outs, torch_outs))}
            if kw.get("qdq"):
                meta["quantized"] = ("onnxruntime quantize_static, QDQ, int8 weights per "
                                     "channel, uint8 activations; onnxruntime's outputs with "
                                     "graph optimizations off, torch's of the float model")
            (d / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
            print(f"{d.name}: {(d / 'model.onnx').stat().st_size} bytes, opset {opset}, "
                  f"ort vs torch {meta['ort_vs_torch_max_abs']:.3g}, ops {ops}", flush=True)
            if build:
                with tempfile.TemporaryDirectory() as wd:
                    got, note = run_kiln(Path(build), d / "model.onnx", inputs, ort_outs,
                                         Path(wd))
                if got is None:
                    print(f"{d.name}: kiln FAIL {note}", flush=True)
                    failed += 1
                    continue
                diffs = [(float(np.abs(g - a).max()),
                          bool((np.abs(g - a) > 1e-4 + 1e-3 * np.abs(a)).any()))
                         for g, a in zip(got, ort_outs)]
                failed += any(bad for _, bad in diffs)
                print(f"{d.name}: kiln on this GPU: max |kiln - ort| "
                      f"{max(m for m, _ in diffs):.3g}, "
                      f"{'FAIL' if any(b for _, b in diffs) else 'ok'} ({note})", flush=True)
    return 1 if failed else 0


def run_stored(dirs, build):
    """Runs stored corpus directories (model.onnx, input_N.npy, ort_N.npy)
    with kiln on this machine's GPU; 1 when one is off or fails."""
    failed = 0
    for d in map(Path, dirs):
        inputs = [np.load(p) for p in sorted(d.glob("input_*.npy"))]
        want = [np.load(p) for p in sorted(d.glob("ort_*.npy"))]
        with tempfile.TemporaryDirectory() as wd:
            got, note = run_kiln(Path(build), d / "model.onnx", inputs, want, Path(wd))
        if got is None:
            print(f"{d.name}: kiln FAIL {note}", flush=True)
            failed += 1
            continue
        diff = max(float(np.abs(g - a).max()) for g, a in zip(got, want))
        bad = any(bool((np.abs(g - a) > 1e-4 + 1e-3 * np.abs(a)).any())
                  for g, a in zip(got, want))
        failed += bad
        print(f"{d.name}: kiln on this GPU: max |kiln - ort| {diff:.3g}, "
              f"{'FAIL' if bad else 'ok'} ({note})", flush=True)
    return 1 if failed else 0


def sh(cmd, cwd=None):
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def run_kiln(build, model, inputs, outs_like, wd):
    """Compiles model with kiln, builds and runs it; returns (outputs, note)."""
    t0 = time.monotonic()
    rc, log = sh([build / "kiln", "compile", model, "--name", "model", "-o", wd / "model.c"])
    if rc:
        return None, f"kiln compile failed:\n{log[-3000:]}"
    compile_s = time.monotonic() - t0
    rc, log2 = sh([os.environ.get("CC", "cc"), "-O2", "-std=c99", "-I", ROOT / "runtime",
                   "-o", wd / "model", wd / "model.c", build / "run_model_test.o",
                   "-L", build, "-lkilnrt", os.environ.get("KILN_VULKAN_LIB", "-lvulkan"), "-lm"])
    if rc:
        return None, f"building the generated C failed:\n{log2[-3000:]}"
    args = [wd / "model", "-q"]
    for i, x in enumerate(inputs):
        x.tofile(wd / f"in{i}.bin")
        args += ["-i", wd / f"in{i}.bin"]
    for i in range(len(outs_like)):
        args += ["-o", wd / f"out{i}.bin"]
    rc, log3 = sh(args, cwd=wd)
    if rc:
        return None, f"the model failed ({rc}):\n{log3[-3000:]}"
    outs = [np.fromfile(wd / f"out{i}.bin", np.float32).reshape(o.shape)
            for i, o in enumerate(outs_like)]
    return outs, f"{log.strip().splitlines()[-1]}; compile {compile_s:.1f} s"


def check(models, build, out):
    failed = 0
    for name in models:
        module, specs, exports = full_model(name)
        inputs = make_inputs(specs)
        for how, kw in exports:
            wd = Path(out) / f"{name}_{how}"
            wd.mkdir(parents=True, exist_ok=True)
            try:
                ort_outs, torch_outs = export(module, inputs, wd / "model.onnx", kw)
            except Exception as e:  # an exporter failure is the exporter's, reported
                print(f"{name} {how}: export failed: {type(e).__name__}: {str(e)[:500]}")
                failed += 1
                continue
            got, note = run_kiln(Path(build), wd / "model.onnx", inputs, ort_outs, wd)
            if got is None:
                print(f"{name} {how}: FAIL {note}")
                failed += 1
                continue
            worst = []
            ok = True
            for g, a, b in zip(got, ort_outs, torch_outs):
                bad = np.abs(g - a) > 1e-4 + 1e-3 * np.abs(a)
                ok &= not bad.any()
                worst.append(f"max |kiln - ort| {np.abs(g - a).max():.3g}, "
                             f"|kiln - torch| {np.abs(g - b).max():.3g}, "
                             f"|ort - torch| {np.abs(a - b).max():.3g}, "
                             f"{int(bad.sum())} of {bad.size} off")
            failed += not ok
            print(f"{name} {how}: {'ok' if ok else 'FAIL'} {'; '.join(worst)} ({note})")
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("corpus")
    c.add_argument("--out", default=str(ROOT / "tests" / "models"))
    c.add_argument("only", nargs="*", help="the models to export (all by default)")
    c.add_argument("--kiln", help="a kiln build: also run each model on this GPU")
    c.add_argument("--skip-existing", metavar="DIR",
                   help="leave out the exports that DIR already holds")
    y = sub.add_parser("dynamic")
    y.add_argument("--out", default=str(ROOT / "tests" / "models" / "dynamic"))
    y.add_argument("only", nargs="*", help="the models to export (all by default)")
    y.add_argument("--kiln", help="a kiln build: also run each model on this GPU")
    p = sub.add_parser("plain")
    p.add_argument("--out", default=str(ROOT / "tests" / "models" / "plain"))
    p.add_argument("only", nargs="*", help="the models to export (all by default)")
    r = sub.add_parser("run")
    r.add_argument("dirs", nargs="+", help="stored corpus directories")
    r.add_argument("--kiln", default=str(ROOT / "build"))
    k = sub.add_parser("check")
    k.add_argument("models", nargs="+")
    k.add_argument("--kiln", default=str(ROOT / "build"))
    k.add_argument("--out", default=tempfile.mkdtemp(prefix="kiln-check-"))
    a = ap.parse_args()
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, "
          f"onnx {onnx.__version__}, onnxruntime {ort.__version__}", flush=True)
    if a.cmd == "corpus":
        return corpus(a.out, a.only, a.kiln, a.skip_existing)
    if a.cmd == "dynamic":
        return dynamic_corpus(a.out, a.only, a.kiln)
    if a.cmd == "plain":
        return plain_corpus(a.out, a.only)
    if a.cmd == "run":
        return run_stored(a.dirs, a.kiln)
    return check(a.models, a.kiln, a.out)


if __name__ == "__main__":
    sys.exit(main())
