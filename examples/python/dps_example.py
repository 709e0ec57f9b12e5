"""dpsampling from Python, one process per GPU under torchrun:

    torchrun --nproc-per-node N examples/python/dps_example.py [--backend auto|nccl|onesided]

(N = 1 runs on a one-GPU machine.) Each rank builds the whole batch's logits
the same way, keeps its vocabulary slice, and swaps it so that it holds its
own requests over the whole vocabulary; then it "samples" (argmax) and
gathers the verify outputs and logprobs of every rank. It also takes every
row's argmax straight from the vocabulary slices, without the swap. Every
result is compared with the values the rank expects; the exit status is 1 on
a mismatch.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist

from dpsampling import DpSamplingComm


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="auto", choices=("auto", "nccl", "onesided"))
    ap.add_argument("--reqs-per-rank", type=int, default=4)
    ap.add_argument("--tokens-per-req", type=int, default=2, help="N (speculative verify)")
    ap.add_argument("--vocab-per-rank", type=int, default=1024)
    args = ap.parse_args()

    if "LOCAL_RANK" not in os.environ:
        sys.exit("run under torchrun: torchrun --nproc-per-node N " + " ".join(sys.argv))
    local_rank = int(os.environ["LOCAL_RANK"])
    world = int(os.environ["WORLD_SIZE"])
    if not torch.cuda.is_available():
        sys.exit("dps_example.py: no usable CUDA device (torch.cuda.is_available() is False)")
    if torch.cuda.device_count() <= local_rank:
        sys.exit(
            f"dps_example.py: rank {local_rank} needs GPU {local_rank} but "
            f"{torch.cuda.device_count()} GPU(s) are visible; use --nproc-per-node "
            f"{torch.cuda.device_count()}"
        )
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    rank = dist.get_rank()
    device = torch.device("cuda", local_rank)

    tp, reqs, n = world, args.reqs_per_rank, args.tokens_per_req
    pad_bs, vocab = reqs * tp, args.vocab_per_rank * tp
    v_local = vocab // tp
    comm = DpSamplingComm(
        tp_size=tp,
        rank=rank,
        group=dist.group.WORLD,  # the engine's ProcessGroup (or a tuple of global ranks)
        max_pad_bs=pad_bs,
        num_tokens_per_req=n,
        vocab_size=vocab,
        logits_dtype=torch.bfloat16,
        backend=args.backend,
    )

    # The whole batch's logits [pad_bs*N, V]: the peak of row r is at column
    # (r * 7919) % V; every rank holds the columns of its vocabulary slice.
    rows = torch.arange(pad_bs * n, device=device)
    peak = (rows * 7919) % vocab
    full = torch.zeros(pad_bs * n, vocab, dtype=torch.bfloat16, device=device)
    full[rows, peak] = 1.0
    local_logits = full[:, rank * v_local : (rank + 1) * v_local].contiguous()

    # 1. swap: this rank's requests [reqs*N, V]
    mine = comm.swap_batch_vocab(local_logits, pad_bs=pad_bs)
    expect = full[rank * reqs * n : (rank + 1) * reqs * n]
    ok = torch.equal(mine, expect)

    # 2. "sample" this rank's requests, then gather every rank's verify outputs
    predict = mine.argmax(dim=-1).to(torch.int32).view(reqs, n)
    accept_index = torch.arange(reqs * n, dtype=torch.int32, device=device).view(reqs, n)
    accept_index += rank * reqs * n
    accept_length = torch.full((reqs,), n, dtype=torch.int32, device=device)
    p, ai, al = comm.gather_verify_outputs(predict, accept_index, accept_length, pad_bs=pad_bs)
    ok &= torch.equal(p, peak.to(torch.int32).view(pad_bs, n))
    ok &= torch.equal(ai, torch.arange(pad_bs * n, dtype=torch.int32, device=device).view(pad_bs, n))
    ok &= bool((al == n).all())

    # 3. gather logprobs
    logprobs = -torch.arange(reqs * n, dtype=torch.float32, device=device).view(reqs, n)
    logprobs -= rank * reqs * n
    lp = comm.gather_verify_logprobs(logprobs, pad_bs=pad_bs)
    ok &= torch.equal(lp, -torch.arange(pad_bs * n, dtype=torch.float32, device=device).view(pad_bs, n))

    # 4. greedy without the swap: every row's (value, global index) from the slices
    values, indices = comm.argmax(local_logits)
    ok &= torch.equal(indices, peak)
    ok &= bool((values == 1.0).all())

    torch.cuda.synchronize()
    verdict = torch.tensor([0 if ok else 1], device=device)
    dist.all_reduce(verdict)
    print(
        f"rank {rank}/{tp} (cuda:{local_rank}, backend {comm.backend}): "
        f"{'expected values' if ok else 'MISMATCH'}",
        flush=True,
    )
    comm.close()
    dist.destroy_process_group()
    if verdict.item():
        if rank == 0:
            print(f"dps_example.py: FAILED on {verdict.item()} rank(s)", flush=True)
        sys.exit(1)
    if rank == 0:
        print(f"dps_example.py: {tp} rank(s) passed", flush=True)


if __name__ == "__main__":
    main()
