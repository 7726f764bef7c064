"""fast_decoder.py: the strongest plain-PyTorch decoder a user would write,
for bench/llm.py's comparison (gpt-fast's recipe, written here from its
description, not copied):

  - the weights of transformers' LlamaForCausalLM, rearranged: q, k and v
    projections in one matrix, gate and up in one, f16;
  - a static key/value cache [layers, 1, kv heads, max length, head dim],
    written in place at the step's positions (index_copy_);
  - attention by F.scaled_dot_product_attention with grouped-query heads
    (enable_gqa) over the whole cache and a boolean causal mask row per
    position;
  - rotary embedding from tables computed once by the model's own
    rotary_emb (so the positions and scaling are transformers');
  - the one-token step under torch.compile(mode="reduce-overhead",
    fullgraph=True): Inductor's fused kernels replayed as a CUDA graph; the
    prompt under torch.compile's default mode (static shapes, no graph).

decode(prompt, new) returns the greedy ids, the prompt's latency and the
decoding tokens/s, timed as bench/llm.py times transformers (the prompt's
first token included in the prompt's time, the rest over the loop).
"""
import time

import torch
import torch.nn.functional as F


class FastLlama(torch.nn.Module):
    def __init__(self, hf, max_len):
        super().__init__()
        cfg = hf.config
        self.layers_n = cfg.num_hidden_layers
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.eps = cfg.rms_norm_eps
        m = hf.model
        dev, dt = "cuda", torch.float16

        def p(t):
            return torch.nn.Parameter(t.detach().to(dev, dt).contiguous(), requires_grad=False)
        self.embed = p(m.embed_tokens.weight)
        self.wqkv = torch.nn.ParameterList(
            [p(torch.cat([l.self_attn.q_proj.weight, l.self_attn.k_proj.weight,
                          l.self_attn.v_proj.weight])) for l in m.layers])
        self.wo = torch.nn.ParameterList([p(l.self_attn.o_proj.weight) for l in m.layers])
        self.wgu = torch.nn.ParameterList(
            [p(torch.cat([l.mlp.gate_proj.weight, l.mlp.up_proj.weight])) for l in m.layers])
        self.wdown = torch.nn.ParameterList([p(l.mlp.down_proj.weight) for l in m.layers])
        self.norm1 = torch.nn.ParameterList([p(l.input_layernorm.weight) for l in m.layers])
        self.norm2 = torch.nn.ParameterList(
            [p(l.post_attention_layernorm.weight) for l in m.layers])
        self.norm = p(m.norm.weight)
        self.head = p(hf.lm_head.weight)
        shape = (self.layers_n, 1, self.kv_heads, max_len, self.head_dim)
        self.register_buffer("k_cache", torch.zeros(shape, device=dev, dtype=dt))
        self.register_buffer("v_cache", torch.zeros(shape, device=dev, dtype=dt))
        pos = torch.arange(max_len, device=dev)[None]
        with torch.no_grad():
            cos, sin = m.rotary_emb(torch.zeros(1, device=dev, dtype=dt), pos)
        self.register_buffer("cos", cos[0].to(dt))  # [max_len, head_dim]
        self.register_buffer("sin", sin[0].to(dt))
        self.register_buffer("causal", torch.tril(torch.ones(max_len, max_len, dtype=torch.bool,
                                                             device=dev)))

    def rms(self, x, w):
        x32 = x.float()
        return w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)

    def rope(self, x, pos):  # x [1, heads, T, hd]
        cos, sin = self.cos[pos][None, None], self.sin[pos][None, None]
        half = x.shape[-1] // 2
        rot = torch.cat([-x[..., half:], x[..., :half]], -1)
        return x * cos + rot * sin

    def forward(self, ids, pos):  # ids [1, T], pos [T]: the logits of the last position
        T = ids.shape[1]
        H, KV, hd = self.heads, self.kv_heads, self.head_dim
        x = F.embedding(ids, self.embed)
        mask = self.causal[pos][None, None]  # [1, 1, T, max_len]
        for i in range(self.layers_n):
            h = self.rms(x, self.norm1[i])
            q, k, v = F.linear(h, self.wqkv[i]).split([H * hd, KV * hd, KV * hd], -1)
            q = self.rope(q.view(1, T, H, hd).transpose(1, 2), pos)
            k = self.rope(k.view(1, T, KV, hd).transpose(1, 2), pos)
            v = v.view(1, T, KV, hd).transpose(1, 2)
            kc, vc = self.k_cache[i], self.v_cache[i]
            kc.index_copy_(2, pos, k)
            vc.index_copy_(2, pos, v)
            a = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask, enable_gqa=True)
            x = x + F.linear(a.transpose(1, 2).reshape(1, T, H * hd), self.wo[i])
            g, u = F.linear(self.rms(x, self.norm2[i]), self.wgu[i]).chunk(2, -1)
            x = x + F.linear(F.silu(g) * u, self.wdown[i])
        return F.linear(self.rms(x[:, -1:], self.norm), self.head)[0, -1]


def matmul_weight_bytes(fast):
    """The bytes of the weights one token's products read (all but the
    embedding table; the head included), f16."""
    return 2 * sum(t.numel() for name, t in fast.named_parameters() if name != "embed")


def decode(hf, prompt, new):
    """Greedy decoding of `new` tokens after `prompt` (numpy [1, P]); the
    model's weights are copied, the transformers model is left as it was.
    Returns {"ids", "prompt_ms", "tokens_s", "compile_s", "weights_gbs"}."""
    P = prompt.shape[1]
    fast = FastLlama(hf, P + new).eval()
    t0 = time.perf_counter()
    prefill = torch.compile(fast, fullgraph=True)
    step = torch.compile(fast, mode="reduce-overhead", fullgraph=True)
    ids = torch.from_numpy(prompt).cuda()
    ppos = torch.arange(P, device="cuda")
    tok = torch.zeros(1, 1, dtype=torch.long, device="cuda")
    spos = torch.zeros(1, dtype=torch.long, device="cuda")

    def run():
        fast.k_cache.zero_()
        fast.v_cache.zero_()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = [int(prefill(ids, ppos).argmax())]
        t1 = time.perf_counter()
        for k in range(1, new):
            tok.fill_(out[-1])
            spos.fill_(P + k - 1)
            out.append(int(step(tok, spos).argmax()))
        t2 = time.perf_counter()
        return out, t1 - t0, t2 - t1

    with torch.no_grad():
        run()  # compiles both, records the step's graph
        compile_s = time.perf_counter() - t0
        out, tp, td = run()
    wbytes = matmul_weight_bytes(fast)
    prefill = step = fast = None
    torch._dynamo.reset()  # its graphs and their memory go
    tps = (new - 1) / td
    return {"ids": out, "prompt_ms": tp * 1e3, "tokens_s": tps, "compile_s": compile_s,
            "weight_bytes": wbytes, "weights_gbs": wbytes * tps / 1e9}
