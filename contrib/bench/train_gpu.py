#!/usr/bin/python3
"""A real PyTorch training job for the benchmark: torchvision's resnet18
trained on an ImageFolder-like dataset (class folders of files; each file's
first 12 KiB become a 3x64x64 image) with a DataLoader of fork workers, on
the GPU when torch.cuda is available, else on the CPU. Prints one JSON line
per epoch: {"epoch": N, "seconds": S, "samples": N, "device": "cuda"}.

contrib/bench/run runs it directly from the emulated PFS and through
monarch-run (on a CUDA device; with --quick on the CPU as a smoke test):

  train_gpu.py ROOT [--epochs 3] [--workers 4] [--batch 128]"""
import argparse
import json
import os
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=128)
    a = ap.parse_args()

    import resource

    import torch
    import torchvision
    from torch.utils.data import DataLoader, Dataset

    # Workers hand batches over through shared memory; a low open-files limit
    # (1024 on some images) runs out with many workers: use the hard limit.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    torch.multiprocessing.set_sharing_strategy("file_system")

    side = 64
    need = 3 * side * side

    class Images(Dataset):
        def __init__(self, root):
            classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
            self.samples = [(os.path.join(root, c, n), i) for i, c in enumerate(classes)
                            for n in sorted(os.listdir(os.path.join(root, c)))]
            self.classes = len(classes)

        def __len__(self):
            return len(self.samples)

        def __getitem__(self, i):
            path, target = self.samples[i]
            with open(path, "rb") as f:  # as PIL does: the whole file
                data = f.read()
            x = torch.frombuffer(bytearray(data[:need].ljust(need, b"\0")), dtype=torch.uint8)
            return x.view(3, side, side).float() / 255, target

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    data = Images(a.root)
    model = torchvision.models.resnet18(num_classes=data.classes).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator()
    g.manual_seed(0)
    loader = DataLoader(data, batch_size=a.batch, shuffle=True, num_workers=a.workers,
                        multiprocessing_context="fork", generator=g,
                        pin_memory=dev == "cuda")
    for e in range(1, a.epochs + 1):
        start, n, loss = time.monotonic(), 0, None
        for x, y in loader:
            x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            n += len(y)
        if dev == "cuda":
            torch.cuda.synchronize()
        name = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
        print(json.dumps({"epoch": e, "seconds": time.monotonic() - start, "samples": n,
                          "loss": float(loss) if loss is not None else None, "device": name,
                          "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main()
