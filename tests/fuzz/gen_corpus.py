#!/usr/bin/env python3
"""Writes the seeds of fuzz_api in the input format described at the top of
fuzz_api.c: the readable scenarios into tests/fuzz/corpus/ (the fuzzer mutates
from there; the committed corpus is minimized, and keeps what they cover under
SHA-1 names) and the inputs that once found bugs into tests/fuzz/regressions/
(make check-fuzz runs each of them first). Run from anywhere:
python3 tests/fuzz/gen_corpus.py (README.md: re-minimizing the corpus)"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))

UNSET, EMPTY, AUTO, NCCL, ONESIDED = 0, 1, 2, 3, 4


def env(mode, s=b""):
    if mode == "str":
        return bytes([5, len(s)]) + s
    return bytes([mode])


def resolve(e1=UNSET, e2=UNSET, requested=0, avail=1, resolved_null=False,
            parse=(NCCL,), parse_out_null=False):
    """requested: -1..3 (b % 5 - 1); avail: 0 or 1."""
    out = env(*e1) if isinstance(e1, tuple) else env(e1)
    out += env(*e2) if isinstance(e2, tuple) else env(e2)
    out += bytes([requested + 1, avail, int(resolved_null)])
    out += env(*parse)
    out += bytes([int(parse_out_null)])
    out += bytes([1 << 2])  # fInt: 1 (any enum value for the name functions)
    return out


def config(tp=4, rank=1, mpb_steps=16, n=3, vocab_mode=0, vocab_mult=100, dtype=-1,
           backend=1, cuda=-1, timeout=False, bad=None, override=None):
    """A consistent config: max_pad_bs = tp*mpb_steps (steps 1..16), N = n (1..8),
    vocab = tp*vocab_mult (mode 0), near INT64_MAX (5), byte count just below (6)
    or just above (7) INT64_MAX."""
    f = 3
    extra = b""
    if bad == "size":
        f, extra = 0, bytes([1])  # size = sizeof - 1
    elif bad == "magic":
        f, extra = 1, struct.pack("<I", 0xDEADBEEF)
    out = bytes([f]) + extra
    out += bytes([tp - 1]) + struct.pack("<I", rank)
    out += bytes([mpb_steps - 1, n - 1])
    out += bytes([vocab_mode])
    if vocab_mode == 5:
        out += bytes([3])
    elif vocab_mode not in (6, 7):
        out += struct.pack("<H", vocab_mult - 1)
    b = (dtype + 1) | (backend << 2) | ((cuda + 1) << 4) | (0xC0 if timeout else 0)
    out += bytes([b])
    out += bytes([override[0], override[1]]) if override else bytes([0])
    return out


def raw_config(tp, rank, mpb, n, vocab, dtype, backend, cuda, timeout):
    """Raw fields through fInt/fI64 mode 2 (the value itself)."""
    def i32(v):
        return bytes([2]) + struct.pack("<i", v)

    def i64(v):
        return bytes([2]) + struct.pack("<q", v)
    return (bytes([8 | 3]) + i32(tp) + i32(rank) + i32(mpb) + i32(n) + i64(vocab) + i32(dtype) +
            i32(backend) + i32(cuda) + i32(timeout))


def bootstrap(bits=0):
    """bit 32 makes dpsOnesidedAvailableOnDevices read a count: -2 (fInt mode 3)."""
    return bytes([bits]) + (bytes([(2 << 2) | 3]) if bits & 32 else b"")


def create(out_null=False, ops_null=False, cfg_null=False, onesided=False, no_async=False,
           f_init=0, f_prep=0):
    cf = (int(out_null) | int(ops_null) << 1 | int(cfg_null) << 2 | int(onesided) << 3 |
          int(no_async) << 4)
    return bytes([cf, f_init, f_prep])


# ---- operations (near-valid shapes: pad_bs = tp*(1+k)) ----
def swap(k=0, dtype=1, wiggle=0, bits=0, fail_prep=0, fail_op=0):
    return bytes([0, bits, dtype + 1, wiggle]) + struct.pack("<I", k) + bytes([fail_prep, fail_op])


def gather(k=0, wiggle=0, bits=0, fail=0):
    return bytes([2, bits, wiggle]) + struct.pack("<I", k) + bytes([fail])


def logprobs(k=0, wiggle=0, bits=0, fail=0):
    return bytes([3, bits, wiggle]) + struct.pack("<I", k) + bytes([fail])


def prepare(dtype=1, fail=0):
    return bytes([4, dtype + 1, fail])


def info(null=False):
    return bytes([5, int(null)])


def async_err(null=False):
    return bytes([6, int(null)])


def collectives(bits=0):
    return bytes([7, bits])


def raise_async(code_byte=3):
    return bytes([8, code_byte])


FAULT = 0x80 | 1  # an injected backend failure (fault() in fuzz_api.c)

SEEDS = {
    # every operation succeeds on a valid tp=4 communicator, dtype fixed by the first swap
    "all_ops_ok": resolve() + config() + bootstrap() + create() +
    swap(k=1) + gather(k=3) + logprobs(k=0) + prepare(2) + info() + async_err() +
    collectives() + collectives(1) + swap(k=15) + info(),
    # dtype locking: prepare fixes bf16, then an fp32 swap is dpsInvalidUsage
    "dtype_lock": resolve() + config(dtype=-1) + bootstrap() + create(onesided=True) +
    prepare(1) + swap(dtype=0) + swap(dtype=1) + prepare(0) + info(),
    # bad shapes and pointers: wiggled pad_bs/rows/cols, NULL arguments
    "bad_args": resolve() + config(tp=8, mpb_steps=4, n=2, dtype=2) + bootstrap(0x7f) + create() +
    swap(wiggle=0x31, dtype=2) + swap(wiggle=0x06, dtype=2) + swap(bits=0x03, dtype=2) +
    gather(wiggle=0x07) + gather(bits=0x3f) + logprobs(wiggle=0x0d) + logprobs(bits=0x03) +
    prepare(-1) + info(True) + async_err(True),
    # backend failures propagate and write nothing; creation-time prepare failure
    "backend_faults": resolve() + config(dtype=-1) + bootstrap() + create() +
    swap(fail_prep=FAULT) + swap(fail_op=FAULT) + swap() + gather(fail=FAULT) +
    logprobs(fail=FAULT) + info(),
    "create_fault": resolve() + config(dtype=0) + bootstrap() + create(f_prep=FAULT) + swap() +
    info(),
    # asynchronous error: every later operation fails with it
    "async_error": resolve() + config(dtype=1) + bootstrap() + create() + swap() + raise_async() +
    async_err() + swap() + gather() + prepare(1) + info(),
    # a backend without async_error: raising one changes nothing
    "no_async_backend": resolve() + config(dtype=1) + bootstrap() + create(no_async=True) +
    raise_async() + async_err() + swap() + prepare(0) + info(),
    # vocab near INT64_MAX; byte count just below and just above INT64_MAX
    "vocab_huge": resolve() + config(tp=2, mpb_steps=1, n=1, vocab_mode=5) + bootstrap() +
    create() + swap() + gather(),
    "bytes_edge_ok": resolve() + config(tp=3, mpb_steps=5, n=7, vocab_mode=6, dtype=0) +
    bootstrap() + create() + swap(k=2, dtype=0) + logprobs(k=4),
    "bytes_edge_overflow": resolve() + config(tp=3, mpb_steps=5, n=7, vocab_mode=7) +
    bootstrap(0x20) + create() + swap() + info(),
    # uninitialized configs
    "bad_magic": resolve() + config(bad="magic") + bootstrap() + create() + swap(),
    "bad_size": resolve() + config(bad="size") + bootstrap(0x08) + create() + info(),
    # raw absurd fields
    "raw_int_min": resolve() + raw_config(-2**31, -1, 0, -5, -2**63, 7, -3, -2, -1) +
    bootstrap() + create() + swap(),
    "raw_max": resolve() + raw_config(2**31 - 1, 2**31 - 2, 2**31 - 1, 2**31 - 1,
                                      2**63 - 1, 1, 2, 0, 2**31 - 1) + bootstrap() + create(),
    # environment overrides
    "env_disagree": resolve(e1=NCCL, e2=ONESIDED, requested=0) + config() + bootstrap() + create(),
    "env_bogus": resolve(e1=("str", b"NCCL "), e2=EMPTY, requested=2, avail=0,
                         parse=("str", b"one-sided")) + config() + bootstrap() + create(),
    "env_onesided_unavailable": resolve(e1=UNSET, e2=ONESIDED, requested=1, avail=0,
                                        parse=(UNSET,)) + config() + bootstrap() + create(),
    "env_alias_auto": resolve(e1=EMPTY, e2=AUTO, requested=2, avail=1, parse=(AUTO,)) +
    config(tp=1, rank=0, mpb_steps=1, n=1) + bootstrap() + create() + swap() + gather() +
    logprobs(),
}


# Inputs that found bugs (bf95842: the harness's 32-bit sums of the nudged
# gather shape overflowed): valid configs at the int limits, N = INT_MAX (N+1
# must not overflow in the harness), max_pad_bs = INT_MAX at tp=1 (pad_bs/tp + 1
# likewise); the gathers nudge both upward.
REGRESSIONS = {
    "raw_n_max_gather": resolve() + raw_config(1, 0, 1, 2**31 - 1, 1, 1, 1, -1, 0) +
    bootstrap() + create() + gather(wiggle=0x04) + logprobs(wiggle=0x04) + gather(),
    "raw_pad_max_gather": resolve() + raw_config(1, 0, 2**31 - 1, 1, 1, 1, 1, -1, 0) +
    bootstrap() + create() + gather(k=2**31 - 2, wiggle=0x0e) +
    logprobs(k=2**31 - 2, wiggle=0x0f) + swap(k=2**31 - 2, wiggle=0x01),
}


def main():
    for sub, inputs in (("corpus", SEEDS), ("regressions", REGRESSIONS)):
        d = os.path.join(HERE, sub)
        os.makedirs(d, exist_ok=True)
        for name, data in inputs.items():
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)
        print(f"{len(inputs)} inputs in {d}")


if __name__ == "__main__":
    main()
