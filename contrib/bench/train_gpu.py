#!/usr/bin/python3
"""A real PyTorch training run for the benchmark, where a CUDA device exists:
torchvision's resnet18 trained for 3 epochs on an ImageFolder-like dataset
(each file's first bytes become a 3x64x64 image) with a DataLoader of fork
workers, directly from the emulated PFS and through monarch-run. Prints the
epoch times of both. Run by contrib/bench/run when torch.cuda.is_available().

  train_gpu.py [DATASET] [--epochs 3]   (without DATASET: a generated one)"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))


def train(root, epochs):
    import torch
    import torchvision
    from torch.utils.data import DataLoader, Dataset

    class Images(Dataset):
        def __init__(self):
            classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
            self.samples = [(os.path.join(root, c, n), i) for i, c in enumerate(classes)
                            for n in sorted(os.listdir(os.path.join(root, c)))]

        def __len__(self):
            return len(self.samples)

        def __getitem__(self, i):
            path, target = self.samples[i]
            with open(path, "rb") as f:
                data = f.read()
            x = torch.frombuffer(bytearray(data[:3 * 64 * 64].ljust(3 * 64 * 64, b"\0")),
                                 dtype=torch.uint8)
            return x.view(3, 64, 64).float() / 255, target

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    data = Images()
    model = torchvision.models.resnet18(num_classes=max(t for _, t in data.samples) + 1).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(data, batch_size=128, shuffle=True, num_workers=4,
                        multiprocessing_context="fork")
    for e in range(1, epochs + 1):
        start = time.time()
        for x, y in loader:
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x.to(dev)), y.to(dev))
            loss.backward()
            opt.step()
        if dev == "cuda":
            torch.cuda.synchronize()
        print(f"epoch {e}: {time.time() - start:.2f} s ({dev})", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dataset", nargs="?")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.inner:
        return train(a.dataset, a.epochs)
    work = tempfile.mkdtemp(prefix="monarch-gpu-")
    root = a.dataset or os.path.join(work, "ds")
    if not a.dataset:
        subprocess.run([os.path.join(SRC, "contrib", "gen-dataset"), root, "--small", "20000",
                        "--large", "0"], check=True, stdout=subprocess.DEVNULL)
        root = os.path.join(root, "images")
    me = [sys.executable, os.path.abspath(__file__), root, "--epochs", str(a.epochs), "--inner"]
    print("direct:", flush=True)
    subprocess.run(me, check=True)
    tier = os.path.join(work, "tier")
    os.makedirs(tier)
    print("through monarch-run:", flush=True)
    run = os.path.join(SRC, "build", "stager", "monarch-run")
    subprocess.run([run, "--dataset", root, "--tier", tier, "--"] + me, check=True)


if __name__ == "__main__":
    main()
