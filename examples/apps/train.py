"""Stage 2: train an MLP on the digits with (elastic) DDP; checkpoint and resume.

Run alone (one process) or under torchrun (gloo on CPU, nccl on GPUs). Rank 0 writes a
checkpoint every --checkpoint_every steps (temp file + rename, so a crash never leaves a
torn file); on start every rank loads the newest checkpoint, so a worker group restarted
by torchrun (--max_restarts) continues where it stopped. Checkpoints hold the unwrapped
model, so a restart with a different world size (elastic scale down/up) re-shards the data.
Rank 0 writes the final model once, at the end.

    torchrun --nproc_per_node 2 examples/apps/train.py --data_path D --output_path M \
--checkpoint_path C
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
from datetime import timedelta
from typing import Any, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fsspec  # noqa: E402
import tracking  # noqa: E402
from common import join, load_split, make_model, record_errors, write_bytes, write_json  # noqa: E402


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--data_path", required=True, help="splits written by datapreproc")
    p.add_argument("--output_path", required=True, help="where model.pt and model.json go")
    p.add_argument(
        "--checkpoint_path", required=True, help="where checkpoints go (resumed from on start)"
    )
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch_size", type=int, default=64, help="per-process batch size")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint_every", type=int, default=20, help="steps between checkpoints")
    p.add_argument("--log_every", type=int, default=10, help="steps between log lines")
    p.add_argument(
        "--step_delay", type=float, default=0.0, help="seconds to sleep per step (fault tests)"
    )
    return p.parse_args(argv)


def _is_local(url: str) -> bool:
    return "://" not in url or url.startswith("file://")


def _local(url: str) -> str:
    return url[len("file://") :] if url.startswith("file://") else url


def save_checkpoint(base: str, state: Dict[str, Any], keep: int = 2) -> str:
    import torch

    name = f"ckpt-{state['step']:09d}.pt"
    buf = io.BytesIO()
    torch.save(state, buf)
    if _is_local(base):
        d = _local(base)
        os.makedirs(d, exist_ok=True)
        tmp = os.path.join(d, f".{name}.tmp.{os.getpid()}")
        with open(tmp, "wb") as f:
            f.write(buf.getvalue())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(d, name))
    else:
        fs, path = fsspec.core.url_to_fs(base)
        fs.makedirs(path, exist_ok=True)
        with fs.open(f"{path}/.{name}.tmp", "wb") as f:
            f.write(buf.getvalue())
        fs.mv(f"{path}/.{name}.tmp", f"{path}/{name}")
    for old in list_checkpoints(base)[:-keep]:
        fs, path = fsspec.core.url_to_fs(join(base, old))
        fs.rm(path)
    return name


def list_checkpoints(base: str) -> List[str]:
    fs, path = fsspec.core.url_to_fs(base)
    if not fs.exists(path):
        return []
    names = [p.rsplit("/", 1)[-1] for p in fs.ls(path, detail=False)]
    return sorted(n for n in names if n.startswith("ckpt-") and n.endswith(".pt"))


def load_newest_checkpoint(base: str) -> Optional[Dict[str, Any]]:
    import torch

    names = list_checkpoints(base)
    if not names:
        return None
    with fsspec.open(join(base, names[-1]), "rb") as f:
        return torch.load(io.BytesIO(f.read()), weights_only=False)


def init_distributed() -> Tuple[int, int, Any]:
    import torch
    import torch.distributed as dist

    if "LOCAL_RANK" not in os.environ and int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return 0, 1, torch.device("cpu")
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, timeout=timedelta(seconds=120))
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    return dist.get_rank(), dist.get_world_size(), device


@record_errors
def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    rank, world, device = init_distributed()
    torch.manual_seed(args.seed)
    x, y = load_split(args.data_path, "train")
    dataset = TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    model = make_model(x.shape[1], args.hidden).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    step, start_epoch, skip, ckpt_world = 0, 0, 0, world
    ckpt = load_newest_checkpoint(args.checkpoint_path)
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        step, start_epoch, ckpt_world = ckpt["step"], ckpt["epoch"], ckpt["world_size"]
        # same world size: skip the batches already done this epoch;
        # otherwise re-shard from the epoch start
        skip = ckpt["epoch_step"] if ckpt_world == world else 0
        print(
            f"resumed from step={step} epoch={start_epoch}"
            f" (checkpoint world_size={ckpt_world}, now {world})",
            flush=True,
        )
    else:
        print(f"starting fresh world_size={world}", flush=True)
    if rank == 0:
        run = tracking.run()
        tracking.record_input(args.data_path)
        run.add_metadata(
            stage="train",
            epochs=args.epochs,
            batch_size=args.batch_size,
            lr=args.lr,
            world_size=world,
        )

    ddp_model = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    sampler = DistributedSampler(
        dataset, num_replicas=world, rank=rank, shuffle=True, seed=args.seed
    )
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    loss_value = float("nan")
    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)
        for i, (xb, yb) in enumerate(loader):
            if epoch == start_epoch and i < skip:
                continue
            optimizer.zero_grad()
            loss = F.cross_entropy(ddp_model(xb.to(device)), yb.to(device))
            loss.backward()
            optimizer.step()
            step += 1
            loss_value = float(loss.item())
            if step % args.log_every == 0:
                print(
                    f"step={step} epoch={epoch} loss={loss_value:.4f}"
                    f" world_size={world} rank={rank}",
                    flush=True,
                )
                if rank == 0:
                    tracking.run().log_metrics({"loss": loss_value}, step=step)
            if step % args.checkpoint_every == 0 and rank == 0:
                state = {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "step": step,
                    "epoch": epoch,
                    "epoch_step": i + 1,
                    "world_size": world,
                }
                save_checkpoint(args.checkpoint_path, state)
            if args.step_delay:
                time.sleep(args.step_delay)
    if world > 1:
        dist.barrier()
    if rank == 0:
        buf = io.BytesIO()
        torch.save(model.state_dict(), buf)
        write_bytes(join(args.output_path, "model.pt"), buf.getvalue())
        write_json(
            join(args.output_path, "model.json"),
            {
                "in_features": int(x.shape[1]),
                "hidden": args.hidden,
                "classes": 10,
                "steps": step,
                "final_loss": loss_value,
            },
        )
        tracking.run().log_metrics({"final_loss": loss_value}, step=step)
        tracking.record_output(args.output_path, "model", {"type": "model", "steps": step})
        print(
            f"wrote model to {args.output_path} after step={step} final_loss={loss_value:.4f}",
            flush=True,
        )
    if world > 1:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
