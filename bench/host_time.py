#!/usr/bin/env python3
"""Host time of one eager dpsampling call, against torch's copy_, in one run.

At tp = 1 (a torch.distributed world of this one process, NCCL, on cuda:0)
it times, for every eager operation of DpSamplingComm on each backend:

  swap                   swap_batch_vocab(x, pad_bs=)              x [pad_bs*N, V]
  gather_verify_outputs  gather_verify_outputs(p, ai, al, pad_bs=)  int32 [pad_bs, N] x2, [pad_bs]
  gather_verify_logprobs gather_verify_logprobs(lp, pad_bs=)        fp32 [pad_bs, N]
  argmax                 argmax(x)                                 persistent outputs
  topk                   topk(x, K)                                persistent outputs
  sample                 sample(x, temperature=0.7, seed=, offset=, top_k=50)  scalars
  sample_tensors         the same with per-row tensors (temperature, seed, offset)
  verify_chain           verify_chain(x, cand, pad_bs=, temperature=0.0, seed=, offset=)

and torch's `dst.copy_(src)` of a tensor of x's size and dtype, the yardstick:
the host time of one eager call is the median over --reps repetitions of
(wall time of --calls back-to-back calls) / --calls, with no synchronization
inside the timed loop. By default (--hold) each timed loop runs while the
device is held busy by a spin kernel (torch.cuda._sleep) queued just before
it, so no call waits for the device, whatever the op's device time: the
figure is the host's alone (an op whose device time per call exceeds its
host time would otherwise read its device time once the launch queue fills).
The loop must fit in the launch queue for that: --calls 256 by default, and
a loop that outlasts its hold is reported ("hold too short"). --no-hold
times the loops without it (the method before session 18, 2000 calls). The
repetitions of copy_ and of every operation are interleaved, so drift hits
all alike.

Columns: host_us (median; min and max of the repetitions after it), gpu_us
(device time per call over an unheld loop of the same calls, from CUDA
events; without --hold, when it is close to host_us the loop filled the
launch queue and host_us measures the device), ratio = host_us / copy_us,
and whether ratio <= --target (default 0.8, issue 25). idle_us: the median host time of one call made with
the device idle (a synchronization before each of --idle-calls calls, outside
the timing): the host's own cost, whatever the device's pace. --csv PATH writes the rows. Exit status 0, or 3 with
--enforce-target when an operation misses the target, 1 when a result is wrong
(checked once, before timing: argmax, topk, swap and sample against torch, the two
gathers against their inputs, which tp = 1 returns as they are).

    PYTHONPATH=build/python python3 bench/host_time.py --csv bench/results/host_time.csv

Needs torch with CUDA and one GPU; runs in about 20 s (most of it torch's
import and the communicators' creation).
"""

import argparse
import csv
import gc
import os
import statistics
import sys
import time

OPS = ["swap", "gather_verify_outputs", "gather_verify_logprobs", "argmax", "topk", "sample",
       "sample_tensors", "verify_chain"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backends", default="nccl,onesided", help="comma list (default: both)")
    p.add_argument("--ops", default=",".join(OPS), help="comma list (default: all): " +
                   ", ".join(OPS))
    p.add_argument("--pad-bs", type=int, default=8, help="requests (default 8)")
    p.add_argument("--n", type=int, default=4, help="num_tokens_per_req (default 4)")
    p.add_argument("--vocab", type=int, default=4096,
                   help="V (default 4096: small, so that the device keeps up with the host)")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--topk", type=int, default=8, help="k of topk (default 8)")
    p.add_argument("--hold", action=argparse.BooleanOptionalAction, default=True,
                   help="time each loop with the device held busy (default; --no-hold: not)")
    p.add_argument("--calls", type=int, default=None,
                   help="calls per repetition (default 256 with --hold, 2000 without)")
    p.add_argument("--reps", type=int, default=None,
                   help="repetitions (default 15 with --hold, 7 without)")
    p.add_argument("--idle-calls", type=int, default=500,
                   help="calls timed one by one with the device idle (default 500)")
    p.add_argument("--warmup", type=int, default=100, help="untimed calls first (default 100)")
    p.add_argument("--target", type=float, default=0.8, help="ratio target (default 0.8)")
    p.add_argument("--enforce-target", action="store_true", help="exit 3 on a miss")
    p.add_argument("--csv", default=None, help="write the rows to this CSV file")
    return p.parse_args(argv)


def init_world(torch, dist):
    """A torch.distributed world of this one process (NCCL, cuda:0)."""
    torch.cuda.set_device(0)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group(backend="nccl", store=dist.HashStore(), world_size=1, rank=0,
                            device_id=torch.device("cuda", 0))


def make_inputs(torch, a):
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    dev = torch.device("cuda", 0)
    g = torch.Generator(device="cpu").manual_seed(1)
    rows = a.pad_bs * a.n
    x = (torch.randn(rows, a.vocab, generator=g) * 2.5).to(dt).to(dev)
    ins = dict(
        dtype=dt,
        x=x,
        dst=torch.empty_like(x),
        p=torch.randint(0, a.vocab, (a.pad_bs, a.n), generator=g, dtype=torch.int32).to(dev),
        ai=torch.randint(0, rows, (a.pad_bs, a.n), generator=g, dtype=torch.int32).to(dev),
        al=torch.randint(1, a.n + 1, (a.pad_bs,), generator=g, dtype=torch.int32).to(dev),
        lp=torch.randn(a.pad_bs, a.n, generator=g).to(dev),
        cand=torch.randint(0, a.vocab, (a.pad_bs, a.n), generator=g, dtype=torch.int32).to(dev),
        temps=torch.full((rows,), 0.7, device=dev),
        seeds=torch.arange(rows, dtype=torch.int64, device=dev),
        offs=torch.arange(rows, dtype=torch.int64, device=dev) + 100,
    )
    return ins


def op_calls(comm, a, i):
    """name -> a callable making one eager call (the shapes of the docstring)."""
    x, pad_bs, k = i["x"], a.pad_bs, a.topk
    return {
        "swap": lambda: comm.swap_batch_vocab(x, pad_bs=pad_bs),
        "gather_verify_outputs": lambda: comm.gather_verify_outputs(i["p"], i["ai"], i["al"],
                                                                    pad_bs=pad_bs),
        "gather_verify_logprobs": lambda: comm.gather_verify_logprobs(i["lp"], pad_bs=pad_bs),
        "argmax": lambda: comm.argmax(x),
        "topk": lambda: comm.topk(x, k),
        "sample": lambda: comm.sample(x, temperature=0.7, seed=1, offset=2, top_k=50),
        "sample_tensors": lambda: comm.sample(x, temperature=i["temps"], seed=i["seeds"],
                                              offset=i["offs"], top_k=50),
        "verify_chain": lambda: comm.verify_chain(x, i["cand"], pad_bs=pad_bs, temperature=0.0,
                                                  seed=1, offset=2),
    }


def check(torch, comm, a, i, backend):
    """One call of the checked operations against torch (tp = 1: the shard is
    the whole row). Returns the names of those that disagree."""
    x = i["x"]
    wrong = []
    swapped = comm.swap_batch_vocab(x, pad_bs=a.pad_bs)
    _, idx = comm.argmax(x)
    _, tidx = comm.topk(x, a.topk)
    tok = comm.sample(x, temperature=0.0, seed=0, offset=0)
    p, ai, al = comm.gather_verify_outputs(i["p"], i["ai"], i["al"], pad_bs=a.pad_bs)
    lp = comm.gather_verify_logprobs(i["lp"], pad_bs=a.pad_bs)
    torch.cuda.synchronize()
    want = x.float().argmax(-1)
    if not torch.equal(swapped, x):
        wrong.append("swap")
    if not torch.equal(idx, want):
        wrong.append("argmax")
    if not torch.equal(tidx[:, 0], want):
        wrong.append("topk")
    if not torch.equal(tok, want):
        wrong.append("sample")
    # tp = 1: the gathers return this rank's own values
    if not (torch.equal(p, i["p"]) and torch.equal(ai, i["ai"]) and torch.equal(al, i["al"])):
        wrong.append("gather_verify_outputs")
    if not torch.equal(lp, i["lp"]):
        wrong.append("gather_verify_logprobs")
    for w in wrong:
        print(f"# WRONG: {backend} {w} disagrees with torch", flush=True)
    return wrong


# Device cycles of hold per call: 50 us at 2 GHz, several times any op's
# device time at the probe's shapes.
HOLD_CYCLES_PER_CALL = 100_000


def time_loop(torch, fn, calls):
    """(host µs per call, device µs per call) of `calls` back-to-back calls."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter_ns()
    end.record()
    torch.cuda.synchronize()
    return (t1 - t0) / 1e3 / calls, start.elapsed_time(end) * 1e3 / calls


def time_held(torch, fn, calls):
    """(host µs per call, whether the hold outlasted the loop) of `calls`
    back-to-back calls queued behind a spin kernel."""
    held = torch.cuda.Event()
    torch.cuda.synchronize()
    torch.cuda._sleep(HOLD_CYCLES_PER_CALL * calls)
    held.record()
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter_ns()
    still_held = not held.query()
    torch.cuda.synchronize()
    return (t1 - t0) / 1e3 / calls, still_held


def time_idle(torch, fn, calls):
    """Median host µs of one call made with the device idle."""
    ts = []
    for _ in range(calls):
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        fn()
        ts.append(time.perf_counter_ns() - t0)
    torch.cuda.synchronize()
    return statistics.median(ts) / 1e3


def main(argv=None):
    a = parse_args(argv)
    ops = [o for o in a.ops.split(",") if o]
    bad = [o for o in ops if o not in OPS]
    if bad:
        raise SystemExit(f"host_time.py: unknown --ops {bad}; choose from {OPS}")
    backends = [b for b in a.backends.split(",") if b]
    import torch
    import torch.distributed as dist

    import dpsampling

    if not torch.cuda.is_available():
        raise SystemExit("host_time.py needs a CUDA device")
    if a.calls is None:
        a.calls = 256 if a.hold else 2000
    if a.reps is None:
        a.reps = 15 if a.hold else 7
    init_world(torch, dist)
    i = make_inputs(torch, a)
    lib = dpsampling.build_info()["library_version"]
    print(f"# host_time.py: torch {torch.__version__}, {torch.cuda.get_device_name(0)}, "
          f"dpsampling {dpsampling.__version__} (library {lib})")
    print(f"# tp=1, pad_bs={a.pad_bs} N={a.n} V={a.vocab} {a.dtype}, topk k={a.topk}; "
          f"median of {a.reps} x {a.calls} eager calls, no sync inside the loop, "
          + ("the device held busy" if a.hold else "the device not held"))
    comms, calls, wrong = {}, {}, []
    for b in backends:
        comm = dpsampling.DpSamplingComm(tp_size=1, rank=0, group=dist.group.WORLD,
                                         max_pad_bs=a.pad_bs, num_tokens_per_req=a.n,
                                         vocab_size=a.vocab, logits_dtype=i["dtype"], backend=b)
        if comm.backend != b:
            raise SystemExit(f"host_time.py: backend={b!r} resolved to {comm.backend!r}")
        comms[b] = comm
        wrong += check(torch, comm, a, i, b)
        all_calls = op_calls(comm, a, i)
        calls.update({(o, b): all_calls[o] for o in ops})
    src, dst = i["x"], i["dst"]
    calls[("copy_", "torch")] = lambda: dst.copy_(src)
    for fn in calls.values():  # warm-up: first-call allocations, lazy loading
        for _ in range(a.warmup):
            fn()
    torch.cuda.synchronize()
    host = {key: [] for key in calls}
    gpu = {key: [] for key in calls}
    short = set()
    gc.collect()
    gc.disable()
    try:
        for _ in range(a.reps):  # interleaved: every key once per repetition
            for key, fn in calls.items():
                h, d = time_loop(torch, fn, a.calls)
                if a.hold:
                    h, still_held = time_held(torch, fn, a.calls)
                    if not still_held:
                        short.add(key)
                host[key].append(h)
                gpu[key].append(d)
        idle = {key: time_idle(torch, fn, a.idle_calls) for key, fn in calls.items()}
    finally:
        gc.enable()
    copy_us = statistics.median(host[("copy_", "torch")])
    rows, misses = [], []
    print(f"{'op':>24} {'backend':>9} {'host_us':>8} {'min':>7} {'max':>7} {'gpu_us':>7} "
          f"{'ratio':>6} {'idle_us':>7}  target<={a.target}")
    for (op, b), hs in host.items():
        med = statistics.median(hs)
        g = statistics.median(gpu[(op, b)])
        ratio = med / copy_us
        is_copy = op == "copy_"
        ok = is_copy or ratio <= a.target
        if not ok:
            misses.append(f"{op}/{b}")
        note = "" if is_copy else ("ok" if ok else "MISS")
        if not a.hold and g >= 0.9 * med:
            note += " (device-bound: gpu_us ~ host_us)"
        if (op, b) in short:
            note += " (hold too short: the loop may have waited for the device)"
        print(f"{op:>24} {b:>9} {med:8.2f} {min(hs):7.2f} {max(hs):7.2f} {g:7.2f} "
              f"{ratio:6.2f} {idle[(op, b)]:7.2f}  {note}")
        rows.append(dict(op=op, backend=b, pad_bs=a.pad_bs, n=a.n, vocab=a.vocab, dtype=a.dtype,
                         calls=a.calls, reps=a.reps, held=int(a.hold),
                         host_us=f"{med:.3f}",
                         host_us_min=f"{min(hs):.3f}", host_us_max=f"{max(hs):.3f}",
                         gpu_us=f"{g:.3f}", copy_us=f"{copy_us:.3f}", ratio=f"{ratio:.3f}",
                         target=a.target, meets_target=int(ok),
                         idle_us=f"{idle[(op, b)]:.3f}"))
    if a.csv:
        d = os.path.dirname(a.csv)
        if d:
            os.makedirs(d, exist_ok=True)
        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        print(f"# wrote {a.csv}")
    print(f"# {len(rows) - 1 - len(misses)} of {len(rows) - 1} ops at or below "
          f"{a.target} x copy_ ({copy_us:.2f} us)" + (f"; above: {', '.join(misses)}"
                                                       if misses else ""))
    for comm in comms.values():
        comm.close()
    dpsampling.destroy_group_communicators()
    dist.destroy_process_group()
    if wrong:
        return 1
    if misses and a.enforce_target:
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
