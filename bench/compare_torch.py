#!/usr/bin/env python3
"""dpsampling vs the torch.distributed path, in one run, on the same GPUs.

For every shape it times, as CUDA-graph replays measured with CUDA events after
warm-up (the slowest rank counts):

  swap (pad_bs x N x V, logits [pad_bs*N, V/tp] -> [pad_bs/tp*N, V]):
    torch      all_to_all_single + the permute copy (upstream's nccl path:
               out = recv.view(tp, reqs*N, v_local).permute(1, 0, 2).reshape(reqs*N, V))
    torch_a2a  all_to_all_single alone (the floor of that path)
    nccl       dpsampling.DpSamplingComm(backend="nccl").swap_batch_vocab
    onesided   dpsampling.DpSamplingComm(backend="onesided").swap_batch_vocab
  gather (gather_verify_outputs, int32 predict/accept_index [reqs, N] + accept_length [reqs]):
    torch      pack -> all_gather_into_tensor -> unpack copies
  logprobs (gather_verify_logprobs, fp32 [reqs, N]):
    torch      all_gather_into_tensor
  argmax / topk (rows x V; every rank holds the [rows, V/tp] shard; k = 64):
    torch      torch.argmax / torch.topk on the full [rows, V] row (what an
               engine without vocab-sharded selection runs after a swap)
    torch_a2a  (column "a2a") the swap (dpsampling onesided, else nccl) of the
               shards + torch.argmax / torch.topk on the swapped [rows/tp, V]
    nccl, onesided  DpSamplingComm.argmax / .topk on the shard
  argmax/topk run at any world size, 1 included.
  sample (rows x V, every rank holds the [rows, V/tp] shard; per-row parameters
  as 1-D CUDA tensors; rows like an LLM's logits: N(0, 2.5^2) plus 1-4 head
  tokens at 10..20, or all equal for p_flat):
    read       torch amax over the shard (the read time of the logits)
    torch      the vLLM V1 sampler on the full [rows, V] row: fp32 logits,
               raw log_softmax for the logprob cases, / temperature, min-p
               (probs < min_p * max prob -> -inf), apply_top_k_top_p (sort,
               top-k mask, softmax + cumsum top-p mask, scatter back),
               softmax, the exponential race probs / q.exponential_() argmax
    torch_mn   the same with torch.multinomial(probs, 1) for the draw
    gather     (world > 1) all_gather of the shards + permute + torch
    nccl, onesided  DpSamplingComm.sample on the shard
  cases: t (T 0.7), t_lp (+ logprobs), kp (top-k 50 + top-p 0.9, T 0.7), kp_lp,
  p (top-p 0.9, T 0.7), p_flat (the same on all-equal rows), minp (min-p 0.1,
  T 0.7); speedup = torch / dpsampling. The draws are random, so the check is
  by rule, not by value (see check_sample).
  verify (pad_bs x N x V, rows = pad_bs*N, every rank holds the [rows, V/tp]
  shard; per-request parameters as 1-D CUDA tensors [pad_bs]; rows as sample's;
  drafts from dpsampling's own draws, half the chains fully matched):
    torch      the upstream path: DpSamplingComm.swap_batch_vocab (the first of
               --backends' communicators) -> the torch chain verify on the
               full rows of this rank's requests -> gather_verify_outputs
               (+ gather_verify_logprobs for _lp); the torch chain verify:
               greedy torch.argmax, else the vLLM V1 sampler above per row
               (exponential race), then the walk vectorized on the device
               (no host sync)
    local      the torch chain verify alone on the full rows (no swap, no
               gather: the floor of that path, what tp = 1 needs)
    nccl, onesided  DpSamplingComm.verify_chain on the shard
  cases: greedy (T 0), t (T 0.7), kp (top-k 50 + top-p 0.9, T 0.7), kp_lp
  (+ logprobs); speedup = torch / dpsampling. dpsampling's outputs must equal
  the host walk over DpSamplingComm.sample's tokens of the same rows (request
  b's parameters, offset[b] + j at position j); every path's outputs must be a
  valid chain (see check_chain), greedy ones exactly the argmax's.

Every result is checked: after the eager warm-up (step 1 inputs) and after the
graph replays (step 2 inputs written into the captured input buffers), the
outputs of every path must equal the reference built independently on each
rank, bit for bit. Any difference -> exit status 1.

Run (self-spawning, one process per GPU):
    PYTHONPATH=build/python python3 bench/compare_torch.py
or under torchrun:
    PYTHONPATH=build/python torchrun --nproc-per-node 2 bench/compare_torch.py
"""

import argparse
import datetime
import gc
import math
import os
import socket
import sys
import traceback

TARGET_SHAPE = (256, 4, 152064, "bf16")

DEFAULT_SWAP = "8x1x64:bf16,8x1x64:fp32,64x1x152064,64x4x152064,256x4x152064,512x4x129280,8x1x129280,128x2x152064"
DEFAULT_GATHER = "8x1,64x1,256x1,512x1,8x4,64x4,256x4,512x4,8x8,64x8,256x8,512x8"
DEFAULT_SELECT = "8x64640,64x76032,256x76032,1024x76032"
DEFAULT_SAMPLE = "8x129280,64x129280,1024x129280,8x152064,64x152064,1024x152064"
DEFAULT_VERIFY = "8x4x152064,64x4x152064,256x4x152064"
TOPK_K = 64

# name: (temperature, top_k, top_p, min_p, flat rows, logprobs)
SAMPLE_CASES = {
    "t": (0.7, None, None, None, False, False),
    "t_lp": (0.7, None, None, None, False, True),
    "kp": (0.7, 50, 0.9, None, False, False),
    "kp_lp": (0.7, 50, 0.9, None, False, True),
    "p": (0.7, None, 0.9, None, False, False),
    "p_flat": (0.7, None, 0.9, None, True, False),
    "minp": (0.7, None, None, 0.1, False, False),
}

# name: (temperature, top_k, top_p, logprobs)
VERIFY_CASES = {
    "greedy": (0.0, None, None, False),
    "t": (0.7, None, None, False),
    "kp": (0.7, 50, 0.9, False),
    "kp_lp": (0.7, 50, 0.9, True),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", type=int, default=0, help="ranks / GPUs (default: all visible GPUs)")
    p.add_argument("--ops", default="swap,gather,logprobs",
                   help="comma list of swap,gather,logprobs,argmax,topk,sample,verify")
    p.add_argument("--backends", default="nccl,onesided", help="dpsampling backends to time")
    p.add_argument("--swap-shapes", default=DEFAULT_SWAP, help="PADxNxV[:dtype] comma list (dtype default --dtype)")
    p.add_argument("--gather-shapes", default=DEFAULT_GATHER, help="PADxN comma list")
    p.add_argument("--select-shapes", default=DEFAULT_SELECT, help="ROWSxV comma list (argmax, topk)")
    p.add_argument("--sample-shapes", default=DEFAULT_SAMPLE, help="ROWSxV comma list (sample)")
    p.add_argument("--sample-cases", default=",".join(SAMPLE_CASES),
                   help="comma list of " + ",".join(SAMPLE_CASES))
    p.add_argument("--verify-shapes", default=DEFAULT_VERIFY,
                   help="PADxNxV[:dtype] comma list (verify; dtype default bf16)")
    p.add_argument("--verify-cases", default="greedy,kp",
                   help="comma list of " + ",".join(VERIFY_CASES))
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--warmup", type=int, default=5, help="eager calls before capture")
    p.add_argument("--iters", type=int, default=20, help="calls captured into one graph")
    p.add_argument("--replays", type=int, default=10, help="timed graph replays")
    p.add_argument("--target", type=float, default=1.05, help="max dpsampling nccl / torch ratio at 256x4x152064 bf16")
    p.add_argument("--enforce-target", action="store_true", help="exit 3 when the target ratio is missed")
    p.add_argument("--timeout-s", type=int, default=600, help="NCCL process-group timeout")
    return p.parse_args(argv)


def parse_swap_shapes(text, default_dtype, what="swap"):
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        dt = default_dtype
        if ":" in item:
            item, dt = item.split(":", 1)
        dims = [int(x) for x in item.lower().split("x")]
        if len(dims) != 3 or min(dims) < 1 or dt not in ("bf16", "fp16", "fp32"):
            raise SystemExit(f"compare_torch.py: bad {what} shape {item!r} (want PADxNxV[:bf16|fp16|fp32])")
        out.append((dims[0], dims[1], dims[2], dt))
    return out


def parse_gather_shapes(text):
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        dims = [int(x) for x in item.lower().split("x")]
        if len(dims) != 2 or min(dims) < 1:
            raise SystemExit(f"compare_torch.py: bad gather shape {item!r} (want PADxN)")
        out.append((dims[0], dims[1]))
    return out


# --------------------------------------------------------------------------
# Worker side


class Ctx:
    pass


def _torch_dtype(torch, name):
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def _time_graph(ctx, fn):
    """Eager warm-up (returns the last eager output), capture ctx.iters calls, and
    return a function that replays (timed) and gives (us_per_call_max_over_ranks, out)."""
    torch, dist = ctx.torch, ctx.dist
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    out = None
    with torch.cuda.stream(side):
        for _ in range(max(1, ctx.warmup)):
            out = fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    eager_out = _clone(torch, out)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(ctx.iters):
            gout = fn()
    torch.cuda.synchronize()

    def replay():
        torch.cuda.synchronize()
        dist.barrier()
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        graph.replay()  # untimed: aligns the ranks on the device
        start.record()
        for _ in range(ctx.replays):
            graph.replay()
        end.record()
        end.synchronize()
        us = start.elapsed_time(end) * 1e3 / (ctx.iters * ctx.replays)
        t = torch.tensor([us], dtype=torch.float64, device=ctx.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item()), gout

    return eager_out, replay, graph


def _clone(torch, out):
    if isinstance(out, (tuple, list)):
        return tuple(o.clone() for o in out)
    return out.clone()


def _count_wrong(torch, got, want):
    if isinstance(want, (tuple, list)):
        return sum(_count_wrong(torch, g, w) for g, w in zip(got, want))
    if tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
        return max(1, want.numel())
    # bitwise equality (NaN-safe): compare the raw bits
    gb = got.contiguous().view(torch.uint8)
    wb = want.contiguous().view(torch.uint8)
    return int((gb != wb).sum().item())


def _sum_over_ranks(ctx, n):
    t = ctx.torch.tensor([n], dtype=ctx.torch.int64, device=ctx.device)
    ctx.dist.all_reduce(t)
    return int(t.item())


def _destroy(comm):
    for name in ("destroy", "close", "shutdown"):
        f = getattr(comm, name, None)
        if callable(f):
            f()
            return


class CommCache:
    """One DpSamplingComm per backend, kept while consecutive cases share its key.
    Destruction happens at the same program point on every rank (collective)."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.slots = {}

    def get(self, backend, key, max_pad_bs, n, vocab, dtype):
        cur = self.slots.get(backend)
        if cur is not None and cur[0] == key:
            return cur[1]
        if cur is not None:
            _destroy(cur[1])
            self.slots[backend] = None
            del cur
            gc.collect()
        ctx = self.ctx
        comm = ctx.dps.DpSamplingComm(
            tp_size=ctx.world,
            rank=ctx.rank,
            group=tuple(range(ctx.world)),
            max_pad_bs=max_pad_bs,
            num_tokens_per_req=n,
            vocab_size=vocab,
            logits_dtype=dtype,
            backend=backend,
        )
        got = getattr(comm, "backend", backend)
        if got != backend:
            raise RuntimeError(f"DpSamplingComm(backend={backend!r}) resolved to {got!r}")
        self.slots[backend] = (key, comm)
        return comm

    def clear(self):
        for b in list(self.slots):
            if self.slots[b] is not None:
                _destroy(self.slots[b][1])
            self.slots[b] = None
        gc.collect()


def _swap_local(ctx, src, step, rows, v_local, dtype, salt):
    torch = ctx.torch
    g = torch.Generator(device=ctx.device)
    g.manual_seed(1_000_003 * step + 7919 * src + salt)
    x = torch.randn(rows, v_local, generator=g, device=ctx.device, dtype=torch.float32)
    return x.to(dtype)


def run_swap(ctx, shape, comms, rows_out):
    torch, dist = ctx.torch, ctx.dist
    pad_bs, n, vocab, dt = shape
    tp, rank = ctx.world, ctx.rank
    dtype = _torch_dtype(torch, dt)
    reqs, v_local = pad_bs // tp, vocab // tp
    salt = (pad_bs * 131 + n * 17 + vocab) % 1_000_000

    def expected(step):
        parts = [
            _swap_local(ctx, src, step, pad_bs * n, v_local, dtype, salt)[rank * reqs * n:(rank + 1) * reqs * n]
            for src in range(tp)
        ]
        return torch.cat(parts, dim=1).contiguous()

    local = _swap_local(ctx, rank, 1, pad_bs * n, v_local, dtype, salt).contiguous()
    step2 = _swap_local(ctx, rank, 2, pad_bs * n, v_local, dtype, salt)
    want1, want2 = expected(1), expected(2)

    def torch_swap():
        recv = torch.empty_like(local)
        dist.all_to_all_single(recv, local)
        return recv.view(tp, reqs * n, v_local).permute(1, 0, 2).reshape(reqs * n, vocab)

    def torch_a2a():
        recv = torch.empty_like(local)
        dist.all_to_all_single(recv, local)
        return recv

    paths = [("torch", torch_swap), ("torch_a2a", torch_a2a)]
    for b in ctx.backends:
        comm = comms.get(b, ("swap", n, vocab, dt), ctx.swap_max_bs[(n, vocab, dt)], n, vocab, dtype)
        paths.append((b, (lambda c=comm: c.swap_batch_vocab(local, pad_bs=pad_bs))))

    # Capture everything on step-1 inputs, then write step 2 into the captured
    # input buffer: the replays must read it.
    prepared = []
    for name, fn in paths:
        eager_out, replay, graph = _time_graph(ctx, fn)
        wrong = 0
        if name != "torch_a2a":
            wrong += _count_wrong(torch, eager_out, want1)
        prepared.append((name, replay, graph, wrong))
    local.copy_(step2)
    torch.cuda.synchronize()

    res = {}
    for name, replay, graph, wrong in prepared:
        us, out = replay()
        if name != "torch_a2a":
            wrong += _count_wrong(torch, out, want2)
        res[name] = (us, _sum_over_ranks(ctx, wrong))
    del prepared
    rows_out.append(("swap", f"{pad_bs}x{n}x{vocab}", dt, (tp - 1) * reqs * n * v_local * local.element_size(), res))


def run_gather(ctx, shape, comms, rows_out, which):
    torch, dist = ctx.torch, ctx.dist
    pad_bs, n = shape
    tp, rank = ctx.world, ctx.rank
    reqs = pad_bs // tp
    dev = ctx.device

    def inputs(step):
        base = torch.arange(pad_bs * n, dtype=torch.int32, device=dev).view(pad_bs, n)
        predict = base * 3 + step
        accept_index = base * 2 + 1 + step
        accept_length = torch.arange(pad_bs, dtype=torch.int32, device=dev) * 5 + step
        logprobs = (base.to(torch.float32) * 0.25 - step).contiguous()
        return predict, accept_index, accept_length, logprobs

    full1, full2 = inputs(1), inputs(2)
    sl = slice(rank * reqs, (rank + 1) * reqs)
    p_in, ai_in, al_in, lp_in = (t[sl].contiguous() for t in full1)

    if which == "gather":
        want1, want2 = full1[:3], full2[:3]

        def torch_fn():
            packed = torch.cat([p_in, ai_in, al_in.unsqueeze(1)], dim=1)
            gathered = torch.empty(pad_bs, 2 * n + 1, dtype=torch.int32, device=dev)
            dist.all_gather_into_tensor(gathered, packed)
            return (gathered[:, :n].contiguous(), gathered[:, n:2 * n].contiguous(), gathered[:, 2 * n].contiguous())

        def dps_fn(c):
            return tuple(c.gather_verify_outputs(p_in, ai_in, al_in, pad_bs=pad_bs))

        nbytes = (tp - 1) * reqs * (2 * n + 1) * 4
    else:
        want1, want2 = full1[3], full2[3]

        def torch_fn():
            out = torch.empty(pad_bs, n, dtype=torch.float32, device=dev)
            dist.all_gather_into_tensor(out, lp_in)
            return out

        def dps_fn(c):
            return c.gather_verify_logprobs(lp_in, pad_bs=pad_bs)

        nbytes = (tp - 1) * reqs * n * 4

    paths = [("torch", torch_fn)]
    for b in ctx.backends:
        comm = comms.get(b, ("verify", n), ctx.gather_max_bs[n], n, tp, ctx.torch.bfloat16)
        paths.append((b, (lambda c=comm: dps_fn(c))))

    prepared = []
    for name, fn in paths:
        eager_out, replay, graph = _time_graph(ctx, fn)
        prepared.append((name, replay, graph, _count_wrong(torch, eager_out, want1)))
    for dst, src in zip((p_in, ai_in, al_in, lp_in), full2):
        dst.copy_(src[sl])
    torch.cuda.synchronize()
    res = {}
    for name, replay, graph, wrong in prepared:
        us, out = replay()
        wrong += _count_wrong(torch, out, want2)
        res[name] = (us, _sum_over_ranks(ctx, wrong))
    del prepared
    rows_out.append((which, f"{pad_bs}x{n}", "int32" if which == "gather" else "fp32", nbytes, res))


def run_select(ctx, shape, rows_out, which):
    """argmax / topk: dpsampling on the shard vs torch on the full row and vs
    swap + torch. Values checked against torch's argmax / topk values."""
    torch = ctx.torch
    rows, vocab = shape
    tp, rank = ctx.world, ctx.rank
    vl = vocab // tp
    dt = torch.bfloat16

    def full(step):
        g = torch.Generator(device=ctx.device).manual_seed(1000 + step)
        return torch.randn(rows, vocab, device=ctx.device, generator=g).to(dt)

    x_full = full(1)
    shard = x_full[:, rank * vl:(rank + 1) * vl].contiguous()
    res = {}

    def want_of(x):
        if which == "argmax":
            return x.float().amax(dim=-1)
        return torch.topk(x.float(), TOPK_K, dim=-1).values

    def wrong_of(got_vals, x):
        return int((got_vals.float() != want_of(x)).sum().item())

    def torch_full():
        if which == "argmax":
            i = torch.argmax(x_full, dim=-1)
            return x_full.gather(1, i[:, None])[:, 0]
        return torch.topk(x_full, TOPK_K, dim=-1).values

    eager, replay, graph = _time_graph(ctx, torch_full)
    us, gout = replay()
    res["torch"] = (us, wrong_of(gout, x_full))
    del graph

    swap_b = "onesided" if "onesided" in ctx.backends else "nccl"
    if rows % tp == 0:
        comm = ctx.dps.DpSamplingComm(tp_size=tp, rank=rank, group=tuple(range(tp)),
                                      max_pad_bs=rows, num_tokens_per_req=1, vocab_size=vocab,
                                      logits_dtype=dt, backend=swap_b)
        mine = slice(rank * (rows // tp), (rank + 1) * (rows // tp))

        def swap_then():
            full_rows = comm.swap_batch_vocab(shard, pad_bs=rows)
            if which == "argmax":
                i = torch.argmax(full_rows, dim=-1)
                return full_rows.gather(1, i[:, None])[:, 0]
            return torch.topk(full_rows, TOPK_K, dim=-1).values

        eager, replay, graph = _time_graph(ctx, swap_then)
        us, gout = replay()
        res["torch_a2a"] = (us, wrong_of(gout, x_full[mine]))
        del graph
        _destroy(comm)
    for b in ctx.backends:
        comm = ctx.dps.DpSamplingComm(tp_size=tp, rank=rank, group=tuple(range(tp)),
                                      max_pad_bs=rows, num_tokens_per_req=1, vocab_size=vocab,
                                      logits_dtype=dt, backend=b)

        def dps():
            if which == "argmax":
                return comm.argmax(shard)[0]  # (values, indices)
            return comm.topk(shard, TOPK_K)[0]

        eager, replay, graph = _time_graph(ctx, dps)
        us, gout = replay()
        res[b] = (us, wrong_of(gout, x_full) + wrong_of(eager, x_full))
        del graph
        _destroy(comm)
    gc.collect()
    rows_out.append((which, f"{rows}x{vocab}", "bf16", rows * vl * 2, res))


def _sample_logits(ctx, rows, vocab, flat):
    """Rows like an LLM's logits (the same on every rank): N(0, 2.5^2) and 1-4
    head tokens at 10..20 at random columns; flat: every logit 1."""
    torch = ctx.torch
    dev = ctx.device
    if flat:
        return torch.ones(rows, vocab, device=dev, dtype=torch.bfloat16)
    g = torch.Generator(device=dev).manual_seed(7001 + rows * 31 + vocab)
    x = torch.randn(rows, vocab, generator=g, device=dev) * 2.5
    nh = torch.randint(1, 5, (rows, 1), generator=g, device=dev)
    pos = torch.randint(0, vocab, (rows, 4), generator=g, device=dev)
    val = 10.0 + 10.0 * torch.rand(rows, 4, generator=g, device=dev)
    val = torch.where(torch.arange(4, device=dev)[None, :] < nh, val, torch.full_like(val, -float("inf")))
    x.scatter_reduce_(1, pos, val, reduce="amax")
    return x.to(torch.bfloat16)


def _apply_top_k_top_p(torch, logits, k, p):
    """vLLM V1's apply_top_k_top_p (sort-based; ties at the k-th value kept)."""
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
    if k is not None:
        top_k_mask = logits_sort.size(1) - k.to(torch.long)
        top_k_mask = logits_sort.gather(1, top_k_mask.unsqueeze(dim=1))
        top_k_mask = logits_sort < top_k_mask
        logits_sort.masked_fill_(top_k_mask, -float("inf"))
    if p is not None:
        probs_sort = logits_sort.softmax(dim=-1)
        probs_sum = torch.cumsum(probs_sort, dim=-1, out=probs_sort)
        top_p_mask = probs_sum <= 1 - p.unsqueeze(dim=1)
        top_p_mask[:, -1] = False
        logits_sort.masked_fill_(top_p_mask, -float("inf"))
    return logits_sort.scatter(dim=-1, index=logits_idx, src=logits_sort)


def _torch_sample(torch, x, temp, k, p, min_p, want_lp, multinomial):
    """The vLLM V1 sampler on the full rows x (no per-request generators)."""
    logits = x.to(torch.float32, copy=True)  # fp32 rows too: the steps below work in place
    lp = logits.log_softmax(dim=-1) if want_lp else None  # raw logprobs, before processing
    logits = logits.div_(temp.unsqueeze(1))
    if min_p is not None:
        probs = logits.softmax(dim=-1)
        keep = probs >= probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)
        logits = logits.masked_fill_(~keep, -float("inf"))
    if k is not None or p is not None:
        logits = _apply_top_k_top_p(torch, logits, k, p)
    probs = logits.softmax(dim=-1, dtype=torch.float32)
    if multinomial:
        tok = torch.multinomial(probs, 1).view(-1)
    else:
        q = torch.empty_like(probs).exponential_()
        tok = probs.div_(q).argmax(dim=-1).view(-1)
    if want_lp:
        return tok, lp.gather(1, tok[:, None])[:, 0]
    return tok


def check_sample(torch, x_f, spec, toks, lps=None, dps=False):
    """Rows breaking a rule: token outside [0, V); top-k: below the 50th value;
    min-p: (l - l_max)/T < log(min_p); p_flat (dpsampling only, whose order cuts
    ties by index): past the first ceil(0.9 V) indices; logprobs: off the
    fp32 log_softmax by more than 1e-3 max(1, |want|)."""
    temp, k, p, min_p, flat, want_lp = spec
    V = x_f.shape[1]
    tok = toks.view(-1).long()
    bad = (tok < 0) | (tok >= V)
    t = tok.clamp(0, V - 1)
    val = x_f.gather(1, t[:, None])[:, 0]
    if k is not None:
        bad |= val < torch.topk(x_f, k, dim=-1).values[:, -1]
    if min_p is not None:
        bad |= (val - x_f.amax(dim=-1)) / temp < math.log(min_p) - 1e-4
    if dps and flat and p is not None:
        bad |= tok >= math.ceil(p * V)
    if lps is not None:
        want = x_f.log_softmax(dim=-1).gather(1, t[:, None])[:, 0]
        bad |= ~((lps.float() - want).abs() <= 1e-3 * want.abs().clamp(min=1.0))
    return int(bad.sum().item())


def shape_comms(ctx, max_pad_bs, n, vocab, dtype, method):
    """One DpSamplingComm per backend for the cases of one shape; `method`
    must exist on it."""
    comms = {}
    for b in ctx.backends:
        comms[b] = ctx.dps.DpSamplingComm(tp_size=ctx.world, rank=ctx.rank, group=tuple(range(ctx.world)),
                                          max_pad_bs=max_pad_bs, num_tokens_per_req=n, vocab_size=vocab,
                                          logits_dtype=dtype, backend=b)
        if not hasattr(comms[b], method):
            raise SystemExit(f"compare_torch.py: this dpsampling has no DpSamplingComm.{method}")
    return comms


def destroy_comms(comms):
    for c in comms.values():
        _destroy(c)
    comms.clear()
    gc.collect()


def run_sample(ctx, shape, case, rows_out, comms):
    """One sample case on rows x V: torch's samplers on the full row vs
    DpSamplingComm.sample on the shard (same inputs, parameters as tensors)."""
    torch, dist = ctx.torch, ctx.dist
    rows, vocab = shape
    tp, rank, dev = ctx.world, ctx.rank, ctx.device
    vl = vocab // tp
    spec = SAMPLE_CASES[case]
    temp_v, k_v, p_v, minp_v, flat, want_lp = spec
    x_full = _sample_logits(ctx, rows, vocab, flat)
    shard = x_full[:, rank * vl:(rank + 1) * vl].contiguous()
    x_f = x_full.float()
    temp = torch.full((rows,), temp_v, dtype=torch.float32, device=dev)
    k = torch.full((rows,), k_v, dtype=torch.int32, device=dev) if k_v is not None else None
    p = torch.full((rows,), p_v, dtype=torch.float32, device=dev) if p_v is not None else None
    min_p = torch.full((rows,), minp_v, dtype=torch.float32, device=dev) if minp_v is not None else None
    g = torch.Generator(device=dev).manual_seed(4242)
    seed = torch.randint(-2**62, 2**62, (rows,), generator=g, device=dev, dtype=torch.int64)
    offset = torch.arange(rows, dtype=torch.int64, device=dev) + 1000
    res = {}

    def timed(name, fn, dps=False, check=True):
        eager, replay, graph = _time_graph(ctx, fn)
        us, gout = replay()
        outs = [eager, gout] if check else []
        wrong = 0
        for o in outs:
            tok, lp = (o[0], o[1]) if isinstance(o, tuple) else (o, None)
            wrong += check_sample(torch, x_f, spec, tok, lp if want_lp else None, dps)
        if dps:  # same inputs, same seeds and offsets: the same tokens on every call
            e_tok = eager[0] if isinstance(eager, tuple) else eager
            g_tok = gout[0] if isinstance(gout, tuple) else gout
            wrong += int((e_tok.view(-1) != g_tok.view(-1)).sum().item())
        res[name] = (us, _sum_over_ranks(ctx, wrong))
        del graph

    timed("read", lambda: shard.amax(dim=-1), check=False)
    timed("torch", lambda: _torch_sample(torch, x_full, temp, k, p, min_p, want_lp, False))
    try:
        timed("torch_mn", lambda: _torch_sample(torch, x_full, temp, k, p, min_p, want_lp, True))
    except RuntimeError as e:  # e.g. a torch whose multinomial cannot be captured
        torch.cuda.synchronize()
        if rank == 0:
            print(f"#   torch_mn unavailable: {str(e).splitlines()[0]}")
    if tp > 1:
        def gather_then():
            buf = torch.empty(tp * rows, vl, dtype=shard.dtype, device=dev)
            dist.all_gather_into_tensor(buf, shard)
            full_rows = buf.view(tp, rows, vl).permute(1, 0, 2).reshape(rows, vocab)
            return _torch_sample(torch, full_rows, temp, k, p, min_p, want_lp, False)

        timed("gather", gather_then)
    for b in ctx.backends:
        def dps(c=comms[b]):
            return c.sample(shard, temperature=temp, seed=seed, offset=offset, top_k=k, top_p=p,
                            min_p=min_p, return_logprobs=want_lp)

        timed(b, dps, dps=True)
    gc.collect()
    rows_out.append(("sample", f"{rows}x{vocab}", case, rows * vl * 2, res))


_sample_header_printed = [False]


def print_sample_row(row, backends):
    _, shape, case, nbytes, res = row
    extra = [n for n in ("torch_mn", "gather") if n in res]
    if not _sample_header_printed[0]:
        cols = "".join(f" {n + '(us)':>13}" for n in ("torch_mn", "gather") if n in res)
        cols += "".join(f" {b + '(us)':>14} {'x' + b:>10}" for b in backends)
        print(f"# {'sample':>8} {'shape':>12} {'case':>6} {'read(us)':>9} {'torch(us)':>10}{cols} {'#wrong':>7}"
              f"   (read: amax over the shard; x: speedup = torch / dpsampling)")
        _sample_header_printed[0] = True
    t = res["torch"][0]
    cols = "".join(f" {res[n][0]:13.2f}" for n in extra)
    for b in backends:
        us = res[b][0]
        cols += f" {us:14.2f} {t / us:10.2f}"
    wrong = sum(w for _, w in res.values())
    print(f"  {'sample':>8} {shape:>12} {case:>6} {res['read'][0]:9.2f} {t:10.2f}{cols} {wrong:7d}")
    if wrong:
        print("#   ^ WRONG: " + ", ".join(f"{k}: {w}" for k, (_, w) in res.items() if w))
    sys.stdout.flush()


def _torch_chain(torch, tok, cand, n, first_req, lp=None):
    """The chain walk of docs/sampling.md on the device, vectorized (no host
    sync): tok int64 [reqs*n] (the token of every row), cand int32 [reqs, n],
    requests first_req.. -> (predict, accept_index int32 [reqs, n],
    accept_length int32 [reqs][, logprobs fp32 [reqs, n]])."""
    t = tok.view(-1, n)
    reqs, dev = t.shape[0], t.device
    # draft i (1..n-1) is accepted while it equals the token of position i-1
    run = (cand[:, 1:].long() == t[:, :-1]).int().cumprod(dim=1)
    acc = run.sum(dim=1)  # [reqs]: the accepted drafts
    pos = torch.arange(n, device=dev)
    keep = pos[None, :] <= acc[:, None]  # positions 0..acc: the accepted tokens and the bonus
    idx = (torch.arange(reqs, device=dev) + first_req)[:, None] * n + pos[None, :]
    predict = torch.where(keep, t, torch.zeros_like(t)).int()
    accept_index = torch.where(keep, idx, torch.full_like(idx, -1)).int()
    out = (predict, accept_index, (acc + 1).int())
    if lp is not None:
        lpv = lp.view(-1, n)
        out += (torch.where(keep, lpv, torch.zeros_like(lpv)),)
    return out


def _torch_verify(torch, x, cand, n, first_req, spec, temp_r, k_r, p_r):
    """The torch chain verify on the full rows x [reqs*n, V] of requests
    first_req..: every row's token (greedy: argmax; else the vLLM V1 sampler,
    exponential race), then the walk."""
    temp, _, _, want_lp = spec
    if temp == 0.0:
        tok = torch.argmax(x, dim=-1)
        lp = x.float().log_softmax(dim=-1).gather(1, tok[:, None])[:, 0] if want_lp else None
    else:
        out = _torch_sample(torch, x, temp_r, k_r, p_r, None, want_lp, False)
        tok, lp = out if want_lp else (out, None)
    return _torch_chain(torch, tok, cand, n, first_req, lp)


def _host_walk(torch, t, cand, pad_bs, n, dev):
    """The walk again, a plain loop on the host (the reference of the exact checks)."""
    t, c = t.view(-1).tolist(), cand.view(-1).tolist()
    pred, ai, al = [0] * (pad_bs * n), [-1] * (pad_bs * n), [0] * pad_bs
    for b in range(pad_bs):
        base, acc = b * n, 0
        ai[base] = base
        for i in range(1, n):
            if c[base + i] != t[base + i - 1]:
                break
            pred[base + i - 1], ai[base + i], acc = t[base + i - 1], base + i, i
        pred[base + acc], al[b] = t[base + acc], acc + 1
    return tuple(torch.tensor(v, dtype=torch.int32, device=dev) for v in (pred, ai, al))


def check_chain(torch, x_f, spec, cand, out, n):
    """Requests whose outputs are not a valid chain: accept_length outside
    [1, N]; accept_index not b*N + j up to the bonus and -1 after; predict not 0
    after it; a draft up to the bonus that differs from the token before it,
    or the draft after the bonus equal to it; a token outside [0, V), below
    the row's k-th value (top-k), or (greedy) not the row's maximum; logprobs
    (when given) off the fp32 log_softmax by more than 1e-3 max(1, |want|) up
    to the bonus, not 0 after it."""
    temp, k, _, _ = spec
    P = out[0].reshape(-1, n).long()
    A = out[1].reshape(-1, n).long()
    L = out[2].reshape(-1).long()
    reqs, V, dev = P.shape[0], x_f.shape[1], P.device
    pos = torch.arange(n, device=dev)
    acc = (L - 1).clamp(0, n - 1)
    keep = pos[None, :] <= acc[:, None]
    idx = torch.arange(reqs, device=dev)[:, None] * n + pos[None, :]
    bad = (L < 1) | (L > n)
    bad |= (A != torch.where(keep, idx, torch.full_like(idx, -1))).any(dim=1)
    bad |= ((P != 0) & ~keep).any(dim=1)
    tok_bad = (P < 0) | (P >= V)
    val = x_f.gather(1, P.clamp(0, V - 1).view(-1, 1)).view(reqs, n)  # row b*n + j at P[b, j]
    if k is not None and temp > 0:
        tok_bad |= val < torch.topk(x_f, k, dim=-1).values[:, -1].view(reqs, n)
    if temp == 0.0:
        tok_bad |= val != x_f.amax(dim=-1).view(reqs, n)
    bad |= (keep & tok_bad).any(dim=1)
    if n > 1:
        match = cand.reshape(-1, n)[:, 1:].long() == P[:, :-1]  # draft i against predict i-1
        bad |= (~match & (pos[None, 1:] <= acc[:, None])).any(dim=1)
        after = match.gather(1, acc.clamp(max=n - 2)[:, None])[:, 0]  # draft acc+1
        bad |= (acc < n - 1) & after
    if len(out) > 3:
        lps = out[3].reshape(-1, n).float()
        want = (val - x_f.logsumexp(dim=-1).view(reqs, n)).where(keep, torch.zeros_like(val))
        bad |= ~((lps - want).abs() <= 1e-3 * want.abs().clamp(min=1.0)).all(dim=1)
    return int(bad.sum().item())


def run_verify(ctx, shape, case, rows_out, comms):
    """One verify case on pad_bs x N x V: DpSamplingComm.verify_chain on the
    shard vs the upstream path (swap -> torch chain verify -> gather) and the
    torch chain verify alone."""
    torch = ctx.torch
    pad_bs, n, vocab, dt = shape
    tp, rank, dev = ctx.world, ctx.rank, ctx.device
    vl, rows, reqs = vocab // tp, pad_bs * n, pad_bs // tp
    spec = VERIFY_CASES[case]
    temp_v, k_v, p_v, want_lp = spec
    x_full = _sample_logits(ctx, rows, vocab, False).to(_torch_dtype(torch, dt))
    shard = x_full[:, rank * vl:(rank + 1) * vl].contiguous()
    x_f = x_full.float()
    # per request (the verify's) and per row (request b's at rows b*n..b*n+n-1)
    temp = torch.full((pad_bs,), temp_v, dtype=torch.float32, device=dev)
    k = torch.full((pad_bs,), k_v, dtype=torch.int32, device=dev) if k_v is not None else None
    p = torch.full((pad_bs,), p_v, dtype=torch.float32, device=dev) if p_v is not None else None
    seed = torch.arange(pad_bs, dtype=torch.int64, device=dev)
    offset = torch.arange(pad_bs, dtype=torch.int64, device=dev) + 1000
    temp_r, k_r, p_r, seed_r = (None if v is None else v.repeat_interleave(n) for v in (temp, k, p, seed))
    offset_r = offset.repeat_interleave(n) + torch.arange(n, device=dev).repeat(pad_bs)

    # dpsampling's own draws of the rows (its verify must walk exactly these),
    # and the drafts: half the requests match all of them, the others up to a
    # cut (a wrong token there, matches after it that must not count)
    first = comms[ctx.backends[0]]
    t = first.sample(shard, temperature=temp_r, seed=seed_r, offset=offset_r, top_k=k_r, top_p=p_r).clone()
    t2 = t.view(pad_bs, n)
    q = torch.arange(pad_bs, device=dev)
    cut = torch.where(q % 2 == 0, torch.full_like(q, n), 1 + (q // 2) % max(n - 1, 1))
    cand = torch.empty(pad_bs, n, dtype=torch.int32, device=dev)
    cand[:, 0] = t2[:, 0].int()
    if n > 1:
        prev = t2[:, :-1]
        drafts = torch.where(torch.arange(1, n, device=dev)[None, :] == cut[:, None], (prev + 1) % vocab, prev)
        cand[:, 1:] = drafts.int()
    want = _host_walk(torch, t, cand, pad_bs, n, dev)
    wrong_t = 0
    if temp_v == 0.0:  # greedy: dpsampling's tokens are the argmax (torch's: the first maximum)
        wrong_t = int((t != torch.argmax(x_f, dim=-1)).sum().item())

    mine = slice(rank * reqs * n, (rank + 1) * reqs * n)
    cand_l, x_l = cand[rank * reqs:(rank + 1) * reqs].contiguous(), x_full[mine]
    loc_r = [None if v is None else v[mine].contiguous() for v in (temp_r, k_r, p_r)]
    swap_comm = first
    res = {}

    def upstream():
        full_rows = swap_comm.swap_batch_vocab(shard, pad_bs=pad_bs)
        o = _torch_verify(torch, full_rows, cand_l, n, rank * reqs, spec, *loc_r)
        g = tuple(swap_comm.gather_verify_outputs(o[0], o[1], o[2], pad_bs=pad_bs))
        return g + (swap_comm.gather_verify_logprobs(o[3], pad_bs=pad_bs),) if want_lp else g

    def timed(name, fn, exact):
        eager, replay, graph = _time_graph(ctx, fn)
        us, gout = replay()
        wrong = 0
        for o in (eager, gout):
            o = o if isinstance(o, tuple) else tuple(o)
            if name == "local":  # this rank's requests only, numbered from rank * reqs
                ref_x, ref_c = x_f[mine], cand_l
                o = (o[0], o[1] - rank * reqs * n * (o[1] >= 0)) + tuple(o[2:])
            else:
                ref_x, ref_c = x_f, cand
            wrong += check_chain(torch, ref_x, spec, ref_c, o, n)
            if exact:
                wrong += _count_wrong(torch, tuple(v.reshape(-1) for v in o[:3]), want)
        res[name] = (us, _sum_over_ranks(ctx, wrong))
        del graph

    greedy = temp_v == 0.0
    timed("torch", upstream, greedy)
    timed("local", lambda: _torch_verify(torch, x_l, cand_l, n, rank * reqs, spec, *loc_r), False)
    for b in ctx.backends:
        def dps(c=comms[b]):
            return c.verify_chain(shard, cand, pad_bs=pad_bs, temperature=temp, seed=seed, offset=offset,
                                  top_k=k, top_p=p, return_logprobs=want_lp)

        timed(b, dps, True)
    res["dps_tokens"] = (0.0, _sum_over_ranks(ctx, wrong_t))
    gc.collect()
    rows_out.append(("verify", f"{pad_bs}x{n}x{vocab}", case, rows * vl * x_full.element_size(), res))


_verify_header_printed = [False]


def print_verify_row(row, backends):
    _, shape, case, nbytes, res = row
    if not _verify_header_printed[0]:
        cols = "".join(f" {b + '(us)':>14} {'x' + b:>10}" for b in backends)
        print(f"# {'verify':>8} {'shape':>14} {'case':>6} {'torch(us)':>10} {'local(us)':>10}{cols} {'#wrong':>7}"
              f"   (torch: swap + torch verify + gather; local: torch verify alone; x: speedup = torch / dpsampling)")
        _verify_header_printed[0] = True
    t = res["torch"][0]
    cols = ""
    for b in backends:
        us = res[b][0]
        cols += f" {us:14.2f} {t / us:10.2f}"
    wrong = sum(w for _, w in res.values())
    print(f"  {'verify':>8} {shape:>14} {case:>6} {t:10.2f} {res['local'][0]:10.2f}{cols} {wrong:7d}")
    if wrong:
        print("#   ^ WRONG: " + ", ".join(f"{k}: {w}" for k, (_, w) in res.items() if w))
    sys.stdout.flush()


def worker_body(rank, world, args, init_method):
    import torch
    import torch.distributed as dist

    try:
        import dpsampling
    except Exception as e:  # noqa: BLE001
        raise SystemExit(f"compare_torch.py: rank {rank}: cannot import dpsampling: {e!r}")

    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group(
        backend="nccl",
        init_method=init_method,
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=args.timeout_s),
        device_id=device,
    )
    ctx = Ctx()
    ctx.torch, ctx.dist, ctx.dps = torch, dist, dpsampling
    ctx.rank, ctx.world, ctx.device = rank, world, device
    ctx.warmup, ctx.iters, ctx.replays = args.warmup, args.iters, args.replays
    ctx.backends = [b for b in args.backends.split(",") if b]
    ops = [o for o in args.ops.split(",") if o]

    swap_shapes = [s for s in parse_swap_shapes(args.swap_shapes, args.dtype) if s[0] % world == 0 and s[2] % world == 0]
    gather_shapes = [s for s in parse_gather_shapes(args.gather_shapes) if s[0] % world == 0]
    ctx.swap_max_bs, ctx.gather_max_bs = {}, {}
    for p, n, v, dt in swap_shapes:
        ctx.swap_max_bs[(n, v, dt)] = max(p, ctx.swap_max_bs.get((n, v, dt), 0))
    for p, n in gather_shapes:
        ctx.gather_max_bs[n] = max(p, ctx.gather_max_bs.get(n, 0))

    if rank == 0:
        names = [torch.cuda.get_device_name(i) for i in range(world)]
        nccl_v = ".".join(str(x) for x in torch.cuda.nccl.version())
        print(f"# compare_torch: torch {torch.__version__} (CUDA {torch.version.cuda}), NCCL {nccl_v}, "
              f"dpsampling {getattr(dpsampling, '__version__', '?')} ({getattr(dpsampling, '__file__', '?')})")
        print(f"# world {world}: {', '.join(f'[{i}] {n}' for i, n in enumerate(names))}")
        print(f"# warmup {ctx.warmup} | {ctx.iters} calls per graph x {ctx.replays} replays | times in us per call, "
              f"max over ranks | env NCCL_NVLS_ENABLE={os.environ.get('NCCL_NVLS_ENABLE')}")
        sys.stdout.flush()

    rows = []
    comms = CommCache(ctx)
    if "swap" in ops:
        for s in swap_shapes:
            run_swap(ctx, s, comms, rows)
            if rank == 0:
                print_row(rows[-1], ctx.backends)
        comms.clear()
    for which in ("gather", "logprobs"):
        if which in ops:
            for s in gather_shapes:
                run_gather(ctx, s, comms, rows, which)
                if rank == 0:
                    print_row(rows[-1], ctx.backends)
            comms.clear()
    select_shapes = [tuple(int(v) for v in t.split("x")) for t in args.select_shapes.split(",") if t]
    for which in ("argmax", "topk"):
        if which in ops:
            for s in select_shapes:
                if s[1] % world:
                    continue
                run_select(ctx, s, rows, which)
                if rank == 0:
                    print_row(rows[-1], ctx.backends)
    if "sample" in ops:
        cases = [c for c in args.sample_cases.split(",") if c]
        for t in args.sample_shapes.split(","):
            if not t:
                continue
            s = tuple(int(v) for v in t.lower().split("x"))
            if s[1] % world:
                continue
            comms = shape_comms(ctx, s[0], 1, s[1], torch.bfloat16, "sample")
            for case in cases:
                run_sample(ctx, s, case, rows, comms)
                if rank == 0:
                    print_sample_row(rows[-1], ctx.backends)
            destroy_comms(comms)
            del comms
    if "verify" in ops:
        cases = [c for c in args.verify_cases.split(",") if c]
        for s in parse_swap_shapes(args.verify_shapes, "bf16", "verify"):
            if s[0] % world or s[2] % world:
                continue
            comms = shape_comms(ctx, s[0], s[1], s[2], _torch_dtype(torch, s[3]), "verify_chain")
            for case in cases:
                run_verify(ctx, s, case, rows, comms)
                if rank == 0:
                    print_verify_row(rows[-1], ctx.backends)
            destroy_comms(comms)
            del comms
    torch.cuda.synchronize()
    dist.barrier()
    dist.destroy_process_group()
    return summarize(rows, ctx.backends, args) if rank == 0 else 0


_header_printed = [False]


def print_row(row, backends):
    op, shape, dt, nbytes, res = row
    if not _header_printed[0]:
        cols = "".join(f" {b + '(us)':>14} {b + '/torch':>14}" for b in backends)
        print(f"# {'op':>8} {'shape':>14} {'dtype':>6} {'bytes':>11} {'torch(us)':>10} {'a2a(us)':>9}{cols} {'#wrong':>7}")
        _header_printed[0] = True
    t = res["torch"][0]
    a2a = f"{res['torch_a2a'][0]:9.2f}" if "torch_a2a" in res else f"{'-':>9}"
    cols = ""
    for b in backends:
        us = res[b][0]
        cols += f" {us:14.2f} {us / t:14.3f}"
    wrong = sum(w for _, w in res.values())
    print(f"  {op:>8} {shape:>14} {dt:>6} {nbytes:11d} {t:10.2f} {a2a}{cols} {wrong:7d}")
    if wrong:
        print("#   ^ WRONG: " + ", ".join(f"{k}: {w}" for k, (_, w) in res.items() if w))
    sys.stdout.flush()


def summarize(rows, backends, args):
    wrong = sum(w for r in rows for _, w in r[4].values())
    code = 0
    p, n, v, dt = TARGET_SHAPE
    target_row = next((r for r in rows if r[0] == "swap" and r[1] == f"{p}x{n}x{v}" and r[2] == dt), None)
    print("#")
    if target_row is not None and "nccl" in target_row[4]:
        ratio = target_row[4]["nccl"][0] / target_row[4]["torch"][0]
        ok = ratio <= args.target
        print(f"# target: dpsampling nccl / torch at {p}x{n}x{v} {dt} = {ratio:.3f} "
              f"(<= {args.target}: {'met' if ok else 'MISSED'})")
        if not ok and args.enforce_target:
            code = 3
    else:
        print(f"# target shape {p}x{n}x{v} {dt} with backend nccl not measured")
    print(f"# wrong elements: {wrong} {'OK' if wrong == 0 else 'FAILED'}")
    if wrong:
        code = 1
    print(f"# {'PASSED' if code == 0 else 'FAILED'}")
    sys.stdout.flush()
    return code


def _spawn_entry(rank, world, args, port, queue):
    crashed = False
    try:
        code = worker_body(rank, world, args, f"tcp://127.0.0.1:{port}")
    except SystemExit as e:
        crashed = True
        code = e.code if isinstance(e.code, int) and e.code else 1
        if not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    except Exception:  # noqa: BLE001
        crashed = True
        traceback.print_exc()
        code = 1
    queue.put((rank, code))
    sys.stdout.flush()
    sys.stderr.flush()
    if crashed:
        # A peer may be stuck in a collective: exiting non-zero makes
        # torch.multiprocessing terminate the other ranks.
        os._exit(code)


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    args = parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    for var in ("DPSAMPLING_BACKEND", "TOKENSPEED_DP_SAMPLING_BACKEND"):
        if os.environ.get(var):
            print(f"compare_torch.py: note: ignoring {var}={os.environ[var]} (use --backends)", file=sys.stderr)
            del os.environ[var]
    for b in args.backends.split(","):
        if b and b not in ("nccl", "onesided"):
            raise SystemExit(f"compare_torch.py: unknown backend {b!r}")
    for o in args.ops.split(","):
        if o and o not in ("swap", "gather", "logprobs", "argmax", "topk", "sample", "verify"):
            raise SystemExit(f"compare_torch.py: unknown op {o!r}")
    parse_swap_shapes(args.swap_shapes, args.dtype)
    parse_gather_shapes(args.gather_shapes)
    for c in args.sample_cases.split(","):
        if c and c not in SAMPLE_CASES:
            raise SystemExit(f"compare_torch.py: unknown sample case {c!r} (want {','.join(SAMPLE_CASES)})")
    parse_swap_shapes(args.verify_shapes, "bf16", "verify")
    for c in args.verify_cases.split(","):
        if c and c not in VERIFY_CASES:
            raise SystemExit(f"compare_torch.py: unknown verify case {c!r} (want {','.join(VERIFY_CASES)})")

    try:
        import torch
        import torch.multiprocessing as mp
    except Exception as e:  # noqa: BLE001
        print(f"compare_torch.py: needs torch: {e!r}", file=sys.stderr)
        return 2
    try:
        import dpsampling  # noqa: F401
    except Exception as e:  # noqa: BLE001
        print(f"compare_torch.py: cannot import the dpsampling Python package ({e!r}).\n"
              "Build it and put it on the path, e.g. `make build` then PYTHONPATH=build/python, "
              "or `pip install --no-build-isolation --no-deps .`", file=sys.stderr)
        return 2

    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", rank))
        if local != rank:
            raise SystemExit("compare_torch.py: single-node only (LOCAL_RANK must equal RANK)")
        return worker_body(rank, world, args, "env://")

    world = args.world or torch.cuda.device_count()
    ops = [o for o in args.ops.split(",") if o]
    need = 2 if any(o in ("swap", "gather", "logprobs") for o in ops) else 1
    if world < need or world > torch.cuda.device_count():
        print(f"compare_torch.py needs at least {need} GPU(s) for --ops {args.ops} (asked {world}, "
              f"found {torch.cuda.device_count()})", file=sys.stderr)
        return 1
    port = _free_port()
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    try:
        mp.spawn(_spawn_entry, args=(world, args, port, queue), nprocs=world, join=True)
    except Exception as e:  # noqa: BLE001
        print(f"compare_torch.py: a rank failed: {e}", file=sys.stderr)
        return 1
    codes = {}
    while not queue.empty():
        r, c = queue.get()
        codes[r] = c
    if len(codes) != world:
        print(f"compare_torch.py: only ranks {sorted(codes)} reported", file=sys.stderr)
        return 1
    return max(codes.values(), key=lambda c: (c != 0, c))


if __name__ == "__main__":
    sys.exit(main())
