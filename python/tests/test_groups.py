"""Groups given as a torch.distributed ProcessGroup, without a GPU: gloo
process groups in this process (world size 1) and in three spawned ranks
(sub-groups, this process's index in them, the bootstrap broadcast over the
given group). The values they are checked against are the ranks the test
itself put into each group. Needs torch (skipped without it, saying so); the
GPU side of the same is in test_select.py (world size 1, NCCL) and
test_world_sizes.py (2..8 GPUs)."""

import multiprocessing
import os
import traceback

import pytest

torch = pytest.importorskip(
    "torch", reason="torch is not installed: ProcessGroup arguments need torch.distributed"
)
import torch.distributed as dist  # noqa: E402

if not dist.is_available():
    pytest.skip("this torch build has no torch.distributed", allow_module_level=True)

import dpsampling  # noqa: E402
from dpsampling import (  # noqa: E402
    DpSamplingComm,
    create_dist_argmax_state,
    onesided_available,
    resolve_backend,
)

pytestmark = pytest.mark.usefixtures("clean_backend_env")


def _comm_kw(**over):
    kw = dict(tp_size=1, rank=0, max_pad_bs=8, num_tokens_per_req=1, vocab_size=64,
              backend="nccl")
    kw.update(over)
    return kw


def test_process_group_is_its_ranks(gloo_world1):
    sub = dist.new_group([0])
    for pg in (gloo_world1, sub):
        st = create_dist_argmax_state(group=pg, rank_in_group=0, max_M=8, dtype=torch.bfloat16,
                                      device=None, skip_ping_pong=True)
        assert st.group == (0,)
        assert st.rank == 0 and st.max_M == 8
        assert st.comm is None  # created at the first call
    # its size is checked against tp_size like a tuple's, before any GPU use
    with pytest.raises(ValueError, match=r"group=\(0,\) has 1 ranks but tp_size=2"):
        DpSamplingComm(**_comm_kw(tp_size=2, max_pad_bs=8, group=gloo_world1))


def test_rank_in_group_checked(gloo_world1):
    with pytest.raises(ValueError) as e:
        create_dist_argmax_state(group=gloo_world1, rank_in_group=1, max_M=8,
                                 dtype=torch.bfloat16)
    msg = str(e.value)
    assert "rank_in_group=1" in msg and "rank 0 of group=(0,)" in msg, msg


def test_backend_queries_take_a_process_group(gloo_world1):
    assert resolve_backend("nccl", gloo_world1) == "nccl"
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: onesided availability is the device's")
    assert onesided_available(gloo_world1) is False
    assert resolve_backend("auto", gloo_world1) == "nccl"
    with pytest.raises(RuntimeError, match="DPSAMPLING_BACKEND=nccl"):
        resolve_backend("onesided", gloo_world1)


def test_construction_reaches_the_device_check(gloo_world1):
    """A ProcessGroup passes every argument check: without a GPU the
    constructor stops at the device, as with a tuple."""
    if torch.cuda.is_available():
        pytest.skip("a GPU is present (test_select.py creates on it)")
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        DpSamplingComm(**_comm_kw(group=gloo_world1))


def test_unknown_or_foreign_groups_are_refused(gloo_world1):
    sub = dist.new_group([0])
    with pytest.raises(TypeError, match="ProcessGroup, a tuple of global ranks or an int"):
        create_dist_argmax_state(group=object(), rank_in_group=0, max_M=8, dtype=torch.float32)
    dist.destroy_process_group()  # `sub` is gone with its world
    dist.init_process_group("gloo", world_size=1, rank=0, store=dist.HashStore())
    with pytest.raises(ValueError, match="ProcessGroup that torch.distributed does not know"):
        create_dist_argmax_state(group=sub, rank_in_group=0, max_M=8, dtype=torch.float32)


# ---- three ranks (spawned processes, gloo over a file store) ---------------------------

WORLD = 3


class _RecordingNcclGroup:
    """Stands in for _C.NcclGroup (ncclCommInitRank needs a GPU): records
    what the bootstrap hands it."""

    def __init__(self, uid, nranks, rank, device):
        self.uid, self.nranks, self.rank, self.device = uid, nranks, rank, device


def _rank_main(rank, store_path, results):
    try:
        dist.init_process_group("gloo", world_size=WORLD, rank=rank,
                                store=dist.FileStore(store_path, WORLD))
        out = {}
        sub = dist.new_group([1, 2])  # collective over the world
        out["world"] = create_dist_argmax_state(dist.group.WORLD, rank, 8, torch.float32).group
        try:
            create_dist_argmax_state(dist.group.WORLD, (rank + 1) % WORLD, 8, torch.float32)
            out["world_wrong_rank"] = "accepted"
        except ValueError as e:
            out["world_wrong_rank"] = str(e)
        if rank in (1, 2):
            me = dist.get_rank(sub)
            out["sub"] = create_dist_argmax_state(sub, me, 8, torch.float32).group
            try:
                create_dist_argmax_state(sub, 1 - me, 8, torch.float32)
                out["sub_wrong_rank"] = "accepted"
            except ValueError as e:
                out["sub_wrong_rank"] = str(e)
        else:  # new_group gave this process GroupMember.NON_GROUP_MEMBER, not a group
            for key, group in (("sub_outsider", sub), ("tuple_outsider", (1, 2))):
                try:
                    create_dist_argmax_state(group, 0, 8, torch.float32)
                    out[key] = "accepted"
                except ValueError as e:
                    out[key] = str(e)
        # The bootstrap of a group given as a ProcessGroup broadcasts its unique id
        # over that group, making no new one. No GPU here: the NCCL communicator and
        # the current device are stood in for; the id and the broadcast are real.
        made = []

        def unique_id():
            made.append(os.urandom(dpsampling._C.UNIQUE_ID_BYTES))
            return made[-1]

        dpsampling._C.NcclGroup = _RecordingNcclGroup
        dpsampling._C.get_unique_id = unique_id
        torch.cuda.current_device = lambda: 0

        def no_new_group(*a, **k):
            raise AssertionError("dist.new_group called for a group given as a ProcessGroup")

        dist.new_group = no_new_group
        g = dpsampling._group_nccl(dist.group.WORLD)
        out["boot_world"] = (g.uid, g.nranks, g.rank, made[:])
        if rank in (1, 2):
            made.clear()
            g = dpsampling._group_nccl(sub)
            out["boot_sub"] = (g.uid, g.nranks, g.rank, made[:])
        out["process_groups_made"] = len(dpsampling._process_groups)
        results.put((rank, out))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        results.put((rank, {"error": traceback.format_exc()}))


def test_three_ranks_sub_groups_and_bootstrap(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(r, str(tmp_path / "store"), results))
             for r in range(WORLD)]
    for p in procs:
        p.start()
    got = {}
    try:
        for _ in range(WORLD):
            rank, out = results.get(timeout=120)
            got[rank] = out
    finally:
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
    for r in range(WORLD):
        assert "error" not in got[r], f"rank {r}:\n{got[r]['error']}"
        assert procs[r].exitcode == 0, f"rank {r} exit code {procs[r].exitcode}"
    for r in range(WORLD):
        o = got[r]
        assert o["world"] == (0, 1, 2)
        assert f"rank_in_group={(r + 1) % WORLD}" in o["world_wrong_rank"], o["world_wrong_rank"]
        assert f"rank {r} of group=(0, 1, 2)" in o["world_wrong_rank"], o["world_wrong_rank"]
        assert o["process_groups_made"] == 0
    assert "group=(-100,)" in got[0]["sub_outsider"], got[0]["sub_outsider"]
    assert "this process is not in it" in got[0]["sub_outsider"], got[0]["sub_outsider"]
    assert got[0]["tuple_outsider"] == "this process (global rank 0) is not in group=(1, 2)"
    for r in (1, 2):
        me = r - 1
        assert got[r]["sub"] == (1, 2)
        msg = got[r]["sub_wrong_rank"]
        assert f"rank_in_group={1 - me}" in msg and f"rank {me} of group=(1, 2)" in msg, msg
    # world: global rank 0 made the id, every rank got that one, at its own rank
    made_w = got[0]["boot_world"][3]
    assert len(made_w) == 1 and got[1]["boot_world"][3] == [] and got[2]["boot_world"][3] == []
    for r in range(WORLD):
        uid, nranks, rank, _ = got[r]["boot_world"]
        assert (uid, nranks, rank) == (made_w[0], WORLD, r)
    # sub-group (1, 2): its rank 0 (global rank 1) made the id, broadcast over it
    made_s = got[1]["boot_sub"][3]
    assert len(made_s) == 1 and got[2]["boot_sub"][3] == []
    assert made_s[0] != made_w[0]
    for r in (1, 2):
        uid, nranks, rank, _ = got[r]["boot_sub"]
        assert (uid, nranks, rank) == (made_s[0], 2, r - 1)
