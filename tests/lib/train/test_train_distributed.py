"""lib.train under torchrun: two CPU processes (Gloo) train exactly like one process on the
global batch, start from rank 0's weights, log averaged metrics, and resume exactly."""
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from lib import train
from lib.train import distributed

WORKER = Path(__file__).with_name("ddp_worker.py")
sys.path.insert(0, str(WORKER.parent))
import ddp_worker  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                                reason="this torch build has no Gloo backend")


def torchrun(out: Path, *args: str, nproc: int = 2) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    distributed.torchrun(WORKER, "--out", str(out), *args, processes=nproc)
    return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(nproc)]


@pytest.fixture(scope="module")
def two_procs(tmp_path_factory):
    return torchrun(tmp_path_factory.mktemp("ddp"), "--steps", "12")


def reference_global_batches(steps: int, world: int = 2, batch: int = 4) -> list:
    """The global batches the ranks see together: at step k, rank r's k-th batch of its
    DistributedSampler share, concatenated over the ranks."""
    ds = ddp_worker.dataset()
    out, epoch = [], 0
    while len(out) < steps:
        shares = []
        for r in range(world):
            sampler = torch.utils.data.DistributedSampler(ds, num_replicas=world, rank=r, shuffle=True, seed=3)
            sampler.set_epoch(epoch)
            shares.append(list(sampler))
        for k in range(0, len(shares[0]), batch):
            idx = [i for share in shares for i in share[k:k + batch]]
            out.append((ds.tensors[0][idx], ds.tensors[1][idx]))
        epoch += 1
    return out[:steps]


def test_replicas_stay_identical_and_start_from_rank_0(two_procs):
    a, b = two_procs
    for k in a["state"]:
        assert torch.equal(a["state"][k], b["state"][k]), f"{k} differs between the two processes"
    assert a["history"] == b["history"]
    assert "process 0 of 2" in a["summary"] and "process 1 of 2" in b["summary"]
    assert a["batches_per_epoch"] == 8                  # 64 samples / 2 processes / batch 4


def test_two_processes_equal_one_process_on_the_global_batch(two_procs):
    net = ddp_worker.model(0.0)                          # rank 0's initial weights (this process is rank 0)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)

    def step_fn(model, batch):
        x, y = batch
        return F.mse_loss(model(x), y), {}

    hist = train.fit(net, reference_global_batches(12), optimizer=opt, step_fn=step_fn, epochs=1,
                     max_steps=12, log_every=1, progress=False)
    ddp_state = two_procs[0]["state"]
    for k, v in net.state_dict().items():
        assert torch.allclose(ddp_state[k], v, atol=1e-6, rtol=1e-5), f"{k}: data-parallel run differs"
    ddp_losses = train.History.from_dict(two_procs[0]["history"]).values("train_loss")
    assert ddp_losses == pytest.approx(hist.values("train_loss"), rel=1e-5)
    # the metric step_fn returned (the rank) is averaged over the processes
    assert set(train.History.from_dict(two_procs[0]["history"]).values("rank")) == {0.5}
    # the model learned something (so the comparison is not between two untrained models)
    assert ddp_losses[-1] < ddp_losses[0]


def test_resume_with_two_processes_is_exact_and_needs_the_same_world_size(tmp_path):
    # dropout draws different masks on each rank: the checkpoint must restore every rank's RNG
    whole = torchrun(tmp_path / "whole", "--steps", "14", "--dropout", "0.2")
    ckpt = tmp_path / "ckpt.pt"
    torchrun(tmp_path / "part", "--steps", "5", "--dropout", "0.2", "--checkpoint", str(ckpt))
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".pt") == ["ckpt.pt"]   # written once
    resumed = torchrun(tmp_path / "resumed", "--steps", "14", "--dropout", "0.2", "--checkpoint", str(ckpt),
                       "--resume")
    for k in whole[0]["state"]:
        assert torch.equal(whole[0]["state"][k], resumed[0]["state"][k]), f"{k} differs after the resume"
    assert whole[0]["history"] == resumed[0]["history"]

    net = ddp_worker.model(0.2)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    with pytest.raises(train.CheckpointError, match="2 process"):
        train.fit(net, [(torch.zeros(1, 4), torch.zeros(1, 1))], optimizer=opt, epochs=1, max_steps=20,
                  step_fn=ddp_worker.step_fn, checkpoint=ckpt, resume=True, progress=False)


def test_torchrun_failure_raises_with_the_processes_output():
    with pytest.raises(RuntimeError, match=r"torchrun lib\.no_such_module failed[\s\S]*No module named"):
        distributed.torchrun("lib.no_such_module", processes=1, timeout=120)
